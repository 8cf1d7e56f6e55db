#include "gguf/gguf_writer.h"

#include <bit>
#include <cmath>
#include <limits>
#include <cstring>
#include <utility>

#include "util/atomic_file.h"
#include "util/error.h"

namespace strata {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

constexpr uint32_t kGgufVersion = 3;
constexpr size_t kMaxKeyBytes = 65535;
constexpr size_t kMaxTensorNameBytes = 63;  // GGML_MAX_NAME = 64 including the NUL
constexpr uint32_t kMaxAlignment = 1u << 20;

uint64_t pad_to(uint64_t offset, uint64_t alignment) {
  return offset + (alignment - offset % alignment) % alignment;
}

bool is_integer_or_bool(GgufValueType type) {
  switch (type) {
    case GgufValueType::F32: case GgufValueType::F64: case GgufValueType::STRING:
    case GgufValueType::ARRAY: return false;
    default: return true;
  }
}

bool is_unsigned(GgufValueType type) {
  return type == GgufValueType::U8 || type == GgufValueType::U16 || type == GgufValueType::U32 ||
         type == GgufValueType::U64;
}

// Whether `value` (U64 as its bits) is representable in the integer/bool element type.
bool int_fits(GgufValueType type, int64_t value) {
  switch (type) {
    case GgufValueType::U8: return std::in_range<uint8_t>(value);
    case GgufValueType::I8: return std::in_range<int8_t>(value);
    case GgufValueType::U16: return std::in_range<uint16_t>(value);
    case GgufValueType::I16: return std::in_range<int16_t>(value);
    case GgufValueType::U32: return std::in_range<uint32_t>(value);
    case GgufValueType::I32: return std::in_range<int32_t>(value);
    case GgufValueType::BOOL: return value == 0 || value == 1;
    case GgufValueType::U64: case GgufValueType::I64: return true;
    default: return false;
  }
}

// Narrowing a finite double beyond float's range to float is undefined behaviour.
bool fits_f32(double value) {
  return !std::isfinite(value) || std::fabs(value) <= double(std::numeric_limits<float>::max());
}

// Little-endian serialisation into a growing byte buffer.
class ByteWriter {
 public:
  template <typename T> void put(T value) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    bytes_.insert(bytes_.end(), raw, raw + sizeof(T));
  }
  void put_string(const std::string& text) {
    put<uint64_t>(text.size());
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  void put_int(GgufValueType type, int64_t value) {
    switch (type) {
      case GgufValueType::U8: case GgufValueType::BOOL: put<uint8_t>(uint8_t(value)); break;
      case GgufValueType::I8: put<int8_t>(int8_t(value)); break;
      case GgufValueType::U16: put<uint16_t>(uint16_t(value)); break;
      case GgufValueType::I16: put<int16_t>(int16_t(value)); break;
      case GgufValueType::U32: put<uint32_t>(uint32_t(value)); break;
      case GgufValueType::I32: put<int32_t>(int32_t(value)); break;
      case GgufValueType::U64: put<uint64_t>(uint64_t(value)); break;
      case GgufValueType::I64: put<int64_t>(value); break;
      default: break;
    }
  }
  void put_float(GgufValueType type, double value) {
    if (type == GgufValueType::F32) put<float>(static_cast<float>(value));
    else put<double>(value);
  }
  void pad(uint64_t alignment) { bytes_.resize(pad_to(bytes_.size(), alignment), 0); }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

void put_value(ByteWriter& out, const GgufValue& value) {
  out.put<uint32_t>(static_cast<uint32_t>(value.type));
  switch (value.type) {
    case GgufValueType::BOOL: out.put<uint8_t>(std::get<bool>(value.value) ? 1 : 0); break;
    case GgufValueType::STRING: out.put_string(std::get<std::string>(value.value)); break;
    case GgufValueType::F32: case GgufValueType::F64:
      out.put_float(value.type, std::get<double>(value.value));
      break;
    case GgufValueType::ARRAY: {
      const GgufArray& array = std::get<GgufArray>(value.value);
      out.put<uint32_t>(static_cast<uint32_t>(array.element_type));
      out.put<uint64_t>(array.size());
      for (int64_t v : array.ints) out.put_int(array.element_type, v);
      for (double v : array.floats) out.put_float(array.element_type, v);
      for (const std::string& s : array.strings) out.put_string(s);
      break;
    }
    default:
      if (const auto* u = std::get_if<uint64_t>(&value.value)) out.put_int(value.type, int64_t(*u));
      else out.put_int(value.type, std::get<int64_t>(value.value));
      break;
  }
}

// Checks that the variant alternative and contents agree with the declared type.
void validate_value(const std::string& key, const GgufValue& value) {
  auto bad = [&](std::string_view what) { fail("gguf writer: key '{}': {}", key, what); };
  const auto& v = value.value;
  switch (value.type) {
    case GgufValueType::BOOL: if (!std::holds_alternative<bool>(v)) bad("bool value must hold bool"); return;
    case GgufValueType::STRING:
      if (!std::holds_alternative<std::string>(v)) bad("string value must hold std::string");
      return;
    case GgufValueType::F32: case GgufValueType::F64:
      if (!std::holds_alternative<double>(v)) bad("float value must hold double");
      if (value.type == GgufValueType::F32 && !fits_f32(std::get<double>(v))) bad("value does not fit in f32");
      return;
    case GgufValueType::ARRAY: break;
    default: {
      bool fits = true;
      if (is_unsigned(value.type)) {
        if (!std::holds_alternative<uint64_t>(v)) bad("unsigned value must hold uint64_t");
        const uint64_t u = std::get<uint64_t>(v);
        fits = value.type == GgufValueType::U64 || (u <= UINT32_MAX && int_fits(value.type, int64_t(u)));
      } else {
        if (!std::holds_alternative<int64_t>(v)) bad("signed value must hold int64_t");
        fits = int_fits(value.type, std::get<int64_t>(v));
      }
      if (!fits) {
        bad(fmt::format("value does not fit in {}", gguf_value_type_name(value.type)));
      }
      return;
    }
  }
  if (!std::holds_alternative<GgufArray>(v)) bad("array value must hold GgufArray");
  const GgufArray& array = std::get<GgufArray>(v);
  const GgufValueType element = array.element_type;
  if (static_cast<uint32_t>(element) > 12) bad("invalid array element type");
  if (element == GgufValueType::ARRAY) bad("nested arrays are not allowed (ggml refuses them)");
  const bool uses_ints = is_integer_or_bool(element);
  const bool uses_floats = element == GgufValueType::F32 || element == GgufValueType::F64;
  const bool uses_strings = element == GgufValueType::STRING;
  if ((!uses_ints && !array.ints.empty()) || (!uses_floats && !array.floats.empty()) ||
      (!uses_strings && !array.strings.empty())) {
    bad(fmt::format("array<{}> holds elements of another kind", gguf_value_type_name(element)));
  }
  for (size_t i = 0; element == GgufValueType::F32 && i < array.floats.size(); ++i) {
    if (!fits_f32(array.floats[i])) bad(fmt::format("element {} = {} does not fit in f32", i, array.floats[i]));
  }
  for (size_t i = 0; uses_ints && i < array.ints.size(); ++i) {
    if (!int_fits(element, array.ints[i])) {
      bad(fmt::format("element {} = {} does not fit in {}", i, array.ints[i],
                      gguf_value_type_name(element)));
    }
  }
}

}  // namespace

// Destination of a serialised file: the atomic temp file, or a byte vector.
class GgufOutput {
 public:
  virtual ~GgufOutput() = default;
  virtual void write(std::span<const uint8_t> bytes) = 0;
  virtual void write_zeros(uint64_t n_bytes) = 0;
  virtual uint64_t bytes_written() const = 0;
  virtual const std::string& name() const = 0;  // for error messages
};

namespace {

class FileOutput final : public GgufOutput {
 public:
  explicit FileOutput(const std::string& path) : file_(path) {}
  void write(std::span<const uint8_t> bytes) override { file_.write(bytes); }
  void write_zeros(uint64_t n_bytes) override { file_.write_zeros(n_bytes); }
  uint64_t bytes_written() const override { return file_.bytes_written(); }
  const std::string& name() const override { return file_.path(); }
  void commit() { file_.commit(); }

 private:
  AtomicFile file_;
};

class MemoryOutput final : public GgufOutput {
 public:
  void write(std::span<const uint8_t> bytes) override { bytes_.insert(bytes_.end(), bytes.begin(), bytes.end()); }
  void write_zeros(uint64_t n_bytes) override { bytes_.resize(bytes_.size() + n_bytes, 0); }
  uint64_t bytes_written() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::string name_ = "(memory)";
  std::vector<uint8_t> bytes_;
};

}  // namespace

GgufTensorSink::GgufTensorSink(GgufOutput& out, const GgufTensorDecl& tensor)
    : out_(out), tensor_(tensor), expected_(tensor.n_bytes) {}

void GgufTensorSink::write(std::span<const uint8_t> bytes) {
  if (bytes.size() > expected_ - written_) {
    fail("{}: tensor '{}': producer wrote {} bytes, more than its size of {} bytes", out_.name(),
         tensor_.name, written_ + bytes.size(), expected_);
  }
  out_.write(bytes);
  written_ += bytes.size();
}

GgufWriter GgufWriter::from_file(const GgufFile& source) {
  GgufWriter writer;
  for (const std::string& key : source.keys()) writer.add(key, *source.find(key));
  for (const TensorInfo& t : source.tensors()) {
    writer.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims));
  }
  return writer;
}

void GgufWriter::add(std::string key, GgufValue value) {
  if (key.empty()) fail("gguf writer: empty metadata key");
  if (key.size() > kMaxKeyBytes) fail("gguf writer: key of {} bytes exceeds {}", key.size(), kMaxKeyBytes);
  if (key_names_.contains(key)) fail("gguf writer: key '{}' added twice", key);
  validate_value(key, value);
  if (key == "general.alignment") {
    // ggml reads this key as u32 only and requires a power of two; the spec wants a multiple of 8.
    if (value.type != GgufValueType::U32) {
      fail("gguf writer: key 'general.alignment': expected type u32, found {}",
           gguf_value_type_description(value));
    }
    const uint64_t alignment = std::get<uint64_t>(value.value);
    if (!std::has_single_bit(alignment) || alignment % 8 != 0 || alignment > kMaxAlignment) {
      fail("gguf writer: key 'general.alignment': expected a power of two, multiple of 8, at most "
           "{}, found {}", kMaxAlignment, alignment);
    }
    alignment_ = static_cast<uint32_t>(alignment);
    assign_offsets();
  }
  key_names_.insert(key);
  kvs_.push_back({std::move(key), std::move(value)});
}

namespace {
GgufValue scalar(GgufValueType type, std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v) {
  GgufValue value;
  value.type = type;
  value.value = std::move(v);
  return value;
}
}  // namespace

void GgufWriter::add_u8(std::string key, uint8_t v) { add(std::move(key), scalar(GgufValueType::U8, uint64_t{v})); }
void GgufWriter::add_i8(std::string key, int8_t v) { add(std::move(key), scalar(GgufValueType::I8, int64_t{v})); }
void GgufWriter::add_u16(std::string key, uint16_t v) { add(std::move(key), scalar(GgufValueType::U16, uint64_t{v})); }
void GgufWriter::add_i16(std::string key, int16_t v) { add(std::move(key), scalar(GgufValueType::I16, int64_t{v})); }
void GgufWriter::add_u32(std::string key, uint32_t v) { add(std::move(key), scalar(GgufValueType::U32, uint64_t{v})); }
void GgufWriter::add_i32(std::string key, int32_t v) { add(std::move(key), scalar(GgufValueType::I32, int64_t{v})); }
void GgufWriter::add_u64(std::string key, uint64_t v) { add(std::move(key), scalar(GgufValueType::U64, v)); }
void GgufWriter::add_i64(std::string key, int64_t v) { add(std::move(key), scalar(GgufValueType::I64, v)); }
void GgufWriter::add_f32(std::string key, float v) { add(std::move(key), scalar(GgufValueType::F32, double{v})); }
void GgufWriter::add_f64(std::string key, double v) { add(std::move(key), scalar(GgufValueType::F64, v)); }
void GgufWriter::add_bool(std::string key, bool v) { add(std::move(key), scalar(GgufValueType::BOOL, v)); }
void GgufWriter::add_string(std::string key, std::string v) {
  add(std::move(key), scalar(GgufValueType::STRING, std::move(v)));
}

void GgufWriter::add_array(std::string key, GgufValueType element_type, std::span<const int64_t> values) {
  GgufArray array;
  array.element_type = element_type;
  if (!is_integer_or_bool(element_type)) {
    fail("gguf writer: key '{}': integer values given for array<{}>", key, gguf_value_type_name(element_type));
  }
  array.ints.assign(values.begin(), values.end());
  add(std::move(key), scalar(GgufValueType::ARRAY, std::move(array)));
}

void GgufWriter::add_array(std::string key, GgufValueType element_type, std::span<const double> values) {
  GgufArray array;
  array.element_type = element_type;
  if (element_type != GgufValueType::F32 && element_type != GgufValueType::F64) {
    fail("gguf writer: key '{}': float values given for array<{}>", key, gguf_value_type_name(element_type));
  }
  array.floats.assign(values.begin(), values.end());
  add(std::move(key), scalar(GgufValueType::ARRAY, std::move(array)));
}

void GgufWriter::add_array_i32(std::string key, std::span<const int32_t> values) {
  const std::vector<int64_t> wide(values.begin(), values.end());
  add_array(std::move(key), GgufValueType::I32, wide);
}

void GgufWriter::add_array_u32(std::string key, std::span<const uint32_t> values) {
  const std::vector<int64_t> wide(values.begin(), values.end());
  add_array(std::move(key), GgufValueType::U32, wide);
}

void GgufWriter::add_array_f32(std::string key, std::span<const float> values) {
  const std::vector<double> wide(values.begin(), values.end());
  add_array(std::move(key), GgufValueType::F32, wide);
}

void GgufWriter::add_array_string(std::string key, std::span<const std::string> values) {
  GgufArray array;
  array.element_type = GgufValueType::STRING;
  array.strings.assign(values.begin(), values.end());
  add(std::move(key), scalar(GgufValueType::ARRAY, std::move(array)));
}

GgufTensorDecl GgufWriter::add_tensor(std::string name, GgmlType type, const std::vector<int64_t>& ne) {
  if (name.empty() || name.size() > kMaxTensorNameBytes) {
    fail("gguf writer: tensor name '{}' has {} bytes, expected 1..{}", name, name.size(), kMaxTensorNameBytes);
  }
  if (name.find('\0') != std::string::npos) fail("gguf writer: tensor name contains a NUL byte");
  if (tensor_names_.contains(name)) fail("gguf writer: tensor '{}' added twice", name);
  if (ne.empty() || ne.size() > 4) {
    fail("gguf writer: tensor '{}': n_dims must be 1..4, found {}", name, ne.size());
  }
  GgufTensorDecl decl;
  decl.type = type;
  decl.n_dims = static_cast<int>(ne.size());
  const TypeTraits& traits = type_traits(type);
  int64_t n_elements = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    // ggml's reader divides INT64_MAX by ne[1..3] to check the element count, so a zero
    // dimension would crash llama.cpp: refuse it here even though the spec allows it.
    if (ne[d] <= 0) fail("gguf writer: tensor '{}': ne[{}] = {}, expected >= 1", name, d, ne[d]);
    decl.ne[d] = ne[d];
    if (__builtin_mul_overflow(n_elements, ne[d], &n_elements)) {
      fail("gguf writer: tensor '{}': element count overflows int64", name);
    }
  }
  if (decl.ne[0] % traits.block_elems != 0) {
    fail("gguf writer: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", name,
         decl.ne[0], traits.name, traits.block_elems);
  }
  if (__builtin_mul_overflow(uint64_t(n_elements / traits.block_elems), uint64_t{traits.block_bytes},
                             &decl.n_bytes)) {
    fail("gguf writer: tensor '{}': size in bytes overflows 64 bits", name);
  }
  if (!tensors_.empty()) {
    decl.data_offset = tensors_.back().data_offset + pad_to(tensors_.back().n_bytes, alignment_);
  }
  decl.name = std::move(name);
  tensor_names_.insert(decl.name);
  tensors_.push_back(std::move(decl));
  tensor_data_.emplace_back();
  has_data_.push_back(false);
  return tensors_.back();
}

GgufTensorDecl GgufWriter::add_tensor(std::string name, GgmlType type, const std::vector<int64_t>& ne,
                                      std::span<const uint8_t> data) {
  GgufTensorDecl decl = add_tensor(std::move(name), type, ne);
  if (data.size() != decl.n_bytes) {
    tensor_names_.erase(decl.name);
    tensors_.pop_back();
    tensor_data_.pop_back();
    has_data_.pop_back();
    fail("gguf writer: tensor '{}': {} data bytes given, expected {}", decl.name, data.size(), decl.n_bytes);
  }
  tensor_data_.back().assign(data.begin(), data.end());
  has_data_.back() = true;
  return decl;
}

void GgufWriter::assign_offsets() {
  uint64_t offset = 0;
  for (GgufTensorDecl& t : tensors_) {
    t.data_offset = offset;
    offset += pad_to(t.n_bytes, alignment_);
  }
}

std::vector<uint8_t> GgufWriter::serialize_metadata() const {
  ByteWriter out;
  out.put<uint32_t>(0x46554747u);  // "GGUF" as a little-endian u32
  out.put<uint32_t>(kGgufVersion);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(kvs_.size());
  for (const KeyValue& kv : kvs_) {
    out.put_string(kv.key);
    put_value(out, kv.value);
  }
  for (const GgufTensorDecl& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) out.put<uint64_t>(static_cast<uint64_t>(t.ne[d]));
    out.put<uint32_t>(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(t.data_offset);
  }
  out.pad(alignment_);  // ggml's writer pads here even when there are no tensors
  return out.take();
}

void GgufWriter::write_file(const std::string& path, const TensorProducer& produce) const {
  FileOutput out(path);
  write_to(out, produce);
  out.commit();
}

std::vector<uint8_t> GgufWriter::write_memory(const TensorProducer& produce) const {
  MemoryOutput out;
  write_to(out, produce);
  return out.take();
}

void GgufWriter::write_to(GgufOutput& out, const TensorProducer& produce) const {
  const std::string& name = out.name();
  out.write(serialize_metadata());
  const uint64_t data_start = out.bytes_written();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensorDecl& tensor = tensors_[i];
    if (out.bytes_written() - data_start != tensor.data_offset) {
      fail("{}: tensor '{}': internal layout error (at data offset {}, declared {})", name,
           tensor.name, out.bytes_written() - data_start, tensor.data_offset);
    }
    GgufTensorSink sink(out, tensor);
    if (has_data_[i]) {
      sink.write(tensor_data_[i]);
    } else if (produce) {
      produce(tensor, sink);
    } else {
      fail("{}: tensor '{}': no data given and no producer callback", name, tensor.name);
    }
    if (sink.bytes_written() != tensor.n_bytes) {
      fail("{}: tensor '{}': producer wrote {} bytes, expected {}", name, tensor.name,
           sink.bytes_written(), tensor.n_bytes);
    }
    out.write_zeros(pad_to(tensor.n_bytes, alignment_) - tensor.n_bytes);  // after every tensor
  }
}

}  // namespace strata
