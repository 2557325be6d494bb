#!/usr/bin/env python3
"""Checks the box task's generators (run by ctest boxes_generator_match; pure Python):

  1. osprey's C++ generator (`osprey eval --task boxes[-short] --write-problems`) writes exactly
     the problems tools/boxes/generate.py makes (the training data's source), full and short;
  2. every held-out problem is well formed and right (check_problem: distinct boxes, counts the
     solution restates, the arithmetic, the answer) and asks only about facts before the last
     RECENT_FACTS (the recent-window control cannot see them);
  3. fact counts stay in their length's range, every kind of question occurs, held-out seeds lie
     above the training seeds, and training conversations (combined and retrieval questions) use
     distinct facts per turn, at most half (a third) of their list;
  4. splitmix64 gives its published test vector (seed 1234567).

  python3 tools/boxes/check_data.py build/osprey
"""
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402

N_FULL, N_SHORT = 200, 40


def main():
    osprey = sys.argv[1]
    failures = []
    r = g.SplitMix64(1234567)
    if [r.next() for _ in range(3)] != [6457827717110365317, 3203168211198807973, 9817491932198370423]:
        failures.append("splitmix64 does not give its test vector")
    with tempfile.TemporaryDirectory() as tmp:
        for task, length, n in (("boxes", "full", N_FULL), ("boxes-short", "short", N_SHORT)):
            path = os.path.join(tmp, f"{task}.jsonl")
            subprocess.run([osprey, "eval", "--task", task, "--limit", str(n), "--write-problems", path],
                           check=True, stdout=subprocess.DEVNULL)
            got = [json.loads(line) for line in open(path, encoding="utf-8")]
            want = g.problems("test", n, length=length)
            if got != want:
                bad = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                failures.append(f"{task}: problem {bad} of osprey's generator differs from generate.py's")
            lo, hi = g.N_FACTS[length]
            for p in want:
                failures += [f"{p['id']}: {e}" for e in g.check_problem(p)]
                if not lo <= p["n_facts"] <= hi:
                    failures.append(f"{p['id']}: {p['n_facts']} facts outside [{lo}, {hi}]")
            kinds = Counter(p["kind"] for p in want)
            if set(kinds) != set(g.KINDS):
                failures.append(f"{task}: kinds {dict(kinds)}")
            print(f"{task}: {n} problems equal in C++ and Python; kinds {dict(kinds)}; facts "
                  f"{min(p['n_facts'] for p in want)}-{max(p['n_facts'] for p in want)}")
    if g.problems("test", 3) != g.problems("test", 3) or g.problems("test", 2) == g.problems("dev", 2):
        failures.append("generator is not deterministic per split")
    if not g.TRAIN_SEED_LIMIT <= g.SPLIT_BASE["dev"] < g.SPLIT_BASE["test"]:
        failures.append("seed ranges overlap")
    for seed in range(200):
        facts, qa = g.training_problem(seed, (4, 60), 6, rng=g.PyRandom(seed))
        asked = [q for q, _ in qa]
        boxes = [b for q in asked for b in q.replace("?", "").replace(",", "").split() if b.isdigit()]
        if len(boxes) != len(set(boxes)) or not qa:
            failures.append(f"training conversation {seed} repeats a box or asks nothing")
        if any(f"Box {b} holds" not in facts for b in boxes):
            failures.append(f"training conversation {seed} asks about a box it does not list")
    for seed in range(200):
        facts, qa = g.retrieval_problem(seed, (2, 60), 6, rng=g.PyRandom(seed))
        n = facts.count("\n")
        asked = [q.split()[-2] for q, _ in qa]
        if not qa or len(asked) != len(set(asked)) or len(qa) > max(1, n // 3):
            failures.append(f"retrieval conversation {seed}: {len(qa)} questions, {n} facts")
        for (q, sol), b in zip(qa, asked):
            line = next((ln for ln in facts.split("\n") if ln.startswith(f"Box {b} holds")), None)
            if line is None or not sol.startswith(line) or not sol.endswith(f"is {line.split()[3]}."):
                failures.append(f"retrieval conversation {seed}: {q!r} -> {sol!r}")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
