// AtomicFile — writes a file so that a crash or an error leaves either the old file or the
// complete new one at the target path, never half of one (the SQLite/LevelDB habit).
//
// Contract
// - The constructor creates "<path>.tmp.<random>" in the target's directory (O_EXCL, mode 0666
//   minus umask); `write` appends through an in-memory buffer; `commit` flushes, fsyncs, renames
//   over the target and fsyncs the directory.
// - Destroying an AtomicFile without a successful `commit` (an exception unwinding, a producer
//   that failed) closes and unlinks the temp file: nothing appears at the target path.
// - Every I/O failure (ENOSPC, EFBIG, a missing directory, ...) throws strata::Error naming the
//   target path and the errno text. Not thread-safe: one writer per AtomicFile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path, size_t buffer_bytes = size_t{1} << 20);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::span<const uint8_t> bytes);
  void write_zeros(uint64_t n_bytes);
  uint64_t bytes_written() const { return bytes_written_; }
  // Makes the file visible at `path`. Throws on failure (the temp file is then removed).
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();
  [[noreturn]] void fail_io(const char* operation, int error_number) const;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<uint8_t> buffer_;
  size_t buffered_ = 0;
  uint64_t bytes_written_ = 0;
};

// The whole of `text` as the file at `path`, through an AtomicFile (a report rewritten after every
// round: a run cut short leaves the previous round's file, never half of one). Throws like
// AtomicFile.
void write_text_file(const std::string& path, std::string_view text);

}  // namespace strata
