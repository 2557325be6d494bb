#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

bool is_continuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

// The range allowed for the second byte of a sequence led by `lead` (RFC 3629, table 3-7 of the
// Unicode standard); the third and fourth bytes are always 80..BF.
void second_byte_range(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
}

}  // namespace

Utf8Step utf8_step(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char lead = p[0];
  if (lead < 0x80) return {Utf8Status::kComplete, 1};
  if (lead < 0xC2 || lead > 0xF4) return {Utf8Status::kInvalid, 1};
  const size_t need = utf8_sequence_length(lead);
  unsigned char lo, hi;
  second_byte_range(lead, lo, hi);
  for (size_t i = 1; i < need; ++i) {
    if (i >= text.size()) return {Utf8Status::kTruncated, i};
    const unsigned char c = p[i];
    const bool ok = i == 1 ? (c >= lo && c <= hi) : is_continuation(c);
    if (!ok) return {Utf8Status::kInvalid, i};
  }
  return {Utf8Status::kComplete, need};
}

size_t utf8_first_invalid(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= n) {
      unsigned long long word;
      __builtin_memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = utf8_step(text.substr(i));
    if (step.status != Utf8Status::kComplete) return i;
    i += step.length;
  }
  return std::string_view::npos;
}

void append_utf8_lossy(std::string_view bytes, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step step = utf8_step(bytes.substr(i));
    if (step.status == Utf8Status::kComplete) {
      out.append(bytes.data() + i, step.length);
    } else {
      out.append(kReplacementCharacter);
    }
    i += step.length;
  }
}

size_t utf8_length(std::string_view text) {
  size_t count = 0;
  for (char c : text) count += !is_continuation(static_cast<unsigned char>(c));
  return count;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t decode_utf8(std::string_view text, size_t& length) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  length = utf8_sequence_length(p[0]);
  switch (length) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

}  // namespace osprey::tokenizer
