// IQ2_XS against Q8_K-style activations (CPU twin: quant/scalar_iq2xs.cpp). A unit is one
// 32-weight sub-block: four 16-bit words (9-bit grid index | 7-bit sign index << 9) and one
// scale nibble per 16 weights, db = d·(2s+1)/8. The 512-point grid (4 KiB) is copied into
// shared memory per thread block: a warp's 32 random lookups then cost a few bank cycles
// instead of up to 32 L1 wavefronts. The sign byte is the 7 stored bits plus their parity.
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Filled once from quant/iq2xs_tables.cpp's kIq2xsGrid (upload_quant_tables in matmul.cu). Defined
// here, not declared: without relocatable device code a __device__ variable lives in the one
// translation unit that uses it, and only matmul.cu includes this header.
__device__ uint64_t g_iq2xs_grid[512];

struct IQ2_XSWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 74;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 512 * 8;
  __device__ static void load_table(uint8_t* shared) {
    auto* grid = reinterpret_cast<uint64_t*>(shared);
    for (int i = threadIdx.x; i < 512; i += blockDim.x) grid[i] = g_iq2xs_grid[i];
  }

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t* table, float (&acc)[NR]) {
    const int b = u >> 3, sub = u & 7;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const float d = f16_bits_to_f32(ld_u16(block));
    uint32_t words[2];
    ld_words_a2<2>(block + 2 + 8 * sub, words);
    const int scale_byte = block[66 + sub];
    const int scale_low = 2 * (scale_byte & 15) + 1, scale_high = 2 * (scale_byte >> 4) + 1;
    const auto* grid = reinterpret_cast<const uint64_t*>(table);
    int v[8];  // the 32 signed values, four per word
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint32_t word = (words[g >> 1] >> (16 * (g & 1))) & 0xffffu;
      const uint64_t point = grid[word & 511];
      const uint32_t sign7 = word >> 9;
      const uint32_t signs = sign7 | ((__popc(sign7) & 1) << 7);
      v[2 * g] = apply_signs4(uint32_t(point), sign_mask4(signs & 15));
      v[2 * g + 1] = apply_signs4(uint32_t(point >> 32), sign_mask4(signs >> 4));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 256 * b + 32 * sub;
        const int4 a0 = ld_i32x4(a), a1 = ld_i32x4(a + 16);
        const int g0 = __dp4a(v[1], a0.y, __dp4a(v[0], a0.x, 0));
        const int g1 = __dp4a(v[3], a0.w, __dp4a(v[2], a0.z, 0));
        const int g2 = __dp4a(v[5], a1.y, __dp4a(v[4], a1.x, 0));
        const int g3 = __dp4a(v[7], a1.w, __dp4a(v[6], a1.z, 0));
        const int scaled = scale_low * (g0 + g1) + scale_high * (g2 + g3);
        // d·d_a·scaled/8: the /8 is exact, folded into the integer's conversion.
        acc[r] = __fmaf_rn(__fmul_rn(d, act.scales(rows[r])[b]), __fmul_rn(float(scaled), 0.125f), acc[r]);
      }
    }
  }
};

}  // namespace strata::compute::cuda::quant_device
