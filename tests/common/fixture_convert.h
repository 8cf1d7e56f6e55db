// The transformers fixtures that are committed only as checkpoints (tests/data/models/<arch>/hf:
// the unseen shapes qwen4exp_dkdv, qwen3next_dkdv, qwen4exp_dense), converted for a test with
// `strata convert` (f32), and llama.cpp's "ratio 0" form of a qwen4exp file. Header-only; needs
// STRATA_TEST_DATA_DIR from the test target. Throws strata::Error as convert and GgufFile do.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace strata::test_support {

inline std::string fixture_dir(const std::string& arch) {
  return std::string(STRATA_TEST_DATA_DIR) + "/models/" + arch;
}

// Writes the f32 GGUF of tests/data/models/<arch>/hf to out_path.
inline void convert_fixture(const std::string& arch, const std::string& out_path) {
  convert::ConvertOptions options;
  options.hf_dir = fixture_dir(arch) + "/hf";
  options.out_path = out_path;
  options.type = GgmlType::F32;
  options.show_progress = false;
  convert::convert_hf_to_gguf(options);
}

// Rewrites `path` in place with every attention.compress_ratios entry 0: the form llama.cpp's
// converter gives a qwen4exp checkpoint whose config.json layer types are not "full_attention"
// (llama.cpp and strata run such a QSA block as dense gated attention).
inline void zero_compress_ratios(const std::string& path) {
  const std::string key = "qwen4exp.attention.compress_ratios";
  const std::string rewritten = path + ".ratio0";
  {
    const auto source = GgufFile::open(path);
    GgufWriter writer;
    for (const std::string& k : source->keys()) {
      if (k != key) {
        writer.add(k, *source->find(k));
        continue;
      }
      const std::vector<int32_t> zeros(source->get<std::vector<int64_t>>(key).size(), 0);
      writer.add_array_i32(key, zeros);
    }
    for (const TensorInfo& t : source->tensors())
      writer.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims));
    writer.write_file(rewritten, [&](const GgufTensorDecl& t, GgufTensorSink& sink) {
      sink.write(std::span<const uint8_t>(source->tensor_data(source->tensor(t.name)), t.n_bytes));
    });
  }
  std::filesystem::rename(rewritten, path);
}

}  // namespace strata::test_support
