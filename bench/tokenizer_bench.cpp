// Encode throughput of osprey's tokenizer on one thread.
//
//   bench_tokenizer --tokenizer PATH [--text FILE | --bytes N] [--write-text FILE] [--repeat R]
//
// The text (a file, or the built-in mixed text of N bytes, default 8 MB) is split into documents
// at "\n\n"; each document is encoded on its own ("documents", the prompt-like case), then the
// whole text in one call ("whole"). Prints MB/s (10^6 bytes of UTF-8 input per second, best of
// R runs), tokens/s and the token count (equal counts across implementations are a cheap check
// that they agree). --write-text saves the text for bench/tokenizer_vs_hf.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench_text.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tk = osprey::tokenizer;

namespace {

struct Result {
  double seconds;
  size_t tokens;
};

template <typename F>
Result best_of(int repeat, F&& run) {
  Result best{1e30, 0};
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t tokens = run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best.seconds) best = {s, tokens};
  }
  return best;
}

void report(const char* mode, size_t bytes, const Result& r) {
  std::printf("osprey %-9s %8.2f MB/s  %10.0f tokens/s  %zu tokens  %.3f s\n", mode,
              bytes / 1e6 / r.seconds, r.tokens / r.seconds, r.tokens, r.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, text_path, write_path;
  size_t bytes = 8'000'000;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_tokenizer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer")
      tokenizer_path = value();
    else if (a == "--text")
      text_path = value();
    else if (a == "--write-text")
      write_path = value();
    else if (a == "--bytes")
      bytes = std::stoull(value());
    else if (a == "--repeat")
      repeat = std::max(1, std::stoi(value()));
    else {
      std::fprintf(stderr,
                   "usage: bench_tokenizer --tokenizer PATH [--text FILE | --bytes N] "
                   "[--write-text FILE] [--repeat R]\n");
      return 2;
    }
  }
  if (tokenizer_path.empty()) {
    std::fprintf(stderr, "bench_tokenizer: --tokenizer PATH is required\n");
    return 2;
  }
  try {
    const auto load0 = std::chrono::steady_clock::now();
    const tk::Tokenizer tokenizer = tk::Tokenizer::load(tokenizer_path);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load0).count();
    std::string text;
    if (!text_path.empty()) {
      std::ifstream in(text_path, std::ios::binary);
      if (!in) osprey::fail("cannot open ", text_path);
      std::ostringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    } else {
      text = osprey::bench::make_bench_text(bytes);
    }
    if (!write_path.empty()) std::ofstream(write_path, std::ios::binary) << text;
    const auto docs = osprey::bench::split_documents(text);
    size_t doc_bytes = 0;
    for (auto d : docs) doc_bytes += d.size();
    std::printf("tokenizer %s (loaded in %.2f s); text %zu bytes, %zu documents\n",
                tokenizer_path.c_str(), load_s, text.size(), docs.size());

    std::vector<tk::TokenId> ids;
    const Result per_doc = best_of(repeat, [&] {
      size_t tokens = 0;
      for (auto d : docs) {
        ids.clear();
        tokenizer.encode_into(d, ids);
        tokens += ids.size();
      }
      return tokens;
    });
    report("documents", doc_bytes, per_doc);
    const Result whole = best_of(repeat, [&] {
      ids.clear();
      tokenizer.encode_into(text, ids);
      return ids.size();
    });
    report("whole", text.size(), whole);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
