#include "engine/spec_verify.h"

#include "core/error.h"

namespace osprey {

std::vector<int32_t> verify_drafts(std::span<const int32_t> drafts,
                                   std::span<const int32_t> targets) {
  OSPREY_CHECK(targets.size() == drafts.size() + 1, targets.size(), " target tokens for ",
               drafts.size(), " drafts");
  size_t m = 0;
  while (m < drafts.size() && targets[m] == drafts[m]) ++m;
  return std::vector<int32_t>(targets.begin(), targets.begin() + std::ptrdiff_t(m) + 1);
}

}  // namespace osprey
