// The real DeepSeek-V3 tokenizer: special tokens, bos, known encodings, streaming, and the
// `osprey tokenize` command.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "deepseek_tokenizer.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

using testing::deepseek_v3;
using Ids = std::vector<TokenId>;

TEST(DeepSeekV3, SpecialTokensComeFromAddedTokens) {
  const Tokenizer& tok = deepseek_v3();
  // The ids published for the V3 family (model_math.md section 4.2).
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.token_to_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.token_to_id("<|EOT|>"), 128805);
  EXPECT_EQ(tok.id_limit(), 128815);
  EXPECT_TRUE(tok.is_special(0));
}

TEST(DeepSeekV3, KnownEncodings) {
  const Tokenizer& tok = deepseek_v3();
  // Values from the reference implementation.
  EXPECT_EQ(tok.encode("Hello, my dog is cute"), (Ids{19923, 14, 1026, 6397, 344, 33125}));
  EXPECT_EQ(tok.encode("<｜User｜>hi<｜Assistant｜>"), (Ids{128803, 6366, 128804}));
  EXPECT_EQ(tok.encode("12345 一二三 日本語のテキスト"),
            (Ids{6895, 1883, 223, 49548, 1131, 223, 88768, 1576, 17383, 20367, 24552}));
  EncodeOptions with_bos;
  with_bos.add_special_tokens = true;  // tokenizer_config.json: add_bos_token true
  EXPECT_EQ(tok.encode("Hello", with_bos), (Ids{0, 19923}));
}

TEST(DeepSeekV3, UnknownIdsAreErrors) {
  const Tokenizer& tok = deepseek_v3();
  // The model's embedding has 129280 rows, but ids past the tokenizer's last token are no text.
  EXPECT_THROW(tok.decode(Ids{128815}), Error);
  EXPECT_THROW(tok.decode(Ids{129279}), Error);
  EXPECT_EQ(tok.decode(Ids{128814}), "<｜tool▁sep｜>");
}

TEST(DeepSeekV3, StreamingHoldsSplitCharacters) {
  const Tokenizer& tok = deepseek_v3();
  const std::string text =
      "Emoji 🫠🧠👨‍👩‍👧‍👦 and 漢字かな交じり文 and Ελληνικά.";
  const Ids ids = tok.encode(text);
  IncrementalDetokenizer detok(tok);
  std::string streamed;
  int held = 0;
  for (TokenId id : ids) {
    const std::string delta = detok.step(id);
    ASSERT_TRUE(utf8_is_valid(delta));
    held += delta.empty();
    streamed += delta;
  }
  streamed += detok.finish();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0);  // some emoji are split over several byte tokens
}

// Runs `osprey tokenize ARGS` with `input` on stdin; returns stdout, sets the exit status.
std::string run_cli(const std::string& args, const std::string& input, int& status) {
  const std::string in_path = ::testing::TempDir() + "osprey_tokenize_in.txt";
  std::ofstream(in_path, std::ios::binary) << input;
  const std::string cmd = std::string(OSPREY_BINARY) + " tokenize --tokenizer " +
                          testing::deepseek_v3_dir() + " " + args + " < " + in_path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  status = WEXITSTATUS(pclose(pipe));
  return out;
}

TEST(DeepSeekV3, TokenizeCommand) {
  int status = -1;
  EXPECT_EQ(run_cli("", "Hello, my dog is cute\n<｜User｜>hi<｜Assistant｜>\n", status),
            "[19923,14,1026,6397,344,33125]\n[128803,6366,128804]\n");
  EXPECT_EQ(status, 0);
  EXPECT_EQ(run_cli("--decode", "[19923,14,1026,6397,344,33125]\n[201]\n", status),
            "\"Hello, my dog is cute\"\n\"\\n\"\n");
  EXPECT_EQ(status, 0);
  EXPECT_EQ(run_cli("--json-input --add-special-tokens", "\"a\\nb\"\n", status), "[0,67,201,68]\n");
  const std::string bad_id = run_cli("--decode", "[1]\n[999999]\n", status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(bad_id.find("line 2: token id 999999 is not in the vocabulary"), std::string::npos)
      << bad_id;
  const std::string bad_utf8 = run_cli("", "ok\nab\xFF\n", status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(bad_utf8.find("line 2: input is not valid UTF-8"), std::string::npos) << bad_utf8;
  EXPECT_EQ(run_cli("--chat deepseek-v3",
                    R"([{"role":"user","content":"hi"}])"
                    "\n",
                    status),
            "[0,128803,6366,128804]\n");
}

}  // namespace
}  // namespace osprey::tokenizer
