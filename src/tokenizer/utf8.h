// UTF-8 helpers shared by encode (validation), decode (lossy conversion) and the streaming
// detokenizer (holding back a character split across tokens). Validity follows RFC 3629 (no
// overlongs, no surrogates, nothing above U+10FFFF); invalid input is replaced the way
// String::from_utf8_lossy and the WHATWG TextDecoder do: one U+FFFD per "maximal subpart".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace osprey::tokenizer {

enum class Utf8Status {
  kComplete,   // a whole valid character of `length` bytes
  kInvalid,    // `length` bytes (>= 1) form one maximal invalid subpart: one U+FFFD
  kTruncated,  // the `length` bytes left are a valid but unfinished prefix of a character
};

struct Utf8Step {
  Utf8Status status;
  size_t length;
};

// Classifies the character starting at text[0]; text must not be empty.
Utf8Step utf8_step(std::string_view text);

// Byte offset of the first byte that is not part of a valid character, or npos when all valid.
size_t utf8_first_invalid(std::string_view text);

inline bool utf8_is_valid(std::string_view text) {
  return utf8_first_invalid(text) == std::string_view::npos;
}

// Appends `bytes` to `out`, replacing each maximal invalid subpart (and an unfinished character
// at the end) with U+FFFD.
void append_utf8_lossy(std::string_view bytes, std::string& out);

// Number of code points in valid UTF-8 text.
size_t utf8_length(std::string_view text);

// Length in bytes of the UTF-8 sequence led by byte `lead` (1 for ASCII or an invalid lead).
inline size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Encodes code point `cp` (<= U+10FFFF, not a surrogate) as UTF-8 onto `out`.
void append_utf8(char32_t cp, std::string& out);

// Decodes the valid UTF-8 character at text[0]; sets `length` to its size in bytes.
char32_t decode_utf8(std::string_view text, size_t& length);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace osprey::tokenizer
