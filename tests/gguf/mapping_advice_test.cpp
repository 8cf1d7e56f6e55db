// plan_mapping_advice: which byte ranges of a GGUF get MADV_RANDOM (streamed experts, sparse row
// gathers) and which are read ahead (dense tensors), from the tensor table alone. DensePrefetch on
// a real file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../common/temp_dir.h"
#include "tensor_table.h"
#include "gguf/gguf.h"
#include "gguf/mapping_advice.h"

namespace strata {
namespace {

using test_support::kPage;
using test_support::tensor;

TEST(GgufMappingAdvice, ExpertsAreSparseAndSharedPagesCountAsDense) {
  const std::vector<TensorInfo> tensors = {
      tensor("token_embd.weight", 0, 10000),               // dense, ends mid-page 2
      tensor("blk.0.ffn_up_exps.weight", 10000, 30000),    // sparse, [10000, 40000)
      tensor("blk.0.attn_q.weight", 40000, 1000),          // dense, [40000, 41000)
      tensor("blk.0.ffn_down_exps.weight", 41000, 50000),  // sparse, [41000, 91000)
      tensor("output.weight", 91000, 9000),                // dense, to the end (100000)
  };
  const MappingAdvicePlan plan = plan_mapping_advice(tensors, 100000, kPage);
  // Sparse shrinks inward: [12288, 36864) and [45056, 90112) — the pages holding dense bytes stay
  // dense.
  EXPECT_EQ(plan.sparse, (std::vector<ByteRange>{{12288, 36864 - 12288}, {45056, 90112 - 45056}}));
  // Dense grows outward to pages, the last one clipped to the file.
  EXPECT_EQ(plan.dense,
            (std::vector<ByteRange>{{0, 12288}, {36864, 45056 - 36864}, {90112, 100000 - 90112}}));
}

TEST(GgufMappingAdvice, PerLayerEmbeddingIsSparseAndNeighboursMerge) {
  const std::vector<TensorInfo> tensors = {
      tensor("blk.1.attn_norm.weight", 8192, 4096),  // file order differs from table order
      tensor("per_layer_token_embd.weight", 16384, 8192),
      tensor("blk.0.attn_norm.weight", 0, 4096),
      tensor("blk.0.attn_k.weight", 4096, 4096),
      tensor("empty", 30000, 0),  // no bytes: no range
  };
  const MappingAdvicePlan plan = plan_mapping_advice(tensors, 1 << 20, kPage);
  EXPECT_EQ(plan.dense, (std::vector<ByteRange>{{0, 12288}}));
  EXPECT_EQ(plan.sparse, (std::vector<ByteRange>{{16384, 8192}}));
}

TEST(GgufMappingAdvice, SparseTensorInsideOneDensePageGetsNoAdvice) {
  const std::vector<TensorInfo> tensors = {tensor("a.weight", 0, 100),
                                           tensor("blk.0.ffn_gate_exps.weight", 100, 200),
                                           tensor("b.weight", 300, 100)};
  const MappingAdvicePlan plan = plan_mapping_advice(tensors, 400, kPage);
  EXPECT_TRUE(plan.sparse.empty());
  EXPECT_EQ(plan.dense, (std::vector<ByteRange>{{0, 400}}));
}

// The invariants on random tables: ranges ascending, disjoint, page-aligned; every dense byte is in
// a dense range; no sparse range touches a page with a dense byte; every sparse page that holds no
// dense byte is advised.
TEST(GgufMappingAdvice, RandomTablesKeepTheInvariants) {
  std::mt19937_64 rng(16);
  for (int round = 0; round < 100; ++round) {
    std::vector<TensorInfo> tensors;
    uint64_t at = 0;
    const int n = 1 + int(rng() % 12);
    for (int i = 0; i < n; ++i) {
      at += rng() % 3 == 0 ? rng() % 5000 : 0;  // gaps (padding)
      const uint64_t bytes = rng() % 4 == 0 ? rng() % 3000 : rng() % 40000;
      tensors.push_back(tensor(rng() % 2 ? "blk.0.ffn_up_exps" : "blk.0.attn_v", at, bytes));
      at += bytes;
    }
    const uint64_t file_size = at + rng() % 5000;
    const MappingAdvicePlan plan = plan_mapping_advice(tensors, file_size, kPage);
    std::vector<char> kind(file_size, 0);  // 1 sparse byte, 2 dense byte
    for (const TensorInfo& t : tensors)
      for (uint64_t b = t.file_offset; b < t.file_offset + t.n_bytes; ++b)
        kind[b] = char(is_sparse_tensor(t) ? 1 : 2);
    std::vector<char> advised(file_size, 0);
    for (const auto* ranges : {&plan.sparse, &plan.dense}) {
      for (size_t i = 0; i < ranges->size(); ++i) {
        const ByteRange& r = (*ranges)[i];
        ASSERT_GT(r.length, 0u);
        ASSERT_EQ(r.offset % kPage, 0u);
        ASSERT_LE(r.end(), file_size);
        if (r.end() != file_size) {
          ASSERT_EQ(r.end() % kPage, 0u);
        }
        if (i > 0) {
          ASSERT_LT((*ranges)[i - 1].end(), r.offset);  // merged when touching
        }
        for (uint64_t b = r.offset; b < r.end(); ++b) {
          ASSERT_EQ(advised[b], 0) << "ranges overlap at " << b;
          advised[b] = char(ranges == &plan.sparse ? 1 : 2);
        }
      }
    }
    for (uint64_t b = 0; b < file_size; ++b) {
      if (kind[b] == 2) {
        ASSERT_EQ(advised[b], 2) << "dense byte " << b << " not read ahead";
      }
      const uint64_t page = b / kPage * kPage, page_end = std::min(file_size, page + kPage);
      if (b != page) continue;
      if (advised[b] == 1) {
        for (uint64_t p = page; p < page_end; ++p)
          ASSERT_NE(kind[p], 2) << "random advice on a dense page";
      }
      // A page wholly inside one expert tensor is always advised random.
      for (const TensorInfo& t : tensors) {
        if (is_sparse_tensor(t) && t.file_offset <= page &&
            page + kPage <= t.file_offset + t.n_bytes) {
          ASSERT_EQ(advised[b], 1) << "page " << page << " of an expert tensor not advised";
        }
      }
    }
  }
}

TEST(GgufMappingAdvice, DensePrefetchRunsOnAFileAndStopsOnDestruction) {
  test_support::ScratchDir dir("mapping-advice");
  const std::string path = (dir.path() / "m.gguf").string();
  // A GGUF with one dense and one expert tensor, written by hand: header, 2 tensors, data.
  {
    std::vector<uint8_t> bytes;
    auto put = [&](const void* p, size_t n) {
      bytes.insert(bytes.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    auto u32 = [&](uint32_t v) { put(&v, 4); };
    auto u64 = [&](uint64_t v) { put(&v, 8); };
    auto str = [&](const std::string& s) {
      u64(s.size());
      put(s.data(), s.size());
    };
    put("GGUF", 4);
    u32(3);
    u64(2);  // tensors
    u64(0);  // kv
    for (const auto& [name, offset] :
         {std::pair<std::string, uint64_t>{"blk.0.attn_q.weight", 0},
          std::pair<std::string, uint64_t>{"blk.0.ffn_up_exps.weight", 1 << 16}}) {
      str(name);
      u32(1);        // n_dims
      u64(1 << 14);  // ne[0]: 16384 f32 = 64 KiB
      u32(0);        // F32
      u64(offset);
    }
    bytes.resize((bytes.size() + 31) / 32 * 32, 0);
    bytes.resize(bytes.size() + (2 << 16), 7);
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  const auto gguf = GgufFile::open(path);
  ASSERT_EQ(gguf->tensors().size(), 2u);
  {
    DensePrefetch prefetch(*gguf);
    EXPECT_GE(prefetch.dense_bytes(), uint64_t{1} << 16);
    EXPECT_LT(prefetch.dense_bytes(), uint64_t{2} << 16);
  }  // joins
  // The mapping still reads the same bytes (advice is a hint).
  EXPECT_EQ(gguf->tensor_data(gguf->tensors()[1])[123], 7);
  const auto in_memory = GgufFile::open_from_memory(
      std::span<const uint8_t>(gguf->mapped_data(), gguf->file_size()), "memory");
  DensePrefetch none(*in_memory);  // no file: nothing to advise or read
  EXPECT_EQ(none.dense_bytes(), 0u);
}

}  // namespace
}  // namespace strata
