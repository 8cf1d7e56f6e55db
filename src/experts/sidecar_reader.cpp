#include "experts/sidecar_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "experts/block_reader.h"
#include "util/error.h"

namespace strata {

SidecarReader::SidecarReader(Sidecar sidecar, const ReadOptions& options)
    : sidecar_(std::move(sidecar)),
      file_(sidecar_.path(), options.direct_io),
      io_uring_(options.io_uring && io_uring_available()) {
  const uint64_t chunk = sidecar_.layout().chunk_bytes;
  split_bytes_ = std::max<uint64_t>((options.split_bytes + chunk - 1) / chunk * chunk, chunk);
}

uint64_t SidecarReader::slot_bytes(int block) const {
  const SidecarLayer& l = sidecar_.layout().layers.at(size_t(block));
  return l.present ? l.record_bytes : 0;
}

ExpertPlacement SidecarReader::place(int block, int32_t) const {
  const SidecarLayer& l = sidecar_.layout().layers[size_t(block)];
  return ExpertPlacement{0, l.up_offset, l.down_offset};
}

void SidecarReader::read_jobs(int block, int32_t expert, uint8_t* slot,
                              std::vector<IoPool::Job>& jobs) {
  const uint64_t record = slot_bytes(block);
  for (uint64_t begin = 0; begin < record; begin += split_bytes_) {
    const uint64_t end = std::min(record, begin + split_bytes_);
    jobs.push_back([this, block, expert, begin, end, slot] {
      read_chunk(block, expert, begin, end, slot + begin);
    });
  }
}

void SidecarReader::read_chunk(int block, int32_t expert, uint64_t begin, uint64_t end,
                               uint8_t* dest) {
  const SidecarLayout& layout = sidecar_.layout();
  const uint64_t base = layout.record_offset(block, expert);
  const ReadBackend backend = io_uring_ ? ReadBackend::IoUring : ReadBackend::Pread;
  while (true) {
    const bool direct = file_.direct();
    try {
      read_exact(backend, direct ? file_.direct_fd() : file_.buffered_fd(), base + begin,
                 end - begin, dest, layout.chunk_bytes);
      break;
    } catch (const ReadError& e) {
      if (e.error_number == EINVAL && direct && file_.refuse_direct(std::strerror(EINVAL)))
        continue;
      fail("{}: reading layer {} expert {} (bytes {}..{} of its record, file offset {}): {}",
           sidecar_.path(), block, expert, begin, end, e.offset,
           e.error_number ? std::strerror(e.error_number)
                          : "the file ends early (truncated after it was opened?)");
    }
  }
  bytes_read_.fetch_add(end - begin, std::memory_order_relaxed);
  const uint64_t chunk = layout.chunk_bytes;
  for (uint64_t c = begin; c < end; c += chunk)
    sidecar_.verify_chunk(block, expert, uint32_t(c / chunk),
                          std::span<const uint8_t>(dest + (c - begin), std::min(chunk, end - c)));
}

}  // namespace strata
