// Safetensors reading and weight loading: good files read back exactly; every kind of damage
// (truncation, a header that lies, a missing tensor, a wrong shape, FP8 without its scales) stops
// with a message naming the tensor and the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"

using namespace osprey;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/osprey_st_" + std::to_string(::getpid());
  fs::create_directories(d);
  return d + "/" + name;
}

void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t claimed_len = -1) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = claimed_len >= 0 ? uint64_t(claimed_len) : header.size();
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f << header << data;
}

// The message of the osprey::Error thrown by fn ("" if none).
template <typename F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_MENTIONS(msg, ...)                                                         \
  do {                                                                                    \
    const std::string m_ = (msg);                                                         \
    EXPECT_FALSE(m_.empty()) << "no error was raised";                                    \
    for (const char* s_ : {__VA_ARGS__}) EXPECT_NE(m_.find(s_), std::string::npos) << m_; \
  } while (0)

}  // namespace

TEST(Safetensors, WritesAndReadsBack) {
  Buffer a(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) a.f32()[i] = float(i) * 1.5f;
  Buffer b(DType::BF16, {4});
  for (int i = 0; i < 4; ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(float(-i));
  const std::string p = tmp("good.safetensors");
  save_safetensors(p, {{"a", a}, {"b", b}}, {{"format", "pt"}});
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor ta = f.tensor("a"), tb = f.tensor("b");
  EXPECT_EQ(ta.shape, Shape({2, 3}));
  EXPECT_EQ(ta.dtype, DType::F32);
  EXPECT_EQ(ta.f32()[5], 7.5f);
  EXPECT_EQ(tb.dtype, DType::BF16);
  EXPECT_EQ(bf16_to_f32(tb.ptr<uint16_t>()[3]), -3.0f);
}

TEST(Safetensors, TruncatedFiles) {
  Buffer a(DType::F32, {64});
  for (int i = 0; i < 64; ++i) a.f32()[i] = float(i);
  const std::string p = tmp("trunc.safetensors");
  save_safetensors(p, {{"model.layers.0.mlp.up_proj.weight", a}});
  fs::resize_file(p, fs::file_size(p) - 10);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "trunc.safetensors",
                  "model.layers.0.mlp.up_proj.weight", "past the end");
  fs::resize_file(p, 5);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "trunc.safetensors", "truncated");
  write_raw(p, "{}", "", 1000);  // header length beyond the file
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "header length");
}

TEST(Safetensors, HeadersThatLie) {
  const std::string p = tmp("lie.safetensors");
  const std::string data(64, '\0');
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 80]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "past the end",
                  "lie.safetensors");

  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "needs 64 bytes", "span 32");

  write_raw(p, R"({"x": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                   "y": {"dtype": "F32", "shape": [8], "data_offsets": [16, 48]}})",
            data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'x'", "'y'", "overlap");

  write_raw(p, R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "unknown dtype");

  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "begin > end");

  write_raw(p, R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "bad dimension");

  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4]}})", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "'w'", "data_offsets");

  write_raw(p, R"({"w": [1, 2)", data);
  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(p); }), "not valid JSON");

  EXPECT_MENTIONS(error_of([&] { SafetensorsFile f(tmp("absent.safetensors")); }), "cannot open");
}

// Shapes whose element counts overflow 64 bits, found by reasoning about the fuzz target's
// property (numel × dtype size = the span): each is refused with the shape in the message instead
// of wrapping around (an empty span used to pass for [2^32, 2^32, 0]-like shapes and a dimension
// above 2^63 became negative).
TEST(Safetensors, RefusesShapesThatOverflow) {
  using osprey::parse_safetensors_header;
  auto image = [](const std::string& header, size_t data_bytes = 0) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
    return b + header + std::string(data_bytes, '\0');
  };
  auto error = [&](const std::string& header, size_t data_bytes = 0) {
    const std::string b = image(header, data_bytes);
    return error_of([&] {
      parse_safetensors_header(reinterpret_cast<const unsigned char*>(b.data()), b.size(), "x");
    });
  };
  EXPECT_MENTIONS(error(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0],
                                  "data_offsets": [0, 0]}})"),
                  "'w'", "more than 2^62 elements");
  EXPECT_MENTIONS(error(R"({"w": {"dtype": "F32", "shape": [9223372036854775808],
                                  "data_offsets": [0, 0]}})"),
                  "'w'", "more than 2^62 elements");
  EXPECT_MENTIONS(error(R"({"w": {"dtype": "F32", "shape": [4611686018427387904],
                                  "data_offsets": [0, 0]}})"),
                  "'w'", "needs more than 2^64 bytes", "span 0");
  EXPECT_MENTIONS(error(R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],
                                  "data_offsets": [0, 4]}})"),
                  "'w'", "more than 16 dimensions");
  // A zero dimension anywhere is an empty tensor: fine when its span is empty.
  const std::string ok =
      image(R"({"e": {"dtype": "BF16", "shape": [0, 1048576], "data_offsets": [0, 0]}})");
  const auto h =
      parse_safetensors_header(reinterpret_cast<const unsigned char*>(ok.data()), ok.size(), "ok");
  EXPECT_EQ(h.tensors.at("e").shape, (osprey::Shape{0, 1048576}));
  // An empty tensor between two overlapping ones: the earlier check compared neighbours only,
  // so 'c' inside 'a' passed once an empty 'b' sat between them.
  EXPECT_MENTIONS(error(R"({"a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]},
                            "b": {"dtype": "U8", "shape": [0], "data_offsets": [10, 10]},
                            "c": {"dtype": "U8", "shape": [10], "data_offsets": [30, 40]}})",
                        100),
                  "'a'", "'c'", "overlap");
}

TEST(Safetensors, ShardedCheckpoint) {
  const std::string dir = tmp("sharded");
  fs::create_directories(dir);
  Buffer a(DType::F32, {2}), b(DType::F32, {3});
  a.f32()[0] = 1, a.f32()[1] = 2;
  b.f32()[0] = 3, b.f32()[1] = 4, b.f32()[2] = 5;
  save_safetensors(dir + "/s1.safetensors", {{"a", a}});
  save_safetensors(dir + "/s2.safetensors", {{"b", b}});
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})";
  Checkpoint ck(dir);
  EXPECT_EQ(ck.get("b").f32()[2], 5.0f);
  EXPECT_EQ(ck.file_of("a"), dir + "/s1.safetensors");
  EXPECT_MENTIONS(error_of([&] { ck.get("c"); }), "missing tensor 'c'");
  EXPECT_MENTIONS(error_of([&] { ck.get("b", {4}); }), "s2.safetensors", "'b'", "[3]", "[4]");

  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"a": "s2.safetensors"}})";
  EXPECT_MENTIONS(error_of([&] { Checkpoint c2(dir); }), "'a'", "s2.safetensors", "does not hold");
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {"a": "../s2"}})";
  EXPECT_MENTIONS(error_of([&] { Checkpoint c2(dir); }), "plain file name");
  fs::remove(dir + "/model.safetensors.index.json");
  fs::remove(dir + "/s1.safetensors");
  fs::remove(dir + "/s2.safetensors");
  EXPECT_MENTIONS(error_of([&] { Checkpoint c2(dir); }), "no model.safetensors");
}

namespace {

// A copy of a tiny model with `edit` applied to its tensor list.
std::string edited_model(
    const std::string& name, bool fp8,
    const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const std::string dir = tmp(name);
  MakeModelOptions o;
  o.seed = 5;
  o.fp8 = fp8;
  make_model(preset_config("v3-tiny"), dir, o);
  std::vector<std::pair<std::string, Tensor>> ts;
  std::vector<Buffer> keep;
  {
    SafetensorsFile f(dir + "/model.safetensors");
    for (const auto& [n, info] : f.tensors()) {
      Tensor t = f.tensor(n);
      Buffer b(t.dtype, t.shape);
      std::memcpy(b.view().data, t.data, t.nbytes());
      ts.emplace_back(n, b.view());
      keep.push_back(std::move(b));
    }
  }
  edit(ts);
  save_safetensors(dir + "/model.safetensors", ts);
  return dir;
}

std::string load_error(const std::string& dir) {
  return error_of([&] {
    Checkpoint ck(dir);
    load_weights_cpu(ck, ModelConfig::from_file(dir));
  });
}

}  // namespace

TEST(Weights, MissingTensorNamed) {
  const std::string dir = edited_model("missing", false, [](auto& ts) {
    std::erase_if(ts,
                  [](auto& p) { return p.first == "model.layers.1.mlp.experts.3.up_proj.weight"; });
  });
  EXPECT_MENTIONS(load_error(dir), "missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight'");
}

TEST(Weights, WrongShapeNamed) {
  Buffer small(DType::BF16, {4, 4});
  std::memset(small.view().data, 0, small.view().nbytes());
  const std::string dir = edited_model("shape", false, [&](auto& ts) {
    for (auto& p : ts)
      if (p.first == "model.layers.0.self_attn.kv_b_proj.weight") p.second = small.view();
  });
  EXPECT_MENTIONS(load_error(dir), "model.layers.0.self_attn.kv_b_proj.weight", "[4, 4]",
                  "model.safetensors", "expected");
}

TEST(Weights, Fp8WithoutScalesNamed) {
  const std::string dir = edited_model("noscale", true, [](auto& ts) {
    std::erase_if(
        ts, [](auto& p) { return p.first == "model.layers.2.self_attn.o_proj.weight_scale_inv"; });
  });
  EXPECT_MENTIONS(load_error(dir), "model.layers.2.self_attn.o_proj.weight", "weight_scale_inv");
}

TEST(Weights, WrongDtypeNamed) {
  Buffer ints(DType::I32, {512, 256});
  std::memset(ints.view().data, 0, ints.view().nbytes());
  const std::string dir = edited_model("dtype", false, [&](auto& ts) {
    for (auto& p : ts)
      if (p.first == "lm_head.weight") p.second = ints.view();
  });
  EXPECT_MENTIONS(load_error(dir), "lm_head.weight", "I32");
}

TEST(Weights, MtpLayerIsRecognisedAndSkipped) {
  Buffer extra(DType::BF16, {8});
  std::memset(extra.view().data, 0, extra.view().nbytes());
  const std::string dir = edited_model("mtp", false, [&](auto& ts) {
    ts.emplace_back("model.layers.3.eh_proj.weight", extra.view());
    ts.emplace_back("model.layers.3.enorm.weight", extra.view());
  });
  Checkpoint ck(dir);
  const ModelWeights w = load_weights_cpu(ck, ModelConfig::from_file(dir));
  EXPECT_EQ(w.skipped_mtp_tensors, 2);
  EXPECT_EQ(w.layers.size(), 3u);
}

TEST(Weights, Fp8DequantizesWithBlockScales) {
  // The same seed with and without FP8: dequantized weights stay within e4m3's rounding of the
  // bf16 originals (3 mantissa bits: |error| ≤ 2^-4 |w| for normal values, plus subnormals).
  MakeModelOptions o;
  o.seed = 9;
  const std::string d16 = tmp("w16"), d8 = tmp("w8");
  make_model(preset_config("v32-tiny"), d16, o);
  o.fp8 = true;
  o.ue8m0 = true;
  make_model(preset_config("v32-tiny"), d8, o);
  Checkpoint c16(d16), c8(d8);
  const ModelConfig cfg = ModelConfig::from_file(d8);
  ASSERT_TRUE(cfg.quant.fp8 && cfg.quant.ue8m0);
  ModelWeights w16 = load_weights_cpu(c16, ModelConfig::from_file(d16));
  ModelWeights w8 = load_weights_cpu(c8, cfg);
  const Tensor s = c8.get("model.layers.1.self_attn.kv_b_proj.weight_scale_inv");
  for (int64_t i = 0; i < s.numel(); ++i) {  // ue8m0: powers of two
    int e;
    EXPECT_EQ(std::frexp(s.f32()[i], &e), 0.5f);
  }
  const Tensor a = w16.layers[1].attn.kv_b_proj.weight, b = w8.layers[1].attn.kv_b_proj.weight;
  double worst = 0;
  int differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.f32()[i], y = b.f32()[i];
    worst = std::max(worst, double(std::fabs(x - y)) - std::fabs(x) / 16.0);
    differ += x != y;
  }
  EXPECT_LT(worst, 1e-3);            // the subnormal quantum of the largest block scale
  EXPECT_GT(differ, a.numel() / 2);  // and it really is a different (quantized) tensor
}
