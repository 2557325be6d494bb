// OSPREY_HOST_DEVICE: marks an inline function that both the CUDA kernels and the host code (the
// CPU references the tests compare the kernels' metadata with) compile.
#pragma once

#ifdef __CUDACC__
#define OSPREY_HOST_DEVICE __host__ __device__
#else
#define OSPREY_HOST_DEVICE
#endif
