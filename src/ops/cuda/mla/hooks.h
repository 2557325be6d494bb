// Host-side counters and a switch of the sm90 MLA path, for tests and the kernel benchmark (plain
// C++, no CUDA types).
#pragma once

#include <cstdint>

namespace osprey::ops::cuda {

// How many times the split-KV plan kernel has been launched in this process (split_kv.cuh): a
// repeated batch fingerprint must not launch it, a changed one must.
int64_t mla_plan_builds();
// How many absorbed-attention calls the tensor-core (sm90) decode kernel has served.
int64_t mla_sm90_calls();
// Routes absorbed attention to the CUDA-core kernels when false (default true): the benchmark's
// baseline and a second reference for the tests. Returns the previous setting.
bool set_mla_sm90_enabled(bool enabled);
// Loads the dense BF16 cache tiles of the seesaw kernel with TMA (true) or the cp.async gathers
// (false; the default, and OSPREY_MLA_DENSE_TMA=1 sets true). Returns the previous setting.
bool set_mla_dense_tma(bool enabled);
bool mla_dense_tma_enabled();
// How many TMA maps of latent caches have been encoded (one per (cache, n_blocks, block_size)).
int64_t mla_dense_tma_map_builds();
// The absorbed sparse prefill kernel on a BF16 cache (decode_sm90.cu): Pipelined, the seesaw
// kernel's prefill variant (fills in release order, coalesced gathers, batched Q staging; the
// default), Overlapped, the variant with FlashMLA's issue order (WG0's next S queued behind
// its last P·V; OSPREY_MLA_PREFILL=overlapped), or Seesaw, the decode kernel as it is
// (OSPREY_MLA_PREFILL=seesaw). The variants take sparse BF16 calls with more query tokens than
// sequences (decode calls: set_mla_sparse_decode_kernel below); FP8 caches and dense calls keep
// their kernels.
// Returns the previous setting.
enum class MlaPrefillKernel { Seesaw, Pipelined, Overlapped };
MlaPrefillKernel set_mla_prefill_kernel(MlaPrefillKernel k);
MlaPrefillKernel mla_prefill_kernel();
const char* mla_prefill_kernel_name(MlaPrefillKernel k);
// The per-token cost, in 64-entry blocks, at which the split-KV plan cuts the runs of calls with
// several query tokens a sequence (prompt chunks, verify steps; ops/mla_plan.h `fixed`; decode
// batches use 0). Default ops::kMlaPrefillTokenCost (ops/mla_plan.h); the benchmark compares
// values. Returns the previous setting.
int set_mla_prefill_token_cost(int blocks);
int mla_prefill_token_cost();
// The kernel of BF16 sparse decode calls (one query token a sequence): Pipelined, the prefill
// variant (the default: 20-35% faster than the seesaw kernel at B = 64-128 on the H100), Seesaw,
// or Overlapped (OSPREY_MLA_SPARSE_DECODE=seesaw|overlapped; the kernel benchmark's A/B). Returns
// the previous setting.
MlaPrefillKernel set_mla_sparse_decode_kernel(MlaPrefillKernel k);
MlaPrefillKernel mla_sparse_decode_kernel();
// How many calls the prefill variants (pipelined or overlapped) have served.
int64_t mla_prefill_variant_calls();
// The split-KV combine of decode batches of more than 16 tokens: true (the default) merges each
// token's splits in one round of loads when it has at most 4 (smaller blocks, 3 an SM); false
// takes the 16-split rounds of the B = 1 combine for every batch (OSPREY_MLA_COMBINE=rounds; the
// A/B and the tests' second path). Returns the previous setting.
bool set_mla_combine_few_splits(bool enabled);
bool mla_combine_few_splits();
// The kernel of FP8-cache calls with H a multiple of 128: Lockstep (every CTA dequantises every
// key tile it reads), Crossover (the lockstep kernel with both head groups of a part in a cluster
// of two CTAs, each dequantising half of every tile for both) or Pipelined (the BF16 prefill
// variant's consumers over the crossover's dequantised tiles), or F16 (the lockstep kernel with the
// latent in f16: e4m3 → f16 exact, × the scale in f16, one instruction a value where BF16 takes
// about three; q's latent part in f16 after a power-of-two pre-scale, P in f16, the rope in BF16;
// any H), or Auto (the default: F16 for calls of at least kMlaF16MinTokens query tokens, Lockstep
// below; decode_sm90.cu says what was measured). OSPREY_MLA_FP8=auto|lockstep|crossover|
// pipelined|f16. Other FP8 calls (H ≤ 64) keep the lockstep kernel unless F16 or Auto chooses F16.
// F16 holds cached latent values up to 65504 only: it serves a call only while the loaded model's
// latent bound (ops/mla.h) allows, else the lockstep kernel does. Returns the previous setting.
enum class MlaFp8Kernel { Lockstep, Crossover, Pipelined, F16, Auto };
MlaFp8Kernel set_mla_fp8_kernel(MlaFp8Kernel k);
MlaFp8Kernel mla_fp8_kernel();
const char* mla_fp8_kernel_name(MlaFp8Kernel k);
// How many calls the crossover kernels (Crossover or Pipelined) have served.
int64_t mla_fp8_crossover_calls();
// How many calls the f16 variant has served (F16 chosen and the latent bound, ops/mla.h, allowing
// it).
int64_t mla_fp8_f16_calls();
// Drops every cached TMA map (the next call of each cache encodes it again): a test's clean start.
void forget_mla_dense_tma_maps();

}  // namespace osprey::ops::cuda
