// The loaded model's bound on its MLA latent cache values (ops/mla.h).
#include <atomic>

#include "core/error.h"
#include "ops/mla.h"

namespace osprey::ops {

namespace {
std::atomic<float> g_latent_bound{0.0f};  // 0: unknown
}  // namespace

void set_mla_latent_bound(float bound) {
  OSPREY_CHECK(bound >= 0.0f, "the MLA latent bound must be >= 0 (or +inf), not ", bound);
  g_latent_bound.store(bound);
}
float mla_latent_bound() {
  return g_latent_bound.load();
}

}  // namespace osprey::ops
