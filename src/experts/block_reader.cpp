#include "experts/block_reader.h"

#include <liburing.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace strata {
namespace {

constexpr unsigned kRingEntries = 64;

void pread_exact(int fd, uint64_t offset, uint64_t length, uint8_t* dest, size_t piece) {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = pread(fd, dest + done, length - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ReadError(errno, offset + done, piece);
    if (n == 0) throw ReadError(0, offset + done, piece);
    done += uint64_t(n);
  }
}

// This thread's ring, set up on first use. `usable` turns false for good when the kernel refuses
// io_uring here, or when a submit failed: entries left unsubmitted in a broken ring must never be
// submitted later (they would read into buffers long since reused).
//
// Trivially destructible on purpose: a thread_local with a destructor registers it on the
// thread's first use (glibc's __cxa_thread_atexit_impl), and that callocs. Which threads read
// during a decode step depends on timing (IoPool::wait runs a ticket's queued jobs on the waiting
// thread), so a first use, and that allocation, could fall inside a steady, allocation-free step
// (tests/engine/zero_alloc_test.cpp). The ring is torn down at thread exit by a pthread key's
// destructor instead: pthread_setspecific on one of a process's first 32 keys allocates nothing.
// (A key's destructor does not run for the main thread at exit(); the kernel frees its ring.)
struct Ring {
  io_uring ring;
  bool initialized;
  bool usable;
};
static_assert(std::is_trivially_destructible_v<Ring>);

void tear_down_ring(void* p) {
  auto* owner = static_cast<Ring*>(p);
  if (owner->initialized) io_uring_queue_exit(&owner->ring);
  owner->initialized = owner->usable = false;
}

pthread_key_t ring_key() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    if (pthread_key_create(&k, tear_down_ring) != 0)
      throw std::runtime_error("block_reader: pthread_key_create failed");
    return k;
  }();
  return key;
}

Ring& thread_ring() {
  thread_local Ring ring{};
  thread_local bool set_up = false;
  if (!set_up) {
    set_up = true;
    ring.initialized = ring.usable = io_uring_queue_init(kRingEntries, &ring.ring, 0) == 0;
    if (ring.initialized) pthread_setspecific(ring_key(), &ring);
  }
  return ring;
}

// One batch (at most kRingEntries pieces) through the ring: one submit, then every completion.
void read_batch(Ring& owner, std::span<const ReadPiece> pieces, size_t first_index) {
  io_uring* ring = &owner.ring;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ReadPiece& p = pieces[i];
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io_uring_prep_read(sqe, p.fd, p.dest, unsigned(p.length), p.offset);
    io_uring_sqe_set_data64(sqe, i);
  }
  int submitted = 0;
  for (int attempt = 0; attempt < 4 && size_t(submitted) < pieces.size(); ++attempt) {
    const int rc = io_uring_submit(ring);
    if (rc > 0)
      submitted += rc;
    else if (rc != -EINTR && rc != -EAGAIN)
      break;
  }
  if (size_t(submitted) != pieces.size()) {
    // The ring failed: reap what went in, retire the ring for this thread, read everything the
    // plain way (the reaped pieces redundantly, which is harmless).
    owner.usable = false;
    for (int i = 0; i < submitted; ++i) {
      io_uring_cqe* cqe = nullptr;
      while (io_uring_wait_cqe(ring, &cqe) == -EINTR) {
      }
      if (cqe) io_uring_cqe_seen(ring, cqe);
    }
    for (size_t i = 0; i < pieces.size(); ++i)
      pread_exact(pieces[i].fd, pieces[i].offset, pieces[i].length, pieces[i].dest,
                  first_index + i);
    return;
  }
  int error = 0;
  uint64_t error_at = 0;
  size_t error_piece = 0;
  bool have_error = false;
  for (size_t done = 0; done < pieces.size(); ++done) {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(ring, &cqe);
    } while (rc == -EINTR);
    if (rc < 0)
      throw ReadError(-rc, pieces[0].offset, first_index);  // cannot happen once submitted
    const size_t i = size_t(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    const ReadPiece& p = pieces[i];
    if (have_error) continue;
    if (res < 0) {
      error = -res, error_at = p.offset, error_piece = first_index + i, have_error = true;
    } else if (uint64_t(res) < p.length) {
      try {  // a short read: finish the piece the plain way
        pread_exact(p.fd, p.offset + uint64_t(res), p.length - uint64_t(res), p.dest + res,
                    first_index + i);
      } catch (const ReadError& e) {
        error = e.error_number, error_at = e.offset, error_piece = e.piece, have_error = true;
      }
    }
  }
  if (have_error) throw ReadError(error, error_at, error_piece);
}

}  // namespace

ReadError::ReadError(int e, uint64_t at, size_t piece_index)
    : std::runtime_error(e ? std::strerror(e) : "unexpected end of file"),
      error_number(e),
      offset(at),
      piece(piece_index) {}

bool io_uring_available() {
  static const bool available = [] {
    io_uring ring{};
    if (io_uring_queue_init(4, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
  }();
  return available;
}

void read_pieces(ReadBackend backend, std::span<const ReadPiece> pieces) {
  Ring* ring = backend == ReadBackend::IoUring ? &thread_ring() : nullptr;
  if (!ring || !ring->usable ||
      pieces.size() == 1) {  // one piece: a plain pread costs one system call too
    for (size_t i = 0; i < pieces.size(); ++i)
      pread_exact(pieces[i].fd, pieces[i].offset, pieces[i].length, pieces[i].dest, i);
    return;
  }
  for (size_t first = 0; first < pieces.size(); first += kRingEntries) {
    const auto batch = pieces.subspan(first, std::min<size_t>(kRingEntries, pieces.size() - first));
    if (ring->usable) {
      read_batch(*ring, batch, first);
      continue;
    }
    for (size_t i = 0; i < batch.size(); ++i)
      pread_exact(batch[i].fd, batch[i].offset, batch[i].length, batch[i].dest, first + i);
  }
}

void read_exact(ReadBackend backend, int fd, uint64_t offset, uint64_t length, uint8_t* dest,
                uint64_t piece_bytes) {
  if (backend == ReadBackend::Pread || length <= piece_bytes) {
    const ReadPiece whole{fd, offset, length, dest};
    return read_pieces(ReadBackend::Pread, std::span(&whole, 1));
  }
  // The pieces in batches of the ring's size on the stack (a vector of them was an allocation
  // per expert read); read_pieces would cut them into such batches anyway.
  ReadPiece batch[kRingEntries];
  size_t first_piece = 0;
  for (uint64_t begin = 0; begin < length;) {
    size_t n = 0;
    for (; n < kRingEntries && begin < length; ++n, begin += piece_bytes)
      batch[n] = ReadPiece{fd, offset + begin, std::min(piece_bytes, length - begin), dest + begin};
    try {
      read_pieces(backend, std::span<const ReadPiece>(batch, n));
    } catch (const ReadError& e) {
      throw ReadError(e.error_number, e.offset, first_piece + e.piece);
    }
    first_piece += n;
  }
}

}  // namespace strata
