#include "engine/tokenizer_decoder.h"

#include "tokenizer/detokenizer.h"

namespace osprey {

namespace {
class Detok : public TextDecoder {
 public:
  Detok(const tokenizer::Tokenizer& t, bool skip_special)
      : t_(t), d_(t, tokenizer::DecodeOptions{skip_special}) {}
  // A model row with no token (DeepSeek's vocabulary is padded past the tokenizer's ids)
  // decodes to nothing rather than failing the step.
  std::string push(int32_t token) override {
    return t_.is_known(token) ? d_.step(tokenizer::TokenId(token)) : std::string();
  }
  std::string finish() override { return d_.finish(); }

 private:
  const tokenizer::Tokenizer& t_;
  tokenizer::IncrementalDetokenizer d_;
};
}  // namespace

TextDecoderFactory make_text_decoder_factory(const tokenizer::Tokenizer& tok) {
  return [&tok](bool skip_special) { return std::make_unique<Detok>(tok, skip_special); };
}

}  // namespace osprey
