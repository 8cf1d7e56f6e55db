#include "experts/expert_reads.h"

#include <algorithm>
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
                         int transient_slots, int io_threads, int urgent_only_threads)
    : reader_(reader), pool_(io_threads, urgent_only_threads), slot_reads_(slots_per_layer.size()) {
  size_t reads = size_t(std::max(transient_slots, 0));
  size_t jobs_per_read = 1;
  for (size_t l = 0; l < slots_per_layer.size(); ++l) {
    slot_reads_[l].resize(size_t(slots_per_layer[l]));
    if (slots_per_layer[l] <= 0) continue;
    reads += size_t(slots_per_layer[l]);
    // A read's jobs depend on its block only (the record's size), not on the expert.
    jobs_.clear();
    reader_.read_jobs(int(l), 0, nullptr, jobs_);
    jobs_per_read = std::max(jobs_per_read, jobs_.size());
  }
  jobs_.clear();
  jobs_.reserve(jobs_per_read);
  // Reads alive at once: one per cache slot (load_slot settles the previous), one per transient
  // slot, and each worker may still hold the ticket of the job it just finished; +1 for the
  // ticket being made while all those are alive.
  const size_t tickets = reads + size_t(io_threads) + 1;
  pool_.reserve(tickets, tickets * jobs_per_read);
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
