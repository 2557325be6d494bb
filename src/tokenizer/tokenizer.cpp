#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

// Encode states kept for reuse; more concurrent callers than this allocate and drop their own.
constexpr size_t kMaxPooledStates = 64;

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<EncodeState> Tokenizer::Impl::acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (!pool.empty()) {
      auto state = std::move(pool.back());
      pool.pop_back();
      return state;
    }
  }
  auto state = std::make_unique<EncodeState>();
  state->pre = pre_tokenizer->make_scratch();
  return state;
}

void Tokenizer::Impl::release(std::unique_ptr<EncodeState> state) {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool.size() < kMaxPooledStates) pool.push_back(std::move(state));
}

void Tokenizer::Impl::encode_text(std::string_view text, EncodeState& state,
                                  std::vector<TokenId>& ids) const {
  pre_tokenizer->split(text, *state.pre, state.pieces);
  for (std::string_view piece : state.pieces) model->encode_piece(piece, state.words, ids);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, ids, options);
  return ids;
}

void Tokenizer::encode_into(std::string_view text, std::vector<TokenId>& ids,
                            const EncodeOptions& options) const {
  if (const size_t bad = utf8_first_invalid(text); bad != std::string_view::npos) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const auto byte = static_cast<unsigned char>(text[bad]);
    const char hex[3] = {kHex[byte >> 4], kHex[byte & 15], '\0'};
    fail("input is not valid UTF-8: the bytes at offset ", bad, " (0x", hex,
         "...) are not a valid character");
  }
  Impl& im = *impl_;
  if (options.add_special_tokens) ids.insert(ids.end(), im.prefix_ids.begin(), im.prefix_ids.end());

  std::unique_ptr<EncodeState> state = im.acquire();
  struct Release {
    Impl& im;
    std::unique_ptr<EncodeState>& state;
    ~Release() { im.release(std::move(state)); }
  } release{im, state};

  auto& raw = state->raw_segments;
  raw.clear();
  if (options.parse_added_tokens) {
    im.added.split(text, AddedVocabulary::Stage::kRaw, raw);
  } else if (!text.empty()) {
    raw.push_back({0, text.size(), -1});
  }
  const bool split_normalized =
      options.parse_added_tokens && im.added.has_tokens(AddedVocabulary::Stage::kNormalized);
  for (const auto& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (!im.normalizer) {
      im.encode_text(piece, *state, ids);
      continue;
    }
    std::string& normalized = state->normalized;
    normalized.assign(piece);
    im.normalizer->normalize(normalized);
    if (!split_normalized) {
      im.encode_text(normalized, *state, ids);
      continue;
    }
    auto& inner = state->normalized_segments;
    inner.clear();
    im.added.split(normalized, AddedVocabulary::Stage::kNormalized, inner);
    for (const auto& s : inner) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        im.encode_text(std::string_view(normalized).substr(s.begin, s.end - s.begin), *state, ids);
      }
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), im.suffix_ids.begin(), im.suffix_ids.end());
}

bool Tokenizer::is_known(TokenId id) const {
  return id >= 0 && id < id_limit() && impl_->decode_kind[id] != 0;
}

bool Tokenizer::is_special(TokenId id) const {
  return is_known(id) && impl_->decode_kind[id] == 3;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (!is_known(id)) {
    fail("token id ", id, " is not in the vocabulary of this tokenizer (ids are 0..",
         id_limit() - 1, ")");
  }
  const auto& off = impl_->decode_offsets;
  return std::string_view(impl_->decode_data).substr(off[id], off[id + 1] - off[id]);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (TokenId id : ids) {
    std::string_view b = token_bytes(id);
    if (options.skip_special_tokens && impl_->decode_kind[id] == 3) continue;
    bytes.append(b);
  }
  if (utf8_is_valid(bytes)) return bytes;
  std::string text;
  text.reserve(bytes.size() + 8);
  append_utf8_lossy(bytes, text);
  return text;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* t = impl_->added.find(token)) return t->id;
  bool all_mapped = false;
  const std::string bytes = byte_level_to_bytes(token, &all_mapped);
  if (!all_mapped) return std::nullopt;
  return impl_->model->bytes_to_id(bytes);
}

TokenId Tokenizer::id_limit() const {
  return static_cast<TokenId>(impl_->decode_kind.size());
}
std::optional<TokenId> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<TokenId> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const AddedVocabulary& Tokenizer::added_vocabulary() const {
  return impl_->added;
}

}  // namespace osprey::tokenizer
