#!/usr/bin/env python3
"""Long-context box problems (issue #19), pure Python: a list of a few hundred "Box K holds N
items." facts and one question that combines two or three of them, answered in the arithmetic
task's worked-solution style (tools/arith/generate.py) and ending "The answer is N.".

  Every box below holds some items.
  Box 417 holds 58 items.
  Box 203 holds 17 items.
  ... (hundreds of facts)
  How many items do box 417 and box 203 hold together?
  → Box 417 holds 58 items. Box 203 holds 17 items. 58 + 17 = 75. The answer is 75.

The facts have a fixed width (box ids 100..999, counts 10..99), so with the bundled tokenizer
(digits split one per token, models/osprey-arith/tokenizer.json) every fact line is the same
number of tokens, FACT_TOKENS, and a prompt's length is a function of its fact count alone. The
ctest boxes_prompt_tokens (tests/eval/test_boxes.cpp) checks this with osprey's tokenizer.

Lengths (`length`):
  full   the gate's prompts: N_FACTS["full"] facts, 3,000-8,000 tokens;
  short  the CI's reduced length: N_FACTS["short"] facts, 2,500-2,650 tokens, still longer than
         index_topk 2048, so sparse attention chooses.
Held-out problems (dev, test) ask only about facts that lie before the last RECENT_FACTS facts
of the prompt: more than 2,300 tokens before the end of the prompt, so attention over the
2048 most recent positions (the recent-window control, `osprey eval --indexer-recent`) cannot see
them and must fail, while the indexer's top-2048 must find them. Training problems ask about any
fact (and come in all lengths: `training_problem`).

Deterministic and the same in C++ (src/eval/boxes_task.cpp, `osprey eval --task boxes`): problem
i of a split is drawn from splitmix64 seeded with SPLIT_BASE[split] + i alone, with the draws in
the order this file makes them (ctest boxes_generator_match compares the two byte for byte).
Training seeds [0, 900_000_000), dev [900_000_000, 1_000_000_000), test [1_000_000_000, ...);
the short length's held-out problems start LENGTH_OFFSET["short"] into their split's range.

  python3 tools/boxes/generate.py --split test --n 200 --out /tmp/boxes_test.jsonl
  python3 tools/boxes/generate.py --split test --length short --n 3 --print
"""
import argparse
import json
import sys

SPLIT_BASE = {"train": 0, "dev": 900_000_000, "test": 1_000_000_000}
TRAIN_SEED_LIMIT = SPLIT_BASE["dev"]
# The short length's seeds sit this far into its split's range, so its problems are not the
# full ones' draws cut short.
LENGTH_OFFSET = {"full": 0, "short": 50_000_000}

BOX_MIN, BOX_MAX = 100, 999        # three digits: every id the same number of tokens
COUNT_MIN, COUNT_MAX = 10, 99      # two digits
FACT_TOKENS = 19                   # tokens per fact line, its "\n" included (ctest boxes_prompt_tokens)
INDEX_TOPK = 2048                  # the model's index_topk
# Held-out questions ask about facts before the last RECENT_FACTS: 120 * 19 = 2,280 tokens plus
# the question (>= 33 tokens), more than INDEX_TOPK plus the longest completion (~90 tokens) with
# a margin of ~170 tokens.
RECENT_FACTS = 120
# Fact counts per length: 19 * n + 55..68 prompt tokens, in [3,000, 8,000] for full.
N_FACTS = {"full": (156, 415), "short": (130, 135)}
TRAIN_N_FACTS = (4, 415)           # training spans short to full prompts

MASK64 = (1 << 64) - 1


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014): 64-bit state, one output per step. Chosen because it
    is a few integer operations, identical in any language (src/eval/boxes_task.cpp)."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        """A draw in [0, n) (modulo bias below n / 2^64: none that matters for n < 10^4)."""
        return self.next() % n

    def between(self, lo, hi):
        """A draw in [lo, hi], both included."""
        return lo + self.below(hi - lo + 1)


INTRO = "Every box below holds some items."
KINDS = ("sum2", "diff", "sum3", "sum2_diff")


def fact_text(box, count):
    return f"Box {box} holds {count} items."


def question_text(kind, boxes):
    if kind == "sum2":
        return f"How many items do box {boxes[0]} and box {boxes[1]} hold together?"
    if kind == "diff":
        return f"How many more items does box {boxes[0]} hold than box {boxes[1]}?"
    if kind == "sum3":
        return f"How many items do box {boxes[0]}, box {boxes[1]} and box {boxes[2]} hold together?"
    assert kind == "sum2_diff"
    return (f"How many more items do box {boxes[0]} and box {boxes[1]} hold together than "
            f"box {boxes[2]}?")


def solution_text(kind, boxes, counts):
    """(worked solution, answer): the facts restated, then one equation per step."""
    said = " ".join(fact_text(b, c) for b, c in zip(boxes, counts))
    a, b = counts[0], counts[1]
    if kind == "sum2":
        steps, answer = [f"{a} + {b} = {a + b}."], a + b
    elif kind == "diff":
        steps, answer = [f"{a} - {b} = {a - b}."], a - b
    elif kind == "sum3":
        c = counts[2]
        steps, answer = [f"{a} + {b} = {a + b}.", f"{a + b} + {c} = {a + b + c}."], a + b + c
    else:
        c = counts[2]
        steps, answer = [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."], a + b - c
    return f"{said} {' '.join(steps)} The answer is {answer}.", answer


def draw_facts(rng, n):
    """n distinct box ids (a partial Fisher-Yates shuffle of BOX_MIN..BOX_MAX) and their counts."""
    pool = list(range(BOX_MIN, BOX_MAX + 1))
    for i in range(n):
        j = i + rng.below(len(pool) - i)
        pool[i], pool[j] = pool[j], pool[i]
    boxes = pool[:n]
    counts = [rng.between(COUNT_MIN, COUNT_MAX) for _ in range(n)]
    return boxes, counts


class Unanswerable(Exception):
    """The facts left hold no question of the drawn kind (diff: every count equal)."""


MAX_TRIES = 10_000  # draws before a question is given up (never reached by a held-out seed)


def draw_question(rng, counts, eligible, used=()):
    """(kind, fact indices) of one question about facts [0, eligible) not in `used`: two distinct
    facts (diff: the first holds more), or three (sum2_diff: the third holds least, so the answer
    is positive)."""
    kind = KINDS[rng.below(len(KINDS))]
    k = 3 if kind in ("sum3", "sum2_diff") else 2
    picked, tries = [], 0
    while len(picked) < k:
        tries += 1
        if tries > MAX_TRIES:
            raise Unanswerable(f"no {kind} question among {eligible} facts")
        i = rng.below(eligible)
        if i in picked or i in used:
            continue
        if kind == "diff" and picked and counts[i] == counts[picked[0]]:
            continue  # "0 more items" is not a question
        picked.append(i)
    if kind == "diff" and counts[picked[0]] < counts[picked[1]]:
        picked = [picked[1], picked[0]]
    if kind == "sum2_diff":
        low = min(range(3), key=lambda j: (counts[picked[j]], j))
        picked = [p for j, p in enumerate(picked) if j != low] + [picked[low]]
    return kind, picked


def prompt_text(boxes, counts, question):
    return "\n".join([INTRO] + [fact_text(b, c) for b, c in zip(boxes, counts)] + [question])


def make_problem(seed, pid, n_facts_range, far):
    """The problem drawn from SplitMix64(seed): n facts, one question; far: only facts before the
    last RECENT_FACTS are asked about."""
    rng = SplitMix64(seed)
    n = rng.between(*n_facts_range)
    boxes, counts = draw_facts(rng, n)
    eligible = n - RECENT_FACTS if far else n
    assert eligible >= 3, (n, far)
    kind, picked = draw_question(rng, counts, eligible)
    qb = [boxes[i] for i in picked]
    qc = [counts[i] for i in picked]
    question = question_text(kind, qb)
    solution, answer = solution_text(kind, qb, qc)
    return {"id": pid, "question": prompt_text(boxes, counts, question), "solution": solution,
            "answer": answer, "kind": kind, "n_facts": n, "fact_index": picked}


def problems(split, n, start=0, length="full"):
    """Held-out problems (dev, test) i = start .. start + n - 1 of a length."""
    assert split in ("dev", "test"), "training problems come from training_problem()"
    base = SPLIT_BASE[split] + LENGTH_OFFSET[length]
    tag = split if length == "full" else f"{split}-{length}"
    return [make_problem(base + i, f"{tag}-{i}", N_FACTS[length], far=True)
            for i in range(start, start + n)]


class PyRandom:
    """The draws of SplitMix64 from Python's random.Random (C speed) for the training stream,
    which needs no C++ twin; held-out problems always use SplitMix64."""

    def __init__(self, seed):
        import random
        self.r = random.Random(seed)

    def below(self, n):
        return self.r.randrange(n)

    def between(self, lo, hi):
        return self.r.randint(lo, hi)


def training_problem(seed, n_facts_range=TRAIN_N_FACTS, turns=1, rng=None):
    """A training conversation from seed (< TRAIN_SEED_LIMIT): one fact list and up to `turns`
    questions about distinct facts anywhere in it. Returns (facts text, [(question, solution)]);
    the first turn's prompt (facts + "\n" + question) has a held-out problem's form. rng: the
    draws (default SplitMix64(seed); the trainer passes PyRandom(seed))."""
    assert 0 <= seed < TRAIN_SEED_LIMIT, "training seeds exhausted"
    rng = rng or SplitMix64(seed)
    n = rng.between(*n_facts_range)
    boxes, counts = draw_facts(rng, n)
    facts = "\n".join([INTRO] + [fact_text(b, c) for b, c in zip(boxes, counts)])
    used, qa = set(), []
    for _ in range(turns):
        # At most half the list is asked (3 facts at least): a last question about the facts
        # left over would be answered by elimination, not by the lookup.
        if len(used) + 3 > max(3, n // 2):
            break
        try:
            kind, picked = draw_question(rng, counts, n, used)
        except Unanswerable:
            break
        used.update(picked)
        qb = [boxes[i] for i in picked]
        qc = [counts[i] for i in picked]
        solution, _ = solution_text(kind, qb, qc)
        qa.append((question_text(kind, qb), solution))
    return facts, qa


def retrieval_text(box, count):
    """A training-only question about one fact and its solution (the lookup alone, the first
    stage of the trainer's curriculum; held-out problems never ask it)."""
    return f"How many items does box {box} hold?", f"{fact_text(box, count)} The answer is {count}."


def retrieval_problem(seed, n_facts_range, turns=1, rng=None):
    """A training conversation of retrieval questions (retrieval_text) about up to `turns`
    (and at most a third of the list) distinct facts of one list of n_facts_range facts (2 facts and up: one fact among two is
    where the lookup's gradient is largest). Returns (facts text, [(question, solution)]) as
    training_problem."""
    assert 0 <= seed < TRAIN_SEED_LIMIT, "training seeds exhausted"
    rng = rng or SplitMix64(seed)
    n = rng.between(*n_facts_range)
    boxes, counts = draw_facts(rng, n)
    facts = "\n".join([INTRO] + [fact_text(b, c) for b, c in zip(boxes, counts)])
    k = min(turns, max(1, n // 3))  # no question answerable by elimination (training_problem)
    order = list(range(n))
    for i in range(k):  # a partial Fisher-Yates shuffle: distinct facts
        j = i + rng.below(n - i)
        order[i], order[j] = order[j], order[i]
    return facts, [retrieval_text(boxes[i], counts[i]) for i in order[:k]]


def check_problem(p):
    """What is wrong with a held-out problem (empty: nothing): every fact line well formed and
    distinct, the asked boxes present with the counts the solution restates, the arithmetic, the
    far placement, and the final answer."""
    errs = []
    lines = p["question"].split("\n")
    if lines[0] != INTRO:
        errs.append("no intro line")
    facts = {}
    for ln in lines[1:-1]:
        parts = ln.split(" ")
        if len(parts) != 5 or parts[0] != "Box" or parts[2] != "holds" or parts[4] != "items.":
            errs.append(f"bad fact line {ln!r}")
            continue
        box, count = int(parts[1]), int(parts[3])
        if not (BOX_MIN <= box <= BOX_MAX and COUNT_MIN <= count <= COUNT_MAX):
            errs.append(f"fact out of range {ln!r}")
        if box in facts:
            errs.append(f"box {box} twice")
        facts[box] = (count, len(facts))
    n = len(lines) - 2
    if n != p["n_facts"]:
        errs.append(f"{n} facts, n_facts says {p['n_facts']}")
    said = [s for s in p["solution"].split(". ") if s.startswith("Box ")]
    values = []
    for s in said:
        parts = s.split(" ")
        box, count = int(parts[1]), int(parts[3])
        if box not in facts or facts[box][0] != count:
            errs.append(f"solution says box {box} holds {count}")
            continue
        if facts[box][1] >= n - RECENT_FACTS:
            errs.append(f"box {box} is among the last {RECENT_FACTS} facts")
        if f"box {box}" not in lines[-1]:
            errs.append(f"box {box} is not in the question")
        values.append(count)
    k = {"sum2": 2, "diff": 2, "sum3": 3, "sum2_diff": 3}[p["kind"]]
    if len(values) != k:
        errs.append(f"{len(values)} facts restated, {p['kind']} needs {k}")
        return errs
    want = {"sum2": lambda v: v[0] + v[1], "diff": lambda v: v[0] - v[1],
            "sum3": lambda v: v[0] + v[1] + v[2], "sum2_diff": lambda v: v[0] + v[1] - v[2]}
    answer = want[p["kind"]](values)
    if answer <= 0 or answer != p["answer"] or not p["solution"].endswith(f"The answer is {answer}."):
        errs.append(f"answer {p['answer']} (recomputed {answer})")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("dev", "test"), required=True)
    ap.add_argument("--length", choices=sorted(N_FACTS), default="full")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--out", help="JSONL file (default: stdout)")
    ap.add_argument("--print", action="store_true", help="human-readable (facts elided)")
    args = ap.parse_args()
    ps = problems(args.split, args.n, args.start, args.length)
    f = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    for p in ps:
        if args.print:
            lines = p["question"].split("\n")
            f.write(f"{p['id']}: {p['n_facts']} facts, asks facts {p['fact_index']}\n  "
                    f"{lines[1]} ... {lines[-2]}\n  {lines[-1]}\n  {p['solution']}\n")
        else:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    if args.out:
        f.close()


if __name__ == "__main__":
    main()
