#include "convert/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "util/error.h"

namespace strata::convert {
namespace {

using nlohmann::json;

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  size_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::BOOL, "BOOL", 1},       {SafetensorsDtype::U8, "U8", 1},
    {SafetensorsDtype::I8, "I8", 1},           {SafetensorsDtype::U16, "U16", 2},
    {SafetensorsDtype::I16, "I16", 2},         {SafetensorsDtype::F16, "F16", 2},
    {SafetensorsDtype::BF16, "BF16", 2},       {SafetensorsDtype::U32, "U32", 4},
    {SafetensorsDtype::I32, "I32", 4},         {SafetensorsDtype::F32, "F32", 4},
    {SafetensorsDtype::U64, "U64", 8},         {SafetensorsDtype::I64, "I64", 8},
    {SafetensorsDtype::F64, "F64", 8},         {SafetensorsDtype::F8_E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::F8_E5M2, "F8_E5M2", 1},
};

const DtypeInfo& info(SafetensorsDtype dtype) {
  for (const DtypeInfo& entry : kDtypes) {
    if (entry.dtype == dtype) return entry;
  }
  fail("safetensors: internal error: dtype {} has no table entry", static_cast<int>(dtype));
}

std::optional<SafetensorsDtype> dtype_from_name(std::string_view name) {
  for (const DtypeInfo& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

// A JSON number that is a non-negative integer representable as u64, else nullopt.
std::optional<uint64_t> as_u64(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsTensor parse_tensor_entry(const std::string& name, const json& entry,
                                     uint64_t data_bytes, std::string_view origin) {
  if (!entry.is_object()) {
    fail("{}: tensor {}: expected an object with dtype/shape/data_offsets, found {}", origin, name,
         entry.type_name());
  }
  for (const auto& [field, value] : entry.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      fail("{}: tensor {}: unknown field \"{}\" (expected dtype, shape, data_offsets)", origin, name,
           field);
    }
  }
  SafetensorsTensor tensor;
  tensor.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    fail("{}: tensor {}: field dtype: expected a string", origin, name);
  }
  const std::string dtype_text = dtype_it->get<std::string>();
  const auto dtype = dtype_from_name(dtype_text);
  if (!dtype) fail("{}: tensor {}: unknown dtype \"{}\"", origin, name, dtype_text);
  tensor.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    fail("{}: tensor {}: field shape: expected an array of non-negative integers", origin, name);
  }
  if (shape_it->size() > 8) {
    fail("{}: tensor {}: field shape: {} dimensions, at most 8 supported", origin, name,
         shape_it->size());
  }
  uint64_t n_elements = 1;
  bool overflow = false;
  for (const json& dim : *shape_it) {
    const auto value = as_u64(dim);
    if (!value || *value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("{}: tensor {}: field shape: expected non-negative integers, found {}", origin, name,
           shape_it->dump());
    }
    tensor.shape.push_back(static_cast<int64_t>(*value));
    if (*value != 0 && n_elements > std::numeric_limits<uint64_t>::max() / *value) overflow = true;
    n_elements *= *value;
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    fail("{}: tensor {}: field data_offsets: expected [begin, end]", origin, name);
  }
  const auto begin = as_u64((*offsets_it)[0]);
  const auto end = as_u64((*offsets_it)[1]);
  if (!begin || !end) {
    fail("{}: tensor {}: field data_offsets: expected two non-negative integers, found {}", origin,
         name, offsets_it->dump());
  }
  if (*begin > *end) {
    fail("{}: tensor {}: data_offsets [{}, {}]: begin is after end", origin, name, *begin, *end);
  }
  if (*end > data_bytes) {
    fail("{}: tensor {}: data_offsets [{}, {}] end past the data section of {} bytes (file truncated?)",
         origin, name, *begin, *end, data_bytes);
  }
  const uint64_t element_bytes = info(tensor.dtype).bytes;
  if (overflow || n_elements > std::numeric_limits<uint64_t>::max() / element_bytes ||
      n_elements * element_bytes != *end - *begin) {
    fail("{}: tensor {}: shape {} of {} needs {} bytes, data_offsets [{}, {}] span {}", origin, name,
         shape_text(tensor.shape), dtype_text,
         overflow ? std::string("too many") : std::to_string(n_elements * element_bytes), *begin,
         *end, *end - *begin);
  }
  tensor.data_begin = *begin;
  tensor.data_end = *end;
  return tensor;
}

}  // namespace

std::string_view dtype_name(SafetensorsDtype dtype) { return info(dtype).name; }
size_t dtype_bytes(SafetensorsDtype dtype) { return info(dtype).bytes; }

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;  // validated at parse time not to overflow the byte size
  return n;
}

SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> file_prefix, uint64_t file_size,
                                           std::string_view origin) {
  if (file_size < 8 || file_prefix.size() < 8) {
    fail("{}: not a safetensors file: {} bytes, expected at least the 8-byte header length", origin,
         file_size);
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | file_prefix[i];
  if (header_bytes > file_size - 8) {
    fail("{}: header length {} exceeds the file ({} bytes after the length field)", origin,
         header_bytes, file_size - 8);
  }
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    fail("{}: header length {} exceeds the limit of {} bytes", origin, header_bytes,
         kMaxSafetensorsHeaderBytes);
  }
  if (file_prefix.size() - 8 < header_bytes) {
    fail("{}: header of {} bytes not available ({} given)", origin, header_bytes,
         file_prefix.size() - 8);
  }
  const char* text = reinterpret_cast<const char*>(file_prefix.data() + 8);

  // The callback catches what a DOM loses: duplicate top-level keys (nlohmann keeps the last one)
  // and nesting deeper than the format has (discarded, so a hostile header cannot build a deep tree).
  std::set<std::string> seen_names;
  std::string duplicate;
  bool too_deep = false;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > 4) {
      too_deep = true;
      return false;
    }
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (!seen_names.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  const json root = json::parse(text, text + header_bytes, callback, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail("{}: header is not valid JSON", origin);
  if (!root.is_object()) fail("{}: header is JSON {}, expected an object", origin, root.type_name());
  if (too_deep) fail("{}: header nests deeper than the safetensors format allows", origin);
  if (!duplicate.empty()) fail("{}: tensor {} appears twice in the header", origin, duplicate);

  SafetensorsHeader header;
  header.data_section_offset = 8 + header_bytes;
  const uint64_t data_bytes = file_size - header.data_section_offset;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__: expected an object of strings", origin);
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail("{}: __metadata__.{}: expected a string, found {}", origin, key, value.type_name());
        }
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail("{}: a tensor has an empty name", origin);
    header.tensors.push_back(parse_tensor_entry(name, entry, data_bytes, origin));
  }

  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& tensor : header.tensors) by_offset.push_back(&tensor);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->data_end < b->data_end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsTensor& previous = *by_offset[i - 1];
    const SafetensorsTensor& current = *by_offset[i];
    if (current.data_begin < previous.data_end) {
      fail("{}: tensors {} [{}, {}] and {} [{}, {}] overlap", origin, previous.name,
           previous.data_begin, previous.data_end, current.name, current.data_begin,
           current.data_end);
    }
  }
  return header;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(error));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  if (size > 0) {
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    ::close(fd);
    if (mapping == MAP_FAILED) fail("{}: cannot mmap {} bytes: {}", path, size, std::strerror(error));
    file->base_ = static_cast<const uint8_t*>(mapping);
    file->mapped_bytes_ = size;
  } else {
    ::close(fd);
  }
  file->header_ = parse_safetensors_header({file->base_, file->mapped_bytes_}, size, path);
  for (size_t i = 0; i < file->header_.tensors.size(); ++i) {
    file->index_.emplace(file->header_.tensors[i].name, i);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), mapped_bytes_);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const SafetensorsTensor& tensor) const {
  return {base_ + header_.data_section_offset + tensor.data_begin, tensor.n_bytes()};
}

}  // namespace strata::convert
