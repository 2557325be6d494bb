#include "engine/speculative_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey {

SpeculativeConfig SpeculativeConfig::parse(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  const char* usage = "; expected e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("--speculative-config is not valid JSON (", e.what(), ")", usage);
  }
  if (!j.is_object()) fail("--speculative-config must be a JSON object", usage);
  for (const auto& [key, value] : j.items())
    if (key != "method" && key != "num_speculative_tokens")
      fail("--speculative-config: unknown key '", key,
           "' (osprey reads \"method\" and \"num_speculative_tokens\")");
  if (!j.contains("method")) fail("--speculative-config needs \"method\"", usage);
  if (!j["method"].is_string()) fail("--speculative-config: \"method\" must be a string", usage);
  const std::string method = j["method"].get<std::string>();
  if (method != "mtp" && method != "deepseek_mtp")
    fail("--speculative-config: method '", method,
         "' is not supported (osprey drafts with the model's own MTP layer: \"mtp\")");
  c.method = "mtp";
  if (!j.contains("num_speculative_tokens"))
    fail("--speculative-config needs \"num_speculative_tokens\"", usage);
  const nlohmann::json& k = j["num_speculative_tokens"];
  if (!k.is_number_integer())
    fail("--speculative-config: \"num_speculative_tokens\" must be an integer, got ", k.dump());
  const int64_t n = k.get<int64_t>();
  if (n < 1 || n > kMaxSpeculativeTokens)
    fail("--speculative-config: \"num_speculative_tokens\" must be in [1, ", kMaxSpeculativeTokens,
         "], got ", n);
  c.num_speculative_tokens = int(n);
  return c;
}

}  // namespace osprey
