// Positional reads for the expert store: pread, or io_uring with several pieces in flight at once.
//
// Contract
// - `read_pieces(backend, pieces)` fills every piece's dest with exactly its `length` bytes from
//   its `offset` in its `fd`, or throws ReadError carrying the errno (0 for an unexpected end of
//   file), the file offset and the index of the failing piece. With io_uring (when the kernel
//   allows it; checked once per thread, falling back to pread silently) all pieces (up to the
//   ring's 64 entries at a time) are prepared and handed to the kernel in ONE io_uring_submit, so
//   an expert's three far-apart slices of the GGUF are one submission; every completion of a batch
//   is reaped before anything is reported, so no read into a dest is still in flight when this
//   returns or throws. Short completions are finished with pread. Without io_uring, one pread
//   loop per piece, in order.
// - `read_exact(fd, offset, length, dest, piece_bytes)` is read_pieces over `length` cut into
//   `piece_bytes` pieces (with io_uring one thread then keeps several requests in flight for a
//   large sidecar record).
// - Each thread owns its ring (thread_local, set up on its first io_uring read, torn down when it
//   exits), so calls from different threads never share state. Setting up a ring allocates
//   nothing from the heap (the zero-allocation decode step relies on it).
// - Pieces read through an O_DIRECT descriptor must follow its rules (dest, offset and length
//   aligned to the logical block size); the callers (sidecar_reader, gguf_reader) arrange that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>

namespace strata {

struct ReadError : std::runtime_error {
  ReadError(int error_number, uint64_t at, size_t piece = 0);
  int error_number;  // 0: end of file
  uint64_t offset;   // where the failing read started
  size_t piece;      // index of the failing piece in read_pieces' span
};

enum class ReadBackend { Pread, IoUring };

struct ReadPiece {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t* dest = nullptr;
};

void read_pieces(ReadBackend backend, std::span<const ReadPiece> pieces);

void read_exact(ReadBackend backend, int fd, uint64_t offset, uint64_t length, uint8_t* dest,
                uint64_t piece_bytes);

// Whether io_uring works here (probed once: set-up of a small ring).
bool io_uring_available();

}  // namespace strata
