#!/usr/bin/env python3
"""A CPU proxy for tools/train_boxes.py's training schedule (issue #19): does retrieval (reading
"Box K holds N items." back out of the prompt) emerge under a schedule? Not the gate model: a
small pre-norm transformer (RoPE, dense FFN, no MLA / indexer / MoE) in plain torch (1.13 works),
on tools/boxes/generate.py's problems at short lengths (a few to ~40 facts, 100-800 tokens) with
a stand-in tokenizer (digits one per token like the bundled one, words in 3-character pieces).
It compares schedules at an equal number of optimizer steps (--steps; or trained tokens, --tokens;
not wall time: the CPU is shared), so it says which schedule forms the lookup circuit sooner; it
says nothing about the H200 run's absolute figures. Held-out prompts ask one question each (no
answer by elimination): the gate's combined questions and retrieval questions, scored by
teacher-forced exact match and by count-token accuracy (the digits only the lookup predicts).

  old        train_boxes.py before issue 19's first fix: fact counts drawn uniformly from all
             buckets, fixed tokens per step, plain mean loss over the solution tokens
  new        the length curriculum of issue 19's second H200 run: the fact-count ceiling starts
             low and rises when the counts read back from the prompt are right (or on a time
             floor), fewer tokens per step on short levels, count tokens weighted up
  retrieval  what train_boxes.py does now (curriculum.Schedule): retrieval questions alone on 2,
             3, 4-5 ... facts first, then the combined questions with a retrieval share, the same
             accuracy-or-time rises, no conversation answerable by elimination

  nice -n 5 python3 tools/boxes/cpu_proxy.py --schedule new --steps 4000 --d 128 --heads 8
  nice -n 5 python3 tools/boxes/cpu_proxy.py --schedule retrieval --steps 4000 --d 128 --heads 8
"""
import argparse
import math
import os
import random
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate as boxes  # noqa: E402
from curriculum import RETRIEVAL_LEVELS, Curriculum, Schedule, count_token_mask  # noqa: E402

PIECE = re.compile(r"[0-9]| ?[A-Za-z]+|\s|[^\sA-Za-z0-9]")
EOS, SEP = 1, 2  # ids: 0 pad, 1 end of solution, 2 end of prompt


class Vocab:
    """Stand-in tokenizer: digits and punctuation one per token, words in 3-character pieces."""

    def __init__(self):
        self.ids = {}

    def pieces(self, s):
        out = []
        for m in PIECE.findall(s):
            if len(m) > 3 and not m.isdigit():
                out += [m[i:i + 3] for i in range(0, len(m), 3)]
            else:
                out.append(m)
        return out

    def encode(self, s):
        return [self.ids.setdefault(p, len(self.ids) + 3) for p in self.pieces(s)]


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.h = heads
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.f1, self.f2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x, cos, sin):
        B, S, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") \
            else causal_attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, D))
        return x + self.f2(F.gelu(self.f1(self.n2(x))))


def causal_attention(q, k, v):
    lg = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    S = q.shape[2]
    lg = lg.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(lg, -1) @ v


def rope(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


class Model(nn.Module):
    def __init__(self, vocab, d=64, heads=4, layers=3, ffn=256):
        super().__init__()
        self.emb, self.blocks = nn.Embedding(vocab, d), nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.hd = d // heads

    def forward(self, ids):
        S = ids.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.arange(S).float()[:, None] * inv[None]
        cos, sin = ang.cos(), ang.sin()
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.head(self.norm(x))


def conversation(vocab, facts, qa):
    """ids, target ids (-100 off the solutions), weights class (2 count digit, 1 other solution)."""
    ids, tgt, kind = [], [], []
    for t, (q, sol) in enumerate(qa):
        p = vocab.encode((facts + "\n" if t == 0 else "") + q) + [SEP]
        c = vocab.encode(sol) + [EOS]
        m = count_token_mask(vocab.pieces(sol)) + [False]
        ids += p + c
        tgt += [-100] * len(p) + c
        kind += [0] * len(p) + [2 if x else 1 for x in m]
    return ids, tgt, kind


def batch(examples):
    L = max(len(e[0]) for e in examples)
    ids = torch.zeros(len(examples), L, dtype=torch.long)
    tgt = torch.full((len(examples), L), -100, dtype=torch.long)
    kind = torch.zeros(len(examples), L, dtype=torch.long)
    for i, (a, b, c) in enumerate(examples):
        ids[i, :len(a)], tgt[i, :len(b)], kind[i, :len(c)] = torch.tensor(a), torch.tensor(b), torch.tensor(c)
    # predict token s+1 from position s
    return ids[:, :-1], tgt[:, 1:], kind[:, 1:]


@torch.no_grad()
def held_out_scores(model, vocab, probs):
    """(exact match, count-token accuracy): teacher-forced, one question a prompt, so no answer
    follows by elimination; the count tokens are the digits only the lookup predicts."""
    ok, right, n = 0, 0, 0
    for p in probs:
        ids, tgt, kind = batch([conversation(vocab, p[0], p[1])])
        pred = model(ids).argmax(-1)
        m, c = tgt != -100, kind == 2
        ok += bool((pred[m] == tgt[m]).all())
        right += int((pred[c] == tgt[c]).sum())
        n += int(c.sum())
    return ok / len(probs), right / max(1, n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedule", choices=("old", "new", "retrieval"), required=True)
    ap.add_argument("--tokens", type=float, default=4e5, help="training tokens (the budget)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (the budget instead of --tokens)")
    ap.add_argument("--max-facts", type=int, default=24, help="the proxy's 'full' length")
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--d", type=int, default=64, help="model width")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--floor", type=float, nargs=2, default=None, metavar=("START", "END"),
                    help="the curriculum's time floor (default: train_boxes.py's 0.5 0.9 for "
                         "retrieval, the second H200 run's 0.3 0.8 for new)")
    ap.add_argument("--eval-n", type=int, default=60, help="held-out prompts per length")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    vocab = Vocab()
    for s in ["0123456789", boxes.INTRO, "Box holds items. The answer is + - = ? How many more items do does "
              "box and hold together than"]:
        vocab.encode(s)
    model = Model(256, d=args.d, heads=args.heads, layers=args.layers, ffn=4 * args.d)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    # held-out: one question each, far from none (the proxy's contexts are short), dev seeds;
    # the gate's combined questions, and retrieval questions (the lookup alone)
    def held(lo, hi, n, base):
        out = []
        for i in range(n):
            p = boxes.make_problem(boxes.SPLIT_BASE["dev"] + base + i, str(i), (lo, hi), far=False)
            facts, q = p["question"].rsplit("\n", 1)
            out.append((facts, [(q, p["solution"])]))
        return out

    def held_retrieval(lo, hi, n, base):
        return [boxes.retrieval_problem(base + i, (lo, hi), 1, rng=boxes.PyRandom(10**8 + base + i))
                for i in range(n)]
    half = args.max_facts // 2
    evals = {"combined 4-12": held(4, 12, args.eval_n, 0),
             f"combined {half}-{args.max_facts}": held(half, args.max_facts, args.eval_n, 10_000),
             "retrieval 4-12": held_retrieval(4, 12, args.eval_n, 0),
             f"retrieval {half}-{args.max_facts}": held_retrieval(half, args.max_facts, args.eval_n, 10_000)}

    def report():
        model.eval()
        r = {k: held_out_scores(model, vocab, v) for k, v in evals.items()}
        model.train()
        return r
    # new (the length curriculum): fact-count ceilings over (4, ceiling); retrieval: the
    # trainer's Schedule over retrieval levels, then combined buckets (lo, ceiling) of these
    ceilings = [c for c in (6, 9, 12, 16, 24, 32, 48) if c < args.max_facts] + [args.max_facts]
    buckets = [(4 if i == 0 else ceilings[i - 1] + 1, c) for i, c in enumerate(ceilings)]
    r_levels = [lv for lv in RETRIEVAL_LEVELS if lv[1] < args.max_facts]
    r_buckets = r_levels + buckets
    sched = Schedule(len(r_levels), len(buckets))
    n_levels = sched.n_levels if args.schedule == "retrieval" else len(ceilings)
    floor = args.floor or ((0.5, 0.9) if args.schedule == "retrieval" else (0.3, 0.8))
    cur = Curriculum(n_levels, floor_start=floor[0], floor_end=floor[1])
    t0, step, seed, done = time.time(), 0, 0, 0
    accs = []
    print(f"schedule {args.schedule}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    while True:
        frac = step / args.steps if args.steps else done / args.tokens
        if frac >= 1:
            break
        kind, newest = "combined", False
        if args.schedule == "old":
            lo, hi = 4, args.max_facts
            tps = args.tokens_per_step
        elif args.schedule == "new":
            at = cur.level(frac, step)
            lo, hi = 4, ceilings[at]
            newest = hi == ceilings[cur.current]
            tps = max(args.tokens_per_step // 4, int(args.tokens_per_step * min(1.0, hi / args.max_facts)))
        else:
            kind, b, newest = sched.draw(cur.level(frac, step), rng)
            lo, hi = (r_buckets if kind == "retrieval" else buckets)[b]
            tps = max(args.tokens_per_step // 4, int(args.tokens_per_step * min(1.0, hi / args.max_facts)))
        make = boxes.retrieval_problem if kind == "retrieval" else boxes.training_problem
        exs, n_tok = [], 0
        while n_tok < tps:
            seed += 1
            facts, qa = make(seed, (lo, hi), args.turns, rng=boxes.PyRandom(seed))
            if not qa:
                continue
            e = conversation(vocab, facts, qa)
            exs.append(e)
            n_tok += len(e[0])
        ids, tgt, kind_t = batch(exs)
        done += n_tok
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(ids)
        nll = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none", ignore_index=-100)
        if args.schedule == "old":
            w = (tgt.flatten() != -100).float()
        else:
            w = torch.where(kind_t.flatten() == 2, 4.0, (kind_t.flatten() == 1).float())
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            cm = kind_t == 2
            acc = (logits.argmax(-1)[cm] == tgt[cm]).float().mean().item()
        accs.append(acc)
        if newest:
            cur.observe(acc, step)
        if step % 50 == 0:
            rec = (f"step {step} {done / 1e3:.0f}k tokens {time.time() - t0:.0f}s {kind} facts {lo}-{hi} "
                   f"batch {len(exs)} loss {loss.item():.3f} count-token acc (last 50 steps) "
                   f"{sum(accs[-50:]) / len(accs[-50:]):.2f}")
            if step % 500 == 0:
                rec += " | held-out (exact, count-token acc) " + " ".join(
                    f"{k}: {v[0]:.2f} {v[1]:.2f}" for k, v in report().items())
            print(rec, flush=True)
        step += 1
    res = report()
    if args.schedule != "old":
        print(f"curriculum rises [step, level, why]: {cur.advances}")
    print(f"final ({args.schedule}, {step} steps, {done / 1e3:.0f}k tokens, {time.time() - t0:.0f} s): "
          "held-out teacher-forced exact match / count-token accuracy: "
          + ", ".join(f"{k} facts {v[0]:.3f} / {v[1]:.3f} (n={len(evals[k])})" for k, v in res.items()),
          flush=True)


if __name__ == "__main__":
    main()
