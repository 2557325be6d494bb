#include "bench/step.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "bench/engine_loop.h"
#include "core/error.h"
#include "model/greedy.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "model/step_cost.h"

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#include "engine/cuda_graph_runner.h"
#include "ops/ceilings.h"
#include "ops/cuda/gemm/fp8_swapab.cuh"
#include "ops/cuda/graph_hooks.h"
#include "ops/pdl.h"
#include "ops/stream_fork.h"
#include "ops/tensor_ops.h"
#endif

namespace osprey::bench {

namespace {
EngineLoopOptions engine_loop_options(const StepOptions& o) {
  EngineLoopOptions e;
  e.batches = o.batches;
  e.context = o.context;
  e.warmup = o.warmup;
  e.iters = o.iters;
  e.seed = o.seed;
  return e;
}
}  // namespace

#ifndef OSPREY_WITH_CUDA
void run_step_benchmark(const StepOptions& o) {
  if (!o.engine_loop || o.model_dir.empty())
    fail(
        "osprey bench step needs the CUDA backend: rebuild where nvcc is installed (without it "
        "only --engine-loop --model DIR runs, on the CPU)");
  const std::unique_ptr<DeepseekModel> model = load_model_cpu(o.model_dir);
  std::printf("model: %s on the CPU, %d layers\n", o.model_dir.c_str(),
              model->config().num_hidden_layers);
  run_engine_loop(*model, engine_loop_options(o));
}
#else

namespace {
struct Row {
  std::string what;
  ops::cuda::Timing t;
  StepCost cost;
  int tokens;
};

// After a graph's node counts: each memset node's bytes and the kernels beside it (a step should
// hold none), and cuBLASLt's algorithm choices so far (a GEMM whose every candidate zero-fills
// something is one source of them).
void print_memset_nodes(const cuda::GraphNodeCounts& n) {
  for (size_t i = 0; i < n.memset_bytes.size(); ++i)
    std::printf("  memset node of %lld bytes (a step should hold none), %s\n",
                static_cast<long long>(n.memset_bytes[i]),
                i < n.memset_neighbours.size() ? n.memset_neighbours[i].c_str() : "");
  const ops::cuda::LtAlgoStats lt = ops::cuda::lt_algo_stats();
  std::printf(
      "  cuBLASLt so far: %lld GEMMs; %lld took a later heuristic choice than the first (which "
      "held a memset node), %lld had no choice without one\n",
      static_cast<long long>(lt.gemms), static_cast<long long>(lt.later_choice),
      static_cast<long long>(lt.no_clean_choice));
}
}  // namespace

// The MTP layer's steps around a verify step of B sequences and K drafts (engine/mtp_drafter.h),
// timed like the rest (eager, CUDA events; logits left on the device, as the drafter's argmax
// reads them there):
//   catch-up: the MTP layer over each sequence's kept tokens, here all 1 + K (every draft
//             accepted: the most it costs), its logits at each sequence's last one;
//   draft:    one MTP step of one token a sequence, run K − 1 times a step (drafts d_2 .. d_K).
// With o.accepted_length = L, MTP decoding makes L tokens a sequence per engine step of
// verify + catch-up + (K − 1) · draft, where plain decoding makes 1 per decode step: the speedup
// printed is L · decode / (verify + catch-up + (K − 1) · draft).
// decoding_seqs(B, n, all_logits): run_step_benchmark's B sequences of n random tokens each.
template <typename DecodingSeqs>
void time_mtp_steps(const DeepseekModel& model, PagedKVCache& cache, const ModelConfig& c,
                    const StepOptions& o, int B, int K, double verify_ms, double decode_ms,
                    const DecodingSeqs& decoding_seqs, std::vector<Row>& rows) {
  const int64_t D = c.hidden_size;
  auto time_mtp = [&](int per_seq) {
    OwnedBatch batch(decoding_seqs(B, per_seq, false), kBlockSize);
    // hidden [B · per_seq, D] F32: the main model's (or the last draft's) hidden states, random
    Storage hidden(Device::CUDA, DType::F32, {int64_t(B) * per_seq, D});
    ops::cuda::fill_uniform(hidden.view(), o.seed + 300 + uint64_t(per_seq), -1.0f, 1.0f);
    Storage logits(Device::CUDA, DType::F32, {B, c.vocab_size});  // [B, V] last token's
    Storage out_hidden(Device::CUDA, DType::F32, {B, D});         // [B, D] next draft's hidden
    return ops::cuda::time_events(
        [&] {
          model.forward_mtp(batch.batch(), hidden.view(), cache, logits.view(), out_hidden.view());
        },
        o.warmup, o.iters);
  };
  const ops::cuda::Timing catch_up = time_mtp(1 + K);
  const ops::cuda::Timing draft = time_mtp(1);
  const StepCost none{};
  rows.push_back(
      {"mtp catch-up B=" + std::to_string(B) + " x" + std::to_string(1 + K), catch_up, none, B});
  rows.push_back({"mtp draft B=" + std::to_string(B), draft, none, B});
  if (o.accepted_length <= 0) return;
  const double step_ms = verify_ms + catch_up.median_ms + (K - 1) * draft.median_ms;
  std::printf(
      "MTP K=%d B=%d at mean accepted length %.3f: verify %.3f + catch-up %.3f + %d x draft "
      "%.3f = %.3f ms an engine step for %.3f tokens a sequence, against decode %.3f ms for 1: "
      "speedup %.2fx\n",
      K, B, o.accepted_length, verify_ms, catch_up.median_ms, K - 1, draft.median_ms, step_ms,
      o.accepted_length, decode_ms, o.accepted_length * decode_ms / step_ms);
}

void run_step_benchmark(const StepOptions& o) {
  if (cuda::device_count() == 0) fail("osprey bench step: no CUDA device");
  if (o.model_dir.empty() == o.preset.empty()) fail("give one of --model DIR or --preset NAME");
  const bool dummy = !o.preset.empty() || o.load_format == "dummy";
  ModelConfig c = o.preset.empty() ? ModelConfig::from_file(o.model_dir) : preset_config(o.preset);
  // Verify steps come with MTP draft steps: a dummy model gets DeepSeek's one MTP layer.
  const bool mtp_added = o.spec_tokens > 0 && dummy && c.num_nextn_predict_layers == 0;
  if (mtp_added) c.num_nextn_predict_layers = 1;
  bool fp8 = o.fp8;
  ModelWeights w;
  if (dummy) {
    w = make_dummy_weights_cuda(c, o.seed, fp8);
  } else {
    Checkpoint ck(o.model_dir);
    w = load_weights_cuda(ck, c);
    fp8 = w.layers[0].attn.kv_a_proj.weight.dtype == DType::F8_E4M3;
  }
  DeepseekModel model(c, std::move(w));
  model.set_kv_cache_dtype(parse_kv_cache_dtype(o.kv_cache_dtype));
  size_t free_b = 0, total_b = 0;
  ops::cuda::memory_info(&free_b, &total_b);
  std::printf("model: %s, %d layers (%s), weights %s; GPU memory used %.1f GB of %.1f GB\n",
              o.preset.empty() ? o.model_dir.c_str() : o.preset.c_str(), c.num_hidden_layers,
              fp8 ? "FP8 linears" : "BF16 linears",
              dummy ? "random on the GPU (dummy)" : "from files", double(total_b - free_b) / 1e9,
              double(total_b) / 1e9);
  const bool time_mtp = o.spec_tokens > 0 && model.has_mtp();
  if (o.spec_tokens > 0)
    std::printf("MTP layer: %s\n", !time_mtp   ? "none (the draft steps are not timed)"
                                   : mtp_added ? "one, added to the config (dummy weights)"
                                               : "the model's");

  // Ceilings of this card, now.
  const double copy_gbs = ops::cuda::copy_bandwidth_gbs(size_t(4) << 30);
  const double bf16_tflops = ops::cuda::bf16_gemm_tflops(8192);
  std::printf(
      "ceilings: device copy %.0f GB/s (read + write, 4 GiB), BF16 GEMM 8192^3 %.0f TFLOP/s\n",
      copy_gbs, bf16_tflops);
  std::printf("programmatic dependent launch (PDL): %s (OSPREY_PDL=0 turns it off)\n",
              ops::cuda::pdl_enabled() ? "on" : "off");
  std::printf(
      "attention's stream forks: %s (OSPREY_STREAM_FORK=1|0); dense FP8 weight tiles by %s, %s "
      "k-blocks a stage at <= %lld tokens (OSPREY_FP8_DENSE_TMA, OSPREY_FP8_DENSE_KGROUPS)\n",
      ops::stream_fork_enabled() ? "on" : "off",
      ops::cuda::fp8_swapab_dense_tma() ? "TMA" : "cp.async",
      ops::cuda::fp8_swapab_dense_groups() == ops::cuda::kDenseGroupsAuto
          ? ("auto (4 where each split keeps >= " +
             std::to_string(ops::cuda::kDeepStageMinKBlocks) + " k-blocks, else 2)")
                .c_str()
          : std::to_string(ops::cuda::fp8_swapab_dense_groups()).c_str(),
      static_cast<long long>(ops::cuda::kSwapAbDeepStageMaxTokens));
  std::printf(
      "dense FP8 swap-AB token limits: %lld a linear, %lld a group of one input; up to %lld for "
      "linears of <= %lld MB (OSPREY_FP8_SWAPAB_MAX_TOKENS, _GROUP_MAX_TOKENS, _WIDE_MAX_MB; 0: "
      "off)\n",
      static_cast<long long>(ops::cuda::fp8_swapab_max_tokens()),
      static_cast<long long>(ops::cuda::fp8_swapab_group_max_tokens()),
      static_cast<long long>(ops::cuda::kSwapAbWideMaxTokens),
      static_cast<long long>(ops::cuda::fp8_swapab_wide_max_bytes() >> 20));

  std::mt19937 rng(uint32_t(o.seed));
  std::uniform_int_distribution<int> tok(2, c.vocab_size - 1);
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t blocks_per_seq = (std::max(o.context, o.prefill) + kBlockSize) / kBlockSize + 1;
  PagedKVCache cache = model.make_cache(blocks_per_seq * max_batch, time_mtp);
  // Random cache contents (never time on zeros): as if every sequence had `context` tokens (the
  // MTP layer's cache layer too).
  for (int l = 0; l < c.num_hidden_layers + (time_mtp ? 1 : 0); ++l) {
    // The FP8 latent cache (U8) likewise: e4m3 bytes in [-1, 1] everywhere, so the scales read as
    // tiny finite fp32 and the rope part as finite bf16 (fine for timing).
    Tensor lat = cache.latent(l);
    if (lat.dtype == DType::U8) lat.dtype = DType::F8_E4M3;
    ops::cuda::fill_uniform(lat, o.seed + 100 + uint64_t(l), -1.0f, 1.0f);
    if (c.has_indexer) {
      // The FP8 indexer cache (U8): e4m3 values in [-1, 1]; the scale slots then hold those bytes
      // too, read as fp32 tiny finite numbers (fine for timing).
      Tensor ik = cache.index_keys(l);
      if (ik.dtype == DType::U8) ik.dtype = DType::F8_E4M3;
      ops::cuda::fill_uniform(ik, o.seed + 200 + uint64_t(l), -1.0f, 1.0f);
    }
  }
  auto blocks_of = [&](int s) {
    std::vector<int32_t> b(static_cast<size_t>(blocks_per_seq));
    std::iota(b.begin(), b.end(), int32_t(s * blocks_per_seq));
    return b;
  };
  // B decoding sequences at position context − 1, each bringing n random tokens (its own 1, or
  // 1 + K for a verify step), with logits of every token (all_logits) or of the last.
  auto decoding_seqs = [&](int B, int n, bool all_logits) {
    std::vector<SeqStep> seqs;
    for (int s = 0; s < B; ++s) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = tok(rng);
      seqs.push_back(SeqStep{t, int32_t(o.context - 1), blocks_of(s), all_logits});
    }
    return seqs;
  };

  std::vector<Row> rows;
  std::map<int, double> decode_ms;  // batch -> the eager decode step's median
  for (int B : o.batches) {
    OwnedBatch batch(decoding_seqs(B, 1, false), kBlockSize);
    Buffer logits(DType::F32, {B, c.vocab_size});
    const auto t = ops::cuda::time_events([&] { model.forward(batch.batch(), cache, logits); },
                                          o.warmup, o.iters);
    decode_ms[B] = t.median_ms;
    rows.push_back(
        {"decode B=" + std::to_string(B) + " ctx=" + std::to_string(o.context), t,
         decode_cost(c, fp8, B, o.context,
                     PagedKVCache::latent_token_bytes(c, Device::CUDA, model.fp8_latent_cache())),
         B});
    if (!o.cuda_graph) continue;
    // The same step as a graph replay: one bucket of exactly B (no padding), device logits read
    // back like the eager row's.
    CudaGraphRunner graphs(model, {B});
    Storage dev_logits(Device::CUDA, DType::F32, {B, c.vocab_size});
    bool replayed = true;
    const auto tg = ops::cuda::time_events(
        [&] {
          replayed = replayed && graphs.forward(batch.batch(), cache, dev_logits.view());
          cuda::copy(logits, dev_logits.view());
        },
        o.warmup, o.iters);
    OSPREY_CHECK(replayed && graphs.replays() > 0, "bench step: B=", B,
                 " did not run as a CUDA graph");
    const cuda::GraphNodeCounts n = graphs.graph(B)->nodes();
    std::printf(
        "graph B=%d: %d kernels, %d memsets, %d memcpys, %d host nodes, %d other, %d joins (%lld "
        "captures)\n",
        B, n.kernels, n.memsets, n.memcpys, n.hosts, n.others, n.joins,
        static_cast<long long>(graphs.captures()));
    print_memset_nodes(n);
    rows.push_back(
        {"graph  B=" + std::to_string(B) + " ctx=" + std::to_string(o.context), tg,
         decode_cost(c, fp8, B, o.context,
                     PagedKVCache::latent_token_bytes(c, Device::CUDA, model.fp8_latent_cache())),
         B});
  }
  for (int B : o.spec_tokens > 0 ? o.batches : std::vector<int>{}) {
    const int K = o.spec_tokens;
    OwnedBatch owned(decoding_seqs(B, 1 + K, true), kBlockSize);
    ForwardBatch batch = owned.batch();
    batch.spec_decode = true;  // the decode (absorbed) path with s_q = 1 + K, as the engine runs it
    Buffer logits(DType::F32, {int64_t(B) * (1 + K), c.vocab_size});
    const auto t =
        ops::cuda::time_events([&] { model.forward(batch, cache, logits); }, o.warmup, o.iters);
    rows.push_back(
        {"verify B=" + std::to_string(B) + " K=" + std::to_string(K), t,
         decode_cost(c, fp8, B, o.context,
                     PagedKVCache::latent_token_bytes(c, Device::CUDA, model.fp8_latent_cache())),
         B});
    if (time_mtp)
      time_mtp_steps(model, cache, c, o, B, K, t.median_ms, decode_ms[B], decoding_seqs, rows);
    if (!o.cuda_graph) continue;
    // The same verify step as a graph replay (key (B, 1 + K), no padding), every row's logits
    // read back like the eager row's.
    CudaGraphRunner graphs(model, {B});
    Storage dev_logits(Device::CUDA, DType::F32, {int64_t(B) * (1 + K), c.vocab_size});
    bool replayed = true;
    const auto tg = ops::cuda::time_events(
        [&] {
          replayed = replayed && graphs.forward(batch, cache, dev_logits.view());
          cuda::copy(logits, dev_logits.view());
        },
        o.warmup, o.iters);
    OSPREY_CHECK(replayed && graphs.replays() > 0, "bench step: verify B=", B, " K=", K,
                 " did not run as a CUDA graph");
    const cuda::GraphNodeCounts n = graphs.graph(B, false, 1 + K)->nodes();
    std::printf(
        "verify graph B=%d K=%d: %d kernels, %d memsets, %d memcpys, %d host nodes, %d "
        "other\n",
        B, K, n.kernels, n.memsets, n.memcpys, n.hosts, n.others);
    print_memset_nodes(n);
    rows.push_back(
        {"vgraph B=" + std::to_string(B) + " K=" + std::to_string(K), tg,
         decode_cost(c, fp8, B, o.context,
                     PagedKVCache::latent_token_bytes(c, Device::CUDA, model.fp8_latent_cache())),
         B});
  }
  if (o.prefill > 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(o.prefill));
    for (auto& x : prompt) x = tok(rng);
    OwnedBatch batch({SeqStep{prompt, 0, blocks_of(0), false}}, kBlockSize);
    Buffer logits(DType::F32, {1, c.vocab_size});
    const auto t = ops::cuda::time_events([&] { model.forward(batch.batch(), cache, logits); }, 1,
                                          o.prefill_iters);
    rows.push_back({"prefill " + std::to_string(o.prefill), t, prefill_cost(c, fp8, o.prefill),
                    int(o.prefill)});
  }

  std::printf("\n%-24s %9s %9s %8s %9s %7s %9s %7s %8s %10s\n", "step", "median_ms", "min_ms", "GB",
              "GB/s", "%copy", "TFLOP/s", "%bf16", "experts", "tok/s");
  for (const Row& r : rows) {
    const double s = r.t.median_ms * 1e-3;
    const double gbs = r.cost.bytes() / s / 1e9, tf = r.cost.flops / s / 1e12;
    std::printf("%-24s %9.3f %9.3f %8.2f %9.0f %6.1f%% %9.1f %6.1f%% %8.1f %10.0f\n",
                r.what.c_str(), r.t.median_ms, r.t.min_ms, r.cost.bytes() / 1e9, gbs,
                100.0 * gbs / copy_gbs, tf, 100.0 * tf / bf16_tflops, r.cost.experts_touched,
                double(r.tokens) / s);
  }
  std::printf(
      "(median of %d decode / %d prefill steps after warm-up, CUDA events around "
      "DeepseekModel::forward incl. the metadata copy and the logits read-back; GB = weights "
      "+ cache bytes the step must read; experts = expected distinct experts per MoE layer)\n",
      o.iters, o.prefill_iters);
  if (o.cuda_graph)
    std::printf(
        "(graph rows: the same decode step as the replay of a CUDA graph captured for exactly B "
        "sequences (engine/cuda_graph_runner.h), CUDA events around the runner's metadata copy + "
        "replay and the logits read-back)\n");
  if (o.spec_tokens > 0)
    std::printf(
        "(verify rows: each sequence's token + %d drafts through the decode path, logits of every "
        "row; GB and tok/s as its decode row: the bytes a decode reads, B sequences. With mean "
        "accepted length L (tokens per verify), MTP decoding gives L tokens per verify step + %d "
        "MTP layer steps; vgraph rows, with --cuda-graph: the same verify step as a graph "
        "replay; mtp rows (an MTP layer present): its catch-up over 1 + K tokens a sequence and "
        "one draft step of 1, eager, no byte or FLOP model (GB 0); --accepted-length L prints "
        "the speedup L * decode / (verify + catch-up + (K - 1) * draft))\n",
        o.spec_tokens, o.spec_tokens);
  if (o.engine_loop) run_engine_loop(model, engine_loop_options(o));
}

#endif

}  // namespace osprey::bench
