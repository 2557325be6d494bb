#!/usr/bin/env python3
"""Checks the committed arithmetic problem sets (run by ctest; pure Python).

  1. test.jsonl and dev.jsonl are exactly what tools/arith/generate.py makes today (determinism:
     regenerating from the seeds gives the same bytes);
  2. every problem's solution is correct: each equation recomputed, every operand either in the
     question or an earlier result, results positive and bounded, 2 or 3 steps, and the final
     "The answer is N." equal to the last equation and to the "answer" field;
  3. the held-out sets are disjoint from training: training_problems() never yields a test or dev
     question (over a large sample), and the seed ranges do not overlap;
  4. the generator is deterministic across calls and uses several templates.

  python3 tools/arith/check_data.py tests/data/arith
"""
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402

TRAIN_SAMPLE = 50_000


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    data_dir = sys.argv[1]
    failures = []
    sets = {}
    for split in ("test", "dev"):
        path = os.path.join(data_dir, f"{split}.jsonl")
        got = load(path)
        sets[split] = got
        want = g.problems(split, len(got))
        if got != want:
            bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            failures.append(f"{path}: problem {bad} differs from the generator's")
        for p in got:
            for e in g.check_problem(p):
                failures.append(f"{p['id']}: {e}")
    if len(sets["test"]) < 1000:
        failures.append(f"test set has {len(sets['test'])} problems (< 1000)")
    held_out = {p["question"] for s in sets.values() for p in s}
    if len({p["question"] for p in sets["test"]}) != len(sets["test"]):
        failures.append("duplicate questions in the test set")
    train = g.training_problems(TRAIN_SAMPLE, exclude_questions=held_out)
    leaked = sum(p["question"] in held_out for p in train)
    if leaked:
        failures.append(f"{leaked} held-out questions in the training stream")
    raw = sum(p["question"] in held_out for p in g.problems("train", TRAIN_SAMPLE))
    if g.problems("train", 3) != g.problems("train", 3):
        failures.append("generator is not deterministic")
    if not g.TRAIN_SEED_LIMIT <= g.SPLIT_BASE["dev"] < g.SPLIT_BASE["test"]:
        failures.append("seed ranges overlap")
    templates = Counter(p["solution"].split(" = ")[0].split()[0] for p in sets["test"])
    steps = Counter(len(g.EQUATION.findall(p["solution"])) for p in sets["test"])
    ops = Counter(op for p in sets["test"] for _, op, _, _ in g.EQUATION.findall(p["solution"]))
    if set(steps) != {2, 3}:
        failures.append(f"step counts {dict(steps)}")
    if set(ops) != set("+-*/"):
        failures.append(f"operations {dict(ops)}")
    if len({g.make_problem(g.SPLIT_BASE['test'] + i, 'x')['question'].split()[1] for i in range(200)}) < 5:
        failures.append("too few templates")
    print(f"test {len(sets['test'])}, dev {len(sets['dev'])} problems; steps {dict(steps)}; "
          f"ops {dict(ops)}; first words {len(templates)}; training sample {TRAIN_SAMPLE}: "
          f"{raw} raw collisions with held-out questions, {leaked} after filtering")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
