// Scalar kernels (the specification) of Q3_K, Q5_K and IQ4_XS, 256 weights per block, written from
// the block definitions (ggml-common.h; element placement as in dequantize_row_q3_K/q5_K/iq4_xs of
// ggml-quants.c). Dot products take Q8_K activations.
#include "quant/blocks.h"
#include "quant/kernels_more.h"
#include "quant/kquant_scales.h"
#include "util/fp16.h"

namespace strata::quant::scalar {
namespace {

// The signed quant (−4..3) of element 16·sub + l of a Q3_K block: the 2 low bits as Q2_K's, minus
// 4 unless bit (4·half + step) of hmask[16·part + l] is set (sub = 8·half + 2·step + part).
int q3_K_quant(const BlockQ3_K& block, int sub, int l) {
  const int half = sub / 8, step = (sub % 8) / 2, part = sub % 2;
  const bool high = (block.hmask[16 * part + l] >> (4 * half + step)) & 1;
  return k2_low_bits(block.qs, sub, l) - (high ? 0 : 4);
}

// The 5-bit quant of element 64·chunk + 32·upper + l of a Q5_K block.
int q5_K_quant(const BlockQ5_K& block, int chunk, int upper, int l) {
  const uint8_t byte = block.qs[32 * chunk + l];
  const int low = upper ? (byte >> 4) : (byte & 15);
  return low | ((block.qh[l] >> (2 * chunk + upper)) & 1) << 4;
}

// Nibble j (j < 32) of IQ4_XS sub-block ib: placed as IQ4_NL's within 16 bytes.
int iq4_xs_index(const BlockIQ4_XS& block, int ib, int j) {
  const uint8_t byte = block.qs[16 * ib + (j % 16)];
  return j < 16 ? (byte & 15) : (byte >> 4);
}

}  // namespace

void dequantize_q3_K(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockQ3_K>(src, dst, n, [](const BlockQ3_K& block, float* y) {
    const float d = f16_to_f32(block.d);
    for (int sub = 0; sub < 16; ++sub) {
      const float dl = d * float(q3_K_scale(block.scales, sub) - 32);
      for (int l = 0; l < 16; ++l) y[16 * sub + l] = dl * float(q3_K_quant(block, sub, l));
    }
  });
}

void dequantize_q5_K(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockQ5_K>(src, dst, n, [](const BlockQ5_K& block, float* y) {
    dequantize_k4_block(
        block, y, [&](int chunk, int upper, int l) { return q5_K_quant(block, chunk, upper, l); });
  });
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockIQ4_XS>(src, dst, n, [](const BlockIQ4_XS& block, float* y) {
    const float d = f16_to_f32(block.d);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * float(iq4_xs_scale(block, ib) - 32);
      for (int j = 0; j < 32; ++j) {
        y[32 * ib + j] = dl * float(kIq4nlValues[iq4_xs_index(block, ib, j)]);
      }
    }
  });
}

float dot_q3_K(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockQ3_K>(w, a, n, [](const BlockQ3_K& block, const BlockQ8_K& act) {
    int64_t scaled = 0;
    for (int sub = 0; sub < 16; ++sub) {
      int isum = 0;
      for (int l = 0; l < 16; ++l) isum += q3_K_quant(block, sub, l) * act.qs[16 * sub + l];
      scaled += int64_t(q3_K_scale(block.scales, sub) - 32) * isum;
    }
    return double(f16_to_f32(block.d)) * act.d * double(scaled);
  });
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockQ5_K>(w, a, n, [](const BlockQ5_K& block, const BlockQ8_K& act) {
    return dot_k4_block(block, act, [&](int chunk, int upper, int l) {
      return q5_K_quant(block, chunk, upper, l);
    });
  });
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockIQ4_XS>(w, a, n, [](const BlockIQ4_XS& block, const BlockQ8_K& act) {
    int64_t scaled = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int isum = 0;
      for (int j = 0; j < 32; ++j) {
        isum += kIq4nlValues[iq4_xs_index(block, ib, j)] * act.qs[32 * ib + j];
      }
      scaled += int64_t(iq4_xs_scale(block, ib) - 32) * isum;
    }
    return double(f16_to_f32(block.d)) * act.d * double(scaled);
  });
}

}  // namespace strata::quant::scalar
