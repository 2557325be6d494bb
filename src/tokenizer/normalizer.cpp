#include "tokenizer/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;

std::u16string to_utf16(const std::string& text) {
  std::u16string out(text.size() + 1, u'\0');
  int32_t length = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &length,
                text.data(), static_cast<int32_t>(text.size()), &status);
  OSPREY_CHECK(U_SUCCESS(status), "UTF-8 to UTF-16 conversion failed: ", u_errorName(status));
  out.resize(length);
  return out;
}

std::string to_utf8(const std::u16string& text) {
  std::string out(text.size() * 3 + 1, '\0');
  int32_t length = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &length,
              reinterpret_cast<const UChar*>(text.data()), static_cast<int32_t>(text.size()),
              &status);
  OSPREY_CHECK(U_SUCCESS(status), "UTF-16 to UTF-8 conversion failed: ", u_errorName(status));
  out.resize(length);
  return out;
}

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const std::string& form) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") norm_ = unorm2_getNFCInstance(&status);
    if (form == "NFD") norm_ = unorm2_getNFDInstance(&status);
    if (form == "NFKC") norm_ = unorm2_getNFKCInstance(&status);
    if (form == "NFKD") norm_ = unorm2_getNFKDInstance(&status);
    if (U_FAILURE(status) || norm_ == nullptr) {
      fail("cannot load ICU data for the ", form, " normalizer: ", u_errorName(status));
    }
  }
  void normalize(std::string& text) const override {
    bool ascii = true;
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return;  // every normalization form leaves ASCII as it is
    const std::u16string in = to_utf16(text);
    const auto* src = reinterpret_cast<const UChar*>(in.data());
    const auto src_len = static_cast<int32_t>(in.size());
    UErrorCode status = U_ZERO_ERROR;
    if (unorm2_isNormalized(norm_, src, src_len, &status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    const int32_t need = unorm2_normalize(norm_, src, src_len, nullptr, 0, &status);
    std::u16string out(need, u'\0');
    status = U_ZERO_ERROR;
    unorm2_normalize(norm_, src, src_len, reinterpret_cast<UChar*>(out.data()), need, &status);
    OSPREY_CHECK(U_SUCCESS(status), "ICU normalization failed: ", u_errorName(status));
    text = to_utf8(out);
  }

 private:
  const UNormalizer2* norm_ = nullptr;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    const std::u16string in = to_utf16(text);
    UErrorCode status = U_ZERO_ERROR;
    const auto* src = reinterpret_cast<const UChar*>(in.data());
    const auto len = static_cast<int32_t>(in.size());
    const int32_t need = u_strToLower(nullptr, 0, src, len, "", &status);
    std::u16string out(need, u'\0');
    status = U_ZERO_ERROR;
    u_strToLower(reinterpret_cast<UChar*>(out.data()), need, src, len, "", &status);
    OSPREY_CHECK(U_SUCCESS(status), "ICU lowercasing failed: ", u_errorName(status));
    text = to_utf8(out);
  }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    size_t b = 0, e = text.size();
    if (left_)
      while (b < e && is_space(text[b])) ++b;
    if (right_)
      while (e > b && is_space(text[e - 1])) --e;
    text = text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const json& pattern, std::string content) : content_(std::move(content)) {
    if (pattern.contains("String")) {
      regex_ =
          std::make_unique<Regex>(pattern.at("String").get<std::string>(), Regex::Syntax::kLiteral);
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pattern.at("Regex").get<std::string>());
    } else {
      fail("Replace normalizer: pattern must have a \"String\" or \"Regex\" field");
    }
  }
  void normalize(std::string& text) const override {
    Regex::Matcher matcher(*regex_);
    std::string out;
    size_t pos = 0, begin, end;
    while (matcher.find(text, pos, begin, end)) {
      out.append(text, pos, begin - pos);
      out += content_;
      pos = end;
    }
    if (pos == 0) return;
    out.append(text, pos, std::string::npos);
    text = std::move(out);
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : config.at("normalizers")) {
      if (auto n = make_normalizer(step)) steps.push_back(std::move(n));
    }
    if (steps.empty()) return nullptr;
    if (steps.size() == 1) return std::move(steps.front());
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(type);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(config.at("prepend").get<std::string>());
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(config.value("left", true),
                                             config.value("right", true));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(config.at("pattern"),
                                               config.at("content").get<std::string>());
  }
  fail("normalizer type '", type,
       "' is not supported (osprey supports Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
       "Prepend, Replace)");
}

}  // namespace osprey::tokenizer
