// ReadFile — one file the expert readers read from, opened twice: with O_DIRECT (reads bypass the
// page cache, so streaming experts never evicts the dense weights' pages) and buffered.
//
// Contract
// - `direct()` says whether reads should go through `direct_fd()` right now; else `buffered_fd()`.
// - When the filesystem refuses O_DIRECT — at open (tmpfs, some FUSE mounts: EINVAL) or on a read
//   (EINVAL: alignment rules this file's reads do not meet) — the file switches to buffered reads
//   for good and prints ONE warning naming the file and the reason (`refuse_direct`).
// - The descriptors live as long as the ReadFile. Thread-safe: the I/O threads share one.
// - `size_now()` is the file's size at this moment (fstat), to tell a truncated file from a
//   failing disk in error messages.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace strata {

class ReadFile {
 public:
  // How a descriptor is opened: ::open by default; tests pass one that refuses O_DIRECT the way
  // tmpfs did before Linux 6.6 (this kernel's tmpfs accepts it).
  using Opener = int (*)(const char* path, int flags);
  // Throws strata::Error naming `path` when it cannot be opened at all.
  ReadFile(std::string path, bool want_direct, Opener opener = nullptr);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_fd_ >= 0 && !refused_.load(std::memory_order_relaxed); }
  int direct_fd() const { return direct_fd_; }
  int buffered_fd() const { return buffered_fd_; }
  // Called after a direct read failed with EINVAL: switches to buffered reads (warning once, even
  // when several threads call it) and returns true (retry buffered). False when the file was
  // never opened for direct reads (the caller's error is real).
  bool refuse_direct(const char* why);
  uint64_t size_now() const;

 private:
  std::string path_;
  int direct_fd_ = -1, buffered_fd_ = -1;
  std::atomic<bool> refused_{false};
};

}  // namespace strata
