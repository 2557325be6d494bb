// wgmma (sm_90a warpgroup MMA) wrappers: shared-memory matrix descriptors for the 128-byte
// swizzled layout, the fence / commit / wait of an async MMA group, and the BF16 shapes osprey's
// kernels use. Generated shapes: BF16 m64n32k16 and m64n64k16 (K-major B; m64n64k16 also with A
// from registers) and m64n256k16 (MN-major B; A from shared memory or registers); e4m3
// m64n16k32, m64n32k32, m64n64k32, m64n256k32 (both K-major: FP8 rows are 128 K values = one SW128
// row).
//
// The 128-byte swizzled tile (SW128), the one layout osprey's kernels keep in shared memory: a
// region of R rows × 64 bf16 (128 B a row), 1024-byte aligned; element (r, c) at byte
//   r·128 + ((c/8 XOR r%8) · 16) + (c%8)·2            (sw128_offset below)
// A matrix wider than 64 columns is a sequence of such regions ("chunks", R·128 bytes apart).
// Descriptors (PTX ISA "Matrix Descriptor Format"): start address >> 4 in bits 0–13, leading
// byte offset >> 4 in 16–29, stride byte offset >> 4 in 32–45, swizzle mode in 62–63 (1 = 128 B).
//   K-major operand (rows = M or N, 64 contiguous K values a row): SBO = 1024 (next 8 rows), LBO
//     unused (1); the k-th 16-wide K step starts 32·k bytes into the row.
//   MN-major operand (rows = K, 64 contiguous N values a row): LBO = the chunk size (next 64 N
//     values), SBO = 1024 (next 8 K rows); the k-th 16-deep K step starts 16·k rows (2048·k B) in.
// Accumulator fragment of m64nNk16 (thread t of the warpgroup, warp w = t/32, lane l): d[i] holds
// row 16·w + l/4 + 8·((i/2) % 2), column 8·(i/4) + 2·(l%4) + i%2.
#pragma once

#include <cstdint>

namespace osprey::ops::cuda::hopper {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of element (r, c), c < 64, in a 1024-aligned SW128 region of 16-bit values.
__device__ __forceinline__ uint32_t sw128_offset(uint32_t r, uint32_t c) {
  return r * 128u + ((((c >> 3) ^ r) & 7u) << 4) + (c & 7u) * 2u;
}

__device__ __forceinline__ uint64_t sw128_desc(const void* start, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = smem_u32(start);
  uint64_t d = uint64_t((a & 0x3FFFFu) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFFu) << 16;
  d |= uint64_t((sbo >> 4) & 0x3FFFu) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across an async MMA.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The wrappers below, one line each: an accumulator of N F32 registers d[0 .. N) ("+f" operands
// %0 .. %N−1, listed in the template as OSPREY_WGMMA_R<N>), then the A operand (a descriptor, or
// the 4 registers of the A fragment), the B descriptor and the accumulate predicate, whose operand
// numbers (IA, IB, IP: N, N + 1, N + 2; or N .. N + 3, N + 4, N + 5) the macro cannot count.
#define OSPREY_WGMMA_D8(o)                                                            \
  "+f"(d[o]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), \
      "+f"(d[(o) + 5]), "+f"(d[(o) + 6]), "+f"(d[(o) + 7])
#define OSPREY_WGMMA_D16(o) OSPREY_WGMMA_D8(o), OSPREY_WGMMA_D8((o) + 8)
#define OSPREY_WGMMA_D32(o) OSPREY_WGMMA_D16(o), OSPREY_WGMMA_D16((o) + 16)
#define OSPREY_WGMMA_D_8 OSPREY_WGMMA_D8(0)
#define OSPREY_WGMMA_D_16 OSPREY_WGMMA_D16(0)
#define OSPREY_WGMMA_D_32 OSPREY_WGMMA_D32(0)
#define OSPREY_WGMMA_D_128 \
  OSPREY_WGMMA_D32(0), OSPREY_WGMMA_D32(32), OSPREY_WGMMA_D32(64), OSPREY_WGMMA_D32(96)
#define OSPREY_WGMMA_R_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define OSPREY_WGMMA_R_16 OSPREY_WGMMA_R_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define OSPREY_WGMMA_R_32 \
  OSPREY_WGMMA_R_16       \
      ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define OSPREY_WGMMA_R_128                                                                      \
  OSPREY_WGMMA_R_32                                                                             \
      ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
      "%49, %50, %51, %52, %53, %54, %55"                                                       \
      ", %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, " \
      "%73, %74, %75, %76, %77, %78, %79"                                                       \
      ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
      "%97, %98, %99, %100, %101"                                                               \
      ", %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, "  \
      "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// NAME(d, desc_a, desc_b, accumulate): A and B in shared memory. TAIL: the immediates after the
// predicate (scale-a, scale-b, and for 16-bit types transpose-a, transpose-b).
#define OSPREY_WGMMA_SS(NAME, N, INSTR, IA, IB, IP, TAIL)                                       \
  __device__ __forceinline__ void NAME(float(&d)[N], uint64_t desc_a, uint64_t desc_b,          \
                                       bool accumulate) {                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP ", 0;\n" INSTR " {" OSPREY_WGMMA_R_##N \
                 "}, %" IA ", %" IB ", p, " TAIL ";\n}\n"                                       \
                 : OSPREY_WGMMA_D_##N                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));                             \
  }
// NAME(d, a, desc_b, accumulate): A from registers (a[0..3], operands IA .. IA + 3 listed in A4).
#define OSPREY_WGMMA_RS(NAME, N, INSTR, A4, IB, IP, TAIL)                                          \
  __device__ __forceinline__ void NAME(float(&d)[N], const uint32_t(&a)[4], uint64_t desc_b,       \
                                       bool accumulate) {                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP ", 0;\n" INSTR " {" OSPREY_WGMMA_R_##N    \
                 "}, {" A4 "}, %" IB ", p, " TAIL ";\n}\n"                                         \
                 : OSPREY_WGMMA_D_##N                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate))); \
  }

// D[64×32] (+)= A[64×16] · B[16×32], BF16, B K-major; accumulate = false overwrites D.
OSPREY_WGMMA_SS(wgmma_m64n32k16_bf16_ss, 16, "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16",
                "16", "17", "18", "1, 1, 0, 0")
// D[64×64] (+)= A[64×16] · B[16×64], BF16, B K-major.
OSPREY_WGMMA_SS(wgmma_m64n64k16_bf16_ss, 32, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                "32", "33", "34", "1, 1, 0, 0")
// D[64×256] (+)= A[64×16] · B[16×256], BF16, B MN-major (transposed: N contiguous).
OSPREY_WGMMA_SS(wgmma_m64n256k16_bf16_ss_tb, 128,
                "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "128", "129", "130",
                "1, 1, 0, 1")
// The same two shapes with F16 operands (the FP8 decode's f16 variant: e4m3 → f16 is exact).
OSPREY_WGMMA_SS(wgmma_m64n32k16_f16_ss, 16, "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16",
                "16", "17", "18", "1, 1, 0, 0")
OSPREY_WGMMA_SS(wgmma_m64n256k16_f16_ss_tb, 128,
                "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", "128", "129", "130",
                "1, 1, 0, 1")
// A from registers: the m16n8k16 A fragment of each warp's 16 rows (a[0] = (row l/4, k 2·(l%4) +
// {0,1}), a[1] = row + 8, a[2] = k + 8, a[3] = both). An accumulator of m64nNk16 converted to
// BF16 pairs in register order is this fragment: d[8k .. 8k + 7] give the A registers of the k-th
// 16-wide K step.
// D[64×64] (+)= A[64×16] · B[16×64], BF16, B K-major.
OSPREY_WGMMA_RS(wgmma_m64n64k16_bf16_rs, 32, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                "%32, %33, %34, %35", "36", "37", "1, 1, 0")
// D[64×256] (+)= A[64×16] · B[16×256], BF16, B MN-major.
OSPREY_WGMMA_RS(wgmma_m64n256k16_bf16_rs_tb, 128,
                "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "%128, %129, %130, %131",
                "132", "133", "1, 1, 1")
// e4m3 A and B in shared memory, both K-major (FP8 wgmma has no transpose), F32 accumulators:
// D[64×N] (+)= A[64×32] · B[32×N] for N = 16, 32, 64, 256.
OSPREY_WGMMA_SS(wgmma_m64n16k32_e4m3_ss, 8, "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3",
                "8", "9", "10", "1, 1")
OSPREY_WGMMA_SS(wgmma_m64n32k32_e4m3_ss, 16, "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3",
                "16", "17", "18", "1, 1")
OSPREY_WGMMA_SS(wgmma_m64n64k32_e4m3_ss, 32, "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3",
                "32", "33", "34", "1, 1")
OSPREY_WGMMA_SS(wgmma_m64n256k32_e4m3_ss, 128,
                "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3", "128", "129", "130",
                "1, 1")

#undef OSPREY_WGMMA_SS
#undef OSPREY_WGMMA_RS

}  // namespace osprey::ops::cuda::hopper
