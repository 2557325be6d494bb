// CUDA sampling (contract in ops/sample.h): one kernel, one block per row, every step in it.
//
// The cuts of min-p / top-k / top-p are thresholds on x, found without sorting: x maps to an
// order-preserving 32-bit key (−0 and +0 to one key), non-candidates get key 0, and a k-ary search
// over the key range finds the smallest key v with W(v) = Σ_{key_i > v} weight_i < bound:
//   top-k:  weight 1, bound k        → v = the k-th largest candidate x (ties kept: key ≥ v)
//   top-p:  weight e_i, bound mass   → v = the x of the last token the nucleus keeps (ties kept)
//   logprobs top-n: weight 1, bound n over the raw logits → the n-th largest raw logit
// Each pass reads the keys once and evaluates W at 15 split points of the remaining range (a block
// reduction of 15 sums), so a 32-bit range takes at most 9 passes; W above the range is carried
// from the previous pass, so only keys inside the range are weighed. The draw walks the kept e_i in
// ascending id order: tiles of kThreads × kItems ids, a block-wide exclusive prefix sum in double
// per tile, the first id whose running sum exceeds u · Σ e wins. Every reduction whose result
// steers control flow is summed in a fixed order by every thread, so the block agrees on it.
//
// Rounding against the CPU twin: e_i = float(exp(double(x_i − m))) is the correctly rounded
// exp(x_i − m) unless exp's double result falls within a double ulp of a float rounding boundary;
// the C library's expf that the CPU twin uses is documented within 0.502 ulp, so a few e_i may
// differ by one float ulp; the double sums differ in their order.
#include <cstdint>
#include <limits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/sample.h"

namespace osprey::ops::cuda {

namespace {

constexpr int kThreads = 512;  // one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kWays = 16;  // the k-ary search splits the key range into kWays parts per pass
constexpr int kSplits = kWays - 1;
constexpr int kItems = 4;  // consecutive ids per thread in the ordered walks
constexpr int kTile = kThreads * kItems;
constexpr int kNoId = std::numeric_limits<int>::max();

struct SampleArgs {
  const float* logits;          // [n_rows, vocab]
  const SampleRowParams* rows;  // [n_rows]
  const int32_t* lists;         // [n_list]
  int64_t n_list;
  uint32_t* prompt_mask;   // [n_slots, words]
  int32_t* output_counts;  // [n_slots, vocab]
  int64_t n_slots;
  int vocab;
  int words;         // ceil(vocab / 32)
  int64_t n_lp;      // rows of logprobs / top_ids
  uint32_t* keys;    // [n_rows, vocab] scratch: processed x (F32 bits), then keys
  float* weights;    // [n_rows, vocab] scratch: e_i of the candidates, else 0
  int32_t* tokens;   // [n_rows]
  float* logprobs;   // [n_lp, 1 + kMaxTopLogprobs]
  int32_t* top_ids;  // [n_lp, kMaxTopLogprobs]
};

// Order-preserving float → uint32: x < y ⇔ key(x) < key(y); −0 and +0 share +0's key; −inf maps
// to 0x007fffff, so key 0 is below every value.
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct ArgMax {
  float v;
  int i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// Block reductions (blockDim.x == kThreads). Each writes its warp partials to `red` ([kWarps] of
// shared memory, or [kSplits][kWarps] for the array form) and every thread combines them in the
// same order, so all threads return the same value. Two barriers each; `red` may be reused by the
// next call.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* red, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = red[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, red[w]);
  return r;
}
template <typename T>
__device__ __forceinline__ T block_add(T v, T* red) {
  return block_reduce(v, red, [](T a, T b) { return a + b; });
}
__device__ __forceinline__ float block_fmax(float v, float* red) {
  return block_reduce(v, red, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ uint32_t block_umax(uint32_t v, uint32_t* red) {
  return block_reduce(v, red, [](uint32_t a, uint32_t b) { return a > b ? a : b; });
}
__device__ __forceinline__ int block_imin(int v, int* red) {
  return block_reduce(v, red, [](int a, int b) { return a < b ? a : b; });
}
__device__ __forceinline__ int block_imax(int v, int* red) {
  return block_reduce(v, red, [](int a, int b) { return a > b ? a : b; });
}
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax* red) {
  for (int o = 16; o > 0; o >>= 1)
    a = better(
        a, ArgMax{__shfl_down_sync(0xffffffffu, a.v, o), __shfl_down_sync(0xffffffffu, a.i, o)});
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  ArgMax r = red[0];
  for (int w = 1; w < kWarps; ++w) r = better(r, red[w]);
  return r;
}
template <typename T>
__device__ __forceinline__ void block_add_array(T (&acc)[kSplits], T* red) {
#pragma unroll
  for (int j = 0; j < kSplits; ++j)
    for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_down_sync(0xffffffffu, acc[j], o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int j = 0; j < kSplits; ++j) red[j * kWarps + (threadIdx.x >> 5)] = acc[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kSplits; ++j) {
    T s = red[j * kWarps];
    for (int w = 1; w < kWarps; ++w) s += red[j * kWarps + w];
    acc[j] = s;
  }
}
// Exclusive prefix sum of v over the threads in thread order; *total gets the block's sum (the
// same in every thread).
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* red, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) before = all;
    all += red[w];
  }
  *total = all;
  return before + (inc - v);
}

// The smallest v in [lo, hi] with W(v) = Σ_{key(i) > v} weight(i) < bound, given W(lo − 1) ≥ bound
// and W(hi) = 0. `key(i)` and `weight(i)` read element i; weight is 1 (T = int) or e_i (double).
template <typename T, typename KeyFn, typename WeightFn>
__device__ uint32_t search_threshold(int vocab, uint32_t lo, uint32_t hi, T bound, KeyFn key,
                                     WeightFn weight, T* red) {
  T above = 0;  // W(hi)
  while (lo < hi) {
    const uint64_t span = uint64_t(hi) - lo;
    uint32_t split[kSplits];  // in [lo, hi − 1], non-decreasing
#pragma unroll
    for (int j = 0; j < kSplits; ++j) split[j] = lo + uint32_t(span * uint64_t(j + 1) / kWays);
    T acc[kSplits];
#pragma unroll
    for (int j = 0; j < kSplits; ++j) acc[j] = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t k = key(i);
      if (k < lo || k > hi) continue;
      const T w = weight(i);
#pragma unroll
      for (int j = 0; j < kSplits; ++j)
        if (k > split[j]) acc[j] += w;
    }
    block_add_array(acc, red);
    // W(split[j]) = above + acc[j], non-increasing in j: the first j where it is < bound bounds v
    // (scanned downwards, fully unrolled, so that nothing is indexed at run time).
    uint32_t new_lo = split[kSplits - 1] + 1, new_hi = hi;
    T new_above = above;
#pragma unroll
    for (int j = kSplits - 1; j >= 0; --j) {
      if (above + acc[j] < bound) {
        new_lo = j == 0 ? lo : split[j - 1] + 1;
        new_hi = split[j];
        new_above = above + acc[j];
      }
    }
    lo = new_lo;
    hi = new_hi;
    above = new_above;
  }
  return lo;
}

// Steps 2–3 for element i of a row with a penalty slot (count c, prompt bit from the mask).
__device__ __forceinline__ float penalise(float x, int i, const SampleRowParams& p,
                                          const int32_t* counts, const uint32_t* mask) {
  const int32_t c = __ldcg(counts + i);
  if (p.repetition_penalty != 1.0f) {
    const bool seen = c > 0 || ((__ldcg(mask + (i >> 5)) >> (i & 31)) & 1u);
    if (seen)
      x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
  }
  if (c > 0 && (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)) {
    x = __fsub_rn(x, __fmul_rn(p.frequency_penalty, float(c)));
    x = __fsub_rn(x, p.presence_penalty);
  }
  return x;
}

__device__ bool range_ok(int32_t begin, int32_t count, int64_t n_list) {
  return begin >= 0 && count >= 0 && int64_t(begin) + count <= n_list;
}

// sample_kernel: the whole contract of ops/sample.h for row blockIdx.x.
//   grid [n_rows], block [kThreads]; scratch keys / weights [n_rows, vocab].
//   Passes over the row (each kThreads-strided, coalesced): validity + raw max (+ processed x for
//   rows with penalties or min_tokens), then greedy argmax, or max → keys/e → ≤ 9 top-k passes →
//   ≤ 9 top-p passes → Σ e → the ordered walk; logprob rows add lse, ≤ 9 top-n passes and an
//   ordered collection of the ties at the n-th value.
//   Preconditions: the slot of a row is no other row's; ids in token_lists < vocab (checked: an
//   error code otherwise); n ≤ kMaxTopLogprobs.
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ double red_d[kSplits * kWarps];
  __shared__ int red_i[kSplits * kWarps];
  __shared__ float red_f[kWarps];
  __shared__ uint32_t red_u[kWarps];
  __shared__ ArgMax red_a[kWarps];
  __shared__ uint32_t top_key[kMaxTopLogprobs];
  __shared__ int top_id[kMaxTopLogprobs];
  __shared__ int n_top;

  const int r = blockIdx.x, tid = threadIdx.x, vocab = a.vocab;
  const SampleRowParams p = a.rows[r];
  const float* raw = a.logits + int64_t(r) * vocab;  // [vocab]
  const bool want_lp = p.logprobs >= 0;
  float* lp_row = nullptr;    // [1 + kMaxTopLogprobs]
  int32_t* id_row = nullptr;  // [kMaxTopLogprobs]
  if (want_lp && p.logprob_row >= 0 && p.logprob_row < a.n_lp) {
    lp_row = a.logprobs + p.logprob_row * int64_t(1 + kMaxTopLogprobs);
    id_row = a.top_ids + p.logprob_row * int64_t(kMaxTopLogprobs);
    for (int j = tid; j < 1 + kMaxTopLogprobs; j += kThreads)
      lp_row[j] = __int_as_float(0x7fc00000);  // NaN
    for (int j = tid; j < kMaxTopLogprobs; j += kThreads) id_row[j] = -1;
  }
  auto fail = [&](int32_t code) {
    if (tid == 0) a.tokens[r] = code;
  };

  // Inputs: list ranges, ids, slot, logprob row.
  int bad = !range_ok(p.suppress_begin, p.suppress_count, a.n_list) ||
            (want_lp && (lp_row == nullptr || p.logprobs > kMaxTopLogprobs));
  const bool has_slot = p.penalty_slot >= 0;
  if (has_slot)
    bad |= p.penalty_slot >= a.n_slots || !range_ok(p.prompt_begin, p.prompt_count, a.n_list) ||
           !range_ok(p.count_begin, p.count_count, a.n_list);
  if (!bad) {
    auto ids_ok = [&](int32_t begin, int32_t count) {
      int b = 0;
      for (int j = begin + tid; j < begin + count; j += kThreads)
        b |= a.lists[j] < 0 || a.lists[j] >= vocab;
      return b;
    };
    bad |= ids_ok(p.suppress_begin, p.suppress_count);
    if (has_slot)
      bad |= ids_ok(p.prompt_begin, p.prompt_count) | ids_ok(p.count_begin, p.count_count);
  }
  if (__syncthreads_or(bad)) return fail(kSampleErrorBadInput);

  // 0: the penalty slot.
  int32_t* counts = nullptr;  // [vocab]
  uint32_t* mask = nullptr;   // [words]
  if (has_slot) {
    counts = a.output_counts + p.penalty_slot * int64_t(vocab);
    mask = a.prompt_mask + p.penalty_slot * int64_t(a.words);
    if (p.reset_slot) {
      for (int i = tid; i < vocab; i += kThreads) counts[i] = 0;
      for (int i = tid; i < a.words; i += kThreads) mask[i] = 0;
      __syncthreads();
    }
    for (int j = p.prompt_begin + tid; j < p.prompt_begin + p.prompt_count; j += kThreads) {
      const int32_t t = a.lists[j];
      atomicOr(mask + (t >> 5), 1u << (t & 31));
    }
    for (int j = p.count_begin + tid; j < p.count_begin + p.count_count; j += kThreads)
      atomicAdd(counts + a.lists[j], 1);
    __syncthreads();
  }

  // 1–3: validity, the raw max, and the processed x where it differs from raw.
  const bool need_x = has_slot || p.suppress_count > 0;
  float* xs = reinterpret_cast<float*>(a.keys + int64_t(r) * vocab);  // [vocab] processed x
  float raw_max = -INFINITY;
  int nonfinite = 0;
  for (int i = tid; i < vocab; i += kThreads) {
    const float v = raw[i];
    nonfinite |= isnan(v) || v == INFINITY;
    raw_max = fmaxf(raw_max, v);
    if (need_x) xs[i] = has_slot ? penalise(v, i, p, counts, mask) : v;
  }
  if (__syncthreads_or(nonfinite)) return fail(kSampleErrorNonFinite);
  // The row's max, the same in every thread (the logprob search bounds depend on it: a per-thread
  // value would send the threads through different numbers of barriers).
  raw_max = block_fmax(raw_max, red_f);
  if (p.suppress_count > 0) {
    for (int j = p.suppress_begin + tid; j < p.suppress_begin + p.suppress_count; j += kThreads)
      xs[a.lists[j]] = -INFINITY;
    __syncthreads();
  }
  auto load_x = [&](int i) { return need_x ? xs[i] : raw[i]; };

  int32_t token;
  if (p.temperature < kGreedyTemperature) {
    // 4: argmax, ties → the lowest id.
    ArgMax best{-INFINITY, kNoId};
    for (int i = tid; i < vocab; i += kThreads) best = better(best, ArgMax{load_x(i), i});
    token = block_argmax(best, red_a).i;
  } else {
    // 5: x / T and its max.
    const float T = p.temperature;
    float m = -INFINITY;
    for (int i = tid; i < vocab; i += kThreads) m = fmaxf(m, __fdiv_rn(load_x(i), T));
    m = block_fmax(m, red_f);
    if (!(m > -INFINITY)) return fail(kSampleErrorAllSuppressed);
    // 6: candidates {e > 0, e ≥ min_p}: key = order_key(x), weight e; others key 0, weight 0.
    // The keys overwrite xs in place (each element read and written by the same thread).
    uint32_t* key = a.keys + int64_t(r) * vocab;  // [vocab]
    float* w = a.weights + int64_t(r) * vocab;    // [vocab]
    int n_cand = 0;
    uint32_t key_max = 0;
    for (int i = tid; i < vocab; i += kThreads) {
      const float x = __fdiv_rn(load_x(i), T);
      const float e = float(exp(double(__fsub_rn(x, m))));
      const bool cand = e > 0.0f && e >= p.min_p;
      const uint32_t k = cand ? order_key(x) : 0u;
      key[i] = k;
      w[i] = cand ? e : 0.0f;
      n_cand += cand;
      key_max = k > key_max ? k : key_max;
    }
    n_cand = block_add(n_cand, red_i);
    key_max = block_umax(key_max, red_u);
    auto key_at = [&](int i) { return key[i]; };
    uint32_t cut = 1;  // keys ≥ cut are kept: every candidate
    // 7: top-k.
    if (p.top_k > 0 && p.top_k < vocab && p.top_k < n_cand)
      cut = search_threshold<int>(
          vocab, 1u, key_max, p.top_k, key_at, [](int) { return 1; }, red_i);
    // 8: top-p over what min-p and top-k kept.
    if (p.top_p < 1.0f) {
      int n = 0;
      double z = 0.0;
      for (int i = tid; i < vocab; i += kThreads) {
        if (key[i] >= cut) {
          ++n;
          z += w[i];
        }
      }
      n = block_add(n, red_i);
      z = block_add(z, red_d);
      if (n > 1)
        cut = search_threshold<double>(
            vocab, cut, key_max, double(p.top_p) * z, key_at, [&](int i) { return double(w[i]); },
            red_d);
    }
    // 9: the draw. Σ e of the kept tokens, then the first id whose running sum exceeds u · Σ e.
    double z = 0.0;
    for (int i = tid; i < vocab; i += kThreads) z += key[i] >= cut ? double(w[i]) : 0.0;
    z = block_add(z, red_d);
    const double target = sampling_uniform(p.seed, p.step) * z;
    double carry = 0.0;
    int found = kNoId, last = -1;
    for (int base = 0; base < vocab; base += kTile) {
      const int i0 = base + tid * kItems;
      float we[kItems];
      double local = 0.0;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int i = i0 + j;
        we[j] = (i < vocab && key[i] >= cut) ? w[i] : 0.0f;
        local += we[j];
      }
      double total;
      double cum = carry + block_exclusive_scan(local, red_d, &total);
      int mine = kNoId;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (we[j] == 0.0f) continue;
        cum += we[j];
        last = i0 + j;
        if (cum > target && mine == kNoId) mine = i0 + j;
      }
      found = block_imin(mine, red_i);
      if (found != kNoId) break;
      carry += total;
    }
    token = found != kNoId ? found : block_imax(last, red_i);  // target rounded up to Σ e
  }
  if (tid == 0) a.tokens[r] = token;
  if (!want_lp) return;

  // 1: logprobs of the raw logits.
  double s = 0.0;
  for (int i = tid; i < vocab; i += kThreads) s += exp(double(raw[i]) - double(raw_max));
  s = block_add(s, red_d);
  const double lse = double(raw_max) + log(s);
  if (tid == 0) lp_row[0] = float(double(raw[token]) - lse);
  const int n = p.logprobs < vocab ? p.logprobs : vocab;
  if (n == 0) return;
  auto raw_key = [&](int i) { return order_key(raw[i]); };
  // thr: the n-th largest raw key (0 when every token is among the top n).
  const uint32_t thr =
      n < vocab ? search_threshold<int>(
                      vocab, 1u, order_key(raw_max), n, raw_key, [](int) { return 1; }, red_i)
                : 0u;
  if (tid == 0) n_top = 0;
  __syncthreads();
  for (int i = tid; i < vocab; i += kThreads) {  // fewer than n are above thr
    const uint32_t k = raw_key(i);
    if (k > thr) {
      const int at = atomicAdd(&n_top, 1);
      top_key[at] = k;
      top_id[at] = i;
    }
  }
  __syncthreads();
  const int n_above = n_top;
  // The ties at thr fill the remaining places in ascending id order.
  int taken = 0;
  for (int base = 0; base < vocab && n_above + taken < n; base += kTile) {
    const int i0 = base + tid * kItems;
    int local = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) local += i0 + j < vocab && raw_key(i0 + j) == thr;
    int total;
    int rank = taken + block_exclusive_scan(local, red_i, &total);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (i0 + j < vocab && raw_key(i0 + j) == thr) {
        if (n_above + rank < n) {
          top_key[n_above + rank] = thr;
          top_id[n_above + rank] = i0 + j;
        }
        ++rank;
      }
    }
    taken += total;
  }
  __syncthreads();
  if (tid == 0) {
    // Insertion sort of the n: key descending, id ascending.
    for (int j = 1; j < n; ++j) {
      const uint32_t k = top_key[j];
      const int id = top_id[j];
      int q = j;
      while (q > 0 && (top_key[q - 1] < k || (top_key[q - 1] == k && top_id[q - 1] > id))) {
        top_key[q] = top_key[q - 1];
        top_id[q] = top_id[q - 1];
        --q;
      }
      top_key[q] = k;
      top_id[q] = id;
    }
    for (int j = 0; j < n; ++j) {
      id_row[j] = top_id[j];
      lp_row[1 + j] = float(double(raw[top_id[j]]) - lse);
    }
  }
}

}  // namespace

void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m) {
  const char* op = "sample";
  check_device(logits, op, "logits");
  check_device(tokens, op, "tokens");
  const SampleShapes sh = check_sample_shapes(tokens, logprobs, top_ids, logits, m);
  const int64_t n_rows = sh.n_rows, vocab = sh.vocab, n_lp = sh.n_lp, n_slots = sh.n_slots;
  if (n_rows == 0) return;
  check_device(m.rows, op, "rows");
  if (m.token_lists.numel() > 0) check_device(m.token_lists, op, "token_lists");
  if (n_slots > 0) {
    check_device(m.output_counts, op, "output_counts");
    check_device(m.prompt_mask, op, "prompt_mask");
  }
  if (n_lp > 0) {
    check_device(logprobs, op, "logprobs");
    check_device(top_ids, op, "top_ids");
  }
  const size_t row_bytes = size_t(n_rows * vocab) * sizeof(float);
  SampleArgs args{};
  args.logits = logits.f32();
  args.rows = static_cast<const SampleRowParams*>(m.rows.data);
  args.lists = m.token_lists.numel() > 0 ? m.token_lists.ptr<int32_t>() : nullptr;
  args.n_list = m.token_lists.numel();
  args.prompt_mask = n_slots > 0 ? static_cast<uint32_t*>(m.prompt_mask.data) : nullptr;
  args.output_counts = n_slots > 0 ? m.output_counts.ptr<int32_t>() : nullptr;
  args.n_slots = n_slots;
  args.vocab = int(vocab);
  args.words = int(sample_mask_words(vocab));
  args.n_lp = n_lp;
  args.keys = static_cast<uint32_t*>(scratch(kScratchSampleKeys, row_bytes));
  args.weights = static_cast<float*>(scratch(kScratchSampleWeights, row_bytes));
  args.tokens = tokens.ptr<int32_t>();
  args.logprobs = n_lp > 0 ? logprobs.f32() : nullptr;
  args.top_ids = n_lp > 0 ? top_ids.ptr<int32_t>() : nullptr;
  launch_pdl(sample_kernel, unsigned(n_rows), kThreads, 0, args);
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
