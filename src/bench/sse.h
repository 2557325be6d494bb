// Server-sent events, incrementally: bytes of a text/event-stream body in, the `data` of each
// complete event out (multi-line data joined with '\n'; comments, `event:` and `id:` lines
// ignored; LF or CRLF line ends).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey::bench {

class SseParser {
 public:
  // Appends to `events` the data of every event completed by `bytes`.
  void feed(std::string_view bytes, std::vector<std::string>& events);
  // At the end of the body: an event not closed by a blank line, if it has data.
  void finish(std::vector<std::string>& events);

 private:
  void line(std::string_view l, std::vector<std::string>& events);
  std::string partial_line_;
  std::string data_;
  bool has_data_ = false;
};

}  // namespace osprey::bench
