// ldmatrix and mma.sync (csrc/warp_mma.cuh) on the host, lane by lane, with the fragment
// layouts of the PTX ISA (tests only). Every lane publishes its registers (or its row address)
// to the warp; each lane then assembles its own result from the other lanes' values, so a
// wrong lane-to-element mapping in the kernels gives wrong numbers here.
//
// Checks: ldmatrix row addresses 16-byte aligned and inside the launch's dynamic shared memory;
// TF32 operands carry no bits below the TF32 mantissa (the kernels must round them).
// Arithmetic model of one mma: exact products and sum (in double) plus the accumulator, then
// one rounding toward zero to fp32 (tensor cores truncate; see csrc/warp_tile.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace phf_emu {

enum MmaKind { kMmaBf16, kMmaTf32 };

inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans) {
  const char* p = static_cast<const char*>(smem);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail("ldmatrix row address not 16-byte aligned");
  if (p < smem_base || p + 16 > smem_base + smem_bytes) fail("ldmatrix row outside the dynamic shared memory");
  const uint64_t mine = reinterpret_cast<uintptr_t>(p);
  const int l = (int)tls_thread.x & 31;
  warp_exchange(&mine, 1, [&](const uint64_t (*slots)[kSlots]) {
    for (int j = 0; j < 4; ++j) {
      if (!trans) {
        const char* row = reinterpret_cast<const char*>(slots[8 * j + l / 4][0]);
        std::memcpy(&r[j], row + 4 * (l % 4), 4);
      } else {  // 16-bit elements (2(l%4), l/4) and (2(l%4)+1, l/4) of matrix j
        uint16_t lo, hi;
        std::memcpy(&lo, reinterpret_cast<const char*>(slots[8 * j + 2 * (l % 4)][0]) + 2 * (l / 4), 2);
        std::memcpy(&hi, reinterpret_cast<const char*>(slots[8 * j + 2 * (l % 4) + 1][0]) + 2 * (l / 4), 2);
        r[j] = (uint32_t)lo | ((uint32_t)hi << 16);
      }
    }
  });
}

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float round_toward_zero(double x) {
  float f = (float)x;
  if (std::fabs((double)f) > std::fabs(x)) f = std::nextafter(f, 0.f);
  return f;
}

// c = RZ(c + a · b) on a 16 x 8 tile; slot layout: a0..a3, b0, b1, c0..c3.
inline void mma_sync(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaKind kind) {
  uint64_t mine[10] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int i = 0; i < 4; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &c[i], 4);
    mine[6 + i] = bits;
  }
  const int l = (int)tls_thread.x & 31, g = l / 4, t = l % 4;
  const int K = kind == kMmaBf16 ? 16 : 8;
  auto a_elem = [&](const uint64_t (*s)[kSlots], int r, int k) -> float {
    if (kind == kMmaBf16) {
      const uint32_t reg = (uint32_t)s[(r % 8) * 4 + (k % 8) / 2][(r / 8) + 2 * (k / 8)];
      return bits_to_float(((reg >> (16 * (k % 2))) & 0xffffu) << 16);
    }
    const uint32_t reg = (uint32_t)s[(r % 8) * 4 + k % 4][(r / 8) + 2 * (k / 4)];
    if (reg & 0x1fffu) fail("TF32 A operand with bits below the TF32 mantissa");
    return bits_to_float(reg);
  };
  auto b_elem = [&](const uint64_t (*s)[kSlots], int k, int n) -> float {
    if (kind == kMmaBf16) {
      const uint32_t reg = (uint32_t)s[n * 4 + (k % 8) / 2][4 + k / 8];
      return bits_to_float(((reg >> (16 * (k % 2))) & 0xffffu) << 16);
    }
    const uint32_t reg = (uint32_t)s[n * 4 + k % 4][4 + k / 4];
    if (reg & 0x1fffu) fail("TF32 B operand with bits below the TF32 mantissa");
    return bits_to_float(reg);
  };
  float out[4];
  warp_exchange(mine, 10, [&](const uint64_t (*s)[kSlots]) {
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
      double acc = (double)c[i];
      for (int k = 0; k < K; ++k) acc += (double)a_elem(s, row, k) * (double)b_elem(s, k, col);
      out[i] = round_toward_zero(acc);
    }
  });
  for (int i = 0; i < 4; ++i) c[i] = out[i];
}

}  // namespace phf_emu
