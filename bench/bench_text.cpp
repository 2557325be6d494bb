#include "bench_text.h"

#include <cstdint>

namespace osprey::bench {
namespace {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  template <size_t N>
  const char* pick(const char* const (&items)[N]) {
    return items[below(N)];
  }
};

const char* const kWords[] = {
    "the",           "of",        "and",      "to",          "in",        "is",
    "that",          "it",        "was",      "for",         "on",        "are",
    "with",          "as",        "they",     "be",          "at",        "this",
    "have",          "from",      "or",       "had",         "by",        "word",
    "but",           "what",      "some",     "we",          "can",       "out",
    "other",         "were",      "all",      "there",       "when",      "up",
    "use",           "your",      "how",      "said",        "an",        "each",
    "which",         "their",     "time",     "will",        "way",       "about",
    "many",          "then",      "them",     "would",       "like",      "so",
    "these",         "her",       "long",     "make",        "thing",     "see",
    "him",           "two",       "has",      "look",        "more",      "day",
    "could",         "go",        "come",     "did",         "number",    "sound",
    "most",          "people",    "over",     "know",        "water",     "than",
    "call",          "first",     "who",      "may",         "down",      "side",
    "been",          "now",       "find",     "attention",   "latency",   "throughput",
    "tokenizer",     "inference", "DeepSeek", "Transformer", "GPU",       "kernel",
    "memory",        "bandwidth", "it's",     "don't",       "we're",     "Hello",
    "World",         "Model",     "Paris",    "London",      "September", "international",
    "responsibility"};
const char* const kPunct[] = {".", ",", "!", "?", ";", ":", " -", "...", "\"", "'", ")", " ("};
const char* const kCode[] = {
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.attn(h)\n",
    "for (int i = 0; i < n; ++i) {\n  acc += a[i] * b[i];\n}\n",
    "const result = await fetch(`/api/v1/items?id=${id}`);\nconsole.log(result.status);\n",
    "#include <vector>\nstd::vector<float> q(n_heads * head_dim);  // [n_heads, head_dim]\n",
    "SELECT name, COUNT(*) FROM users WHERE created_at >= '2024-01-01' GROUP BY name;\n",
    "{\"model\": \"deepseek-v3\", \"max_tokens\": 512, \"temperature\": 0.7, \"stream\": true}\n",
    "    if err != nil {\n        return nil, fmt.Errorf(\"open %s: %w\", path, err)\n    }\n",
    "<div class=\"container\"><p id='intro'>Hello &amp; welcome</p></div>\n"};
const char* const kChinese[] = {"深度学习模型在自然语言处理任务中表现出色。",
                                "我们今天去公园散步，天气非常好！",
                                "这个算法的时间复杂度是线性的，空间复杂度也很低。",
                                "北京是中华人民共和国的首都。",
                                "请把文件发送到我的邮箱，谢谢。",
                                "大规模语言模型的推理速度取决于显存带宽。"};
const char* const kJapanese[] = {"東京は日本の首都です。", "今日はとても良い天気ですね。",
                                 "トークナイザーの性能を測定します。", "ありがとうございました！"};
const char* const kKorean[] = {"안녕하세요, 만나서 반갑습니다.", "오늘 날씨가 정말 좋네요.",
                               "한국어 텍스트를 처리하는 예제입니다."};
const char* const kOther[] = {"مرحبا بالعالم، كيف حالك اليوم؟",
                              "Привет, как дела? Всё хорошо.",
                              "Γειά σου κόσμε",
                              "Café naïve résumé über Straße",
                              "emoji 😀🚀🔥 👍🏽 👨‍👩‍👧‍👦 🇺🇸",
                              "नमस्ते दुनिया"};

void append_prose(SplitMix64& rng, std::string& out) {
  const size_t sentences = 1 + rng.below(6);
  for (size_t s = 0; s < sentences; ++s) {
    const size_t words = 4 + rng.below(16);
    for (size_t w = 0; w < words; ++w) {
      if (w) out += (rng.below(12) == 0) ? ", " : " ";
      std::string word = rng.pick(kWords);
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      out += word;
    }
    out += rng.pick(kPunct);
    out += ' ';
  }
}

void append_numbers(SplitMix64& rng, std::string& out) {
  const size_t n = 1 + rng.below(8);
  for (size_t i = 0; i < n; ++i) {
    out += std::to_string(rng.next() % (rng.below(2) ? 1000 : 100000000));
    if (rng.below(3) == 0) {
      out += '.';
      out += std::to_string(rng.below(100));
    }
    out += rng.below(2) ? ", " : " ";
  }
}

}  // namespace

std::string make_bench_text(size_t bytes) {
  SplitMix64 rng{20240601};
  std::string out;
  out.reserve(bytes + 4096);
  while (out.size() < bytes) {
    const size_t parts = 1 + rng.below(6);
    for (size_t p = 0; p < parts; ++p) {
      switch (rng.below(10)) {
        case 0:
        case 1:
        case 2:
        case 3:
          append_prose(rng, out);
          break;
        case 4:
          out += rng.pick(kCode);
          break;
        case 5:
          out += rng.pick(kChinese);
          break;
        case 6:
          out += rng.below(2) ? rng.pick(kJapanese) : rng.pick(kKorean);
          break;
        case 7:
          out += rng.pick(kOther);
          out += ' ';
          break;
        case 8:
          append_numbers(rng, out);
          break;
        default:
          out += std::string(1 + rng.below(8), ' ');
          out += rng.below(2) ? "\n" : "\t";
          break;
      }
      if (rng.below(3) == 0) out += '\n';
    }
    out += "\n\n";
  }
  return out;
}

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) docs.push_back(text.substr(pos, end - pos));
    pos = end + 2;
  }
  return docs;
}

}  // namespace osprey::bench
