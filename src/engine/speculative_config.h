// `--speculative-config` (vLLM's spelling): the JSON object that turns on speculative decoding.
//   {"method": "mtp", "num_speculative_tokens": K}
// method "mtp" (alias "deepseek_mtp"): DeepSeek's multi-token-prediction layer drafts K tokens
// (1 ≤ K ≤ kMaxSpeculativeTokens), the one MTP layer run K times; the main model verifies them
// in one step (engine/spec_verify.h). Unknown keys are refused, naming them.
#pragma once

#include <string>

namespace osprey {

// The MTP layer is trained one token ahead; each further draft step feeds it its own guess, so
// acceptance falls quickly with depth (SGLang and vLLM use 1 to 3 for DeepSeek).
inline constexpr int kMaxSpeculativeTokens = 3;

struct SpeculativeConfig {
  std::string method;              // "mtp", or empty: off
  int num_speculative_tokens = 0;  // K

  bool enabled() const { return num_speculative_tokens > 0; }
  // Parses the flag's value; throws osprey::Error saying what is wrong (not JSON, not an object,
  // a missing or unknown method, K missing, not an integer or outside [1, 3], an unknown key).
  // An empty string gives the disabled config.
  static SpeculativeConfig parse(const std::string& json);
};

}  // namespace osprey
