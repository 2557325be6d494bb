// Host-side counters and a switch of the sm90 MLA path, for tests and the kernel benchmark (plain
// C++, no CUDA types).
#pragma once

#include <cstdint>

namespace osprey::ops::cuda {

// How many times the split-KV plan kernel has been launched in this process (split_kv.cuh): a
// repeated batch fingerprint must not launch it, a changed one must.
int64_t mla_plan_builds();
// How many absorbed-attention calls the tensor-core (sm90) decode kernel has served.
int64_t mla_sm90_calls();
// Routes absorbed attention to the CUDA-core kernels when false (default true): the benchmark's
// baseline and a second reference for the tests. Returns the previous setting.
bool set_mla_sm90_enabled(bool enabled);

}  // namespace osprey::ops::cuda
