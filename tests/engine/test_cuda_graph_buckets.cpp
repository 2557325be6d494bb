// The CUDA graph runner's host side (engine/cuda_graph_runner.h), which runs without a GPU: vLLM's
// capture sizes, the bucket of a batch, which steps may replay a decode graph, which prepared
// samplings the graph can take (the rest fall back to the host path), the staging of the sampling
// rows under the shrink-tail rule, and the clear refusal of --cuda-graph for a CPU model.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/storage.h"
#include "engine/cuda_graph_runner.h"
#include "engine/engine.h"
#include "model/greedy.h"

namespace osprey {
namespace {

TEST(CudaGraphBuckets, CaptureSizesAreVllms) {
  EXPECT_EQ(cuda_graph_capture_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(cuda_graph_capture_sizes(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(cuda_graph_capture_sizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(cuda_graph_capture_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(cuda_graph_capture_sizes(64),
            (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
}

TEST(CudaGraphBuckets, SmallestBucketThatHoldsTheBatch) {
  const std::vector<int> s = cuda_graph_capture_sizes(64);
  EXPECT_EQ(cuda_graph_bucket(s, 1), 1);
  EXPECT_EQ(cuda_graph_bucket(s, 3), 4);
  EXPECT_EQ(cuda_graph_bucket(s, 5), 8);
  EXPECT_EQ(cuda_graph_bucket(s, 8), 8);
  EXPECT_EQ(cuda_graph_bucket(s, 9), 16);
  EXPECT_EQ(cuda_graph_bucket(s, 57), 64);
  EXPECT_EQ(cuda_graph_bucket(s, 65), 0);  // larger than every bucket: eager
}

std::vector<int32_t> blocks(int first) {
  return {first, first + 1};
}

TEST(CudaGraphBuckets, OnlyPureDecodeStepsReplay) {
  // Three decodes: eligible.
  OwnedBatch decode(
      {SeqStep{{5}, 10, blocks(0)}, SeqStep{{6}, 70, blocks(2)}, SeqStep{{7}, 3, blocks(4)}}, 64);
  EXPECT_EQ(cuda_graph_ineligible(decode.batch()), "");
  // A prompt chunk in the batch (mixed): eager.
  OwnedBatch mixed({SeqStep{{5}, 10, blocks(0)}, SeqStep{{1, 2, 3}, 0, blocks(2)}}, 64);
  EXPECT_NE(cuda_graph_ineligible(mixed.batch()), "");
  // A verify step (1 + drafts, every row sampled): eager.
  OwnedBatch verify({SeqStep{{5, 6}, 10, blocks(0), true}}, 64);
  ForwardBatch vb = verify.batch();
  vb.spec_decode = true;
  EXPECT_NE(cuda_graph_ineligible(vb), "");
  // One-token steps of which one is not sampled (a mid-prompt chunk of one token): eager.
  ForwardBatch partial = decode.batch();
  partial.logits_indices = partial.logits_indices.rows(0, 2);
  EXPECT_NE(cuda_graph_ineligible(partial), "");
  // An empty batch: eager.
  EXPECT_NE(cuda_graph_ineligible(ForwardBatch{}), "");
}

// A prepared sampling of n rows: greedy rows, `lists` ids listed, logprobs on row 0 if asked.
struct Prepared {
  std::vector<SampleRowParams> rows;
  std::vector<int32_t> lists;
  GraphSampling gs;
  Prepared(int n, size_t lists_size, bool logprobs) {
    rows.assign(size_t(n), SampleRowParams{});
    for (int r = 0; r < n; ++r) rows[size_t(r)].seed = uint64_t(100 + r);
    lists.assign(lists_size, 1);
    if (logprobs) {
      rows[0].logprobs = 5;
      rows[0].logprob_row = 0;
    }
    gs.rows = &rows;
    gs.lists = &lists;
    gs.n_logprob_rows = logprobs ? 1 : 0;
  }
};

TEST(CudaGraphBuckets, InGraphSamplingOrTheHostPath) {
  // Fits: plain rows, logprobs, lists up to the bucket's capacity.
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, 0, false).gs, 3, 4), "");
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, 10, true).gs, 3, 4), "");
  const size_t cap = size_t(4) * kGraphSampleListPerRow;
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, cap, false).gs, 3, 4), "");
  // One id past the capacity (a new penalty slot's prompt): the host path, with the reason.
  const std::string over = cuda_graph_sampling_unsupported(Prepared(3, cap + 1, false).gs, 3, 4);
  EXPECT_NE(over.find("capacity"), std::string::npos) << over;
  // A larger bucket holds it.
  EXPECT_EQ(cuda_graph_sampling_unsupported(Prepared(3, cap + 1, false).gs, 3, 8), "");
  // Not one row per sequence, no rows at all, logprob rows that do not match.
  EXPECT_NE(cuda_graph_sampling_unsupported(Prepared(2, 0, false).gs, 3, 4), "");
  EXPECT_NE(cuda_graph_sampling_unsupported(GraphSampling{}, 3, 4), "");
  Prepared bad_lp(3, 0, true);
  bad_lp.gs.n_logprob_rows = 0;  // row 0 asks for logprobs but no row is counted
  EXPECT_NE(cuda_graph_sampling_unsupported(bad_lp.gs, 3, 4).find("logprob"), std::string::npos);
  // A penalty slot needs the penalty state on the GPU (a CPU state cannot be read by the graph).
  Prepared pen(3, 4, false);
  pen.rows[1].penalty_slot = 0;
  Storage mask(Device::CPU, DType::I32, {4, 2}), counts(Device::CPU, DType::I32, {4, 64});
  pen.gs.prompt_mask = mask.view();
  pen.gs.output_counts = counts.view();
  EXPECT_NE(cuda_graph_sampling_unsupported(pen.gs, 3, 4).find("penalty state"), std::string::npos);
  pen.gs.prompt_mask = pen.gs.output_counts = Tensor{};  // none at all
  EXPECT_NE(cuda_graph_sampling_unsupported(pen.gs, 3, 4), "");
  pen.rows[1].penalty_slot = -1;  // without the slot the state is not read
  EXPECT_EQ(cuda_graph_sampling_unsupported(pen.gs, 3, 4), "");
}

TEST(CudaGraphBuckets, SamplingRowsStagedWithTheShrinkTail) {
  constexpr int kBucket = 8;
  const SampleRowParams pad = graph_padding_sample_row();
  EXPECT_LT(pad.temperature, kGreedyTemperature);  // greedy: no draw, no state
  EXPECT_EQ(pad.logprobs, -1);
  EXPECT_EQ(pad.penalty_slot, -1);
  EXPECT_EQ(pad.suppress_count, 0);
  std::vector<SampleRowParams> staged(kBucket);
  // A marker in every staged row, so that a row the staging must leave alone is seen untouched.
  auto mark = [&] {
    for (SampleRowParams& p : staged) p.seed = 0xdead;
  };
  auto rows = [](int n, uint64_t base) {
    std::vector<SampleRowParams> r(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      r[size_t(i)].seed = base + uint64_t(i);
      r[size_t(i)].temperature = 0.7f;
      r[size_t(i)].step = uint64_t(i) * 3;
    }
    return r;
  };
  auto same = [](const SampleRowParams& a, const SampleRowParams& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  };
  mark();
  // Never staged: every padding row is written.
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, -1, rows(7, 10)), 1);
  for (int r = 0; r < 7; ++r) EXPECT_TRUE(same(staged[size_t(r)], rows(7, 10)[size_t(r)]));
  EXPECT_TRUE(same(staged[7], pad));
  // 7 → 5: rows 5 and 6 shrank off and are reset; row 7 (padding already) is left alone.
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 7, rows(5, 20)), 2);
  for (int r = 0; r < 5; ++r) EXPECT_TRUE(same(staged[size_t(r)], rows(5, 20)[size_t(r)]));
  EXPECT_TRUE(same(staged[5], pad));
  EXPECT_TRUE(same(staged[6], pad));
  EXPECT_EQ(staged[7].seed, 0xdeadu);
  // 5 → 5: nothing shrank; 5 → 6: row 5 is real again, rows 6 and 7 untouched.
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 5, rows(5, 30)), 0);
  for (int r = 5; r < kBucket; ++r) EXPECT_EQ(staged[size_t(r)].seed, 0xdeadu);
  mark();
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 5, rows(6, 40)), 0);
  EXPECT_TRUE(same(staged[5], rows(6, 40)[5]));
  EXPECT_EQ(staged[6].seed, 0xdeadu);
  // A full bucket; no row, or more rows than the bucket, is an internal error that stops loudly.
  EXPECT_EQ(stage_graph_sample_rows(staged.data(), kBucket, 6, rows(8, 50)), 0);
  EXPECT_DEATH(stage_graph_sample_rows(staged.data(), kBucket, 8, {}), "0 sampling rows");
  EXPECT_DEATH(stage_graph_sample_rows(staged.data(), kBucket, 8, rows(9, 60)), "9 sampling rows");
}

TEST(CudaGraphBuckets, CpuModelRefusesCudaGraphsClearly) {
  const auto m = load_model_cpu(OSPREY_BUNDLED_MODEL);
  EngineConfig ec;
  ec.max_num_seqs = 4;
  ec.max_model_len = 128;
  ec.num_blocks = 8;
  ec.cuda_graph = true;
  try {
    Engine e(*m, ec);
    FAIL() << "an engine with CUDA graphs on a CPU model was made";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("--cuda-graph"), std::string::npos) << what;
  }
  ec.cuda_graph = false;  // the default: the CPU engine as before
  Engine e(*m, ec);
  EXPECT_EQ(e.stats().cuda_graph_replays, 0);
}

}  // namespace
}  // namespace osprey
