// The sm_90a tensor-core absorbed MLA kernel (ops/cuda/mla/decode_sm90.cu) against the CPU twin on
// DeepSeek-V3.2's shapes: 128 heads (and 64, 16: per-GPU head counts under TP), latent 512 +
// rope 64, BF16 and FP8 (656 B/token) caches, top-2048 sparse with −1 padding and repeated
// indices, dense contexts across block boundaries up to 64k, several query tokens per sequence,
// ragged batches; the lse output; and the split-KV plan cache (a repeated batch fingerprint builds
// no plan, a changed one does). Dense BF16 decode with both producers of the seesaw kernel
// (cp.async gathers and TMA boxes, set_mla_dense_tma), NaN in every cache row never written, block
// sizes 64, 128 and 32, and the TMA map cache (one map per cache geometry). The sparse prefill on
// a BF16 cache with the seesaw kernel and its prefill variant (set_mla_prefill_kernel).
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_test_util.h"
#include "ops/cuda/mla/hooks.h"
#include "ops/cuda/mla/split_kv.cuh"
#include "ops/mla.h"
#include "ops/mla_plan.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int64_t kLora = 512, kRope = 64, kWidth = 576;
constexpr float kScale = 0.3f;  // larger than 192^-0.5 so that the softmax is peaked

// A cache with every slot holding a random row: BF16 values (as F32 for the CPU twin) or the FP8
// format written by the CPU twin.
Buffer random_cache(int64_t n_blocks, bool fp8) {
  const int64_t n_slots = n_blocks * 64;
  Buffer latent = rand_f32({n_slots, kLora}), k_pe = rand_f32({n_slots, kRope}, -2.0f, 2.0f);
  if (!fp8) {
    Buffer c(DType::F32, {n_blocks, 64, kWidth});
    for (int64_t r = 0; r < n_slots; ++r) {
      std::copy_n(latent.f32() + r * kLora, kLora, c.f32() + r * kWidth);
      std::copy_n(k_pe.f32() + r * kRope, kRope, c.f32() + r * kWidth + kLora);
    }
    round_bf16(c);
    return c;
  }
  Buffer slots(DType::I64, {n_slots});
  for (int64_t r = 0; r < n_slots; ++r) slots.ptr<int64_t>()[r] = r;
  AttentionMeta fill{1, int(n_slots), 64, {}, {}, {}, {}, slots, {}};
  Buffer cache(DType::U8, {n_blocks, 64, ops::mla_fp8_token_bytes(kLora, kRope)});
  ops::mla_cache_write(cache, latent, k_pe, fill);
  return cache;
}

// Every row of a BF16 cache [rows, 576] (F32 here) that no sequence of the batch has written
// (positions ≥ ctx in a sequence's last block, the blocks nobody uses) set to NaN: what an
// uninitialised allocation may hold. No such row may reach the MMAs (0 · NaN = NaN in P · V); the
// CPU twin reads attended rows only.
void poison_unwritten(Buffer& cache, const Batch& b, const std::vector<int>& ctx) {
  const int64_t rows = cache.numel() / kWidth, bs = b.host.block_size;
  const int64_t mb = b.block_table.shape()[1];
  std::vector<char> written(size_t(rows), 0);
  for (size_t s = 0; s < ctx.size(); ++s)
    for (int64_t p = 0; p < ctx[s]; ++p)
      written[size_t(b.block_table.ptr<int32_t>()[int64_t(s) * mb + p / bs] * bs + p % bs)] = 1;
  for (int64_t r = 0; r < rows; ++r)
    if (!written[size_t(r)]) std::fill_n(cache.f32() + r * kWidth, kWidth, NAN);
}

// Sets the dense BF16 producer (TMA or cp.async) for a scope.
struct DenseTma {
  bool was;
  explicit DenseTma(bool on) : was(ops::cuda::set_mla_dense_tma(on)) {}
  ~DenseTma() { ops::cuda::set_mla_dense_tma(was); }
};

// Sets the sparse prefill kernel (the seesaw kernel or its prefill variant) for a scope.
struct PrefillKernel {
  ops::cuda::MlaPrefillKernel was;
  explicit PrefillKernel(ops::cuda::MlaPrefillKernel k)
      : was(ops::cuda::set_mla_prefill_kernel(k)) {}
  ~PrefillKernel() { ops::cuda::set_mla_prefill_kernel(was); }
};

// Sets the kernel of BF16 sparse decode batches (the seesaw kernel or a prefill variant).
struct SparseDecodeKernel {
  ops::cuda::MlaPrefillKernel was;
  explicit SparseDecodeKernel(ops::cuda::MlaPrefillKernel k)
      : was(ops::cuda::set_mla_sparse_decode_kernel(k)) {}
  ~SparseDecodeKernel() { ops::cuda::set_mla_sparse_decode_kernel(was); }
};

// Sets the combine of many-token decode batches (one round of loads, or the 16-split rounds).
struct CombineFewSplits {
  bool was;
  explicit CombineFewSplits(bool on) : was(ops::cuda::set_mla_combine_few_splits(on)) {}
  ~CombineFewSplits() { ops::cuda::set_mla_combine_few_splits(was); }
};

struct Case {
  std::vector<int> ctx, n_new;
  int64_t heads = 128;
  int topk = 2048;  // 0 = dense
  bool fp8 = false;
  bool repeats = false;
  DType q_dt = DType::BF16, out_dt = DType::BF16;
  int block_size = 64;
  bool nan_unwritten = false;  // BF16: unwritten cache rows hold NaN (poison_unwritten)
  // q × q_mul (a power of two) with the softmax scale ÷ q_mul: the same S, larger q (past f16's
  // range: the f16 variant's pre-scale).
  float q_mul = 1.0f;
};

void run_case(const Case& c) {
  Batch b = make_batch(c.ctx, c.n_new, c.block_size);
  const int64_t n = b.host.n_tokens, H = c.heads;
  const bool sparse = c.topk > 0;
  // random_cache makes blocks of 64 rows: block_size / 64 of them per cache block.
  Buffer cache = random_cache(b.n_blocks * c.block_size / 64, c.fp8), q = rand_f32({n, H, kWidth});
  if (c.nan_unwritten && !c.fp8) poison_unwritten(cache, b, c.ctx);
  if (c.q_mul != 1.0f)
    for (int64_t i = 0; i < q.numel(); ++i) q.ptr<float>()[i] *= c.q_mul;
  round_bf16(q);
  const float scale = kScale / c.q_mul;
  Buffer topk = sparse ? random_topk(b, c.topk, c.repeats) : Buffer();
  Buffer ref(DType::F32, {n, H, kLora}), ref_lse(DType::F32, {n, H});
  ops::mla_attention_absorbed(ref, q, cache, b.host, sparse ? topk.view() : Tensor{}, scale,
                              ref_lse);
  DeviceBuffer d_cache = c.fp8 ? upload(cache) : upload(cache, DType::BF16), dq = upload(q, c.q_dt),
               d_out = poisoned(c.out_dt, {n, H, kLora}), d_lse = poisoned(DType::F32, {n, H});
  DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
  const int64_t calls = ops::cuda::mla_sm90_calls();
  ops::mla_attention_absorbed(d_out, dq, d_cache, b.dev, sparse ? d_topk.view() : Tensor{}, scale,
                              d_lse);
  EXPECT_EQ(ops::cuda::mla_sm90_calls(), calls + 1) << "the call did not take the sm90 kernel";
  int max_ctx = 0;
  for (int x : c.ctx) max_ctx = std::max(max_ctx, x);
  const bool tma =
      !sparse && !c.fp8 && ops::cuda::mla_dense_tma_enabled() && c.block_size % 64 == 0;
  const std::string name =
      strf("sm90 %s %s H%lld n%lld ctx<=%d%s q%s out%s%s%s bs%d", sparse ? "top-2048" : "dense",
           c.fp8 ? "FP8" : "BF16", static_cast<long long>(H), static_cast<long long>(n), max_ctx,
           c.repeats ? " rep" : "", c.q_dt == DType::F32 ? "F32" : "BF16",
           c.out_dt == DType::F32 ? "F32" : "BF16", tma ? " TMA" : "",
           c.nan_unwritten && !c.fp8 ? " NaN-tail" : "", c.block_size);
  // BF16 operands (P rounded to BF16 too): ~3e-3 measured class; the output rounding adds ~2e-3.
  expect_close(name, download(d_out), ref, 1e-2);
  // lse: exact up to F32 rounding on a BF16 cache (~2e-7); an FP8 cache's rows are dequantised to
  // BF16 in the kernel (the CPU twin keeps the F32 product), ~2e-4 measured.
  expect_close(name + " lse", download(d_lse), ref_lse, c.fp8 ? 1e-3 : 1e-5);
}

TEST(CudaMlaSm90, SparseDecodeBf16) {
  OSPREY_REQUIRE_GPU();
  run_case({{5000, 4000, 2048, 2047, 300, 1, 6000, 9000}, {1, 1, 1, 1, 1, 1, 1, 1}});
}

TEST(CudaMlaSm90, SparseDecodeFp8) {
  OSPREY_REQUIRE_GPU();
  Case c{{5000, 4000, 2048, 2047, 300, 1, 6000, 9000}, {1, 1, 1, 1, 1, 1, 1, 1}};
  c.fp8 = true;
  run_case(c);
}

// One sequence (B = 1 decode): its 32 blocks cut into 32 runs, the 32 partials of every head
// merged by the one-head-a-block combine; BF16 and F32 outputs, both cache formats.
TEST(CudaMlaSm90, SparseDecodeOneSequenceCombinesEverySplit) {
  OSPREY_REQUIRE_GPU();
  for (const bool fp8 : {false, true})
    for (const DType out_dt : {DType::BF16, DType::F32}) {
      Case c{{5000}, {1}};
      c.fp8 = fp8;
      c.out_dt = out_dt;
      run_case(c);
    }
}

// Decode batches of more than 16 sequences, whose combine blocks take 4 heads: B = 56 (the wave's
// decode batch; 32 heads, one head group over 132 runs: 2–4 splits a token, merged in one round
// of loads) and B = 17 (8–9 splits a token: the rounds after the warps' reductions), contexts
// from 1 to 5000, both cache formats, with each combine (set_mla_combine_few_splits) against the
// CPU twin.
TEST(CudaMlaSm90, SparseDecodeManySequencesBothCombines) {
  OSPREY_REQUIRE_GPU();
  for (const bool few : {true, false}) {
    CombineFewSplits scope(few);
    for (const int B : {56, 17})
      for (const bool fp8 : {false, true}) {
        std::vector<int> ctx(static_cast<size_t>(B)), n_new(static_cast<size_t>(B), 1);
        for (int i = 0; i < B; ++i) ctx[size_t(i)] = i % 7 == 3 ? 1 + 97 * i : 5000 - 13 * i;
        Case c{ctx, n_new};
        c.heads = 32;
        c.fp8 = fp8;
        run_case(c);
      }
  }
}

TEST(CudaMlaSm90, SparseRepeatedIndicesAndSq2) {
  OSPREY_REQUIRE_GPU();
  Case c{{5000, 3000, 70, 2100}, {2, 2, 2, 2}};  // s_q = 2 (MTP verify shape)
  c.repeats = true;
  run_case(c);
  c.fp8 = true;
  run_case(c);
}

TEST(CudaMlaSm90, SparsePrefillChunk) {
  OSPREY_REQUIRE_GPU();
  // A 300-token chunk at context 2500 and a fresh 40-token prompt: the absorbed sparse prefill.
  Case c{{2500, 40}, {300, 40}};
  c.fp8 = true;
  c.q_dt = DType::F32;
  c.out_dt = DType::F32;
  run_case(c);
}

// The absorbed sparse prefill on a BF16 cache with each kernel (the seesaw kernel, its prefill
// variant: release-ordered fills, 8-thread row gathers, batched Q staging, and the variant with
// the overlapped issue order: WG0's next S behind its last P·V) on a chunk of
// four sequences: 120 tokens at context 2600 (every row the full top-2048, 32 tiles), a fresh
// 40-token prompt (rows of 1..40 keys, shorter than a tile, −1 padded), 64 tokens whose rows
// cross 2048 (2038..2048 keys, odd and even tile counts), a fresh 130-token prompt (1..130 keys:
// 1 to 3 tiles, odd runs padded). Unwritten cache rows hold NaN; the batch is cut across parts
// (split partials). H = 128 and the TP head counts 64 and 16, F32 and BF16 q / out, repeated
// indices once. The variant must take each of these calls; an FP8 cache and a decode batch must
// not take it (and stay right).
TEST(CudaMlaSm90, SparsePrefillVariants) {
  OSPREY_REQUIRE_GPU();
  using ops::cuda::MlaPrefillKernel;
  const std::vector<int> ctx{2600, 40, 2101, 130}, n_new{120, 40, 64, 130};
  struct Shape {
    int64_t heads;
    DType q_dt, out_dt;
    bool repeats;
  };
  const Shape shapes[] = {{128, DType::BF16, DType::BF16, false},
                          {128, DType::F32, DType::F32, true},
                          {64, DType::BF16, DType::F32, false},
                          {16, DType::F32, DType::BF16, false}};
  for (MlaPrefillKernel k :
       {MlaPrefillKernel::Seesaw, MlaPrefillKernel::Pipelined, MlaPrefillKernel::Overlapped}) {
    PrefillKernel on(k);
    const int64_t want = k == MlaPrefillKernel::Seesaw ? 0 : 1;
    for (const Shape& sh : shapes) {
      Case c{ctx, n_new};
      c.heads = sh.heads;
      c.q_dt = sh.q_dt;
      c.out_dt = sh.out_dt;
      c.repeats = sh.repeats;
      c.nan_unwritten = true;
      const int64_t before = ops::cuda::mla_prefill_variant_calls();
      run_case(c);
      EXPECT_EQ(ops::cuda::mla_prefill_variant_calls(), before + want)
          << ops::cuda::mla_prefill_kernel_name(k) << " H" << sh.heads;
    }
  }
  PrefillKernel on(MlaPrefillKernel::Pipelined);
  const int64_t before = ops::cuda::mla_prefill_variant_calls();
  Case fp8{ctx, n_new};
  fp8.fp8 = true;
  run_case(fp8);
  Case decode{{5000, 300, 1, 2048}, {1, 1, 1, 1}};
  {
    SparseDecodeKernel seesaw_decode(MlaPrefillKernel::Seesaw);  // decode batches: not the setting
    run_case(decode);                                            // of prompt chunks
  }
  EXPECT_EQ(ops::cuda::mla_prefill_variant_calls(), before) << "FP8 cache / decode batch";
}

// The prefill variants on decode batches (OSPREY_MLA_SPARSE_DECODE): one token a sequence at
// contexts 5000 (the full top-2048), 300 and 1 (rows shorter than a tile, −1 padded), 2048 and
// 2101 (whole and odd tile counts), NaN in unwritten rows, split across parts; H = 128 and 16,
// F32 and BF16 q / out. Each variant (the pipelined one is the default) must take the call; the
// seesaw kernel not.
TEST(CudaMlaSm90, SparseDecodeOnPrefillVariants) {
  OSPREY_REQUIRE_GPU();
  using ops::cuda::MlaPrefillKernel;
  for (MlaPrefillKernel k :
       {MlaPrefillKernel::Pipelined, MlaPrefillKernel::Overlapped, MlaPrefillKernel::Seesaw}) {
    SparseDecodeKernel on(k);
    for (int64_t heads : {128, 16}) {
      Case c{{5000, 300, 1, 2048, 2101, 5000, 64, 4097}, {1, 1, 1, 1, 1, 1, 1, 1}};
      c.heads = heads;
      c.nan_unwritten = true;
      if (heads == 16) {
        c.q_dt = DType::F32;
        c.out_dt = DType::F32;
      }
      const int64_t before = ops::cuda::mla_prefill_variant_calls();
      run_case(c);
      EXPECT_EQ(ops::cuda::mla_prefill_variant_calls(),
                before + (k == MlaPrefillKernel::Seesaw ? 0 : 1))
          << ops::cuda::mla_prefill_kernel_name(k) << " H" << heads;
    }
  }
}

// Both producers of the BF16 cache (cp.async gathers, TMA boxes) over partial last blocks of every
// fill (1, 63, 64, 65 rows ...) with NaN in every unwritten row; the FP8 cache (cp.async only).
TEST(CudaMlaSm90, DenseDecodeBlockBoundariesTo64k) {
  OSPREY_REQUIRE_GPU();
  Case c{{65536, 16384, 4097, 4096, 64, 65, 1, 5000, 127}, {1, 1, 1, 1, 1, 1, 1, 2, 1}};
  c.topk = 0;
  c.nan_unwritten = true;
  for (bool tma : {false, true}) {
    DenseTma on(tma);
    run_case(c);
  }
  c.fp8 = true;
  c.q_dt = DType::F32;
  run_case(c);
}

// Cache blocks of 128 rows: a 64-entry tile is half a block, the TMA box of a partial second half
// starts inside the block (its rows above the attended ones are the block's earlier, written rows,
// flagged invalid); s_q = 3 puts three tokens' different partial tiles on one block. Block size 32
// is no whole tile: the cp.async producer serves it whatever the setting.
TEST(CudaMlaSm90, DenseDecodeBlockSize128And32) {
  OSPREY_REQUIRE_GPU();
  for (int bs : {128, 32})
    for (bool tma : {false, true}) {
      DenseTma on(tma);
      Case c{{300, 129, 128, 1, 5000, 191}, {1, 1, 1, 1, 3, 1}};
      c.topk = 0;
      c.block_size = bs;
      c.nan_unwritten = true;
      c.out_dt = DType::F32;
      run_case(c);
    }
}

// The TMA map is encoded once per (cache, n_blocks, block_size): the same cache again (the next
// step) encodes nothing, the same allocation seen with more blocks (a grown cache) encodes a new
// map, and each result matches the CPU twin.
TEST(CudaMlaSm90, DenseTmaMapPerCacheGeometry) {
  OSPREY_REQUIRE_GPU();
  DenseTma on(true);
  Batch b = make_batch({700, 64, 1000}, {1, 1, 2});
  constexpr int64_t kExtra = 37;  // blocks past the batch's, in the larger view
  Buffer cache = random_cache(b.n_blocks + kExtra, false), q = rand_f32({4, 128, kWidth});
  round_bf16(q);
  DeviceBuffer d_cache = upload(cache, DType::BF16), dq = upload(q, DType::BF16);
  Tensor small = d_cache.view(), all = d_cache.view();
  small.shape = {b.n_blocks, 64, kWidth};
  Buffer ref(DType::F32, {4, 128, kLora});
  ops::mla_attention_absorbed(ref, q, cache, b.host, Tensor{}, kScale);
  auto check = [&](Tensor c, const char* what, int64_t new_maps) {
    DeviceBuffer d_out = poisoned(DType::BF16, {4, 128, kLora});
    const int64_t before = ops::cuda::mla_dense_tma_map_builds();
    ops::mla_attention_absorbed(d_out, dq, c, b.dev, Tensor{}, kScale);
    EXPECT_EQ(ops::cuda::mla_dense_tma_map_builds(), before + new_maps) << what;
    expect_close(strf("sm90 dense BF16 TMA map: %s", what), download(d_out), ref, 1e-2);
  };
  ops::cuda::forget_mla_dense_tma_maps();
  check(small, "first call", 1);
  check(small, "same cache again", 0);
  check(all, "more blocks", 1);
  check(all, "more blocks again", 0);
  check(small, "first view again", 0);
}

struct Fp8Kernel {
  ops::cuda::MlaFp8Kernel was;
  explicit Fp8Kernel(ops::cuda::MlaFp8Kernel k) : was(ops::cuda::set_mla_fp8_kernel(k)) {}
  ~Fp8Kernel() { ops::cuda::set_mla_fp8_kernel(was); }
};

// The crossover kernels (FP8 cache, 128 heads: the two head groups of a part in a cluster of two
// CTAs, each dequantising half of every key tile into both CTAs' shared memory; the lockstep
// consumers, or the prefill variant's) against the CPU twin on every kind of call they take:
// sparse decode at contexts 1–9000, one sequence (32 splits), 56 sequences, s_q = 2 with repeated
// indices, a prompt chunk with F32 q and out, dense decode over partial blocks up to 65536 keys;
// the lockstep kernel, its f16 variant and Auto (f16 from 16 query tokens, the cases of 56
// sequences and of the prompt chunk) take the same calls, and 64 or 16 heads (one head
// group, nothing to pair) never take a crossover kernel; the f16 variant also with q past f16's
// range.
TEST(CudaMlaSm90, Fp8CrossoverMatchesTwin) {
  OSPREY_REQUIRE_GPU();
  using ops::cuda::MlaFp8Kernel;
  auto run = [](const Case& c, MlaFp8Kernel k, bool takes) {
    Fp8Kernel scope(k);
    const int64_t before = ops::cuda::mla_fp8_crossover_calls();
    const int64_t f16_before = ops::cuda::mla_fp8_f16_calls();
    run_case(c);
    EXPECT_EQ(ops::cuda::mla_fp8_crossover_calls(), before + (takes ? 1 : 0))
        << "heads " << c.heads << " kernel " << ops::cuda::mla_fp8_kernel_name(k);
    // The f16 variant serves F16 calls, and Auto's calls of at least 16 query tokens, while the
    // latent bound (ops/mla.h) is unknown or in range.
    int tokens = 0;
    for (int n : c.n_new) tokens += n;
    const bool f16 = (k == MlaFp8Kernel::F16 || (k == MlaFp8Kernel::Auto && tokens >= 16)) &&
                     ops::mla_latent_bound() <= ops::kMlaF16LatentLimit;
    EXPECT_EQ(ops::cuda::mla_fp8_f16_calls(), f16_before + (f16 ? 1 : 0))
        << "heads " << c.heads << " kernel " << ops::cuda::mla_fp8_kernel_name(k);
  };
  std::vector<Case> cases;
  cases.push_back({{5000, 4000, 2048, 2047, 300, 1, 6000, 9000}, {1, 1, 1, 1, 1, 1, 1, 1}});
  cases.push_back({{5000}, {1}});
  {
    std::vector<int> ctx(56), n_new(56, 1);
    for (int i = 0; i < 56; ++i) ctx[size_t(i)] = i % 7 == 3 ? 1 + 97 * i : 5000 - 13 * i;
    cases.push_back({ctx, n_new});
  }
  cases.push_back({{5000, 3000, 70, 2100}, {2, 2, 2, 2}});
  cases.back().repeats = true;
  cases.push_back({{2500, 40}, {300, 40}});
  cases.back().q_dt = DType::F32;
  cases.back().out_dt = DType::F32;
  cases.push_back({{65536, 16384, 4097, 4096, 64, 65, 1, 5000, 127}, {1, 1, 1, 1, 1, 1, 1, 2, 1}});
  cases.back().topk = 0;
  cases.back().out_dt = DType::F32;
  for (Case& c : cases) {
    c.fp8 = true;
    for (MlaFp8Kernel k : {MlaFp8Kernel::Crossover, MlaFp8Kernel::Pipelined}) run(c, k, true);
    for (MlaFp8Kernel k : {MlaFp8Kernel::Lockstep, MlaFp8Kernel::F16, MlaFp8Kernel::Auto})
      run(c, k, false);
  }
  for (int64_t heads : {64, 16}) {
    Case c{{5000, 700, 3}, {1, 2, 1}};
    c.heads = heads;
    c.fp8 = true;
    for (MlaFp8Kernel k : {MlaFp8Kernel::Crossover, MlaFp8Kernel::Pipelined, MlaFp8Kernel::F16})
      run(c, k, false);
  }
  // q past f16's range (max |q| about 2^17): the f16 variant pre-scales it by 2^-3.
  Case big{{5000, 700, 3}, {1, 2, 1}};
  big.fp8 = true;
  big.q_mul = 131072.0f;
  for (MlaFp8Kernel k : {MlaFp8Kernel::Lockstep, MlaFp8Kernel::F16}) run(big, k, false);
  // A model whose latent f16 cannot hold: F16 declines, the lockstep kernel serves (run checks
  // that the f16 variant's count did not move).
  ops::set_mla_latent_bound(1e5f);
  run(big, MlaFp8Kernel::F16, false);
  run(cases[2], MlaFp8Kernel::Auto, false);
  ops::set_mla_latent_bound(0.0f);
}

TEST(CudaMlaSm90, HeadCountsUnderTensorParallel) {
  OSPREY_REQUIRE_GPU();
  for (int64_t heads : {64, 16}) {
    Case c{{5000, 700, 3}, {1, 2, 1}};
    c.heads = heads;
    c.fp8 = heads == 16;
    run_case(c);
  }
}

std::vector<int32_t> from_device(const int32_t* p, size_t n) {
  std::vector<int32_t> h(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

// The device plan (split_kv.cu) equals the host reference (ops/mla_plan.h) array for array: a
// decode batch with no per-token cost (equal runs of blocks), a causal 1440-token chunk and a
// ragged prefill batch with the prefill cost, on 66 and 132 parts; and the cost changes the cut
// there.
TEST(CudaMlaSm90, SplitPlanMatchesHostReference) {
  OSPREY_REQUIRE_GPU();
  struct Case {
    std::vector<int> ctx, n_new;
    int64_t clamp;
    int n_parts;
    int32_t fixed;
  };
  const Case cases[] = {{{5000, 3000, 2500, 70}, {1, 1, 1, 1}, 2048, 66, 0},
                        {{1440}, {1440}, 2048, 66, ops::kMlaPrefillTokenCost},
                        {{1440}, {1440}, 2048, 66, 0},
                        {{2600, 40, 2101, 130}, {120, 40, 64, 130}, 2048, 132, 4},
                        {{2600, 40, 2101, 130}, {120, 40, 64, 130}, INT32_MAX, 66, 9}};
  std::vector<int32_t> cut_cost0, cut_cost;
  for (const Case& c : cases) {
    Batch b = make_batch(c.ctx, c.n_new);
    AttentionMeta m = b.dev;
    m.fingerprint = 0;  // built fresh
    const ops::cuda::MlaPlan plan = ops::cuda::mla_split_plan(m, c.clamp, c.n_parts, c.fixed);
    const std::vector<int32_t> pos(b.positions.ptr<int32_t>(),
                                   b.positions.ptr<int32_t>() + m.n_tokens);
    const ops::MlaPlanReference want = ops::mla_plan_reference(pos, c.clamp, c.n_parts, c.fixed);
    const size_t n = size_t(m.n_tokens);
    SCOPED_TRACE(strf("%zu tokens, %d parts, cost %d", n, c.n_parts, int(c.fixed)));
    EXPECT_EQ(from_device(plan.cum, n + 1), want.cum);
    EXPECT_EQ(from_device(plan.part_start, size_t(c.n_parts) + 1), want.part_start);
    EXPECT_EQ(from_device(plan.first_part, n), want.first_part);
    EXPECT_EQ(from_device(plan.n_splits, n), want.n_splits);
    EXPECT_EQ(from_device(plan.split_base, n + 1), want.split_base);
    const std::vector<int32_t> list = from_device(plan.split_list, size_t(c.n_parts));
    ASSERT_EQ(size_t(list[0]), want.split_tokens.size());
    EXPECT_EQ(std::vector<int32_t>(list.begin() + 1, list.begin() + 1 + list[0]),
              want.split_tokens);
    EXPECT_LE(want.split_base[n], plan.max_slots);
    if (c.ctx.size() == 1 && c.fixed == 0) cut_cost0 = want.part_start;
    if (c.ctx.size() == 1 && c.fixed > 0) cut_cost = want.part_start;
  }
  EXPECT_NE(cut_cost0, cut_cost) << "the per-token cost must move the causal chunk's cuts";
}

// The plan kernel runs once per fingerprint: the same fingerprint again (the next layer of the
// step, or a decode step whose clamped lengths repeat) builds nothing; a changed one builds.
TEST(CudaMlaSm90, PlanBuiltOncePerFingerprint) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({5000, 3000, 2500}, {1, 1, 1});
  Buffer cache = random_cache(b.n_blocks, true), q = rand_f32({3, 128, kWidth});
  Buffer topk = random_topk(b, 2048, false);
  DeviceBuffer d_cache = upload(cache), dq = upload(q, DType::BF16),
               d_out = poisoned(DType::BF16, {3, 128, kLora}), d_topk = cuda::to_device(topk);
  AttentionMeta m = b.dev;
  m.fingerprint = attention_fingerprint(b.host, 2048);
  const int64_t before = ops::cuda::mla_plan_builds();
  for (int layer = 0; layer < 5; ++layer)
    ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 1) << "five layers, one fingerprint";
  // The next decode step: every context grew by one but all stay past top-2048, so the clamped
  // lengths (and the fingerprint) repeat.
  Buffer next_pos(DType::I32, {3});
  for (int t = 0; t < 3; ++t) next_pos.ptr<int32_t>()[t] = b.positions.ptr<int32_t>()[t] + 1;
  AttentionMeta next_host = b.host;
  next_host.positions = next_pos;
  EXPECT_EQ(attention_fingerprint(next_host, 2048), m.fingerprint);
  EXPECT_NE(attention_fingerprint(next_host, INT32_MAX), attention_fingerprint(b.host, INT32_MAX))
      << "dense lengths grew: the dense fingerprint must change";
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 1);
  // A changed fingerprint (another batch shape) rebuilds, once.
  m.fingerprint ^= 0x9e3779b97f4a7c15ull;
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 2);
  // Unknown (0): rebuilt every call.
  m.fingerprint = 0;
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 4);
  // And the result with a cached plan is still right.
  Buffer ref(DType::F32, {3, 128, kLora});
  ops::mla_attention_absorbed(ref, q, cache, b.host, topk, kScale);
  expect_close("sm90 top-2048 FP8 H128 n3 (cached plan)", download(d_out), ref, 1e-2);
}

}  // namespace
}  // namespace osprey
