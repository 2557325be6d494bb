// On one GPU: the NCCL backend with one rank (every collective on device buffers), and the model
// loaded through the parallel path (TCP control plane + NCCL, --enable-expert-parallel with one
// rank, so that every MoE layer's dispatch and combine run through NCCL's all-to-all) giving the
// single-GPU model's logits and greedy tokens. Skips without a GPU.
#include <gtest/gtest.h>

#include "core/device_buffer.h"
#include "dist/nccl_comm.h"
#include "dist/tcp_comm.h"
#include "model/greedy.h"
#include "model/rank_group.h"
#include "model/test_util.h"

namespace osprey {
namespace {

bool have_gpu() {
  return cuda::device_count() > 0;
}

TEST(NcclOneRank, Collectives) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  ASSERT_GT(dist::nccl_version(), 0) << "libnccl.so.2 not found";
  dist::TcpCommunicator boot(dist::TcpEndpoint{"127.0.0.1", 29911}, 0, 1);
  auto c = dist::make_nccl_communicator(boot);
  Buffer h(DType::F32, {5});
  for (int i = 0; i < 5; ++i) h.f32()[i] = float(i) + 0.5f;
  Storage d(Device::CUDA, DType::F32, {5}), g(Device::CUDA, DType::F32, {5});
  cuda::copy(d.view(), h);
  c->all_reduce_sum(d.view());
  c->all_gather(g.view(), d.view());
  c->all_to_allv(d.view(), {5}, g.view(), {5});
  c->broadcast(d.view(), 0);
  c->barrier();
  Buffer back(DType::F32, {5});
  cuda::copy(back, d.view());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back.f32()[i], float(i) + 0.5f);
}

class ThroughNccl : public ::testing::TestWithParam<std::string> {};

TEST_P(ThroughNccl, LogitsAndGreedyEqualTheSingleGpuModel) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string dir = GetParam() == "osprey-arith" ? std::string(OSPREY_BUNDLED_MODEL)
                                                       : testing::model_dir(GetParam());
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 250, 3, 64, 128, 11, 200, 1, 77};
  Buffer ref;
  std::vector<int32_t> ref_greedy;
  GreedyOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  {
    auto m = load_model_cuda(dir);
    ref = prefill_logits(*m, prompt);
    ref_greedy = greedy_generate(*m, prompt, o);
  }
  dist::ParallelConfig p;
  p.enable_expert_parallel = true;
  p.master_port = 29912;
  RankGroupOptions ro;
  ro.device = Device::CUDA;
  RankGroup g(dir, p, ro);
  const Buffer logits = prefill_logits(g.leader(), prompt);
  // BF16 expert GEMMs over pairs instead of tokens: rounding differs a little, not more.
  EXPECT_LT(testing::rel_error(logits.view(), ref.view()), 2e-3);
  EXPECT_EQ(greedy_generate(g.leader(), prompt, o), ref_greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, ThroughNccl,
                         ::testing::Values("v3-tiny", "v32-tiny", "v32-tiny-fp8", "osprey-arith"),
                         [](const auto& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace osprey
