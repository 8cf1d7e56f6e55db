// GgufFile: opening (mmap or memory copy) and typed metadata / tensor access.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gguf/gguf.h"
#include "gguf/gguf_parser.h"
#include "util/error.h"

namespace strata {

size_t TensorInfo::row_bytes() const { return strata::row_bytes(type, ne[0]); }

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  // O_NONBLOCK so that a FIFO given by mistake fails the regular-file check instead of hanging.
  file->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file->fd_ < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(file->fd_, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > 0) {
    // Read-only private mapping: pages are shared with the page cache and never written.
    void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file->fd_, 0);
    if (mapping == MAP_FAILED) fail("{}: cannot mmap {} bytes: {}", path, size, std::strerror(errno));
    file->base_ = static_cast<const uint8_t*>(mapping);
    file->mapped_bytes_ = size;
  }
  GgufParser(*file, std::span<const uint8_t>(file->base_, size)).parse();
  return file;
}

std::unique_ptr<GgufFile> GgufFile::open_from_memory(std::span<const uint8_t> bytes,
                                                     const std::string& name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = name;
  file->owned_bytes_.assign(bytes.begin(), bytes.end());
  file->base_ = file->owned_bytes_.data();
  GgufParser(*file, file->owned_bytes_).parse();
  return file;
}

GgufFile::~GgufFile() {
  if (mapped_bytes_ > 0) munmap(const_cast<uint8_t*>(base_), mapped_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

bool GgufFile::has(std::string_view key) const { return kv_.find(key) != kv_.end(); }

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::require(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) fail("{}: key '{}': missing (required metadata)", path_, key);
  return *value;
}

const GgufArray& GgufFile::get_array(std::string_view key) const {
  const GgufValue& value = require(key);
  if (value.type != GgufValueType::ARRAY) {
    fail("{}: key '{}': expected an array, found {}", path_, key, gguf_value_type_description(value));
  }
  return std::get<GgufArray>(value.value);
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* info = find_tensor(name);
  if (info == nullptr) fail("{}: tensor '{}': missing (required tensor)", path_, name);
  return *info;
}

namespace {

template <typename T> constexpr std::string_view cpp_type_name() {
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  else if constexpr (std::is_same_v<T, uint16_t>) return "u16";
  else if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  else if constexpr (std::is_same_v<T, uint64_t>) return "u64";
  else if constexpr (std::is_same_v<T, int8_t>) return "i8";
  else if constexpr (std::is_same_v<T, int16_t>) return "i16";
  else if constexpr (std::is_same_v<T, int32_t>) return "i32";
  else if constexpr (std::is_same_v<T, int64_t>) return "i64";
  else return "?";
}

bool is_integer_type(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::U16: case GgufValueType::I16:
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::U64: case GgufValueType::I64:
      return true;
    default: return false;
  }
}

// Converts one stored integer (U64 values are kept as bits in int64_t) to T when it fits.
template <typename T> bool integer_fits(GgufValueType stored_type, int64_t stored, T& out) {
  if (stored_type == GgufValueType::U64) {
    const uint64_t unsigned_value = static_cast<uint64_t>(stored);
    if (!std::in_range<T>(unsigned_value)) return false;
    out = static_cast<T>(unsigned_value);
    return true;
  }
  if (!std::in_range<T>(stored)) return false;
  out = static_cast<T>(stored);
  return true;
}

template <typename T> struct is_vector : std::false_type {};
template <typename E> struct is_vector<std::vector<E>> : std::true_type {
  using element = E;
};

}  // namespace

template <typename T>
T GgufFile::get(std::string_view key) const {
  const GgufValue& value = require(key);
  auto wrong_type = [&](std::string_view expected) {
    fail("{}: key '{}': expected {}, found {}", path_, key, expected,
         gguf_value_type_description(value));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (value.type != GgufValueType::BOOL) wrong_type("bool");
    return std::get<bool>(value.value);
  } else if constexpr (std::is_integral_v<T>) {
    if (!is_integer_type(value.type)) wrong_type(fmt::format("an integer ({})", cpp_type_name<T>()));
    T out{};
    const auto* unsigned_value = std::get_if<uint64_t>(&value.value);
    const bool fits = unsigned_value != nullptr
                          ? integer_fits(GgufValueType::U64, static_cast<int64_t>(*unsigned_value), out)
                          : integer_fits(GgufValueType::I64, std::get<int64_t>(value.value), out);
    if (!fits) {
      fail("{}: key '{}': value {} ({}) does not fit in {}", path_, key,
           gguf_value_to_string(value), gguf_value_type_name(value.type), cpp_type_name<T>());
    }
    return out;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (value.type != GgufValueType::F32 && value.type != GgufValueType::F64) wrong_type("f32 or f64");
    const double stored = std::get<double>(value.value);
    // Narrowing a finite double beyond float's range is undefined behaviour; report it instead.
    if (std::is_same_v<T, float> && std::isfinite(stored) &&
        std::fabs(stored) > double(std::numeric_limits<float>::max())) {
      fail("{}: key '{}': value {} (f64) does not fit in f32", path_, key, stored);
    }
    return static_cast<T>(stored);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (value.type != GgufValueType::STRING) wrong_type("string");
    return std::get<std::string>(value.value);
  } else {
    static_assert(is_vector<T>::value, "unsupported GgufFile::get type");
    using E = typename is_vector<T>::element;
    const GgufArray* array = std::get_if<GgufArray>(&value.value);
    if constexpr (std::is_same_v<E, std::string>) {
      if (array == nullptr || array->element_type != GgufValueType::STRING) wrong_type("array<string>");
      return array->strings;
    } else if constexpr (std::is_floating_point_v<E>) {
      if (array == nullptr || (array->element_type != GgufValueType::F32 &&
                               array->element_type != GgufValueType::F64)) {
        wrong_type("array<f32> or array<f64>");
      }
      T out;
      out.reserve(array->floats.size());
      for (size_t i = 0; i < array->floats.size(); ++i) {
        const double stored = array->floats[i];
        if (std::is_same_v<E, float> && std::isfinite(stored) &&
            std::fabs(stored) > double(std::numeric_limits<float>::max())) {
          fail("{}: key '{}': element {} ({}) does not fit in f32", path_, key, i, stored);
        }
        out.push_back(static_cast<E>(stored));
      }
      return out;
    } else {
      if (array == nullptr || !is_integer_type(array->element_type)) {
        wrong_type(fmt::format("an integer array ({} elements)", cpp_type_name<E>()));
      }
      T out(array->ints.size());
      for (size_t i = 0; i < out.size(); ++i) {
        if (!integer_fits(array->element_type, array->ints[i], out[i])) {
          fail("{}: key '{}': element {} ({}) does not fit in {}", path_, key, i,
               array->element_type == GgufValueType::U64 ? fmt::format("{}", uint64_t(array->ints[i]))
                                                         : fmt::format("{}", array->ints[i]),
               cpp_type_name<E>());
        }
      }
      return out;
    }
  }
}

template uint8_t GgufFile::get<uint8_t>(std::string_view) const;
template uint16_t GgufFile::get<uint16_t>(std::string_view) const;
template uint32_t GgufFile::get<uint32_t>(std::string_view) const;
template uint64_t GgufFile::get<uint64_t>(std::string_view) const;
template int8_t GgufFile::get<int8_t>(std::string_view) const;
template int16_t GgufFile::get<int16_t>(std::string_view) const;
template int32_t GgufFile::get<int32_t>(std::string_view) const;
template int64_t GgufFile::get<int64_t>(std::string_view) const;
template float GgufFile::get<float>(std::string_view) const;
template double GgufFile::get<double>(std::string_view) const;
template bool GgufFile::get<bool>(std::string_view) const;
template std::string GgufFile::get<std::string>(std::string_view) const;
template std::vector<int64_t> GgufFile::get<std::vector<int64_t>>(std::string_view) const;
template std::vector<int32_t> GgufFile::get<std::vector<int32_t>>(std::string_view) const;
template std::vector<uint32_t> GgufFile::get<std::vector<uint32_t>>(std::string_view) const;
template std::vector<float> GgufFile::get<std::vector<float>>(std::string_view) const;
template std::vector<double> GgufFile::get<std::vector<double>>(std::string_view) const;
template std::vector<std::string> GgufFile::get<std::vector<std::string>>(std::string_view) const;

void GgufFile::advise(uint64_t offset, uint64_t length, int advice) const {
  if (mapped_bytes_ == 0 || length == 0 || offset >= mapped_bytes_) return;
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  const uint64_t end = std::min<uint64_t>(mapped_bytes_, offset + length);
  // Advice is a hint: a refusal changes speed, never results, so errors are ignored.
  madvise(const_cast<uint8_t*>(base_) + begin, size_t(end - begin), advice);
}

uint64_t GgufFile::copy_in_place(uint64_t offset, uint64_t length) const {
  if (mapped_bytes_ == 0 || length == 0 || offset >= mapped_bytes_) return 0;
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const auto round_up = [page](uint64_t v) { return (v + page - 1) / page * page; };
  const uint64_t begin = offset / page * page;
  const uint64_t end = std::min(round_up(offset + length), round_up(mapped_bytes_));
  const size_t n = size_t(end - begin);
  auto* target = const_cast<uint8_t*>(base_) + begin;
  // The copy is made at an address congruent to the target modulo 2 MiB, so the huge pages it gets
  // stay whole when mremap moves them (a huge page moved off that alignment is split).
  static constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  void* raw = mmap(nullptr, n + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return 0;
  const auto raw_at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t shift =
      (reinterpret_cast<uintptr_t>(target) % kHugePage + kHugePage - raw_at % kHugePage) % kHugePage;
  auto* copy = reinterpret_cast<uint8_t*>(raw_at + shift);
  if (shift > 0) munmap(raw, shift);
  if (kHugePage - shift > 0) munmap(copy + n, kHugePage - shift);
  madvise(copy, n, MADV_HUGEPAGE);  // a hint: without it the copy is still correct
  // pread, not a copy from the mapping: the file's pages are never mapped (no faults, no page tables).
  static constexpr size_t kChunkBytes = size_t{8} << 20;
  for (size_t at = 0; at < n;) {
    const ssize_t got = pread(fd_, copy + at, std::min(kChunkBytes, n - at), off_t(begin + at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      munmap(copy, n);
      return 0;
    }
    if (got == 0) break;  // end of file: the rest of the last page stays zero, as in the mapping
    at += size_t(got);
  }
  mprotect(copy, n, PROT_READ);
  // Atomically replaces the file pages at `target` (MREMAP_FIXED unmaps what was there).
  if (mremap(copy, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, target) == MAP_FAILED) {
    munmap(copy, n);
    return 0;
  }
  return n;
}

}  // namespace strata
