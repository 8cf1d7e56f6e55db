#include "gguf_test_util.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "util/fp16.h"

namespace strata::test {

ScratchDir::ScratchDir(const std::string& tag) {
  static int counter = 0;  // test-only: distinct dirs within one process
  path_ = std::filesystem::temp_directory_path() /
          ("strata-gguf-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<std::string> ScratchDir::list() const {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// ---- layout walker (valid files only; deliberately independent of the parser under test) ----

namespace {

struct Walker {
  const std::vector<uint8_t>& bytes;
  uint64_t pos = 0;
  template <typename T> T take() {
    if (pos + sizeof(T) > bytes.size()) throw std::runtime_error("walk_layout: truncated");
    T value;
    std::memcpy(&value, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
    return value;
  }
  std::string take_string() {
    const uint64_t n = take<uint64_t>();
    if (pos + n > bytes.size()) throw std::runtime_error("walk_layout: truncated string");
    std::string s(reinterpret_cast<const char*>(bytes.data() + pos), n);
    pos += n;
    return s;
  }
  void skip_value(uint32_t type) {
    static const uint64_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      take_string();
    } else if (type == 9) {
      const uint32_t element = take<uint32_t>();
      const uint64_t count = take<uint64_t>();
      for (uint64_t i = 0; i < count; ++i) skip_value(element);
    } else if (type < 13) {
      pos += kSizes[type];
    } else {
      throw std::runtime_error("walk_layout: bad type");
    }
  }
};

}  // namespace

GgufLayout walk_layout(const std::vector<uint8_t>& bytes) {
  Walker w{bytes};
  w.pos = 8;
  const uint64_t n_tensors = w.take<uint64_t>();
  const uint64_t n_kv = w.take<uint64_t>();
  GgufLayout layout;
  for (uint64_t i = 0; i < n_kv; ++i) {
    KvLayout kv;
    kv.key_length_at = w.pos;
    kv.key = w.take_string();
    kv.type_at = w.pos;
    const uint32_t type = w.take<uint32_t>();
    kv.type = static_cast<GgufValueType>(type);
    kv.value_at = w.pos;
    w.skip_value(type);
    layout.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorLayout t;
    t.name_length_at = w.pos;
    t.name = w.take_string();
    t.n_dims_at = w.pos;
    const uint32_t n_dims = w.take<uint32_t>();
    for (uint32_t d = 0; d < n_dims; ++d) {
      t.ne_at[d] = w.pos;
      w.take<uint64_t>();
    }
    t.type_at = w.pos;
    w.take<uint32_t>();
    t.offset_at = w.pos;
    w.take<uint64_t>();
    layout.tensors.push_back(t);
  }
  layout.infos_end = w.pos;
  return layout;
}

const KvLayout& GgufLayout::kv(const std::string& key) const {
  for (const KvLayout& kv : kvs) {
    if (kv.key == key) return kv;
  }
  throw std::runtime_error("no key " + key);
}

const TensorLayout& GgufLayout::tensor(const std::string& name) const {
  for (const TensorLayout& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tensor " + name);
}

// ---- deterministic fixture data ----

namespace {

uint32_t fnv1a(const std::string& text) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : text) hash = (hash ^ c) * 16777619u;
  return hash;
}

// std::mt19937's output sequence is fixed by the standard; the distributions are not, so values
// are derived from raw outputs only. Bytes depend only on the tensor name.
std::vector<uint8_t> synthetic_tensor_bytes(const std::string& name, GgmlType type, uint64_t n_bytes) {
  std::mt19937 rng(fnv1a(name));
  auto uniform = [&] { return static_cast<float>(rng() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; };
  std::vector<uint8_t> bytes(n_bytes);
  const bool is_norm = name.find("norm") != std::string::npos;
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(bytes.data() + at, &v, 2); };
  switch (type) {
    case GgmlType::F32:
      for (size_t i = 0; i + 4 <= n_bytes; i += 4) {
        const float v = is_norm ? 1.0f : 0.05f * uniform();
        std::memcpy(bytes.data() + i, &v, 4);
      }
      break;
    case GgmlType::F16:
      for (size_t i = 0; i + 2 <= n_bytes; i += 2) put16(i, f32_to_f16(0.05f * uniform()));
      break;
    case GgmlType::Q8_0:  // 34-byte blocks: f16 scale, 32 int8 quants
      for (size_t block = 0; block + 34 <= n_bytes; block += 34) {
        put16(block, f32_to_f16(0.05f / 127.0f));
        for (size_t j = 0; j < 32; ++j) bytes[block + 2 + j] = static_cast<uint8_t>(rng());
      }
      break;
    case GgmlType::Q4_0:  // 18-byte blocks: f16 scale, 16 bytes of nibbles
      for (size_t block = 0; block + 18 <= n_bytes; block += 18) {
        put16(block, f32_to_f16(0.05f / 8.0f));
        for (size_t j = 0; j < 16; ++j) bytes[block + 2 + j] = static_cast<uint8_t>(rng());
      }
      break;
    default:
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      break;
  }
  return bytes;
}

}  // namespace

void build_tiny_qwen4exp(GgufWriter& w) {
  constexpr int kLayers = 2, kHidden = 64, kExperts = 8, kExpertFfn = 32, kVocab = 64;
  w.add_string("general.architecture", "qwen4exp");
  w.add_string("general.name", "tiny-qwen4exp (random weights, test fixture)");
  w.add_u32("general.file_type", 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
  w.add_u32("general.quantization_version", 2);
  w.set_alignment(32);
  w.add_u32("qwen4exp.block_count", kLayers);
  w.add_u32("qwen4exp.context_length", 4096);
  w.add_u32("qwen4exp.embedding_length", kHidden);
  w.add_u32("qwen4exp.attention.head_count", 4);
  w.add_u32("qwen4exp.attention.head_count_kv", 2);
  w.add_u32("qwen4exp.attention.key_length", 16);
  w.add_u32("qwen4exp.attention.value_length", 16);
  w.add_f32("qwen4exp.attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_f32("qwen4exp.rope.freq_base", 1e7f);
  w.add_u32("qwen4exp.rope.dimension_count", 4);
  const std::vector<int32_t> sections = {1, 1, 0, 0};
  w.add_array_i32("qwen4exp.rope.dimension_sections", sections);
  w.add_u32("qwen4exp.expert_count", kExperts);
  w.add_u32("qwen4exp.expert_used_count", 2);
  w.add_u32("qwen4exp.expert_feed_forward_length", kExpertFfn);
  w.add_u32("qwen4exp.expert_shared_feed_forward_length", kExpertFfn);
  w.add_u32("qwen4exp.ssm.conv_kernel", 4);
  w.add_u32("qwen4exp.ssm.state_size", 16);
  w.add_u32("qwen4exp.ssm.group_count", 2);
  w.add_u32("qwen4exp.ssm.time_step_rank", 4);
  w.add_u32("qwen4exp.ssm.inner_size", 64);
  w.add_u32("qwen4exp.hyper_connection.count", 4);
  w.add_u32("qwen4exp.hyper_connection.low_rank", 32);
  w.add_u32("qwen4exp.full_attention_interval", 2);
  const std::vector<int32_t> compress = {0, 4};
  w.add_array_i32("qwen4exp.attention.compress_ratios", compress);

  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> token_types = {3, 3, 3};  // CONTROL
  for (int i = 0; static_cast<int>(tokens.size()) < kVocab; ++i) {
    tokens.push_back(i < 26 ? std::string(1, char('a' + i)) : fmt::format("t{}", i));
    token_types.push_back(1);  // NORMAL
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "qwen35");
  w.add_array_string("tokenizer.ggml.tokens", tokens);
  w.add_array_i32("tokenizer.ggml.token_type", token_types);
  const std::vector<std::string> merges = {"a b", "c d", "e f"};
  w.add_array_string("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_string("tokenizer.chat_template",
               "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");

  w.add_tensor("token_embd.weight", GgmlType::F16, {kHidden, kVocab});
  w.add_tensor("output_norm.weight", GgmlType::F32, {kHidden});
  w.add_tensor("output.weight", GgmlType::Q8_0, {kHidden, kVocab});
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::string blk = "blk." + std::to_string(layer) + ".";
    // Layer 0 is a Gated DeltaNet layer, layer 1 a QSA attention layer (full_attention_interval 2).
    w.add_tensor(blk + "attn_norm.weight", GgmlType::F32, {kHidden});
    if (layer == 0) {
      w.add_tensor(blk + "attn_qkv.weight", GgmlType::Q8_0, {kHidden, 3 * kHidden});
      w.add_tensor(blk + "ssm_a", GgmlType::F32, {4});
    } else {
      w.add_tensor(blk + "attn_q.weight", GgmlType::F16, {kHidden, 2 * kHidden});
      w.add_tensor(blk + "attn_k.weight", GgmlType::F16, {kHidden, 32});
    }
    w.add_tensor(blk + "ffn_norm.weight", GgmlType::F32, {kHidden});
    w.add_tensor(blk + "ffn_gate_inp.weight", GgmlType::F32, {kHidden, kExperts});
    const GgmlType expert_type = layer == 0 ? GgmlType::Q8_0 : GgmlType::Q4_0;
    w.add_tensor(blk + "ffn_gate_exps.weight", expert_type, {kHidden, kExpertFfn, kExperts});
    w.add_tensor(blk + "ffn_up_exps.weight", expert_type, {kHidden, kExpertFfn, kExperts});
    w.add_tensor(blk + "ffn_down_exps.weight", expert_type, {kExpertFfn, kHidden, kExperts});
    w.add_tensor(blk + "ffn_gate_shexp.weight", GgmlType::F16, {kHidden, kExpertFfn});
    w.add_tensor(blk + "ffn_up_shexp.weight", GgmlType::F16, {kHidden, kExpertFfn});
    w.add_tensor(blk + "ffn_down_shexp.weight", GgmlType::F16, {kExpertFfn, kHidden});
  }
}

void write_tiny_qwen4exp(const std::string& path) {
  GgufWriter writer;
  build_tiny_qwen4exp(writer);
  // Every tensor is streamed through the producer, in chunks, as a converter would do it.
  writer.write_file(path, [](const GgufTensorDecl& tensor, GgufTensorSink& sink) {
    const std::vector<uint8_t> bytes = synthetic_tensor_bytes(tensor.name, tensor.type, tensor.n_bytes);
    for (size_t at = 0; at < bytes.size(); at += 1000) {
      sink.write(std::span<const uint8_t>(bytes).subspan(at, std::min<size_t>(1000, bytes.size() - at)));
    }
  });
}

void build_every_type_sample(GgufWriter& w) {
  w.add_string("general.architecture", "sample");
  w.set_alignment(32);
  w.add_u8("sample.u8", 200);
  w.add_i8("sample.i8", -100);
  w.add_u16("sample.u16", 60000);
  w.add_i16("sample.i16", -30000);
  w.add_u32("sample.u32", 4000000000u);
  w.add_i32("sample.i32", -2000000000);
  w.add_u64("sample.u64", 18000000000000000000ull);
  w.add_i64("sample.i64", -9000000000000000000ll);
  w.add_f32("sample.f32", 0.15625f);
  w.add_f64("sample.f64", -2.5e300);
  w.add_bool("sample.bool", true);
  w.add_string("sample.string", "héllo\nworld");
  w.add_array("sample.arr_u8", GgufValueType::U8, std::vector<int64_t>{0, 255, 7});
  w.add_array("sample.arr_i8", GgufValueType::I8, std::vector<int64_t>{-128, 127});
  w.add_array("sample.arr_u16", GgufValueType::U16, std::vector<int64_t>{65535});
  w.add_array("sample.arr_i16", GgufValueType::I16, std::vector<int64_t>{-32768, 32767});
  w.add_array("sample.arr_u32", GgufValueType::U32, std::vector<int64_t>{0, 1, 2});
  w.add_array("sample.arr_i32", GgufValueType::I32, std::vector<int64_t>{-5, 5});
  w.add_array("sample.arr_u64", GgufValueType::U64, std::vector<int64_t>{-1});  // 2^64-1 as bits
  w.add_array("sample.arr_i64", GgufValueType::I64, std::vector<int64_t>{INT64_MIN, INT64_MAX});
  w.add_array("sample.arr_bool", GgufValueType::BOOL, std::vector<int64_t>{1, 0, 1});
  w.add_array("sample.arr_f32", GgufValueType::F32, std::vector<double>{0.5, -1.25});
  w.add_array("sample.arr_f64", GgufValueType::F64, std::vector<double>{1e-300, 3.0});
  w.add_array_string("sample.arr_string", std::vector<std::string>{"", "a", "bc"});
  w.add_array("sample.arr_empty", GgufValueType::U32, std::vector<int64_t>{});
  std::vector<uint8_t> f32(4 * 8), f16(2 * 3 * 2), q8(34 * 2 * 2);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint8_t>(i * 13 + 5);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 3 + 2);
  w.add_tensor("a.f32", GgmlType::F32, {8}, f32);
  w.add_tensor("b.f16", GgmlType::F16, {3, 2}, f16);
  w.add_tensor("c_exps.q8_0", GgmlType::Q8_0, {64, 1, 2}, q8);
}

}  // namespace strata::test
