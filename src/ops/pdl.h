// The process-wide switch of programmatic dependent launch (ops/cuda/hopper/pdl.cuh): whether
// osprey's kernels are launched with programmatic stream serialisation. On unless OSPREY_PDL=0
// (read once at start); set_pdl switches it for A/B runs in one process (tests, bench step). A
// graph keeps the setting it was captured with. Defined in ops/cuda/hopper/pdl.cu (CUDA builds
// only).
#pragma once

namespace osprey::ops::cuda {

bool pdl_enabled();
void set_pdl(bool on);

}  // namespace osprey::ops::cuda
