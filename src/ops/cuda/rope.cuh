// The rotary embedding's per-pair arithmetic (ops/rope.h's contract), shared by every CUDA kernel
// that applies it (rope.cu; the fused latent-cache write of mla.cu; the fused q of the absorbed
// query and the indexer's q and k), so a fused kernel rotates exactly as the rope kernel does.
//   angle_i = float(p) · inv_freq[i] (F32 product); c, s = cosf, sinf(angle) · factor (precise,
//   no fast math); the pair (x0, x1) becomes (x0·c − x1·s, x1·c + x0·s).
//   Pair i of a rope slice of rope_dim = 2·half values: interleaved (x[2i], x[2i+1]); half-split
//   (x[i], x[i + half]).
#pragma once

namespace osprey::ops::cuda {

struct RopeCs {
  float c, s;
};
__device__ __forceinline__ RopeCs rope_cs(float p, float inv_freq_i, float factor) {
  const float angle = p * inv_freq_i;
  return {cosf(angle) * factor, sinf(angle) * factor};
}
// The rotated pair, in place.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, RopeCs r) {
  const float y0 = x0 * r.c - x1 * r.s;
  const float y1 = x1 * r.c + x0 * r.s;
  x0 = y0;
  x1 = y1;
}
// The indices within the rope slice of pair i's two values.
__device__ __forceinline__ int rope_first(int i, int half, bool interleaved) {
  (void)half;
  return interleaved ? 2 * i : i;
}
__device__ __forceinline__ int rope_second(int i, int half, bool interleaved) {
  return interleaved ? 2 * i + 1 : i + half;
}
// The pair of slice element j and whether j is its first value.
__device__ __forceinline__ int rope_pair_of(int j, int half, bool interleaved, bool& first) {
  first = interleaved ? (j & 1) == 0 : j < half;
  return interleaved ? j >> 1 : (j < half ? j : j - half);
}

}  // namespace osprey::ops::cuda
