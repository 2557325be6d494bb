// The `normalizer` of tokenizer.json: Sequence, NFC, NFD, NFKC, NFKD (through ICU), Lowercase,
// Strip, Prepend, Replace. Other kinds stop loading with an error that names them.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace osprey::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites valid UTF-8 `text` in place.
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer described by `config`; nullptr for JSON null or an empty Sequence.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

}  // namespace osprey::tokenizer
