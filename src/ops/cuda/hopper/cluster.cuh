// Thread-block cluster primitives (sm_90): the CTA's rank in its cluster, the cluster-wide
// barrier, the address of a peer CTA's copy of a shared-memory location (mapa), an arrival on a
// peer's mbarrier, the 16-byte asynchronous store into a peer's shared memory whose bytes complete
// on the peer's mbarrier (st.async), and the parity wait that acquires at cluster scope (what a
// peer released into this CTA's shared memory). Distributed shared memory: a kernel launched in
// clusters reads and writes its peers' shared memory through these; the layout of every CTA's
// shared memory is the same, so a peer's copy of a location is mapa(location, peer).
#pragma once

#include <cstdint>

#include "ops/cuda/hopper/wgmma.cuh"

namespace osprey::ops::cuda::hopper {

// This CTA's rank in its cluster (0 .. cluster size − 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The cluster barrier, split: every thread of every CTA of the cluster arrives (release: its
// earlier writes, shared memory of peers included, become visible), then waits (acquire) until
// all have. Not .aligned: threads of one warp may reach it on different paths.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// The shared::cluster address of CTA `rank`'s copy of this CTA's shared-memory location p. A
// CTA's window is contiguous: mapa(p, rank) + k is the peer's copy of p + k.
__device__ __forceinline__ uint32_t mapa(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}

// One arrival on the mbarrier at shared::cluster address `bar` (a peer's, from mapa), released at
// cluster scope: the peer's waiter that acquires the phase sees this thread's earlier accesses
// done (a consumer's wgmma reads of the peer's tile: the producer may overwrite it).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar)
               : "memory");
}

// 16 bytes to shared::cluster address dst (a peer's, from mapa), completing 16 bytes of the
// transaction count of the mbarrier at shared::cluster address bar (in the same CTA as dst), whose
// phase was armed with mbar_arrive_expect_tx. The thread goes on at once.
__device__ __forceinline__ void st_async_16(uint32_t dst, uint4 v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
}

// Raises the transaction bytes the barrier's current phase waits for by `bytes`, without arriving
// (the bytes a peer's st.async will complete; a peer's bytes may land first: the phase completes
// only once its arrivals are in too).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// mbar_wait (sync.cuh) with cluster-scope acquire: for phases completed by a peer CTA's arrivals
// or st.async bytes, so that what the peer released is visible to this thread.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}

}  // namespace osprey::ops::cuda::hopper
