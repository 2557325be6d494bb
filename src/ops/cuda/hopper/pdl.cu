// The process-wide PDL switch of hopper/pdl.cuh: on unless OSPREY_PDL=0.
#include <atomic>
#include <cstdlib>

#include "ops/cuda/hopper/pdl.cuh"

namespace osprey::ops::cuda {
namespace {
std::atomic<bool> g_pdl{[] {
  const char* e = std::getenv("OSPREY_PDL");
  return !(e && e[0] == '0');
}()};
}  // namespace

bool pdl_enabled() {
  return g_pdl.load(std::memory_order_relaxed);
}
void set_pdl(bool on) {
  g_pdl.store(on, std::memory_order_relaxed);
}

}  // namespace osprey::ops::cuda
