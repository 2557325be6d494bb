// The CUDA graph runner's host side (engine/cuda_graph_runner.h), which runs without a GPU: vLLM's
// capture sizes, the bucket of a batch, which steps may replay a decode graph, and the clear
// refusal of --cuda-graph for a CPU model.
#include <gtest/gtest.h>

#include "core/error.h"
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
