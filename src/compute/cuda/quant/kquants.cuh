// K-quants (256-weight blocks) against Q8_K-style activations (CPU twins: quant/scalar/kquants.cpp,
// quant/scalar/kquant_scales.h): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Each unit's integer
// sums (scaled quants, and the mins term from the activation's 16-quant sums) are exact; the
// unit adds d·d_a·scaled − dmin·d_a·mins to the row with two fused multiply-adds.
#pragma once

#include "compute/cuda/quant/common.cuh"

namespace strata::compute::cuda::quant_device {

// Q4_K: a unit is one 64-weight chunk c (sub-blocks 2c and 2c+1 share the 32 bytes qs[32c..]).
struct Q4_KWeights {
  static constexpr int kRowsPerWarp = 4;  // at T = 1 (bench_cuda_matvec: 0.32 -> 0.44 of HBM for Q4_K)
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 144;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 16;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  // 6-bit scale and min of sub-block `sub` (unpack_q4_K_scales), from the 12 scale bytes as words.
  // Bytes k of the three words (k = sub mod 4) by shifts, never a run-time index into s (which
  // put s in local memory in the staged kernel).
  __device__ static void scale_min(const uint32_t (&s)[3], int sub, int& scale, int& min) {
    const int shift = 8 * (sub & 3);
    const int b0 = int((s[0] >> shift) & 0xffu), b1 = int((s[1] >> shift) & 0xffu), b2 = int((s[2] >> shift) & 0xffu);
    if (sub < 4) {  // bytes sub and sub + 4
      scale = b0 & 63;
      min = b1 & 63;
    } else {  // bytes sub + 4 (low and high nibble), sub − 4 and sub (top two bits)
      scale = (b2 & 15) | ((b0 >> 6) << 4);
      min = (b2 >> 4) | ((b1 >> 6) << 4);
    }
  }

  struct Decoded {
    uint32_t q[8];
    int sc0, m0, sc1, m1;
    float d, dmin;
  };
  struct Act {
    int4 low0, low1, high0, high1;  // quants of sub-blocks 2c (low nibbles) and 2c+1 (high)
    int sum_low, sum_high;          // their 32-quant sums
    float d;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const int b = u >> 2, chunk = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const uint32_t dd = ld_u32(block);
    out.d = f16_bits_to_f32(uint16_t(dd & 0xffffu));
    out.dmin = f16_bits_to_f32(uint16_t(dd >> 16));
    const uint32_t s[3] = {ld_u32(block + 4), ld_u32(block + 8), ld_u32(block + 12)};
    scale_min(s, 2 * chunk, out.sc0, out.m0);
    scale_min(s, 2 * chunk + 1, out.sc1, out.m1);
    const uint4* qp = reinterpret_cast<const uint4*>(block + 16 + 32 * chunk);
    const uint4 qa = qp[0], qb = qp[1];
    out.q[0] = qa.x; out.q[1] = qa.y; out.q[2] = qa.z; out.q[3] = qa.w;
    out.q[4] = qb.x; out.q[5] = qb.y; out.q[6] = qb.z; out.q[7] = qb.w;
    return out;
  }
  template <class View>
  __device__ static Act load_act(const View& act, int row, int u) {
    const int b = u >> 2, chunk = u & 3;
    const int8_t* a = act.qs_at(row, 256 * b + 64 * chunk);
    const int32_t* bs = act.sums(row) + 16 * b + 4 * chunk;
    return Act{ld_i32x4(a), ld_i32x4(a + 16), ld_i32x4(a + 32), ld_i32x4(a + 48), bs[0] + bs[1], bs[2] + bs[3],
               act.scales(row)[b]};
  }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    const auto nibble_dot = [](const uint32_t* q, int4 a, int shift, int sum) {
      sum = __dp4a(int((q[0] >> shift) & 0x0f0f0f0fu), a.x, sum);
      sum = __dp4a(int((q[1] >> shift) & 0x0f0f0f0fu), a.y, sum);
      sum = __dp4a(int((q[2] >> shift) & 0x0f0f0f0fu), a.z, sum);
      return __dp4a(int((q[3] >> shift) & 0x0f0f0f0fu), a.w, sum);
    };
    const int low = nibble_dot(w.q + 4, a.low1, 0, nibble_dot(w.q, a.low0, 0, 0));
    const int high = nibble_dot(w.q + 4, a.high1, 4, nibble_dot(w.q, a.high0, 4, 0));
    const int scaled = w.sc0 * low + w.sc1 * high;
    const int mins = w.m0 * a.sum_low + w.m1 * a.sum_high;
    const float t = __fmaf_rn(__fmul_rn(w.d, a.d), float(scaled), acc);
    return __fmaf_rn(-__fmul_rn(w.dmin, a.d), float(mins), t);
  }
};

// Q6_K: a unit is one 32-weight quarter q of half h (u = 4h + q): elements 128h + 32q + l.
struct Q6_KWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 210;
  static constexpr int kUnitsPerBlock = 8;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    int v[8];  // signed 6-bit values q − 32, four per word
    int scale0, scale1;
    float d;
  };
  struct Act {
    int4 a0, a1;
    float d;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const int b = u >> 3, half = (u >> 2) & 1, quarter = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    uint32_t ql[8], qh[8];
    ld_words_a2<8>(block + 64 * half + 32 * (quarter & 1), ql);
    ld_words_a2<8>(block + 128 + 32 * half, qh);
    const int low_shift = quarter < 2 ? 0 : 4, high_shift = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t low = (ql[i] >> low_shift) & 0x0f0f0f0fu;
      const uint32_t high = ((qh[i] >> high_shift) & 0x03030303u) << 4;
      out.v[i] = int(__vsub4(low | high, 0x20202020u));
    }
    const uint16_t sw = ld_u16(block + 192 + 8 * half + 2 * quarter);
    out.scale0 = int(int8_t(sw & 0xffu));
    out.scale1 = int(int8_t(sw >> 8));
    out.d = f16_bits_to_f32(ld_u16(block + 208));
    return out;
  }
  __device__ static Act load_act(const ActView& act, int row, int u) {
    const int b = u >> 3;
    const int8_t* a = act.qs(row) + 256 * b + 32 * (u & 7);
    return Act{ld_i32x4(a), ld_i32x4(a + 16), act.scales(row)[b]};
  }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    int s0 = __dp4a(w.v[0], a.a0.x, 0);
    s0 = __dp4a(w.v[1], a.a0.y, s0);
    s0 = __dp4a(w.v[2], a.a0.z, s0);
    s0 = __dp4a(w.v[3], a.a0.w, s0);
    int s1 = __dp4a(w.v[4], a.a1.x, 0);
    s1 = __dp4a(w.v[5], a.a1.y, s1);
    s1 = __dp4a(w.v[6], a.a1.z, s1);
    s1 = __dp4a(w.v[7], a.a1.w, s1);
    const int scaled = w.scale0 * s0 + w.scale1 * s1;
    return __fmaf_rn(__fmul_rn(w.d, a.d), float(scaled), acc);
  }
};

// Q2_K: a unit is 16 bytes qs[32h + 16p ..] (u = 2h + p), holding sub-blocks 8h + 2s + p
// (s = 0..3) at bit 2s: 64 weights.
struct Q2_KWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 84;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 4;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    uint32_t q[4];
    int scale_byte[4];
    float d, dmin;
  };
  struct Act {
    int4 a[4];   // the quants of sub-blocks 8h + 2s + p, s = 0..3
    int sum[4];  // their 16-quant sums
    float d;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const int b = u >> 2, half = (u >> 1) & 1, part = u & 1;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const uint8_t* q = block + 16 + 32 * half + 16 * part;
#pragma unroll
    for (int i = 0; i < 4; ++i) out.q[i] = ld_u32(q + 4 * i);
    const uint32_t dd = ld_u32(block + 80);
    out.d = f16_bits_to_f32(uint16_t(dd & 0xffffu));
    out.dmin = f16_bits_to_f32(uint16_t(dd >> 16));
#pragma unroll
    for (int s = 0; s < 4; ++s) out.scale_byte[s] = block[8 * half + 2 * s + part];
    return out;
  }
  __device__ static Act load_act(const ActView& act, int row, int u) {
    const int b = u >> 2, half = (u >> 1) & 1, part = u & 1;
    const int8_t* a = act.qs(row) + 256 * b;
    const int32_t* bs = act.sums(row) + 16 * b;
    Act out;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int sub = 8 * half + 2 * s + part;
      out.a[s] = ld_i32x4(a + 16 * sub);
      out.sum[s] = bs[sub];
    }
    out.d = act.scales(row)[b];
    return out;
  }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    int scaled = 0, mins = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      int isum = __dp4a(int((w.q[0] >> (2 * s)) & 0x03030303u), a.a[s].x, 0);
      isum = __dp4a(int((w.q[1] >> (2 * s)) & 0x03030303u), a.a[s].y, isum);
      isum = __dp4a(int((w.q[2] >> (2 * s)) & 0x03030303u), a.a[s].z, isum);
      isum = __dp4a(int((w.q[3] >> (2 * s)) & 0x03030303u), a.a[s].w, isum);
      scaled += (w.scale_byte[s] & 15) * isum;
      mins += (w.scale_byte[s] >> 4) * a.sum[s];
    }
    const float t = __fmaf_rn(__fmul_rn(w.d, a.d), float(scaled), acc);
    return __fmaf_rn(-__fmul_rn(w.dmin, a.d), float(mins), t);
  }
};

// Q5_K: as Q4_K (a unit is one 64-weight chunk c: sub-blocks 2c and 2c+1, the 32 bytes
// qs[32c..]) with the fifth bits from qh: bit 2c of qh[l] tops element 64c + l (low nibble), bit
// 2c+1 element 64c + 32 + l (high nibble). Block {d, dmin, scales[12], qh[32], qs[128]}: 176
// bytes, so a 16-byte-aligned row stays 16-byte aligned; every lane reads all 32 qh bytes.
struct Q5_KWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 176;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 16;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  template <int NR>
  __device__ static void unit(const uint8_t* row, int u, const ActView& act, const int (&rows)[NR],
                              int nr, const uint8_t*, float (&acc)[NR]) {
    const int b = u >> 2, chunk = u & 3;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    const uint32_t dd = ld_u32(block);
    const float d = f16_bits_to_f32(uint16_t(dd & 0xffffu));
    const float dmin = f16_bits_to_f32(uint16_t(dd >> 16));
    const uint32_t s[3] = {ld_u32(block + 4), ld_u32(block + 8), ld_u32(block + 12)};
    int sc0, m0, sc1, m1;
    Q4_KWeights::scale_min(s, 2 * chunk, sc0, m0);
    Q4_KWeights::scale_min(s, 2 * chunk + 1, sc1, m1);
    const uint4* hp = reinterpret_cast<const uint4*>(block + 16);
    const uint4 ha = hp[0], hb = hp[1];
    const uint32_t qh[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
    const uint4* qp = reinterpret_cast<const uint4*>(block + 48 + 32 * chunk);
    const uint4 qa = qp[0], qb = qp[1];
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    int lo[8], hi[8];  // the unsigned 5-bit quants of sub-blocks 2c (lo) and 2c+1 (hi), four per word
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo[i] = int((q[i] & 0x0f0f0f0fu) | (((qh[i] >> (2 * chunk)) & 0x01010101u) << 4));
      hi[i] = int(((q[i] >> 4) & 0x0f0f0f0fu) | (((qh[i] >> (2 * chunk + 1)) & 0x01010101u) << 4));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nr) {
        const int8_t* a = act.qs(rows[r]) + 256 * b + 64 * chunk;
        int low = 0, high = 0;
#pragma unroll
        for (int i = 0; i < 8; i += 4) {
          const int4 al = ld_i32x4(a + 4 * i), ah = ld_i32x4(a + 32 + 4 * i);
          low = __dp4a(lo[i], al.x, low);
          low = __dp4a(lo[i + 1], al.y, low);
          low = __dp4a(lo[i + 2], al.z, low);
          low = __dp4a(lo[i + 3], al.w, low);
          high = __dp4a(hi[i], ah.x, high);
          high = __dp4a(hi[i + 1], ah.y, high);
          high = __dp4a(hi[i + 2], ah.z, high);
          high = __dp4a(hi[i + 3], ah.w, high);
        }
        const int32_t* bs = act.sums(rows[r]) + 16 * b + 4 * chunk;
        const int scaled = sc0 * low + sc1 * high;
        const int mins = m0 * (bs[0] + bs[1]) + m1 * (bs[2] + bs[3]);
        const float da = act.scales(rows[r])[b];
        float t = __fmaf_rn(__fmul_rn(d, da), float(scaled), acc[r]);
        acc[r] = __fmaf_rn(-__fmul_rn(dmin, da), float(mins), t);
      }
    }
  }
};

// Q3_K: the unit layout of Q2_K: 16 bytes qs[32h + 16p ..] (u = 2h + p) holding the low two bits
// of sub-blocks k = 8h + 2s + p (s = 0..3) at bit 2s, with their third bits in hmask[16p ..] at
// bit 4h + s (set: the quant is low bits, clear: low bits − 4): 64 weights. Signed 6-bit scales
// biased by 32 (q3_K_scale in quant/blocks.h). Block {hmask[32], qs[64], scales[12], d}: 110
// bytes, so rows are only 2-byte aligned: 32-bit words through ld_words_a2.
struct Q3_KWeights {
  static constexpr int kBlockElems = 256;
  static constexpr int kBlockBytes = 110;
  static constexpr int kUnitsPerBlock = 4;
  static constexpr GgmlType kActivation = GgmlType::Q8_K;
  static constexpr int kRowAlign = 2;  // bytes: the widest aligned load
  static constexpr int kTableBytes = 0;
  __device__ static void load_table(uint8_t*) {}

  struct Decoded {
    int v[4][4];   // v[s][i]: signed quants (−4..3) of sub-block k = 8h + 2s + p, elements 4i..4i+3
    int scale[4];  // q3_K_scale(k) − 32
    float d;
  };
  struct Act {
    int4 a[4];  // the quants of sub-blocks 8h + 2s + p, s = 0..3
    float d;
  };

  __device__ static Decoded decode(const uint8_t* row, int u, const uint8_t*) {
    Decoded out;
    const int b = u >> 2, half = (u >> 1) & 1, part = u & 1;
    const uint8_t* block = row + size_t(b) * kBlockBytes;
    uint32_t q[4], hm[4], sc[3];
    ld_words_a2<4>(block + 32 + 32 * half + 16 * part, q);
    ld_words_a2<4>(block + 16 * part, hm);
    ld_words_a2<3>(block + 96, sc);
    out.d = f16_bits_to_f32(ld_u16(block + 108));
    auto byte = [&](int i) { return int((sc[i >> 2] >> (8 * (i & 3))) & 0xffu); };
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int k = 8 * half + 2 * s + part;
      const int low = (byte(k & 7) >> (4 * half)) & 15;  // k < 8: byte k bits 0-3; else byte k − 8 bits 4-7
      const int high = (byte(8 + (k & 3)) >> (2 * (k >> 2))) & 3;
      out.scale[s] = (low | (high << 4)) - 32;
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t low = (q[i] >> (2 * s)) & 0x03030303u;
        const uint32_t third = ((hm[i] >> (4 * half + s)) & 0x01010101u) << 2;
        out.v[s][i] = int(__vsub4(low | third, 0x04040404u));
      }
    }
    return out;
  }
  template <class View>
  __device__ static Act load_act(const View& act, int row, int u) {
    const int b = u >> 2, half = (u >> 1) & 1, part = u & 1;
    Act out;
#pragma unroll
    for (int s = 0; s < 4; ++s) out.a[s] = ld_i32x4(act.qs_at(row, 256 * b + 16 * (8 * half + 2 * s + part)));
    out.d = act.scales(row)[b];
    return out;
  }
  __device__ static float dot(const Decoded& w, const Act& a, float acc) {
    int scaled = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      int isum = __dp4a(w.v[s][0], a.a[s].x, 0);
      isum = __dp4a(w.v[s][1], a.a[s].y, isum);
      isum = __dp4a(w.v[s][2], a.a[s].z, isum);
      isum = __dp4a(w.v[s][3], a.a[s].w, isum);
      scaled += w.scale[s] * isum;
    }
    return __fmaf_rn(__fmul_rn(w.d, a.d), float(scaled), acc);
  }
};

}  // namespace strata::compute::cuda::quant_device
