#include "server/auth.h"

#include <cstdint>
#include <string>

namespace osprey::server {

bool bearer_matches(std::string_view authorization, std::string_view key) {
  const std::string expected = "Bearer " + std::string(key);
  // Every byte of the header is compared (against the expected byte at the same position, or a
  // byte of it when the header is longer), and the differences are OR-ed: no early exit.
  unsigned diff = authorization.size() != expected.size();
  for (size_t i = 0; i < authorization.size(); ++i)
    diff |= unsigned(uint8_t(authorization[i]) ^ uint8_t(expected[i % expected.size()]));
  return diff == 0;
}

}  // namespace osprey::server
