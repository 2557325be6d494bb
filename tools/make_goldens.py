#!/usr/bin/env python3
"""Goldens for osprey's model tests, made by transformers (run on the GPU machine).

For every model folder under --models (written by `osprey make-model`), this script loads the
model with transformers in float32 (eager attention, TF32 off), and saves to --out/<name>.safetensors:
  tokens.<s>        int32 [T]      fixed token sequences (deterministic)
  logits.<s>        f32 [T, V]     logits of every position (one full forward, no cache)
  prompt.greedy     int32 [P]      the greedy prompt
  greedy            int32 [N]      greedy continuation by model.generate (KV cache path)
  topk.<s>.<l>      int32 [T, k]   V3.2: the indexer's selected positions per token, layer l
  logits_dense.<s>  f32 [T, V]     V3.2: logits with index_topk above T (dense attention)
  hidden.<s>.<l>    f32 [T, D]     output of decoder layer l (for diffing)
and a report <name>.json with the margins that decide whether the goldens sit near a tie:
greedy top-1/top-2 logit gaps, router top-k boundary gaps, indexer top-k boundary gaps.

FP8 models (quantization_config in config.json) are dequantized here (W = e4m3 · scale_inv per
128×128 block) and run in float32: osprey's CPU path must match transformers on those weights.

Usage: python3 tools/make_goldens.py --models tests/data/models --out tests/data/goldens
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SEQ_LENS = {"a": 40, "b": 70}  # b crosses a 64-token block boundary
GREEDY_PROMPT = 12
GREEDY_NEW = 32


def sequences(vocab):
    rng = np.random.default_rng(1234)
    return {k: rng.integers(3, vocab, size=n).astype(np.int64) for k, n in SEQ_LENS.items()}


def dequantized_copy(src, dst):
    """A float32 copy of an FP8 model folder, without quantization_config."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    os.makedirs(dst, exist_ok=True)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    tensors = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, f)))
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        s = tensors.get(name + "_scale_inv")
        if s is not None:
            w = t.to(torch.float32)
            rows, cols = w.shape
            big = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
            out[name] = (w * big).contiguous()
        else:
            out[name] = t.to(torch.float32).contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def load(folder, overrides=None):
    config = AutoConfig.from_pretrained(folder)
    for k, v in (overrides or {}).items():
        setattr(config, k, v)
    model = AutoModelForCausalLM.from_pretrained(
        folder, config=config, dtype=torch.float32, attn_implementation="eager")
    return model.cuda().eval()


def indexer_scores(mod, args):
    """Recompute the V3.2 indexer's scores [S, T] (no cache) from the hook's inputs."""
    hidden, q_resid, (cos, sin) = args[0], args[1], args[2]
    b, s, _ = hidden.shape
    q = mod.wq_b(q_resid).view(b, s, mod.n_heads, mod.head_dim)
    rd = mod.qk_rope_head_dim
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    k = mod.k_norm(mod.wk(hidden)).unsqueeze(2)
    k_rot, k_pass = k[..., :rd], k[..., rd:]
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], -1)
    k = torch.cat([k_rot, k_pass], -1).squeeze(2)
    sc = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
    w = mod.weights_proj(hidden.to(mod.weights_proj.weight.dtype)).float() * (mod.n_heads ** -0.5)
    return torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]  # [S, T]


def boundary_gap(values, k):
    """Gap between the k-th and (k+1)-th largest of a 1-D tensor, relative to the scale."""
    if values.numel() <= k:
        return math.inf
    top = torch.topk(values, k + 1).values
    scale = max(float(values.abs().max()), 1e-12)
    return float(top[k - 1] - top[k]) / scale


def run_model(name, folder, out_dir):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    tmp = None
    if "quantization_config" in cfg:
        tmp = tempfile.mkdtemp()
        dequantized_copy(folder, tmp)
        folder = tmp
    model = load(folder)
    c = model.config
    is_v32 = cfg["model_type"] == "deepseek_v32"
    seqs = sequences(cfg["vocab_size"])
    out, report = {}, {"transformers": transformers.__version__, "torch": torch.__version__}

    # Hooks: decoder layer outputs, indexer choices and margins, router margins.
    captured = {}
    hooks = []
    for li, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, li=li: captured.__setitem__(("hidden", li), (o[0] if isinstance(o, tuple) else o).detach())))
        attn = layer.self_attn
        if hasattr(attn, "indexer"):
            def ihook(m, a, kw, o, li=li):
                captured[("topk", li)] = o.detach()
                captured[("iscore", li)] = indexer_scores(m, a).detach()
            hooks.append(attn.indexer.register_forward_hook(ihook, with_kwargs=True))
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            def ghook(m, a, o, li=li):
                captured[("router_in", li)] = a[0].detach()
            hooks.append(gate.register_forward_hook(ghook))

    min_router_gap, min_index_gap = math.inf, math.inf
    with torch.no_grad():
        for sname, ids in seqs.items():
            captured.clear()
            x = torch.tensor(ids, device="cuda").unsqueeze(0)
            logits = model(x, use_cache=False).logits[0].float().cpu()
            out[f"tokens.{sname}"] = torch.tensor(ids, dtype=torch.int32)
            out[f"logits.{sname}"] = logits.contiguous()
            for li in range(c.num_hidden_layers):
                out[f"hidden.{sname}.{li}"] = captured[("hidden", li)][0].float().cpu().contiguous()
                if ("topk", li) in captured:
                    topk = captured[("topk", li)][0].to(torch.int32).cpu()
                    # Positions beyond the causal limit are masked in attention: mark them -1.
                    pos = torch.arange(topk.shape[0]).unsqueeze(1)
                    topk = torch.where(topk <= pos, topk, torch.full_like(topk, -1))
                    out[f"topk.{sname}.{li}"] = torch.sort(topk, dim=1).values.contiguous()
                    sc = captured[("iscore", li)].float().cpu()
                    k = cfg["index_topk"]
                    for t in range(sc.shape[0]):
                        if t + 1 > k:
                            min_index_gap = min(min_index_gap, boundary_gap(sc[t, : t + 1], k))
                if ("router_in", li) in captured:
                    h = captured[("router_in", li)].reshape(-1, c.hidden_size).float()
                    gate = model.model.layers[li].mlp.gate
                    lg = h @ gate.weight.float().t()
                    if cfg.get("scoring_func", "softmax") == "sigmoid":
                        s = lg.sigmoid() + gate.e_score_correction_bias.float()
                    else:
                        s = lg.softmax(-1)
                    for row in s.cpu():
                        min_router_gap = min(min_router_gap, boundary_gap(row, cfg["num_experts_per_tok"]))
            if is_v32:
                dense = load(folder, {"index_topk": 1_000_000})
                out[f"logits_dense.{sname}"] = dense(x, use_cache=False).logits[0].float().cpu().contiguous()
                del dense
        for h in hooks:
            h.remove()

        # Greedy continuation through transformers' own cache path, cross-checked by full
        # recomputation without a cache.
        prompt = torch.tensor(seqs["a"][:GREEDY_PROMPT], device="cuda").unsqueeze(0)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        gen = model.generate(prompt, max_new_tokens=GREEDY_NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        gen = gen[0, GREEDY_PROMPT:].cpu()
        seq = prompt
        greedy_gaps = []
        for _ in range(GREEDY_NEW):
            lg = model(seq, use_cache=False).logits[0, -1].float()
            top2 = torch.topk(lg, 2).values
            greedy_gaps.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, lg.argmax().view(1, 1)], 1)
        nocache = seq[0, GREEDY_PROMPT:].cpu()
        out["prompt.greedy"] = prompt[0].to(torch.int32).cpu()
        out["greedy"] = gen.to(torch.int32).contiguous()
        report.update({
            "greedy_generate_equals_recompute": bool(torch.equal(gen, nocache)),
            "min_greedy_logit_gap": min(greedy_gaps),
            "min_router_relative_gap": min_router_gap,
            "min_indexer_relative_gap": min_index_gap,
            "max_abs_logit": float(max(out[f"logits.{s}"].abs().max() for s in seqs)),
        })
    save_file(out, os.path.join(out_dir, f"{name}.safetensors"))
    json.dump(report, open(os.path.join(out_dir, f"{name}.json"), "w"), indent=2)
    print(name, json.dumps(report))
    if tmp:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for name in sorted(os.listdir(args.models)):
        folder = os.path.join(args.models, name)
        if not os.path.exists(os.path.join(folder, "config.json")):
            continue
        try:
            run_model(name, folder, args.out)
        except Exception:
            failed += 1
            print(f"FAILED {name}", file=sys.stderr)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
