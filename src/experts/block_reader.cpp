#include "experts/block_reader.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace strata {
namespace {

constexpr unsigned kRingEntries = 64;

void pread_exact(int fd, uint64_t offset, uint64_t length, uint8_t* dest) {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = pread(fd, dest + done, length - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ReadError(errno, offset + done);
    if (n == 0) throw ReadError(0, offset + done);
    done += uint64_t(n);
  }
}

// This thread's ring, set up on first use; nullptr when io_uring is refused here.
struct Ring {
  io_uring ring{};
  bool ok = false;
  Ring() { ok = io_uring_queue_init(kRingEntries, &ring, 0) == 0; }
  ~Ring() {
    if (ok) io_uring_queue_exit(&ring);
  }
};

io_uring* thread_ring() {
  thread_local Ring ring;
  return ring.ok ? &ring.ring : nullptr;
}

}  // namespace

ReadError::ReadError(int e, uint64_t at)
    : std::runtime_error(e ? std::strerror(e) : "unexpected end of file"), error_number(e), offset(at) {}

bool io_uring_available() {
  static const bool available = [] {
    io_uring ring{};
    if (io_uring_queue_init(4, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
  }();
  return available;
}

void read_exact(ReadBackend backend, int fd, uint64_t offset, uint64_t length, uint8_t* dest,
                uint64_t piece_bytes) {
  io_uring* ring = backend == ReadBackend::IoUring ? thread_ring() : nullptr;
  if (!ring || length <= piece_bytes) return pread_exact(fd, offset, length, dest);

  const uint64_t n_pieces = (length + piece_bytes - 1) / piece_bytes;
  for (uint64_t first = 0; first < n_pieces; first += kRingEntries) {
    const uint64_t batch = std::min<uint64_t>(kRingEntries, n_pieces - first);
    for (uint64_t i = 0; i < batch; ++i) {
      const uint64_t begin = (first + i) * piece_bytes, n = std::min(piece_bytes, length - begin);
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      io_uring_prep_read(sqe, fd, dest + begin, unsigned(n), offset + begin);
      io_uring_sqe_set_data64(sqe, first + i);
    }
    int submitted = io_uring_submit(ring);
    if (submitted < 0) {  // ring unusable right now: read this batch with pread
      for (uint64_t i = 0; i < batch; ++i) {
        const uint64_t begin = (first + i) * piece_bytes;
        pread_exact(fd, offset + begin, std::min(piece_bytes, length - begin), dest + begin);
      }
      continue;
    }
    // Reap every completion of the batch before reporting any error, so no read into `dest`
    // is still in flight when we return or throw.
    int error = 0;
    uint64_t error_at = 0;
    bool have_error = false;
    for (uint64_t i = 0; i < batch; ++i) {
      io_uring_cqe* cqe = nullptr;
      int rc;
      do {
        rc = io_uring_wait_cqe(ring, &cqe);
      } while (rc == -EINTR);
      if (rc < 0) throw ReadError(-rc, offset);  // cannot happen with submitted requests
      const uint64_t piece = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      const uint64_t begin = piece * piece_bytes, n = std::min(piece_bytes, length - begin);
      if (res < 0) {
        if (!have_error) error = -res, error_at = offset + begin, have_error = true;
      } else if (uint64_t(res) < n && !have_error) {
        try {  // a short read: finish the piece the plain way
          pread_exact(fd, offset + begin + uint64_t(res), n - uint64_t(res), dest + begin + res);
        } catch (const ReadError& e) {
          error = e.error_number, error_at = e.offset, have_error = true;
        }
      }
    }
    if (have_error) throw ReadError(error, error_at);
  }
}

}  // namespace strata
