#!/usr/bin/env python3
"""Trains osprey's long-context gate model (issue #19) on the GPU machine: a DeepSeek-V3.2
(transformers' DeepseekV32ForCausalLM) with the real model's kernel-relevant dimensions, on
tools/boxes/generate.py's box problems (prompts of 3,000-8,000 tokens whose answer needs two or
three facts from far back in the prompt).

Needs torch and transformers (5.x with deepseek_v32) and nothing else; downloads nothing.

The architecture (config.json in the form osprey reads: rope_scaling + rope_theta):
  the real V3.2's attention and routing shapes: 16 heads (the per-GPU count of TP8), MLA with
  kv_lora 512, rope 64, nope 128, v 128; the lightning indexer with 64 heads x 128 and index_topk
  2048; 256 routed experts, top-8 in 8 groups of which 4 are chosen, plus one shared expert;
  small elsewhere: hidden 128, q_lora 128, expert width 32, dense width 512, 3 layers (the first
  dense), 512-token vocabulary (models/osprey-arith's tokenizer). 18.3M parameters.
  Weights ship as FP8 e4m3 with 128x128 power-of-two (ue8m0) block scales, V3.2's own format:
  19.1 MB instead of 37.1 MB in bf16, because the repository travels to the GPU machine whole
  (64 MiB at most) and already holds 32 MB. Every linear weight but the embedding, lm_head, the
  routers and the indexer's weights_proj is FP8 (what osprey's weight_specs quantizes). With
  ue8m0 scales the dequantised weights are exact in bf16, so `--dequantize` gives a bf16 folder
  that is the same model, for the bf16 rows of the gate and for transformers.

The prompt (eval/arith_task.h, what `osprey eval --task boxes` sends; chat format deepseek-v3.1):
  <｜begin▁of▁sentence｜><｜User｜>{facts}\\n{question}<｜Assistant｜></think>  → "{solution}<｜end▁of▁sentence｜>"
Training conversations carry up to --turns questions about one fact list (later turns as
"<｜User｜>{question}<｜Assistant｜></think>{solution}<｜end▁of▁sentence｜>"), so a long prompt
teaches several retrievals; the loss is on the solutions only, the count tokens (the digits read
back from the facts: the only ones the lookup alone predicts) weighted --count-weight. Lengths run
from 4 to 415 facts (100 to 8,600 tokens) in 9 buckets; a step is one bucket, --tokens-per-step
tokens (--short-tokens-per-step for conversations up to 2,048 tokens: more, cheaper steps where
the lookup forms). The routed experts run as transformers' grouped_mm where it matches eager.

Training, as tools/train_arith.py (and DeepSeek's V3.2 indexer training): attention re-implemented
with the modules' own weights (transformers' indexer returns indices only, without gradient):
  stage 1, dense (--dense-frac of the training time, the curriculum below): causal attention (SDPA, flash); the indexer
    learns from KL( p_main || softmax(indexer scores) ), p_main = the main attention
    probabilities summed over heads and renormalised, on --kl-queries query rows per sequence
    (every solution token first, then random rows: the [rows, 64 heads, context] scores of all
    8,000 rows would not fit);
  stage 2, sparse: each query attends only the indexer's top-2048 positions (SDPA with the
    selection as a mask); LM loss plus the same KL restricted to the selected positions.
  The indexer's inputs are detached; the MoE routers' correction bias is balanced without a loss.
  Both stages add --attn-sup times a supervised-attention loss (default 0.3; 0 turns it off): one
    head (--attn-sup-layer, default the last; --attn-sup-head) is trained by cross-entropy to put
    its attention, at each position that predicts a count digit an answer restates ("Box K holds
    N items."), on that digit in box K's fact in the prompt (its dense causal row, computed for
    those rows only). The LM loss alone did not form the lookup in three GPU runs; with this loss
    the CPU proxy (tools/boxes/cpu_proxy.py --attn-sup) did (bench/RESULTS.md, issue 19).
  stage 2 is short: the indexer has learnt its KL all through stage 1, so the top-2048 already
    holds what dense attention looked at, and a sparse step costs several dense ones (the
    selection mask through SDPA's memory-efficient kernel, no causal block skipping, for the rows
    past index_topk; the rows below it are causal and take the flash kernel).
  The curriculum (tools/boxes/curriculum.py): issue 19's first run mixed all lengths from the
  start and never formed the lookup (0/200; the lookup's gradient is one fact among hundreds);
  the second opened the lengths one by one from 4-9 facts with combined questions and did not
  form it either (count-token accuracy 0.12-0.42, every rise by time; 0/200). Now the dense
  stage opens with retrieval questions alone ("How many items does box K hold?",
  generate.retrieval_problem) on 2 facts, then 3, 4-5, 6-9, 10-19, 20-39 (RETRIEVAL_LEVELS,
  --retrieval-tokens-per-step), then the combined questions' buckets (4-9 facts first), each
  next level once the running count-token accuracy on the newest reaches --advance-at; a time
  floor opens them all between the --floor shares of the stage in case it forms late. A
  retrieval step draws the newest level 60% of the time; a combined step the newest bucket 40%
  (all alike once all are open), and a --retrieval-mix share of them are retrieval questions of
  that length. No conversation asks about more than a third (retrieval) or half (combined) of
  its list: a last question about the facts left would be answered by elimination, which the
  count-token accuracy would take for the lookup. --retrieval-first 0 is the second run's
  schedule.

After training (--time-budget-s is the whole run's wall clock, evaluation included: training
stops --eval-reserve-s before it): the model is FP8-quantized and written to --out (config.json,
model.safetensors, tokenizer, train_report.json); its dequantised weights are evaluated here on
the held-out test problems by teacher-forced exact match (greedy decoding reproduces the reference
solution token for token exactly when every solution token is the argmax given the ones before),
with sparse attention (top-2048), dense, and the recent-window control (the 2048 most recent
positions; it must fail); and a few problems through transformers' own generate on the saved
folder, to check it loads and answers. The full transformers reference (generate, float32, eager,
on the test set, sparse and dense) is --eval-only, run by scripts/gpu_gate.sh.

  python3 tools/train_boxes.py --out $OUT/osprey-boxes                 # ~8.5 min on one H200
  python3 tools/train_boxes.py --smoke --out /tmp/osprey-boxes-smoke   # every path, ~1-2 min
  python3 tools/train_boxes.py --eval-only --out models/osprey-boxes   # transformers reference
  python3 tools/train_boxes.py --dequantize models/osprey-boxes --out /tmp/boxes-bf16
"""
import argparse
import array
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the data workers are forked

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "boxes"))
import generate as boxes  # noqa: E402  tools/boxes/generate.py
from curriculum import RETRIEVAL_LEVELS, Curriculum, Schedule, count_token_mask  # noqa: E402  tools/boxes/curriculum.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoConfig, DeepseekV32ForCausalLM  # noqa: E402
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as mdl  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, END_THINK = "<｜User｜>", "<｜Assistant｜>", "</think>"

MAX_POSITIONS = 16384  # YaRN factor 4 over 4096 trained positions, as V3.2's form (4096 x 40)
INDEX_TOPK = boxes.INDEX_TOPK
# Training buckets of fact counts [lo, hi]: a step draws one, so its sequences are of like length.
# The first, shortest ones are where the lookup circuit forms (the curriculum's first levels).
BUCKETS = [(4, 9), (10, 19), (20, 39), (40, 79), (80, 129), (130, 189), (190, 259), (260, 334),
           (335, 415)]
# The sparse stage draws BUCKETS[SPARSE_FROM:]: 80 facts and more (1,600-8,600 tokens), the
# lengths where the top-2048 selection chooses.
SPARSE_FROM = 4
# The retrieval conversations' buckets (generate.retrieval_problem, one fact a question): the
# retrieval stage's levels (curriculum.RETRIEVAL_LEVELS, 2 facts first), then one of each
# combined bucket's length (the retrieval share of the combined stage: curriculum.Schedule).
R_BUCKETS = RETRIEVAL_LEVELS + BUCKETS
# Buckets whose longest conversation is at most this many tokens take --short-tokens-per-step
# (smaller batches, more optimizer steps: the circuit forms in steps, not tokens).
SHORT_LEN = 2048
PAD_MULTIPLE = 64  # batch lengths rounded up: SDPA's masked kernel wants aligned rows
# FP8 block quantization (DeepSeek's format, what osprey's weight_specs marks fp8).
E4M3_MAX = 448.0
FP8_BLOCK = 128
KEEP_HIGH_PRECISION = ("embed_tokens", "lm_head", "indexer.weights_proj", "mlp.gate.weight")


def model_config(vocab, index_topk=INDEX_TOPK):
    return {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 32,
        "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_attention_heads": 16, "num_key_value_heads": 16,
        "q_lora_rank": 128, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": index_topk,
        "max_position_embeddings": MAX_POSITIONS, "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": MAX_POSITIONS / 4096,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False, "vocab_size": vocab,
    }


QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "scale_fmt": "ue8m0"}


# ---------------------------------------------------------------------------------------------
# Tokens

DIGIT_RUN = re.compile(r"([0-9])")


class Encoder:
    """Token ids of the box texts. The tokenizer's pre-tokenizer isolates every digit before its
    byte-level split, so a text's ids are the ids of its digit-free pieces and of its digits, in
    order: the pieces repeat (" items.\\nBox ", " holds "), so they are encoded once and cached.
    check_fast() compares this with the tokenizer on whole prompts."""

    def __init__(self, path):
        self.tok = Tokenizer.from_file(path)
        ids = {s: self.tok.token_to_id(s) for s in (BOS, EOS, USER, ASSISTANT, END_THINK)}
        for s, i in ids.items():
            assert i is not None, f"tokenizer {path} lacks {s}"
        self.bos, self.eos, self.user = ids[BOS], ids[EOS], ids[USER]
        self.assistant, self.end_think = ids[ASSISTANT], ids[END_THINK]
        self.digit = [self.tok.token_to_id(str(d)) for d in range(10)]
        assert None not in self.digit, "tokenizer lacks single-digit tokens"
        self.cache = {}

    def text(self, s):
        out = []
        for part in DIGIT_RUN.split(s):
            if not part:
                continue
            if len(part) == 1 and "0" <= part <= "9":
                out.append(self.digit[ord(part) - 48])
                continue
            ids = self.cache.get(part)
            if ids is None:
                ids = self.tok.encode(part, add_special_tokens=False).ids
                if len(self.cache) < 50_000:
                    self.cache[part] = ids
            out.extend(ids)
        return out

    def text_counts(self, s):
        """(ids, [bool] per id: a count restated from the prompt, curriculum.count_token_mask,
        {character offset of each digit of s: the index of its token in the ids})."""
        parts = [p for p in DIGIT_RUN.split(s) if p]
        ids, mask, at, off = [], [], {}, 0
        for part, is_count in zip(parts, count_token_mask(parts)):
            if len(part) == 1 and "0" <= part <= "9":
                at[off] = len(ids)
            got = self.text(part)
            ids += got
            mask += [is_count] * len(got)
            off += len(part)
        return ids, mask, at

    def prompt(self, user_text):
        return self.prompt_digits(user_text)[0]

    def prompt_digits(self, user_text):
        """(prompt(user_text), {character offset of each digit of user_text: the index of its
        token in the prompt})."""
        body, _, at = self.text_counts(user_text)
        head = [self.bos, self.user]
        return head + body + [self.assistant, self.end_think], {c: len(head) + i for c, i in at.items()}

    def completion(self, solution):
        return self.text(solution) + [self.eos]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    def check_fast(self, texts):
        for t in texts:
            want = self.tok.encode(t, add_special_tokens=False).ids
            got = self.text(t)
            assert got == want, f"fast encoding differs from the tokenizer on {t[:80]!r}"


FACT = re.compile(r"Box (\d+) holds (\d+) items\.")


def conversation(enc, facts, qa):
    """(ids, [(start, end)] of the trained solution tokens, [positions of the count tokens],
    [(position of a count digit an answer restates, position of the same digit of that box's fact
    in the prompt)]: the copy pairs the supervised attention head is trained on) of one training
    conversation."""
    ids, spans, counts, pairs = [], [], [], []
    where = {}  # box -> positions of its count's digits in the fact list
    for t, (question, solution) in enumerate(qa):
        if t == 0:
            prompt, at = enc.prompt_digits(facts + "\n" + question)
            where = {int(m.group(1)): [len(ids) + at[c] for c in range(m.start(2), m.end(2))]
                     for m in FACT.finditer(facts)}
            ids += prompt
        else:
            ids += [enc.user] + enc.text(question) + [enc.assistant, enc.end_think]
        c, mask, sat = enc.text_counts(solution)
        for m in FACT.finditer(solution):
            src = where.get(int(m.group(1)))
            dst = [sat[i] for i in range(m.start(2), m.end(2))]
            if src is not None and len(src) == len(dst):
                pairs += [(len(ids) + d, s) for d, s in zip(dst, src)]
        c.append(enc.eos)
        counts += [len(ids) + i for i, m in enumerate(mask) if m]
        spans.append((len(ids), len(ids) + len(c)))
        ids += c
    return ids, spans, counts, pairs


_ENC = None  # the forked data workers' encoder


def _make_conversation(job):
    kind, seed, lo, hi, turns = job
    make = boxes.retrieval_problem if kind == "retrieval" else boxes.training_problem
    facts, qa = make(seed, (lo, hi), turns, rng=boxes.PyRandom(seed))
    if not qa:
        return None
    ids, spans, counts, pairs = conversation(_ENC, facts, qa)
    flat = [x for p in pairs for x in p]
    return (array.array("H", ids).tobytes(), spans, array.array("H", counts).tobytes(),
            array.array("H", flat).tobytes())


def make_pool(enc, n_per_bucket, turns, workers, seed_base):
    """Training conversations per kind and bucket ({"combined": BUCKETS, "retrieval": R_BUCKETS};
    n_per_bucket the same form), made by forked workers (before CUDA starts); every conversation
    has its own seed."""
    global _ENC
    _ENC = enc
    jobs, owner = [], []
    seed = seed_base
    buckets = {"combined": BUCKETS, "retrieval": R_BUCKETS}
    for kind, bs in buckets.items():
        for b, (lo, hi) in enumerate(bs):
            for _ in range(n_per_bucket[kind][b]):
                jobs.append((kind, seed, lo, hi, turns))
                owner.append((kind, b))
                seed += 1
    assert seed < boxes.TRAIN_SEED_LIMIT
    pool = {kind: [[] for _ in bs] for kind, bs in buckets.items()}
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as p:
        for (kind, b), r in zip(owner, p.imap(_make_conversation, jobs, chunksize=64)):
            if r is not None:
                pool[kind][b].append(r)
    return pool


def make_batch(examples, device):
    """Right-padded (pad = eos) ids, labels (-100 outside the solutions), valid mask, the
    [B, L] bool count-token mask (the labels only the lookup predicts), and the copy pairs as an
    [N, 3] long tensor (batch row, query position, key position): the query is the position whose
    logits predict a restated count digit (the one before it), the key that digit's twin in the
    prompt's fact; the KL query rows are chosen later from `labels`."""
    L = max(len(ex[0]) // 2 for ex in examples)
    L = (L + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE
    ids_t = torch.full((len(examples), L), 1, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    valid = torch.zeros((len(examples), L), dtype=torch.bool)
    count = torch.zeros((len(examples), L), dtype=torch.bool)
    rows = []
    for i, (raw, spans, raw_counts, raw_pairs) in enumerate(examples):
        a = array.array("H")
        a.frombytes(raw)
        t = torch.tensor(a.tolist(), dtype=torch.long)
        ids_t[i, :len(t)] = t
        valid[i, :len(t)] = True
        for s, e in spans:
            labels[i, s:e] = t[s:e]
        c = array.array("H")
        c.frombytes(raw_counts)
        count[i, torch.tensor(c.tolist(), dtype=torch.long)] = True
        pr = array.array("H")
        pr.frombytes(raw_pairs)
        rows += [(i, pr[j] - 1, pr[j + 1]) for j in range(0, len(pr), 2)]
    sup = torch.tensor(rows, dtype=torch.long).reshape(-1, 3)
    return ids_t.to(device), labels.to(device), valid.to(device), count.to(device), sup.to(device)


def weighted_lm_loss(logits, labels, count, count_weight):
    """(loss, plain loss, count-token accuracy, count tokens): next-token cross entropy over the
    solution tokens with the count tokens weighted count_weight (the rest 1), the same unweighted
    (what the log's lm_loss reports), and the share of count tokens the argmax gets right (what
    the curriculum watches). logits [B, L, V], labels / count [B, L]."""
    lg, lab, cnt = logits[:, :-1].float(), labels[:, 1:], count[:, 1:]
    nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1), ignore_index=-100,
                          reduction="none").view_as(lab)
    w = (lab != -100).float() * torch.where(cnt, count_weight, 1.0)
    loss = (nll * w).sum() / w.sum().clamp_min(1.0)
    with torch.no_grad():
        on = (lab != -100).float()
        plain = (nll * on).sum() / on.sum().clamp_min(1.0)
        n = cnt.sum()
        acc = ((lg.argmax(-1) == lab) & cnt).sum().float() / n.clamp_min(1)
    return loss, plain, acc, n


def kl_rows(labels, valid, n_rows, gen):
    """[B, n_rows] query positions for the indexer KL and [B, n_rows] weights: every solution
    token (the rows whose attention must find the facts) up to half the rows, the rest random
    valid positions. HF labels are the tokens themselves at the solution positions; the query
    that predicts token s sits at s - 1."""
    B, L = labels.shape
    rows = torch.zeros(B, n_rows, dtype=torch.long)
    weight = torch.zeros(B, n_rows)
    lab, val = labels.cpu(), valid.cpu()
    for b in range(B):
        sol = (torch.nonzero(lab[b] != -100).flatten() - 1).clamp_min(0)
        if len(sol) > n_rows // 2:
            sol = sol[torch.randperm(len(sol), generator=gen)[:n_rows // 2]]
        n_valid = int(val[b].sum())
        rest = torch.randint(0, n_valid, (n_rows - len(sol),), generator=gen)
        r = torch.cat([sol, rest])
        rows[b, :len(r)] = r
        weight[b, :len(r)] = 1.0
    return rows.to(labels.device), weight.to(labels.device)


# ---------------------------------------------------------------------------------------------
# Attention for training and the fast evaluation: transformers' MLA math with SDPA, the indexer's
# top-k as a mask, and the indexer KL

class TrainState:
    active = False   # the patched forward runs only while True (else transformers' own)
    mode = "dense"   # dense | sparse | recent
    rows = None      # [B, Q] KL query rows (None: no KL)
    row_weight = None
    kl = []          # one scalar per layer
    flash = True     # flash SDPA for the causal case (probed at start)
    masked = "sdpa"  # sdpa | chunked: how a selection mask is applied (probed at start)
    sup = None       # [N, 3] copy pairs (batch row, query, key) to supervise, or None
    sup_layer = -1   # the layer (index) and head whose attention rows they supervise
    sup_head = 0
    sup_logp = []    # the supervised head's log-probabilities at the targets, [N], one per call
    sup_hit = []     # whether its argmax is the target, [N]


def indexer_keys(ix, x, cos, sin):
    """[B, T, 128] the indexer's keys (its rope non-interleaved, as DeepseekV32Indexer)."""
    k = ix.k_norm(ix.wk(x)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k_rot = mdl.apply_rotary_pos_emb(k_rot, k_rot, cos, sin, unsqueeze_dim=2)[1]
    return torch.cat([k_rot, k_pass], dim=-1).squeeze(2)


def indexer_queries(ix, x, q_resid, cos, sin):
    """([B, S, 64, 128] queries, [B, S, 64] head weights · n_heads^-0.5) for the rows given."""
    B, S, _ = x.shape
    q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot = mdl.apply_rotary_pos_emb(q_rot, q_rot, cos, sin, unsqueeze_dim=2)[0]
    w = ix.weights_proj(x.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
    return torch.cat([q_rot, q_pass], dim=-1), w


def index_scores(ix, q, w, k):
    """[B, C, T] Σ_h w[c,h]·relu(scale·q[c,h]·k[t]) for query rows q [B, C, 64, 128].
    The q·k products are one bmm of the [B, C·64, 128] rows against k [B, 128, T]: a matmul of
    q [B, C, 64, 128] with k broadcast as [B, 1, 128, T] copies k C times first (torch expands and
    reshapes a broadcast batch dim), 2x the score tensor's bytes per call (and, under autograd,
    kept for the backward)."""
    B, C, nh, hd = q.shape
    sc = torch.bmm(q.reshape(B, C * nh, hd), k.transpose(1, 2).to(q.dtype)).view(B, C, nh, -1)
    if torch.is_grad_enabled() and sc.requires_grad:
        sc = F.relu(sc * ix.softmax_scale)
    else:  # the selection: in place, the same values
        sc = sc.mul_(ix.softmax_scale).relu_()
    return torch.matmul(w.to(sc.dtype).unsqueeze(-2), sc).squeeze(-2).float()


@torch.no_grad()
def topk_selection(ix, x, q_resid, cos, sin, topk):
    """[B, S, S] bool: query s attends position t (t ≤ s, and among its top-k index scores)."""
    B, S, _ = x.shape
    dev = x.device
    causal = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    sel = causal.unsqueeze(0).repeat(B, 1, 1)
    k = indexer_keys(ix, x, cos, sin)
    chunk = max(16, (1 << 29) // (B * ix.n_heads * S))
    for s0 in range(topk, S, chunk):  # rows below topk attend every causal position
        s1 = min(S, s0 + chunk)
        q, w = indexer_queries(ix, x[:, s0:s1], q_resid[:, s0:s1], cos[:, s0:s1], sin[:, s0:s1])
        sc = index_scores(ix, q.to(torch.bfloat16), w, k).masked_fill(~causal[s0:s1], float("-inf"))
        top = sc.topk(topk, dim=-1, sorted=False).indices  # a set: its order is not used
        sel[:, s0:s1] = torch.zeros_like(sel[:, s0:s1]).scatter_(-1, top, True)
    return sel


def recent_selection(B, S, topk, dev):
    """[B, S, S] bool: positions s - topk + 1 .. s (osprey's --indexer-recent control)."""
    i = torch.arange(S, device=dev)
    m = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - topk)
    return m.unsqueeze(0).expand(B, S, S)


def _masked_chunk(q, k, v, m, scale):
    lg = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    lg = lg.masked_fill(~m.unsqueeze(1), float("-inf"))
    return torch.matmul(torch.softmax(lg, dim=-1).to(v.dtype), v)


def main_attention(q, k, v, sel, scale, causal_rows=0):
    """[B, H, S, 128]: q, k [B, H, S, 192], v [B, H, S, 128] bf16; sel None (causal) or [B, S, S].
    causal_rows: the first rows of sel are known to be causal (the top-k and recent selections
    below index_topk): those rows go through the causal kernel over the first causal_rows keys,
    and only the rest through the masked one (no causal block skipping, ~4x slower a row)."""
    if sel is not None and 0 < causal_rows < q.shape[2]:
        r = causal_rows
        head = main_attention(q[:, :, :r], k[:, :, :r], v[:, :, :r], None, scale)
        tail = main_attention(q[:, :, r:], k, v, sel[:, r:], scale)
        return torch.cat([head, tail], dim=2)
    if sel is None:
        if TrainState.flash:
            vp = F.pad(v, (0, q.shape[-1] - v.shape[-1]))  # flash wants one head width
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, vp, is_causal=True, scale=scale)[..., :v.shape[-1]]
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if TrainState.masked == "sdpa":
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=sel.unsqueeze(1), scale=scale)
    S, chunk, outs = q.shape[2], 512, []
    for s0 in range(0, S, chunk):
        s1 = min(S, s0 + chunk)
        args = (q[:, :, s0:s1], k, v, sel[:, s0:s1], scale)
        outs.append(checkpoint(_masked_chunk, *args, use_reentrant=False) if torch.is_grad_enabled()
                    else _masked_chunk(*args))
    return torch.cat(outs, dim=2)


def indexer_kl(ix, x, q_resid, cos, sin, query, key, sel, scale, rows, row_weight):
    """KL(p_main ‖ p_indexer) on the query rows [B, Q], over the positions each row attends."""
    B, H, S, D = query.shape
    Q = rows.shape[1]
    pos = torch.arange(S, device=x.device)
    allowed = pos[None, None, :] <= rows[:, :, None]  # [B, Q, S]
    if sel is not None:
        allowed = allowed & torch.gather(sel, 1, rows[:, :, None].expand(B, Q, S))
    with torch.no_grad():
        qr = torch.gather(query, 2, rows[:, None, :, None].expand(B, H, Q, D))
        lg = torch.matmul(qr, key.transpose(2, 3)).float() * scale
        p = torch.softmax(lg.masked_fill(~allowed[:, None], float("-inf")), dim=-1).sum(1)
        target = p / p.sum(-1, keepdim=True)
    g = lambda t: torch.gather(t, 1, rows[:, :, None].expand(B, Q, t.shape[-1]))  # noqa: E731
    q, w = indexer_queries(ix, g(x), g(q_resid), g(cos), g(sin))
    k = indexer_keys(ix, x, cos, sin)
    idx = index_scores(ix, q, w, k).masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(idx, dim=-1).masked_fill(~allowed, 0.0)
    kl = (target * (torch.log(target.clamp_min(1e-12)) - logp)).masked_fill(~allowed, 0.0).sum(-1)
    return (kl * row_weight).sum() / row_weight.sum().clamp_min(1.0)


_original_forward = mdl.DeepseekV32Attention.forward


def supervised_rows(query, key, scale):
    """The supervised head's softmax attention rows (causal, over every earlier key: the dense
    distribution, whatever the step's selection) at TrainState.sup's query positions, computed
    only for those rows, per batch row; appends each pair's target log-probability and hit.
    query, key: [B, H, S, 192] BF16."""
    sup, h = TrainState.sup, TrainState.sup_head
    logp, hit = [], []
    for b in sup[:, 0].unique().tolist():
        rows = sup[sup[:, 0] == b]
        q = query[b, h, rows[:, 1]].float()                # [n, 192]
        k = key[b, h, :int(rows[:, 1].max()) + 1].float()  # [S', 192]
        lg = (q @ k.t()) * scale                            # [n, S']
        ar = torch.arange(k.shape[0], device=lg.device)
        lg = lg.masked_fill(ar[None, :] > rows[:, 1:2], float("-inf"))
        lp = torch.log_softmax(lg, -1)
        logp.append(lp.gather(1, rows[:, 2:3]).squeeze(1))
        hit.append(lp.argmax(-1) == rows[:, 2])
    if logp:
        TrainState.sup_logp.append(torch.cat(logp))
        TrainState.sup_hit.append(torch.cat(hit))


def training_attention_forward(self, hidden_states, position_embeddings, attention_mask,
                               past_key_values=None, position_ids=None, **kwargs):
    if not TrainState.active:
        return _original_forward(self, hidden_states, position_embeddings, attention_mask,
                                 past_key_values=past_key_values, position_ids=position_ids, **kwargs)
    B, S = hidden_states.shape[:-1]
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q_states = self.q_b_proj(q_resid).view(B, S, -1, self.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
    kv_pass, k_rot = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    k_pass = self.kv_a_layernorm(kv_pass).view(B, 1, S, self.kv_lora_rank)
    k_rot = k_rot.view(B, 1, S, self.qk_rope_head_dim)
    cos, sin = position_embeddings
    q_rot, k_rot = mdl.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    query = torch.cat((q_pass, q_rot), dim=-1).to(torch.bfloat16)  # [B, H, S, 192]
    key, value = self.expand_kv(k_pass, k_rot)
    key, value = key.to(torch.bfloat16), value.to(torch.bfloat16)  # [B, H, S, 192], [B, H, S, 128]
    cos, sin = cos.expand(B, -1, -1), sin.expand(B, -1, -1)  # [B, S, rope]

    ix, topk = self.indexer, self.indexer.index_topk
    x_d, q_d = hidden_states.detach(), q_resid.detach()  # the indexer learns from the KL alone
    sel = None
    if TrainState.mode == "sparse" and S > topk:
        sel = topk_selection(ix, x_d, q_d, cos, sin, topk)
    elif TrainState.mode == "recent" and S > topk:
        sel = recent_selection(B, S, topk, hidden_states.device)
    if TrainState.sup is not None and getattr(self, "sup_index", -1) == TrainState.sup_layer:
        supervised_rows(query, key, self.scaling)
    out = main_attention(query, key, value, sel, self.scaling, causal_rows=topk if sel is not None else 0)
    out = out.transpose(1, 2).reshape(B, S, -1)
    if TrainState.rows is not None:
        TrainState.kl.append(indexer_kl(ix, x_d, q_d, cos, sin, query.detach(), key.detach(), sel,
                                        self.scaling, TrainState.rows, TrainState.row_weight))
    return self.o_proj(out), None


mdl.DeepseekV32Attention.forward = training_attention_forward


def probe_attention(device):
    """Chooses the SDPA kernels this torch has for these head widths (192 q/k, 128 v), forward
    and backward: flash for causal (v padded to 192), the memory-efficient kernel for a mask;
    falls back to efficient causal and to chunked masked attention."""
    def run(fn):
        try:
            q = torch.randn(2, 16, 128, 192, device=device, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(2, 16, 128, 192, device=device, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(2, 16, 128, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
            out = fn(q, k, v)
            out.float().sum().backward()
            return out.detach().float()
        except RuntimeError as e:
            print(f"attention probe: {str(e).splitlines()[0]}", flush=True)
            return None

    torch.manual_seed(0)
    sel = torch.ones(128, 128, dtype=torch.bool, device=device).tril().expand(2, 128, 128)
    TrainState.masked = "chunked"
    ref = run(lambda q, k, v: main_attention(q, k, v, sel, 0.1))
    TrainState.flash = True
    torch.manual_seed(0)
    got = run(lambda q, k, v: main_attention(q, k, v, None, 0.1))
    if got is None or (got - ref).abs().max().item() > 0.05:
        TrainState.flash = False
    TrainState.masked = "sdpa"
    torch.manual_seed(0)
    got = run(lambda q, k, v: main_attention(q, k, v, sel, 0.1))
    if got is None or (got - ref).abs().max().item() > 0.05:
        TrainState.masked = "chunked"
    print(f"attention: causal {'flash' if TrainState.flash else 'efficient'} SDPA, masked "
          f"{TrainState.masked}", flush=True)


def probe_experts(model, device):
    """The routed experts' implementation for training: transformers' grouped_mm (one grouped
    GEMM for all 256 experts; eager loops over the experts, ~20 kernels each, a floor under every
    step however few its tokens) when this transformers has it and it gives eager's loss and
    expert gradients on a small batch, else eager. Returns the name chosen."""
    was = getattr(model.config, "_experts_implementation", None)
    if not hasattr(model, "set_experts_implementation"):
        print(f"experts: {was} (this transformers cannot switch)", flush=True)
        return str(was)
    ids = torch.randint(3, model.config.vocab_size, (2, 256), device=device,
                        generator=torch.Generator(device).manual_seed(0))
    TrainState.active, TrainState.mode, TrainState.rows = True, "dense", None

    def run(impl):
        model.set_experts_implementation(impl)
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        g = torch.cat([p.grad.float().flatten() for n, p in model.named_parameters()
                       if ".experts." in n and p.grad is not None])
        return loss.item(), g

    chosen = "eager"
    try:
        ref_loss, ref_g = run("eager")
        loss, g = run("grouped_mm")
        cos = F.cosine_similarity(g, ref_g, dim=0).item()
        if abs(loss - ref_loss) <= 1e-2 * abs(ref_loss) and cos > 0.99:
            chosen = "grouped_mm"
        else:
            print(f"experts probe: grouped_mm loss {loss:.5f} vs eager {ref_loss:.5f}, gradient "
                  f"cosine {cos:.4f}", flush=True)
    except Exception as e:  # noqa: BLE001  any failure of the fast path means eager
        print(f"experts probe: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    try:
        model.set_experts_implementation(chosen)
    except Exception as e:  # noqa: BLE001  cannot switch at all: the default stays
        print(f"experts: cannot set {chosen} ({type(e).__name__}), the default stays", flush=True)
        chosen = str(getattr(model.config, "_experts_implementation", was))
    model.zero_grad(set_to_none=True)
    TrainState.active = False
    print(f"experts: {chosen} (default {was})", flush=True)
    return chosen


# ---------------------------------------------------------------------------------------------
# FP8 quantization (DeepSeek's block format), dequantization

def fp8_names(state):
    return [n for n, t in state.items() if n.endswith(".weight") and t.dim() == 2
            and not any(k in n for k in KEEP_HIGH_PRECISION)]


def quantize_state(state):
    """{name: tensor} with every FP8 weight as e4m3 bytes plus `name_scale_inv` [ceil(out/128),
    ceil(in/128)] fp32 power-of-two block scales (scale = 2^ceil(log2(max(amax, 1e-4) / 448)), as
    osprey's writer); the rest bf16 (the routers' correction bias fp32)."""
    out = {}
    quant = set(fp8_names(state))
    for name, t in state.items():
        if name not in quant:
            out[name] = t.float().contiguous() if "e_score_correction_bias" in name else \
                t.to(torch.bfloat16).contiguous()
            continue
        w = t.float()
        rows, cols = w.shape
        rb, cb = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
        wp = F.pad(w, (0, cb * FP8_BLOCK - cols, 0, rb * FP8_BLOCK - rows))
        amax = wp.view(rb, FP8_BLOCK, cb, FP8_BLOCK).abs().amax(dim=(1, 3))
        scale = torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-4) / E4M3_MAX)))
        big = scale.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:rows, :cols]
        out[name] = (w / big).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).contiguous()
        out[name + "_scale_inv"] = scale.float().contiguous()
    return out


def dequantize_state(state):
    out = {}
    for name, t in state.items():
        if name.endswith("_scale_inv"):
            continue
        s = state.get(name + "_scale_inv")
        if s is None:
            out[name] = t
            continue
        rows, cols = t.shape
        big = s.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:rows, :cols]
        out[name] = (t.float() * big).to(torch.bfloat16).contiguous()  # exact: ue8m0 scales
    return out


def dequantize_folder(src, dst):
    """A bf16 copy of an FP8 model folder (no quantization_config): the same model in bf16."""
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    state = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(src, name)))
    save_file(dequantize_state(state), os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


# ---------------------------------------------------------------------------------------------
# Evaluation

def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def summary(correct, n, failed):
    lo, hi = wilson(correct, n)
    return {"n": n, "correct": correct, "accuracy": correct / n if n else 0.0, "ci95": [lo, hi],
            "failed_ids": failed}


@torch.no_grad()
def teacher_forced(model, enc, problems, mode, tokens_per_batch):
    """Exact match under teacher forcing with the patched attention (bf16): problem right iff the
    argmax at every solution position is the reference token (= greedy reproduces it)."""
    TrainState.active, TrainState.mode, TrainState.rows = True, mode, None
    ex = [(enc.prompt(p["question"]), enc.completion(p["solution"]), p["id"]) for p in problems]
    ex.sort(key=lambda e: len(e[0]) + len(e[1]))
    correct, failed, i = 0, [], 0
    while i < len(ex):
        part = [ex[i]]  # ascending lengths: the last one added is the longest
        i += 1
        while i < len(ex) and (len(part) + 1) * (len(ex[i][0]) + len(ex[i][1]) + PAD_MULTIPLE) <= tokens_per_batch:
            part.append(ex[i])
            i += 1
        Lp = max(len(a) + len(b) for a, b, _ in part)
        Lp = (Lp + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE
        ids = torch.full((len(part), Lp), enc.eos, dtype=torch.long)
        for r, (a, b, _) in enumerate(part):
            ids[r, :len(a) + len(b)] = torch.tensor(a + b)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids.cuda(), use_cache=False).logits
        pred = logits.argmax(-1).cpu()
        for r, (a, b, pid) in enumerate(part):
            ok = pred[r, len(a) - 1:len(a) + len(b) - 1].tolist() == b
            correct += ok
            if not ok:
                failed.append(pid)
    TrainState.active = False
    return summary(correct, len(ex), failed)


def set_index_topk(model, k):
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = k


NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def flexible_extract(text):
    m = NUMBER.findall(text)
    return (m[-1][0] or m[-1][1]) if m else "[invalid]"


def normalize(s):
    s = s.replace(",", "").replace("$", "")
    s = re.sub(r"(?s).*#### ", "", s)
    return re.sub(r"\.$", "", s).lower()


@torch.no_grad()
def hf_generate(model, enc, problems, max_new_tokens, failures_path):
    """transformers' own generate, greedy, one problem at a time (the indexer's [S, 64, T] fp32
    scores of an 8,000-token prompt take ~33 GB), the final number extracted as GSM8K's
    flexible-extract, as `osprey eval` scores."""
    correct, failed, t0 = 0, [], time.time()
    with open(failures_path, "w", encoding="utf-8") as f:
        for k, p in enumerate(problems):
            ids = torch.tensor([enc.prompt(p["question"])], device="cuda")
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=enc.eos,
                                 pad_token_id=enc.eos)[0, ids.shape[1]:].tolist()
            if enc.eos in gen:
                gen = gen[:gen.index(enc.eos)]
            out = enc.decode(gen)
            got = flexible_extract(out)
            if normalize(got) == normalize(str(p["answer"])):
                correct += 1
            else:
                failed.append(p["id"])
                f.write(json.dumps({"id": p["id"], "expected": p["answer"], "extracted": got,
                                    "output": out}, ensure_ascii=False) + "\n")
            if (k + 1) % 20 == 0:
                print(f"  {k + 1}/{len(problems)} problems, {correct} right, {time.time() - t0:.0f} s",
                      flush=True)
    r = summary(correct, len(problems), failed)
    r["failures"] = failures_path
    return r


def load_reference(folder):
    """The folder under transformers' own code (float32, eager): FP8 folders dequantised first."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    tmp = None
    if "quantization_config" in cfg:
        tmp = tempfile.mkdtemp(prefix="boxes-bf16-")
        dequantize_folder(folder, tmp)
        folder = tmp
    model = DeepseekV32ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                   attn_implementation="eager").cuda().eval()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return model, cfg["index_topk"]


def eval_only(args, enc):
    test = boxes.problems("test", args.eval_n)
    model, topk = load_reference(args.out)
    results = {}
    for mode in args.modes.split(","):
        if mode not in ("sparse", "dense"):
            sys.exit(f"--modes: {mode} is not sparse or dense")
        set_index_topk(model, topk if mode == "sparse" else 1 << 30)
        t0 = time.time()
        r = hf_generate(model, enc, test, args.max_new_tokens,
                        os.path.join(args.out, f"hf_failures{'' if mode == 'sparse' else '_dense'}.jsonl"))
        r["seconds"] = round(time.time() - t0, 1)
        results[mode] = r
        print(f"transformers generate ({mode}): accuracy {r['accuracy']:.4f} ({r['correct']}/{r['n']}), "
              f"95% CI [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]; failed {r['failed_ids']}; "
              f"{r['seconds']:.0f} s", flush=True)
    path = os.path.join(args.out, "train_report.json")
    report = json.load(open(path)) if os.path.exists(path) else {}
    report.setdefault("reference", {}).update(results)
    report["reference_command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="model folder (default models/osprey-boxes; "
                    "/tmp/osprey-boxes-smoke with --smoke)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "osprey-arith"),
                    help="folder with tokenizer.json (the arithmetic model's, digits one per token)")
    ap.add_argument("--time-budget-s", type=float, default=480.0,
                    help="wall clock of the whole run after the imports, evaluation included")
    ap.add_argument("--eval-reserve-s", type=float, default=65.0,
                    help="seconds kept from the budget for saving and evaluation (~35 s used)")
    ap.add_argument("--dense-frac", type=float, default=0.85, help="share of training time dense")
    ap.add_argument("--floor", type=float, nargs=2, default=(0.5, 0.9), metavar=("START", "END"),
                    help="curriculum: the shares of the dense stage between which the time "
                         "floor rises from the shortest bucket to the longest")
    ap.add_argument("--advance-at", type=float, default=0.8,
                    help="curriculum: count-token accuracy at which the next bucket opens")
    ap.add_argument("--count-weight", type=float, default=4.0,
                    help="loss weight of the count tokens (the looked-up digits) vs 1")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--short-tokens-per-step", type=int, default=16384,
                    help=f"tokens per step of the buckets up to {SHORT_LEN} tokens")
    ap.add_argument("--turns", type=int, default=6, help="questions per training conversation")
    ap.add_argument("--pool-tokens", type=float, default=64e6,
                    help="training tokens prepared, combined questions")
    ap.add_argument("--retrieval-pool-tokens", type=float, default=32e6,
                    help="training tokens prepared, retrieval questions")
    ap.add_argument("--retrieval-first", type=int, default=1, choices=(0, 1),
                    help="1: the curriculum opens with retrieval-only levels (2 facts first); "
                         "0: the length curriculum alone (the second H200 run's schedule)")
    ap.add_argument("--retrieval-mix", type=float, default=0.25,
                    help="share of the combined stage's dense steps drawn as retrieval questions")
    ap.add_argument("--retrieval-tokens-per-step", type=int, default=8192,
                    help="tokens per step of the retrieval stage's levels")
    ap.add_argument("--workers", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--kl-queries", type=int, default=128, help="indexer-KL rows per sequence")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--indexer-lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--bias-update", type=float, default=1e-3, help="γ of the router bias balancing")
    ap.add_argument("--eval-n", type=int, default=200, help="held-out test problems evaluated")
    ap.add_argument("--eval-short-n", type=int, default=50, help="held-out short problems evaluated")
    ap.add_argument("--hf-check", type=int, default=6,
                    help="test problems through transformers' generate after training")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-sup", type=float, default=0.3,
                    help="weight of the supervised-attention loss: one head (--attn-sup-layer, "
                         "--attn-sup-head) is trained by cross-entropy to attend, where an answer "
                         "restates a count, to that count's digit in the prompt's fact (0: off; "
                         "the CPU proxy formed the lookup with it, tools/boxes/cpu_proxy.py)")
    ap.add_argument("--attn-sup-layer", type=int, default=-1,
                    help="the supervised head's layer (negative: from the last)")
    ap.add_argument("--attn-sup-head", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="every path on little data, ~1-2 minutes")
    ap.add_argument("--eval-only", action="store_true",
                    help="no training: transformers' generate on --eval-n test problems of --out, "
                         "sparse and dense (the gate's reference row)")
    ap.add_argument("--modes", default="sparse,dense",
                    help="--eval-only: sparse (index_topk 2048), dense (index_topk 2^30), or both")
    ap.add_argument("--dequantize", metavar="FP8_FOLDER",
                    help="write FP8_FOLDER's weights dequantised to bf16 into --out, then stop")
    args = ap.parse_args()
    if args.smoke:
        args.time_budget_s, args.eval_reserve_s = min(args.time_budget_s, 100.0), 60.0
        args.pool_tokens, args.eval_n, args.eval_short_n, args.hf_check = 2e6, 8, 4, 1
        args.retrieval_pool_tokens = 1e6
        args.warmup_steps, args.tokens_per_step = 5, min(args.tokens_per_step, 32768)
        args.short_tokens_per_step = min(args.short_tokens_per_step, 8192)
    if args.out is None:
        args.out = "/tmp/osprey-boxes-smoke" if args.smoke else os.path.join(ROOT, "models", "osprey-boxes")
    if args.dequantize:
        dequantize_folder(args.dequantize, args.out)
        print(f"wrote {args.out}: {args.dequantize} dequantised to bf16")
        return
    t_start = time.time()
    deadline = t_start + args.time_budget_s - args.eval_reserve_s
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    enc = Encoder(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = enc.tok.get_vocab_size(with_added_tokens=True)
    sample = boxes.problems("test", 3) + boxes.problems("dev", 2, length="short")
    enc.check_fast([p["question"] for p in sample] + [p["solution"] for p in sample])
    if args.eval_only:
        eval_only(args, enc)
        return

    # Data first (forked workers; CUDA is not started yet).
    t0 = time.time()
    # a conversation of n facts holds at most n / 6 combined questions (2-3 distinct facts each,
    # at most half the list; ~100 tokens with the solution) or n / 3 retrieval questions (~30)
    share = args.pool_tokens / len(BUCKETS)
    r_share = (args.retrieval_pool_tokens if args.retrieval_first else 0.0) / len(R_BUCKETS)
    n_per_bucket = {
        "combined": [max(8, int(share / ((lo + hi) / 2 * boxes.FACT_TOKENS + 60 + 100 * min(args.turns, (lo + hi) / 6))))
                     for lo, hi in BUCKETS],
        "retrieval": [max(8, int(r_share / ((lo + hi) / 2 * boxes.FACT_TOKENS + 60 + 30 * min(args.turns, max(1, lo // 3)))))
                      for lo, hi in R_BUCKETS]}
    pool = make_pool(enc, n_per_bucket, args.turns, args.workers, args.seed * 50_000_000)
    max_len = {k: [max(len(r[0]) // 2 for r in bucket) for bucket in v] for k, v in pool.items()}
    n_tok = sum(len(r[0]) // 2 for v in pool.values() for bucket in v for r in bucket)
    print(f"{sum(len(b) for v in pool.values() for b in v)} training conversations, "
          f"{n_tok / 1e6:.1f}M tokens, in {time.time() - t0:.1f} s; per bucket "
          f"{ {k: [len(b) for b in v] for k, v in pool.items()} }, longest {max_len}", flush=True)
    assert max(max(v) for v in max_len.values()) < MAX_POSITIONS

    os.makedirs(args.out, exist_ok=True)
    cfg_dict = model_config(vocab)
    work = tempfile.mkdtemp(prefix="boxes-train-")
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    config = AutoConfig.from_pretrained(work)
    config._attn_implementation = "sdpa"
    model = DeepseekV32ForCausalLM(config).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}: {n_params / 1e6:.2f}M parameters", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    probe_attention("cuda")
    experts = probe_experts(model, "cuda")

    indexer_params = [p for n, p in model.named_parameters() if ".indexer." in n]
    main_params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    opt = torch.optim.AdamW([
        {"params": [p for p in main_params if p.dim() >= 2], "weight_decay": 0.1, "base_lr": args.lr},
        {"params": [p for p in main_params if p.dim() < 2], "weight_decay": 0.0, "base_lr": args.lr},
        {"params": indexer_params, "weight_decay": 0.0, "base_lr": args.indexer_lr},
    ], lr=args.lr, betas=(0.9, 0.95), fused=True)
    routers = [m for m in model.modules() if isinstance(m, mdl.DeepseekV32TopkRouter)]
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layer.self_attn.sup_index = i  # training_attention_forward matches it to sup_layer
    TrainState.sup_layer = args.attn_sup_layer % len(layers)
    TrainState.sup_head = args.attn_sup_head
    assert 0 <= TrainState.sup_head < config.num_attention_heads, "--attn-sup-head out of range"
    loads = {}

    def count_load(module, _inp, out):
        loads[module] = torch.bincount(out[2].flatten(), minlength=module.num_experts)

    for r in routers:
        r.register_forward_hook(count_load)

    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed + 1)
    cursors = {k: [0] * len(v) for k, v in pool.items()}
    for v in pool.values():
        for b in v:
            rng.shuffle(b)
    tps = {k: [args.short_tokens_per_step if m <= SHORT_LEN else args.tokens_per_step for m in v]
           for k, v in max_len.items()}
    n_r = len(RETRIEVAL_LEVELS) if args.retrieval_first else 0
    for b in range(n_r):  # the retrieval stage's own batch size
        tps["retrieval"][b] = args.retrieval_tokens_per_step
    # The dense stage's curriculum (tools/boxes/curriculum.py): levels 0 .. n_r - 1 are retrieval
    # questions of RETRIEVAL_LEVELS[l], then level n_r + c opens BUCKETS[:c + 1] of combined
    # questions (with a retrieval share, --retrieval-mix).
    sched = Schedule(n_r, len(BUCKETS), mix=args.retrieval_mix if n_r else 0.0)
    cur = Curriculum(sched.n_levels, advance_at=args.advance_at, floor_start=args.floor[0],
                     floor_end=args.floor[1])
    budget = max(1.0, deadline - time.time())
    t_train = time.time()
    model.train()
    TrainState.active = True
    history, step, stage_switch = [], 0, None
    seen = {k: [0] * len(v) for k, v in pool.items()}
    last = len(BUCKETS) - 1
    # --smoke: the first steps cover every path (short retrieval, short and long dense, long sparse).
    forced = [(False, "retrieval", 0), (False, "combined", 0), (False, "combined", last),
              (True, "combined", last), (True, "combined", SPARSE_FROM)] if args.smoke else []
    while True:
        frac = (time.time() - t_train) / budget
        if frac >= 1.0 and step >= len(forced):
            break
        sparse = frac >= args.dense_frac
        level = cur.level(frac / args.dense_frac, step) if not sparse else sched.n_levels - 1
        if sparse:
            kind, b, newest = "combined", rng.randrange(SPARSE_FROM, len(BUCKETS)), False
        else:  # newest: the level's own bucket, where the accuracy that opens the next is measured
            kind, b, newest = sched.draw(level, rng)
        if step < len(forced):
            (sparse, kind, b), newest = forced[step], False
        TrainState.mode = "sparse" if sparse else "dense"
        if sparse and stage_switch is None:
            stage_switch = step
            print(f"step {step}: sparse attention on (index_topk {INDEX_TOPK}); curriculum rises "
                  f"[step, level, why] {cur.advances}", flush=True)
        bucket = pool[kind][b]
        n = min(len(bucket), max(1, tps[kind][b] // (max_len[kind][b] + PAD_MULTIPLE)))
        if cursors[kind][b] + n > len(bucket):
            rng.shuffle(bucket)
            cursors[kind][b] = 0
        batch = bucket[cursors[kind][b]:cursors[kind][b] + n]
        cursors[kind][b] += n
        seen[kind][b] += len(batch)
        scale = min(1.0, (step + 1) / args.warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * scale
        ids, labels, valid, count, sup = make_batch(batch, "cuda")
        TrainState.rows, TrainState.row_weight = kl_rows(labels, valid, args.kl_queries, gen)
        TrainState.kl = []
        TrainState.sup = sup if args.attn_sup > 0 and len(sup) else None
        TrainState.sup_logp, TrainState.sup_hit = [], []
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, use_cache=False).logits
        lm_loss, plain_loss, count_acc, n_count = weighted_lm_loss(logits, labels, count,
                                                                   args.count_weight)
        kl = torch.stack(TrainState.kl).mean()
        loss = lm_loss + kl
        attn_loss = attn_hit = None
        if TrainState.sup_logp:  # the supervised head: cross-entropy against the fact's digit
            attn_loss = -torch.cat(TrainState.sup_logp).mean()
            attn_hit = torch.cat(TrainState.sup_hit).float().mean().item()
            loss = loss + args.attn_sup * attn_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        torch.nn.utils.clip_grad_norm_(indexer_params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3)
            for r in routers:
                load = loads[r].float()
                r.e_score_correction_bias += args.bias_update * torch.sign(load.mean() - load)
        acc = count_acc.item() if int(n_count) else None
        if not sparse and newest:
            cur.observe(acc, step)
        if step % 25 == 0 or step < len(forced):
            rec = {"step": step, "seconds": round(time.time() - t_train, 1),
                   "stage": TrainState.mode, "kind": kind, "bucket": b, "batch": len(batch),
                   "length": int(ids.shape[1]), "lm_loss": round(plain_loss.item(), 5),
                   "count_acc": None if acc is None else round(acc, 4), "level": level,
                   "indexer_kl": round(kl.item(), 5), "lr_scale": round(scale, 4),
                   "attn_loss": None if attn_loss is None else round(attn_loss.item(), 4),
                   "attn_hit": None if attn_hit is None else round(attn_hit, 4),
                   "max_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1)}
            history.append(rec)
            print(json.dumps(rec), flush=True)
        step += 1
    TrainState.active, TrainState.rows, TrainState.sup = False, None, None
    train_seconds = time.time() - t_train
    final = history[-1] if history else {}
    print(f"trained {step} steps in {train_seconds:.0f} s; conversations per bucket {seen}", flush=True)

    # The shipped folder: FP8 weights with the published per-expert names (transformers'
    # save_pretrained gives the names; the tensors are then quantized here).
    t_save = time.time()
    del opt
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        state = {}
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".safetensors"):
                state.update(load_file(os.path.join(tmp, name)))
    fp8 = quantize_state(state)
    save_file(fp8, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    shipped_cfg = dict(cfg_dict, quantization_config=QUANT_CONFIG)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(shipped_cfg, f, indent=2, sort_keys=True)
    if os.path.abspath(args.tokenizer) != os.path.abspath(args.out):
        shutil.copy(os.path.join(args.tokenizer, "tokenizer.json"), os.path.join(args.out, "tokenizer.json"))
        tcfg = json.load(open(os.path.join(args.tokenizer, "tokenizer_config.json")))
        tcfg["model_max_length"] = MAX_POSITIONS
        with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
            json.dump(tcfg, f, indent=1, ensure_ascii=False)
    size_mb = os.path.getsize(os.path.join(args.out, "model.safetensors")) / 1e6
    n_fp8 = len(fp8_names(state))
    print(f"wrote {args.out}/model.safetensors ({size_mb:.1f} MB, {n_fp8} FP8 weights) in "
          f"{time.time() - t_save:.0f} s", flush=True)

    # Evaluation of what ships: the folder loaded back by transformers (FP8 dequantised: exact in
    # bf16), float32; the teacher-forced runs through the patched attention.
    t_eval = time.time()
    del model, state, fp8
    torch.cuda.empty_cache()
    model, _ = load_reference(args.out)
    test = boxes.problems("test", args.eval_n)
    short = boxes.problems("test", args.eval_short_n, length="short")
    tpb = args.tokens_per_step
    evals = {}
    for mode in ("sparse", "dense", "recent"):
        evals[mode] = teacher_forced(model, enc, test, mode, tpb)
        print(f"teacher-forced exact match, test ({mode}): {evals[mode]['accuracy']:.4f} "
              f"({evals[mode]['correct']}/{evals[mode]['n']}), 95% CI "
              f"[{evals[mode]['ci95'][0]:.4f}, {evals[mode]['ci95'][1]:.4f}]", flush=True)
    for mode in ("sparse", "recent"):
        evals[f"short_{mode}"] = teacher_forced(model, enc, short, mode, tpb)
        print(f"teacher-forced exact match, short ({mode}): "
              f"{evals[f'short_{mode}']['correct']}/{evals[f'short_{mode}']['n']}", flush=True)
    hf = None
    if args.hf_check:  # transformers' own forward (eager) and generate on the same folder
        hf = hf_generate(model, enc, test[:args.hf_check], args.max_new_tokens,
                         os.path.join(args.out, "hf_check_failures.jsonl"))
        print(f"transformers generate on the saved folder (sparse): {hf['correct']}/{hf['n']}", flush=True)
    del model
    report = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(), "parameters": n_params, "config": shipped_cfg,
        "model_mb": round(size_mb, 2), "fp8_weights": n_fp8, "attention": {"causal_flash": TrainState.flash,
                                                     "masked": TrainState.masked},
        "buckets": BUCKETS, "retrieval_buckets": R_BUCKETS, "retrieval_levels": n_r,
        "retrieval_mix": sched.mix, "pool_conversations": {k: [len(b) for b in v] for k, v in pool.items()},
        "seen": seen, "retrieval_tokens_per_step": args.retrieval_tokens_per_step,
        "experts": experts, "turns": args.turns, "tokens_per_step": args.tokens_per_step,
        "short_tokens_per_step": args.short_tokens_per_step, "count_weight": args.count_weight,
        "curriculum": {"advance_at": args.advance_at, "floor": list(args.floor),
                       "rises": cur.advances}, "kl_queries": args.kl_queries,
        "steps": step, "sparse_from_step": stage_switch, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.time() - t_eval, 1),
        "total_seconds": round(time.time() - t_start, 1), "time_budget_s": args.time_budget_s,
        "final": final, "history": history,
        "eval": {"method": "teacher-forced exact match of the whole solution (= greedy "
                           "reproduces it), bf16 autocast, the shipped (dequantised FP8) weights",
                 **evals},
        "hf_check": hf,
        "prompt": f"{BOS}{USER}{{question}}{ASSISTANT}{END_THINK}",
    }
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out} (config.json, model.safetensors, tokenizer, train_report.json) in "
          f"{time.time() - t_start:.0f} s; sparse {evals['sparse']['accuracy']:.3f}, dense "
          f"{evals['dense']['accuracy']:.3f}, recent-window control {evals['recent']['accuracy']:.3f}",
          flush=True)


if __name__ == "__main__":
    main()
