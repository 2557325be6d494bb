// Missing, corrupt and unsupported tokenizer files stop with a message that says what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string load_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("osprey_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST_F(TempDir, LoadsAFileOrAFolder) {
  write("tokenizer.json", testing::tiny_tokenizer({}).dump());
  EXPECT_EQ(Tokenizer::load(dir_).encode("ab"), (std::vector<TokenId>{'a', 'b'}));
  EXPECT_EQ(Tokenizer::load(dir_ / "tokenizer.json").id_limit(), 256);
}

TEST_F(TempDir, MissingFileNamesThePath) {
  const std::string msg = load_error([&] { Tokenizer::load(dir_ / "nope.json"); });
  EXPECT_CONTAINS(msg, "nope.json");
  EXPECT_CONTAINS(msg, "pass a tokenizer.json file or a folder");
  EXPECT_CONTAINS(load_error([&] { Tokenizer::load(dir_); }), "no tokenizer at");
}

TEST_F(TempDir, CorruptJsonIsReported) {
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0");
  const std::string msg = load_error([&] { Tokenizer::load(dir_); });
  EXPECT_CONTAINS(msg, "tokenizer.json is not valid JSON");
  EXPECT_CONTAINS(msg, (dir_ / "tokenizer.json").string());
}

TEST(LoadErrors, UnsupportedAndMalformedParts) {
  json t = testing::tiny_tokenizer({});
  t["model"]["type"] = "WordPiece";
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "model type 'WordPiece'");

  t = testing::tiny_tokenizer({});
  t["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "'Digits' is not supported");

  t = testing::tiny_tokenizer({});
  t["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "'BertNormalizer'");

  t = testing::tiny_tokenizer({});
  t["decoder"] = {{"type", "WordPiece"}};
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "decoder type 'WordPiece'");

  t = testing::tiny_tokenizer({});
  t["model"]["merges"] = {"a zz"};
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "'zz', not in the vocab");

  t = testing::tiny_tokenizer({});
  t["model"]["merges"] = {"abc"};
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "not two tokens");

  t = testing::tiny_tokenizer({});
  t["model"].erase("vocab");
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json(t.dump()); }), "malformed");

  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json("[1, 2]"); }), "must hold a JSON object");
  EXPECT_CONTAINS(load_error([&] { Tokenizer::from_json("{}"); }), "no \"model\"");
}

}  // namespace
}  // namespace osprey::tokenizer
