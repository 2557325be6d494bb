// http://host[:port][/prefix] → its parts. Only plain HTTP (the benchmark talks to a local or
// in-cluster server; put a TLS proxy in front for anything else).
#pragma once

#include <string>

namespace osprey::bench {

struct BaseUrl {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string prefix;  // path before the endpoint, without a trailing '/'; often empty
};

// Throws osprey::Error for https:// or a malformed URL.
BaseUrl parse_base_url(const std::string& url);

}  // namespace osprey::bench
