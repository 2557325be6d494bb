"""The box trainer's length curriculum (tools/train_boxes.py; tools/boxes/cpu_proxy.py tries it on
the CPU), pure Python.

Why: the lookup circuit (find "Box K holds" in the prompt, copy the count after it) forms from
the gradient of the count tokens, whose signal is the attention to one fact among n. With
hundreds of facts at once that signal is ~1/n and the run of issue 19's first training (fact
counts 4-415 mixed from the start) never formed it: 0/200. With a few facts it forms in a few
hundred steps, and once formed it carries over to longer lists (the match is by content, not
distance). So the ceiling on the fact count starts low and rises by `grow` whenever the count
tokens are read back right (running accuracy >= `advance_at` over the steps at the current
ceiling), and never lags behind a time floor that rises from `floor_start` to reach the full
length at `floor_end` of the training time (so a run whose circuit forms late still trains at
full length, while one that has not formed it keeps the short problems for a while).
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
