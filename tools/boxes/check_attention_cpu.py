#!/usr/bin/env python3
"""CPU check (torch 1.13 or 2.x, no transformers, no GPU) of tools/train_boxes.py's attention
helpers against an earlier revision's: index_scores (values and gradients), topk_selection (the same
sets) and main_attention with the top-k and recent selections (outputs and q/k/v gradients), every
masked/flash path; transformers, tokenizers and safetensors are stubbed, SDPA is a reference.

  python3 tools/boxes/check_attention_cpu.py [REV]   # REV default d27d841 (before the bmm change)
"""
import contextlib, importlib.util, os, subprocess, sys, tempfile, types
import torch
import torch.nn as nn
import torch.nn.functional as F

def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    lg = (q.float() @ k.float().transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    Lq, Lk = q.shape[-2], k.shape[-2]
    if is_causal:
        lg = lg.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        lg = lg.masked_fill(~attn_mask, float("-inf"))
    return (torch.softmax(lg, -1) @ v.float()).to(q.dtype)
F.scaled_dot_product_attention = sdpa
att = types.ModuleType("torch.nn.attention")
att.SDPBackend = types.SimpleNamespace(FLASH_ATTENTION=0, EFFICIENT_ATTENTION=1)
att.sdpa_kernel = lambda _b: contextlib.nullcontext()
sys.modules["torch.nn.attention"] = att
tr = types.ModuleType("transformers"); tr.AutoConfig = tr.DeepseekV32ForCausalLM = object; tr.__version__ = "stub"
mdl = types.ModuleType("modeling_deepseek_v32")
class Attn:
    def forward(self, *a, **k): pass
mdl.DeepseekV32Attention = Attn
def rot_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rot_half(q) * sin, k * cos + rot_half(k) * sin
mdl.apply_rotary_pos_emb = apply_rotary_pos_emb
for name, m in {"transformers": tr, "transformers.models": types.ModuleType("x"),
                "transformers.models.deepseek_v32": types.ModuleType("y"),
                "transformers.models.deepseek_v32.modeling_deepseek_v32": mdl}.items():
    sys.modules[name] = m
sys.modules["transformers.models.deepseek_v32"].modeling_deepseek_v32 = mdl
st = types.ModuleType("safetensors"); stt = types.ModuleType("safetensors.torch")
stt.load_file = stt.save_file = None; sys.modules["safetensors"] = st; sys.modules["safetensors.torch"] = stt
tk = types.ModuleType("tokenizers"); tk.Tokenizer = object; sys.modules["tokenizers"] = tk
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
REV = sys.argv[1] if len(sys.argv) > 1 else "d27d841"
REF = os.path.join(tempfile.mkdtemp(), "ref_train_boxes.py")
with open(REF, "w") as f:
    f.write(subprocess.run(["git", "-C", ROOT, "show", f"{REV}:tools/train_boxes.py"], check=True,
                           capture_output=True, text=True).stdout)

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
new = load("new_tb", os.path.join(os.path.dirname(HERE), "train_boxes.py"))
old = load("old_tb", REF)

class Ix(nn.Module):  # the indexer's parameters at V3.2's shapes, hidden 128
    def __init__(s, d=128, q_lora=128):
        super().__init__()
        s.n_heads, s.head_dim, s.qk_rope_head_dim = 64, 128, 64
        s.softmax_scale = 128 ** -0.5
        s.wq_b = nn.Linear(q_lora, 64 * 128, bias=False); s.wk = nn.Linear(d, 128, bias=False)
        s.k_norm = nn.LayerNorm(128); s.weights_proj = nn.Linear(d, 64, bias=False)

torch.manual_seed(0)
B, S, topk = 2, 384, 128
ix = Ix()
x, qr = torch.randn(B, S, 128), torch.randn(B, S, 128)
ang = torch.arange(S).float()[:, None] / (10000 ** (torch.arange(0, 64, 2).float() / 64))
cos = torch.cat([ang.cos(), ang.cos()], -1)[None].expand(B, S, 64)
sin = torch.cat([ang.sin(), ang.sin()], -1)[None].expand(B, S, 64)
worst = {}
# index_scores: values (no grad) and gradients (the KL path)
q, w = new.indexer_queries(ix, x[:, :40], qr[:, :40], cos[:, :40], sin[:, :40])
k = new.indexer_keys(ix, x, cos, sin)
with torch.no_grad():
    worst["index_scores"] = (new.index_scores(ix, q, w, k) - old.index_scores(ix, q, w, k)).abs().max().item()
gs = []
for m in (old, new):
    ix.zero_grad(); m.index_scores(ix, *m.indexer_queries(ix, x[:, :40], qr[:, :40], cos[:, :40], sin[:, :40]),
                                   m.indexer_keys(ix, x, cos, sin)).pow(2).mean().backward()
    gs.append(torch.cat([p.grad.flatten() for p in ix.parameters() if p.grad is not None]))
worst["index_scores grad (rel)"] = ((gs[0] - gs[1]).abs().max() / gs[0].abs().max()).item()
# topk_selection: the same set
sel_old = old.topk_selection(ix, x, qr, cos, sin, topk)
sel_new = new.topk_selection(ix, x, qr, cos, sin, topk)
worst["topk_selection differing entries"] = (sel_old != sel_new).sum().item()
assert bool((sel_new[:, :topk] == torch.ones(S, S, dtype=torch.bool).tril()[:topk]).all())
# main_attention with a selection: rows below topk through the causal path
H = 16
qa = torch.randn(B, H, S, 192, requires_grad=True); ka = torch.randn(B, H, S, 192, requires_grad=True)
va = torch.randn(B, H, S, 128, requires_grad=True)
for masked in ("sdpa", "chunked"):
    for flash in (True, False):
        for mode in ("topk", "recent"):
            sel = sel_new if mode == "topk" else new.recent_selection(B, S, topk, "cpu")
            outs = []
            for m, kw in ((old, {}), (new, {"causal_rows": topk})):
                m.TrainState.masked, m.TrainState.flash = masked, flash
                for t in (qa, ka, va):
                    t.grad = None
                o = m.main_attention(qa, ka, va, sel, 0.07, **kw)
                (o * torch.linspace(-1, 1, 128)).sum().backward()
                outs.append((o.detach(), qa.grad.clone(), ka.grad.clone(), va.grad.clone()))
            worst[f"main_attention {masked} flash={flash} {mode} (out, dq, dk, dv)"] = tuple(
                round((a - b).abs().max().item(), 8) for a, b in zip(*outs))
for k_, v_ in worst.items():
    print(f"{k_}: {v_}")
bad = worst["topk_selection differing entries"] != 0 or max(
    max(v) if isinstance(v, tuple) else v for k, v in worst.items() if "differing" not in k) > 1e-4
print("FAIL" if bad else "ok: equal to fp32 rounding")
sys.exit(1 if bad else 0)
