#!/usr/bin/env python3
"""Numerics of the FP8 sparse decode's two possible MMA types, on the CPU (numpy; Debian's
python3-numpy): today's path (each e4m3 latent value × its f32 scale, rounded to BF16; q BF16; P
rounded to BF16; BF16 wgmma) against a proposed F16 path (e4m3 → f16 is exact, × the scale in f16
— cvt.rn.f16x2.e4m3x2 then HMUL2, one instruction a value where today's e4m3 → f16 → f32 → × scale
→ BF16 takes about three; q's latent part converted to f16 after a power-of-two pre-scale so that
max |q| < 2^15, compensated in the softmax scale; P rounded to f16; the rope part kept in BF16,
its wgmma accumulating into the same F32 registers). Both are compared with an F32 reference over
the same dequantised cache: max |out − ref| / max |ref| for one query token, H heads, N attended
rows, the cache quantised as osprey's FP8 cache is (per 128 latent values: scale = amax / 448).

    /usr/bin/python3 tools/mla_fp8_f16_numerics.py
"""
import numpy as np

rng = np.random.default_rng(0)


def bf16(x):
    """Round to the nearest BF16 (ties to even), back to f32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def e4m3(y):
    """Round y (already divided by its scale, |y| <= 448) to the nearest e4m3 value."""
    a = np.abs(y)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(y) * np.minimum(np.round(a / step) * step, 448.0)


def attend(k, q, round_p, softmax_scale):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * softmax_scale
    p = np.exp(s - s.max(-1, keepdims=True))
    l = p.sum(-1, keepdims=True)
    return (round_p(p.astype(np.float32)).astype(np.float64) @ k[:, :512].astype(np.float64)) / l


def case(heads, rows, mag_kv, mag_q, label):
    lat = bf16(rng.standard_normal((rows, 512)).astype(np.float32) * mag_kv)
    rope = bf16(rng.standard_normal((rows, 64)).astype(np.float32) * mag_kv)
    tiles = lat.reshape(rows, 4, 128)
    scale = np.maximum(np.abs(tiles).max(-1, keepdims=True) / 448.0,
                       np.finfo(np.float32).tiny).astype(np.float32)
    stored = e4m3(tiles / scale)
    deq = (stored * scale).reshape(rows, 512)
    q = bf16(rng.standard_normal((heads, 576)).astype(np.float32) * mag_q)
    sm = 1.0 / np.sqrt(192.0)
    ref = attend(np.concatenate([deq, rope], 1), q, lambda p: p, sm)
    out_bf16 = attend(np.concatenate([bf16(deq), rope], 1), q, bf16, sm)
    k_f16 = f16(f16(stored) * f16(scale)).reshape(rows, 512)
    pre = 2.0 ** min(0.0, 14 - np.ceil(np.log2(np.abs(q).max())))
    q_f16 = np.concatenate([f16(q[:, :512] * pre), q[:, 512:] * pre], 1) / pre
    out_f16 = attend(np.concatenate([k_f16, rope], 1), q_f16, f16, sm)
    rel = lambda o: np.abs(o - ref).max() / np.abs(ref).max()
    print(f"{label:30s} H {heads:3d} rows {rows}: max rel err  BF16 path {rel(out_bf16):.2e}  "
          f"F16 path {rel(out_f16):.2e}  (scales {scale.min():.1e} .. {scale.max():.1e})")


if __name__ == "__main__":
    case(128, 2048, 1.0, 1.0, "latent and q ~ N(0, 1)")
    case(128, 2048, 3.0, 10.0, "latent x3, q x10")
    case(128, 2048, 20.0, 1.0, "latent x20 (amax ~100)")
    case(128, 2048, 0.02, 1.0, "latent x0.02")
    case(128, 2048, 0.002, 1.0, "latent x0.002 (f16 subnormal scales)")
    case(64, 5000, 1.0, 3.0, "64 heads, 5000 rows")
