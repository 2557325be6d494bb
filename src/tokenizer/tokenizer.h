// A byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (+ tokenizer_config.json
// beside it when present): DeepSeek-V3/R1/V3.1/V3.2, GPT-2, Llama 3, Qwen and the like.
//
//   encode: UTF-8 text -> added-token cut -> normalizer -> pre-tokenizer (regex splits) -> BPE
//   decode: ids -> raw bytes of each token (added tokens as their text) -> UTF-8, invalid bytes
//           replaced by U+FFFD
//
// A Tokenizer is immutable once loaded; encode and decode may be called from many threads at once
// (each call borrows a per-thread scratch state from a small pool).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/token_id.h"

namespace osprey::tokenizer {

struct EncodeOptions {
  // Add what the tokenizer adds around a text (bos when tokenizer_config.json says
  // add_bos_token, or the post_processor's template).
  bool add_special_tokens = false;
  // Recognise added-token text (e.g. "<｜User｜>") in the input as those tokens. When false the
  // whole input is ordinary text.
  bool parse_added_tokens = true;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  // Loads PATH: a tokenizer.json file, or a folder containing one. tokenizer_config.json beside
  // it is read when present. Throws osprey::Error (missing file, corrupt JSON, unsupported kind).
  static Tokenizer load(const std::filesystem::path& path);
  // From the two files' contents; `tokenizer_config_json` may be empty.
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Throws osprey::Error when `text` is not valid UTF-8 (the message gives the byte offset).
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Appends to `ids` instead of returning a new vector.
  void encode_into(std::string_view text, std::vector<TokenId>& ids,
                   const EncodeOptions& options = {}) const;

  // Throws osprey::Error for an id that is no token of this tokenizer.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // The raw bytes token `id` stands for (an added token: its text). Throws for an unknown id.
  std::string_view token_bytes(TokenId id) const;
  bool is_known(TokenId id) const;
  bool is_special(TokenId id) const;
  // The id of an added token by its text, else of a vocabulary entry as tokenizer.json writes it
  // (byte-level alphabet, e.g. "Ġthe").
  std::optional<TokenId> token_to_id(std::string_view token) const;

  // One past the largest token id.
  TokenId id_limit() const;
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  const std::string& bos_token() const;  // empty when none
  const std::string& eos_token() const;
  const AddedVocabulary& added_vocabulary() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::tokenizer
