// GpuExpertTier — routed experts under a GPU memory budget: a device arena of slots fed from the
// host tier (an ExpertSource: the GGUF mapping or the RAM arena of experts/expert_store.h, which
// itself streams from the SSD), with one handshake per MoE layer inside the window.
//
// Memory (allocated once, at the first MoE layer of the model's first window; checked with the
// dense weights against the device's free memory when the model's first CUDA sequence starts:
// compute/gpu_memory_plan.h, whose plan_gpu_arena lays the slots out)
// - Cache slots: `slots` per layer with experts (GpuTierOptions: (budget - transient) / Σ layer
//   slot bytes, or slots_per_layer), each [gate | up | down] of that layer's shapes. Transient
//   slots after them: min(n_expert, k · max window rows) slots of the largest layer's size, for the
//   misses of a layer that the cache cannot take (a prefill chunk routes to far more experts than
//   a layer keeps). The budget pays for both; a budget below 1 slot per layer + the transient
//   slots fails with the numbers. The slot map is on the device: smap[layer][expert] = the slot's
//   offset in 256-byte units, or kMiss.
// - Mapped host memory: a mailbox (the routed ids of the layer) and a ring of jobs (the layer's
//   new slot-map row and the chunks to copy); a pinned bounce buffer when the host tier cannot
//   be read in place.
//
// The handshake (per MoE layer; the device side is enqueued like any op, so it is captured into
// the window graphs and replayed)
//   device, compute stream: router, top-k (with read-ahead: the next layer's router on the same
//     input, in the same top-k launch: the guess) → publish(): the ids and the guess to the
//     mailbox, a device sequence number + 1 (the shared expert runs on its own branch meanwhile)
//     → wait(): a 64-block kernel whose
//     block 0 spins until the host marks the job of that sequence number ready (the other blocks
//     spin on a device word block 0 sets: 64 pollers across PCIe made a release take ≈ 107 µs to
//     be seen, one ≈ 4 µs), then copies the job's chunks (reading pinned host memory directly)
//     and writes the layer's slot-map row → the expert kernels (launched after it completes: it
//     does not trigger dependent launch early, so no SM is held while it waits). With
//     STRATA_TIER_FUSE_PUBLISH=1 (fuse_publish; off by default until measured on a GPU: written
//     in session 54, when no device could be started) publish() launches nothing and wait()'s
//     block 0 publishes first, in the same launch: a dependent launch a layer fewer; nothing
//     runs between the two on the stream.
//   read-ahead (a side branch of the graph, forked after wait(l), joined before publish(l+1), or
//     with STRATA_TIER_JOIN=wait before wait(l+1), or before the capture segment ends): a kernel
//     like wait()'s that waits for the read-ahead job of the same sequence number and copies the guessed experts of layer l+1 into their slots
//     while layer l's experts and layer l+1's mixer run (PCIe idle otherwise). It writes no slot
//     map: wait(l+1)'s job carries layer l+1's whole row, read-ahead slots included, and the join
//     orders the read-ahead copies before any copy or kernel of layer l+1.
//   self-release (GpuTierOptions::self_release): the wait kernel first applies the layer's
//     pending row (below), then, when every routed id of the handshake has a cache slot in the
//     layer's device row, goes on at once: no job, no copy, the row kept. The host still serves
//     that handshake in order (LRU, observers, the next read-ahead) and evaluates the same rule on
//     its copy of the device row (device_rows_), checking that such a handshake resolves with no
//     miss on a row equal to the residency's (else the tier fails: the bookkeeping broke). The
//     host's answer then only gates the read-ahead kernel (joined before the next publish), so its
//     latency hides behind a layer's expert work and the next mixer instead of the shared expert.
//     Pending rows: a read-ahead job carries the guessed layer's row after the guess; the
//     read-ahead kernel leaves it pending (pending_rows_/pending_flags_, per layer) and the layer's
//     next wait applies it before the rule (the router's MoCE read of the row, before the wait,
//     sees what it saw before this existed: the row as the layer's last wait left it).
//     The mailbox: a publish after a self-released wait polls the host's mapped `consumed` word
//     unless a read-ahead kernel has since seen the host answer that handshake, so a publish
//     never overwrites ids the host has not read, wherever the branch joins. (Session 33 moved the
//     join from before wait to before publish, which puts the branch's last copies and the host's
//     round trip in series; the 25 % budget fell from 0.83 to 0.69 of all-in-VRAM speed between
//     sessions 32 and 35: docs/bench-cuda.md, session 35. STRATA_TIER_JOIN=wait restores the old
//     placement; measured in session 36, it was no faster: 0.67 against 0.66.)
//   host, one thread: sees the sequence number, resolves the layer's union with SlotResidency
//     (experts/slot_residency.h: the RAM arena's policy, tested equal to it), takes each miss's
//     bytes from the host tier and fills the job; then, with a guess, ranks it like the CPU path
//     (layers/moe.cpp moe_predict: best weight over the rows, ties to the lower id), lets
//     SlotResidency::predict assign slots (at most half a layer's) and fills the read-ahead job.
//     It makes no CUDA call: nothing it does can wait behind the window thread's driver calls (a
//     cudaFree that synchronizes the device while the GPU waits for this thread would deadlock).
// - Deterministic limbo: residency changes only in resolve and predict, in handshake order, from
//   the routed ids and guesses alone (both functions of the tokens): which experts are resident
//   depends on the tokens, never on timing. Every slot holds the GGUF's bytes, so logits are
//   bitwise those of the all-resident backend (tests/cuda/expert_tier_test.cpp).
// - Ordering: the GPU publishes layer l only after layer l-1's kernels finished, so when the host
//   serves a layer no kernel reads a slot it may evict, a transient slot, the bounce buffer or a
//   job it refills. Read-ahead writes only layer l+1's cache slots, which nothing reads until
//   wait(l+1), after the join; a guess that resolve(l+1) evicts again is overwritten by wait(l+1)
//   after the read-ahead copy finished (join), never concurrently.
// - Host memory: the host tier's regions (ExpertSource::host_regions) are registered once
//   (cudaHostRegister, mapped) and read in place through their device alias when the source's
//   pointers stay valid (the GGUF mapping; a RAM arena with a slot for every expert). Otherwise
//   (a RAM arena that streams, or memory that cannot be pinned) each miss is copied into the
//   bounce buffer as it is handed out (read-ahead has its own part of it: wait(l) may still be
//   reading layer l's part while the host stages the guess for l+1).
// - Policies (the RAM arena's, experts/expert_store.h, on the GPU arena): the startup fill
//   (GpuTierOptions::fill_ranking: a profile's or the usage history's ranking, the first
//   `fill_pinned` of each layer pinned) is applied by prime() and copied in before the first
//   window; prompt-hot pins (pin_prompt_hot, between windows: this tier's own count of the routed
//   pairs since reset_prompt_heat, blended with the usage history, chosen by
//   experts/usage_history.h prompt_hot_pins exactly as the RAM arena chooses) are copied in at
//   once. Both change residency only between windows, at points the caller's token stream fixes,
//   so limbo stays deterministic; the changed layers' device slot-map rows are written at once
//   (and again by each layer's next wait(), whose job carries the whole row). Every handshake also hands the layer's routing (ids
//   and weights, per row) to the host tier's observe_routing on the handshake thread, so a RAM
//   arena's usage history and prompt heat count GPU windows too (the window thread does not
//   touch the host tier while a window runs).
// - MoCE (GpuTierOptions::moce_lambda > 0; route/moce.h's rule): the router kernel reads this
//   tier's device slot map (ops.h route_top_k_moce via moce()). What it sees as resident is the
//   layer's row as the last wait() of that layer wrote it (cache slots only, not transient ones):
//   a function of the tokens, so MoCE's tokens depend on the tokens and the budget, never on
//   timing. Telemetry (rows, swaps, agreement, KL) accumulates on the device; relMSE samples are
//   the CPU path's only.
// - Failure: an exception on the handshake thread (a read error of the host tier) is kept, the
//   GPU is released with an abort flag (the window's results are garbage), and settle() rethrows
//   it; the tier is then unusable (every later expect() throws). A window that does not finish
//   within 60 s throws with both sides' counters (CudaBackend::read).
//
// Threads: publish/wait/view/expect/settle on the window thread; the handshake thread is the only
// other user of the host tier while a window runs (settle() returns once it is idle). One window
// at a time per model.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compute/cuda/matmul.h"
#include "compute/cuda/ops.h"
#include "compute/cuda/runtime.h"
#include "compute/expert_tier.h"
#include "experts/device_slot_rows.h"
#include "experts/expert_source.h"
#include "experts/slot_residency.h"
#include "experts/usage_history.h"

namespace strata::compute::cuda {

struct TierCopy;   // a chunk to copy (below, with the kernels)
struct TierTimes;  // a handshake's timestamps (below)

// What one publish writes (kernels below: tier_publish, tier_wait): the routed pairs (device),
// the guess (device, n_guess 0 without one).
struct TierPublish {
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int n_pairs = 0;
  const int32_t* guess_ids = nullptr;
  const float* guess_weights = nullptr;
  int n_guess = 0;
  int capacity = 0;  // of each mailbox array
  int layer = 0;
  void* mailbox = nullptr;  // mapped (device alias); null: no publish
  const uint32_t* consumed_host = nullptr;
};

struct GpuTierStats {
  uint64_t handshakes = 0, needed = 0, hits = 0, misses = 0, transient = 0;
  // Handshakes whose wait kernel released itself (every routed expert already had a cache slot in
  // the device's row): by the host's count of the rule, and as the GPU counted them (equal).
  uint64_t self_released = 0, gpu_self_released = 0;
  uint64_t read_ahead_issued = 0, read_ahead_used = 0;
  uint64_t loaded_bytes = 0;        // host → device, misses and read-ahead
  uint64_t miss_bytes = 0;          // of those, what a layer waited for
  uint64_t read_ahead_bytes = 0;    //           the guesses, copied beside the previous layer
  double host_serve_ms = 0;         // the handshake thread busy (resolve + host tier + the job)
  double serve_resolve_ms = 0;      // of it: the union and SlotResidency::resolve
  double serve_source_ms = 0;       //        the host tier handing out the misses (and staging)
  double serve_job_ms = 0;          //        the slot-map row and the chunks into the mapped job
  double serve_cpu_ms = 0;          // the thread's CPU time over the same spans (< busy: preempted)
  double gpu_wait_ms = 0;           // device: wait kernels spinning until their job was ready
  double gpu_copy_ms = 0;           // device: wait kernels copying the misses
  double gpu_read_ahead_wait_ms = 0;  // device, side branch: read-ahead kernels waiting for their job
  double gpu_read_ahead_copy_ms = 0;  //                      and copying the guesses
  // A handshake's latency on the GPU's clock (%globaltimer; the host's clock drifts from it by
  // ~100 µs within seconds, so one-way times across the two are not measured): the round trip
  // from publish until the wait kernel saw the job ready, and the GPU's own work in between (the
  // shared expert, until the wait kernel started spinning). Sums over timed handshakes.
  double round_trip_ms = 0, before_wait_ms = 0;
  uint64_t timed_handshakes = 0;
  bool staged = false;              // the host tier is copied through the bounce buffer, not read in place
  // Policies, between windows: the startup fill and the prompt-hot pins.
  uint64_t fill_loads = 0, pin_changes = 0, pin_loads = 0;
  uint64_t policy_bytes = 0;        // copied in for them
  uint64_t hot_pins = 0, fill_pins = 0;  // pinned slots now, all layers
  // MoCE telemetry (main rows of every layer): as MoceStats.
  double moce_rows = 0, moce_swaps = 0, moce_agreement_sum = 0, moce_kl_sum = 0;
  double hit_rate() const { return needed ? double(hits) / double(needed) : 1.0; }
};

// Layout of one layer's slots (matmul.h shapes, offsets within a slot).
struct TierLayer {
  bool present = false;
  ExpertMatrixShape gate, up, down;
  size_t slot_bytes = 0;      // multiple of 256
  size_t first_offset = 0;    // of slot 0 in the arena
};

class GpuExpertTier {
 public:
  static constexpr uint32_t kMiss = UINT32_MAX;
  // max_rows: the largest window (sizes the mailbox and the transient slots).
  GpuExpertTier(const GpuTierOptions& options, int n_expert, int k, int64_t max_rows);
  ~GpuExpertTier();
  GpuExpertTier(const GpuExpertTier&) = delete;
  GpuExpertTier& operator=(const GpuExpertTier&) = delete;

  int slots_per_layer() const { return slots_; }
  int transient_slots() const { return n_transient_; }
  uint64_t arena_bytes() const { return arena_.bytes(); }
  int64_t max_rows() const { return max_rows_; }
  const TierLayer& layer(int l) const { return layers_.at(size_t(l)); }
  // The arena as the expert kernels address it (base, 256-byte units, the layer's smap row).
  ExpertArenaView view(int layer) const;

  // Window thread, in moe(), for every MoE layer of every window (eager, recorded or replayed):
  // one handshake will follow on the GPU, served from `source`.
  void expect(ExpertSource& source);
  // Window thread, once, right after construction and outside any graph capture
  // (CudaBackend::expert_tier): binds the host tier (the only one: expect() refuses another) and
  // applies the startup fill of GpuTierOptions::fill_ranking, copying those experts in now.
  void prime(ExpertSource& source);
  // Window thread, between windows (after settle(), outside a capture): the prompt-hot pins of
  // every layer (see the contract), copied in now. Returns the pins added or dropped.
  int pin_prompt_hot(const HotPinOptions& options, const UsageHistory* history);
  void reset_prompt_heat();
  // Enqueued on `stream` (the backend's compute stream). pairs = rows · k ids and their weights
  // (device); the guess (device, may be null) = rows · k ids and weights of the next layer's router.
  void publish(int layer, const int32_t* ids, const float* weights, int64_t n_pairs, const int32_t* guess_ids,
               const float* guess_weights, int64_t n_guess, cudaStream_t stream);
  // ids: the layer's routed ids as published (device, n_pairs), for the wait kernel's self-release.
  void wait(int layer, const int32_t* ids, int64_t n_pairs, cudaStream_t stream);
  // Read-ahead (only after a publish with a guess, right after that layer's wait): forks a side
  // branch off `stream` whose kernel copies the guessed experts of the next layer. join() puts the
  // branch back into `stream` (before the next wait, and before a capture segment ends: an
  // unjoined branch cannot be captured); a no-op when no branch is open.
  void read_ahead(cudaStream_t stream);
  void join(cudaStream_t stream);
  // Where the backend joins the previous read-ahead branch: before publish() (the default), or
  // before wait() (STRATA_TIER_JOIN=wait: publish and the host's serving overlap the branch's last
  // copies; measured no faster, docs/bench-cuda.md session 36).
  bool join_before_publish() const { return join_before_publish_; }
  bool read_ahead_enabled() const { return read_ahead_enabled_; }
  // MoCE against this tier's residency (the layer's slot-map rows for route_top_k_moce); lambda 0
  // when off.
  RouteMoce moce(int layer) const;
  // Whether layer l's routed experts live in this tier (a guess is only made for such a layer).
  bool has_layer(int l) const { return l >= 0 && size_t(l) < layers_.size() && layers_[size_t(l)].present; }
  // After the compute stream was synchronized: waits until the handshake thread has served what
  // the GPU published, forgets expectations that were never published (a window that failed
  // before its launch), rethrows a handshake failure.
  void settle();
  // Window thread, after settle(): reads the device counters too.
  GpuTierStats stats() const;
  // Counters of both sides, for an error message when a window does not finish.
  std::string describe_state();
  static bool trace();  // STRATA_TIER_TRACE=1: one stderr line per served handshake

 private:
  void run();
  void serve();
  void release(int layer, uint32_t seq);
  void release_read_ahead(int layer, uint32_t seq, const int32_t* guess_ids, const float* guess_weights, int n_guess);
  // Appends the chunks that bring `loads` of `layer` into their slots to copies_ (staged in the
  // given part of the bounce buffer when the host tier cannot be read in place); returns the bytes.
  uint64_t gather_copies(int layer, const std::vector<SlotResidency::Load>& loads, size_t bounce_first_slot);
  uint32_t offset_units(int layer, const SlotResidency::Load& load) const;
  void prepare_source(ExpertSource& source);
  // Window thread, no window running: copies `loads` of `layer` into their cache slots now, and
  // writes the layer's device slot-map row from the residency.
  uint64_t copy_now(int layer, const std::vector<SlotResidency::Load>& loads);
  void upload_row(int layer);
  void residency_row(int layer, std::vector<uint32_t>& row) const;
  void check_device_row(int layer);
  uint32_t resident_below() const;  // the first slot-map offset that is not a cache slot (transient ones lie above)
  void account_timeline(uint32_t first_seq, uint32_t last_seq);  // mutex_ held

  std::vector<TierLayer> layers_;
  int n_expert_ = 0, k_ = 0, slots_ = 0, n_transient_ = 0;
  int64_t max_rows_ = 0;
  size_t transient_offset_ = 0, transient_slot_bytes_ = 0;
  DeviceBuffer arena_, smap_, words_;  // words_: TierDeviceWords
  SlotResidency residency_;

  // Mapped host memory (cudaHostAlloc): mailbox and job ring.
  void* mailbox_host_ = nullptr;
  void* mailbox_dev_ = nullptr;
  void* jobs_host_ = nullptr;
  void* jobs_dev_ = nullptr;
  size_t job_bytes_ = 0, max_chunks_ = 0;
  void* ra_jobs_host_ = nullptr;  // read-ahead jobs: TierJobHeader then TierCopy × n_copies
  void* ra_jobs_dev_ = nullptr;
  size_t ra_job_bytes_ = 0;
  bool read_ahead_enabled_ = false;
  int max_read_ahead_loads_ = 0;  // SlotResidency::predict's bound: half a layer's slots, at least 1
  Stream side_stream_;            // the read-ahead branch (captured into the window graphs)
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool branch_open_ = false;
  // Pinned staging for a host tier that cannot be read in place: n_transient slots for the misses,
  // then max_read_ahead_loads_ for the guesses.
  void* bounce_host_ = nullptr;
  void* bounce_dev_ = nullptr;
  size_t bounce_bytes_ = 0;
  volatile uint32_t* abort_host_ = nullptr;
  uint32_t* abort_dev_ = nullptr;
  TierTimes* times_host_ = nullptr;  // mapped ring of kTimelineRing handshake timestamps
  TierTimes* times_dev_ = nullptr;
  uint32_t accounted_seq_ = 0;       // handshakes up to this one are in the latency stats
  Stream copy_stream_;  // only for describe_state's read of the device words

  // Host tier.
  ExpertSource* source_ = nullptr;
  bool direct_reads_ = false;   // its regions are registered: the load kernel reads them
  bool stable_pointers_ = false;
  std::vector<void*> registered_;
  struct Alias {
    const uint8_t* host_begin;
    const uint8_t* host_end;
    const uint8_t* device_begin;  // registered host memory as the device addresses it
  };
  std::vector<Alias> aliases_;
  const uint8_t* device_alias(const uint8_t* p, size_t n) const;

  // Handshake thread state.
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t expected_ = 0, served_ = 0;
  uint32_t last_seq_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  GpuTierStats stats_;
  std::vector<int32_t> union_, load_ids_;
  std::vector<uint8_t> seen_;
  std::vector<SlotResidency::Load> loads_, ra_loads_;
  std::vector<float> best_;            // read-ahead ranking: best guess weight per expert
  std::vector<int32_t> ranked_;
  // Each layer's slot-map row as the device holds it after its last wait (read-ahead rows counted
  // when made: the layer's next wait applies them before its rule); the handshake thread's, the
  // window thread's in prime/pin_prompt_hot's upload_row.
  DeviceSlotRows device_rows_;
  bool self_release_ = true;
  int read_ahead_blocks_ = 32;  // fewer than wait()'s; STRATA_TIER_RA_BLOCKS overrides it (measurement)
  bool join_before_publish_ = true;  // STRATA_TIER_JOIN=wait: the join precedes wait() instead
  // publish() only records the handshake's publish and the next wait() does it in its own launch
  // (block 0, before it waits): one dependent launch a layer fewer. Off by default until it is
  // measured on a GPU; STRATA_TIER_FUSE_PUBLISH=1 turns it on.
  bool fuse_publish_ = false;
  bool early_launch_ = false;  // TierSelfRelease::launch_dependents_when_free (STRATA_TIER_EARLY_LAUNCH=1: on)
  TierPublish pending_publish_;  // recorded by publish(), launched by wait() (mailbox null: none)
  DeviceBuffer pending_rows_, pending_flags_;  // read-ahead rows waiting for their layer's wait
  volatile uint32_t* consumed_host_ = nullptr;  // the mailbox was read up to this handshake
  uint32_t* consumed_dev_ = nullptr;
  std::vector<int32_t> mailbox_;        // the served handshake's ids, then its guess ids
  std::vector<float> mailbox_weights_;  //   and their weights
  // Policies.
  std::vector<std::vector<int32_t>> fill_ranking_;
  int fill_pinned_ = 0;
  std::vector<uint64_t> heat_;  // [n_layer][n_expert]: routed pairs since reset_prompt_heat (handshake thread)
  double moce_lambda_ = 0.0;
  int moce_protect_ = 1, moce_max_rank_ = 0;
  DeviceBuffer moce_stats_;     // 4 doubles (ops.h RouteMoce::stats)
  Routing routing_;             // the layer's routing for the host tier's observe_routing
  std::vector<uint32_t> row_;          // the job being built: its slot-map row and chunks
  std::vector<TierCopy> copies_;
};

// --- kernels (expert_tier.cu) -------------------------------------------------------------
// One handshake's timestamps (%globaltimer) from the publish and wait kernels, in mapped host
// memory (ring slot seq % kTimelineRing). Read by settle() once the window's stream has finished.
struct TierTimes {
  uint64_t published_ns, spin_ns, released_ns, copied_ns;
  uint32_t seq, pad;
};
constexpr int kTimelineRing = 256;
struct TierCopy {
  const uint8_t* src;  // device-accessible (registered host memory) or device
  uint8_t* dst;
  uint32_t bytes;
  uint32_t pad;
};
// Device-side state of one kind of release: the layer's misses (channel 0, wait()) or the next
// layer's read-ahead (channel 1, read_ahead()).
struct TierChannel {
  uint32_t released_seq;     // block 0: the handshake's seq, once its job is ready
  uint32_t released_copies;  //   and the job's copy count, for the other blocks
  uint32_t done_blocks;      // blocks of the running kernel that finished
  uint32_t released_row;     //   and whether they write the job's slot-map row (0: released itself)
  uint32_t released_pending_layer;  //   read-ahead: the layer whose row the job carries, or UINT32_MAX
  uint64_t spin_started_ns, released_ns;  // block 0 of the running kernel (%globaltimer)
  uint64_t wait_ns, copy_ns;              // sums over every kernel of the channel
};
struct TierDeviceWords {
  uint32_t seq;             // of the last published handshake
  uint32_t unconsumed_seq;  // the last handshake whose wait released itself (the host unheard)
  uint32_t consumed_seq;    // the host has read the mailbox up to here (as a read-ahead kernel saw)
  uint32_t self_released;   // waits that released themselves
  TierChannel channel[2];
};
// What a wait kernel needs to release itself: the handshake's routed ids (device, n_pairs of
// them), the layer's pending row and its flag (set by a read-ahead kernel), and the first offset
// that is not a cache slot (transient slots lie above the cache slots). ids == nullptr: off.
struct TierSelfRelease {
  const int32_t* ids = nullptr;
  int n_pairs = 0;
  uint32_t resident_below = 0;
  const uint32_t* pending_row = nullptr;
  uint32_t* pending_flag = nullptr;
  // A block with nothing to copy lets the kernels after it launch (griddepcontrol.launch_dependents)
  // instead of at its exit. Off by default until measured; STRATA_TIER_EARLY_LAUNCH=1 turns it on.
  bool launch_dependents_when_free = false;
};
struct TierMailboxHeader {
  volatile uint32_t seq;
  uint32_t layer, n_pairs, n_guess;
};

// The mailbox: TierMailboxHeader padded to 64 bytes, then ids[capacity], guess ids[capacity],
// guess weights[capacity], weights[capacity].
// Before it writes the mailbox, the publish makes sure the host has read the previous
// handshake's (consumed_host: a mapped word the host writes) when that handshake's wait released
// itself and no read-ahead kernel has since seen the host answer it.
// A publish as its own one-block launch (GpuExpertTier::publish with fuse_publish off).
void tier_publish(const TierPublish& publish, const uint32_t* abort_flag, TierDeviceWords* words, TierTimes* times,
                  cudaStream_t stream);
// The job of handshake `seq` lies at jobs + (seq % ring) · job_bytes: TierJobHeader, a slot-map
// row (n_expert words, padded to 16 bytes: the layer's row in a wait job; in a read-ahead job the
// guessed layer's row after the guess, when has_row), then TierCopy × n_copies.
struct TierJobHeader {
  volatile uint32_t ready;  // == seq once the host filled the job
  uint32_t n_copies;
  uint32_t has_row;         // read-ahead jobs: the row is the guessed layer's
  uint32_t layer;           //   that layer
};
// publish (may be null): the handshake's publish, done by block 0 before it waits (one launch
// instead of two: GpuExpertTier's fuse_publish). The new seq is then words->seq + 1, stored by
// the last block to finish.
void tier_wait(TierDeviceWords* words, const void* jobs_dev, size_t job_bytes, int ring, int n_expert,
               uint32_t* smap_row, const uint32_t* abort_flag, TierTimes* times, const TierSelfRelease& self,
               const TierPublish* publish, int blocks, cudaStream_t stream);
// The read-ahead branch's kernel: the job of the handshake whose wait() ran last (channel 0's
// released_seq: it precedes this kernel in the graph, and the next wait() follows the join). The
// job's row goes to pending_rows[layer] (n_expert words a layer), pending_flags[layer] = 1.
void tier_read_ahead(TierDeviceWords* words, const void* jobs_dev, size_t job_bytes, int ring, int n_expert,
                     const uint32_t* abort_flag, uint32_t* pending_rows, uint32_t* pending_flags, int blocks,
                     cudaStream_t stream);


}  // namespace strata::compute::cuda
