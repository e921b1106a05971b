// The warp-level tensor-core instructions the kernels use (PTX ISA, sm_80+), as thin inline
// wrappers. Fragment layouts (lane = 4 * g + t, g = lane / 4, t = lane % 4):
//   mma.m16n8k16 bf16: A regs (row g | g+8, k 2t..2t+1 | +8), B regs (k 2t..2t+1 | +8, col g),
//                      C/D (row g | g+8, cols 2t, 2t+1);
//   mma.m16n8k8 tf32:  A regs (row g | g+8, k t | t+4), B regs (k t | t+4, col g), C/D as above;
//   ldmatrix.x4:       four 8 x 8 matrices of 16-bit elements (= 8 x 4 of 32-bit ones), the
//                      address of row r of matrix j given by lane 8j + r; lane l receives the
//                      32-bit word l % 4 of row l / 4 (with .trans: 16-bit elements (2(l%4), l/4)
//                      and (2(l%4)+1, l/4)).
// The CPU test harness replaces them by emulations with exactly these semantics.
#pragma once

#include <cstdint>

#ifdef PHF_FLOW_CPU_EMULATION
#include "mma_cpu_fake.h"  // tests/kernels/cpu_harness
#endif

namespace phf_flow {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
#ifdef PHF_FLOW_CPU_EMULATION
  phf_emu::ldmatrix_x4(r, smem, false);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
#ifdef PHF_FLOW_CPU_EMULATION
  phf_emu::ldmatrix_x4(r, smem, true);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#endif
}

// c += a · b on a 16 x 8 tile, bf16 operands, fp32 accumulation.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PHF_FLOW_CPU_EMULATION
  phf_emu::mma_sync(c, a, b0, b1, phf_emu::kMmaBf16);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += a · b on a 16 x 8 tile, TF32 operands (fp32 bit patterns with the low 13 bits zero).
__device__ __forceinline__ void mma_tf32_1688(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PHF_FLOW_CPU_EMULATION
  phf_emu::mma_sync(c, a, b0, b1, phf_emu::kMmaTf32);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// x rounded to TF32 (10 stored mantissa bits), to nearest with ties away from zero: the same
// result as cvt.rna.tf32.f32 for finite x, in two integer operations instead of a conversion.
__device__ __forceinline__ float tf32_round(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  bits = (bits + 0x1000u) & 0xffffe000u;
  float out;
  memcpy(&out, &bits, 4);
  return out;
}

}  // namespace phf_flow
