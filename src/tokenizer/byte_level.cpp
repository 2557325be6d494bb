#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

bool is_printable_self(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_unicode{};
  // Code points of the alphabet are all below 0x144 (256 + 68 non-printable bytes).
  std::array<int, 0x200> to_byte{};
  Tables() {
    to_byte.fill(-1);
    unsigned next = 0;
    for (unsigned b = 0; b < 256; ++b) {
      const char32_t cp = is_printable_self(b) ? b : 256 + next++;
      to_unicode[b] = cp;
      to_byte[cp] = static_cast<int>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_unicode(unsigned char b) {
  return tables().to_unicode[b];
}

std::optional<unsigned char> unicode_to_byte(char32_t cp) {
  if (cp >= tables().to_byte.size() || tables().to_byte[cp] < 0) return std::nullopt;
  return static_cast<unsigned char>(tables().to_byte[cp]);
}

std::string byte_level_to_bytes(std::string_view token, bool* all_mapped) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const Utf8Step step = utf8_step(token.substr(i));
    std::optional<unsigned char> b;
    if (step.status == Utf8Status::kComplete) {
      size_t len;
      b = unicode_to_byte(decode_utf8(token.substr(i), len));
    }
    if (!b) {
      if (all_mapped) *all_mapped = false;
      return std::string(token);
    }
    out.push_back(static_cast<char>(*b));
    i += step.length;
  }
  if (all_mapped) *all_mapped = true;
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(byte_to_unicode(static_cast<unsigned char>(c)), out);
  return out;
}

}  // namespace osprey::tokenizer
