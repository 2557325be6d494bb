#include "bench/url.h"

#include <charconv>

#include "core/error.h"

namespace osprey::bench {

BaseUrl parse_base_url(const std::string& url) {
  std::string_view u = url;
  if (u.starts_with("https://"))
    fail("--base-url '", url, "': https is not supported; use http:// (or a local TLS proxy)");
  if (u.starts_with("http://"))
    u.remove_prefix(7);
  else if (u.find("://") != std::string_view::npos)
    fail("--base-url '", url, "': only http:// URLs are supported");
  BaseUrl b;
  const size_t slash = u.find('/');
  std::string_view hostport = u.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = u.substr(slash);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    b.prefix = std::string(path);
  }
  // [v6]:port, host:port or host
  std::string_view host = hostport, port;
  if (hostport.starts_with("[")) {
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) fail("--base-url '", url, "': unclosed '[' in the host");
    host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] == ':')
      port = hostport.substr(close + 2);
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  } else {
    b.port = 80;
  }
  if (host.empty()) fail("--base-url '", url, "': no host");
  b.host = std::string(host);
  if (!port.empty()) {
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p <= 0 || p > 65535)
      fail("--base-url '", url, "': bad port '", port, "'");
    b.port = p;
  }
  return b;
}

}  // namespace osprey::bench
