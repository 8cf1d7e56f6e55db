// moe_forward on the CPU: a window's rows give the bits each row gives alone on one thread,
// whatever the thread count and window size. Windows of a few rows per thread take the row slices
// (layers/moe.cpp, moe_forward_sliced), the others the split per product; both must agree with
// the row-by-row reference, with a shared expert and without, whether the source delivers the
// experts in one batch or in several, and at widths the combine's 32-column blocks do not divide.
#include "layers/moe.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "quant/quant.h"

namespace strata {
namespace {

struct QuantMatrix {
  std::vector<std::byte> bytes;
  compute::WeightMatrix view;
};

QuantMatrix random_matrix(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  QuantMatrix m;
  const size_t row_size = row_bytes(type, n_in);
  m.bytes.resize(row_size * size_t(n_out));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    for (float& v : row) v = normal(rng);
    std::byte* out = m.bytes.data() + size_t(o) * row_size;
    if (type == GgmlType::F32)
      std::memcpy(out, row.data(), row_size);
    else
      quant::quantize_row(type, row.data(), out, n_in);
  }
  m.view = compute::WeightMatrix::dense(type, n_in, n_out, m.bytes.data());
  return m;
}

// Every expert resident; the published union delivered in batches of at most `per_batch`
// experts (odd positions first, so the batches are not in id order).
class ResidentSource final : public ExpertSource {
 public:
  ResidentSource(const std::vector<ExpertMatrices>& experts, size_t per_batch)
      : experts_(experts), per_batch_(per_batch) {}
  void publish(int /*layer*/, std::span<const int32_t> ids) override {
    pending_.clear();
    for (size_t parity : {1u, 0u})
      for (size_t i = parity; i < ids.size(); i += 2)
        pending_.push_back({int(i), experts_[size_t(ids[i])]});
    next_ = 0;
  }
  std::span<const DeliveredExpert> wait() override {
    const size_t n = std::min(per_batch_, pending_.size() - next_);
    const std::span<const DeliveredExpert> batch(pending_.data() + next_, n);
    next_ += n;
    return batch;
  }

 private:
  const std::vector<ExpertMatrices>& experts_;
  size_t per_batch_;
  std::vector<DeliveredExpert> pending_;
  size_t next_ = 0;
};

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Every window size, thread count and batching of a model of n_embd columns of `type` weights
// against each row alone.
void expect_row_by_row_bits(GgmlType type, int64_t n_embd) {
  constexpr int64_t kFf = 32, kSharedFf = 64, kMaxRows = 40;
  MoeDims dims{};
  dims.n_embd = n_embd;
  dims.n_expert = 16;
  dims.n_expert_used = 4;
  std::mt19937 rng(5);
  std::vector<QuantMatrix> storage;
  auto matrix = [&](int64_t n_in, int64_t n_out) {
    storage.push_back(random_matrix(type, n_in, n_out, rng));
    return storage.size() - 1;
  };
  const size_t router = matrix(n_embd, dims.n_expert);
  const size_t shared_gate = matrix(n_embd, kSharedFf), shared_up = matrix(n_embd, kSharedFf),
               shared_down = matrix(kSharedFf, n_embd);
  std::vector<size_t> expert_parts;
  for (int e = 0; e < dims.n_expert; ++e) {
    expert_parts.push_back(matrix(n_embd, kFf));
    expert_parts.push_back(matrix(n_embd, kFf));
    expert_parts.push_back(matrix(kFf, n_embd));  // one-block rows, as the default model's
  }
  std::vector<ExpertMatrices> experts;
  for (int e = 0; e < dims.n_expert; ++e)
    experts.push_back({storage[expert_parts[size_t(3 * e)]].view,
                       storage[expert_parts[size_t(3 * e + 1)]].view,
                       storage[expert_parts[size_t(3 * e + 2)]].view});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  MoeWeights with_shared;
  with_shared.router = storage[router].view;
  with_shared.shared_gate = storage[shared_gate].view;
  with_shared.shared_up = storage[shared_up].view;
  with_shared.shared_down = storage[shared_down].view;
  with_shared.shared_gate_inp.resize(size_t(n_embd));
  for (float& v : with_shared.shared_gate_inp) v = 0.2f * normal(rng);
  MoeWeights routed_only;
  routed_only.router = with_shared.router;
  std::vector<float> x(static_cast<size_t>(kMaxRows * n_embd));
  for (float& v : x) v = normal(rng);

  for (const MoeWeights* w : {&with_shared, &routed_only}) {
    // The reference: every row alone, one thread, every expert in one batch.
    std::vector<float> want(static_cast<size_t>(kMaxRows * n_embd));
    {
      compute::ThreadPool one(1);
      compute::Workspace ws;
      ResidentSource source(experts, 1000);
      for (int64_t t = 0; t < kMaxRows; ++t)
        moe_forward(one, ws, dims, *w, source, 0, x.data() + t * n_embd, 1,
                    want.data() + t * n_embd);
    }
    for (int threads : {1, 2, 3, 4})
      for (size_t per_batch : {size_t(1000), size_t(3)}) {
        compute::ThreadPool pool(threads);
        compute::Workspace ws;
        ResidentSource source(experts, per_batch);
        for (int64_t n_rows : {1, 2, 4, 5, 8, 16, 17, 32, 33, 40}) {
          // Rows from an offset, so a row's place in the window differs from the reference's.
          const int64_t first = (kMaxRows - n_rows) / 2;
          std::vector<float> got(static_cast<size_t>(n_rows * n_embd), -1.0f);
          moe_forward(pool, ws, dims, *w, source, 0, x.data() + first * n_embd, n_rows, got.data());
          ASSERT_TRUE(same_bits(got.data(), want.data() + first * n_embd, got.size()))
              << threads << " threads, " << n_rows << " rows, batches of " << per_batch
              << (w->has_shared() ? ", shared expert" : ", routed only");
        }
      }
  }
}

TEST(MoeForward, EveryWindowThreadCountAndDeliveryGivesTheRowByRowBits) {
  expect_row_by_row_bits(GgmlType::Q8_0, 128);
}

// The combine sums 32 columns at a time in registers: widths with a rest (72 = 2 blocks + 8) and
// under one block (20) take its column-by-column tail (F32 weights: any width).
TEST(MoeForward, WidthsOffTheCombinesBlockGiveTheRowByRowBits) {
  for (int64_t n_embd : {72, 20}) {
    SCOPED_TRACE(n_embd);
    expect_row_by_row_bits(GgmlType::F32, n_embd);
  }
}

}  // namespace
}  // namespace strata
