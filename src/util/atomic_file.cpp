#include "util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "util/error.h"

namespace strata {
namespace {

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, size_t buffer_bytes)
    : path_(std::move(path)), buffer_(buffer_bytes > 0 ? buffer_bytes : 1) {
  std::random_device random;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_path_ = fmt::format("{}.tmp.{:08x}", path_, random());
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) fail_io("cannot create temp file", errno);
  }
  if (fd_ < 0) fail_io("cannot create temp file", EEXIST);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::fail_io(const char* operation, int error_number) const {
  fail("{}: {} {}: {}", path_, operation, temp_path_, std::strerror(error_number));
}

void AtomicFile::flush_buffer() {
  size_t done = 0;
  while (done < buffered_) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffered_ - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io("write failed on", errno);
    }
    if (n == 0) fail_io("write failed on", EIO);
    done += static_cast<size_t>(n);
  }
  buffered_ = 0;
}

void AtomicFile::write(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const size_t n = std::min(bytes.size(), buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, bytes.data(), n);
    buffered_ += n;
    bytes_written_ += n;
    bytes = bytes.subspan(n);
    if (buffered_ == buffer_.size()) flush_buffer();
  }
}

void AtomicFile::write_zeros(uint64_t n_bytes) {
  static constexpr uint8_t kZeros[4096] = {};
  while (n_bytes > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(n_bytes, sizeof(kZeros)));
    write(std::span<const uint8_t>(kZeros, n));
    n_bytes -= n;
  }
}

void AtomicFile::commit() {
  if (committed_) fail("{}: commit called twice", path_);
  flush_buffer();
  if (::fsync(fd_) != 0) fail_io("fsync failed on", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io("close failed on", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail_io("cannot rename", errno);
  committed_ = true;
  // Persist the rename itself; a failure here does not un-write the file, so it is not fatal.
  const int dir_fd = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_text_file(const std::string& path, std::string_view text) {
  AtomicFile out(path);
  out.write(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  out.commit();
}

}  // namespace strata
