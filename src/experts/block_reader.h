// Positional reads for the expert store: pread, or io_uring with several pieces in flight at once.
//
// Contract
// - `read_exact(fd, offset, length, dest, piece_bytes)` fills dest with exactly `length` bytes from
//   `offset` or throws ReadError carrying the errno (0 for an unexpected end of file).
// - With io_uring (when the kernel allows it; checked once per thread, falling back to pread
//   silently), the range is cut into `piece_bytes` pieces that are all submitted together, so one
//   I/O thread keeps several requests in flight for a large record; short completions are finished
//   with pread. Without it, one pread loop.
// - Each thread owns its ring (thread_local), so calls from different threads never share state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace strata {

struct ReadError : std::runtime_error {
  ReadError(int error_number, uint64_t at);
  int error_number;  // 0: end of file
  uint64_t offset;   // where the failing read started
};

enum class ReadBackend { Pread, IoUring };

void read_exact(ReadBackend backend, int fd, uint64_t offset, uint64_t length, uint8_t* dest,
                uint64_t piece_bytes);

// Whether io_uring works here (probed once: set-up of a small ring).
bool io_uring_available();

}  // namespace strata
