"""The box trainer's retrieval-then-length curriculum (tools/train_boxes.py; tools/boxes/cpu_proxy.py
tries it on the CPU), pure Python.

Why: the lookup circuit (find "Box K holds" in the prompt, copy the count after it) forms from
the gradient of the count tokens, whose signal is the attention to one fact among n. With
hundreds of facts at once that signal is ~1/n and the run of issue 19's first training (fact
counts 4-415 mixed from the start) never formed it: 0/200. The second run's length curriculum
(4-9 facts first, combined questions) did not form it either: count-token accuracy 0.12-0.42,
every rise by time. Two reasons found on the CPU proxy (bench/RESULTS.md, 2026-12-05): the key is
three digit tokens five tokens before the count, so the match needs layer-0 heads that gather the
id at fixed offsets before any match can pay off (a slow, gradual climb: ~4,000 small steps for a
2-3-fact list on the proxy); and a conversation asking about most of a short list lets the last
questions be answered by elimination (the facts not asked yet), which the count-token accuracy
rewarded as if it were the lookup (2 facts, 2 questions: 0.77 with no lookup at all). So the
curriculum now opens with retrieval questions alone ("How many items does box K hold?") on 2, 3,
4-5 ... facts (RETRIEVAL_LEVELS), conversations never ask more than a third (retrieval) or half
(combined) of their list, and the combined questions follow, with a retrieval share at every length
(Schedule). A level's ceiling rises whenever its count tokens are read back right (running
accuracy >= `advance_at` over the steps at the current level), and never lags behind a time floor
that rises from `floor_start` to reach the last level at `floor_end` of the training time (so a
run whose circuit forms late still trains at full length).
"""
# Running mean of the count-token accuracy: the last ~1 / EMA steps.
EMA = 0.1
# Steps at a level before it may rise: the running mean must reflect this level's problems.
MIN_STEPS = 20


class Curriculum:
    """Levels 0 .. n_levels - 1 (the caller maps them to fact-count ceilings: the trainer's
    buckets, the proxy's fact counts). level(frac) is the current one: the accuracy-driven level,
    or the time floor (level 0 until floor_start, then linear in the level index to the last
    level at floor_end) when that is higher. observe() takes the count-token accuracy of a step drawn at the current level."""

    def __init__(self, n_levels, advance_at=0.8, floor_start=0.3, floor_end=0.8):
        assert n_levels >= 1 and 0 <= floor_start < floor_end <= 1 and 0 < advance_at <= 1
        self.top, self.advance_at = n_levels - 1, advance_at
        self.floor_start, self.floor_end = floor_start, floor_end
        self.current = 0
        self.acc = 0.0       # running count-token accuracy at the current level
        self.steps = 0       # steps observed at the current level
        self.advances = []   # [step, new level, "accuracy" | "time"] of each rise

    def floor(self, frac):
        t = (frac - self.floor_start) / (self.floor_end - self.floor_start)
        return int(min(1.0, max(0.0, t)) * self.top)

    def level(self, frac, step=None):
        f = self.floor(frac)
        if f > self.current:
            self._rise(f, step, "time")
        return self.current

    def _rise(self, to, step, why):
        self.current, self.steps, self.acc = to, 0, 0.0
        self.advances.append([step, to, why])

    def observe(self, count_acc, step=None):
        """One step's accuracy on the count tokens (NaN or None: the batch had none)."""
        if count_acc is None or count_acc != count_acc:
            return
        self.steps += 1
        self.acc = count_acc if self.steps == 1 else (1 - EMA) * self.acc + EMA * count_acc
        if self.steps >= MIN_STEPS and self.acc >= self.advance_at and self.current < self.top:
            self._rise(self.current + 1, step, "accuracy")


# The retrieval stage's fact counts [lo, hi] (generate.retrieval_problem: "How many items does box
# K hold?"), levels before the combined questions' buckets: one fact among two first, where the
# lookup's gradient is largest. Without them the lookup never formed in issue 19's second H200 run
# (count-token accuracy 0.12-0.42 on 4-9 facts and combined questions, every rise by time) nor in
# the CPU proxy (tools/boxes/cpu_proxy.py: chance, ~0.1, after 1,500 steps).
RETRIEVAL_LEVELS = [(2, 2), (3, 3), (4, 5), (6, 9), (10, 19), (20, 39)]


class Schedule:
    """The data a step draws at a curriculum level (levels 0 .. n_retrieval + n_combined - 1):
    below n_retrieval, retrieval conversations of retrieval bucket `level` (the newest) `newest`
    of the time, else of an older retrieval bucket; from n_retrieval on, the combined questions of
    bucket c = level - n_retrieval (the newest `newest_combined` of the time, else an older one;
    at the top level every bucket alike), with a retrieval conversation of the same length
    `mix` of the time, so the lookup keeps its own gradient at every length. Retrieval bucket
    n_retrieval + c has the fact counts of combined bucket c."""

    def __init__(self, n_retrieval, n_combined, mix=0.25, newest=0.6, newest_combined=0.4):
        assert n_retrieval >= 0 and n_combined >= 1
        self.n_r, self.n_c, self.mix = n_retrieval, n_combined, mix
        self.newest, self.newest_c = newest, newest_combined
        self.n_levels = n_retrieval + n_combined

    def draw(self, level, rng):
        """(kind "retrieval" | "combined", bucket index in that kind's pool, whether it is the
        level's newest bucket: the steps whose count-token accuracy the Curriculum observes)."""
        if level < self.n_r:
            if level == 0 or rng.random() < self.newest:
                return "retrieval", level, True
            return "retrieval", rng.randrange(level), False
        c = level - self.n_r
        if c == self.n_c - 1:
            b = rng.randrange(self.n_c)  # all open: every length alike
        elif c == 0 or rng.random() < self.newest_c:
            b = c
        else:
            b = rng.randrange(c)
        if self.n_r and rng.random() < self.mix:
            return "retrieval", self.n_r + b, False
        return "combined", b, b == c


def count_token_mask(pieces):
    """[bool] per solution token piece: True for the digits of a count restated from the prompt
    ("Box 417 holds 58 items." -> the 5 and the 8), the tokens only the lookup can predict.
    pieces: the solution's tokens as text, digits one per token (the bundled tokenizer's and the
    proxy's split); a count is the digit run after a piece ending in "holds" or "holds "."""
    out, after_holds, text = [], False, ""
    for p in pieces:
        is_digit = len(p) == 1 and p.isdigit()
        if is_digit:
            out.append(after_holds)
        else:
            text = (text + p)[-8:]
            after_holds = text.rstrip(" ").endswith("holds")
            out.append(False)
    return out
