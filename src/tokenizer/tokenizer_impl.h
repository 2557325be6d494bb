// Internal: the parts of a loaded Tokenizer (shared by tokenizer.cpp and tokenizer_load.cpp).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {

// What one encode call needs to itself; pooled and reused.
struct EncodeState {
  std::unique_ptr<PreTokenizer::Scratch> pre;
  BpeModel::WordCache words;
  std::vector<std::string_view> pieces;
  std::vector<AddedVocabulary::Segment> raw_segments, normalized_segments;
  std::string normalized;
};

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;

  // Ids added around a text by encode(add_special_tokens).
  std::vector<TokenId> prefix_ids, suffix_ids;
  std::string bos_token, eos_token;
  std::optional<TokenId> bos_id, eos_id;

  // Bytes of every id for decoding (added tokens' text overriding the model's entry).
  std::string decode_data;
  std::vector<uint32_t> decode_offsets;  // [id_limit + 1]
  std::vector<uint8_t> decode_kind;      // [id_limit]: 0 unknown, 1 model token, 2 added, 3 special

  std::mutex pool_mutex;
  std::vector<std::unique_ptr<EncodeState>> pool;

  std::unique_ptr<EncodeState> acquire();
  void release(std::unique_ptr<EncodeState> state);
  void encode_text(std::string_view text, EncodeState& state, std::vector<TokenId>& ids) const;
  void build_decode_table();
};

}  // namespace osprey::tokenizer
