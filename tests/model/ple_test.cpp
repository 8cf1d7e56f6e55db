// PLE n-gram hashing: constants and row ids against the values published in
// shared/reference/qwen4exp.md §9 and §14 (computed independently of this code).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <unistd.h>

#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"
#include "layers/ple.h"
#include "quant/quant.h"
#include "model/hparams.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "synth/synth.h"
#include "util/error.h"
#include "util/fp16.h"

namespace strata {
namespace {

HParams real_model_ple() {
  HParams hp;
  hp.ple_ngram_size = 3;
  hp.ple_heads_per_ngram = 8;
  hp.ple_eos_token = 248044;
  hp.ple_multipliers = {23703573157769ull, 20109073645365ull, 8052911324071ull};
  hp.ple_head_vocab_sizes = {20000003, 20000023, 20000033, 20000047, 20000059, 20000063,
                             20000069, 20000077, 20000081, 20000093, 20000107, 20000147,
                             20000153, 20000159, 20000161, 20000171};
  uint64_t offset = 0;
  for (uint64_t q : hp.ple_head_vocab_sizes) {
    hp.ple_head_offsets.push_back(offset);
    offset += q;
  }
  return hp;
}

TEST(PleHash, RealModelKnownAnswerForFirstEos) {
  const HParams hp = real_model_ple();
  EXPECT_EQ(hp.ple_head_offsets.back(), 300001275u);  // reference: last offset
  const int32_t tokens[] = {248044};
  const std::vector<uint64_t> rows = ple_row_ids(forward_dims(hp).ple, PleContext{}, tokens);
  const std::vector<uint64_t> expected = {9663979,   26558231,  56120240,  74755659,
                                          80459717,  109265651, 132697467, 151022725,
                                          170054832, 192967038, 200687722, 225763581,
                                          259275737, 272983544, 297596484, 300986548};
  EXPECT_EQ(rows, expected);
}

TEST(PleHash, ParityConfigConstantsFromSeed) {
  HParams hp;
  hp.n_vocab = 512;
  hp.ple_ngram_size = 3;
  hp.ple_heads_per_ngram = 8;
  fill_ple_constants(hp, 1000, 1234);
  const std::vector<uint64_t> m = {4295158889763781ull, 17440218147737327ull, 1270917961434445ull};
  EXPECT_EQ(hp.ple_multipliers, m);
  ASSERT_EQ(hp.ple_head_vocab_sizes.size(), 16u);
  EXPECT_EQ(hp.ple_head_vocab_sizes.front(), 1009u);
  EXPECT_EQ(hp.ple_head_vocab_sizes.back(), 1097u);
  EXPECT_EQ(hp.ple_head_offsets.back() + hp.ple_head_vocab_sizes.back(), 16826u);
}

TEST(PleHash, EosCutsContextAndWindowsCompose) {
  const PleDims dims = forward_dims(real_model_ple()).ple;
  const int32_t eos = 248044;
  // After an eos, the next token's context is (tok, eos, eos): equal to a sequence start.
  const int32_t after_eos[] = {5, 7, eos, 11};
  const int32_t fresh[] = {11};
  const std::vector<uint64_t> a = ple_row_ids(dims, PleContext{}, after_eos);
  const std::vector<uint64_t> b = ple_row_ids(dims, PleContext{}, fresh);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 3 * 16));
  // Feeding a sequence in two windows gives the same rows as one window.
  const int32_t all[] = {5, 7, 9, 11, 13};
  const std::vector<uint64_t> whole = ple_row_ids(dims, PleContext{}, all);
  const std::span<const int32_t> first(all, 2), second(all + 2, 3);
  std::vector<uint64_t> split = ple_row_ids(dims, PleContext{}, first);
  const std::vector<uint64_t> rest =
      ple_row_ids(dims, ple_advance(dims, PleContext{}, first), second);
  split.insert(split.end(), rest.begin(), rest.end());
  EXPECT_EQ(whole, split);
  // Bigram heads of token 9 depend on (9, 7) only; trigram heads also on 5.
  const int32_t other_start[] = {6, 7, 9};
  const std::vector<uint64_t> c = ple_row_ids(dims, PleContext{}, other_start);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(c[2 * 16 + h], whole[2 * 16 + h]);
  for (int h = 8; h < 16; ++h) EXPECT_NE(c[2 * 16 + h], whole[2 * 16 + h]);
}

// PleRowReader: a small table copied from the mapping on the window thread and the same table read
// with preads on the reader thread give the same floats, window after window, and both name the
// file, tensor and row of an id outside the table.
TEST(PleRowReader, MappedCopyAndReaderThreadGiveTheSameRows) {
  constexpr int64_t kWidth = 24, kRows = 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> bytes(size_t(kWidth * kRows) * 2);
  for (size_t i = 0; i < bytes.size(); i += 2) {
    const uint16_t h = f32_to_f16(normal(rng));
    std::memcpy(bytes.data() + i, &h, 2);
  }
  const std::string path = "/tmp/strata-ple-reader-" + std::to_string(getpid()) + ".gguf";
  GgufWriter writer;
  writer.add_string("general.architecture", "test");
  writer.add_tensor("per_layer_token_embd.weight", GgmlType::F16, {kWidth, kRows}, bytes);
  writer.write_file(path);
  const auto file = GgufFile::open(path);
  PleWeights w;
  w.file = file.get();
  w.table = file->tensor("per_layer_token_embd.weight");
  PleDims dims;
  dims.row_width = kWidth;

  PleRowReader mapped, threaded(0);
  ASSERT_TRUE(mapped.reads_from_mapping(w));
  ASSERT_FALSE(threaded.reads_from_mapping(w));
  std::uniform_int_distribution<uint64_t> row(0, kRows - 1);
  for (size_t n_ids : {1, 16, 160, 3}) {
    std::vector<uint64_t> ids(n_ids);
    for (uint64_t& id : ids) id = row(rng);
    ids[0] = kRows - 1;  // the table's last row
    mapped.start(dims, w, ids);
    threaded.start(dims, w, ids);
    const std::vector<float> a = mapped.collect(), b = threaded.collect();
    ASSERT_EQ(a.size(), n_ids * size_t(kWidth));
    ASSERT_EQ(a, b) << n_ids << " rows";
    for (int64_t i = 0; i < kWidth; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + size_t(ids[1 % n_ids] * kWidth + uint64_t(i)) * 2, 2);
      ASSERT_EQ(a[size_t((1 % n_ids) * kWidth + i)], f16_to_f32(h));
    }
  }
  const uint64_t outside[] = {3, uint64_t(kRows)};
  for (PleRowReader* reader : {&mapped, &threaded}) {
    reader->start(dims, w, outside);
    try {
      reader->collect();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find("n-gram row 1000 is outside the table (1000 rows)"),
                std::string::npos)
          << message;
    }
  }
  std::remove(path.c_str());
}

// The batched PLE (ple_forward_rows: key/value projections and gates over every sequence's rows at
// once, the conv per sequence; on 2+ threads each thread's row slice of whole sequences, some
// slices empty at 4 threads) against each sequence's ple_forward alone: X and the conv history
// bitwise equal, for sequences of 1-3 rows with their own histories and 1-4 threads.
TEST(PleForwardRows, EverySequenceGetsItsAloneBits) {
  constexpr int kStreams = 4;
  constexpr int64_t kEmbd = 64, kWidth = kStreams * kEmbd, kRowWidth = 8;
  PleDims dims;
  dims.n_embd = kEmbd;
  dims.n_streams = kStreams;
  dims.ngram_size = 3;
  dims.heads_per_ngram = 2;
  dims.conv_kernel = 4;
  dims.row_width = kRowWidth;
  const int64_t embedding_width = dims.n_heads() * kRowWidth;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_vector = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  auto q8_0 = [&](int64_t n_in, int64_t n_out, std::vector<std::byte>& bytes) {
    const size_t row_size = row_bytes(GgmlType::Q8_0, n_in);
    bytes.resize(row_size * size_t(n_out));
    for (int64_t o = 0; o < n_out; ++o) {
      const std::vector<float> row = random_vector(n_in);
      quant::quantize_row(GgmlType::Q8_0, row.data(), bytes.data() + size_t(o) * row_size, n_in);
    }
    return compute::WeightMatrix::dense(GgmlType::Q8_0, n_in, n_out, bytes.data());
  };
  std::vector<std::byte> key_bytes, value_bytes;
  PleWeights w;
  w.key = q8_0(embedding_width, kWidth, key_bytes);
  w.value = q8_0(embedding_width, kEmbd, value_bytes);
  w.norm_key = random_vector(kWidth);
  w.norm_query = random_vector(kWidth);
  w.norm_conv = random_vector(kWidth);
  w.conv = random_vector(kWidth * dims.conv_kernel);

  const std::vector<int64_t> lengths = {1, 3, 1, 2, 1};
  int64_t n_rows = 0;
  std::vector<compute::RowSegment> segments;
  for (const int64_t n : lengths) {
    segments.push_back({n_rows, n});
    n_rows += n;
  }
  std::vector<PleState> start(lengths.size());
  std::vector<std::vector<float>> embeddings;
  for (PleState& state : start) {
    state.reset(dims);
    state.conv_history = random_vector(int64_t(state.conv_history.size()));
  }
  for (const int64_t n : lengths) embeddings.push_back(random_vector(n * embedding_width));
  const std::vector<float> X0 = random_vector(n_rows * kWidth);

  for (const int threads : {1, 2, 3, 4}) {
    compute::ThreadPool pool(threads);
    compute::Workspace ws;
    std::vector<float> X_alone = X0;
    std::vector<PleState> alone = start;
    for (size_t s = 0; s < lengths.size(); ++s)
      ple_forward(pool, ws, dims, w, alone[s], embeddings[s].data(), lengths[s],
                  X_alone.data() + segments[s].first_row * kWidth);
    std::vector<float> X_batched = X0;
    std::vector<PleState> batched = start;
    std::vector<PleState*> states;
    std::vector<const float*> blocks;
    for (size_t s = 0; s < lengths.size(); ++s) {
      states.push_back(&batched[s]);
      blocks.push_back(embeddings[s].data());
    }
    ple_forward_rows(pool, ws, dims, w, states, blocks, segments, n_rows, X_batched.data());
    ASSERT_EQ(0, std::memcmp(X_alone.data(), X_batched.data(), X0.size() * 4)) << threads << " threads: X";
    ASSERT_NE(0, std::memcmp(X_alone.data(), X0.data(), X0.size() * 4)) << "the layer changed nothing";
    for (size_t s = 0; s < lengths.size(); ++s)
      ASSERT_EQ(alone[s].conv_history, batched[s].conv_history) << threads << " threads: sequence " << s << "'s history";
  }
  // A mismatched call is refused, naming the counts.
  compute::ThreadPool pool(1);
  compute::Workspace ws;
  std::vector<float> X = X0;
  PleState* one[1] = {&start[0]};
  const float* blocks[1] = {embeddings[0].data()};
  EXPECT_THROW(ple_forward_rows(pool, ws, dims, w, one, blocks, segments, n_rows, X.data()), Error);
}

}  // namespace
}  // namespace strata
