// The streaming parsers (reasoning_parser, tool_parser) look for markers in text that arrives in
// pieces: a tail that is the start of a marker is held back until the next piece says whether it
// is the marker.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace osprey::server {

// The length of the longest suffix of `s` that is a proper prefix of `marker` (non-empty): the
// bytes to hold back, 0 when no tail could still become `marker`.
inline size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace osprey::server
