// A large mixed text for tokenizer benchmarks, the same on every machine: English prose, code,
// Chinese, Japanese, Korean, Arabic, Cyrillic, emoji, numbers and whitespace runs, in documents
// separated by a blank line ("\n\n"). Built from a fixed-seed generator (the splitmix64 sequence
// and plain modulo, no library distributions, so every standard library gives the same text).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::bench {

std::string make_bench_text(size_t bytes);

// Documents of `text` split at every "\n\n" (empty ones dropped), as the Python side does.
std::vector<std::string_view> split_documents(std::string_view text);

}  // namespace osprey::bench
