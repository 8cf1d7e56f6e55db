#include "gguf/gguf_parser.h"

#include <bit>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace strata {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF parser assumes a little-endian host");

constexpr uint64_t kHeaderBytes = 24;  // magic, version, tensor_count, kv_count
// Smallest possible encodings, used to bound counts by the bytes that remain before reserving.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;              // key len, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, ne0, type, offset
constexpr uint64_t kMaxKeyBytes = 65535;  // spec
// ggml's reader refuses longer strings / arrays; a file with them is unusable by llama.cpp anyway,
// and the caps keep a crafted file from making us allocate several times its size.
constexpr uint64_t kMaxStringBytes = 64ull << 20;
constexpr uint64_t kMaxArrayElements = 64ull << 20;
constexpr uint64_t kMaxTensorNameBytes = 63;  // GGML_MAX_NAME = 64 including the NUL
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxAlignment = 1u << 20;  // ggml's bound; legitimate files use 32..4096
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxValueTypeId = 12;

// Bytes of one element of a fixed-size value type; 0 for string and array.
uint64_t fixed_value_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    case GgufValueType::STRING: case GgufValueType::ARRAY: return 0;
  }
  return 0;
}

std::string printable_magic(const uint8_t* bytes) {
  std::string out;
  for (int i = 0; i < 4; ++i) out += (bytes[i] >= 0x20 && bytes[i] < 0x7f) ? char(bytes[i]) : '?';
  return out;
}

uint64_t pad_to(uint64_t offset, uint64_t alignment) {
  return offset + (alignment - offset % alignment) % alignment;
}

}  // namespace

GgufParser::GgufParser(GgufFile& file, std::span<const uint8_t> bytes)
    : file_(file), data_(bytes.data()), size_(bytes.size()) {}

void GgufParser::fail_at(std::string_view where, std::string_view what) const {
  fail("{}: {}: {}", file_.path_, where, what);
}

void GgufParser::need(uint64_t n_bytes, std::string_view where) const {
  if (n_bytes > remaining()) {
    fail("{}: {}: needs {} bytes at offset {}, but the file ends at offset {} (truncated?)",
         file_.path_, where, n_bytes, pos_, size_);
  }
}

template <typename T>
T GgufParser::read(std::string_view where) {
  need(sizeof(T), where);
  T value;
  std::memcpy(&value, data_ + pos_, sizeof(T));
  pos_ += sizeof(T);
  return value;
}

std::string GgufParser::read_string(std::string_view where, uint64_t max_bytes) {
  const uint64_t length = read<uint64_t>(fmt::format("{} length", where));
  if (length > max_bytes) {
    fail_at(where, fmt::format("string length {} exceeds the maximum of {} bytes", length, max_bytes));
  }
  if (length > remaining()) {
    fail_at(where, fmt::format("string length {} at offset {} runs past the end of the file "
                               "({} bytes remain)", length, pos_, remaining()));
  }
  std::string value(reinterpret_cast<const char*>(data_ + pos_), length);
  pos_ += length;
  return value;
}

GgufValueType GgufParser::read_value_type(std::string_view where) {
  const uint32_t id = read<uint32_t>(where);
  if (id > kMaxValueTypeId) {
    fail_at(where, fmt::format("expected a GGUF value type id 0..{}, found {}", kMaxValueTypeId, id));
  }
  return static_cast<GgufValueType>(id);
}

void GgufParser::parse() {
  parse_header();
  for (uint64_t i = 0; i < kv_count_; ++i) parse_kv(i);
  check_alignment_key();
  for (uint64_t i = 0; i < tensor_count_; ++i) parse_tensor_info(i);
  place_tensor_data();
}

void GgufParser::parse_header() {
  file_.file_size_ = size_;
  if (size_ < 4) {
    fail_at("header magic", fmt::format("file is {} bytes, too small to be a GGUF file "
                                        "(header is {} bytes)", size_, kHeaderBytes));
  }
  if (std::memcmp(data_, "GGUF", 4) != 0) {
    fail_at("header magic", fmt::format("expected 'GGUF' (47 47 55 46), found '{}' ({:02x} {:02x} "
                                        "{:02x} {:02x}); not a GGUF file", printable_magic(data_),
                                        data_[0], data_[1], data_[2], data_[3]));
  }
  pos_ = 4;
  const uint32_t version = read<uint32_t>("header version");
  if (version != 0 && (version & 0xffff) == 0) {
    fail_at("header version", fmt::format("found 0x{:08x}, which looks byte-swapped: a big-endian "
                                          "GGUF file; only little-endian files are supported",
                                          version));
  }
  if (version < 2 || version > 3) {
    fail_at("header version", fmt::format("expected 2 or 3, found {}{}", version,
                                          version == 1 ? " (GGUF v1 is obsolete; re-convert the model)"
                                                       : ""));
  }
  file_.version_ = version;
  tensor_count_ = read<uint64_t>("header tensor_count");
  kv_count_ = read<uint64_t>("header kv_count");
  // Bound both counts by the bytes left, so a corrupted count fails here instead of in reserve().
  if (kv_count_ > remaining() / kMinKvBytes) {
    fail_at("header kv_count", fmt::format("{} key-value pairs cannot fit in the {} bytes after the "
                                           "header (each needs at least {} bytes)",
                                           kv_count_, remaining(), kMinKvBytes));
  }
  if (tensor_count_ > remaining() / kMinTensorInfoBytes) {
    fail_at("header tensor_count", fmt::format("{} tensor infos cannot fit in the {} bytes after the "
                                               "header (each needs at least {} bytes)",
                                               tensor_count_, remaining(), kMinTensorInfoBytes));
  }
  file_.key_order_.reserve(kv_count_);
  file_.tensors_.reserve(tensor_count_);
}

void GgufParser::parse_kv(uint64_t index) {
  const std::string key_where = fmt::format("key #{}", index);
  std::string key = read_string(key_where, kMaxKeyBytes);
  if (key.empty()) fail_at(key_where, "expected a non-empty key, found an empty string");
  if (file_.kv_.contains(key)) {
    fail_at(fmt::format("key '{}' (#{})", key, index), "duplicate key (keys must be unique)");
  }
  const std::string where = fmt::format("key '{}'", key);
  const GgufValueType type = read_value_type(where + " value type");
  GgufValue value;
  value.type = type;
  const std::string value_where = where + " value";
  switch (type) {
    case GgufValueType::U8: value.value = uint64_t{read<uint8_t>(value_where)}; break;
    case GgufValueType::U16: value.value = uint64_t{read<uint16_t>(value_where)}; break;
    case GgufValueType::U32: value.value = uint64_t{read<uint32_t>(value_where)}; break;
    case GgufValueType::U64: value.value = read<uint64_t>(value_where); break;
    case GgufValueType::I8: value.value = int64_t{read<int8_t>(value_where)}; break;
    case GgufValueType::I16: value.value = int64_t{read<int16_t>(value_where)}; break;
    case GgufValueType::I32: value.value = int64_t{read<int32_t>(value_where)}; break;
    case GgufValueType::I64: value.value = read<int64_t>(value_where); break;
    case GgufValueType::F32: value.value = double{read<float>(value_where)}; break;
    case GgufValueType::F64: value.value = read<double>(value_where); break;
    case GgufValueType::BOOL: {
      const uint8_t byte = read<uint8_t>(value_where);
      if (byte > 1) fail_at(value_where, fmt::format("bool must be 0 or 1, found {}", byte));
      value.value = byte == 1;
      break;
    }
    case GgufValueType::STRING: value.value = read_string(value_where, kMaxStringBytes); break;
    case GgufValueType::ARRAY: value = parse_array(where); break;
  }
  file_.key_order_.push_back(key);
  file_.kv_.emplace(std::move(key), std::move(value));
}

GgufValue GgufParser::parse_array(const std::string& where) {
  const GgufValueType element_type = read_value_type(where + " array element type");
  if (element_type == GgufValueType::ARRAY) {
    fail_at(where, "nested arrays are not supported (element type is array; ggml refuses them too)");
  }
  const uint64_t count = read<uint64_t>(where + " array count");
  if (count > kMaxArrayElements) {
    fail_at(where, fmt::format("array count {} exceeds the maximum of {} elements", count,
                               kMaxArrayElements));
  }
  // A string element takes at least its 8-byte length.
  const uint64_t min_element_bytes =
      element_type == GgufValueType::STRING ? 8 : fixed_value_bytes(element_type);
  if (count > remaining() / min_element_bytes) {
    fail_at(where, fmt::format("array of {} {} elements needs at least {} bytes, but only {} remain "
                               "in the file", count, gguf_value_type_name(element_type),
                               count * min_element_bytes, remaining()));
  }
  GgufArray array;
  array.element_type = element_type;
  const uint8_t* p = data_ + pos_;
  auto load = [&](auto tag) {
    using T = decltype(tag);
    T element;
    std::memcpy(&element, p, sizeof(T));
    p += sizeof(T);
    return element;
  };
  switch (element_type) {
    case GgufValueType::F32:
    case GgufValueType::F64:
      array.floats.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        array.floats.push_back(element_type == GgufValueType::F32 ? double{load(float{})}
                                                                  : load(double{}));
      }
      break;
    case GgufValueType::STRING:
      array.strings.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        // Fast path without building a field name; the slow path re-reads to report the error.
        uint64_t length = 0;
        if (remaining() >= 8) std::memcpy(&length, data_ + pos_, 8);
        if (remaining() < 8 || length > kMaxStringBytes || length > remaining() - 8) {
          read_string(fmt::format("{} element {}", where, i), kMaxStringBytes);
        }
        array.strings.emplace_back(reinterpret_cast<const char*>(data_ + pos_ + 8), length);
        pos_ += 8 + length;
      }
      break;
    default:
      array.ints.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        int64_t element = 0;
        switch (element_type) {
          case GgufValueType::U8: element = load(uint8_t{}); break;
          case GgufValueType::I8: element = load(int8_t{}); break;
          case GgufValueType::U16: element = load(uint16_t{}); break;
          case GgufValueType::I16: element = load(int16_t{}); break;
          case GgufValueType::U32: element = load(uint32_t{}); break;
          case GgufValueType::I32: element = load(int32_t{}); break;
          case GgufValueType::U64: element = static_cast<int64_t>(load(uint64_t{})); break;
          case GgufValueType::I64: element = load(int64_t{}); break;
          case GgufValueType::BOOL: {
            const uint8_t byte = load(uint8_t{});
            if (byte > 1) {
              fail_at(fmt::format("{} element {}", where, i),
                      fmt::format("bool must be 0 or 1, found {}", byte));
            }
            element = byte;
            break;
          }
          default: break;  // floats, strings and arrays handled above
        }
        array.ints.push_back(element);
      }
      break;
  }
  if (element_type != GgufValueType::STRING) pos_ += count * min_element_bytes;
  GgufValue value;
  value.type = GgufValueType::ARRAY;
  value.value = std::move(array);
  return value;
}

void GgufParser::check_alignment_key() {
  const auto it = file_.kv_.find(std::string_view("general.alignment"));
  if (it == file_.kv_.end()) {
    file_.alignment_ = kDefaultAlignment;
    return;
  }
  const GgufValue& value = it->second;
  if (value.type != GgufValueType::U32) {
    // ggml reads this key with gguf_get_val_u32 and aborts on any other type.
    fail_at("key 'general.alignment'",
            fmt::format("expected type u32, found {}", gguf_value_type_description(value)));
  }
  const uint64_t alignment = std::get<uint64_t>(value.value);
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment % 8 != 0 ||
      alignment > kMaxAlignment) {
    fail_at("key 'general.alignment'",
            fmt::format("expected a power of two, multiple of 8, at most {}, found {}", kMaxAlignment,
                        alignment));
  }
  file_.alignment_ = static_cast<uint32_t>(alignment);
}

void GgufParser::parse_tensor_info(uint64_t index) {
  const std::string index_where = fmt::format("tensor #{} name", index);
  std::string name = read_string(index_where, kMaxTensorNameBytes);
  if (name.empty()) fail_at(index_where, "expected a non-empty tensor name");
  if (name.find('\0') != std::string::npos) fail_at(index_where, "tensor name contains a NUL byte");
  const std::string where = fmt::format("tensor '{}'", name);
  if (file_.tensor_index_.contains(name)) {
    fail_at(where, fmt::format("duplicate tensor name (tensor #{} repeats tensor #{})", index,
                               file_.tensor_index_.find(name)->second));
  }
  TensorInfo info;
  info.name = std::move(name);
  const uint32_t n_dims = read<uint32_t>(where + " n_dims");
  if (n_dims < 1 || n_dims > kMaxDims) {
    fail_at(where, fmt::format("n_dims: expected 1..{}, found {}", kMaxDims, n_dims));
  }
  info.n_dims = static_cast<int>(n_dims);
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t ne = read<uint64_t>(fmt::format("{} ne[{}]", where, d));
    if (ne > uint64_t(std::numeric_limits<int64_t>::max())) {
      fail_at(where, fmt::format("ne[{}]: expected a value in 0..2^63-1, found {} (negative as "
                                 "int64)", d, ne));
    }
    info.ne[d] = static_cast<int64_t>(ne);
    if (__builtin_mul_overflow(n_elements, info.ne[d], &n_elements)) {
      fail_at(where, fmt::format("ne[{}] = {}: the element count overflows int64", d, ne));
    }
  }
  const uint32_t type_id = read<uint32_t>(where + " type");
  const TypeTraits* traits = type_traits_or_null(type_id);
  if (traits == nullptr) fail_at(where, fmt::format("unknown ggml type id {}", type_id));
  info.type = traits->type;
  if (info.ne[0] % traits->block_elems != 0) {
    fail_at(where, fmt::format("ne[0] = {} is not a multiple of the {} block size {}", info.ne[0],
                               traits->name, traits->block_elems));
  }
  const uint64_t n_blocks = static_cast<uint64_t>(n_elements / traits->block_elems);
  if (__builtin_mul_overflow(n_blocks, uint64_t{traits->block_bytes}, &info.n_bytes)) {
    fail_at(where, fmt::format("size in bytes of {} {} blocks overflows 64 bits", n_blocks,
                               traits->name));
  }
  info.data_offset = read<uint64_t>(where + " offset");
  file_.tensor_index_.emplace(info.name, file_.tensors_.size());
  file_.tensors_.push_back(std::move(info));
}

void GgufParser::place_tensor_data() {
  const uint64_t alignment = file_.alignment_;
  // ggml pads to the alignment before the data section only when there are tensors.
  const uint64_t data_offset = tensor_count_ == 0 ? pos_ : pad_to(pos_, alignment);
  if (data_offset > size_) {
    fail_at("data section", fmt::format("starts at offset {} (end of tensor infos {} padded to {}), "
                                        "past the end of the file at {}",
                                        data_offset, pos_, alignment, size_));
  }
  file_.data_offset_ = data_offset;
  const uint64_t data_bytes = size_ - data_offset;
  uint64_t expected_offset = 0;
  for (TensorInfo& info : file_.tensors_) {
    const std::string where = fmt::format("tensor '{}'", info.name);
    if (info.data_offset % alignment != 0) {
      fail_at(where, fmt::format("offset {} is not a multiple of the alignment {}", info.data_offset,
                                 alignment));
    }
    if (info.data_offset != expected_offset) {
      fail_at(where, fmt::format("offset: expected {} (tensor data must be consecutive in tensor-info "
                                 "order, as ggml requires), found {}", expected_offset,
                                 info.data_offset));
    }
    if (info.data_offset > data_bytes || info.n_bytes > data_bytes - info.data_offset) {
      fail_at(where, fmt::format("data [{}, +{} bytes) at file offset {} runs past the end of the "
                                 "file (size {})", info.data_offset, info.n_bytes,
                                 data_offset + info.data_offset, size_));
    }
    info.file_offset = data_offset + info.data_offset;
    // Cannot overflow: both terms are bounded by the file size and the alignment.
    expected_offset = info.data_offset + pad_to(info.n_bytes, alignment);
  }
}

}  // namespace strata
