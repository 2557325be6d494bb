// The GPT-2 byte-level alphabet: each of the 256 byte values is shown as one printable code point
// (printable Latin-1 bytes as themselves, the rest as U+0100 + n), so that BPE vocabularies are
// strings. osprey keeps every token as its raw bytes; this map is used only when loading
// tokenizer.json (vocab and merges are written in the alphabet) and by `token_to_text` helpers.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace osprey::tokenizer {

// The code point that stands for byte `b`.
char32_t byte_to_unicode(unsigned char b);

// The byte that code point `cp` stands for, or nullopt when `cp` is not in the alphabet.
std::optional<unsigned char> unicode_to_byte(char32_t cp);

// Maps a token string written in the alphabet back to raw bytes. A string containing a code point
// outside the alphabet is returned unchanged (its UTF-8 bytes), as Hugging Face's ByteLevel
// decoder does; `all_mapped` (when given) tells which case applied.
std::string byte_level_to_bytes(std::string_view token, bool* all_mapped = nullptr);

// Writes raw bytes in the alphabet (the inverse of byte_level_to_bytes for mapped strings).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace osprey::tokenizer
