// make-model: deterministic by seed (the committed test models are exactly what it writes),
// sharded output loads like a single file, the presets carry the published shapes; and the CLI
// commands built on the model (logits, generate) work and refuse bad input with a message.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/greedy.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

using namespace osprey;
using namespace osprey::testing;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "/osprey_mm_" + std::to_string(::getpid()) + "/" + name;
  fs::create_directories(fs::path(d).parent_path());
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the osprey binary; returns its exit status and fills out with stdout+stderr.
int run_osprey(const std::string& args, std::string* out) {
  const std::string log = tmp("cli.log");
  const int rc =
      std::system((std::string(OSPREY_BINARY) + " " + args + " >" + log + " 2>&1").c_str());
  *out = slurp(log);
  return WEXITSTATUS(rc);
}

}  // namespace

// The seeds the committed models were made with (tests/data/models/README.md).
TEST(MakeModel, CommittedTestModelsAreReproducible) {
  struct Case {
    const char* name;
    const char* preset;
    uint64_t seed;
    bool ue8m0;
  };
  for (const Case& c :
       {Case{"v2-tiny", "v2-tiny", 2, false}, Case{"v3-tiny", "v3-tiny", 3, false},
        Case{"v32-tiny", "v32-tiny", 32, false}, Case{"v32-tiny-fp8", "v32-tiny", 33, true}}) {
    MakeModelOptions o;
    o.seed = c.seed;
    o.fp8 = o.ue8m0 = c.ue8m0;
    const std::string dir = tmp(std::string("re_") + c.name);
    make_model(preset_config(c.preset), dir, o);
    EXPECT_EQ(slurp(dir + "/model.safetensors"), slurp(model_dir(c.name) + "/model.safetensors"))
        << c.name;
    EXPECT_EQ(slurp(dir + "/config.json"), slurp(model_dir(c.name) + "/config.json")) << c.name;
  }
}

TEST(MakeModel, SeedChangesWeights) {
  MakeModelOptions o;
  o.seed = 100;
  make_model(preset_config("v2-tiny"), tmp("s100"), o);
  o.seed = 101;
  make_model(preset_config("v2-tiny"), tmp("s101"), o);
  EXPECT_NE(slurp(tmp("s100") + "/model.safetensors"), slurp(tmp("s101") + "/model.safetensors"));
}

TEST(MakeModel, ShardedModelGivesTheSameLogits) {
  MakeModelOptions o;
  o.seed = 3;
  o.max_shard_bytes = 1 << 20;  // 1 MiB shards
  const std::string dir = tmp("sharded");
  make_model(preset_config("v3-tiny"), dir, o);
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(dir + "/model-00002-of-00004.safetensors"));
  const std::vector<int32_t> tokens = {5, 9, 200, 17, 3};
  Buffer a = prefill_logits(*load_model_cpu(dir), tokens);
  Buffer b = prefill_logits(*load_model_cpu(model_dir("v3-tiny")), tokens);
  EXPECT_EQ(rel_error(a, b), 0.0);
}

TEST(MakeModel, FullSizeV32PresetHasThePublishedShapes) {
  const ModelConfig c = preset_config("dsv32");
  EXPECT_EQ(c.num_hidden_layers, 5);
  int64_t params = 0, fp8_params = 0;
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& s : weight_specs(c)) {
    params += shape_numel(s.shape);
    if (s.fp8) fp8_params += shape_numel(s.shape);
    shapes[s.name] = s.shape;
  }
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_b_proj.weight"], Shape({128 * 192, 1536}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"], Shape({576, 7168}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.indexer.wq_b.weight"], Shape({64 * 128, 1536}));
  EXPECT_EQ(shapes["model.layers.4.mlp.experts.255.down_proj.weight"], Shape({7168, 2048}));
  EXPECT_EQ(shapes["model.layers.2.mlp.gate_proj.weight"], Shape({18432, 7168}));
  EXPECT_FALSE(shapes.count("model.layers.2.mlp.gate.weight"));
  EXPECT_EQ(shapes["model.layers.3.mlp.gate.e_score_correction_bias"], Shape({256}));
  // One MoE layer holds 256 experts × 3 × 2048 × 7168 routed weights.
  EXPECT_GT(fp8_params, 2 * 256 * 3 * int64_t(2048) * 7168);
  EXPECT_LT(params, int64_t(30) << 30);
}

TEST(MakeModel, UnknownPresetIsRefused) {
  try {
    preset_config("v9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v32-tiny"), std::string::npos);
  }
}

TEST(Cli, LogitsWritesNpyAndHash) {
  const std::string out = tmp("l.npy");
  std::string log;
  ASSERT_EQ(run_osprey("logits --model " + model_dir("v32-tiny") + " --tokens 4,5,6,7 --out " + out,
                       &log),
            0)
      << log;
  EXPECT_NE(log.find("xxh64 "), std::string::npos);
  const std::string npy = slurp(out);
  ASSERT_GT(npy.size(), 128u);
  EXPECT_EQ(npy.substr(1, 5), "NUMPY");
  EXPECT_NE(npy.find("'shape': (4,512,)"), std::string::npos);
  // The data are the logits prefill_logits gives.
  Buffer ref = prefill_logits(*load_model_cpu(model_dir("v32-tiny")), {4, 5, 6, 7});
  const size_t header = size_t(uint8_t(npy[8])) + 256 * size_t(uint8_t(npy[9])) + 10;
  ASSERT_EQ(npy.size() - header, size_t(4 * 512 * 4));
  EXPECT_EQ(std::memcmp(npy.data() + header, ref.f32(), 4 * 512 * 4), 0);
}

TEST(Cli, GenerateMatchesTheLibrary) {
  std::string log;
  ASSERT_EQ(run_osprey("generate --model " + model_dir("v3-tiny") +
                           " --tokens 4,5,6 --max-tokens 8 --ignore-eos",
                       &log),
            0)
      << log;
  GreedyOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  const auto ids = greedy_generate(*load_model_cpu(model_dir("v3-tiny")), {4, 5, 6}, o);
  std::string want;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) want += ',';
    want += std::to_string(ids[i]);
  }
  EXPECT_NE(log.find(want + "\n"), std::string::npos) << log;
}

// --kv-cache-dtype fp8: the FP8 latent cache (the library's set_kv_cache_dtype), same tokens.
TEST(Cli, GenerateWithTheFp8LatentCacheMatchesTheLibrary) {
  std::string log;
  ASSERT_EQ(run_osprey("generate --model " + model_dir("v3-tiny") +
                           " --tokens 4,5,6 --max-tokens 8 --ignore-eos --kv-cache-dtype fp8",
                       &log),
            0)
      << log;
  GreedyOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  auto m = load_model_cpu(model_dir("v3-tiny"));
  m->set_kv_cache_dtype(KvCacheDtype::Fp8);
  const auto ids = greedy_generate(*m, {4, 5, 6}, o);
  std::string want;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) want += ',';
    want += std::to_string(ids[i]);
  }
  EXPECT_NE(log.find(want + "\n"), std::string::npos) << log;
}

TEST(Cli, BadInputGetsAMessage) {
  std::string log;
  EXPECT_EQ(run_osprey("logits --model " + model_dir("v3-tiny") + " --tokens 4,x,6", &log), 1);
  EXPECT_NE(log.find("'x' is not a token id"), std::string::npos) << log;
  EXPECT_EQ(run_osprey("logits --model " + model_dir("v3-tiny") + " --tokens 4,512", &log), 1);
  EXPECT_NE(log.find("outside the vocabulary"), std::string::npos) << log;
  EXPECT_EQ(run_osprey("generate --model /nonexistent --tokens 1", &log), 1);
  EXPECT_NE(log.find("/nonexistent"), std::string::npos) << log;
  EXPECT_EQ(
      run_osprey("generate --model " + model_dir("v3-tiny") + " --tokens 1 --kv-cache-dtype fp9",
                 &log),
      1);
  EXPECT_NE(log.find("--kv-cache-dtype must be auto, bf16 or fp8"), std::string::npos) << log;
  EXPECT_EQ(
      run_osprey("generate --model " + model_dir("v3-tiny") + " --tokens 1 --kv-cache-dtype bf16",
                 &log),
      1);
  EXPECT_NE(log.find("applies to --device cuda"), std::string::npos) << log;
  EXPECT_EQ(run_osprey("make-model --preset nope --out " + tmp("x"), &log), 1);
  EXPECT_NE(log.find("unknown preset"), std::string::npos) << log;
}
