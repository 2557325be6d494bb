// Verification of draft tokens (speculative decoding; Leviathan et al. 2023, Chen et al. 2023).
//
// A sequence brings its next known token t and K drafts d_1..d_K; the main model's step gives
// K + 1 target distributions p_0..p_K (row j conditioned on t, d_1..d_j, after every sampling
// transform of the request). Rejection sampling accepts d_{j+1} with probability
// min(1, p_j(d) / q_j(d)) and otherwise emits a token from norm(max(0, p_j − q_j)) and stops; if
// all K are accepted, a bonus token is drawn from p_K. Every emitted token then has exactly the
// target's distribution.
//
// osprey's drafts are greedy (the MTP layer's argmax), so q_j is one-hot at d_{j+1}. Then
//   accept with probability p_j(d),  residual norm(max(0, p_j − δ_d)) = p_j restricted to ≠ d,
// which is precisely what drawing y_j ~ p_j and comparing does: P(y_j = d) = p_j(d), and
// y_j | y_j ≠ d ~ p_j restricted to ≠ d. So each row is sampled by the ordinary sampler (its own
// uniform: sampling_uniform(seed, output length + j)), and the emitted tokens are y_0, ..., y_m
// where m is the number of leading rows whose y_j equals the draft. Greedy requests are the
// temperature-0 case: the matching prefix plus the target's next argmax (the bonus token).
// Because row j uses the uniform plain decoding would use for the same output position, a seeded
// request gives the same tokens with and without speculation (up to the logits' rounding).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace osprey {

// The tokens a verified sequence emits: targets [K + 1] are the rows' sampled tokens, drafts [K]
// the proposals. Returns targets[0..m] where m = the number of leading j with targets[j] ==
// drafts[j] (so 1 to K + 1 tokens: m accepted drafts and the token after them).
std::vector<int32_t> verify_drafts(std::span<const int32_t> drafts,
                                   std::span<const int32_t> targets);

}  // namespace osprey
