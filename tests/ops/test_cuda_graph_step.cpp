// Decode steps as CUDA graph replays (engine/cuda_graph_runner.h) against the eager step, on the
// bundled model (models/osprey-arith) and on random small DeepSeek-V3.2-like models that take the
// sm90 kernels (latent 512 + 64, indexer 64 × 128, FP8 linears, 8-group routing):
//   - replay logits == the padded eager warm-up's, bit for bit; real rows close to the unpadded
//     eager step's; padding rows write no cache entry; batch sizes crossing bucket edges (1 to 16),
//     no memset and no host node in any bucket's graph;
//   - the captured step holds no memset and no host node, and a kernel budget per layer kind
//     (dense, MoE, the DSA indexer's share), measured by differencing models of other depths;
//   - the shrink-tail rule on the runner's device metadata;
//   - the engine with --cuda-graph gives the eager engine's greedy tokens, sync and async;
//   - sampling inside the graph (GraphSampling): the ids of the host path (the logits-only graph,
//     then the Sampler) token for token, greedy and seeded random with penalties, min_tokens and
//     logprobs, over several buckets with padding rows; the sampling graph is the logits graph and
//     one sample kernel, no memset or host node; per step only the ids (and asked-for logprob
//     rows) come back; its sampling rows keep the shrink-tail rule on the device; the engine's
//     tokens with in-graph sampling equal its tokens with host sampling (sync and async), and a
//     step the in-graph sampler cannot take falls back, counted by reason;
//   - speculative verify steps (B sequences of 1 + K tokens, every token sampled; key (bucket,
//     1 + K)): replay logits and hidden states == the padded eager warm-up's, bit for bit; real
//     rows close to the unpadded eager step's; padding writes no cache entry; no memset, no host
//     node, and the decode step's kernel budget per layer at the same token count (one kernel more
//     with the hidden states out); the engine with --speculative-config (K = 1, 2, 3) and graphs
//     gives the eager engine's greedy tokens, its verify steps replayed.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/device_buffer.h"
#include "cuda_graph_util.h"
#include "cuda_test_util.h"
#include "engine/cuda_graph_runner.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative_config.h"
#include "model/greedy.h"
#include "model/make_model.h"
#include "model/model_writer.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "ops/gemm.h"
#include "ops/pdl.h"
#include "ops/stream_fork.h"

namespace osprey {
namespace {
using namespace testing;

std::string bundled_model() {
  const char* e = std::getenv("OSPREY_BUNDLED_MODEL");
  return e && *e ? e : OSPREY_BUNDLED_MODEL;
}

// DeepSeek-V3.2's attention and indexer shapes (the sm90 kernels' class) at a small width.
ModelConfig dsv32_small(int layers, int dense_layers, bool indexer) {
  ModelConfig c = preset_config("dsv32");
  c.num_hidden_layers = layers;
  c.first_k_dense_replace = dense_layers;
  c.hidden_size = 2048;
  c.intermediate_size = 4096;
  c.vocab_size = 8192;
  c.num_attention_heads = c.num_key_value_heads = 16;
  c.q_lora_rank = 512;
  c.n_routed_experts = 64;  // 8 groups of 8, top-4 groups, top-8 experts (as V3.2's routing)
  c.index_topk = 64;        // below the test contexts: the selection is sparse
  c.max_position_embeddings = 4096;
  if (!indexer) {
    c.has_indexer = false;
    c.model_type = ModelType::DeepseekV3;
    c.model_type_name = "deepseek_v3";
  }
  return c;
}
std::unique_ptr<DeepseekModel> small_model(int layers, int dense, bool indexer) {
  const ModelConfig c = dsv32_small(layers, dense, indexer);
  return std::make_unique<DeepseekModel>(c, make_dummy_weights_cuda(c, 7, /*fp8=*/true));
}

constexpr int kBlocksPerSeq = 4;  // 256 positions a sequence: the contexts below fit

// Sequences prefilled eagerly, one at a time, and the decode step each takes next; each prompt's
// logits and the latent slots the prefills and decodes write.
struct Batch {
  std::vector<SeqStep> decode;
  std::vector<Buffer> prefill_logits;  // [1, V] a sequence
  std::vector<int64_t> slots;
};
Batch prefill(const DeepseekModel& m, PagedKVCache& cache, int B, std::mt19937& g) {
  const int V = m.config().vocab_size;
  std::uniform_int_distribution<int> tok(2, V - 1);
  Batch b;
  for (int s = 0; s < B; ++s) {
    const int len = 17 + (37 * s) % 150;  // 17 .. 166: some past the index top-k
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (auto& t : prompt) t = tok(g);
    std::vector<int32_t> blocks(kBlocksPerSeq);
    for (int i = 0; i < kBlocksPerSeq; ++i) blocks[size_t(i)] = s * kBlocksPerSeq + i;
    OwnedBatch ob({SeqStep{prompt, 0, blocks, false}}, kBlockSize);
    Buffer logits(DType::F32, {1, V});
    m.forward(ob.batch(), cache, logits);
    b.prefill_logits.push_back(std::move(logits));
    for (int pos = 0; pos <= len; ++pos)  // the prompt's rows and the decode token's
      b.slots.push_back(int64_t(blocks[size_t(pos / kBlockSize)]) * kBlockSize + pos % kBlockSize);
    b.decode.push_back(SeqStep{{tok(g)}, len, blocks, false});
  }
  return b;
}

struct CacheSnapshot {
  std::vector<Buffer> latent, index_keys;
};
CacheSnapshot snapshot(const PagedKVCache& c, bool indexer) {
  cuda::synchronize();
  CacheSnapshot s;
  for (int l = 0; l < c.n_layers(); ++l) {
    s.latent.push_back(cuda::to_host(c.latent(l)));
    if (indexer) s.index_keys.push_back(cuda::to_host(c.index_keys(l)));
  }
  return s;
}
bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.view().nbytes() == b.view().nbytes() &&
         std::memcmp(a.view().data, b.view().data, a.view().nbytes()) == 0;
}
// Latent rows (slots) of a cache layer [n_blocks, block, W] that differ between a and b.
std::vector<int64_t> changed_slots(const Buffer& a, const Buffer& b) {
  const int64_t slots = a.view().size(0) * a.view().size(1);
  const size_t row = a.view().nbytes() / size_t(slots);
  std::vector<int64_t> out;
  for (int64_t s = 0; s < slots; ++s)
    if (std::memcmp(static_cast<const char*>(a.view().data) + size_t(s) * row,
                    static_cast<const char*>(b.view().data) + size_t(s) * row, row) != 0)
      out.push_back(s);
  return out;
}
// Blocks of an indexer key cache [n_blocks, ...] that differ between a and b.
std::vector<int64_t> changed_blocks(const Buffer& a, const Buffer& b) {
  const int64_t n = a.view().size(0);
  const size_t row = a.view().nbytes() / size_t(n);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const char*>(a.view().data) + size_t(i) * row,
                    static_cast<const char*>(b.view().data) + size_t(i) * row, row) != 0)
      out.push_back(i);
  return out;
}
double rel_l2(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    d += double(a[i] - b[i]) * double(a[i] - b[i]);
    r += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d / std::max(r, 1e-30));
}

// Rows [0, rows) of two logits buffers [rows, V]: where the eager row's greedy token leads its
// runner-up by more than 1e-2 · max(1, |top|), the replay picks the same token.
void expect_clear_greedy_kept(const Buffer& eager, const Buffer& replay, int64_t rows, int64_t V,
                              const char* label) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* e = eager.f32() + r * V;
    const float* x = replay.f32() + r * V;
    int a = 0, b = 0;
    for (int64_t v = 1; v < V; ++v) {
      if (e[v] > e[a]) a = int(v);
      if (x[v] > x[b]) b = int(v);
    }
    float second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != a) second = std::max(second, e[v]);
    if (e[a] - second > 1e-2f * std::max(1.0f, std::fabs(e[a]))) {
      EXPECT_EQ(a, b) << label << " " << r << ": greedy token changed";
    }
  }
}

// Replay vs eager for batch sizes crossing the bucket edges (buckets 1, 2, 4, 8, 16).
void replay_matches_eager(const DeepseekModel& m, const char* what) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  std::mt19937 g(11);
  for (int B : {1, 2, 3, 5, 8, 9, 13, 16}) {
    SCOPED_TRACE(strf("%s B=%d", what, B));
    PagedKVCache cache = m.make_cache(int64_t(B) * kBlocksPerSeq);
    const Batch seqs = prefill(m, cache, B, g);
    OwnedBatch ob(seqs.decode, kBlockSize);
    Buffer eager(DType::F32, {B, V});
    m.forward(ob.batch(), cache, eager);  // writes the step's cache entries
    const CacheSnapshot s0 = snapshot(cache, c.has_indexer);

    CudaGraphRunner runner(m, {1, 2, 4, 8, 16});
    const int Bp = cuda_graph_bucket(runner.capture_sizes(), B);
    Storage dl(Device::CUDA, DType::F32, {16, V});
    ASSERT_TRUE(runner.forward(ob.batch(), cache, dl.view()));  // warm-up + capture
    ASSERT_EQ(runner.capture_failures(), 0);
    EXPECT_EQ(runner.captures(), 1);
    const Buffer warm = cuda::to_host(dl.view().rows(0, Bp));
    const CacheSnapshot s1 = snapshot(cache, c.has_indexer);
    cuda::fill_bytes(dl.view(), 0xff);
    ASSERT_TRUE(runner.forward(ob.batch(), cache, dl.view()));  // replay
    EXPECT_EQ(runner.replays(), 1);
    // No memset and no host node in any bucket's graph (the budget test below counts at 4 tokens;
    // the bench's dsv32 graphs at B=1 and B=16 once held a memset node that B=64's did not).
    const cuda::CudaGraph* graph = runner.graph(Bp);
    ASSERT_NE(graph, nullptr);
    const cuda::GraphNodeCounts nodes = graph->nodes();
    std::string around;
    for (const std::string& s : nodes.memset_neighbours) around += "\n  memset " + s;
    EXPECT_EQ(nodes.memsets, 0) << around;
    EXPECT_EQ(nodes.hosts, 0);
    const Buffer replay = cuda::to_host(dl.view().rows(0, Bp));
    const CacheSnapshot s2 = snapshot(cache, c.has_indexer);

    // The replay is the padded warm-up, bit for bit: logits and cache.
    EXPECT_TRUE(same_bytes(replay, warm)) << "replay logits differ from the eager warm-up";
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_TRUE(same_bytes(s2.latent[size_t(l)], s1.latent[size_t(l)])) << "layer " << l;
      if (c.has_indexer) {
        EXPECT_TRUE(same_bytes(s2.index_keys[size_t(l)], s1.index_keys[size_t(l)]))
            << "layer " << l;
      }
    }
    // Padding wrote nothing: only the real tokens' slots (blocks) may differ from the unpadded
    // eager step's cache (rounding of GEMMs over more rows).
    std::vector<int64_t> real_slots, real_blocks;
    for (const SeqStep& s : seqs.decode) {
      const int64_t blk = s.blocks[size_t(s.start_pos / kBlockSize)];
      real_slots.push_back(blk * kBlockSize + s.start_pos % kBlockSize);
      real_blocks.push_back(blk);
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      for (int64_t slot : changed_slots(s1.latent[size_t(l)], s0.latent[size_t(l)])) {
        EXPECT_NE(std::find(real_slots.begin(), real_slots.end(), slot), real_slots.end())
            << "layer " << l << ": the padded step wrote latent slot " << slot;
      }
      if (!c.has_indexer) continue;
      for (int64_t blk : changed_blocks(s1.index_keys[size_t(l)], s0.index_keys[size_t(l)])) {
        EXPECT_NE(std::find(real_blocks.begin(), real_blocks.end(), blk), real_blocks.end())
            << "layer " << l << ": the padded step wrote indexer block " << blk;
      }
    }
    // Real rows: the unpadded eager logits up to rounding; the same greedy token where clear.
    const double err = rel_l2(replay.f32(), eager.f32(), int64_t(B) * V);
    std::printf("GRAPH %s B=%d bucket %d: replay vs unpadded eager rel L2 %.2e\n", what, B, Bp,
                err);
    EXPECT_LT(err, 2e-2);
    expect_clear_greedy_kept(eager, replay, B, V, "row");
  }
}

TEST(CudaGraphStep, BundledModelReplayMatchesEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  replay_matches_eager(*m, "osprey-arith");
}

TEST(CudaGraphStep, Dsv32LikeReplayMatchesEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(3, 1, true);  // 1 dense + 2 MoE layers, all with the indexer
  replay_matches_eager(*m, "dsv32-small");
}

// One setting's run for the tests below that show a launch setting changes no byte: prompts of
// B sequences prefilled one by one, then one eager decode step and one graph replay of it (the
// setting applied before any of them, so the graph is captured with it), and the cache rows
// written; and the number of join nodes (two branches meeting) in the replayed graph.
struct SettingRun {
  std::vector<Buffer> prefill_logits;
  Buffer eager, replay;
  CacheSnapshot cache;
  std::vector<int64_t> slots;  // latent slots written (prefill and decode)
  int joins = 0;
};
SettingRun run_setting(const DeepseekModel& m, int B) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  SettingRun r;
  std::mt19937 g(23);  // the same prompts for every setting
  PagedKVCache cache = m.make_cache(int64_t(B) * kBlocksPerSeq);
  Batch seqs = prefill(m, cache, B, g);
  r.prefill_logits = std::move(seqs.prefill_logits);
  r.slots = std::move(seqs.slots);
  OwnedBatch ob(seqs.decode, kBlockSize);
  r.eager = Buffer(DType::F32, {B, V});
  m.forward(ob.batch(), cache, r.eager);
  CudaGraphRunner runner(m, {1, 2, 4, 8, 16});
  Storage dl(Device::CUDA, DType::F32, {16, V});
  EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view()));  // warm-up + capture
  EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view()));  // replay
  EXPECT_EQ(runner.capture_failures(), 0);
  EXPECT_EQ(runner.replays(), 1);
  r.replay = cuda::to_host(dl.view().rows(0, B));
  r.cache = snapshot(cache, c.has_indexer);
  for (int b : {1, 2, 4, 8, 16})
    if (b >= B) {
      if (const cuda::CudaGraph* graph = runner.graph(b)) r.joins = graph->nodes().joins;
      break;
    }
  return r;
}
bool same_rows(const Buffer& a, const Buffer& b, const std::vector<int64_t>& slots) {
  const int64_t n = a.view().size(0) * a.view().size(1);
  const size_t row = a.view().nbytes() / size_t(n);
  for (int64_t s : slots)
    if (std::memcmp(static_cast<const char*>(a.view().data) + size_t(s) * row,
                    static_cast<const char*>(b.view().data) + size_t(s) * row, row) != 0)
      return false;
  return true;
}
// The two runs' bytes equal, and the logits real (finite, not one value a row).
void expect_same_runs(const SettingRun& off, const SettingRun& on, int B, int layers, int64_t V) {
  ASSERT_EQ(off.prefill_logits.size(), on.prefill_logits.size());
  for (size_t s = 0; s < off.prefill_logits.size(); ++s)
    EXPECT_TRUE(same_bytes(off.prefill_logits[s], on.prefill_logits[s])) << "prefill " << s;
  EXPECT_TRUE(same_bytes(off.eager, on.eager)) << "eager decode logits";
  EXPECT_TRUE(same_bytes(off.replay, on.replay)) << "graph replay logits";
  for (int64_t r = 0; r < B; ++r) {
    const float* x = on.replay.f32() + r * V;
    const auto [lo, hi] = std::minmax_element(x, x + V);
    EXPECT_TRUE(std::isfinite(*lo) && std::isfinite(*hi) && *hi > *lo) << "row " << r;
  }
  for (int l = 0; l < layers; ++l) {
    EXPECT_TRUE(same_rows(off.cache.latent[size_t(l)], on.cache.latent[size_t(l)], off.slots))
        << "latent layer " << l;
  }
}

// Programmatic dependent launch (ops/cuda/hopper/pdl.cuh) changes when kernels start, never what
// they compute: with PDL off and on, the same prompts' prefill logits, the eager decode step's
// logits, a graph replay's logits (each setting captured in its own graph) and every cache row the
// steps wrote are the same bytes, at batch sizes with one, several and a full bucket of sequences.
TEST(CudaGraphStep, PdlChangesNoByte) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(3, 1, true);
  const ModelConfig& c = m->config();
  const bool was = ops::cuda::pdl_enabled();
  for (int B : {1, 9, 16}) {
    SCOPED_TRACE(strf("B=%d", B));
    ops::cuda::set_pdl(false);
    const SettingRun off = run_setting(*m, B);
    ops::cuda::set_pdl(true);
    const SettingRun on = run_setting(*m, B);
    expect_same_runs(off, on, B, c.num_hidden_layers, c.vocab_size);
    std::printf(
        "PDL B=%d: prefill, eager and replay logits and %zu latent rows a layer equal, PDL "
        "off vs on\n",
        B, off.slots.size());
  }
  ops::cuda::set_pdl(was);
}

// The attention's two forks (ops/stream_fork.h: the latent write and the indexer's keys beside
// q's chain, q's absorption beside the indexer's scoring) change which kernels may run at once,
// never what they compute: fork off and on give the same bytes (prefill, eager decode, graph
// replay, cache rows), and the graph captured with the fork holds its branches: two joins a layer
// (the indexer's layers) more than the graph without it.
TEST(CudaGraphStep, StreamForkChangesNoByte) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(3, 1, true);
  const ModelConfig& c = m->config();
  ASSERT_TRUE(c.has_indexer);
  const bool was = ops::set_stream_fork(false);
  for (int B : {1, 9, 16}) {
    SCOPED_TRACE(strf("B=%d", B));
    ops::set_stream_fork(false);
    const SettingRun off = run_setting(*m, B);
    ops::set_stream_fork(true);
    const SettingRun on = run_setting(*m, B);
    expect_same_runs(off, on, B, c.num_hidden_layers, c.vocab_size);
    EXPECT_GE(on.joins, off.joins + 2 * c.num_hidden_layers)
        << "joins in the graph: fork on " << on.joins << ", off " << off.joins;
    std::printf(
        "FORK B=%d: prefill, eager and replay logits and %zu latent rows a layer equal, fork off "
        "vs on; graph joins %d vs %d\n",
        B, off.slots.size(), off.joins, on.joins);
  }
  ops::set_stream_fork(was);
}

// The kernel budget of a decode step, per layer kind (dsv32_small: q LoRA, FP8 linears on the
// swap-AB kernel at 4 tokens, BF16 router, FP8 indexer key cache). The H200 run of 6d1981f measured
// dense 45 (with the DSA share), MoE 54, DSA 14 against estimates of 41, 46, 14; the audit below
// removed the redundant quantisations (ops::linears: one per input instead of one per FP8 linear)
// and counts each kernel left, name → why a decode step needs it. Counted from the launch paths
// after those changes and measured on the H200 (2026-12-01: dense 41, MoE 50, DSA 12 with the
// indexer on), then 4 fewer a layer with ops::mla_kv_write (37, 46, 12: measured on the H200),
// then the dataflow fusions of issue 13 (30, 38, 11: counted from the code, then measured on the
// H200, 2026-12-03):
// the norms write their consumers' FP8 and BF16 inputs (ops::rms_norm_multi), silu_mul writes the
// FP8 down projection's (ops::silu_mul_multi), absorb_q reads F32 q without a conversion kernel,
// o_lat is written in BF16 — 6 kernels fewer in attention + dense MLP, 7 in attention + MoE FFN,
// 1 in the DSA share (each marked "issue 13" below); then the FP8 linears of one input in one
// swap-AB launch (ops::linears → launch_fp8_swapab_linears, 2026-12-06: 13, 4, 12, 9 — q_a + kv_a
// (+ wk), q_b (+ wq_b), gate + up, marked "grouped" below); then q's rope in the absorption's split
// kernel and the indexer's key and query chains fused (ops::mla_absorb_q_rope,
// ops::indexer_k_write, ops::indexer_q_prep) and the shared expert's add in the routed combine
// (2026-12-06: 12 attention, 11 MoE FFN, 5 DSA, marked "fused" below). The test prints the measured
// counts. A change that adds (or removes) a kernel must change these on purpose. Layer 0 has one
// more (mla_plan: the split-KV plan, built once a step, reused by every layer); the differencing
// below measures layers past 0. (lm_head's input conversion, once a step, went too: the final norm
// writes its BF16 input; no per-layer count sees it.) These budgets are read from the logits-only
// graph; the engine's decode graph (sampling inside it) adds exactly one kernel per step, not per
// layer: kSampleKernels in SamplingGraphAddsOneSampleKernel below.
//   attention without the indexer (12; 13 before q's rope went into split_q, 14 before the grouped
//   launches, 18 before issue 13, 22 before ops::mla_kv_write):
//     fp8_swapab               q_a_proj and kv_a_proj in one launch (grouped, -1), reading x's
//                              e4m3 copy that the norm before wrote (issue 13: quantize_rows(x)
//                              gone, -1)
//     rms_norm                 q_a_norm → q_lat, writing q_lat's e4m3 copy for q_b_proj (and the
//                              indexer's wq_b) in the same kernel (issue 13: quantize_rows(q_lat)
//                              gone, -1)
//     fp8_swapab               q_b_proj
//     kv_write                 kv_a's output split, kv_a_norm on the latent, k_pe's rope and the
//                              paged cache write (BF16) in one kernel (ops::mla_kv_write; before
//                              it: copy_columns × 2, rms_norm, rope, cache_write: 4 kernels more)
//     split_q + GEMM           q_nope → BF16 and q's rope part, rotated, into the absorbed query
//                              [T, H, 576] in one kernel, · W_UK per head (cuBLASLt BF16) (issue
//                              13: convert and copy_rope were two kernels, -1; fused: q's rope
//                              kernel gone, -1)
//     mla_decode               sparse/dense absorbed attention, split-KV partials
//     mla_combine              the split-KV partials merged, o_lat written in BF16
//     GEMM                     o_lat · W_UV per head (issue 13: o_lat's convert to BF16 gone: the
//                              attention writes BF16, -1)
//     quantize_rows + fp8      o_proj (its input quantised: one reader, a cuBLASLt output)
//     rms_norm (add)           residual += attn; post_attention_layernorm (with the FFN's extras)
//   the DSA indexer's share (5; 9 before the fused key and query, 11 before the grouped launches,
//     12 before issue 13): wk and wq_b run in the launches of q_a/kv_a and q_b (grouped, -2; their
//     inputs' quantisations are the norms', shared), GEMM (weights_proj, BF16, reading x's BF16
//     copy from the norm before: issue 13, its convert gone, -1), index_k_write (k_norm, the key's
//     rope and the FP8 key cache write: fused, -2), indexer_q_prep (q's rope, × IH^-1/2 on the
//     weights, q → e4m3 with its scales folded into the weights: fused, -2), indexer_logits,
//     indexer_topk
//   dense MLP (4; 5 before the grouped launches, 7 before issue 13): fp8_swapab gate and up in one
//     launch (grouped, -1; x's e4m3 copy from the post-attention norm: issue 13,
//     quantize_rows(x) gone, -1), silu_mul writing h and h's e4m3 copy (issue 13:
//     quantize_rows(h) gone, -1), fp8_swapab down, rms_norm (add: residual += mlp; next
//     input_layernorm, with the next attention's extras)
//   MoE FFN (11; 12 before the combine added the shared expert's output, 13 before the grouped
//   launches, 16 before issue 13):
//     GEMM                     router: the gate GEMM (BF16) on x's BF16 copy from the
//                              post-attention norm, writing BF16 logits (cuBLASLt takes one kernel
//                              for [4, 2048] · [2048, 64]: measured on the H200, 2026-12-01)
//                              (issue 13: the convert of x gone, -1)
//     moe_route                biased grouped top-k on the BF16 logits (no cast kernel)
//     quantize_rows(x)         x → e4m3 for the routed experts (moe_experts' own)
//     moe_permute              tokens grouped by expert, the tile schedule
//     fp8_swapab × 2           grouped gate_up (silu·mul and h's quantisation fused), grouped down
//     moe_combine              the top-k outputs weighted back per token, + the shared expert's
//                              output (its add kernel gone: fused, -1)
//     fp8_swapab               the shared expert's gate and up in one launch (grouped, -1) on x's
//                              e4m3 copy from the norm (issue 13: their quantize_rows(x) gone, -1)
//     silu_mul + 1             the shared expert's silu·mul (writing h's e4m3 copy: issue 13,
//                              quantize_rows(h) gone, -1) and down
//     rms_norm (add)           residual += ffn; next input_layernorm
constexpr int kAttentionKernels = 12;
constexpr int kDenseMlpKernels = 4;
constexpr int kMoeFfnKernels = 11;
constexpr int kDenseLayerKernels = kAttentionKernels + kDenseMlpKernels;  // 16
constexpr int kMoeLayerKernels = kAttentionKernels + kMoeFfnKernels;      // 23
constexpr int kDsaLayerKernels = 5;
constexpr int kBudgetBatch = 4;

struct Captured {
  GraphNodes nodes;
  int layers = 0, dense = 0;
};
// The decode steps of `seqs` as verify steps: each sequence's token and k drafts (random ids) at
// the next positions, every token sampled.
std::vector<SeqStep> verify_steps(const std::vector<SeqStep>& decode, int k, int V,
                                  std::mt19937& g) {
  std::uniform_int_distribution<int> tok(2, V - 1);
  std::vector<SeqStep> v = decode;
  for (SeqStep& s : v) {
    for (int i = 0; i < k; ++i) s.tokens.push_back(tok(g));
    s.all_logits = true;
  }
  return v;
}
ForwardBatch as_verify(const OwnedBatch& ob) {
  ForwardBatch b = ob.batch();
  b.spec_decode = true;  // the absorbed (decode) path with s_q = 1 + k, as the engine runs it
  return b;
}

// The captured step of n_seqs sequences (the budget's kBudgetBatch by default), q tokens each
// (q = 1: a decode, else a verify of q − 1 drafts), with the hidden states out when asked.
Captured capture_step(int layers, int dense, bool indexer, int q = 1, bool hidden = false,
                      int n_seqs = kBudgetBatch) {
  const auto m = small_model(layers, dense, indexer);
  std::mt19937 g(5);
  PagedKVCache cache = m->make_cache(int64_t(n_seqs) * kBlocksPerSeq);
  const Batch seqs = prefill(*m, cache, n_seqs, g);
  const int64_t V = m->config().vocab_size, D = m->config().hidden_size;
  OwnedBatch ob(q == 1 ? seqs.decode : verify_steps(seqs.decode, q - 1, int(V), g), kBlockSize);
  const ForwardBatch b = q == 1 ? ob.batch() : as_verify(ob);
  CudaGraphRunner runner(*m, {n_seqs});
  Storage dl(Device::CUDA, DType::F32, {int64_t(n_seqs) * q, V});
  Storage dh(Device::CUDA, DType::F32, {int64_t(n_seqs) * q, D});
  const Tensor h = hidden ? dh.view() : Tensor{};
  EXPECT_TRUE(runner.forward(b, cache, dl.view(), nullptr, h));
  EXPECT_TRUE(runner.forward(b, cache, dl.view(), nullptr, h));
  EXPECT_EQ(runner.capture_failures(), 0);
  EXPECT_EQ(runner.replays(), 1);
  const cuda::CudaGraph* graph = runner.graph(n_seqs, false, q);
  EXPECT_NE(graph, nullptr);
  Captured c;
  c.layers = layers;
  c.dense = dense;
  if (graph) c.nodes = graph_nodes(static_cast<cudaGraph_t>(graph->raw_graph()));
  const cuda::GraphNodeCounts n = graph ? graph->nodes() : cuda::GraphNodeCounts{};
  EXPECT_EQ(n.kernels, c.nodes.kernels);
  std::printf("GRAPH step %d layers (%d dense, indexer %s), %d sequences of %d tokens%s: %s\n",
              layers, dense, indexer ? "on" : "off", n_seqs, q, hidden ? ", hidden states out" : "",
              c.nodes.summary().c_str());
  return c;
}

TEST(CudaGraphStep, NoMemsetNoHostNodeAndKernelBudgetPerLayer) {
  OSPREY_REQUIRE_GPU();
  const Captured a = capture_step(2, 1, true);   // 1 dense + 1 MoE
  const Captured b = capture_step(3, 1, true);   // 1 dense + 2 MoE
  const Captured c = capture_step(3, 2, true);   // 2 dense + 1 MoE
  const Captured d = capture_step(2, 1, false);  // a without the indexer
  ASSERT_FALSE(HasFatalFailure());
  for (const Captured* x : {&a, &b, &c, &d}) {
    EXPECT_EQ(x->nodes.memsets, 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.hosts, 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.others, 0) << x->nodes.summary();
  }
  // Issue 13 by name (where the driver names kernels): no cast kernel and no block-scaled
  // quantisation left in a decode step, and quantize_rows only where no producer writes the FP8
  // input: o_proj's (a cuBLASLt GEMM's output) in every layer, the routed experts' in each MoE one.
  for (const Captured* x : {&a, &b, &c, &d}) {
    if (!x->nodes.names_known()) {
      std::printf("GRAPH note: the driver names no kernel; the name checks are skipped\n");
      break;
    }
    EXPECT_EQ(x->nodes.kernels_named("convert_kernel"), 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.kernels_named("quantize_act_kernel"), 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.kernels_named("copy_rope_kernel"), 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.kernels_named("quantize_rows_kernel"), x->layers + (x->layers - x->dense))
        << x->nodes.summary();
  }
  const int moe = b.nodes.kernels - a.nodes.kernels;
  const int dense = c.nodes.kernels - a.nodes.kernels;
  const int dsa2 = a.nodes.kernels - d.nodes.kernels;  // two layers' indexers
  std::printf(
      "GRAPH budget measured: dense layer %d kernels (budget %d), MoE layer %d (budget %d), DSA "
      "share %d per layer (budget %d); a 2-layer step %d kernels, %d memcpy nodes\n",
      dense, kDenseLayerKernels + kDsaLayerKernels, moe, kMoeLayerKernels + kDsaLayerKernels,
      dsa2 / 2, kDsaLayerKernels, a.nodes.kernels, a.nodes.memcpys);
  EXPECT_EQ(dense, kDenseLayerKernels + kDsaLayerKernels);
  EXPECT_EQ(moe, kMoeLayerKernels + kDsaLayerKernels);
  EXPECT_EQ(dsa2 % 2, 0);
  EXPECT_EQ(dsa2 / 2, kDsaLayerKernels);
}

// The runner's device metadata across steps that shrink and grow inside one bucket.
TEST(CudaGraphStep, ShrinkTailOnTheDeviceBuffers) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  const int64_t V = m->config().vocab_size;
  std::mt19937 g(3);
  PagedKVCache cache = m->make_cache(7 * kBlocksPerSeq);
  Batch seqs = prefill(*m, cache, 7, g);
  CudaGraphRunner runner(*m, {8});
  Storage dl(Device::CUDA, DType::F32, {8, V});
  struct Rows {
    Buffer tok, pos, lens, qsl, req, li, slot, table;
  };
  auto read = [&] {
    const ForwardBatch* d = runner.device_batch(8);
    EXPECT_NE(d, nullptr);
    return Rows{cuda::to_host(d->token_ids),
                cuda::to_host(d->attn.positions),
                cuda::to_host(d->attn.seq_lens),
                cuda::to_host(d->attn.query_start_loc),
                cuda::to_host(d->attn.req_id_per_token),
                cuda::to_host(d->logits_indices),
                cuda::to_host(d->attn.slot_mapping),
                cuda::to_host(d->attn.block_table)};
  };
  auto step = [&](int B) {
    std::vector<SeqStep> d(seqs.decode.begin(), seqs.decode.begin() + B);
    OwnedBatch ob(d, kBlockSize);
    EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view()));
    for (int s = 0; s < B; ++s) ++seqs.decode[size_t(s)].start_pos;  // the next position
    return d;
  };
  auto expect_rows = [&](const Rows& r, const std::vector<SeqStep>& real, int64_t width) {
    const int B = int(real.size());
    for (int i = 0; i <= 8; ++i) EXPECT_EQ(r.qsl.ptr<int32_t>()[i], i) << "qsl " << i;
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(r.req.ptr<int32_t>()[i], i);
      EXPECT_EQ(r.li.ptr<int32_t>()[i], i);
      const int32_t* row = r.table.ptr<int32_t>() + i * width;
      if (i < B) {
        const SeqStep& s = real[size_t(i)];
        EXPECT_EQ(r.tok.ptr<int32_t>()[i], s.tokens[0]) << "row " << i;
        EXPECT_EQ(r.pos.ptr<int32_t>()[i], s.start_pos) << "row " << i;
        EXPECT_EQ(r.lens.ptr<int32_t>()[i], s.start_pos + 1) << "row " << i;
        EXPECT_EQ(r.slot.ptr<int64_t>()[i],
                  int64_t(s.blocks[size_t(s.start_pos / kBlockSize)]) * kBlockSize +
                      s.start_pos % kBlockSize)
            << "row " << i;
        for (int b = 0; b <= s.start_pos / kBlockSize; ++b)
          EXPECT_EQ(row[b], s.blocks[size_t(b)]) << "row " << i << " block " << b;
      } else {  // padding: reads row 0's first block, writes nothing
        EXPECT_EQ(r.tok.ptr<int32_t>()[i], 0) << "padding row " << i;
        EXPECT_EQ(r.pos.ptr<int32_t>()[i], 0) << "padding row " << i;
        EXPECT_EQ(r.lens.ptr<int32_t>()[i], 1) << "padding row " << i;
        EXPECT_EQ(r.slot.ptr<int64_t>()[i], -1) << "padding row " << i;
        EXPECT_EQ(row[0], real[0].blocks[0]) << "padding row " << i;
      }
    }
  };
  const int64_t width = kBlocksPerSeq;  // OwnedBatch's table: the widest sequence's blocks
  auto real = step(7);
  EXPECT_EQ(runner.last_padding_rewrites, 1);  // first staging: row 7 is laid out as padding
  const int64_t copy_bytes = runner.last_copy_bytes;
  expect_rows(read(), real, width);
  real = step(5);  // rows 5, 6 shrank off: only they are reset
  EXPECT_EQ(runner.last_padding_rewrites, 2);
  EXPECT_EQ(runner.last_copy_bytes, copy_bytes);  // one copy of the bucket's region, always
  expect_rows(read(), real, width);
  real = step(5);  // nothing shrank: no padding row rewritten
  EXPECT_EQ(runner.last_padding_rewrites, 0);
  expect_rows(read(), real, width);
  real = step(6);  // row 5 real again, rows 6, 7 stay padding untouched
  EXPECT_EQ(runner.last_padding_rewrites, 0);
  expect_rows(read(), real, width);
  EXPECT_EQ(runner.captures(), 1);
  EXPECT_EQ(runner.replays(), 3);
}

// n random prompts of 5 + 7·i % 40 tokens for the engine tests.
std::vector<std::vector<int32_t>> engine_prompts(const DeepseekModel& m, int n, std::mt19937& g) {
  std::uniform_int_distribution<int> tok(2, m.config().vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(size_t(5 + 7 * i % 40));
    for (auto& t : p) t = tok(g);
    prompts.push_back(p);
  }
  return prompts;
}
// The engine tests' engine (16 sequences, 256 tokens, 64 blocks) run over the prompts: each
// request's tokens and the engine's stats.
std::vector<std::vector<int32_t>> run_engine(const DeepseekModel& m,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const std::vector<SamplingParams>& params, bool graphs,
                                             bool in_graph, bool async, EngineStats* st) {
  EngineConfig ec;
  ec.max_num_seqs = 16;
  ec.max_model_len = 256;
  ec.num_blocks = 16 * 4;
  ec.cuda_graph = graphs;
  ec.cuda_graph_sampling = in_graph;
  ec.async_scheduling = async;
  Engine e(m, ec);
  std::vector<Engine::Result> r = e.generate(prompts, params);
  *st = e.stats();
  std::vector<std::vector<int32_t>> t;
  for (auto& x : r) t.push_back(x.tokens);
  return t;
}

// The engine with --cuda-graph: the eager engine's greedy tokens, synchronous and async; the
// batch shrinks across bucket edges (16 → 8 → 4 → 2 → 1) as requests finish.
TEST(CudaGraphStep, EngineGreedyTokensMatchEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  std::mt19937 g(9);
  const std::vector<std::vector<int32_t>> prompts = engine_prompts(*m, 13, g);
  std::vector<SamplingParams> params;
  for (int i = 0; i < 13; ++i) {
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 3 + 2 * i;
    sp.ignore_eos = true;
    params.push_back(sp);
  }
  // Host sampling after each replay (in-graph sampling has its own test below).
  EngineStats s_eager, s_sync, s_async;
  const auto eager = run_engine(*m, prompts, params, false, false, false, &s_eager);
  const auto sync = run_engine(*m, prompts, params, true, false, false, &s_sync);
  const auto async = run_engine(*m, prompts, params, true, false, true, &s_async);
  EXPECT_EQ(sync, eager);
  EXPECT_EQ(async, eager);
  EXPECT_EQ(s_eager.cuda_graph_replays, 0);
  EXPECT_EQ(s_sync.cuda_graph_capture_failures, 0);
  EXPECT_EQ(s_async.cuda_graph_capture_failures, 0);
  EXPECT_GT(s_sync.cuda_graph_replays, 10);
  EXPECT_GT(s_async.cuda_graph_replays, 10);
  std::printf(
      "GRAPH engine: %lld replays / %lld captures (sync), %lld / %lld (async) of %lld steps\n",
      static_cast<long long>(s_sync.cuda_graph_replays),
      static_cast<long long>(s_sync.cuda_graph_captures),
      static_cast<long long>(s_async.cuda_graph_replays),
      static_cast<long long>(s_async.cuda_graph_captures), static_cast<long long>(s_sync.steps));
  // Why the other steps ran eagerly: prefill and mixed steps only (never a decode of ≤ 16).
  for (const EngineStats* s : {&s_sync, &s_async})
    for (const auto& [why, n] : s->cuda_graph_eager_steps) {
      std::printf("GRAPH engine (%s): %lld eager steps: %s\n", s == &s_sync ? "sync" : "async",
                  static_cast<long long>(n), why.c_str());
      EXPECT_EQ(why.rfind("not a pure decode", 0), 0u) << why;
    }
}

// ---------------------------------------------------------------------------------------------
// Sampling inside the graph.

// One request of each kind the in-graph sampler takes (by r % 6), seeded.
struct SampleRequest {
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  uint64_t seed = 0, key = 0;
};
std::vector<SampleRequest> sample_requests(int B, int V, std::mt19937& g) {
  std::uniform_int_distribution<int> tok(2, V - 1);
  std::vector<SampleRequest> reqs(static_cast<size_t>(B));
  for (int r = 0; r < B; ++r) {
    SampleRequest& q = reqs[size_t(r)];
    q.seed = 1000 + uint64_t(r);
    q.key = uint64_t(r) + 1;
    for (int i = 0; i < 10; ++i) q.prompt.push_back(tok(g));
    SamplingParams& p = q.params;
    switch (r % 6) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.8f;
        p.top_k = 40;
        p.top_p = 0.9f;
        p.logprobs = 3;
        break;
      case 2:
        p.min_p = 0.05f;
        p.repetition_penalty = 1.2f;
        p.frequency_penalty = 0.3f;
        p.presence_penalty = 0.2f;
        break;
      case 3:
        p.temperature = 0.7f;
        p.min_tokens = 3;
        p.stop_token_ids = {5, 6};
        break;
      case 4:
        p.temperature = 0.0f;
        p.presence_penalty = 0.5f;
        p.logprobs = 0;
        break;
      case 5:
        p.temperature = 1.3f;
        p.top_p = 0.8f;
        break;
    }
  }
  return reqs;
}
std::vector<SamplingRow> sampling_rows(const std::vector<SampleRequest>& reqs, int eos) {
  std::vector<SamplingRow> rows;
  for (const SampleRequest& q : reqs)
    rows.push_back({&q.params, &q.prompt, &q.output, q.seed, eos, q.key});
  return rows;
}
GraphSampling graph_sampling(const Sampler& s) {
  GraphSampling gs;
  gs.rows = &s.prepared_rows();
  gs.lists = &s.prepared_lists();
  gs.n_logprob_rows = s.prepared_logprob_rows();
  gs.prompt_mask = s.prompt_mask();
  gs.output_counts = s.output_counts();
  return gs;
}
int64_t id_bytes(int B, int n_lp) {
  return int64_t(B) * 4 + int64_t(n_lp) * (1 + 2 * kMaxTopLogprobs) * 4;
}

// Per bucket, 6 decode steps: the host path (logits-only graph + Sampler) and the in-graph path
// (sampling graph) over the same device logits, each with its own Sampler and penalty state.
void graph_sampling_matches_host(const DeepseekModel& m, const char* what) {
  const int64_t V = m.config().vocab_size;
  const int eos = m.config().eos_token_id;
  std::mt19937 g(21);
  int compared = 0, random_rows = 0;
  for (int B : {1, 3, 5, 8, 13}) {
    SCOPED_TRACE(strf("%s B=%d", what, B));
    PagedKVCache cache = m.make_cache(int64_t(B) * kBlocksPerSeq);
    Batch seqs = prefill(m, cache, B, g);
    std::vector<SampleRequest> reqs = sample_requests(B, int(V), g);
    CudaGraphRunner runner(m, {1, 2, 4, 8, 16});
    const int Bp = cuda_graph_bucket(runner.capture_sizes(), B);
    Storage dl(Device::CUDA, DType::F32, {16, V});
    Sampler host, in_graph;
    host.reserve(Device::CUDA, int(V), 16);
    in_graph.reserve(Device::CUDA, int(V), 16);
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(strf("step %d", step));
      OwnedBatch ob(seqs.decode, kBlockSize);
      const std::vector<SamplingRow> rows = sampling_rows(reqs, eos);
      ASSERT_TRUE(runner.forward(ob.batch(), cache, dl.view()));  // logits only
      EXPECT_EQ(runner.last_download_bytes, 0);
      std::vector<SampleResult> want, got;
      host.sample(dl.view().rows(0, B), rows, &want);
      in_graph.prepare(Device::CUDA, int(V), rows);
      GraphSampling gs = graph_sampling(in_graph);
      cuda::fill_bytes(runner.device_sampled_ids(Bp), 0xff);  // −1: an id not written shows
      ASSERT_TRUE(runner.forward(ob.batch(), cache, dl.view(), &gs));
      ASSERT_TRUE(gs.sampled);
      for (int r = 0; r < B; ++r) ASSERT_GE(gs.tokens[r], 0) << "row " << r;
      in_graph.finish(gs.tokens, gs.logprobs, gs.top_ids, &got);
      // Only the ids (and the logprob rows asked for) came back.
      EXPECT_EQ(runner.last_download_bytes, id_bytes(B, gs.n_logprob_rows));
      ASSERT_EQ(got.size(), size_t(B));  // padding rows are never in the result
      for (int r = 0; r < B; ++r) {
        const SampleResult &a = want[size_t(r)], &b = got[size_t(r)];
        EXPECT_EQ(b.token, a.token) << "row " << r;
        EXPECT_EQ(b.top_logprobs, a.top_logprobs) << "row " << r;
        if (reqs[size_t(r)].params.logprobs >= 0) {
          EXPECT_EQ(b.logprob, a.logprob) << "row " << r;
        }
        ++compared;
        random_rows += reqs[size_t(r)].params.temperature >= kGreedyTemperature;
      }
      // The next decode step: the host path's token at the next position.
      for (int r = 0; r < B; ++r) {
        SeqStep& d = seqs.decode[size_t(r)];
        d.tokens = {want[size_t(r)].token};
        ++d.start_pos;
        reqs[size_t(r)].output.push_back(want[size_t(r)].token);
      }
    }
    EXPECT_EQ(runner.capture_failures(), 0);
    EXPECT_EQ(runner.captures(), 2);  // a logits-only graph and a sampling graph
    EXPECT_EQ(runner.graph_sampled_steps(), 6);
    EXPECT_TRUE(runner.host_sampling_reasons().empty());
    const cuda::CudaGraph* plain = runner.graph(Bp, false);
    const cuda::CudaGraph* sampled = runner.graph(Bp, true);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(sampled, nullptr);
    const cuda::GraphNodeCounts np = plain->nodes(), ns = sampled->nodes();
    EXPECT_EQ(ns.memsets, 0);
    EXPECT_EQ(ns.hosts, 0);
    EXPECT_EQ(ns.memcpys, np.memcpys);
    EXPECT_EQ(ns.kernels, np.kernels + 1);  // + ops::sample's one kernel
  }
  std::printf("GRAPHSAMPLE %s: %d rows identical to the host path (%d random)\n", what, compared,
              random_rows);
}

TEST(CudaGraphStep, BundledModelInGraphSamplingMatchesHostSampling) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  graph_sampling_matches_host(*m, "osprey-arith");
}

TEST(CudaGraphStep, Dsv32LikeInGraphSamplingMatchesHostSampling) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(3, 1, true);
  graph_sampling_matches_host(*m, "dsv32-small");
}

// The sampling graph's budget: the decode step's kernels (the per-layer budget above, unchanged)
// plus exactly one, ops::sample's sample_kernel (one block per row, every step of ops/sample.h in
// it: the sampling that ran after the replay, now the graph's last node); no memset, no host node,
// no copy node (the ids come back by one copy after the replay, outside the graph). The region's
// copy grows by the sampling rows and the used token lists only.
TEST(CudaGraphStep, SamplingGraphAddsOneSampleKernel) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(2, 1, true);
  const int64_t V = m->config().vocab_size;
  std::mt19937 g(5);
  PagedKVCache cache = m->make_cache(kBudgetBatch * kBlocksPerSeq);
  const Batch seqs = prefill(*m, cache, kBudgetBatch, g);
  OwnedBatch ob(seqs.decode, kBlockSize);
  CudaGraphRunner runner(*m, {kBudgetBatch});
  Storage dl(Device::CUDA, DType::F32, {kBudgetBatch, V});
  EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view()));
  EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view()));
  const int64_t plain_copy = runner.last_copy_bytes;
  std::vector<SampleRequest> reqs = sample_requests(kBudgetBatch, int(V), g);
  for (SampleRequest& q : reqs) q.params.logprobs = -1;  // ids only
  Sampler s;
  s.reserve(Device::CUDA, int(V), kBudgetBatch);
  for (int i = 0; i < 2; ++i) {  // capture, then replay
    s.prepare(Device::CUDA, int(V), sampling_rows(reqs, m->config().eos_token_id));
    GraphSampling gs = graph_sampling(s);
    ASSERT_TRUE(runner.forward(ob.batch(), cache, dl.view(), &gs));
    ASSERT_TRUE(gs.sampled);
    std::vector<SampleResult> out;
    s.finish(gs.tokens, gs.logprobs, gs.top_ids, &out);
    for (size_t r = 0; r < reqs.size(); ++r) reqs[r].output.push_back(out[r].token);
    // Back: the 4 ids, 16 bytes. Up: the metadata, the rows (4 · 88 B, one 256 B-aligned piece)
    // and the lists this step used.
    EXPECT_EQ(runner.last_download_bytes, int64_t(kBudgetBatch) * 4);
    EXPECT_EQ(runner.last_copy_bytes, plain_copy + 512 + int64_t(s.prepared_lists().size()) * 4);
  }
  EXPECT_EQ(runner.capture_failures(), 0);
  EXPECT_EQ(runner.replays(), 2);
  const cuda::CudaGraph* plain = runner.graph(kBudgetBatch, false);
  const cuda::CudaGraph* sampled = runner.graph(kBudgetBatch, true);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(sampled, nullptr);
  const GraphNodes a = graph_nodes(static_cast<cudaGraph_t>(plain->raw_graph()));
  const GraphNodes b = graph_nodes(static_cast<cudaGraph_t>(sampled->raw_graph()));
  constexpr int kSampleKernels = 1;
  std::printf("GRAPHSAMPLE budget: logits graph %d kernels, sampling graph %d (budget +%d)\n",
              a.kernels, b.kernels, kSampleKernels);
  EXPECT_EQ(b.kernels, a.kernels + kSampleKernels) << b.summary();
  EXPECT_EQ(b.memsets, 0) << b.summary();
  EXPECT_EQ(b.hosts, 0) << b.summary();
  EXPECT_EQ(b.others, 0) << b.summary();
  EXPECT_EQ(b.memcpys, a.memcpys) << b.summary();
  if (b.names_known()) {
    EXPECT_EQ(b.kernels_named("sample_kernel"), 1) << b.summary();
    EXPECT_EQ(a.kernels_named("sample_kernel"), 0) << a.summary();
  } else {
    std::printf("GRAPHSAMPLE note: the driver names no kernel; the name check is skipped\n");
  }
}

// The sampling rows on the device across in-graph sampling steps that shrink and grow in one
// bucket: real rows are the prepared ones, padding rows the padding row; only rows that shrank
// off are rewritten.
TEST(CudaGraphStep, SamplingRowsShrinkTailOnTheDevice) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  const int64_t V = m->config().vocab_size;
  std::mt19937 g(3);
  PagedKVCache cache = m->make_cache(7 * kBlocksPerSeq);
  Batch seqs = prefill(*m, cache, 7, g);
  std::vector<SampleRequest> reqs = sample_requests(7, int(V), g);
  CudaGraphRunner runner(*m, {8});
  Storage dl(Device::CUDA, DType::F32, {8, V});
  Sampler s;
  s.reserve(Device::CUDA, int(V), 8);
  const SampleRowParams pad = graph_padding_sample_row();
  auto step = [&](int B) {
    std::vector<SeqStep> d(seqs.decode.begin(), seqs.decode.begin() + B);
    OwnedBatch ob(d, kBlockSize);
    const std::vector<SampleRequest> now(reqs.begin(), reqs.begin() + B);
    s.prepare(Device::CUDA, int(V), sampling_rows(now, m->config().eos_token_id));
    GraphSampling gs = graph_sampling(s);
    EXPECT_TRUE(runner.forward(ob.batch(), cache, dl.view(), &gs));
    EXPECT_TRUE(gs.sampled);
    std::vector<SampleResult> out;
    s.finish(gs.tokens, gs.logprobs, gs.top_ids, &out);
    for (int r = 0; r < B; ++r) {
      SeqStep& x = seqs.decode[size_t(r)];
      x.tokens = {out[size_t(r)].token};
      ++x.start_pos;
      reqs[size_t(r)].output.push_back(out[size_t(r)].token);
    }
    // The device rows: [0, B) the prepared rows, [B, 8) the padding row.
    const Buffer dev = cuda::to_host(runner.device_sample_rows(8));
    const auto* rows = static_cast<const SampleRowParams*>(dev.view().data);
    for (int r = 0; r < 8; ++r) {
      const SampleRowParams& want = r < B ? s.prepared_rows()[size_t(r)] : pad;
      EXPECT_EQ(std::memcmp(&rows[r], &want, sizeof want), 0) << "B=" << B << " row " << r;
    }
  };
  step(7);
  EXPECT_EQ(runner.last_sample_row_rewrites, 1);  // first staging: row 7 laid out as padding
  step(5);                                        // rows 5, 6 shrank off
  EXPECT_EQ(runner.last_sample_row_rewrites, 2);
  step(5);
  EXPECT_EQ(runner.last_sample_row_rewrites, 0);
  step(6);  // row 5 real again; 6, 7 stay padding untouched
  EXPECT_EQ(runner.last_sample_row_rewrites, 0);
  EXPECT_EQ(runner.graph_sampled_steps(), 4);
  EXPECT_EQ(runner.capture_failures(), 0);
}

// The engine with --cuda-graph: seeded random sampling (penalties, min_tokens, logprobs) inside
// the graphs gives the tokens of the same engine sampling on the host after each replay (the same
// logits), synchronous and async; every graph step sampled inside its graph.
TEST(CudaGraphStep, EngineInGraphSamplingMatchesHostSampling) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  std::mt19937 g(9);
  const std::vector<SampleRequest> kinds = sample_requests(13, m->config().vocab_size, g);
  const std::vector<std::vector<int32_t>> prompts = engine_prompts(*m, 13, g);
  std::vector<SamplingParams> params;
  for (int i = 0; i < 13; ++i) {
    SamplingParams sp = kinds[size_t(i)].params;
    sp.seed = 500 + i;
    sp.max_tokens = 3 + 2 * i;
    sp.ignore_eos = true;
    params.push_back(sp);
  }
  auto run = [&](bool graphs, bool in_graph, bool async, EngineStats* st) {
    return run_engine(*m, prompts, params, graphs, in_graph, async, st);
  };
  EngineStats s_eager, s_host, s_sync, s_async, s_host_async;
  const auto eager = run(false, false, false, &s_eager);
  const auto host = run(true, false, false, &s_host);
  const auto sync = run(true, true, false, &s_sync);
  const auto async = run(true, true, true, &s_async);
  const auto host_async = run(true, false, true, &s_host_async);
  EXPECT_EQ(sync, host);
  EXPECT_EQ(async, host);
  EXPECT_EQ(host_async, host);
  for (const EngineStats* s : {&s_sync, &s_async}) {
    EXPECT_EQ(s->cuda_graph_capture_failures, 0);
    EXPECT_GT(s->cuda_graph_replays, 10);
    // Every graph step (replayed or captured) sampled inside its graph; none fell back.
    EXPECT_EQ(s->cuda_graph_sampled_steps, s->cuda_graph_replays + s->cuda_graph_captures);
    EXPECT_TRUE(s->cuda_graph_host_sampling_steps.empty());
  }
  EXPECT_EQ(s_host.cuda_graph_sampled_steps, 0);
  // Against the engine without graphs: greedy requests are the same; a random one may differ
  // where the padded step's GEMMs round a logit differently near a draw's bin edge (printed).
  int differing = 0;
  for (size_t i = 0; i < eager.size(); ++i) {
    if (params[i].temperature < kGreedyTemperature && params[i].presence_penalty == 0.0f) {
      EXPECT_EQ(sync[i], eager[i]) << "greedy request " << i;
    }
    differing += sync[i] != eager[i];
  }
  std::printf(
      "GRAPHSAMPLE engine: %lld in-graph sampled steps (sync), %lld (async); %d of %zu requests "
      "differ from the engine without graphs\n",
      static_cast<long long>(s_sync.cuda_graph_sampled_steps),
      static_cast<long long>(s_async.cuda_graph_sampled_steps), differing, eager.size());
}

// A step whose token lists exceed the bucket's capacity (a request with 300 stop ids under
// min_tokens) is sampled on the host path after the replay, counted under its reason; its tokens
// are those of host sampling; once min_tokens is reached its steps sample inside the graph again.
TEST(CudaGraphStep, EngineFallsBackToHostSamplingWhenTheListsDoNotFit) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  std::vector<std::vector<int32_t>> prompts = {{3, 4, 5, 6, 7, 8}};
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.seed = 42;
  sp.max_tokens = 12;
  sp.min_tokens = 8;
  sp.ignore_eos = true;
  for (int i = 0; i < 300; ++i) sp.stop_token_ids.push_back(100 + i % 50);
  auto run = [&](bool in_graph, bool async, EngineStats* st) {
    EngineConfig ec;
    ec.max_num_seqs = 4;
    ec.max_model_len = 128;
    ec.num_blocks = 8;
    ec.cuda_graph = true;
    ec.cuda_graph_sampling = in_graph;
    ec.async_scheduling = async;
    Engine e(*m, ec);
    const auto r = e.generate(prompts, {sp});
    *st = e.stats();
    return r[0].tokens;
  };
  EngineStats s_host, s_sync, s_async;
  const auto host = run(false, false, &s_host);
  const auto sync = run(true, false, &s_sync);
  const auto async = run(true, true, &s_async);
  EXPECT_EQ(host.size(), 12u);
  EXPECT_EQ(sync, host);
  EXPECT_EQ(async, host);
  for (const EngineStats* s : {&s_sync, &s_async}) {
    // Output tokens 1..7 (sampled while the output is shorter than min_tokens = 8) list the 300
    // stop ids: host path; tokens 8.. sample inside the graph (token 0 is the prefill's, eager).
    ASSERT_EQ(s->cuda_graph_host_sampling_steps.size(), 1u);
    const auto& [why, n] = *s->cuda_graph_host_sampling_steps.begin();
    EXPECT_NE(why.find("capacity"), std::string::npos) << why;
    EXPECT_EQ(n, 7) << why;
    EXPECT_GE(s->cuda_graph_sampled_steps, 4);
    std::printf("GRAPHSAMPLE fallback (%s): %lld host-sampled graph steps (%s), %lld in-graph\n",
                s == &s_sync ? "sync" : "async", static_cast<long long>(n), why.c_str(),
                static_cast<long long>(s->cuda_graph_sampled_steps));
  }
}

// ---------------------------------------------------------------------------------------------
// Speculative verify steps.

// Verify steps (1 + K tokens a sequence, K = 1..3, every token sampled) replayed against the eager
// step over the bucket edges: the padded warm-up bit for bit (logits, hidden states and cache),
// real rows close to the unpadded eager step, padding writes no cache entry, no memset and no host
// node in any key's graph.
void verify_replay_matches_eager(const DeepseekModel& m, const char* what) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size, D = c.hidden_size;
  std::mt19937 g(17);
  for (int K = 1; K <= kMaxSpeculativeTokens; ++K) {
    for (int B : {1, 3, 5, 9}) {
      SCOPED_TRACE(strf("%s K=%d B=%d", what, K, B));
      const int q = 1 + K;
      PagedKVCache cache = m.make_cache(int64_t(B) * kBlocksPerSeq);
      const Batch seqs = prefill(m, cache, B, g);
      OwnedBatch ob(verify_steps(seqs.decode, K, int(V), g), kBlockSize);
      const ForwardBatch vb = as_verify(ob);
      ASSERT_EQ(cuda_graph_ineligible(vb), "");
      const int64_t n = int64_t(B) * q;  // real tokens
      Buffer eager(DType::F32, {n, V});
      Storage eager_h(Device::CUDA, DType::F32, {n, D});
      ForwardOptions fo;
      fo.hidden_out = eager_h.view();
      m.forward(vb, cache, eager, fo);  // writes the step's cache entries
      const Buffer eager_hidden = cuda::to_host(eager_h.view());
      const CacheSnapshot s0 = snapshot(cache, c.has_indexer);

      CudaGraphRunner runner(m, {1, 2, 4, 8, 16});
      const int Bp = cuda_graph_bucket(runner.capture_sizes(), B);
      const int64_t rows = int64_t(Bp) * q;  // padded tokens
      EXPECT_EQ(runner.graph_rows(vb), rows);
      Storage dl(Device::CUDA, DType::F32, {16 * q, V});
      Storage dh(Device::CUDA, DType::F32, {16 * q, D});
      // Padding across a linear's kernel threshold (K = 2, B = 9: 27 tokens padded to 48 crosses
      // the swap-AB limit of 32; measured on the H200 as a 0.11 logits difference with a changed
      // greedy token, every other case here exactly 0): the runner declines, the step is eager.
      if (const int64_t t =
              cuda_graph_crossed_threshold(n, rows, ops::cuda::token_path_thresholds())) {
        std::printf("VGRAPH %s K=%d B=%d: %lld tokens padded to %lld cross %lld: eager\n", what, K,
                    B, static_cast<long long>(n), static_cast<long long>(rows),
                    static_cast<long long>(t));
        EXPECT_FALSE(runner.forward(vb, cache, dl.view(), nullptr, dh.view()));
        EXPECT_EQ(runner.captures(), 0);
        const auto reasons = runner.eager_reasons();
        EXPECT_EQ(reasons.size(), 1u);
        EXPECT_NE(reasons.begin()->first.find("threshold"), std::string::npos);
        continue;
      }
      ASSERT_TRUE(runner.forward(vb, cache, dl.view(), nullptr, dh.view()));  // warm-up + capture
      ASSERT_EQ(runner.capture_failures(), 0);
      EXPECT_EQ(runner.captures(), 1);
      const Buffer warm = cuda::to_host(dl.view().rows(0, rows));
      const Buffer warm_h = cuda::to_host(dh.view().rows(0, rows));
      const CacheSnapshot s1 = snapshot(cache, c.has_indexer);
      cuda::fill_bytes(dl.view(), 0xff);
      cuda::fill_bytes(dh.view(), 0xff);
      ASSERT_TRUE(runner.forward(vb, cache, dl.view(), nullptr, dh.view()));  // replay
      EXPECT_EQ(runner.replays(), 1);
      const cuda::CudaGraph* graph = runner.graph(Bp, false, q);
      ASSERT_NE(graph, nullptr);
      EXPECT_EQ(runner.graph(Bp), nullptr);  // the decode key of the bucket is another graph
      const cuda::GraphNodeCounts nodes = graph->nodes();
      std::string around;
      for (const std::string& x : nodes.memset_neighbours) around += "\n  memset " + x;
      EXPECT_EQ(nodes.memsets, 0) << around;
      EXPECT_EQ(nodes.hosts, 0);
      // The device metadata: runs of q tokens, every token sampled.
      const ForwardBatch* dev = runner.device_batch(Bp, q);
      ASSERT_NE(dev, nullptr);
      const Buffer qsl = cuda::to_host(dev->attn.query_start_loc);
      const Buffer li = cuda::to_host(dev->logits_indices);
      for (int r = 0; r <= Bp; ++r) EXPECT_EQ(qsl.ptr<int32_t>()[r], r * q);
      for (int64_t t = 0; t < rows; ++t) EXPECT_EQ(li.ptr<int32_t>()[t], int32_t(t));
      const Buffer replay = cuda::to_host(dl.view().rows(0, rows));
      const Buffer replay_h = cuda::to_host(dh.view().rows(0, rows));
      const CacheSnapshot s2 = snapshot(cache, c.has_indexer);

      // The replay is the padded warm-up, bit for bit: logits, hidden states and cache.
      EXPECT_TRUE(same_bytes(replay, warm)) << "replay logits differ from the eager warm-up";
      EXPECT_TRUE(same_bytes(replay_h, warm_h)) << "replay hidden states differ from the warm-up";
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        EXPECT_TRUE(same_bytes(s2.latent[size_t(l)], s1.latent[size_t(l)])) << "layer " << l;
        if (c.has_indexer) {
          EXPECT_TRUE(same_bytes(s2.index_keys[size_t(l)], s1.index_keys[size_t(l)]))
              << "layer " << l;
        }
      }
      // Padding wrote nothing: only the real tokens' slots (blocks) may differ from the unpadded
      // eager step's cache.
      std::vector<int64_t> real_slots, real_blocks;
      for (const SeqStep& x : seqs.decode) {
        for (int i = 0; i < q; ++i) {
          const int p = x.start_pos + i;
          const int64_t blk = x.blocks[size_t(p / kBlockSize)];
          real_slots.push_back(blk * kBlockSize + p % kBlockSize);
          real_blocks.push_back(blk);
        }
      }
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        for (int64_t slot : changed_slots(s1.latent[size_t(l)], s0.latent[size_t(l)])) {
          EXPECT_NE(std::find(real_slots.begin(), real_slots.end(), slot), real_slots.end())
              << "layer " << l << ": the padded verify step wrote latent slot " << slot;
        }
        if (!c.has_indexer) continue;
        for (int64_t blk : changed_blocks(s1.index_keys[size_t(l)], s0.index_keys[size_t(l)])) {
          EXPECT_NE(std::find(real_blocks.begin(), real_blocks.end(), blk), real_blocks.end())
              << "layer " << l << ": the padded verify step wrote indexer block " << blk;
        }
      }
      // Real rows: the unpadded eager step's logits and hidden states up to rounding; the same
      // greedy token where it is clear.
      const double err = rel_l2(replay.f32(), eager.f32(), n * V);
      const double err_h = rel_l2(replay_h.f32(), eager_hidden.f32(), n * D);
      std::printf(
          "VGRAPH %s K=%d B=%d bucket %d: replay vs unpadded eager rel L2 %.2e (logits), %.2e "
          "(hidden)\n",
          what, K, B, Bp, err, err_h);
      EXPECT_LT(err, 2e-2);
      EXPECT_LT(err_h, 2e-2);
      expect_clear_greedy_kept(eager, replay, n, V, "token row");
    }
  }
}

TEST(CudaGraphStep, BundledModelVerifyReplayMatchesEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(bundled_model());
  verify_replay_matches_eager(*m, "osprey-arith");
}

TEST(CudaGraphStep, Dsv32LikeVerifyReplayMatchesEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = small_model(3, 1, true);
  verify_replay_matches_eager(*m, "dsv32-small");
}

// The verify graph's budget, measured at the decode budget's token count: kBudgetBatch / 2
// sequences of 2 tokens (4 tokens, so every GEMM has the decode budget's shape and any kernel
// more or less is the verify step's own) launch the decode step's kernels, layer by layer (the
// absorbed attention takes s_q = 2 through its token grid, the plan over tokens); the hidden
// states out (the MTP drafter's input) add one kernel, the final norm over every token; no memset,
// no host node, no other node. K = 3 at kBudgetBatch sequences (16 tokens) holds no memset, host
// or other node either; its kernel count is printed beside the decode's (cuBLASLt may choose
// another algorithm for 16 rows than for 4: not asserted).
TEST(CudaGraphStep, VerifyGraphHoldsTheDecodeBudgetPerLayer) {
  OSPREY_REQUIRE_GPU();
  constexpr int kQ = 2, kSeqs = kBudgetBatch / kQ;
  constexpr int kHiddenOutKernels = 1;  // rms_norm(hidden_out, residual, final_norm)
  const Captured a = capture_step(2, 1, true, kQ, false, kSeqs);   // 1 dense + 1 MoE
  const Captured b = capture_step(3, 1, true, kQ, false, kSeqs);   // 1 dense + 2 MoE
  const Captured c = capture_step(3, 2, true, kQ, false, kSeqs);   // 2 dense + 1 MoE
  const Captured d = capture_step(2, 1, false, kQ, false, kSeqs);  // a without the indexer
  const Captured h = capture_step(2, 1, true, kQ, /*hidden=*/true, kSeqs);
  const Captured a1 = capture_step(2, 1, true);  // a as a decode of kBudgetBatch tokens
  const Captured k3 = capture_step(2, 1, true, 1 + kMaxSpeculativeTokens, true);  // 16 tokens
  ASSERT_FALSE(HasFatalFailure());
  for (const Captured* x : {&a, &b, &c, &d, &h, &k3}) {
    EXPECT_EQ(x->nodes.memsets, 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.hosts, 0) << x->nodes.summary();
    EXPECT_EQ(x->nodes.others, 0) << x->nodes.summary();
  }
  const int moe = b.nodes.kernels - a.nodes.kernels;
  const int dense = c.nodes.kernels - a.nodes.kernels;
  const int dsa2 = a.nodes.kernels - d.nodes.kernels;
  std::printf(
      "VGRAPH budget measured (%d sequences of %d tokens): dense layer %d kernels (budget %d), MoE "
      "layer %d (budget %d), DSA share %d per layer (budget %d); a 2-layer verify %d kernels "
      "(decode %d), with hidden states out %d; K=%d at %d sequences with hidden states out %d\n",
      kSeqs, kQ, dense, kDenseLayerKernels + kDsaLayerKernels, moe,
      kMoeLayerKernels + kDsaLayerKernels, dsa2 / 2, kDsaLayerKernels, a.nodes.kernels,
      a1.nodes.kernels, h.nodes.kernels, kMaxSpeculativeTokens, kBudgetBatch, k3.nodes.kernels);
  EXPECT_EQ(dense, kDenseLayerKernels + kDsaLayerKernels);
  EXPECT_EQ(moe, kMoeLayerKernels + kDsaLayerKernels);
  EXPECT_EQ(dsa2 % 2, 0);
  EXPECT_EQ(dsa2 / 2, kDsaLayerKernels);
  EXPECT_EQ(a.nodes.kernels, a1.nodes.kernels) << a.nodes.summary() << "\n" << a1.nodes.summary();
  EXPECT_EQ(h.nodes.kernels, a.nodes.kernels + kHiddenOutKernels) << h.nodes.summary();
  EXPECT_EQ(h.nodes.memcpys, a.nodes.memcpys);
  if (h.nodes.names_known()) {
    EXPECT_EQ(h.nodes.kernels_named("rms_norm"), a.nodes.kernels_named("rms_norm") + 1)
        << h.nodes.summary();
  }
}

// The bundled model with an MTP layer, written once per process to a temporary folder: its
// checkpoint as it is, plus layer num_hidden_layers (the MTP decoder layer) a copy of the last
// layer, eh_proj = [I | 0] (the next token's embedding half), enorm = hnorm = 1, shared_head =
// the final norm and lm_head. A trained main model (clear greedy margins) and an MTP layer that
// guesses from the next token: some drafts accepted, many rejected.
std::string arith_mtp_dir() {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    const std::string d =
        (fs::temp_directory_path() / ("osprey_test_arith_mtp_" + std::to_string(::getpid())))
            .string();
    ModelConfig c = ModelConfig::from_file(bundled_model());
    c.num_nextn_predict_layers = 1;
    write_model_config(c, d, ModelWriteOptions{});
    const Checkpoint ck(bundled_model());
    std::vector<std::pair<std::string, Tensor>> ts;
    const std::string last = "model.layers." + std::to_string(c.num_hidden_layers - 1) + ".";
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    for (const std::string& name : ck.names()) {
      ts.emplace_back(name, ck.get(name));
      if (name.rfind(last, 0) == 0) ts.emplace_back(mtp + name.substr(last.size()), ck.get(name));
    }
    const int64_t D = c.hidden_size;
    const Tensor norm = ck.get("model.norm.weight");
    OSPREY_CHECK(norm.dtype == DType::BF16, "the bundled model's norms are BF16");
    Buffer ones(DType::BF16, {D}), eh(DType::BF16, {D, 2 * D});  // [D], [D, 2·D]
    for (int64_t i = 0; i < D; ++i) ones.ptr<uint16_t>()[i] = f32_to_bf16(1.0f);
    for (int64_t r = 0; r < D; ++r)
      for (int64_t k = 0; k < 2 * D; ++k)
        eh.ptr<uint16_t>()[r * 2 * D + k] = f32_to_bf16(k == r ? 1.0f : 0.0f);
    ts.emplace_back(mtp + "enorm.weight", ones.view());
    ts.emplace_back(mtp + "hnorm.weight", ones.view());
    ts.emplace_back(mtp + "eh_proj.weight", eh.view());
    ts.emplace_back(mtp + "shared_head.norm.weight", norm);
    ts.emplace_back(mtp + "shared_head.head.weight", ck.get("lm_head.weight"));
    save_safetensors((fs::path(d) / "model.safetensors").string(), ts);
    return d;
  }();
  // Removed when the test process ends.
  static const struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  return dir;
}

// The engine with --speculative-config (K drafts) and with or without graphs, greedy, over the
// engine tests' prompts: each request's tokens and the engine's stats.
std::vector<std::vector<int32_t>> run_spec_engine(const DeepseekModel& m,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<SamplingParams>& params, int K,
                                                  bool graphs, EngineStats* st) {
  EngineConfig ec;
  ec.max_num_seqs = 16;
  ec.max_model_len = 256;
  ec.num_blocks = 16 * 4;
  ec.cuda_graph = graphs;
  ec.cuda_graph_sampling = false;
  if (K > 0)
    ec.speculative = SpeculativeConfig::parse(R"({"method": "mtp", "num_speculative_tokens": )" +
                                              std::to_string(K) + "}");
  Engine e(m, ec);
  std::vector<Engine::Result> r = e.generate(prompts, params);
  *st = e.stats();
  std::vector<std::vector<int32_t>> t;
  for (auto& x : r) t.push_back(x.tokens);
  return t;
}

// The engine with --speculative-config and --cuda-graph: the eager speculative engine's greedy
// tokens, token for token, for K = 1, 2, 3, over two workloads:
//   staggered  max_tokens 3 + 3i: the batch shrinks across bucket edges as requests finish; a
//              sequence within K tokens of its max_tokens verifies fewer drafts (the scheduler's
//              room_out), which makes the step uneven (eager): few steps replay;
//   even       max_tokens 32 for all 13: nearly every step is a uniform verify of bucket 16 (3
//              padding sequences), the last ones with fewer drafts for all (keys (16, 1 + k)).
// Verify steps (uniform ones) replay from their graphs; no capture fails.
TEST(CudaGraphStep, EngineSpeculativeGreedyTokensMatchEager) {
  OSPREY_REQUIRE_GPU();
  const auto m = load_model_cuda(arith_mtp_dir());
  ASSERT_TRUE(m->has_mtp());
  std::mt19937 g(9);
  const std::vector<std::vector<int32_t>> prompts = engine_prompts(*m, 13, g);
  for (const bool even : {false, true}) {
    std::vector<SamplingParams> params;
    for (int i = 0; i < 13; ++i) {
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = even ? 32 : 3 + 3 * i;
      sp.ignore_eos = true;
      params.push_back(sp);
    }
    const char* what = even ? "even" : "staggered";
    EngineStats s_plain;
    const auto plain = run_spec_engine(*m, prompts, params, 0, false, &s_plain);
    for (int K = 1; K <= kMaxSpeculativeTokens; ++K) {
      SCOPED_TRACE(strf("%s K=%d", what, K));
      EngineStats s_eager, s_graph;
      const auto eager = run_spec_engine(*m, prompts, params, K, false, &s_eager);
      const auto graph = run_spec_engine(*m, prompts, params, K, true, &s_graph);
      EXPECT_EQ(graph, eager);
      EXPECT_EQ(s_eager.cuda_graph_replays, 0);
      EXPECT_EQ(s_graph.cuda_graph_capture_failures, 0);
      EXPECT_GT(s_graph.spec_verifies, 0);
      // Counted on the CPU engine over the same workload (its scheduling): even, 24 to 28 of 32
      // steps are uniform verifies; staggered, 6 (K = 3) to 26 (K = 1) of 39.
      if (even) {
        EXPECT_GT(s_graph.cuda_graph_replays, 15);
      } else {
        EXPECT_GT(s_graph.cuda_graph_replays + s_graph.cuda_graph_captures, 0);
      }
      int differ_plain = 0;
      for (size_t i = 0; i < plain.size(); ++i) differ_plain += graph[i] != plain[i];
      std::printf(
          "VGRAPH engine %s K=%d: %lld replays / %lld captures of %lld steps; %lld verifies, %lld "
          "of %lld drafts accepted; %d of %zu requests differ from the engine without MTP\n",
          what, K, static_cast<long long>(s_graph.cuda_graph_replays),
          static_cast<long long>(s_graph.cuda_graph_captures),
          static_cast<long long>(s_graph.steps), static_cast<long long>(s_graph.spec_verifies),
          static_cast<long long>(s_graph.spec_accepted_tokens),
          static_cast<long long>(s_graph.spec_draft_tokens), differ_plain, plain.size());
      // Why the other steps ran eagerly: prefill and mixed steps, verify steps of uneven drafts,
      // and verify steps whose padding would cross a linear's kernel threshold (27 tokens padded
      // to 48 at K = 2: on the H200, 2 such steps staggered); never a buffer too small for the
      // bucket.
      for (const auto& [why, n] : s_graph.cuda_graph_eager_steps) {
        std::printf("VGRAPH engine %s K=%d: %lld eager steps: %s\n", what, K,
                    static_cast<long long>(n), why.c_str());
        EXPECT_TRUE(why.rfind("not a pure decode", 0) == 0 ||
                    why.rfind("padding would cross a linear's kernel threshold", 0) == 0)
            << why;
      }
    }
  }
}
}  // namespace
}  // namespace osprey
