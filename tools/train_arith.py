#!/usr/bin/env python3
"""Trains osprey's bundled arithmetic model (issues #7, #16, #17) on the GPU machine: a ~6.6M-parameter
DeepSeek-V3.2 (transformers' DeepseekV32ForCausalLM) with DeepSeek-V3's multi-token-prediction (MTP)
layer, on tools/arith/generate.py's word problems in three chat modes.

Needs torch, transformers (5.x with deepseek_v32), tokenizers and safetensors; downloads nothing.

  # the one GPU command (training, save, evaluation, osprey's gate, one archive under $OUT):
  scripts/train_arith_tools.sh $OUT build/osprey --device cuda            # < 10 min on one H200
  scripts/train_arith_tools.sh $OUT build/osprey --device cuda -- --smoke # ~2 min: does it run?
  # the script alone:
  python3 tools/train_arith.py --out DIR --minutes 7 --time-budget-s 510  # train, save, evaluate
  python3 tools/train_arith.py --smoke --out /tmp/osprey-arith-smoke       # every code path, tiny
  python3 tools/train_arith.py --eval-only --out DIR [--time-budget-s S]   # evaluate a folder

The architecture (config.json is written in the form osprey reads: rope_scaling + rope_theta):
  4 layers (the first dense), hidden 256, MLA with q_lora 128 / kv_lora 128, 4 heads (nope 32,
  rope 16, v 32); MoE with 16 routed experts in 4 groups (top-2 groups, 4 experts per token), one
  shared expert; the lightning indexer (4 heads × 32) with index_topk 32, below the length of a
  problem and its answer (~100-200 tokens), so the sparse selection decides what is attended.
  Plus one MTP layer (num_nextn_predict_layers 1; --no-mtp: none), as DeepSeek-V3 publishes it
  (../shared/reference/model_math.md §2.8), saved as model.layers.4.*:
    h'_i = eh_proj(cat[enorm(emb(x_{i+1})), hnorm(h_i)])   (the embedding zeroed at position 0)
    then a full decoder layer (MLA + indexer, MoE as the main MoE layers: input_layernorm,
    self_attn.*, post_attention_layernorm, mlp.*), then shared_head.norm, shared_head.head
  predicting x_{i+2}. h_i is the main model's last hidden state after its final norm (what vLLM
  and SGLang hand their MTP layer); the embedding and the output head are the main model's
  (DeepSeek-V3 shares them), saved again under the layer's own names embed_tokens.weight and
  shared_head.head.weight as the published checkpoints do. Drafting K > 1 tokens reuses the layer:
  step k+1 takes the layer's own output (before shared_head.norm) at the previous position and
  the token step k drafted, as vLLM's MTP proposer does.

The prompt (eval/arith_task.h, what `osprey eval --task arith` sends; chat format deepseek-v3.1,
which osprey picks for model_type deepseek_v32):
  <｜begin▁of▁sentence｜><｜User｜>{question}<｜Assistant｜></think>   → "{solution}<｜end▁of▁sentence｜>"
The loss is on the completion tokens only.

Chat modes (issue #17; tools/arith/generate.py chat_segments, rendered as osprey's deepseek-v3.2
chat encoder renders them, which the ctest arith_chat_render checks): plain problems as above;
--thinking-frac of them in thinking mode (<｜Assistant｜><think> → "{steps}</think>The answer is
N."); and --tool-frac of the steps on calculator conversations (the request's tools block in the
prompt → a DSML call with the solution as one expression; the tool's result → "The answer is N.").
The context is 2048 (the tools block is ~1100 tokens).

Training, as DeepSeek trained V3.2's indexer (transformers' indexer returns indices only and gets
no gradient, so attention is re-implemented here for training, with the module's own weights):
  stage 1, dense warm-up (--dense-frac of the time): attention over every causal position; the
    main model learns from the LM loss; the indexer learns from
      KL( p_main ‖ softmax(indexer scores) ),  p_main = main attention probabilities summed over
      heads and renormalised, per query token and layer (the MTP layer's indexer too);
  stage 2, sparse: attention restricted to the indexer's top-k (index_topk); LM loss plus the same
    KL restricted to the selected positions.
  The MTP loss is DeepSeek-V3's (depth 1): loss = LM loss + λ·MTP loss + KL, the MTP loss the
  cross-entropy of x_{i+2} over the trained tokens, its gradient reaching the main model through
  h_i and the shared embedding and head. λ follows DeepSeek-V3: 0.3 (--mtp-weight) for the first
  70% of the time (--mtp-weight-switch; DeepSeek: the first 10T of 14.8T tokens), then 0.1
  (--mtp-weight-late).
  The indexer's inputs are detached (its only signal is the KL; the main model's only signal is
  the LM and MTP losses). The MoE routers' e_score_correction_bias (the MTP layer's too) is
  balanced as DeepSeek's auxiliary-loss-free scheme does (bias += γ·sign(mean load − load)).

Time: --minutes caps the training; --time-budget-s caps the whole run (from the process start):
training then ends --eval-reserve-s before the budget, and every evaluation section stops at the
budget (what it did is reported, with "complete": false), so a device call never overruns.

After training: the weights are saved in bf16 (routers' correction bias fp32) under --out with
the published per-expert names (transformers' save_pretrained for the main model; the MTP layer's
decoder layer through the same conversion), with config.json, the tokenizer and train_report.json
(written before the evaluation and updated after it). The folder is then reloaded with
from_pretrained (float32, eager attention; the MTP layer's tensors are extra keys it ignores,
loaded separately here), checked tensor for tensor against the trained weights, and evaluated
(outputs under --eval-dir, default --out), in this order:
  modes    --modes-eval test problems in thinking mode and through the calculator round trip
           under transformers' generate (left-padded batches; position ids from the attention
           mask, as generate makes them);
  sparse   transformers' own generate (greedy) on --test with the config's index_topk, prompts
           batched by length (no padding: positions as in osprey); final-number extraction as
           GSM8K's flexible-extract; Wilson 95% intervals;
  mtp_acceptance   on those greedy outputs, this script's own MTP implementation (torch): for
           K = 1..--mtp-k the greedy drafts against the main model's greedy tokens, simulated as
           an engine's speculative decoding does it (draft K, accept the matching prefix plus the
           main model's next token): acceptance rate (accepted / proposed), mean acceptance
           length (1 + accepted per verify step, vLLM's definition), per-position acceptance;
           checked against a one-step-at-a-time recomputation (train_report.json "check");
  padding_check   --padding-check thinking prompts generated both unpadded and left-padded;
  dense    as sparse with index_topk above any sequence.
Writes --out/train_report.json (command, time, losses, accuracies, acceptance). The process exits
non-zero when a check or an evaluation section failed (after writing everything).
"""
import time

T_PROCESS = time.time()  # the --time-budget-s clock starts here, before the heavy imports

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
import zlib  # noqa: E402

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import transformers
    from transformers import AutoConfig, DeepseekV32ForCausalLM
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as mdl
    from tokenizers import Tokenizer
    from safetensors.torch import load_file, save_file
except ImportError as e:
    sys.exit(f"train_arith.py needs torch, transformers 5.x (with deepseek_v32), tokenizers and "
             f"safetensors: {e}")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "arith"))
import generate  # noqa: E402  tools/arith/generate.py

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, END_THINK = "<｜User｜>", "<｜Assistant｜>", "</think>"
# The calculator conversation's prompt starts with this (~1100 tokens); encoded once.
TOOLS_PREFIX = BOS + generate.tools_block([generate.CALCULATOR_TOOL])

# The calculator conversation's prompt carries V3.2's tools block (~1100 tokens with this
# tokenizer), so the context is 2048 (YaRN over the 256 trained positions).
MAX_POSITIONS = 2048
# Largest |Δlogit| allowed between the batched MTP drafts and the one-step-at-a-time
# recomputation with dense attention in float32 (TF32 off): the same arithmetic in other shapes
# differs by ~1e-6; a wrong mask or position moves logits by far more than this.
MTP_CHECK_TOLERANCE = 1e-3
# Shortest common prefix that a batch runs once (step_losses); the calculator conversations'
# tools block is ~1100 tokens, a plain batch shares ~3 (worth nothing).
SHARE_MIN_TOKENS = 64
# Conversations of the shared-prefix check at the start of every call (check_prefix_sharing).
SHARE_CHECK_ROWS = 4
# Texts per tokenizer batch when preparing the training data (bounds the Encodings alive at once).
ENCODE_CHUNK = 50_000

FAILURES = []  # what went wrong (checks, evaluation sections): the exit status is 3 if any


def fail(msg):
    FAILURES.append(msg)
    print(f"train_arith: FAILED: {msg}", flush=True)


def model_config(vocab, index_topk, mtp_layers):
    return {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "hidden_size": 256, "intermediate_size": 768, "moe_intermediate_size": 128,
        "num_hidden_layers": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 128, "kv_lora_rank": 128,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
        "n_group": 4, "topk_group": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "index_n_heads": 4, "index_head_dim": 32, "index_topk": index_topk,
        "max_position_embeddings": MAX_POSITIONS, "num_nextn_predict_layers": mtp_layers,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": MAX_POSITIONS / 256,
                         "original_max_position_embeddings": 256, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False, "vocab_size": vocab,
    }


def carrier_config(cfg_dict, folder):
    """A config with one decoder layer more (index num_hidden_layers, an MoE layer like the last
    main one), written into folder: transformers builds, initialises, saves and loads the MTP
    layer's decoder layer as layer N of such a model, with its own per-expert name conversion."""
    d = dict(cfg_dict, num_hidden_layers=cfg_dict["num_hidden_layers"] + 1,
             num_nextn_predict_layers=0)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    config = AutoConfig.from_pretrained(folder)
    config._attn_implementation = "eager"
    return config


class Clock:
    """The run's wall-clock budget: a deadline in time.time() seconds, or none."""

    def __init__(self, deadline):
        self.deadline = deadline

    def left(self):
        return math.inf if self.deadline is None else self.deadline - time.time()

    def expired(self):
        return self.left() <= 0


# ---------------------------------------------------------------------------------------------
# Prompt and data

class Encoder:
    def __init__(self, path):
        if not os.path.exists(path):
            sys.exit(f"train_arith: no tokenizer at {path} (tools/make_bundled_tokenizer.py --corpus arith)")
        self.tok = Tokenizer.from_file(path)
        self.bos, self.eos = self.tok.token_to_id(BOS), self.tok.token_to_id(EOS)
        for s in (BOS, EOS, USER, ASSISTANT, END_THINK):
            if self.tok.token_to_id(s) is None:
                sys.exit(f"train_arith: the tokenizer {path} lacks the special token {s}")

    def prompts(self, questions):
        texts = [f"{BOS}{USER}{q}{ASSISTANT}{END_THINK}" for q in questions]
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    def ids(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def conversations(self, convs):
        """[(ids, trained mask)] of conversations given as [(text, trained)] segments, encoded in
        one batch (the tokenizer's threads). Segments meet at special tokens, so encoding them
        apart gives the ids of the whole text; a segment that starts with TOOLS_PREFIX (which a
        special token follows) is split there and the prefix encoded once."""
        prefix_ids = self.ids(TOOLS_PREFIX)
        texts, plans = [], []
        for segs in convs:
            plan = []
            for text, trained in segs:
                if text.startswith(TOOLS_PREFIX):
                    if not text[len(TOOLS_PREFIX):].startswith(USER):
                        raise ValueError("a tools prompt does not continue with <｜User｜> after "
                                         "the tools block")
                    plan.append((None, trained))
                    text = text[len(TOOLS_PREFIX):]
                plan.append((len(texts), trained))
                texts.append(text)
            plans.append(plan)
        encoded = []  # ids only, in chunks (an Encoding holds far more than its ids)
        for s in range(0, len(texts), ENCODE_CHUNK):
            encoded += [e.ids for e in self.tok.encode_batch(texts[s:s + ENCODE_CHUNK],
                                                              add_special_tokens=False)]
        out = []
        for plan in plans:
            ids, mask = [], []
            for ref, trained in plan:
                part = prefix_ids if ref is None else encoded[ref]
                ids += part
                mask += [trained] * len(part)
            out.append((ids, mask))
        return out

    def check_conversations(self, convs, encoded):
        """Raises unless each conversation's segment-wise ids are the ids of its whole text."""
        for segs, (ids, _) in zip(convs, encoded):
            whole = self.ids("".join(text for text, _ in segs))
            if whole != ids:
                first = next((i for i, (a, b) in enumerate(zip(whole, ids)) if a != b),
                             min(len(whole), len(ids)))
                raise ValueError(f"segment-wise encoding differs from the whole text's at token "
                                 f"{first}: {''.join(t for t, _ in segs)[:200]!r}")


def make_masked_batch(examples, device, share_min=0):
    """Right-padded (pad = eos) inputs and labels (-100 outside the trained segments), and the
    length of the prefix the rows share (0: none) when it is at least share_min tokens, shorter
    than every row and untrained (no label within it or at the position after it): the
    calculator conversations' tools block, which step_losses then runs once."""
    L = max(len(ids) for ids, _ in examples)
    ids_t = torch.full((len(examples), L), 1, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    valid = torch.zeros((len(examples), L), dtype=torch.bool)
    for i, (ids, mask) in enumerate(examples):
        t = torch.tensor(ids)
        ids_t[i, :len(ids)] = t
        m = torch.tensor(mask)
        labels[i, :len(ids)] = torch.where(m, t, torch.full_like(t, -100))
        valid[i, :len(ids)] = True
    shared = 0
    if share_min > 0 and len(examples) > 1:
        same = (ids_t == ids_t[:1]).all(0)
        shared = min(int(same.long().cumprod(0).sum()), min(len(ids) for ids, _ in examples) - 1)
        if shared < share_min or not bool((labels[:, 1:shared + 1] == -100).all()):
            shared = 0
    return ids_t.to(device), labels.to(device), valid.to(device), shared


class NoMask(dict):
    """An attention-mask mapping (the form generate passes) that gives every layer no mask:
    the training attention makes its own, and a suffix at offset positions needs none built."""

    def __missing__(self, key):
        return None


def step_losses(model, mtp, ids, labels, valid, eos, shared=0):
    """(lm_loss, mtp_loss, kl) of a training batch (make_masked_batch's tensors). shared > 0:
    the first `shared` positions, the same in every row and untrained, run once (one row, their
    keys kept: Prefix) and the rows' suffixes over them: the same losses and gradients as the
    whole batch (the prefix's KL terms and router loads counted once per row)."""
    B, S = ids.shape
    pos = torch.arange(S, device=ids.device)
    TrainState.kl, TrainState.load_weight = {}, 1
    try:
        if shared:
            L = shared
            TrainState.prefix, TrainState.valid, TrainState.load_weight = Prefix(B), valid[:1, :L], B
            h_pre = model.model(input_ids=ids[:1, :L], use_cache=False).last_hidden_state  # [1, L, H]
            TrainState.prefix.mode, TrainState.valid, TrainState.load_weight = "use", valid[:, L:], 1
            hidden = model.model(input_ids=ids[:, L:], position_ids=pos[None, L:], attention_mask=NoMask(),
                                 use_cache=False).last_hidden_state                          # [B, S-L, H]
            TrainState.prefix = None
        else:
            L = 0
            TrainState.valid = valid
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state           # [B, S, H]
        logits = model.lm_head(hidden)
        lm_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, L + 1:].flatten(),
                                  ignore_index=-100)
        mtp_loss = torch.zeros((), device=ids.device)
        if mtp is not None:
            embed, rotary = model.model.embed_tokens, model.model.rotary_emb
            # position i: the main hidden state h_i and the token x_{i+1} → x_{i+2}; the last
            # position has no x_{i+1} (eos stands in; it predicts nothing that is trained)
            nxt = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], eos)], dim=1)
            valid_mtp = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1)
            M = max(L - 1, 0)  # the MTP positions shared: h_i and x_{i+1} both in the prefix
            if M:
                TrainState.prefix, TrainState.load_weight = Prefix(B), B
                x = mtp.combine(embed, h_pre[:, :M], nxt[:1, :M], pos[:M])
                mtp.train_block(x, rotary(h_pre, pos[None, :M]), valid_mtp[:1, :M])
                TrainState.prefix.mode, TrainState.load_weight = "use", 1
            h = hidden if not L else torch.cat([h_pre[:, M:L].expand(B, -1, -1), hidden], dim=1)
            x = mtp.combine(embed, h, nxt[:, M:], pos[M:])                                   # [B, S-M, H]
            x = mtp.train_block(x, rotary(hidden, pos[None, M:]), valid_mtp[:, M:])
            TrainState.prefix = None
            mtp_logits = mtp.logits(model.lm_head, x)
            mtp_loss = F.cross_entropy(mtp_logits[:, :-2].flatten(0, 1).float(), labels[:, M + 2:].flatten(),
                                       ignore_index=-100)
        kl = torch.stack([num / den for num, den in TrainState.kl.values()]).mean()
    finally:
        TrainState.prefix, TrainState.load_weight = None, 1
    return lm_loss, mtp_loss, kl


def check_prefix_sharing(model, mtp, examples, eos, device, routers, loads, tolerance=2e-3):
    """step_losses on a batch of calculator conversations with the shared prefix run once
    against the whole batch, float32 without TF32, dense attention: losses, every gradient and
    the router loads. Returns the report; "passed" False (or an exception) turns sharing off."""
    ids, labels, valid, shared = make_masked_batch(examples, device, share_min=1)
    if not shared:
        return {"passed": False, "reason": "the conversations share no untrained prefix"}
    params = [p for p in list(model.parameters()) + (list(mtp.parameters()) if mtp is not None else [])]
    tf32, sparse, active = torch.backends.cuda.matmul.allow_tf32, TrainState.sparse, TrainState.active
    torch.backends.cuda.matmul.allow_tf32, TrainState.sparse, TrainState.active = False, False, True
    runs, seconds = [], []  # seconds: forward + backward, float32 (the first run warms up too)
    try:
        for share in (0, shared):
            loads.clear()
            for p in params:
                p.grad = None
            t0 = time.time()
            losses = step_losses(model, mtp, ids, labels, valid, eos, share)
            sum(losses).backward()
            if ids.is_cuda:
                torch.cuda.synchronize()
            seconds.append(round(time.time() - t0, 3))
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
                               for p in params])
            runs.append(([x.item() for x in losses], grads, {r: loads[r].clone() for r in routers}))
    finally:
        for p in params:
            p.grad = None
        loads.clear()
        torch.backends.cuda.matmul.allow_tf32, TrainState.sparse, TrainState.active = tf32, sparse, active
    (full, g_full, l_full), (part, g_part, l_part) = runs
    loss_diff = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(full, part))
    grad_diff = ((g_full - g_part).norm() / g_full.norm().clamp_min(1e-12)).item()
    load_diff = sum(int((l_full[r] - l_part[r]).abs().sum()) for r in routers)
    res = {"rows": ids.shape[0], "tokens": ids.shape[1], "shared": shared,
           "losses_whole": full, "losses_shared": part, "max_rel_loss_diff": loss_diff,
           "rel_grad_diff": grad_diff, "router_load_diff": load_diff, "tolerance": tolerance,
           "seconds_whole_shared": seconds}
    res["passed"] = loss_diff <= tolerance and grad_diff <= tolerance
    return res


# ---------------------------------------------------------------------------------------------
# Attention for training and for the MTP layer: transformers' MLA math and the V3.2 indexer's
# selection with the modules' own weights, the indexer's scores with gradient and the KL, and
# keys from several streams (the MTP layer's chained draft steps) or from a shared prefix.

class Prefix:
    """A prefix shared by every row of a batch (the calculator conversations' ~1100-token tools
    block), computed once: "record" while one row of it runs (its keys kept per attention
    module, its KL and router loads counted `rows` times, as the rows would count them), then
    "use" while the rows' suffixes run over those keys and their own."""

    def __init__(self, rows):
        self.mode, self.rows, self.kv = "record", rows, {}


class TrainState:
    active = False   # the patched forward of the main layers runs only while training
    sparse = False   # stage 2
    valid = None     # [B, S] bool: real tokens (queries counted in the KL) of the running call
    kl = {}          # per attention module (the MTP layer's included): [Σ KL over queries, queries]
    prefix = None    # a Prefix while a shared-prefix batch runs
    load_weight = 1  # how many rows each token of the running call stands for (router loads)


def causal_mask(S, device):
    """[S, S] bool: query p sees keys j <= p."""
    return torch.ones(S, S, dtype=torch.bool, device=device).tril()


def chain_mask(S, step, device):
    """[S, step·S] bool: the keys the step-`step` draft query at position p sees when the MTP
    layer drafts `step` tokens in a chain started at position p - step + 1: the teacher-forced
    stream 1 (the main model's hidden states and the real tokens) at j <= p - step + 1, and each
    draft stream r (2 <= r <= step; r = step is the query's own) at its one position
    p - step + r: what an engine's MTP KV cache holds then. Step 1 is causal."""
    p = torch.arange(S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    parts = [j <= p - step + 1] + [j == p - step + r for r in range(2, step + 1)]
    return torch.cat(parts, dim=1)


def stream_keys(attn, x, position_embeddings):
    """The keys of one (normed) stream x [B, S, H] of a DeepseekV32Attention at the positions of
    position_embeddings: (MLA key [B, nh, S, dqk], value [B, nh, S, dv], indexer key [B, S, Di]);
    the indexer's from x detached (its only signal is the KL)."""
    B, S, _ = x.shape
    cos, sin = position_embeddings
    compressed_kv = attn.kv_a_proj_with_mqa(x)
    kv_pass, k_rot = torch.split(compressed_kv, [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1)
    k_pass = attn.kv_a_layernorm(kv_pass).view(B, 1, S, attn.kv_lora_rank)
    k_rot = k_rot.view(B, 1, S, attn.qk_rope_head_dim)
    _, k_rot = mdl.apply_rotary_pos_emb_interleave(k_rot, k_rot, cos, sin)
    key, value = attn.expand_kv(k_pass, k_rot)                                # [B, nh, S, d]
    ix = attn.indexer
    rope = ix.qk_rope_head_dim
    k = ix.k_norm(ix.wk(x.detach())).unsqueeze(2)                             # [B, S, 1, Di]
    k_rot, k_pass = torch.split(k, [rope, ix.head_dim - rope], dim=-1)
    _, k_rot = mdl.apply_rotary_pos_emb(k_rot, k_rot, cos, sin, unsqueeze_dim=2)
    return key, value, torch.cat([k_rot, k_pass], dim=-1).squeeze(2)


def cat_keys(parts, rows):
    """The keys of several streams (stream_keys tuples) concatenated along the key positions,
    each broadcast to `rows` rows (a shared prefix's keys have one)."""
    def grow(t):
        return t.expand(rows, *t.shape[1:]) if t.shape[0] != rows else t
    return tuple(torch.cat([grow(p[i]) for p in parts], dim=2 if i < 2 else 1) for i in range(3))


def indexer_scores(ix, xq, q_resid, ikey, position_embeddings):
    """[B, S, T] fp32: Σ_h w[s,h]·relu(scale·q[s,h]·k[t]), as DeepseekV32Indexer computes it but
    differentiable, of the queries (xq [B, S, H], q_resid [B, S, q_lora], at the positions of
    position_embeddings) against the indexer keys ikey [B, T, Di] (stream_keys)."""
    B, S, _ = xq.shape
    cos, sin = position_embeddings
    rope = ix.qk_rope_head_dim
    q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [rope, ix.head_dim - rope], dim=-1)
    q_roped, _ = mdl.apply_rotary_pos_emb(q_rot, q_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_roped, q_pass], dim=-1)                                  # [B, S, Hi, D]
    scores = F.relu(torch.matmul(q.float(), ikey.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(xq.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
    return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)                  # [B, S, T]


def mla_attend(attn, xq, q_pe, keys, allowed, sparse, valid=None, kl_weight=1):
    """MLA output [B, S, H] of a DeepseekV32Attention for the (normed) queries' inputs xq
    [B, S, H] at the positions of q_pe over keys (key, value, indexer key: stream_keys, T key
    positions), restricted to allowed [S, T] and, when sparse, to the indexer's index_topk best
    allowed keys. With valid ([B, S] bool) the indexer's KL to the attention is added to
    TrainState.kl (training), each query counted kl_weight times."""
    B, S, _ = xq.shape
    T = allowed.shape[-1]
    cos, sin = q_pe
    q_resid = attn.q_a_layernorm(attn.q_a_proj(xq))
    q_states = attn.q_b_proj(q_resid).view(B, S, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q_states, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    q_roped, _ = mdl.apply_rotary_pos_emb_interleave(q_rot, q_rot[:, :1], cos, sin)
    query = torch.cat((q_pass, q_roped), dim=-1)                              # [B, nh, S, dqk]
    key, value, ikey = keys                                                   # [B, nh, T, d]

    idx = indexer_scores(attn.indexer, xq.detach(), q_resid.detach(), ikey, q_pe)
    idx = idx.masked_fill(~allowed, float("-inf"))
    if sparse and attn.indexer.index_topk < T:
        top = idx.detach().topk(attn.indexer.index_topk, dim=-1).indices
        sel = torch.zeros(B, S, T, dtype=torch.bool, device=idx.device).scatter(-1, top, True) & allowed
    else:
        sel = allowed.expand(B, S, T)
    logits = torch.matmul(query, key.transpose(2, 3)).float() * attn.scaling
    logits = logits.masked_fill(~sel.unsqueeze(1), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value).transpose(1, 2).reshape(B, S, -1)

    if valid is not None:
        with torch.no_grad():
            target = probs.sum(1)
            target = target / target.sum(-1, keepdim=True)
        logp = torch.log_softmax(idx.masked_fill(~sel, float("-inf")), dim=-1).masked_fill(~sel, 0.0)
        kl = (target * (torch.log(target.clamp_min(1e-12)) - logp)).masked_fill(~sel, 0.0).sum(-1)
        v = valid.float()
        part = [(kl * v).sum() * kl_weight, v.sum() * kl_weight]
        acc = TrainState.kl.get(attn)
        TrainState.kl[attn] = part if acc is None else [acc[0] + part[0], acc[1] + part[1]]
    return attn.o_proj(out)


def mla_attention(attn, xq, xkvs, allowed, position_embeddings, sparse, valid=None):
    """mla_attend over the keys of the R (normed) streams xkvs ([B, S, H] each, positions
    0..S-1, the queries' too), allowed [S, R·S]."""
    keys = cat_keys([stream_keys(attn, x, position_embeddings) for x in xkvs], xq.shape[0])
    return mla_attend(attn, xq, position_embeddings, keys, allowed, sparse, valid)


def train_attention(attn, x, position_embeddings, valid):
    """Causal training attention of the (normed) stream x [B, S, H] (positions those of
    position_embeddings), through TrainState.prefix when a shared prefix runs: "record" keeps
    x's keys (x is the prefix, one row); "use" puts them before x's own (x is the rows'
    suffixes, which see the whole prefix)."""
    pre = TrainState.prefix
    B, S, _ = x.shape
    keys = stream_keys(attn, x, position_embeddings)
    allowed, weight = causal_mask(S, x.device), 1
    if pre is not None and pre.mode == "record":
        pre.kv[attn] = keys
        weight = pre.rows
    elif pre is not None:
        prefix_keys = pre.kv.pop(attn)
        P = prefix_keys[2].shape[1]
        keys = cat_keys([prefix_keys, keys], B)
        allowed = torch.cat([torch.ones(S, P, dtype=torch.bool, device=x.device), allowed], dim=1)
    return mla_attend(attn, x, position_embeddings, keys, allowed, TrainState.sparse, valid, weight)


_original_forward = mdl.DeepseekV32Attention.forward


def training_attention_forward(self, hidden_states, position_embeddings, attention_mask,
                               past_key_values=None, position_ids=None, **kwargs):
    if not TrainState.active:
        return _original_forward(self, hidden_states, position_embeddings, attention_mask,
                                 past_key_values=past_key_values, position_ids=position_ids, **kwargs)
    return train_attention(self, hidden_states, position_embeddings, TrainState.valid), None


mdl.DeepseekV32Attention.forward = training_attention_forward


# ---------------------------------------------------------------------------------------------
# The MTP layer (DeepSeek-V3, depth 1)

class MTPLayer(nn.Module):
    """model.layers.{N}: enorm, hnorm, eh_proj, a decoder layer (`block`: transformers' own
    DeepseekV32DecoderLayer, run here through mla_attention), shared_head.norm. The embedding and
    the head are passed in: the main model's while training, the saved copies when evaluating."""

    def __init__(self, block, config):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = mdl.DeepseekV32RMSNorm(H, eps)
        self.hnorm = mdl.DeepseekV32RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        nn.init.normal_(self.eh_proj.weight, std=getattr(config, "initializer_range", 0.02))
        self.block = block
        self.shared_head = nn.Module()
        self.shared_head.norm = mdl.DeepseekV32RMSNorm(H, eps)

    def combine(self, embed, h_prev, next_ids, positions):
        """[B, S, H] fp32: eh_proj(cat[enorm(emb(next_ids)), hnorm(h_prev)]), the embedding zeroed
        where positions ([S]) is 0 (as vLLM's DeepSeekMultiTokenPredictorLayer)."""
        e = embed(next_ids)
        e = e * (positions != 0).to(e.dtype)[None, :, None]
        return self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h_prev)], dim=-1)).float()

    def block_forward(self, streams, allowed, position_embeddings, sparse, valid=None):
        """The decoder layer (pre-norm residual, as DeepseekV32DecoderLayer) on the last stream's
        inputs, its attention over the keys of all streams (allowed [S, R·S])."""
        blk = self.block
        normed = [blk.input_layernorm(x) for x in streams]
        h = streams[-1] + mla_attention(blk.self_attn, normed[-1], normed, allowed,
                                        position_embeddings, sparse, valid)
        return h + blk.mlp(blk.post_attention_layernorm(h))

    def train_block(self, x, position_embeddings, valid):
        """block_forward of one causal stream x in training (train_attention: a shared prefix's
        keys when TrainState.prefix is on)."""
        blk = self.block
        h = x + train_attention(blk.self_attn, blk.input_layernorm(x), position_embeddings, valid)
        return h + blk.mlp(blk.post_attention_layernorm(h))

    def logits(self, head, x):
        return head(self.shared_head.norm(x))

    def drafts(self, embed, head, hidden, ids, position_embeddings, steps, sparse):
        """Greedy drafts of `steps` chained MTP steps, for every position at once: drafts[s-1]
        [B, S] at position p is the token drafted at step s of the chain whose step 1 sits at
        position p - s + 1 (step 1 at p takes the main hidden[p] and ids[p+1]; step s takes step
        s-1's output and draft at p-1), predicting the token at p + 2. Returns (drafts, logits)."""
        B, S = ids.shape
        pos = torch.arange(S, device=ids.device)
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # the last position's token is unused
        streams = [self.combine(embed, hidden, nxt, pos)]
        drafts, logits, outs = [], [], []
        for s in range(1, steps + 1):
            if s > 1:
                prev_tok = torch.cat([drafts[-1][:, :1], drafts[-1][:, :-1]], dim=1)
                prev_h = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
                streams.append(self.combine(embed, prev_h, prev_tok, pos))
            x = self.block_forward(streams, chain_mask(S, s, ids.device), position_embeddings, sparse)
            lg = self.logits(head, x)
            outs.append(x)
            logits.append(lg)
            drafts.append(lg.argmax(-1))
        return drafts, logits


def simulate_speculative(draft_rows, x, prompt_len, k):
    """Greedy speculative decoding of the sequence x (the main model's greedy output after a
    prompt of prompt_len tokens) with k draft tokens per step; draft_rows[s-1][p] is the step-s
    draft at position p (MTPLayer.drafts). After the prefill the main model has produced
    x[prompt_len]; each verify step drafts k tokens after the last committed one, accepts the
    prefix matching x, and commits it plus the main model's next token. Returns (verify steps,
    accepted drafts, accepted count per draft position)."""
    n = len(x)
    c = prompt_len + 1  # tokens committed
    steps, accepted, at = 0, 0, [0] * k
    while c < n:
        a = 0
        for j in range(1, k + 1):
            tok = c - 1 + j  # the position whose token the j-th draft proposes
            if tok < n and draft_rows[j - 1][c - 3 + j] == x[tok]:
                at[j - 1] += 1
                a += 1
            else:
                break
        steps += 1
        accepted += a
        c += a + 1
    return steps, accepted, at


def sequential_drafts(mtp, embed, head, rotary, hidden, x, c, steps, sparse, device):
    """The drafts for c committed tokens of x computed as an engine does, one step at a time over
    one growing sequence with plain causal attention: positions 0..c-2 from the main hidden
    states (hidden [1, n, H]) and x[1..c-1], then each step's input appended at the next position.
    Returns (tokens, logits [V] per step)."""
    ids = torch.tensor(x[:c], device=device)[None]
    z = mtp.combine(embed, hidden[:, :c - 1], ids[:, 1:c], torch.arange(c - 1, device=device))
    toks, logits = [], []
    for s in range(1, steps + 1):
        S = z.shape[1]
        pe = rotary(z, torch.arange(S, device=device)[None])
        out = mtp.block_forward([z], causal_mask(S, device), pe, sparse)
        lg = mtp.logits(head, out[:, -1])[0]
        toks.append(int(lg.argmax()))
        logits.append(lg)
        if s < steps:
            p = torch.tensor([c - 2 + s], device=device)
            z = torch.cat([z, mtp.combine(embed, out[:, -1:], torch.tensor([[toks[-1]]], device=device), p)], 1)
    return toks, logits


# ---------------------------------------------------------------------------------------------
# Evaluation with transformers' own generate (the reference of the accuracy gate)

NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def flexible_extract(text):
    m = NUMBER.findall(text)
    if not m:
        return "[invalid]"
    return m[-1][0] or m[-1][1]


def normalize(s):
    s = s.replace(",", "").replace("$", "")
    s = re.sub(r"(?s).*#### ", "", s)
    s = re.sub(r"\.$", "", s)
    return s.lower()


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def rate(k, n):
    lo, hi = wilson(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi]}


@torch.no_grad()
def generate_greedy(model, prompts, max_new_tokens, eos, device, clock, left_pad, batch=128):
    """Greedy continuations under transformers' generate, each cut after its first EOS (kept),
    None where the budget ran out first. left_pad False: batches of prompts of one length (no
    padding: positions as in osprey); True: left-padded batches of any lengths (position ids from
    the attention mask, as generate makes them; fewer, fuller batches)."""
    outputs = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    if left_pad:
        groups = [order[s:s + batch] for s in range(0, len(order), batch)]
    else:
        by_len = {}
        for i in order:
            by_len.setdefault(len(prompts[i]), []).append(i)
        groups = [idxs[s:s + batch] for idxs in by_len.values() for s in range(0, len(idxs), batch)]
    for part in groups:
        if clock.expired():
            break
        L = max(len(prompts[i]) for i in part)
        ids = torch.full((len(part), L), eos, dtype=torch.long)
        mask = torch.zeros((len(part), L), dtype=torch.long)
        for row, i in enumerate(part):
            ids[row, L - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, L - len(prompts[i]):] = 1
        ids, mask = ids.to(device), mask.to(device)
        gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)
        for row, i in zip(gen[:, L:].tolist(), part):
            outputs[i] = row[:row.index(eos) + 1] if eos in row else row
    return outputs


def evaluate(model, enc, problems, max_new_tokens, failures_path, device, clock):
    """Plain prompts, greedy; returns (result, [(prompt ids, output ids) or None])."""
    prompts = enc.prompts([p["question"] for p in problems])
    t0 = time.time()
    outs = generate_greedy(model, prompts, max_new_tokens, enc.eos, device, clock, left_pad=False)
    correct = done = 0
    with open(failures_path, "w", encoding="utf-8") as f:
        for p, out in zip(problems, outs):
            if out is None:
                continue
            done += 1
            text = enc.decode(out)
            got = flexible_extract(text)
            if normalize(got) == normalize(str(p["answer"])):
                correct += 1
            else:
                f.write(json.dumps({"id": p["id"], "question": p["question"], "expected": p["answer"],
                                    "extracted": got, "output": text}, ensure_ascii=False) + "\n")
    res = rate(correct, done)
    res.update({"of": len(problems), "complete": done == len(problems),
                "failures": os.path.basename(failures_path), "seconds": round(time.time() - t0, 1)})
    if done < len(problems):
        print(f"train_arith: time budget reached: {done} of {len(problems)} problems evaluated "
              f"(the shortest prompts first)", flush=True)
    seqs = [(pr, out) if out is not None else None for pr, out in zip(prompts, outs)]
    return res, seqs


CALL_RE = re.compile(r'<｜DSML｜parameter name="expression" string="true">(.*?)</｜DSML｜parameter>')


def evaluate_modes(model, enc, problems, max_new_tokens, out_path, device, clock, force_calls):
    """Thinking mode and the calculator round trip under transformers' generate (greedy,
    left-padded batches): thinking is right when the text after </think> names the answer; the
    tool round is right when the call parses, its expression evaluates to the answer, and the
    reply after the tool result names it. force_calls (--smoke): where the model's call does not
    parse, the reference call is sent instead so that the reply path runs too (not counted)."""
    t0 = time.time()
    think = [ids for ids, _ in enc.conversations(
        [generate.chat_segments(p, "thinking")[:1] for p in problems])]
    tool = [ids for ids, _ in enc.conversations(
        [generate.chat_segments(p, "tool")[:1] for p in problems])]
    think_out = generate_greedy(model, think, max_new_tokens, enc.eos, device, clock, left_pad=True)
    call_out = generate_greedy(model, tool, max_new_tokens, enc.eos, device, clock, left_pad=True)
    rows, follow, follow_of = [], [], []
    ok = {"thinking": [0, 0], "tool_call": [0, 0], "tool_answer": [0, 0]}  # [correct, n]
    for i, p in enumerate(problems):
        want = str(p["answer"])
        row = {"id": p["id"], "answer": p["answer"]}
        if think_out[i] is not None:
            out = enc.tok.decode(think_out[i], skip_special_tokens=False)
            _, _, content = out.partition(END_THINK)
            ok["thinking"][0] += normalize(flexible_extract(content)) == want
            ok["thinking"][1] += 1
            row["thinking"] = out
        if call_out[i] is not None:
            call_ids = call_out[i]
            call = enc.tok.decode(call_ids, skip_special_tokens=False)
            m = CALL_RE.search(call)
            try:
                result = generate.calculate(m.group(1)) if m else None
            except ValueError:
                result = None
            ok["tool_call"][0] += result == want
            ok["tool_call"][1] += 1
            row.update({"call": call, "result": result})
            if result is None and force_calls:
                expr = generate.expression(p)
                call_ids = enc.ids(generate.tool_call_text(expr)) + [enc.eos]
                result = generate.calculate(expr)
                row["forced_call"] = True
            if result is not None:
                follow.append(tool[i] + call_ids + enc.ids(generate.tool_result_text(result)))
                follow_of.append(i)
        rows.append(row)
    reply_out = generate_greedy(model, follow, max_new_tokens, enc.eos, device, clock, left_pad=True)
    for i, out in zip(follow_of, reply_out):
        if out is None:
            continue
        answer = enc.decode(out)
        rows[i]["reply"] = answer
        if not rows[i].get("forced_call"):
            ok["tool_answer"][0] += normalize(flexible_extract(answer)) == str(problems[i]["answer"])
            ok["tool_answer"][1] += 1
    with open(out_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    res = {}
    for k, (v, n) in ok.items():
        res[k] = rate(v, n)
        print(f"transformers generate ({k}): {v}/{n} = {res[k]['accuracy']:.4f}, 95% CI "
              f"[{res[k]['ci95'][0]:.4f}, {res[k]['ci95'][1]:.4f}]", flush=True)
    forced = sum(bool(r.get("forced_call")) for r in rows)
    # tool_answer counts the problems whose call parsed to a result: complete when every
    # evaluated call got its reply.
    res.update({"of": len(problems), "outputs": os.path.basename(out_path),
                "complete": ok["thinking"][1] == ok["tool_call"][1] == len(problems)
                and all(o is not None for o in reply_out),
                "forced_calls": forced, "batching": "left-padded", "seconds": round(time.time() - t0, 1)})
    return res


def padding_check(model, enc, problems, max_new_tokens, device, clock):
    """The thinking prompts of `problems` generated unpadded (one length per batch) and left-padded:
    how many continuations are identical (evidence that the modes' left-padded batches are
    the unpadded ones)."""
    prompts = [ids for ids, _ in enc.conversations(
        [generate.chat_segments(p, "thinking")[:1] for p in problems])]
    a = generate_greedy(model, prompts, max_new_tokens, enc.eos, device, clock, left_pad=True)
    b = generate_greedy(model, prompts, max_new_tokens, enc.eos, device, clock, left_pad=False)
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    same = sum(x == y for x, y in pairs)
    print(f"left-padded vs unpadded generate: {same}/{len(pairs)} continuations identical", flush=True)
    return {"compared": len(pairs), "identical": same, "of": len(problems)}


@torch.no_grad()
def mtp_acceptance(ref, mtp, embed, head, seqs, max_k, device, clock, batch=64, check_rows=3):
    """MTP draft acceptance (K = 1..max_k, sparse attention as served) on the main model's greedy
    outputs seqs [(prompt ids, output ids)], the main hidden states from one teacher-forced pass
    of transformers' model over each whole sequence."""
    t0 = time.time()
    items = sorted(((len(p), p + o) for p, o in (s for s in seqs if s is not None)), key=lambda t: len(t[1]))
    if not items:
        if clock.expired():
            print("train_arith: time budget reached: no greedy outputs for the MTP acceptance", flush=True)
            return {"skipped": "time budget reached before the sparse evaluation made any output"}
        raise RuntimeError("no greedy outputs to measure the drafts on (the sparse evaluation made none)")
    stats = {k: {"verify_steps": 0, "accepted": 0, "at": [0] * k} for k in range(1, max_k + 1)}
    main_tf, mtp_tf = [0, 0], [0, 0]  # [agree, tokens]
    rotary = ref.model.rotary_emb
    done, check = 0, None
    for b in range(0, len(items), batch):
        if clock.expired():
            print(f"train_arith: time budget reached: MTP acceptance on {done} of {len(items)} "
                  f"sequences", flush=True)
            break
        part = items[b:b + batch]
        L = max(len(x) for _, x in part)
        ids = torch.full((len(part), L), 1, dtype=torch.long)
        for row, (_, x) in enumerate(part):
            ids[row, :len(x)] = torch.tensor(x)
        ids = ids.to(device)
        hidden = ref.model(input_ids=ids, use_cache=False).last_hidden_state  # [b, L, H]
        main_pred = ref.lm_head(hidden).argmax(-1).tolist()
        pe = rotary(hidden, torch.arange(L, device=device)[None])
        drafts, _ = mtp.drafts(embed, head, hidden, ids, pe, max_k, sparse=True)
        rows = [d.tolist() for d in drafts]
        for r, (P, x) in enumerate(part):
            n = len(x)
            for i in range(P - 1, n - 1):
                main_tf[0] += main_pred[r][i] == x[i + 1]
                main_tf[1] += 1
            for i in range(max(P - 1, 0), n - 2):
                mtp_tf[0] += rows[0][r][i] == x[i + 2]
                mtp_tf[1] += 1
            for k, st in stats.items():
                steps, acc, at = simulate_speculative([d[r] for d in rows], x, P, k)
                st["verify_steps"] += steps
                st["accepted"] += acc
                st["at"] = [u + v for u, v in zip(st["at"], at)]
        if check is None:
            check = mtp_check(mtp, embed, head, rotary, hidden, ids, part[:check_rows], max_k, device)
        done += len(part)
    res = {"sequences": done, "of": len(items), "complete": done == len(items), "index_topk":
           mtp.block.self_attn.indexer.index_topk, "attention": "sparse (index_topk), as served",
           "definition": "each verify step drafts K tokens after the last committed one; the "
                         "drafts matching the main model's greedy tokens are accepted, plus the "
                         "main model's next token; acceptance_rate = accepted / (K·verify_steps), "
                         "mean_acceptance_length = 1 + accepted / verify_steps (vLLM's), "
                         "per_position_acceptance[j] = steps whose j+1-th draft was accepted / steps",
           "teacher_forced": {"main_top1_agreement": main_tf[0] / max(1, main_tf[1]),
                              "mtp_top1": mtp_tf[0] / max(1, mtp_tf[1]), "tokens": mtp_tf[1]},
           "k": {}, "check": check, "seconds": round(time.time() - t0, 1)}
    for k, st in stats.items():
        steps = st["verify_steps"]
        r = {"verify_steps": steps, "proposed": k * steps, "accepted": st["accepted"],
             "acceptance_rate": st["accepted"] / max(1, k * steps),
             "mean_acceptance_length": 1 + st["accepted"] / max(1, steps),
             "per_position_acceptance": [a / max(1, steps) for a in st["at"]]}
        res["k"][str(k)] = r
        print(f"MTP K={k}: acceptance rate {r['acceptance_rate']:.4f}, mean acceptance length "
              f"{r['mean_acceptance_length']:.4f} ({steps} verify steps, {done} sequences)", flush=True)
    print(f"teacher-forced: main top-1 agrees with generate on {res['teacher_forced']['main_top1_agreement']:.4f} "
          f"of the tokens; MTP top-1 (token i+2) {res['teacher_forced']['mtp_top1']:.4f}", flush=True)
    return res


@torch.no_grad()
def mtp_check(mtp, embed, head, rotary, hidden, ids, part, steps, device):
    """MTPLayer.drafts (all positions at once, several key streams) against sequential_drafts (one
    step at a time, one causal stream) at a few committed lengths of a few sequences. Dense
    attention in float32 without TF32: the logits within MTP_CHECK_TOLERANCE, where at most a
    tenth of the comparisons may be off (an MoE routing near-tie that the shapes' rounding flips);
    a wrong mask or position moves most of them. Sparse (top-k near-ties may differ): reported."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        L = ids.shape[1]
        pe = rotary(hidden, torch.arange(L, device=device)[None])
        res = {}
        for name, sparse in (("dense", False), ("sparse", True)):
            _, logits = mtp.drafts(embed, head, hidden, ids, pe, steps, sparse)
            compared = same = over = 0
            worst = 0.0
            for r, (P, x) in enumerate(part):
                n = len(x)
                for c in sorted({P + 1, (P + n) // 2, n - 1}):
                    if not P + 1 <= c <= n - 1:
                        continue
                    toks, seq_logits = sequential_drafts(mtp, embed, head, rotary, hidden[r:r + 1], x,
                                                         c, steps, sparse, device)
                    for s in range(1, steps + 1):
                        par = logits[s - 1][r, c - 3 + s]
                        diff = (par - seq_logits[s - 1]).abs().max().item()
                        worst = max(worst, diff)
                        over += diff > MTP_CHECK_TOLERANCE
                        same += int(par.argmax()) == toks[s - 1]
                        compared += 1
            res[name] = {"compared": compared, "identical_drafts": same, "max_abs_logit_diff": worst,
                         "over_tolerance": over}
        res["tolerance"] = MTP_CHECK_TOLERANCE
        dense = res["dense"]
        res["passed"] = dense["compared"] > 0 and dense["over_tolerance"] <= dense["compared"] // 10
        print(f"MTP draft check (batched vs one step at a time): dense {res['dense']}, sparse "
              f"{res['sparse']}", flush=True)
        if not res["passed"]:
            fail(f"MTP draft check: the batched drafts differ from the sequential ones: {res}")
        return res
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def set_index_topk(model, k):
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = k


# ---------------------------------------------------------------------------------------------
# Saving and loading the folder

def read_safetensors_dir(folder):
    tensors = {}
    names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not names:
        raise RuntimeError(f"save_pretrained wrote no .safetensors file into {folder}: {os.listdir(folder)}")
    for name in names:
        tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def layer_index(name):
    """The decoder layer a tensor name belongs to (model.layers.{i}.…), -1 for none."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def snapshot(module):
    return {k: v.detach().to("cpu", copy=True).float() for k, v in module.state_dict().items()}


def save_folder(out, model, mtp, carrier, cfg_dict, routers):
    """Writes out/model.safetensors: the main model through save_pretrained, the MTP layer's
    decoder layer as layer N of the carrier model through save_pretrained (the same name
    conversion), and the MTP tensors of the published checkpoints; bf16, routers' bias fp32.
    Returns the snapshots (float32, CPU) of the main model's and the MTP block's state dicts."""
    bias = {r: r.e_score_correction_bias.detach().float().clone() for r in routers}
    model.to(torch.bfloat16)
    if mtp is not None:
        carrier.to(torch.bfloat16)
        mtp.to(torch.bfloat16)
    for r, b in bias.items():
        r.e_score_correction_bias.data = b
    expected = {"main": snapshot(model)}
    tensors = {}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors.update(read_safetensors_dir(tmp))
    if mtp is not None:
        N = cfg_dict["num_hidden_layers"]
        pre, last = f"model.layers.{N}.", f"model.layers.{N - 1}."
        if any(k.startswith(pre) for k in tensors):
            raise RuntimeError(f"the main model's save already has tensors named {pre}*")
        expected["mtp_block"] = snapshot(mtp.block)
        carrier.to("cpu")
        with tempfile.TemporaryDirectory() as tmp:
            carrier.save_pretrained(tmp)
            block = {k: v for k, v in read_safetensors_dir(tmp).items() if k.startswith(pre)}
        got = {k[len(pre):] for k in block}
        want = {k[len(last):] for k in tensors if k.startswith(last)}
        if got != want:
            raise RuntimeError(f"the MTP decoder layer saved as {pre}* does not have the tensors of "
                               f"layer {N - 1}: only there {sorted(want - got)[:5]}, only here "
                               f"{sorted(got - want)[:5]}")
        tensors.update(block)
        extra = {"enorm.weight": mtp.enorm.weight, "hnorm.weight": mtp.hnorm.weight,
                 "eh_proj.weight": mtp.eh_proj.weight,
                 "shared_head.norm.weight": mtp.shared_head.norm.weight,
                 # shared with the main model (DeepSeek-V3), saved again as published
                 "embed_tokens.weight": model.model.embed_tokens.weight,
                 "shared_head.head.weight": model.lm_head.weight}
        for k, v in extra.items():
            tensors[pre + k] = v.detach().to("cpu", torch.bfloat16).contiguous().clone()
    path = os.path.join(out, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    print(f"saved {path}: {len(tensors)} tensors, {os.path.getsize(path) / 2**20:.2f} MiB", flush=True)
    return expected


def compare_state(name, module, expected=None, tensors=None, prefix=""):
    """Checks the loaded module's tensors: against expected (the trained snapshot, every tensor)
    or against the file's tensors of the same names (those that exist unconverted). Raises."""
    state = module.state_dict()
    if expected is not None:
        missing = sorted(set(expected) ^ set(state))
        bad = [k for k in expected if k in state and not torch.equal(state[k].detach().float().cpu(), expected[k])]
        if missing or bad:
            raise RuntimeError(f"{name}: the loaded weights are not the trained ones: names differ "
                               f"{missing[:5]}, values differ {bad[:5]} ({len(bad)} tensors)")
        return len(expected)
    compared = 0
    for k, v in state.items():
        if prefix + k in tensors:
            if not torch.equal(v.detach().float().cpu(), tensors[prefix + k].float()):
                raise RuntimeError(f"{name}: {k} as loaded differs from {prefix + k} in the file")
            compared += 1
    if compared == 0:
        raise RuntimeError(f"{name}: none of the loaded tensors is named as in the file")
    return compared


def load_main(folder, device, expected=None):
    """transformers' from_pretrained of the folder (float32, eager). The MTP layer's tensors are
    keys the model does not have; should a transformers version refuse them, or build modules of
    its own for num_nextn_predict_layers, the main tensors are loaded from a copy without them
    (said in the log and the report)."""
    note = None
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    n = cfg["num_hidden_layers"]
    try:
        ref = DeepseekV32ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="eager")
        if expected is not None:
            extra = [k for k in ref.state_dict() if k not in expected]
        else:
            extra = [k for k in ref.state_dict() if "mtp" in k.lower() or layer_index(k) >= n]
        if extra:
            raise RuntimeError(f"the loaded model has tensors beyond the main model's: {extra[:5]}")
    except Exception as e:  # noqa: BLE001  the fallback says what happened
        note = (f"from_pretrained({folder}) as is: {type(e).__name__}: {e}; the main model loaded from "
                f"a copy without the MTP layer (num_nextn_predict_layers 0, no model.layers.{n}.*)")
        print(f"train_arith: {note}", flush=True)
        cfg["num_nextn_predict_layers"] = 0
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        keep = {k: v for k, v in tensors.items() if layer_index(k) < n}
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            save_file(keep, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            ref = DeepseekV32ForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                         attn_implementation="eager")
    tensors = None if expected is not None else load_file(os.path.join(folder, "model.safetensors"))
    checked = compare_state("main model", ref, expected, tensors)
    print(f"main model loaded with from_pretrained: {checked} tensors checked against "
          f"{'the trained weights' if expected is not None else 'the file'}", flush=True)
    return ref.to(device).eval(), note


def load_mtp(folder, cfg_dict, device, expected=None):
    """The MTP layer from the folder's model.safetensors: its decoder layer through
    from_pretrained of the carrier model (the per-expert names converted by transformers), the
    rest directly. Returns (mtp, embed, head) in float32."""
    N = cfg_dict["num_hidden_layers"]
    pre = f"model.layers.{N}."
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    names = ["enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight",
             "shared_head.norm.weight", "shared_head.head.weight"]
    missing = [pre + k for k in names if pre + k not in tensors]
    if missing:
        raise RuntimeError(f"{path} lacks the MTP tensors {missing} (config num_nextn_predict_layers "
                           f"{cfg_dict.get('num_nextn_predict_layers')})")
    tmp = tempfile.mkdtemp()
    try:
        carrier_config(cfg_dict, tmp)
        os.symlink(os.path.abspath(path), os.path.join(tmp, "model.safetensors"))
        carrier = DeepseekV32ForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                         attn_implementation="eager")
        block = carrier.model.layers[N]
        n = compare_state("MTP decoder layer", block, expected, tensors, pre)
        mtp = MTPLayer(block, carrier.config)
        for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
            mod = mtp.get_submodule(k.rsplit(".", 1)[0])
            if mod.weight.shape != tensors[pre + k].shape:
                raise RuntimeError(f"{pre + k}: shape {tuple(tensors[pre + k].shape)}, expected "
                                   f"{tuple(mod.weight.shape)}")
            mod.weight.data.copy_(tensors[pre + k].float())
        embed = nn.Embedding.from_pretrained(tensors[pre + "embed_tokens.weight"].float(), freeze=True)
        head = nn.Linear(*tensors[pre + "shared_head.head.weight"].shape[::-1], bias=False)
        head.weight.data.copy_(tensors[pre + "shared_head.head.weight"].float())
        mtp, embed, head = mtp.to(device).eval(), embed.to(device), head.to(device)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"MTP layer loaded: decoder layer through from_pretrained ({n} tensors checked), "
          f"{len(names)} MTP tensors", flush=True)
    return mtp, embed, head


def section(results, name, fn):
    """Runs one evaluation section; an exception is reported and the others still run."""
    t0 = time.time()
    try:
        results[name] = fn()
    except Exception as e:  # noqa: BLE001  reported, the run goes on, the exit status says it
        traceback.print_exc()
        results[name] = {"error": f"{type(e).__name__}: {e}"}
        fail(f"evaluation section {name}: {type(e).__name__}: {e}")
    print(f"[{name}: {time.time() - t0:.0f} s]", flush=True)


def evaluate_folder(folder, eval_dir, enc, test, args, clock, expected=None):
    """The saved folder under transformers (float32, eager): modes, sparse, mtp_acceptance,
    padding_check, dense (each within the budget; see the module's docstring)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    index_topk = cfg["index_topk"]
    os.makedirs(eval_dir, exist_ok=True)
    ref, note = load_main(folder, args.device, expected and expected["main"])
    results = {"load_note": note} if note else {}
    seqs = []

    def sparse():
        res, s = evaluate(ref, enc, test, args.max_new_tokens, os.path.join(eval_dir, "hf_failures.jsonl"),
                          args.device, clock)
        seqs.extend(s)
        return res

    if args.modes_eval:
        section(results, "modes", lambda: evaluate_modes(
            ref, enc, test[:args.modes_eval], args.max_new_tokens, os.path.join(eval_dir, "hf_modes.jsonl"),
            args.device, clock, force_calls=args.smoke))
    section(results, "sparse", sparse)
    if cfg.get("num_nextn_predict_layers", 0) >= 1:
        def acceptance():
            mtp, embed, head = load_mtp(folder, cfg, args.device, expected and expected.get("mtp_block"))
            return mtp_acceptance(ref, mtp, embed, head, seqs, args.mtp_k, args.device, clock)
        section(results, "mtp_acceptance", acceptance)
    if args.padding_check:
        section(results, "padding_check", lambda: padding_check(
            ref, enc, test[:args.padding_check], args.max_new_tokens, args.device, clock))
    if clock.expired():
        results["dense"] = {"skipped": "time budget reached"}
        print("train_arith: time budget reached: dense evaluation skipped", flush=True)
    else:
        def dense():
            set_index_topk(ref, 1 << 30)
            try:
                res, _ = evaluate(ref, enc, test, args.max_new_tokens,
                                  os.path.join(eval_dir, "hf_failures_dense.jsonl"), args.device, clock)
            finally:
                set_index_topk(ref, index_topk)
            return res
        section(results, "dense", dense)
    for k in ("sparse", "dense"):
        r = results.get(k) or {}
        if "accuracy" in r:
            print(f"transformers generate ({k}): accuracy {r['accuracy']:.4f} ({r['correct']}/{r['n']} of "
                  f"{r['of']}), 95% CI [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] in {r['seconds']} s", flush=True)
    results["budget_reached"] = clock.expired()
    return results


def write_report(out, report):
    with open(os.path.join(out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)


# ---------------------------------------------------------------------------------------------
# Training state across device calls (--save-state / --resume)

STATE_VERSION = 1
# Bytes kept of each float32 in the saved state: the parameters' top 3 (round to nearest: a
# relative error <= 2^-17, a one-time nudge below one AdamW step at the lowest learning rate for
# weights of typical size), Adam's moments' top 2 (bfloat16: they forget in ~10 and ~20 steps,
# betas 0.9 / 0.95), buffers, step counters and integers whole. What the 64 MiB that a device
# call carries in allows: ~43 MiB for this model with its MTP layer, instead of 103 MiB.
PARAM_BYTES, MOMENT_BYTES = 3, 2
# The arguments a resumed call must share with the run it continues (what the model learns).
RUN_ARGS = ("n_train", "n_tool", "batch", "tool_batch", "lr", "indexer_lr", "index_topk",
            "bias_update", "no_mtp", "mtp_weight", "mtp_weight_late", "mtp_weight_switch",
            "dense_frac", "seed", "tool_frac", "thinking_frac", "smoke")


def pack_tensors(entries):
    """[(name, tensor, bytes kept)] → (index, blob): float tensors as the top `bytes` of their
    float32 bits (rounded to nearest), integer tensors as int64, each as byte planes (most
    significant first: the exponents compress), zlib level 1."""
    import numpy as np
    index, chunks, offset = [], [], 0
    for name, t, keep in entries:
        t = t.detach().cpu().contiguous()
        if t.is_floating_point():
            kind, bits = "f32", t.float().numpy().view(np.uint32).astype(np.uint64)
            drop = 8 * (4 - keep)
            if drop:
                bits = (bits + np.uint64(1 << (drop - 1))) >> np.uint64(drop)
        else:
            kind, keep = "i64", 8
            bits = t.long().numpy().view(np.uint64)
        planes = [((bits >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint8).tobytes()
                  for i in reversed(range(keep))]
        data = b"".join(planes)
        index.append({"name": name, "kind": kind, "shape": list(t.shape), "dtype": str(t.dtype),
                      "bytes": keep, "offset": offset, "size": len(data)})
        chunks.append(data)
        offset += len(data)
    return index, zlib.compress(b"".join(chunks), 1)


def unpack_tensors(index, blob):
    """pack_tensors' inverse: {name: tensor} (floats as float32, then the saved dtype)."""
    import numpy as np
    raw = zlib.decompress(blob)
    out = {}
    for e in index:
        data = np.frombuffer(raw, dtype=np.uint8, count=e["size"], offset=e["offset"])
        keep = e["bytes"]
        planes = data.reshape(keep, -1).astype(np.uint64)
        bits = np.zeros(planes.shape[1], dtype=np.uint64)
        for i in range(keep):
            bits |= planes[i] << np.uint64(8 * (keep - 1 - i))
        if e["kind"] == "f32":
            bits <<= np.uint64(8 * (4 - keep))
            t = torch.from_numpy(bits.astype(np.uint32).view(np.float32).copy())
        else:
            t = torch.from_numpy(bits.view(np.int64).copy())
        out[e["name"]] = t.reshape(e["shape"]).to(getattr(torch, e["dtype"].replace("torch.", "")))
    return out


def save_state(folder, meta, modules, opt, extra=None):
    """Writes folder/state.json (meta: counters, schedule, RNG) and folder/tensors.bin (every
    module's state_dict, the optimizer's moments and step counters, the extra {name: integer
    tensor}: the data order). Returns its bytes."""
    os.makedirs(folder, exist_ok=True)
    entries = [(f"extra.{k}", v, 8) for k, v in (extra or {}).items()]
    for prefix, module in modules.items():
        params = {n for n, _ in module.named_parameters()}
        for n, t in module.state_dict().items():
            entries.append((f"{prefix}.{n}", t, PARAM_BYTES if n in params else 4))
    pid = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    for p, st in opt.state.items():
        for k, v in st.items():
            keep = 4 if k == "step" else MOMENT_BYTES
            entries.append((f"opt.{pid[id(p)]}.{k}", v if torch.is_tensor(v) else torch.tensor(float(v)), keep))
    index, blob = pack_tensors(entries)
    meta = dict(meta, version=STATE_VERSION, tensors=index,
                param_groups=[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    tmp = os.path.join(folder, "tensors.bin.tmp")
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, os.path.join(folder, "tensors.bin"))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump(meta, f)
    return len(blob)


def load_state(folder, modules, opt):
    """save_state's inverse: loads the modules and the optimizer in place, returns the meta with
    the extra tensors under meta["extra"]. Exits with a message on a missing, foreign or
    mismatched state."""
    paths = [os.path.join(folder, n) for n in ("state.json", "tensors.bin")]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        sys.exit(f"train_arith: --resume {folder}: no {', '.join(missing)} (unpack the previous call's "
                 f"arith-state.tar* there: cat OUT/arith-state.tar* | tar -x -C {folder})")
    with open(paths[0]) as f:
        meta = json.load(f)
    if meta.get("version") != STATE_VERSION:
        sys.exit(f"train_arith: --resume {folder}: state version {meta.get('version')}, this script "
                 f"reads {STATE_VERSION}")
    with open(paths[1], "rb") as f:
        tensors = unpack_tensors(meta["tensors"], f.read())
    for prefix, module in modules.items():
        sd = module.state_dict()
        got = {n[len(prefix) + 1:]: t for n, t in tensors.items() if n.startswith(prefix + ".")}
        if set(got) != set(sd):
            sys.exit(f"train_arith: --resume {folder}: the saved {prefix} tensors differ from this "
                     f"model's: {sorted(set(got) ^ set(sd))[:5]}")
        bad = [n for n in sd if tuple(sd[n].shape) != tuple(got[n].shape)]
        if bad:
            sys.exit(f"train_arith: --resume {folder}: {prefix} shapes differ at {bad[:5]}")
        module.load_state_dict({n: got[n].to(sd[n].dtype) for n in sd})
    params = [p for g in opt.param_groups for p in g["params"]]
    state = {}
    for name, t in tensors.items():
        if name.startswith("opt."):
            _, i, k = name.split(".", 2)
            state.setdefault(int(i), {})[k] = t.float()
    if any(i >= len(params) for i in state):
        sys.exit(f"train_arith: --resume {folder}: the saved optimizer has more parameters than this model")
    groups = opt.state_dict()["param_groups"]
    for g, saved in zip(groups, meta["param_groups"]):
        g.update({k: v for k, v in saved.items() if k != "params"})
    opt.load_state_dict({"state": state, "param_groups": groups})
    meta["extra"] = {n[len("extra."):]: t for n, t in tensors.items() if n.startswith("extra.")}
    return meta


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="model folder (default models/osprey-arith; "
                    "/tmp/osprey-arith-smoke with --smoke)")
    ap.add_argument("--eval-dir", default=None, help="where the evaluation writes its failures and "
                    "outputs (default: --out)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "osprey-arith"),
                    help="folder with tokenizer.json (tools/make_bundled_tokenizer.py --corpus arith)")
    ap.add_argument("--test", default=os.path.join(ROOT, "tests", "data", "arith", "test.jsonl"))
    ap.add_argument("--dev", default=os.path.join(ROOT, "tests", "data", "arith", "dev.jsonl"))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--minutes", type=float, default=7.0, help="training time cap")
    ap.add_argument("--time-budget-s", type=float, default=0.0,
                    help="wall-clock budget of the whole run from the process start (0: none): "
                         "training ends --eval-reserve-s before it, evaluation sections stop at it")
    ap.add_argument("--eval-reserve-s", type=float, default=120.0,
                    help="seconds of --time-budget-s kept for saving and evaluating")
    ap.add_argument("--dense-frac", type=float, default=0.3, help="share of the time in the dense warm-up")
    ap.add_argument("--n-train", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--indexer-lr", type=float, default=2e-3)
    ap.add_argument("--index-topk", type=int, default=32)
    ap.add_argument("--bias-update", type=float, default=1e-3, help="γ of the router bias balancing")
    ap.add_argument("--no-mtp", action="store_true", help="no MTP layer (num_nextn_predict_layers 0)")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="λ of the MTP loss at first")
    ap.add_argument("--mtp-weight-late", type=float, default=0.1, help="λ after --mtp-weight-switch")
    ap.add_argument("--mtp-weight-switch", type=float, default=0.7,
                    help="share of the training time after which λ is --mtp-weight-late")
    ap.add_argument("--mtp-k", type=int, default=3, help="largest K of the acceptance evaluation")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--eval-limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tool-frac", type=float, default=0.3,
                    help="share of the steps on calculator-tool conversations")
    ap.add_argument("--tool-batch", type=int, default=48, help="conversations per tool step")
    ap.add_argument("--thinking-frac", type=float, default=0.25,
                    help="share of the plain batches' problems in thinking mode")
    ap.add_argument("--n-tool", type=int, default=60_000, help="tool conversations prepared")
    ap.add_argument("--modes-eval", type=int, default=300,
                    help="test problems for the thinking and tool evaluation (0: none)")
    ap.add_argument("--padding-check", type=int, default=8,
                    help="thinking prompts generated both unpadded and left-padded (0: none)")
    ap.add_argument("--phase", default="1/1", help="K/N: this call is the K-th of a run of N device "
                    "calls (1/1: one call, as before); K < N trains until its budget and saves the state "
                    "(--save-state), K > 1 continues it (--resume), K = N then saves and evaluates")
    ap.add_argument("--save-state", default=None, help="folder for the training state (calls K < N)")
    ap.add_argument("--resume", default=None, help="the previous call's --save-state folder (calls K > 1)")
    ap.add_argument("--plan-train-s", type=float, default=0.0,
                    help="the run's training seconds over all its calls, which the schedule's progress "
                         "(warm-up, dense/sparse, MTP weight, cosine) follows (0: call 1's training "
                         "budget times N, less the last call's larger reserve)")
    ap.add_argument("--state-reserve-s", type=float, default=20.0,
                    help="seconds of --time-budget-s kept for saving the state (calls K < N)")
    ap.add_argument("--no-share-prefix", dest="share_prefix", action="store_false",
                    help="run the calculator conversations' common tools block with every row "
                         "(default: once per batch, checked against the whole batch at the start)")
    ap.add_argument("--smoke", action="store_true", help="a few steps on tiny data, then a small eval")
    ap.add_argument("--no-eval", action="store_true",
                    help="save the trained folder and stop (evaluate later with --eval-only)")
    ap.add_argument("--eval-only", action="store_true",
                    help="no training: evaluate the folder --out with transformers' generate")
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.n_train, args.eval_limit, args.batch = 0.5, 2000, 24, 32
        args.n_tool, args.tool_batch, args.modes_eval, args.max_new_tokens = 200, 8, 8, 24
        args.padding_check = 4
    if args.out is None:
        args.out = "/tmp/osprey-arith-smoke" if args.smoke else os.path.join(ROOT, "models", "osprey-arith")
    args.eval_dir = args.eval_dir or args.out
    m = re.fullmatch(r"(\d+)/(\d+)", args.phase)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        ap.error(f"--phase {args.phase}: expected K/N with 1 <= K <= N, e.g. 1/3")
    args.phase = (int(m.group(1)), int(m.group(2)))
    if (args.phase[0] < args.phase[1]) != (args.save_state is not None):
        ap.error(f"--phase {args.phase[0]}/{args.phase[1]}: --save-state is for the calls before the "
                 f"last one (and only for them)")
    if (args.phase[0] > 1) != (args.resume is not None):
        ap.error(f"--phase {args.phase[0]}/{args.phase[1]}: --resume is for the calls after the first "
                 f"one (and only for them)")
    if args.eval_only and (args.save_state or args.resume):
        ap.error("--eval-only trains nothing: no --save-state or --resume")
    if not 1 <= args.mtp_k <= 3:
        ap.error("--mtp-k must be 1, 2 or 3")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("train_arith: --device cuda but torch sees no CUDA device")
    clock = Clock(T_PROCESS + args.time_budget_s if args.time_budget_s > 0 else None)
    dev_type = "cuda" if args.device.startswith("cuda") else "cpu"
    t_start = time.time()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True

    enc = Encoder(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = enc.tok.get_vocab_size(with_added_tokens=True)
    test = [json.loads(line) for line in open(args.test, encoding="utf-8")]
    if args.eval_limit:
        test = test[:args.eval_limit]
    if args.eval_only:
        if not os.path.exists(os.path.join(args.out, "config.json")):
            sys.exit(f"train_arith: --eval-only: no config.json in {args.out}")
        results = evaluate_folder(args.out, args.eval_dir, enc, test, args, clock)
        path = os.path.join(args.out, "train_report.json")
        report = json.load(open(path)) if os.path.exists(path) else {}
        report["eval"] = results
        report["eval_command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
        report["eval_failures"] = FAILURES
        write_report(args.out, report)
        return 3 if FAILURES else 0

    os.makedirs(args.out, exist_ok=True)
    use_mtp = not args.no_mtp
    cfg_dict = model_config(vocab, args.index_topk, 1 if use_mtp else 0)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        # transformers builds the main model alone (the MTP layer is this script's); config.json
        # gets num_nextn_predict_layers 1 after the save
        json.dump(dict(cfg_dict, num_nextn_predict_layers=0), f, indent=2, sort_keys=True)
    if os.path.abspath(args.tokenizer) != os.path.abspath(args.out):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    config = AutoConfig.from_pretrained(args.out)
    config._attn_implementation = "eager"
    model = DeepseekV32ForCausalLM(config).to(args.device)
    if len(model.model.layers) != cfg_dict["num_hidden_layers"]:
        sys.exit(f"train_arith: transformers built {len(model.model.layers)} decoder layers, the "
                 f"config has {cfg_dict['num_hidden_layers']}")
    n_main = sum(p.numel() for p in model.parameters())
    mtp = carrier = None
    n_mtp = 0
    if use_mtp:
        with tempfile.TemporaryDirectory() as tmp:
            carrier = DeepseekV32ForCausalLM(carrier_config(cfg_dict, tmp))
        N = cfg_dict["num_hidden_layers"]
        mtp = MTPLayer(carrier.model.layers[N], config).to(args.device)
        if not any(isinstance(m, mdl.DeepseekV32TopkRouter) for m in mtp.block.mlp.modules()):
            sys.exit(f"train_arith: the carrier's layer {N} is not an MoE layer ({type(mtp.block.mlp).__name__})")
        n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {n_main / 1e6:.2f}M "
          f"parameters + MTP layer {n_mtp / 1e6:.2f}M (embedding and head shared)", flush=True)

    dev = [json.loads(line) for line in open(args.dev, encoding="utf-8")]
    held_out = {p["question"] for p in test + dev}
    t0 = time.time()
    train = generate.training_problems(args.n_train, exclude_questions=held_out)
    rng = random.Random(args.seed + 1)
    convs = [generate.chat_segments(p, "thinking" if rng.random() < args.thinking_frac else "plain")
             for p in train]
    tool_convs = [generate.chat_segments(p, "tool") for p in train[:args.n_tool]]
    data = enc.conversations(convs)
    tool_data = enc.conversations(tool_convs)
    enc.check_conversations(convs[:32] + tool_convs[:8], data[:32] + tool_data[:8])
    del convs, tool_convs
    lens = [len(ids) for ids, _ in data]
    tlens = [len(ids) for ids, _ in tool_data]
    print(f"{len(data)} training problems ({args.thinking_frac:.0%} thinking) and {len(tool_data)} "
          f"tool conversations in {time.time() - t0:.1f} s; tokens mean {sum(lens) / len(lens):.0f} "
          f"(max {max(lens)}), tool mean {sum(tlens) / len(tlens):.0f} (max {max(tlens)}); "
          f"index_topk {args.index_topk}", flush=True)
    if max(tlens) >= MAX_POSITIONS:
        sys.exit(f"train_arith: a tool conversation has {max(tlens)} tokens, the context {MAX_POSITIONS}")

    named = list(model.named_parameters()) + ([("mtp." + n, p) for n, p in mtp.named_parameters()]
                                              if mtp is not None else [])
    indexer_params = [p for n, p in named if ".indexer." in n]
    main_params = [p for n, p in named if ".indexer." not in n]
    decay = [p for p in main_params if p.dim() >= 2]
    no_decay = [p for p in main_params if p.dim() < 2]
    opt = torch.optim.AdamW([
        {"params": decay, "weight_decay": 0.1, "lr": args.lr, "base_lr": args.lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": args.lr, "base_lr": args.lr},
        {"params": indexer_params, "weight_decay": 0.0, "lr": args.indexer_lr, "base_lr": args.indexer_lr},
    ], betas=(0.9, 0.95), **({"fused": True} if dev_type == "cuda" else {}))

    modules = list(model.modules()) + (list(mtp.modules()) if mtp is not None else [])
    routers = [m for m in modules if isinstance(m, mdl.DeepseekV32TopkRouter)]
    loads = {}

    def count_load(module, _inp, out):  # summed over a step's calls (a shared prefix counts per row)
        n = torch.bincount(out[2].flatten(), minlength=module.num_experts) * TrainState.load_weight
        loads[module] = n if module not in loads else loads[module] + n

    hooks = [r.register_forward_hook(count_load) for r in routers]
    state_modules = {"model": model, **({"mtp": mtp} if mtp is not None else {})}
    run_args = {k: getattr(args, k) for k in RUN_ARGS}
    phase, phases = args.phase
    intermediate = phase < phases

    # The run so far (--resume) or a new one; the schedule's progress frac runs 0 → 1 over the
    # run's planned training seconds (plan_s, fixed by its first call), continuously across calls.
    if args.resume:
        meta = load_state(args.resume, state_modules, opt)
        if meta["run_args"] != run_args:
            diff = {k: (meta["run_args"].get(k), v) for k, v in run_args.items() if meta["run_args"].get(k) != v}
            sys.exit(f"train_arith: --resume {args.resume}: this call's arguments differ from the run's "
                     f"(saved, now): {diff}")
        if meta["phases"] != phases or meta["phase"] + 1 != phase:
            sys.exit(f"train_arith: --resume {args.resume}: the state is from call {meta['phase']}/"
                     f"{meta['phases']}; this is --phase {phase}/{phases} (expected {meta['phase'] + 1}/"
                     f"{meta['phases']})")
        order, tool_order = (meta["extra"][k].tolist() for k in ("order", "tool_order"))
        if sorted(order) != list(range(len(data))) or sorted(tool_order) != list(range(len(tool_data))):
            sys.exit(f"train_arith: --resume {args.resume}: the saved data order covers {len(order)} "
                     f"problems and {len(tool_order)} conversations; this call made {len(data)} and "
                     f"{len(tool_data)}")
        random.setstate((meta["random"][0], tuple(meta["random"][1]), meta["random"][2]))
        torch.set_rng_state(torch.tensor(meta["torch_rng"], dtype=torch.uint8))
        history, step, stage_switch = meta["history"], meta["step"], meta["sparse_from_step"]
        tool_steps, frac0, trained0, plan_s = meta["tool_steps"], meta["frac"], meta["train_seconds"], meta["plan_s"]
        cursor, tool_cursor = meta["cursor"], meta["tool_cursor"]
        calls = meta["calls"]
        print(f"resumed {args.resume}: call {phase}/{phases} from step {step}, schedule at {frac0:.3f} of "
              f"{plan_s:.0f} s, {trained0:.0f} s trained", flush=True)
    else:
        if phase != 1:
            sys.exit(f"train_arith: --phase {phase}/{phases} needs --resume (the state of call {phase - 1})")
        history, step, stage_switch, tool_steps, frac0, trained0, plan_s, calls = [], 0, None, 0, 0.0, 0.0, None, []
        order = list(range(len(data)))
        random.shuffle(order)
        cursor = 0
        tool_order = list(range(len(tool_data)))
        random.shuffle(tool_order)
        tool_cursor = 0

    share_report = None
    if args.share_prefix and tool_data and args.tool_frac > 0:
        try:
            share_report = check_prefix_sharing(model, mtp, [tool_data[i] for i in tool_order[:SHARE_CHECK_ROWS]], enc.eos,
                                                args.device, routers, loads)
        except Exception as e:  # noqa: BLE001  reported; the batches then run whole
            traceback.print_exc()
            share_report = {"passed": False, "error": f"{type(e).__name__}: {e}"}
        print(f"shared-prefix check (tool conversations, prefix run once vs the whole batch): {share_report}",
              flush=True)
        if not share_report["passed"]:
            print("train_arith: the shared-prefix check failed: the tool batches run whole", flush=True)
    share_min = SHARE_MIN_TOKENS if share_report and share_report["passed"] else 0

    t_train = time.time()
    reserve = args.state_reserve_s if intermediate else args.eval_reserve_s
    budget = args.minutes * 60.0
    if clock.deadline is not None:
        budget = min(budget, clock.left() - reserve)
        if budget < 10:
            sys.exit(f"train_arith: --time-budget-s {args.time_budget_s:.0f} leaves {budget:.0f} s for "
                     f"training after {t_train - T_PROCESS:.0f} s of setup and a reserve of {reserve:.0f} s")
    if plan_s is None:  # the run's first call: its own budget, and the later calls' like it
        plan_s = args.plan_train_s or (budget * (phases - 1) + max(
            60.0, budget + args.state_reserve_s - args.eval_reserve_s) if phases > 1 else budget)
    # an intermediate call advances frac at the planned rate; the last call takes it to 1 in the
    # time it has (however much the earlier calls trained)
    rate = 1.0 / plan_s if intermediate else (1.0 - frac0) / budget
    print(f"training for {budget:.0f} s (call {phase}/{phases}, --minutes {args.minutes}, --time-budget-s "
          f"{args.time_budget_s:.0f}, setup {t_train - T_PROCESS:.0f} s); schedule {frac0:.3f} → "
          f"{min(1.0, frac0 + rate * budget):.3f} of the run's {plan_s:.0f} s", flush=True)
    model.train()
    if mtp is not None:
        mtp.train()
    TrainState.active = True
    warmup_steps = 100 if not args.smoke else 5
    step0, tool_steps0, shared_steps = step, tool_steps, 0

    def record(at):  # the losses of the step just done (the loop's variables)
        rec = {"step": at, "seconds": round(trained0 + time.time() - t_train, 1),
               "stage": "sparse" if TrainState.sparse else "dense",
               "lm_loss": round(lm_loss.item(), 5), "mtp_loss": round(mtp_loss.item(), 5),
               "mtp_weight": lam if use_mtp else 0.0,
               "indexer_kl": round(kl.item(), 5), "lr_scale": round(scale, 4)}
        if not all(math.isfinite(rec[k]) for k in ("lm_loss", "mtp_loss", "indexer_kl")):
            sys.exit(f"train_arith: the loss is not finite at step {at}: {rec}")
        history.append(rec)
        print(json.dumps(rec), flush=True)

    frac = frac0
    while True:
        elapsed = time.time() - t_train
        frac = frac0 + rate * elapsed
        if frac >= 1.0 or elapsed >= budget:
            break
        TrainState.sparse = frac >= args.dense_frac
        if TrainState.sparse and stage_switch is None:
            stage_switch = step
            print(f"step {step}: sparse attention on (index_topk {args.index_topk})", flush=True)
        scale = min(1.0, (step + 1) / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * scale
        lam = args.mtp_weight if frac < args.mtp_weight_switch else args.mtp_weight_late
        if random.random() < args.tool_frac:
            if tool_cursor + args.tool_batch > len(tool_order):
                random.shuffle(tool_order)
                tool_cursor = 0
            batch = [tool_data[i] for i in tool_order[tool_cursor:tool_cursor + args.tool_batch]]
            tool_cursor += args.tool_batch
            tool_steps += 1
        else:
            if cursor + args.batch > len(order):
                random.shuffle(order)
                cursor = 0
            batch = [data[i] for i in order[cursor:cursor + args.batch]]
            cursor += args.batch
        ids, labels, valid, shared = make_masked_batch(batch, args.device, share_min)
        shared_steps += shared > 0
        loads.clear()
        # bf16 autocast on the GPU; float32 on the CPU (a test run: CPU autocast differs, e.g.
        # its layer_norm does not run in float32)
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=dev_type == "cuda"):
            lm_loss, mtp_loss, kl = step_losses(model, mtp, ids, labels, valid, enc.eos, shared)
        loss = lm_loss + lam * mtp_loss + kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        torch.nn.utils.clip_grad_norm_(indexer_params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3)
            for r in routers:
                load = loads[r].float()
                r.e_score_correction_bias += args.bias_update * torch.sign(load.mean() - load)
        if step % 50 == 0:
            record(step)
        step += 1
    if step > step0 and history[-1]["step"] != step - 1:
        record(step - 1)  # the last step's losses
    TrainState.active, TrainState.valid, TrainState.kl = False, None, {}
    for h in hooks:
        h.remove()
    call_seconds = time.time() - t_train
    train_seconds = trained0 + call_seconds
    calls.append({"phase": phase, "steps": step - step0, "tool_steps": tool_steps - tool_steps0,
                  "shared_prefix_steps": shared_steps, "train_seconds": round(call_seconds, 1),
                  "setup_seconds": round(t_train - T_PROCESS, 1), "frac_end": round(min(frac, 1.0), 4),
                  "steps_per_second": round((step - step0) / max(call_seconds, 1e-9), 2),
                  "shared_prefix_check": share_report})
    final = history[-1] if history else {}
    print(f"trained {step - step0} steps in {call_seconds:.0f} s ({calls[-1]['steps_per_second']} steps/s, "
          f"{shared_steps} tool steps with the prefix shared); {step} steps, {train_seconds:.0f} s in the "
          f"run; last lm loss {final.get('lm_loss')}, mtp loss {final.get('mtp_loss')}, indexer KL "
          f"{final.get('indexer_kl')}", flush=True)

    if intermediate:
        t_save = time.time()
        rs = random.getstate()
        meta = {"run_args": run_args, "phase": phase, "phases": phases, "step": step,
                "sparse_from_step": stage_switch, "tool_steps": tool_steps, "frac": min(frac, 1.0),
                "train_seconds": train_seconds, "plan_s": plan_s, "history": history, "calls": calls,
                "cursor": cursor, "tool_cursor": tool_cursor,
                "random": [rs[0], list(rs[1]), rs[2]], "torch_rng": torch.get_rng_state().tolist(),
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
        size = save_state(args.save_state, meta, state_modules, opt,
                          {"order": torch.tensor(order), "tool_order": torch.tensor(tool_order)})
        print(f"saved the training state of call {phase}/{phases} in {args.save_state} ({size / 2**20:.1f} "
              f"MiB of tensors) in {time.time() - t_save:.1f} s; {time.time() - T_PROCESS:.0f} s after the "
              f"start", flush=True)
        return 0

    # Save: bf16 weights (the routers' correction bias stays fp32), published per-expert names.
    t_save = time.time()
    expected = save_folder(args.out, model, mtp, carrier, cfg_dict, routers)
    with open(os.path.join(args.out, "config.json"), "w") as f:  # ours, not transformers' form
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    del model, mtp, carrier, opt
    if dev_type == "cuda":
        torch.cuda.empty_cache()

    report = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if dev_type == "cuda" else "cpu",
        "parameters": n_main, "mtp_parameters": n_mtp, "config": cfg_dict,
        "mtp": None if not use_mtp else {
            "layers": 1, "depth": 1, "tensors": f"model.layers.{cfg_dict['num_hidden_layers']}.*",
            "input": "eh_proj(cat[enorm(emb(x_{i+1})), hnorm(h_i)]), h_i after the main final norm, "
                     "embedding zeroed at position 0",
            "draft_chain": "step k+1: the MTP layer's output before shared_head.norm at the previous "
                           "position and step k's draft",
            "loss_weight": {"first": args.mtp_weight, "late": args.mtp_weight_late,
                            "switch_at_time_fraction": args.mtp_weight_switch}},
        "train_problems": len(data), "steps": step, "sparse_from_step": stage_switch,
        "tool_conversations": len(tool_data), "tool_steps": tool_steps,
        "thinking_frac": args.thinking_frac, "chat_modes": ["plain", "thinking", "tool"],
        "tool": generate.CALCULATOR_TOOL, "batch": args.batch, "minutes": args.minutes,
        "time_budget_s": args.time_budget_s, "eval_reserve_s": args.eval_reserve_s,
        "setup_seconds": round(t_train - T_PROCESS, 1), "train_seconds": round(train_seconds, 1),
        "save_seconds": round(time.time() - t_save, 1),
        "plan_train_seconds": round(plan_s, 1), "calls": calls,
        "resumed_from": args.resume or None,
        "final": final, "history": history, "eval": None,
        "prompt": f"{BOS}{USER}{{question}}{ASSISTANT}{END_THINK}",
    }
    write_report(args.out, report)  # before the evaluation: nothing is lost if it fails
    print(f"wrote {args.out} (config.json, model.safetensors, tokenizer, train_report.json) "
          f"{time.time() - t_start:.0f} s after the start", flush=True)
    if not args.no_eval:
        t_eval = time.time()
        try:
            report["eval"] = evaluate_folder(args.out, args.eval_dir, enc, test, args, clock, expected)
        except Exception as e:  # noqa: BLE001  loading failed: reported, the folder stays
            traceback.print_exc()
            report["eval"] = {"error": f"{type(e).__name__}: {e}"}
            fail(f"evaluation: {type(e).__name__}: {e}")
        report["eval_seconds"] = round(time.time() - t_eval, 1)
    report["total_seconds"] = round(time.time() - T_PROCESS, 1)
    report["failures"] = FAILURES
    write_report(args.out, report)
    print(f"done in {time.time() - T_PROCESS:.0f} s (budget {args.time_budget_s:.0f} s)"
          + (f"; FAILED: {FAILURES}" if FAILURES else ""), flush=True)
    return 3 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
