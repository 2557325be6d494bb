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

--attn-sup W (default 0: off) adds W times an auxiliary loss that supervises one attention head
(--attn-sup-layer, default the last; --attn-sup-head, default 0): at each input position that
predicts a digit of a count restated from the prompt in the answer ("Box K holds N items." in a
retrieval or combined answer), that head's softmax attention row (causal, over all earlier keys,
computed explicitly for those rows only) is scored by cross-entropy against the one-hot position
of the asked fact's corresponding count digit in the prompt (--attn-sup-target digit: the digit
the model should copy, the default; before: the token before it), averaged over those rows.
The training log then also prints attn-hit, the share of those rows whose argmax is the target
(reported whatever W, so the baseline shows whether the head finds the fact on its own).

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

    def forward(self, x, cos, sin, sup=None):
        """sup: (head, batch rows, query positions) of the attention rows to return as log-probs
        (N, S) (the head's softmax over keys <= the query position), kept in self.sup_logp."""
        B, S, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if sup is not None:
            h, bi, qi = sup
            lg = torch.einsum("nd,nsd->ns", q[bi, h, qi], k[bi, h]) / math.sqrt(q.shape[-1])
            lg = lg.masked_fill(torch.arange(S)[None, :] > qi[:, None], float("-inf"))
            self.sup_logp = torch.log_softmax(lg, -1)
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

    def forward(self, ids, sup=None, sup_layer=-1):
        """sup: (head, batch rows, query positions); then block sup_layer's sup_logp is set."""
        S = ids.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.arange(S).float()[:, None] * inv[None]
        cos, sin = ang.cos(), ang.sin()
        x = self.emb(ids)
        at = sup_layer % len(self.blocks)
        for i, b in enumerate(self.blocks):
            x = b(x, cos, sin, sup if i == at else None)
        return self.head(self.norm(x))


FACT = re.compile(r"Box (\d+) holds (\d+) items\.")


def fact_digit_positions(vocab, text):
    """[(box, [token index of each count digit])] of the "Box K holds N items." in text, in the
    stand-in tokenizer's pieces (digits one per token; the pieces concatenate to text)."""
    tok_at, pos = [], 0
    for i, p in enumerate(vocab.pieces(text)):
        tok_at += [i] * len(p)
        pos += len(p)
    assert pos == len(text)
    return [(int(m.group(1)), [tok_at[c] for c in range(m.start(2), m.end(2))]) for m in FACT.finditer(text)]


def conversation(vocab, facts, qa):
    """ids, target ids (-100 off the solutions), weights class (2 count digit, 1 other solution),
    and copy pairs [(conversation index of a count digit restated in an answer, conversation
    index of the same digit of the asked box's count in the prompt's fact list)]."""
    ids, tgt, kind, pairs = [], [], [], []
    where = {}  # box -> conversation indices of its count digits in the fact list
    for t, (q, sol) in enumerate(qa):
        text = (facts + "\n" if t == 0 else "") + q
        if t == 0:
            where = {b: ps for b, ps in fact_digit_positions(vocab, text)}
        p = vocab.encode(text) + [SEP]
        c = vocab.encode(sol) + [EOS]
        m = count_token_mask(vocab.pieces(sol)) + [False]
        base = len(ids) + len(p)
        for box, ps in fact_digit_positions(vocab, sol):
            src = where[box]
            assert len(src) == len(ps) and all(m[j] for j in ps)
            pairs += [(base + j, s) for j, s in zip(ps, src)]
        ids += p + c
        tgt += [-100] * len(p) + c
        kind += [0] * len(p) + [2 if x else 1 for x in m]
    return ids, tgt, kind, pairs


def batch(examples, before=False):
    """ids, tgt, kind (shifted: position s predicts token s+1) and the copy pairs as tensors
    (batch row, query position, key position): the query is the input position that predicts a
    restated count digit (the token before it), the key its fact digit in the prompt (before:
    the token before that digit)."""
    L = max(len(e[0]) for e in examples)
    ids = torch.zeros(len(examples), L, dtype=torch.long)
    tgt = torch.full((len(examples), L), -100, dtype=torch.long)
    kind = torch.zeros(len(examples), L, dtype=torch.long)
    rows = []
    for i, (a, b, c, pairs) in enumerate(examples):
        ids[i, :len(a)], tgt[i, :len(b)], kind[i, :len(c)] = torch.tensor(a), torch.tensor(b), torch.tensor(c)
        rows += [(i, t - 1, s - 1 if before else s) for t, s in pairs]
    sup = torch.tensor(rows, dtype=torch.long).reshape(-1, 3)
    # predict token s+1 from position s
    return ids[:, :-1], tgt[:, 1:], kind[:, 1:], sup


def attn_sup(model, ids, sup, head, layer):
    """(logits, the supervised head's log-probs at the copy targets (N,), argmax hits (N,))."""
    logits = model(ids, (head, sup[:, 0], sup[:, 1]), layer)
    logp = model.blocks[layer].sup_logp
    tl = logp.gather(1, sup[:, 2:3]).squeeze(1)
    return logits, tl, logp.argmax(-1) == sup[:, 2]


@torch.no_grad()
def held_out_scores(model, vocab, probs, sup_at=None):
    """(exact match, count-token accuracy, attn-hit): teacher-forced, one question a prompt, so
    no answer follows by elimination; the count tokens are the digits only the lookup predicts;
    attn-hit: share of the copy rows where the supervised head's argmax is the target (sup_at:
    (head, layer, before))."""
    ok, right, n, hit, nh = 0, 0, 0, 0, 0
    for p in probs:
        ids, tgt, kind, sup = batch([conversation(vocab, p[0], p[1])], sup_at[2] if sup_at else False)
        if sup_at and len(sup):
            logits, _, h = attn_sup(model, ids, sup, sup_at[0], sup_at[1])
            hit, nh = hit + int(h.sum()), nh + len(h)
        else:
            logits = model(ids)
        pred = logits.argmax(-1)
        m, c = tgt != -100, kind == 2
        ok += bool((pred[m] == tgt[m]).all())
        right += int((pred[c] == tgt[c]).sum())
        n += int(c.sum())
    return ok / len(probs), right / max(1, n), hit / max(1, nh)


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
    ap.add_argument("--attn-sup", type=float, default=0.0,
                    help="weight of the supervised-attention loss (0: off; see above)")
    ap.add_argument("--attn-sup-layer", type=int, default=-1, help="the supervised head's layer (default the last)")
    ap.add_argument("--attn-sup-head", type=int, default=0)
    ap.add_argument("--attn-sup-target", choices=("digit", "before"), default="digit",
                    help="the key: the fact's count digit to copy, or the token before it")
    ap.add_argument("--log-every", type=int, default=50, help="training log interval (steps)")
    ap.add_argument("--eval-every", type=int, default=500, help="held-out scores interval (steps)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    before = args.attn_sup_target == "before"
    sup_at = (args.attn_sup_head, args.attn_sup_layer % args.layers, before)
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
        r = {k: held_out_scores(model, vocab, v, sup_at) for k, v in evals.items()}
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
    accs, hits, sup_losses = [], [], []
    print(f"attn-sup {args.attn_sup} (layer {sup_at[1]}, head {sup_at[0]}, target {args.attn_sup_target})", flush=True)
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
        ids, tgt, kind_t, sup = batch(exs, before)
        done += n_tok
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if len(sup):
            logits, tl, hit = attn_sup(model, ids, sup, args.attn_sup_head, sup_at[1])
            hits.append(hit.float().mean().item())
            sup_losses.append(-tl.mean().item())
        else:
            logits, tl = model(ids), None
        nll = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none", ignore_index=-100)
        if args.schedule == "old":
            w = (tgt.flatten() != -100).float()
        else:
            w = torch.where(kind_t.flatten() == 2, 4.0, (kind_t.flatten() == 1).float())
        loss = (nll * w).sum() / w.sum()
        total = loss - args.attn_sup * tl.mean() if (args.attn_sup > 0 and tl is not None) else loss
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            cm = kind_t == 2
            acc = (logits.argmax(-1)[cm] == tgt[cm]).float().mean().item()
        accs.append(acc)
        if newest:
            cur.observe(acc, step)
        if step % args.log_every == 0:
            n = args.log_every
            rec = (f"step {step} {done / 1e3:.0f}k tokens {time.time() - t0:.0f}s {kind} facts {lo}-{hi} "
                   f"level {cur.current} batch {len(exs)} loss {loss.item():.3f} count-token acc (last {n} steps) "
                   f"{sum(accs[-n:]) / len(accs[-n:]):.2f} attn-hit {sum(hits[-n:]) / max(1, len(hits[-n:])):.2f} "
                   f"attn-loss {sum(sup_losses[-n:]) / max(1, len(sup_losses[-n:])):.2f}")
            if step % args.eval_every == 0:
                rec += " | held-out (exact, count-token acc, attn-hit) " + " ".join(
                    f"{k}: {v[0]:.2f} {v[1]:.2f} {v[2]:.2f}" for k, v in report().items())
            print(rec, flush=True)
        step += 1
    res = report()
    if args.schedule != "old":
        print(f"curriculum rises [step, level, why]: {cur.advances}")
    print(f"final ({args.schedule}, {step} steps, {done / 1e3:.0f}k tokens, {time.time() - t0:.0f} s): "
          "held-out teacher-forced exact match / count-token accuracy / attn-hit: "
          + ", ".join(f"{k} facts {v[0]:.3f} / {v[1]:.3f} / {v[2]:.3f} (n={len(evals[k])})" for k, v in res.items()),
          flush=True)


if __name__ == "__main__":
    main()
