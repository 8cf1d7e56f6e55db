// ExpertReads — the I/O side of an ExpertStore: reads experts into arena slots on the I/O pool
// (experts/io_pool.h) through an ExpertReader, and remembers the read in flight into every cache
// slot.
//
// What it promises
// - start(layer, expert, dest, priority) submits the reader's jobs for one expert as one ticket:
//   Urgent for a miss the window waits for, ReadAhead for a guess or a prompt-hot pin. The job
//   list is reused, so a read allocates nothing once warm.
// - load_slot(...) starts a cache slot's new read after finishing the slot's previous one (settle):
//   two reads never write into one slot, and an evicted read-ahead never lands over its successor.
// - Allocation: at construction the pool reserves room for every read this can have at once (a
//   read per cache slot, one per transient slot, plus one finished ticket per I/O thread that a
//   worker may still hold), so no read allocates, whatever the timing.
// - wait(ticket) blocks until the ticket's jobs ran and rethrows the first job's strata::Error
//   (it names the file, layer and expert). settle(...) waits without throwing: a slot being reused
//   had its error seen by whoever needed it.
// - wait_ms() is the time the window thread spent blocked in wait / settle since construction
//   (waits through pool() are not counted).
// - Threads: the window thread calls everything here; the pool's threads only run the jobs, which
//   write slot bytes and completion flags. Destruction cancels queued reads and joins the pool's
//   threads: destroy it before the arena it reads into (and before the reader).
#pragma once

#include <cstdint>
#include <vector>

#include "experts/expert_reader.h"
#include "experts/io_pool.h"

namespace strata {

class ExpertReads {
 public:
  // slots_per_layer[layer]: the cache slots whose reads are tracked (0: a layer without experts);
  // transient_slots: the untracked reads (start) that can be alive at once.
  ExpertReads(ExpertReader& reader, const std::vector<int>& slots_per_layer, int transient_slots,
              int io_threads, int urgent_only_threads);

  IoPool::TicketPtr start(int layer, int32_t expert, uint8_t* dest, IoPool::Priority priority);
  void load_slot(int layer, uint32_t slot, int32_t expert, uint8_t* dest,
                 IoPool::Priority priority) {
    settle(layer, slot);
    slot_reads_[size_t(layer)][slot] = start(layer, expert, dest, priority);
  }
  // The slot's last read (null once settled or forgotten).
  const IoPool::TicketPtr& slot_read(int layer, uint32_t slot) const {
    return slot_reads_[size_t(layer)][slot];
  }
  void settle(int layer, uint32_t slot);
  void forget(int layer, uint32_t slot) { slot_reads_[size_t(layer)][slot].reset(); }

  void wait(const IoPool::TicketPtr& ticket);
  void promote(const IoPool::TicketPtr& ticket) { pool_.promote(ticket); }
  double wait_ms() const { return wait_ms_; }
  // For waits that are not the window's (a startup fill, an interrupted layer's leftovers):
  // untimed.
  IoPool& pool() { return pool_; }

 private:
  ExpertReader& reader_;
  IoPool pool_;
  std::vector<std::vector<IoPool::TicketPtr>> slot_reads_;  // [layer][cache slot]
  std::vector<IoPool::Job> jobs_;                           // start's, reused
  double wait_ms_ = 0;
};

}  // namespace strata
