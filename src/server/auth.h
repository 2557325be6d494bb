// The API key check of /v1 routes.
#pragma once

#include <string_view>

namespace osprey::server {

// Whether an Authorization header value is "Bearer <key>". The comparison takes a time that
// depends only on the header's length, never on how many leading bytes match, so the key cannot
// be guessed byte by byte from response times.
bool bearer_matches(std::string_view authorization, std::string_view key);

}  // namespace osprey::server
