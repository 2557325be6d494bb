// Errors. Two kinds, kept apart:
//  - osprey::Error: something a user can cause (bad config, corrupt file, bad request). The message
//    says what was wrong and where; callers at the top (CLI, server) print it and carry on or exit.
//  - OSPREY_CHECK: an internal invariant. Fails loudly (abort with file:line) in every build.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace osprey {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates its arguments with operator<<.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Throws osprey::Error with the concatenated message.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

[[noreturn]] inline void check_failed(const char* cond, const char* file, int line,
                                      const std::string& msg) {
  std::fprintf(stderr, "osprey: internal check failed: %s at %s:%d %s\n", cond, file, line,
               msg.c_str());
  std::abort();
}

}  // namespace osprey

#define OSPREY_CHECK(cond, ...)                                                 \
  do {                                                                          \
    if (!(cond))                                                                \
      ::osprey::check_failed(#cond, __FILE__, __LINE__,                         \
                             ::osprey::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
