#include "experts/expert_reads.h"

#include <chrono>

#include "util/error.h"

namespace strata {
namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

ExpertReads::ExpertReads(ExpertReader& reader, const std::vector<int>& slots_per_layer,
                         int io_threads, int urgent_only_threads)
    : reader_(reader), pool_(io_threads, urgent_only_threads), slot_reads_(slots_per_layer.size()) {
  for (size_t l = 0; l < slots_per_layer.size(); ++l)
    slot_reads_[l].resize(size_t(slots_per_layer[l]));
}

IoPool::TicketPtr ExpertReads::start(int layer, int32_t expert, uint8_t* dest,
                                     IoPool::Priority priority) {
  jobs_.clear();  // keeps its capacity: a read allocates nothing once warm
  reader_.read_jobs(layer, expert, dest, jobs_);
  return pool_.submit(priority, jobs_);
}

void ExpertReads::settle(int layer, uint32_t slot) {
  IoPool::TicketPtr& read = slot_reads_[size_t(layer)][slot];
  if (!read) return;
  const auto start = std::chrono::steady_clock::now();
  try {
    pool_.wait(read);
  } catch (const Error&) {
    // The slot is being reused; whoever needed the failed read has already seen the error.
  }
  wait_ms_ += ms_since(start);
  read.reset();
}

void ExpertReads::wait(const IoPool::TicketPtr& ticket) {
  const auto start = std::chrono::steady_clock::now();
  try {
    pool_.wait(ticket);
  } catch (const Error&) {
    wait_ms_ += ms_since(start);
    throw;
  }
  wait_ms_ += ms_since(start);
}

}  // namespace strata
