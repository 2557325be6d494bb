// Hopper synchronisation and data-movement primitives: mbarriers (init, arrive, parity wait),
// named barriers for a subset of the block's warps, the generic → async proxy fence (shared memory
// written by ordinary stores that wgmma reads next), warpgroup register reallocation, and 16- and
// 4-byte cp.async with zero fill, whose completion can arrive on an mbarrier. Each written once;
// every sm_90a kernel of osprey uses these.
#pragma once

#include <cstdint>

#include "ops/cuda/hopper/wgmma.cuh"

namespace osprey::ops::cuda::hopper {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// Makes the initialised barriers visible before any thread uses them (then a block barrier).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the barrier's phase with this parity has completed (a fresh barrier counts its
// phase "1" as completed, so a producer's first wait on parity 1 passes at once).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}

// bar.sync on a named barrier (1..15; 0 is __syncthreads) for `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive on a named barrier: counts this warp's threads toward `threads` without waiting
// (the producer side of a one-way hand-off; the consumer side waits with named_barrier).
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's ordinary shared-memory writes before later async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Warpgroup register reallocation (needs a register cap at kernel entry: __launch_bounds__(n, 1)).
template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// 16-byte global → shared copy that bypasses L1; src_bytes = 0 writes 16 zero bytes (src unread).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// The same, with an L2 prefetch of the 256-byte block around the source (.L2::256B): a gathered
// cache row is 1152 bytes (9 chunks of 128, each taken by 8 threads' 16-byte copies), so the
// first copy to miss brings the row's neighbouring sectors into L2 with it.
__device__ __forceinline__ void cp_async_16_pf256(void* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
}
// 4-byte global → shared copy through L1 (scales); src_bytes = 0 writes 4 zero bytes.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// Arrives on the mbarrier once this thread's earlier cp.async copies have landed, without raising
// the barrier's expected count (.noinc: the init count includes these arrivals). The thread goes
// on at once: several stages' copies stay in flight.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// 16-byte read-only global load through L1 (the non-coherent path: the data does not change
// while the kernel runs), so the rest of its 32-byte sector serves the next load from L1.
__device__ __forceinline__ uint4 ld_nc_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_shared_16(void* p, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace osprey::ops::cuda::hopper
