// Helpers shared by the model tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace osprey::testing {

// OSPREY_TEST_DATA in the environment overrides the build's path (binaries carried to the GPU
// machine).
inline std::string data_dir() {
  const char* e = std::getenv("OSPREY_TEST_DATA");
  return e && *e ? e : OSPREY_TEST_DATA;
}
inline std::string model_dir(const std::string& name) {
  return data_dir() + "/models/" + name;
}

// max |a − b| / max |b|: the relative error of a against the reference b.
inline double rel_error(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}
inline double rel_error(const Tensor& a, const Tensor& b) {
  OSPREY_CHECK(a.numel() == b.numel(), "rel_error sizes ", shape_str(a.shape), " ",
               shape_str(b.shape));
  return rel_error(a.f32(), b.f32(), a.numel());
}

inline std::vector<int32_t> to_ids(const Tensor& t) {
  const int32_t* p = t.ptr<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

}  // namespace osprey::testing
