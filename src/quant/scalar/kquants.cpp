// Scalar dequantization and dot products (the specification) of the K-quants Q2_K, Q3_K, Q4_K, Q5_K
// and Q6_K (256 weights per block), written straight from the block definitions in
// shared/reference/gguf-and-quants.md §4 (element placement as in dequantize_row_q3_K/q5_K of
// ggml-quants.c). Dot products take Q8_K activations. Quantizers: scalar/kquants_quantize.cpp.
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/scalar/kquant_scales.h"
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

}  // namespace

void dequantize_q2_K(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockQ2_K>(src, dst, n, [](const BlockQ2_K& block, float* y) {
    const float d = f16_to_f32(block.d);
    const float dmin = f16_to_f32(block.dmin);
    for (int sub = 0; sub < 16; ++sub) {
      const uint8_t scale = block.scales[sub];
      const float dl = d * (scale & 15);
      const float ml = dmin * (scale >> 4);
      for (int l = 0; l < 16; ++l) y[16 * sub + l] = dl * k2_low_bits(block.qs, sub, l) - ml;
    }
  });
}

// The 4-bit quant of element 64·chunk + 32·upper + l (l < 32) of a Q4_K block: low nibbles for
// upper = 0, high nibbles for upper = 1.
static int q4_K_quant(const BlockQ4_K& block, int chunk, int upper, int l) {
  const uint8_t byte = block.qs[32 * chunk + l];
  return upper ? (byte >> 4) : (byte & 15);
}

void dequantize_q4_K(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockQ4_K>(src, dst, n, [](const BlockQ4_K& block, float* y) {
    dequantize_k4_block(
        block, y, [&](int chunk, int upper, int l) { return q4_K_quant(block, chunk, upper, l); });
  });
}

// The 6-bit quant of element 128·half + 32·quarter + l (l < 32) of a Q6_K block, in [0, 63].
static int q6_K_quant(const BlockQ6_K& block, int half, int quarter, int l) {
  const uint8_t low_byte = block.ql[64 * half + 32 * (quarter & 1) + l];
  const int low = quarter < 2 ? (low_byte & 15) : (low_byte >> 4);
  const int high = (block.qh[32 * half + l] >> (2 * quarter)) & 3;
  return low | (high << 4);
}

void dequantize_q6_K(const void* src, float* dst, int64_t n) {
  dequantize_k_blocks<BlockQ6_K>(src, dst, n, [](const BlockQ6_K& block, float* y) {
    const float d = f16_to_f32(block.d);
    for (int half = 0; half < 2; ++half) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        for (int l = 0; l < 32; ++l) {
          const int element = 128 * half + 32 * quarter + l;
          const float scale = d * block.scales[element / 16];
          y[element] = scale * (q6_K_quant(block, half, quarter, l) - 32);
        }
      }
    }
  });
}

float dot_q2_K(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockQ2_K>(w, a, n, [](const BlockQ2_K& block, const BlockQ8_K& act) {
    // Element e lies in sub-block e / 16, whose scale byte is scales[e / 16].
    int64_t scaled = 0;
    int64_t mins = 0;
    for (int sub = 0; sub < 16; ++sub) {
      int isum = 0;
      for (int l = 0; l < 16; ++l) isum += k2_low_bits(block.qs, sub, l) * act.qs[16 * sub + l];
      scaled += int64_t(block.scales[sub] & 15) * isum;
      mins += int64_t(block.scales[sub] >> 4) * act.bsums[sub];
    }
    return k_block_dot(block.d, block.dmin, act.d, scaled, mins);
  });
}

float dot_q4_K(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockQ4_K>(w, a, n, [](const BlockQ4_K& block, const BlockQ8_K& act) {
    return dot_k4_block(block, act, [&](int chunk, int upper, int l) {
      return q4_K_quant(block, chunk, upper, l);
    });
  });
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  return dot_k_blocks<BlockQ6_K>(w, a, n, [](const BlockQ6_K& block, const BlockQ8_K& act) {
    int64_t scaled = 0;
    for (int half = 0; half < 2; ++half) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        for (int part = 0; part < 2; ++part) {
          const int first = 128 * half + 32 * quarter + 16 * part;
          int isum = 0;
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            isum +=
                (q6_K_quant(block, half, quarter, l) - 32) * act.qs[128 * half + 32 * quarter + l];
          }
          scaled += int64_t(block.scales[first / 16]) * isum;
        }
      }
    }
    return double(f16_to_f32(block.d)) * act.d * double(scaled);
  });
}

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

}  // namespace strata::quant::scalar
