#!/usr/bin/env python3
"""Trains osprey's bundled arithmetic model (issue #7) on the GPU machine: a ~7M-parameter
DeepSeek-V3.2 (transformers' DeepseekV32ForCausalLM) on tools/arith/generate.py's word problems.

Needs torch and transformers (5.x with deepseek_v32) and nothing else; downloads nothing.

The architecture (config.json is written in the form osprey reads: rope_scaling + rope_theta):
  4 layers (the first dense), hidden 256, MLA with q_lora 128 / kv_lora 128, 4 heads (nope 32,
  rope 16, v 32); MoE with 16 routed experts in 4 groups (top-2 groups, 4 experts per token), one
  shared expert; the lightning indexer (4 heads × 32) with index_topk 32, below the length of a
  problem and its answer (~100-200 tokens), so the sparse selection decides what is attended.

The prompt (eval/arith_task.h, what `osprey eval --task arith` sends; chat format deepseek-v3.1,
which osprey picks for model_type deepseek_v32):
  <｜begin▁of▁sentence｜><｜User｜>{question}<｜Assistant｜></think>   → "{solution}<｜end▁of▁sentence｜>"
The loss is on the completion tokens only.

Chat modes (issue #17; tools/arith/generate.py chat_segments, rendered as osprey's deepseek-v3.2
chat encoder renders them, which the ctest arith_chat_render checks): plain problems as above;
--thinking-frac of them in thinking mode (<｜Assistant｜><think> → "{steps}</think>The answer is
N."); and --tool-frac of the steps on calculator conversations (the request's tools block in the
prompt → a DSML call with the solution as one expression; the tool's result → "The answer is N.").
The context is 2048 (the tools block is ~1100 tokens). After training, --modes-eval test problems
are also run in thinking mode and through the calculator round trip (train_report.json "modes").

Training, as DeepSeek trained V3.2's indexer (transformers' indexer returns indices only and gets
no gradient, so attention is re-implemented here for training, with the module's own weights):
  stage 1, dense warm-up (--dense-frac of the time): attention over every causal position; the
    main model learns from the LM loss; the indexer learns from
      KL( p_main ‖ softmax(indexer scores) ),  p_main = main attention probabilities summed over
      heads and renormalised, per query token and layer;
  stage 2, sparse: attention restricted to the indexer's top-k (index_topk); LM loss plus the same
    KL restricted to the selected positions.
  The indexer's inputs are detached (its only signal is the KL; the main model's only signal is
  the LM loss). The MoE routers' e_score_correction_bias is balanced as DeepSeek's
  auxiliary-loss-free scheme does (bias += γ·sign(mean load − load) after each step).

After training: the weights are saved in bf16 (routers' correction bias fp32) under --out with
the published per-expert names (transformers' save_pretrained), with config.json and the
tokenizer; the folder is then reloaded with from_pretrained (float32, eager attention) and
evaluated with transformers' own generate (greedy) on --test: sparse (the config's index_topk)
and dense (index_topk above any sequence); final-number extraction as GSM8K's flexible-extract.
Writes --out/train_report.json (command, time, losses, accuracies) and the failures JSONL.

  python3 tools/train_arith.py --out models/osprey-arith            # ~10 min on one H200
  python3 tools/train_arith.py --smoke --out /tmp/osprey-arith-smoke # a minute: does it run?
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import transformers
from transformers import AutoConfig, DeepseekV32ForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as mdl
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "arith"))
import generate  # noqa: E402  tools/arith/generate.py

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, END_THINK = "<｜User｜>", "<｜Assistant｜>", "</think>"


# The calculator conversation's prompt carries V3.2's tools block (~1100 tokens with this
# tokenizer), so the context is 2048 (YaRN over the 256 trained positions).
MAX_POSITIONS = 2048


def model_config(vocab, index_topk):
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
        "max_position_embeddings": MAX_POSITIONS, "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": MAX_POSITIONS / 256,
                         "original_max_position_embeddings": 256, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False, "vocab_size": vocab,
    }


# ---------------------------------------------------------------------------------------------
# Prompt and data

class Encoder:
    def __init__(self, path):
        self.tok = Tokenizer.from_file(path)
        self.bos, self.eos = self.tok.token_to_id(BOS), self.tok.token_to_id(EOS)
        for s in (BOS, EOS, USER, ASSISTANT, END_THINK):
            assert self.tok.token_to_id(s) is not None, f"tokenizer lacks {s}"

    def prompts(self, questions):
        texts = [f"{BOS}{USER}{q}{ASSISTANT}{END_THINK}" for q in questions]
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def completions(self, solutions):
        return [e.ids + [self.eos] for e in self.tok.encode_batch(solutions, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    def segments(self, segs, cache):
        """(ids, trained mask) of a conversation given as [(text, trained)]. Segments meet at
        special tokens, so encoding them apart gives the ids of the whole text; the (long,
        repeated) prompt segments are cached."""
        ids, mask = [], []
        for text, trained in segs:
            if not trained and text in cache:
                part = cache[text]
            else:
                part = self.tok.encode(text, add_special_tokens=False).ids
                if not trained and len(cache) < 4:
                    cache[text] = part
            ids += part
            mask += [trained] * len(part)
        return ids, mask


def make_masked_batch(examples, device):
    """Right-padded (pad = eos) inputs and labels (-100 outside the trained segments)."""
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
    return ids_t.to(device), labels.to(device), valid.to(device)


def make_batch(examples, device):
    """Right-padded (pad = eos) inputs and labels (-100 outside the completion)."""
    L = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), L), 1, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    valid = torch.zeros((len(examples), L), dtype=torch.bool)
    for i, (p, c) in enumerate(examples):
        seq = p + c
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(c)
        valid[i, :len(seq)] = True
    return ids.to(device), labels.to(device), valid.to(device)


# ---------------------------------------------------------------------------------------------
# Training attention: transformers' MLA math, plus the indexer's scores with gradient and the KL

class TrainState:
    active = False   # the patched forward runs only while training
    sparse = False   # stage 2
    valid = None     # [B, S] bool: real tokens (queries counted in the KL)
    kl = []          # one scalar per layer


def indexer_scores(ix, x, q_resid, position_embeddings):
    """[B, S, T] fp32: Σ_h w[s,h]·relu(scale·q[s,h]·k[t]), as DeepseekV32Indexer, differentiable."""
    B, S, _ = x.shape
    cos, sin = position_embeddings
    q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(x)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = mdl.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(x.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
    return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)


_original_forward = mdl.DeepseekV32Attention.forward


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
    query = torch.cat((q_pass, q_rot), dim=-1)
    key, value = self.expand_kv(k_pass, k_rot)

    causal = torch.ones(S, S, dtype=torch.bool, device=hidden_states.device).tril()
    idx = indexer_scores(self.indexer, hidden_states.detach(), q_resid.detach(), position_embeddings)
    idx = idx.masked_fill(~causal, float("-inf"))
    if TrainState.sparse and self.indexer.index_topk < S:
        top = idx.detach().topk(self.indexer.index_topk, dim=-1).indices
        sel = torch.zeros(B, S, S, dtype=torch.bool, device=idx.device).scatter(-1, top, True) & causal
    else:
        sel = causal.expand(B, S, S)
    logits = torch.matmul(query, key.transpose(2, 3)).float() * self.scaling
    logits = logits.masked_fill(~sel.unsqueeze(1), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value).transpose(1, 2).reshape(B, S, -1)

    with torch.no_grad():
        target = probs.sum(1)
        target = target / target.sum(-1, keepdim=True)
    logp = torch.log_softmax(idx.masked_fill(~sel, float("-inf")), dim=-1).masked_fill(~sel, 0.0)
    kl = (target * (torch.log(target.clamp_min(1e-12)) - logp)).masked_fill(~sel, 0.0).sum(-1)
    v = TrainState.valid.float()
    TrainState.kl.append((kl * v).sum() / v.sum())
    return self.o_proj(out), None


mdl.DeepseekV32Attention.forward = training_attention_forward


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


@torch.no_grad()
def evaluate(model, enc, problems, max_new_tokens, failures_path, batch=128):
    """Greedy generate on prompts grouped by length (no padding: positions as in osprey)."""
    prompts = enc.prompts([p["question"] for p in problems])
    by_len = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    outputs = [None] * len(problems)
    for _, idxs in sorted(by_len.items()):
        for s in range(0, len(idxs), batch):
            part = idxs[s:s + batch]
            ids = torch.tensor([prompts[i] for i in part], device="cuda")
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=enc.eos,
                                 pad_token_id=enc.eos)
            for row, i in zip(gen[:, ids.shape[1]:].tolist(), part):
                if enc.eos in row:
                    row = row[:row.index(enc.eos)]
                outputs[i] = enc.decode(row)
    correct = 0
    with open(failures_path, "w", encoding="utf-8") as f:
        for p, out in zip(problems, outputs):
            got = flexible_extract(out)
            if normalize(got) == normalize(str(p["answer"])):
                correct += 1
            else:
                f.write(json.dumps({"id": p["id"], "question": p["question"], "expected": p["answer"],
                                    "extracted": got, "output": out}, ensure_ascii=False) + "\n")
    lo, hi = wilson(correct, len(problems))
    return {"n": len(problems), "correct": correct, "accuracy": correct / len(problems),
            "ci95": [lo, hi], "failures": failures_path}


@torch.no_grad()
def evaluate_modes(model, enc, problems, max_new_tokens, out_path):
    """Thinking mode and the calculator round trip under transformers' generate (greedy), one
    problem at a time: thinking is right when the text after </think> names the answer; the tool
    round is right when the call parses, its expression evaluates to the answer, and the reply
    after the tool result names it."""
    def gen(ids):
        x = torch.tensor([ids], device="cuda")
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=enc.eos,
                             pad_token_id=enc.eos)[0, x.shape[1]:].tolist()
        return out[:out.index(enc.eos) + 1] if enc.eos in out else out

    cache, rows = {}, []
    ok = {"thinking": 0, "tool_call": 0, "tool_answer": 0}
    call_re = re.compile(r'<｜DSML｜parameter name="expression" string="true">(.*?)</｜DSML｜parameter>')
    for p in problems:
        want = str(p["answer"])
        segs = generate.chat_segments(p, "thinking")
        out = enc.tok.decode(gen(enc.segments(segs[:1], cache)[0]), skip_special_tokens=False)
        reasoning, _, content = out.partition("</think>")
        thinking_ok = normalize(flexible_extract(content)) == want
        ok["thinking"] += thinking_ok
        segs = generate.chat_segments(p, "tool")
        prompt = enc.segments(segs[:1], cache)[0]
        call_ids = gen(prompt)
        call = enc.tok.decode(call_ids, skip_special_tokens=False)
        m = call_re.search(call)
        result, answer = None, ""
        try:
            result = generate.calculate(m.group(1)) if m else None
        except ValueError:
            result = None
        if result is not None:
            ok["tool_call"] += result == want
            follow = prompt + call_ids + enc.tok.encode(generate.tool_result_text(result),
                                                        add_special_tokens=False).ids
            answer = enc.tok.decode(gen(follow), skip_special_tokens=True)
            ok["tool_answer"] += normalize(flexible_extract(answer)) == want
        rows.append({"id": p["id"], "answer": p["answer"], "thinking": out, "call": call,
                     "result": result, "reply": answer})
    with open(out_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    n = len(problems)
    res = {}
    for k, v in ok.items():
        lo, hi = wilson(v, n)
        res[k] = {"n": n, "correct": v, "accuracy": v / n, "ci95": [lo, hi]}
        print(f"transformers generate ({k}): {v}/{n} = {v / n:.4f}, 95% CI [{lo:.4f}, {hi:.4f}]",
              flush=True)
    res["outputs"] = out_path
    return res


def set_index_topk(model, k):
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = k


def evaluate_folder(folder, enc, test, max_new_tokens, index_topk, modes_limit=0):
    """The shipped folder under transformers' own code (float32, eager, generate): sparse (the
    config's index_topk) and dense (index_topk above any sequence)."""
    ref = DeepseekV32ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager").cuda().eval()
    t_eval = time.time()
    results = {"sparse": evaluate(ref, enc, test, max_new_tokens,
                                  os.path.join(folder, "hf_failures.jsonl"))}
    set_index_topk(ref, 1 << 30)
    results["dense"] = evaluate(ref, enc, test, max_new_tokens,
                                os.path.join(folder, "hf_failures_dense.jsonl"))
    set_index_topk(ref, index_topk)
    if modes_limit:
        results["modes"] = evaluate_modes(ref, enc, test[:modes_limit], max_new_tokens,
                                          os.path.join(folder, "hf_modes.jsonl"))
    for k, r in results.items():
        if k == "modes":
            continue
        print(f"transformers generate ({k}): accuracy {r['accuracy']:.4f} ({r['correct']}/{r['n']}), "
              f"95% CI [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] in {time.time() - t_eval:.0f} s",
              flush=True)
    return results


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="model folder (default models/osprey-arith; "
                    "/tmp/osprey-arith-smoke with --smoke)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "osprey-arith"),
                    help="folder with tokenizer.json (tools/make_bundled_tokenizer.py --corpus arith)")
    ap.add_argument("--test", default=os.path.join(ROOT, "tests", "data", "arith", "test.jsonl"))
    ap.add_argument("--dev", default=os.path.join(ROOT, "tests", "data", "arith", "dev.jsonl"))
    ap.add_argument("--minutes", type=float, default=9.0, help="training time budget")
    ap.add_argument("--dense-frac", type=float, default=0.3, help="share of the time in the dense warm-up")
    ap.add_argument("--n-train", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--indexer-lr", type=float, default=2e-3)
    ap.add_argument("--index-topk", type=int, default=32)
    ap.add_argument("--bias-update", type=float, default=1e-3, help="γ of the router bias balancing")
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
    ap.add_argument("--smoke", action="store_true", help="a few steps on tiny data, then a small eval")
    ap.add_argument("--no-eval", action="store_true",
                    help="save the trained folder and stop (evaluate later with --eval-only)")
    ap.add_argument("--eval-only", action="store_true",
                    help="no training: evaluate the folder --out with transformers' generate")
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.n_train, args.eval_limit, args.batch = 0.5, 2000, 40, 32
        args.n_tool, args.tool_batch, args.modes_eval = 200, 8, 10
    if args.out is None:
        args.out = "/tmp/osprey-arith-smoke" if args.smoke else os.path.join(ROOT, "models", "osprey-arith")
    t_start = time.time()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True

    enc = Encoder(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = enc.tok.get_vocab_size(with_added_tokens=True)
    if args.eval_only:
        test = [json.loads(l) for l in open(args.test, encoding="utf-8")]
        if args.eval_limit:
            test = test[:args.eval_limit]
        with open(os.path.join(args.out, "config.json")) as f:
            index_topk = json.load(f)["index_topk"]
        results = evaluate_folder(args.out, enc, test, args.max_new_tokens, index_topk,
                                  args.modes_eval)
        path = os.path.join(args.out, "train_report.json")
        report = json.load(open(path)) if os.path.exists(path) else {}
        report["eval"] = results
        report["eval_command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        return
    os.makedirs(args.out, exist_ok=True)
    cfg_dict = model_config(vocab, args.index_topk)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    if os.path.abspath(args.tokenizer) != os.path.abspath(args.out):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    config = AutoConfig.from_pretrained(args.out)
    config._attn_implementation = "eager"
    model = DeepseekV32ForCausalLM(config).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {n_params / 1e6:.2f}M parameters")

    test = [json.loads(l) for l in open(args.test, encoding="utf-8")]
    dev = [json.loads(l) for l in open(args.dev, encoding="utf-8")]
    if args.eval_limit:
        test = test[:args.eval_limit]
    held_out = {p["question"] for p in test + dev}
    t0 = time.time()
    train = generate.training_problems(args.n_train, exclude_questions=held_out)
    rng = random.Random(args.seed + 1)
    cache = {}
    data = [enc.segments(generate.chat_segments(p, "thinking" if rng.random() < args.thinking_frac
                                                else "plain"), cache) for p in train]
    tool_data = [enc.segments(generate.chat_segments(p, "tool"), cache)
                 for p in train[:args.n_tool]]
    lens = [len(ids) for ids, _ in data]
    tlens = [len(ids) for ids, _ in tool_data]
    print(f"{len(data)} training problems ({args.thinking_frac:.0%} thinking) and {len(tool_data)} "
          f"tool conversations in {time.time() - t0:.1f} s; tokens mean {sum(lens) / len(lens):.0f} "
          f"(max {max(lens)}), tool mean {sum(tlens) / len(tlens):.0f} (max {max(tlens)}); "
          f"index_topk {args.index_topk}")
    assert max(tlens) < MAX_POSITIONS

    indexer_params = [p for n, p in model.named_parameters() if ".indexer." in n]
    main_params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    decay = [p for p in main_params if p.dim() >= 2]
    no_decay = [p for p in main_params if p.dim() < 2]
    opt = torch.optim.AdamW([
        {"params": decay, "weight_decay": 0.1, "lr": args.lr, "base_lr": args.lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": args.lr, "base_lr": args.lr},
        {"params": indexer_params, "weight_decay": 0.0, "lr": args.indexer_lr, "base_lr": args.indexer_lr},
    ], betas=(0.9, 0.95), fused=True)

    routers = [m for m in model.modules() if isinstance(m, mdl.DeepseekV32TopkRouter)]
    loads = {}

    def count_load(module, _inp, out):
        loads[module] = torch.bincount(out[2].flatten(), minlength=module.num_experts)

    for r in routers:
        r.register_forward_hook(count_load)

    budget = args.minutes * 60.0
    model.train()
    TrainState.active = True
    history, step, t_train = [], 0, time.time()
    order = list(range(len(data)))
    random.shuffle(order)
    cursor = 0
    tool_order = list(range(len(tool_data)))
    random.shuffle(tool_order)
    tool_cursor, tool_steps = 0, 0
    warmup_steps = 100 if not args.smoke else 5
    stage_switch = None
    while True:
        frac = (time.time() - t_train) / budget
        if frac >= 1.0:
            break
        TrainState.sparse = frac >= args.dense_frac
        if TrainState.sparse and stage_switch is None:
            stage_switch = step
            print(f"step {step}: sparse attention on (index_topk {args.index_topk})")
        scale = min(1.0, (step + 1) / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * scale
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
        ids, labels, valid = make_masked_batch(batch, "cuda")
        TrainState.valid, TrainState.kl = valid, []
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=labels, use_cache=False)
        kl = torch.stack(TrainState.kl).mean()
        loss = out.loss + kl
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
            rec = {"step": step, "seconds": round(time.time() - t_train, 1),
                   "stage": "sparse" if TrainState.sparse else "dense",
                   "lm_loss": round(out.loss.item(), 5), "indexer_kl": round(kl.item(), 5),
                   "lr_scale": round(scale, 4)}
            history.append(rec)
            print(json.dumps(rec), flush=True)
        step += 1
    TrainState.active = False
    train_seconds = time.time() - t_train
    final = history[-1] if history else {}
    print(f"trained {step} steps in {train_seconds:.0f} s; last lm loss {final.get('lm_loss')}, "
          f"indexer KL {final.get('indexer_kl')}")

    # Save: bf16 weights (the routers' correction bias stays fp32), published per-expert names.
    model = model.to(torch.bfloat16)
    for r in routers:
        r.e_score_correction_bias.data = r.e_score_correction_bias.data.float()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "config.json"), "w") as f:  # ours, not transformers' form
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    del model
    torch.cuda.empty_cache()

    results = None
    t_eval = time.time()
    if not args.no_eval:
        results = evaluate_folder(args.out, enc, test, args.max_new_tokens, args.index_topk,
                                  args.modes_eval)
    report = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(), "parameters": n_params, "config": cfg_dict,
        "train_problems": len(data), "steps": step, "sparse_from_step": stage_switch,
        "tool_conversations": len(tool_data), "tool_steps": tool_steps,
        "thinking_frac": args.thinking_frac, "chat_modes": ["plain", "thinking", "tool"],
        "tool": generate.CALCULATOR_TOOL,
        "batch": args.batch, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.time() - t_eval, 1), "total_seconds": round(time.time() - t_start, 1),
        "final": final, "history": history, "eval": results,
        "prompt": f"{BOS}{USER}{{question}}{ASSISTANT}{END_THINK}",
    }
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out} (config.json, model.safetensors, tokenizer, train_report.json) in "
          f"{time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
