// A small byte-level BPE tokenizer.json for the benchmark tests (ids 0..255 = bytes, merges after,
// one special token last).
#pragma once

#include <string>

namespace osprey::bench::testing {

std::string tiny_tokenizer_json();
// Writes it to a temporary folder; returns the file's path.
std::string write_tiny_tokenizer();

}  // namespace osprey::bench::testing
