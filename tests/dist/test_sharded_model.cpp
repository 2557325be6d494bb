// The parallel model on the CPU twin (ranks as threads): with 2, 4 and 8 ranks, TP, TP + EP and
// DP-attention + EP give the 1-rank logits within float tolerance (the sums only change order)
// and the same greedy continuation, on every committed test model and the bundled osprey-arith;
// a batch of several sequences spreads over the DP ranks; sizes that do not divide are refused
// with the model's number; a rank that fails names itself to rank 0.
#include <gtest/gtest.h>

#include <map>

#include "model/greedy.h"
#include "model/rank_group.h"
#include "model/test_util.h"

namespace osprey {
namespace {

using testing::model_dir;
using testing::rel_error;

// Float sums in another order (all-reduce over heads / intermediate parts, experts' outputs
// combined per token): measured ~1e-6; far below a wrong shard (O(1)).
constexpr double kLogitsTol = 2e-5;

std::string dir_of(const std::string& name) {
  return name == "osprey-arith" ? std::string(OSPREY_BUNDLED_MODEL) : model_dir(name);
}

const std::vector<int32_t> kPrompt = {5, 17, 300, 42, 7, 99, 250, 3, 64, 128, 11, 200, 1, 77};

struct Reference {
  Buffer logits;
  std::vector<int32_t> greedy;
};
const Reference& reference(const std::string& name) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto m = load_model_cpu(dir_of(name));
  Reference r{prefill_logits(*m, kPrompt), {}};
  GreedyOptions g;
  g.max_new_tokens = 8;
  g.stop_at_eos = false;
  r.greedy = greedy_generate(*m, kPrompt, g);
  return cache.emplace(name, std::move(r)).first->second;
}

dist::ParallelConfig mode(const std::string& m, int n) {
  dist::ParallelConfig p;
  if (m == "tp") p.tensor_parallel_size = n;
  if (m == "tp-ep") p.tensor_parallel_size = n, p.enable_expert_parallel = true;
  if (m == "dp-ep") p.data_parallel_size = n, p.enable_expert_parallel = true;
  return p;
}

class Sharded : public ::testing::TestWithParam<std::tuple<std::string, std::string, int>> {};

TEST_P(Sharded, LogitsAndGreedyEqualOneRank) {
  const auto [name, m, n] = GetParam();
  const Reference& ref = reference(name);
  RankGroup g(dir_of(name), mode(m, n));
  ASSERT_TRUE(g.has_leader());
  const Buffer logits = prefill_logits(g.leader(), kPrompt);
  const double err = rel_error(logits.view(), ref.logits.view());
  EXPECT_LT(err, kLogitsTol) << name << " " << m << n;
  std::printf("%s %s%d: logits rel. error vs 1 rank %.2e\n", name.c_str(), m.c_str(), n, err);
  GreedyOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  EXPECT_EQ(greedy_generate(g.leader(), kPrompt, o), ref.greedy) << name << " " << m << n;
}

// TP and TP + EP with 2 and 4 ranks (the models have 4 heads: TP8 is refused, below); DP-attention
// + EP over 2, 4 and 8 (16 experts).
std::vector<std::tuple<std::string, std::string, int>> cases() {
  std::vector<std::tuple<std::string, std::string, int>> out;
  for (const char* name : {"v2-tiny", "v3-tiny", "v32-tiny", "v32-tiny-fp8", "osprey-arith"}) {
    for (int n : {2, 4}) out.emplace_back(name, "tp", n);
    for (int n : {2, 4}) out.emplace_back(name, "tp-ep", n);
    for (int n : {2, 4, 8}) out.emplace_back(name, "dp-ep", n);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, Sharded, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param) +
                  std::to_string(std::get<2>(info.param));
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
});

TEST(Sharded, TpEightIsRefusedForFourHeads) {
  try {
    RankGroup g(model_dir("v32-tiny"), mode("tp", 8));
    FAIL() << "TP8 over 4 heads loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "num_attention_heads (4) does not divide by --tensor-parallel-size 8"),
              std::string::npos)
        << e.what();
  }
}

TEST(Sharded, ExpertsThatDoNotDivideAreRefused) {
  try {
    RankGroup g(model_dir("v3-tiny"), mode("dp-ep", 3));  // 16 experts over 3 ranks
    FAIL() << "EP3 over 16 experts loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_routed_experts (16) does not divide over 3"),
              std::string::npos)
        << e.what();
  }
}

// Several sequences in one step (prefill and decode mixed): DP spreads them over the ranks by
// their first block; every sequence's logits equal one rank's.
TEST(Sharded, DataParallelBatchOfSequences) {
  auto one = load_model_cpu(model_dir("v32-tiny"));
  RankGroup g(model_dir("v32-tiny"), mode("dp-ep", 4));
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400, 500, 60, 7}, {42}, {11, 12}, {300, 3}};
  auto run = [&](const DeepseekModel& m) {
    PagedKVCache cache = m.make_cache(int64_t(prompts.size()));
    std::vector<SeqStep> seqs;
    for (size_t i = 0; i < prompts.size(); ++i)
      seqs.push_back(SeqStep{prompts[i], 0, {int32_t(i)}, false});
    OwnedBatch b(seqs, kBlockSize);
    Buffer logits(DType::F32, {b.n_logits(), m.config().vocab_size});
    m.forward(b.batch(), cache, logits);
    // A decode step for every sequence after it.
    std::vector<SeqStep> dec;
    for (size_t i = 0; i < prompts.size(); ++i)
      dec.push_back(SeqStep{{int32_t(i + 5)}, int32_t(prompts[i].size()), {int32_t(i)}, false});
    OwnedBatch d(dec, kBlockSize);
    Buffer dl(DType::F32, {d.n_logits(), m.config().vocab_size});
    m.forward(d.batch(), cache, dl);
    return std::make_pair(std::move(logits), std::move(dl));
  };
  const auto a = run(*one), b = run(g.leader());
  EXPECT_LT(rel_error(b.first.view(), a.first.view()), kLogitsTol);
  EXPECT_LT(rel_error(b.second.view(), a.second.view()), kLogitsTol);
}

// A rank whose checkpoint slice is unreadable: rank 0 names it, nothing hangs.
TEST(Sharded, ARankThatFailsToLoadIsNamed) {
  ModelConfig c = ModelConfig::from_file(model_dir("v3-tiny"));
  c.moe_intermediate_size *= 2;  // every expert's shape now disagrees with the checkpoint
  try {
    RankGroup g(model_dir("v3-tiny"), mode("dp-ep", 2), RankGroupOptions{Device::CPU, &c});
    FAIL() << "loaded with wrong shapes";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("expected"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace osprey
