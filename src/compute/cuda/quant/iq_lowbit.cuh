// The low-bit IQ types against Q8_K-style activations (CPU twin: quant/scalar/iq_lowbit.cpp):
// IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. A unit is one 32-weight sub-block (four 8-weight
// groups): its index, sign and scale bytes are contiguous or nearly so, and a warp's lanes read
// neighbouring sub-blocks. Each group becomes two words of four signed bytes (grid magnitudes
// with the group's signs applied), dotted exactly with dp4a; the sub-block's odd integer scale
// multiplies the group sums, and d·d_a·scaled·factor (factor 1/8, 1/4 or 1: exact, folded into the integer's
// conversion) is added to the row with one fused multiply-add. The grids (quant/iq_lowbit_tables)
// are copied into shared memory per thread block, as IQ2_XS's (iq2xs.cuh). The XXS types' 7-bit
// sign indices become sign bytes by adding their parity as bit 7, which is kIq2xsSigns.
// The IQ1 types' grid values are signed bytes (−1, 0, 1) and every value carries a ±1/8 delta:
// the unit sums 8·Σ g·a ± Σ a in integers, as the CPU's dot_ternary, and scales by 1/8.
// IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S blocks (66, 82, 98, 110, 50 bytes) keep rows only 2-byte
// aligned: words via ld_u32_a2 / ld_words_a2; IQ1_M's (56) keep them 8-byte aligned.
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Filled from quant/iq_lowbit_tables.cpp (upload_tables<Q> in matmul/*.cu). Defined here, not
// declared: without relocatable device code a __device__ variable lives in the translation unit
// that defines it, so every one that includes this header (matmul.cu and each matmul/*.cu, through
// matmul_plan.cuh) has its own copy, and the file whose kernels read a grid uploads its own copy.
__device__ uint64_t g_iq2xxs_grid[256];
__device__ uint64_t g_iq2s_grid[1024];
__device__ uint32_t g_iq3xxs_grid[256];
__device__ uint32_t g_iq3s_grid[512];
__device__ uint64_t g_iq1s_grid[2048];

template <typename T, int N>
__device__ __forceinline__ void copy_table(uint8_t* shared, const T (&table)[N]) {
  auto* out = reinterpret_cast<T*>(shared);
  for (int i = threadIdx.x; i < N; i += blockDim.x) out[i] = table[i];
}

// kIq2xsSigns[s7]: the 7 stored sign bits plus their parity as bit 7.
__device__ __forceinline__ uint32_t signs_from7(uint32_t s7) { return s7 | ((__popc(s7) & 1u) << 7); }

// An 8-D grid point (8 unsigned magnitudes, byte j = element j) with sign bit j of `signs`
// negating element j, as two words of four signed bytes.
__device__ __forceinline__ void signed_point8(uint64_t point, uint32_t signs, int& v0, int& v1) {
  v0 = apply_signs4(uint32_t(point), sign_mask4(signs & 15u));
  v1 = apply_signs4(uint32_t(point >> 32), sign_mask4((signs >> 4) & 15u));
}

// Σ over the four groups g of the sub-block of dot(v[2g], v[2g+1]; a[8g .. 8g+7]), as g0..g3.
__device__ __forceinline__ void group_dots(const int (&v)[8], const int8_t* a, int (&g)[4]) {
  const int4 a0 = ld_i32x4(a), a1 = ld_i32x4(a + 16);
  g[0] = __dp4a(v[1], a0.y, __dp4a(v[0], a0.x, 0));
  g[1] = __dp4a(v[3], a0.w, __dp4a(v[2], a0.z, 0));
  g[2] = __dp4a(v[5], a1.y, __dp4a(v[4], a1.x, 0));
  g[3] = __dp4a(v[7], a1.w, __dp4a(v[6], a1.z, 0));
}

// IQ2_XXS: sub-block s is the 8 bytes at 2 + 8s: a word of four 8-bit grid indices, then a word
// of four 7-bit sign indices (bits 7g..) and the scale s4 in bits 28-31: db = d·(2·s4 + 1)/8.
struct IQ2_XXSWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 66;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 256 * 8;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq2xxs_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    uint32_t words[2];
    ld_words_a2<2>(block + 2 + 8 * sub, words);
    const int scale = 2 * int(words[1] >> 28) + 1;
    const auto* grid = reinterpret_cast<const uint64_t*>(table);
    int v[8];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint64_t point = grid[(words[0] >> (8 * g)) & 255u];
      signed_point8(point, signs_from7((words[1] >> (7 * g)) & 127u), v[2 * g], v[2 * g + 1]);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        int g[4];
        group_dots(v, act.qs(rows[r]) + 256 * b + 32 * sub, g);
        const int scaled = scale * (g[0] + g[1] + g[2] + g[3]);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.125f), acc[r]);
      }
    }
  }
};

// IQ2_S: sub-block s has the four index low bytes qs[4s ..] (at 2 + 4s), four sign bytes
// qs[32 + 4s ..] (at 34 + 4s, bit j negates element j), qh[s] (at 66 + s, bits 2g..2g+1: the
// index's bits 8-9) and scales[s] (at 74 + s: low nibble for groups 0-1, high for 2-3;
// db = d·(2·nibble + 1)/8). 10-bit indices into a 1024-point grid (8 KiB).
struct IQ2_SWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 82;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 1024 * 8;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq2s_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    const uint32_t indices = ld_u32_a2(block + 2 + 4 * sub);
    const uint32_t signs = ld_u32_a2(block + 34 + 4 * sub);
    const uint32_t high = block[66 + sub];
    const uint32_t scale_byte = block[74 + sub];
    const int scale_low = 2 * int(scale_byte & 15u) + 1, scale_high = 2 * int(scale_byte >> 4) + 1;
    const auto* grid = reinterpret_cast<const uint64_t*>(table);
    int v[8];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t index = ((indices >> (8 * g)) & 255u) | (((high >> (2 * g)) & 3u) << 8);
      signed_point8(grid[index], (signs >> (8 * g)) & 255u, v[2 * g], v[2 * g + 1]);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        int g[4];
        group_dots(v, act.qs(rows[r]) + 256 * b + 32 * sub, g);
        const int scaled = scale_low * (g[0] + g[1]) + scale_high * (g[2] + g[3]);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.125f), acc[r]);
      }
    }
  }
};

// IQ3_XXS: sub-block s has eight 8-bit indices of 4-D points qs[8s ..] (at 2 + 8s; group g uses
// points 2g, 2g+1) and the word qs[64 + 4s ..] (at 66 + 4s) of four 7-bit sign indices and the
// scale s4 in bits 28-31: db = d·(2·s4 + 1)/4.
struct IQ3_XXSWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 98;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 256 * 4;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq3xxs_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    uint32_t indices[2];
    ld_words_a2<2>(block + 2 + 8 * sub, indices);
    const uint32_t sign_word = ld_u32_a2(block + 66 + 4 * sub);
    const int scale = 2 * int(sign_word >> 28) + 1;
    const auto* grid = reinterpret_cast<const uint32_t*>(table);
    int v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {  // point k: elements 4k..4k+3, sign bits 4(k & 1).. of group k/2
      const uint32_t point = grid[(indices[k >> 2] >> (8 * (k & 3))) & 255u];
      const uint32_t signs = signs_from7((sign_word >> (7 * (k >> 1))) & 127u);
      v[k] = apply_signs4(point, sign_mask4((signs >> (4 * (k & 1))) & 15u));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        int g[4];
        group_dots(v, act.qs(rows[r]) + 256 * b + 32 * sub, g);
        const int scaled = scale * (g[0] + g[1] + g[2] + g[3]);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.25f), acc[r]);
      }
    }
  }
};

// IQ3_S: sub-block s has eight index low bytes qs[8s ..] (at 2 + 8s), qh[s] (at 66 + s; bit k is
// bit 8 of point k's index), four sign bytes signs[4s ..] (at 74 + 4s; group g's byte, bit j
// negates element j) and a scale nibble (scales[s/2] at 106 + s/2, low nibble for even s):
// db = d·(1 + 2·nibble). 9-bit indices into a 512-point grid of 4-D points.
struct IQ3_SWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 110;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 512 * 4;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq3s_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    uint32_t indices[2];
    ld_words_a2<2>(block + 2 + 8 * sub, indices);
    const uint32_t high = block[66 + sub];
    const uint32_t signs = ld_u32_a2(block + 74 + 4 * sub);
    const int scale = 1 + 2 * int((block[106 + (sub >> 1)] >> (4 * (sub & 1))) & 15u);
    const auto* grid = reinterpret_cast<const uint32_t*>(table);
    int v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {  // point k: elements 4k..4k+3, sign bits 4(k & 1).. of byte k/2
      const uint32_t index = ((indices[k >> 2] >> (8 * (k & 3))) & 255u) | (((high >> k) & 1u) << 8);
      v[k] = apply_signs4(grid[index], sign_mask4((signs >> (4 * k)) & 15u));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        int g[4];
        group_dots(v, act.qs(rows[r]) + 256 * b + 32 * sub, g);
        const int scaled = scale * (g[0] + g[1] + g[2] + g[3]);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), float(scaled), acc[r]);
      }
    }
  }
};

// IQ1_S: sub-block s has four index low bytes qs[4s ..] (at 2 + 4s) and the u16 qh[s] (at 34 + 2s):
// bits 3g..3g+2 the index's bits 8-10 for group g, bits 12-14 the scale s3 (dl = d·(2·s3 + 1)),
// bit 15 the sign of the sub-block's delta. The delta term uses the activation's two 16-quant sums
// of the sub-block. 11-bit indices into the 2048-point ternary grid (16 KiB).
struct IQ1_SWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 50;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 2048 * 8;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq1s_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    const uint32_t indices = ld_u32_a2(block + 2 + 4 * sub);
    const uint32_t high = ld_u16(block + 34 + 2 * sub);
    const int scale = 2 * int((high >> 12) & 7u) + 1;
    const bool negative = (high & 0x8000u) != 0;
    const auto* grid = reinterpret_cast<const uint64_t*>(table);
    int v[8];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint64_t point = grid[((indices >> (8 * g)) & 255u) | (((high >> (3 * g)) & 7u) << 8)];
      v[2 * g] = int(uint32_t(point));
      v[2 * g + 1] = int(uint32_t(point >> 32));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        int g[4];
        group_dots(v, act.qs(rows[r]) + 256 * b + 32 * sub, g);
        const int32_t* bs = act.sums(rows[r]) + 16 * b + 2 * sub;
        const int delta_sum = negative ? -(bs[0] + bs[1]) : bs[0] + bs[1];
        const int scaled = scale * (8 * (g[0] + g[1] + g[2] + g[3]) + delta_sum);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.125f), acc[r]);
      }
    }
  }
};

// IQ1_M: no d field; the f16 super-scale is the top nibbles of the four u16 scale words (at 48).
// Sub-block s has four index low bytes qs[4s ..] (at 4s) and the bytes qh[2s], qh[2s+1] (one u16
// at 32 + 2s): group g's nibble is its bits 4g..4g+3 (bits 0-2: the index's bits 8-10, bit 3: the
// sign of the group's delta). Scale word s/2 holds 3-bit scales at bit 6(s % 2) (groups 0-1) and
// 6(s % 2) + 3 (groups 2-3): dl = d·(2·s3 + 1). The delta term needs each group's own 8-quant
// activation sum: dp4a against ones.
struct IQ1_MWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 56;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 8;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 2048 * 8;
  __device__ static void load_table(uint8_t* shared) { copy_table(shared, g_iq1s_grid); }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const uint32_t indices = ld_u32(block + 4 * sub);
    const uint32_t high = ld_u16(block + 32 + 2 * sub);
    const uint2 sc = *reinterpret_cast<const uint2*>(block + 48);
    // words w0..w3 = sc.x low, sc.x high, sc.y low, sc.y high; d = their top nibbles, w0's lowest
    const uint32_t d_bits =
        ((sc.x >> 12) & 0xfu) | ((sc.x >> 24) & 0xf0u) | ((sc.y >> 4) & 0xf00u) | ((sc.y >> 16) & 0xf000u);
    const float d = f16_bits_to_f32(uint16_t(d_bits));
    const uint32_t word = (sub < 4 ? sc.x : sc.y) >> (16 * ((sub >> 1) & 1));
    const int shift = 6 * (sub & 1);
    const int scale_low = 2 * int((word >> shift) & 7u) + 1, scale_high = 2 * int((word >> (shift + 3)) & 7u) + 1;
    const auto* grid = reinterpret_cast<const uint64_t*>(table);
    int v[8];
    bool negative[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t nibble = (high >> (4 * g)) & 15u;
      const uint64_t point = grid[((indices >> (8 * g)) & 255u) | ((nibble & 7u) << 8)];
      v[2 * g] = int(uint32_t(point));
      v[2 * g + 1] = int(uint32_t(point >> 32));
      negative[g] = (nibble & 8u) != 0;
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 256 * b + 32 * sub;
        const int4 a0 = ld_i32x4(a), a1 = ld_i32x4(a + 16);
        const int av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        int t[4];  // 8·Σ g·a ± Σ a per group
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          const int dot = __dp4a(v[2 * g + 1], av[2 * g + 1], __dp4a(v[2 * g], av[2 * g], 0));
          const int sum = __dp4a(0x01010101, av[2 * g + 1], __dp4a(0x01010101, av[2 * g], 0));
          t[g] = 8 * dot + (negative[g] ? -sum : sum);
        }
        const int scaled = scale_low * (t[0] + t[1]) + scale_high * (t[2] + t[3]);
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.125f), acc[r]);
      }
    }
  }
};

}  // namespace strata::compute::cuda::quant_device
