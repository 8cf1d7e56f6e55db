// The GPU expert tier's host side. Contract in expert_tier.h.
#include "compute/cuda/expert_tier.h"

#include <immintrin.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include <cstdlib>

#include "compute/gpu_memory_plan.h"
#include "util/error.h"

namespace strata::compute::cuda {
namespace {

constexpr size_t kUnit = kGpuArenaUnit;  // slot-map offsets are in these units
// Bytes a wait-kernel block copies per chunk, and the kernel's blocks. Measured on the H200 (48 ×
// 512 bench, 50 % and 1 GiB budgets): 64, 132 or 264 blocks with 8, 16 or 64 KiB chunks all copy at
// 44–47 GB/s and decode within 1 % of each other.
constexpr size_t kChunk = 16 << 10;
constexpr int kWaitBlocks = 64;
constexpr size_t kMailboxHeader = 64;
constexpr int kJobRing = 8;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
size_t chunks_of(size_t bytes) { return (bytes + kChunk - 1) / kChunk; }

ExpertMatrixShape shape_of(const ExpertMatrixLayout& m, size_t offset) {
  return ExpertMatrixShape{m.type, m.n_in, m.n_out, offset, m.row_stride_bytes};
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

}  // namespace

GpuExpertTier::GpuExpertTier(const GpuTierOptions& options, int n_expert, int k, int64_t max_rows)
    : n_expert_(n_expert), k_(k), max_rows_(max_rows), residency_({1}, 1, 0) {
  read_ahead_enabled_ = options.read_ahead;
  fill_ranking_ = options.fill_ranking;
  fill_pinned_ = options.fill_pinned;
  moce_lambda_ = options.moce_lambda;
  moce_protect_ = options.moce_protect;
  moce_max_rank_ = options.moce_max_rank;
  self_release_ = options.self_release;
  if (const char* v = std::getenv("STRATA_TIER_SELF_RELEASE"); v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0))
    self_release_ = v[0] == '1';
  // Where the read-ahead branch joins (docs/bench-cuda.md, session 35): before the next publish
  // (session 33's placement) unless STRATA_TIER_JOIN=wait, session 35's candidate, which session 36
  // measured no faster (0.67 against 0.66 of all in VRAM at the skewed 25 % budget).
  if (const char* v = std::getenv("STRATA_TIER_JOIN"); v && std::strcmp(v, "wait") == 0) join_before_publish_ = false;
  // The read-ahead kernel's block count, for measuring (docs/bench-cuda.md, session 53): each of
  // its blocks on an SM can push one of a layer kernel's blocks there into a second wave.
  if (const char* v = std::getenv("STRATA_TIER_RA_BLOCKS"); v && std::atoi(v) > 0)
    read_ahead_blocks_ = std::min(std::atoi(v), kWaitBlocks);
  // The publish in the wait's launch, and the early launch of the experts after a wait that
  // released itself (expert_tier.h): both off until measured on a GPU; "1" turns each on.
  if (const char* v = std::getenv("STRATA_TIER_FUSE_PUBLISH"); v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0))
    fuse_publish_ = v[0] == '1';
  if (const char* v = std::getenv("STRATA_TIER_EARLY_LAUNCH"); v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0))
    early_launch_ = v[0] == '1';
  // Slot layout per layer: [gate | up | down] (compute/gpu_memory_plan.h, which the start check
  // sizes the arena by too).
  const GpuArenaPlan plan = plan_gpu_arena(options, n_expert, k, max_rows);
  layers_.resize(plan.layers.size());
  size_t largest_slice = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const ExpertLayerLayout& src = options.layers[l];
    const GpuArenaLayer& p = plan.layers[l];
    if (!p.present) continue;
    TierLayer& t = layers_[l];
    t.present = true;
    t.gate = shape_of(src.gate, 0);
    t.up = shape_of(src.up, p.up_offset);
    t.down = shape_of(src.down, p.down_offset);
    t.slot_bytes = p.slot_bytes;
    t.first_offset = p.first_offset;
    largest_slice = std::max({largest_slice, src.gate.bytes(), src.up.bytes(), src.down.bytes()});
  }
  slots_ = plan.slots;
  n_transient_ = plan.transient_slots;
  transient_offset_ = plan.transient_offset;
  transient_slot_bytes_ = plan.transient_slot_bytes;
  const size_t arena_bytes = plan.arena_bytes;
  // The start check (CudaBackend's constructor, gpu_memory_plan.h check_gpu_fit) counted this
  // arena beside the dense weights; this one sees what is free now, after the first windows'
  // uploads and states (a window of more rows than the start assumed gets more transient slots).
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (arena_bytes + (size_t(256) << 20) > free_bytes)
    fail("gpu expert tier: an arena of {:.1f} MiB ({} slots per layer + {} transient) does not fit in the {:.1f} MiB "
         "free on the device ({:.1f} MiB in all): lower --gpu-budget",
         double(arena_bytes) / (1 << 20), slots_, n_transient_, double(free_bytes) / (1 << 20),
         double(total_bytes) / (1 << 20));
  if (arena_bytes / kUnit >= kMiss) fail("gpu expert tier: an arena of {} bytes is too large to address", arena_bytes);
  arena_ = DeviceBuffer(arena_bytes);

  std::vector<int> per_layer(layers_.size(), 0);
  for (size_t l = 0; l < layers_.size(); ++l) per_layer[l] = layers_[l].present ? slots_ : 0;
  residency_ = SlotResidency(per_layer, n_expert, n_transient_);
  device_rows_ = DeviceSlotRows(int(layers_.size()), n_expert, resident_below());
  const std::vector<uint32_t> no_slots(layers_.size() * size_t(n_expert), kMiss);
  smap_ = DeviceBuffer(no_slots.size() * 4);
  smap_.upload(no_slots.data(), no_slots.size() * 4);
  pending_rows_ = DeviceBuffer(no_slots.size() * 4);
  pending_rows_.upload(no_slots.data(), no_slots.size() * 4);
  pending_flags_ = DeviceBuffer(layers_.size() * 4);
  STRATA_CUDA_CHECK(cudaMemset(pending_flags_.data(), 0, layers_.size() * 4));
  moce_stats_ = DeviceBuffer(4 * sizeof(double));
  STRATA_CUDA_CHECK(cudaMemset(moce_stats_.data(), 0, 4 * sizeof(double)));
  words_ = DeviceBuffer(sizeof(TierDeviceWords));
  STRATA_CUDA_CHECK(cudaMemset(words_.data(), 0, sizeof(TierDeviceWords)));

  // Mapped host memory: the mailbox, the job ring and the abort flag.
  const size_t capacity = size_t(k) * size_t(max_rows);
  const size_t mailbox_bytes = kMailboxHeader + capacity * 16;
  STRATA_CUDA_CHECK(cudaHostAlloc(&mailbox_host_, mailbox_bytes + 64, cudaHostAllocMapped));
  std::memset(mailbox_host_, 0, mailbox_bytes + 64);
  STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&mailbox_dev_, mailbox_host_, 0));
  abort_host_ = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(mailbox_host_) + mailbox_bytes);
  abort_dev_ = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(mailbox_dev_) + mailbox_bytes);
  consumed_host_ = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(mailbox_host_) + mailbox_bytes + 32);
  consumed_dev_ = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(mailbox_dev_) + mailbox_bytes + 32);
  // A job holds at most every expert of a layer: its three slices in chunks.
  max_chunks_ = size_t(n_expert) * 3 * chunks_of(largest_slice);
  job_bytes_ = align_up(sizeof(TierJobHeader) + align_up(size_t(n_expert) * 4, 16) + max_chunks_ * sizeof(TierCopy), 256);
  STRATA_CUDA_CHECK(cudaHostAlloc(&jobs_host_, job_bytes_ * kJobRing, cudaHostAllocMapped));
  std::memset(jobs_host_, 0, job_bytes_ * kJobRing);
  STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&jobs_dev_, jobs_host_, 0));
  STRATA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&times_host_), sizeof(TierTimes) * kTimelineRing,
                                  cudaHostAllocMapped));
  std::memset(static_cast<void*>(times_host_), 0, sizeof(TierTimes) * kTimelineRing);
  STRATA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&times_dev_), times_host_, 0));
  // Read-ahead: its job ring (copies only) and the branch's fork and join events.
  max_read_ahead_loads_ = int(std::min<int64_t>({int64_t(std::max(1, slots_ / 2)), int64_t(n_expert), int64_t(capacity)}));
  ra_job_bytes_ = job_bytes_;  // the same layout: header, the guessed layer's row, chunks
  STRATA_CUDA_CHECK(cudaHostAlloc(&ra_jobs_host_, ra_job_bytes_ * kJobRing, cudaHostAllocMapped));
  std::memset(ra_jobs_host_, 0, ra_job_bytes_ * kJobRing);
  STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&ra_jobs_dev_, ra_jobs_host_, 0));
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  seen_.assign(size_t(n_expert), 0);
  best_.assign(size_t(n_expert), -1.0f);
  heat_.assign(layers_.size() * size_t(n_expert), 0);
  routing_.k = k;
  routing_.experts.reserve(capacity);
  routing_.weights.reserve(capacity);
  thread_ = std::thread([this] { run(); });
}

GpuExpertTier::~GpuExpertTier() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (void* p : registered_) cudaHostUnregister(p);
  if (bounce_host_) cudaFreeHost(bounce_host_);
  if (jobs_host_) cudaFreeHost(jobs_host_);
  if (ra_jobs_host_) cudaFreeHost(ra_jobs_host_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (times_host_) cudaFreeHost(times_host_);
  if (mailbox_host_) cudaFreeHost(mailbox_host_);
}

RouteMoce GpuExpertTier::moce(int layer) const {
  RouteMoce m;
  if (moce_lambda_ <= 0.0) return m;
  m.lambda = moce_lambda_;
  m.protect = moce_protect_;
  m.max_rank = moce_max_rank_;
  m.smap = smap_.as<uint32_t>() + size_t(layer) * size_t(n_expert_);
  m.smap_next = has_layer(layer + 1) ? m.smap + n_expert_ : nullptr;
  m.resident_below = resident_below();
  m.stats = moce_stats_.as<double>();
  return m;
}

ExpertArenaView GpuExpertTier::view(int layer) const {
  ExpertArenaView v;
  v.base = arena_.as<uint8_t>();
  v.slot_bytes = kUnit;
  v.smap = smap_.as<uint32_t>() + size_t(layer) * size_t(n_expert_);
  v.n_expert = n_expert_;
  return v;
}

void GpuExpertTier::prepare_source(ExpertSource& source) {
  // Called with mutex_ held, before any handshake of the source is served.
  source_ = &source;
  stable_pointers_ = source.pointers_stay_valid();
  direct_reads_ = true;
  const long page = sysconf(_SC_PAGESIZE);
  const std::vector<ExpertSource::HostRegion> regions = source.host_regions();
  if (regions.empty()) direct_reads_ = false;
  for (const ExpertSource::HostRegion& r : regions) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(r.data) / uintptr_t(page) * uintptr_t(page);
    const uintptr_t end = align_up(reinterpret_cast<uintptr_t>(r.data) + r.bytes, size_t(page));
    void* p = reinterpret_cast<void*>(begin);
    cudaError_t e = cudaHostRegister(p, end - begin, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
      cudaGetLastError();
      e = cudaHostRegister(p, end - begin, cudaHostRegisterMapped);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::fprintf(stderr,
                   "note: gpu expert tier: %.1f MiB of host experts could not be pinned (%s); copying them through "
                   "the driver's staging instead\n",
                   double(end - begin) / (1 << 20), cudaGetErrorString(e));
      direct_reads_ = false;
      continue;
    }
    registered_.push_back(p);
    void* dev = nullptr;
    STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
    aliases_.push_back({static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + (end - begin),
                        static_cast<const uint8_t*>(dev)});
  }
  // Misses that cannot be read in place are staged here (allocated now, on the window thread: the
  // handshake thread makes no CUDA call). A layer loads at most n_transient experts, a guess at
  // most max_read_ahead_loads_, into one of two read-ahead parts by the handshake's parity: the
  // read-ahead kernel of handshake s may still read its part while this thread, serving s + 1,
  // stages the next guess (with STRATA_TIER_JOIN=wait the branch joins only before wait(s + 1),
  // after that publish).
  if (!(direct_reads_ && stable_pointers_)) {
    bounce_bytes_ =
        size_t(n_transient_ + (read_ahead_enabled_ ? 2 * max_read_ahead_loads_ : 0)) * transient_slot_bytes_;
    STRATA_CUDA_CHECK(cudaHostAlloc(&bounce_host_, bounce_bytes_, cudaHostAllocMapped));
    STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&bounce_dev_, bounce_host_, 0));
  }
}

// Adds the timed handshakes (first_seq, last_seq] to the latency stats. REQUIRES: the GPU has
// finished them (the window's stream was synchronized), mutex_ held.
void GpuExpertTier::account_timeline(uint32_t first_seq, uint32_t last_seq) {
  for (uint32_t seq = first_seq + 1; seq != last_seq + 1; ++seq) {
    if (last_seq - seq >= uint32_t(kTimelineRing)) continue;  // overwritten since
    const TierTimes& t = times_host_[seq % kTimelineRing];
    if (t.seq != seq || t.released_ns == 0) continue;
    const int64_t published = int64_t(t.published_ns), spin = int64_t(t.spin_ns), released = int64_t(t.released_ns);
    stats_.round_trip_ms += double(released - published) * 1e-6;
    stats_.before_wait_ms += double(std::max<int64_t>(0, spin - published)) * 1e-6;
    ++stats_.timed_handshakes;
  }
}

void GpuExpertTier::expect(ExpertSource& source) {
  {
    std::lock_guard lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    if (!source_) prepare_source(source);
    else if (source_ != &source)
      fail("gpu expert tier: one expert source per model (a second sequence passed another one)");
    ++expected_;
  }
  cv_.notify_all();
}

void GpuExpertTier::prime(ExpertSource& source) {
  std::lock_guard lock(mutex_);
  if (source_) fail("gpu expert tier: prime() after the host tier was bound");
  prepare_source(source);
  if (fill_ranking_.empty()) return;
  std::vector<SlotResidency::Load> loads;
  for (size_t l = 0; l < layers_.size() && l < fill_ranking_.size(); ++l) {
    if (!layers_[l].present || fill_ranking_[l].empty()) continue;
    residency_.fill(int(l), fill_ranking_[l], fill_pinned_, loads);
    stats_.fill_loads += loads.size();
    stats_.policy_bytes += copy_now(int(l), loads);
    upload_row(int(l));
  }
  fill_ranking_.clear();
  fill_ranking_.shrink_to_fit();
}

void GpuExpertTier::reset_prompt_heat() {
  std::lock_guard lock(mutex_);
  std::fill(heat_.begin(), heat_.end(), 0);
}

int GpuExpertTier::pin_prompt_hot(const HotPinOptions& options, const UsageHistory* history) {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (served_ != expected_) fail("gpu expert tier: pin_prompt_hot while a window's handshakes are in flight");
  if (!source_) return 0;  // no window has run: nothing was routed yet
  int changes = 0;
  std::vector<double> score;
  std::vector<SlotResidency::Load> loads;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].present) continue;
    const int n_hot = std::min(options.n_hot, slots_ / 2);
    const std::vector<int32_t> current = residency_.hot_pins(int(l));
    const std::span<const uint64_t> heat(heat_.data() + l * size_t(n_expert_), size_t(n_expert_));
    const std::vector<int32_t> wanted = prompt_hot_pins(
        heat, history, int(l), options, n_hot, current, [&](int32_t e) { return residency_.pinned(int(l), e); }, score);
    changes += residency_.pin_hot(int(l), wanted, loads);
    stats_.pin_loads += loads.size();
    stats_.policy_bytes += copy_now(int(l), loads);
    if (!loads.empty()) upload_row(int(l));
  }
  stats_.pin_changes += uint64_t(changes);
  return changes;
}

// The layer's device slot-map row from the residency now (cache slots; no transient ones), so
// that what the router sees as resident (MoCE) follows a change made between windows at once
// rather than at the layer's next wait().
// The pending row gets the same (a read-ahead row still pending for the layer predates this change).
void GpuExpertTier::upload_row(int layer) {
  residency_row(layer, row_);
  const size_t at = size_t(layer) * size_t(n_expert_);
  device_rows_.write(layer, row_);
  for (DeviceBuffer* rows : {&smap_, &pending_rows_})
    STRATA_CUDA_CHECK(cudaMemcpyAsync(rows->as<uint32_t>() + at, row_.data(), size_t(n_expert_) * 4,
                                      cudaMemcpyHostToDevice, copy_stream_.get()));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
}

uint32_t GpuExpertTier::resident_below() const { return uint32_t(transient_offset_ / kUnit); }

// The layer's slot-map row as the residency has it: cache slots only.
void GpuExpertTier::residency_row(int layer, std::vector<uint32_t>& row) const {
  row.resize(size_t(n_expert_));
  for (int32_t e = 0; e < n_expert_; ++e) {
    const uint32_t s = residency_.slot_of(layer, e);
    row[size_t(e)] = s == SlotResidency::kMiss ? kMiss : offset_units(layer, {e, s, false});
  }
}

// The host tier hands the loads out in batches of at most n_transient_ experts, in ascending id
// (what a publish may hold; a streaming RAM arena's pointers die at its next call, so each batch is
// copied and synchronized before the next). The caller writes the device slot-map row after
// (upload_row); the layer's next wait() writes it again from the residency of that handshake.
uint64_t GpuExpertTier::copy_now(int layer, const std::vector<SlotResidency::Load>& loads) {
  if (loads.empty()) return 0;
  const TierLayer& t = layers_[size_t(layer)];
  std::vector<SlotResidency::Load> sorted(loads);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.expert < b.expert; });
  const size_t batch = size_t(std::max(1, n_transient_));
  uint64_t bytes = 0;
  for (size_t first = 0; first < sorted.size(); first += batch) {
    const size_t n = std::min(batch, sorted.size() - first);
    load_ids_.clear();
    for (size_t i = 0; i < n; ++i) load_ids_.push_back(sorted[first + i].expert);
    source_->publish(layer, load_ids_);
    for_each_delivered(*source_, [&](int index, const ExpertMatrices& m) {
      if (index < 0 || size_t(index) >= n)
        fail("gpu expert tier: layer {}: the host tier handed out index {} of {}", layer, index, n);
      uint8_t* dst = arena_.as<uint8_t>() + size_t(offset_units(layer, sorted[first + size_t(index)])) * kUnit;
      const std::pair<const compute::WeightMatrix*, const ExpertMatrixShape*> parts[] = {
          {&m.gate, &t.gate}, {&m.up, &t.up}, {&m.down, &t.down}};
      for (const auto& [matrix, shape] : parts) {
        const size_t n_bytes = size_t(shape->n_out) * shape->row_stride_bytes;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(dst + shape->matrix_offset, matrix->data, n_bytes, cudaMemcpyHostToDevice,
                                          copy_stream_.get()));
        bytes += n_bytes;
      }
    });
    STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
  }
  return bytes;
}

void GpuExpertTier::publish(int layer, const int32_t* ids, const float* weights, int64_t n_pairs,
                            const int32_t* guess_ids, const float* guess_weights, int64_t n_guess,
                            cudaStream_t stream) {
  const int64_t capacity = int64_t(k_) * max_rows_;
  if (n_pairs > capacity || n_guess > capacity)
    fail("gpu expert tier: a window of {} routed pairs exceeds the {} the tier was sized for ({} rows)", n_pairs,
         capacity, max_rows_);
  if (layer < 0 || size_t(layer) >= layers_.size() || !layers_[size_t(layer)].present)
    fail("gpu expert tier: layer {} has no routed experts", layer);
  if (pending_publish_.mailbox != nullptr) fail("gpu expert tier: layer {} published before the last publish's wait", layer);
  TierPublish p;
  p.ids = ids;
  p.weights = weights;
  p.n_pairs = int(n_pairs);
  p.guess_ids = guess_ids;
  p.guess_weights = guess_weights;
  p.n_guess = guess_ids ? int(n_guess) : 0;
  p.capacity = int(capacity);
  p.layer = layer;
  p.mailbox = mailbox_dev_;
  p.consumed_host = consumed_dev_;
  // Fused: the next wait() publishes in its own launch (with STRATA_TIER_JOIN=wait after the
  // read-ahead branch's join, which then precedes the publish too).
  if (fuse_publish_) pending_publish_ = p;
  else tier_publish(p, abort_dev_, words_.as<TierDeviceWords>(), times_dev_, stream);
}

void GpuExpertTier::read_ahead(cudaStream_t stream) {
  if (branch_open_) fail("gpu expert tier: a read-ahead branch was forked while the last one was still open");
  STRATA_CUDA_CHECK(cudaEventRecord(fork_, stream));
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(side_stream_.get(), fork_, 0));
  // Fewer blocks than wait()'s: the branch shares the SMs with the layer's own kernels, and needs
  // only enough loads in flight to keep PCIe busy.
  // Pending rows exist only with self-release (release_read_ahead writes a row into the job then).
  // Block 0 alone reads the job header's has_row across PCIe and passes it on in device memory: a
  // read per block cost the branch 0.50 -> 1.8 ms per token at the 25 % tier (docs/bench-cuda.md,
  // session 38).
  const bool pending = self_release_;
  tier_read_ahead(words_.as<TierDeviceWords>(), ra_jobs_dev_, ra_job_bytes_, kJobRing, n_expert_, abort_dev_,
                  pending ? pending_rows_.as<uint32_t>() : nullptr, pending ? pending_flags_.as<uint32_t>() : nullptr,
                  read_ahead_blocks_, side_stream_.get());
  STRATA_CUDA_CHECK(cudaEventRecord(join_, side_stream_.get()));
  branch_open_ = true;
}

void GpuExpertTier::join(cudaStream_t stream) {
  if (!branch_open_) return;
  branch_open_ = false;
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
}

void GpuExpertTier::wait(int layer, const int32_t* ids, int64_t n_pairs, cudaStream_t stream) {
  TierSelfRelease self;
  if (self_release_) {
    self.ids = ids;
    self.n_pairs = int(n_pairs);
    self.resident_below = resident_below();
    self.pending_row = pending_rows_.as<uint32_t>() + size_t(layer) * size_t(n_expert_);
    self.pending_flag = pending_flags_.as<uint32_t>() + layer;
    self.launch_dependents_when_free = early_launch_;
  }
  const TierPublish publish = pending_publish_;
  pending_publish_ = TierPublish{};
  if (fuse_publish_ && (publish.mailbox == nullptr || publish.layer != layer))
    fail("gpu expert tier: the wait of layer {} has no publish of that layer before it", layer);
  // 64 blocks: enough 16-byte loads in flight to keep PCIe busy (kWaitBlocks); only block 0 polls the host.
  tier_wait(words_.as<TierDeviceWords>(), jobs_dev_, job_bytes_, kJobRing, n_expert_,
            smap_.as<uint32_t>() + size_t(layer) * size_t(n_expert_), abort_dev_, times_dev_, self,
            fuse_publish_ ? &publish : nullptr, kWaitBlocks, stream);
}

bool GpuExpertTier::trace() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_TIER_TRACE");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

std::string GpuExpertTier::describe_state() {
  const auto* header = static_cast<const TierMailboxHeader*>(mailbox_host_);
  TierDeviceWords words{};
  if (cudaMemcpyAsync(&words, words_.data(), sizeof(words), cudaMemcpyDeviceToHost, copy_stream_.get()) == cudaSuccess)
    cudaStreamSynchronize(copy_stream_.get());
  std::lock_guard lock(mutex_);
  return fmt::format("expected {} served {} last served seq {}; mailbox seq {} (layer {}), read by the host up to {}; "
                     "device seq {}, released {} ({} by themselves, the last {}, the host heard up to {}), "
                     "{} blocks of the last wait kernel done; read-ahead released {}, {} blocks done",
                     expected_, served_, last_seq_, header->seq, header->layer, *consumed_host_, words.seq,
                     words.channel[0].released_seq, words.self_released, words.unconsumed_seq, words.consumed_seq,
                     words.channel[0].done_blocks, words.channel[1].released_seq, words.channel[1].done_blocks);
}

void GpuExpertTier::settle() {
  const auto* header = static_cast<const TierMailboxHeader*>(mailbox_host_);
  const uint32_t published = header->seq;
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return last_seq_ == published || error_ != nullptr; });
  expected_ = served_;
  account_timeline(accounted_seq_, last_seq_);
  accounted_seq_ = last_seq_;
  if (error_) std::rethrow_exception(error_);
}

GpuTierStats GpuExpertTier::stats() const {
  TierDeviceWords words{};
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(&words, words_.data(), sizeof(words), cudaMemcpyDeviceToHost, copy_stream_.get()));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
  std::lock_guard lock(mutex_);
  GpuTierStats s = stats_;
  s.gpu_wait_ms = double(words.channel[0].wait_ns) * 1e-6;
  s.gpu_copy_ms = double(words.channel[0].copy_ns) * 1e-6;
  s.gpu_read_ahead_wait_ms = double(words.channel[1].wait_ns) * 1e-6;
  s.gpu_read_ahead_copy_ms = double(words.channel[1].copy_ns) * 1e-6;
  s.gpu_self_released = words.self_released;
  s.staged = bounce_host_ != nullptr;
  const SlotResidencyStats& r = residency_.stats();
  s.needed = r.needed;
  s.hits = r.hits;
  s.misses = r.misses;
  s.transient = r.transient;
  s.read_ahead_issued = r.read_ahead_issued;
  s.read_ahead_used = r.read_ahead_used;
  double moce[4] = {};
  STRATA_CUDA_CHECK(cudaMemcpyAsync(moce, moce_stats_.data(), sizeof(moce), cudaMemcpyDeviceToHost, copy_stream_.get()));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
  s.moce_rows = moce[0];
  s.moce_swaps = moce[1];
  s.moce_agreement_sum = moce[2];
  s.moce_kl_sum = moce[3];
  s.hot_pins = s.fill_pins = 0;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l].present)
      for (int32_t e = 0; e < n_expert_; ++e) {
        s.hot_pins += residency_.hot(int(l), e);
        s.fill_pins += residency_.pinned(int(l), e);
      }
  return s;
}

void GpuExpertTier::run() {
  const auto* header = static_cast<const TierMailboxHeader*>(mailbox_host_);
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || served_ < expected_; });
      if (stop_) return;
    }
    // One handshake is coming: spin for it (the GPU waits for us next), backing off after a
    // while so that a window that never launches (an error on the window thread) costs no core.
    const uint32_t want = last_seq_ + 1;
    for (uint64_t spins = 0; header->seq != want; ++spins) {
      if ((spins & 1023) == 0) {
        std::lock_guard lock(mutex_);
        if (stop_) return;
        if (served_ >= expected_) break;  // settle() dropped the expectation
      }
      if (spins < (1u << 20)) _mm_pause();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (header->seq != want) continue;
    std::atomic_thread_fence(std::memory_order_acquire);
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_ms();
    try {
      if (!error_) serve();
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      *abort_host_ = 1;  // release every wait kernel; the window's results are garbage
    }
    {
      std::lock_guard lock(mutex_);
      stats_.host_serve_ms += ms_since(start);
      stats_.serve_cpu_ms += thread_cpu_ms() - cpu_start;
      last_seq_ = want;
      ++served_;
    }
    cv_.notify_all();
  }
}

// The device address of registered host bytes [p, p + n).
const uint8_t* GpuExpertTier::device_alias(const uint8_t* p, size_t n) const {
  for (const Alias& a : aliases_)
    if (p >= a.host_begin && p + n <= a.host_end) return a.device_begin + (p - a.host_begin);
  fail("gpu expert tier: the host tier handed out {} bytes outside the memory it named (host_regions)", n);
}

uint32_t GpuExpertTier::offset_units(int layer, const SlotResidency::Load& load) const {
  const size_t offset = load.transient ? transient_offset_ + size_t(load.slot) * transient_slot_bytes_
                                       : layers_[size_t(layer)].first_offset +
                                             size_t(load.slot) * layers_[size_t(layer)].slot_bytes;
  return uint32_t(offset / kUnit);
}

void GpuExpertTier::serve() {
  const auto* header = static_cast<const TierMailboxHeader*>(mailbox_host_);
  const int layer = int(header->layer);
  const int n_pairs = int(header->n_pairs), n_guess = int(header->n_guess);
  const int64_t capacity = int64_t(k_) * max_rows_;
  if (n_pairs < 0 || n_pairs > capacity || n_guess < 0 || n_guess > capacity)
    fail("gpu expert tier: the GPU published {} pairs and {} guesses; the mailbox holds {}", n_pairs, n_guess,
         capacity);
  // The mailbox is read once, then handed back: a wait that released itself lets the GPU publish
  // the next handshake without hearing from this thread (publish_kernel checks consumed).
  const auto* mailbox_ids = reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(mailbox_host_) + kMailboxHeader);
  mailbox_.assign(mailbox_ids, mailbox_ids + n_pairs);
  mailbox_.insert(mailbox_.end(), mailbox_ids + capacity, mailbox_ids + capacity + n_guess);  // guess ids
  const auto* mailbox_weights = reinterpret_cast<const float*>(mailbox_ids + 3 * capacity);
  const auto* mailbox_guess_weights = reinterpret_cast<const float*>(mailbox_ids + 2 * capacity);
  mailbox_weights_.assign(mailbox_weights, mailbox_weights + n_pairs);
  mailbox_weights_.insert(mailbox_weights_.end(), mailbox_guess_weights, mailbox_guess_weights + n_guess);
  const uint32_t seq = last_seq_ + 1;
  std::atomic_thread_fence(std::memory_order_release);
  *consumed_host_ = seq;
  const int32_t* ids = mailbox_.data();
  if (layer < 0 || size_t(layer) >= layers_.size() || !layers_[size_t(layer)].present)
    fail("gpu expert tier: the GPU published layer {}, which has no routed experts", layer);

  const auto start = std::chrono::steady_clock::now();
  // The layer's union, ascending.
  union_.clear();
  for (int i = 0; i < n_pairs; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= n_expert_) fail("gpu expert tier: layer {}: routed expert id {} out of range", layer, e);
    if (!seen_[size_t(e)]) {
      seen_[size_t(e)] = 1;
      union_.push_back(e);
    }
  }
  for (const int32_t e : union_) seen_[size_t(e)] = 0;
  std::sort(union_.begin(), union_.end());
  // The policies' inputs: this prompt's heat and the host tier's own observers (usage history,
  // prompt heat, a routing trace), with the rows as the router chose them.
  uint64_t* heat = heat_.data() + size_t(layer) * size_t(n_expert_);
  for (int i = 0; i < n_pairs; ++i) ++heat[ids[i]];
  const float* weights = mailbox_weights_.data();
  routing_.experts.assign(ids, ids + n_pairs);
  routing_.weights.assign(weights, weights + n_pairs);
  source_->observe_routing(layer, routing_);
  // The wait kernel's rule, on the row the device holds (expert_tier.cu): it released itself when
  // every routed expert has a cache slot there. Such a handshake must resolve to hits only, with
  // the device's row still the residency's; anything else would compute with wrong bytes.
  const bool released_itself = self_release_ && device_rows_.all_cached(layer, union_);
  residency_.resolve(layer, union_, loads_);
  ++stats_.handshakes;
  stats_.serve_resolve_ms += ms_since(start);
  if (trace())
    std::fprintf(stderr, "tier: seq %u layer %d: %d pairs, union %zu, %zu loads%s\n", seq, layer, n_pairs,
                 union_.size(), loads_.size(), released_itself ? ", released by the GPU" : "");
  if (released_itself) {
    check_device_row(layer);
    ++stats_.self_released;
  } else {
    release(layer, seq);
  }
  if (n_guess > 0) release_read_ahead(layer + 1, seq, ids + n_pairs, weights + n_pairs, n_guess);
}

// A handshake the GPU released by itself: no miss, and the device's row agrees with the residency
// (DeviceSlotRows::agrees; tests/experts/device_slot_rows_test.cpp plays this protocol on the CPU).
void GpuExpertTier::check_device_row(int layer) {
  residency_row(layer, row_);
  if (!loads_.empty() || !device_rows_.agrees(layer, row_))
    fail("gpu expert tier: layer {}: the GPU released a handshake by itself ({} misses resolved) on a slot-map row that "
         "is not the residency's: the tier's bookkeeping is broken",
         layer, loads_.size());
}

// Fills the job of handshake `seq`: the layer's new slot-map row (from the residency, plus this
// call's transient slots) and the chunks to copy, then marks it ready: the GPU's wait kernel copies.
void GpuExpertTier::release(int layer, uint32_t seq) {
  const auto row_start = std::chrono::steady_clock::now();
  uint8_t* job = static_cast<uint8_t*>(jobs_host_) + size_t(seq % kJobRing) * job_bytes_;
  auto* header = reinterpret_cast<TierJobHeader*>(job);
  // Built in ordinary memory, then copied into the mapped job in one pass: the job's lines are
  // read by the GPU's polling blocks across PCIe, so fewer, wider stores to them.
  residency_row(layer, row_);
  for (const SlotResidency::Load& load : loads_)
    if (load.transient) row_[size_t(load.expert)] = offset_units(layer, load);
  device_rows_.write(layer, row_);

  stats_.serve_job_ms += ms_since(row_start);
  const auto source_start = std::chrono::steady_clock::now();
  copies_.clear();
  const uint64_t bytes = gather_copies(layer, loads_, 0);
  stats_.loaded_bytes += bytes;
  stats_.miss_bytes += bytes;
  stats_.serve_source_ms += ms_since(source_start);
  const auto job_start = std::chrono::steady_clock::now();
  const uint32_t n_copies = uint32_t(copies_.size());
  const size_t row_bytes = align_up(size_t(n_expert_) * 4, 16);
  std::memcpy(job + sizeof(TierJobHeader), row_.data(), size_t(n_expert_) * 4);
  if (n_copies > 0) std::memcpy(job + sizeof(TierJobHeader) + row_bytes, copies_.data(), copies_.size() * sizeof(TierCopy));
  header->n_copies = n_copies;
  std::atomic_thread_fence(std::memory_order_release);
  header->ready = seq;  // volatile: the wait kernel sees it after the job above
  stats_.serve_job_ms += ms_since(job_start);
}

uint64_t GpuExpertTier::gather_copies(int layer, const std::vector<SlotResidency::Load>& loads,
                                      size_t bounce_first_slot) {
  if (loads.empty()) return 0;
  const TierLayer& t = layers_[size_t(layer)];
  // The loads' bytes from the host tier, in the order it hands them out; read in place when its
  // memory is pinned and stays valid, else staged in the pinned bounce buffer first.
  const bool in_place = direct_reads_ && stable_pointers_;
  load_ids_.clear();
  for (const SlotResidency::Load& load : loads) load_ids_.push_back(load.expert);
  source_->publish(layer, load_ids_);
  uint64_t bytes = 0;
  for_each_delivered(*source_, [&](int index, const ExpertMatrices& m) {
    if (index < 0 || size_t(index) >= loads.size())
      fail("gpu expert tier: layer {}: the host tier handed out index {} of {}", layer, index, loads.size());
    uint8_t* dst = arena_.as<uint8_t>() + size_t(offset_units(layer, loads[size_t(index)])) * kUnit;
    const std::pair<const compute::WeightMatrix*, const ExpertMatrixShape*> parts[] = {
        {&m.gate, &t.gate}, {&m.up, &t.up}, {&m.down, &t.down}};
    for (const auto& [matrix, shape] : parts) {
      const size_t n = size_t(shape->n_out) * shape->row_stride_bytes;
      const auto* src = static_cast<const uint8_t*>(matrix->data);
      if (in_place) {
        src = device_alias(src, n);
      } else {
        const size_t slot = bounce_first_slot + size_t(index);
        if ((slot + 1) * transient_slot_bytes_ > bounce_bytes_)
          fail("gpu expert tier: layer {}: staging slot {} is outside the bounce buffer", layer, slot);
        uint8_t* staged = static_cast<uint8_t*>(bounce_host_) + slot * transient_slot_bytes_ + shape->matrix_offset;
        std::memcpy(staged, src, n);
        src = static_cast<const uint8_t*>(bounce_dev_) + (staged - static_cast<uint8_t*>(bounce_host_));
      }
      bytes += n;
      for (size_t at = 0; at < n; at += kChunk)
        copies_.push_back(TierCopy{src + at, dst + shape->matrix_offset + at, uint32_t(std::min(kChunk, n - at)), 0});
    }
  });
  if (copies_.size() > max_chunks_)
    fail("gpu expert tier: layer {}: {} copy chunks exceed the job's {}", layer, copies_.size(), max_chunks_);
  return bytes;
}

// The read-ahead job of handshake `seq`: the guess for `layer` (the next layer's router on the
// published layer's input) ranked as the CPU path ranks it (layers/moe.cpp moe_predict: best
// weight over the rows, descending, ties to the lower id), slots assigned by
// SlotResidency::predict, and the chunks that bring the new ones in. Always released (possibly
// with no copies): the GPU's read-ahead kernel waits for it.
void GpuExpertTier::release_read_ahead(int layer, uint32_t seq, const int32_t* guess_ids, const float* guess_weights,
                                       int n_guess) {
  const auto start = std::chrono::steady_clock::now();
  uint8_t* job = static_cast<uint8_t*>(ra_jobs_host_) + size_t(seq % kJobRing) * ra_job_bytes_;
  auto* header = reinterpret_cast<TierJobHeader*>(job);
  const size_t row_bytes = align_up(size_t(n_expert_) * 4, 16);
  copies_.clear();
  uint64_t bytes = 0;
  header->has_row = 0;
  if (read_ahead_enabled_ && layer >= 0 && size_t(layer) < layers_.size() && layers_[size_t(layer)].present) {
    ranked_.clear();
    for (int i = 0; i < n_guess; ++i) {
      const int32_t e = guess_ids[i];
      if (e < 0 || e >= n_expert_) fail("gpu expert tier: layer {}: guessed expert id {} out of range", layer, e);
      if (best_[size_t(e)] < 0.0f) ranked_.push_back(e);
      best_[size_t(e)] = std::max(best_[size_t(e)], guess_weights[i]);
    }
    std::sort(ranked_.begin(), ranked_.end(), [&](int32_t a, int32_t b) {
      return best_[size_t(a)] > best_[size_t(b)] || (best_[size_t(a)] == best_[size_t(b)] && a < b);
    });
    for (const int32_t e : ranked_) best_[size_t(e)] = -1.0f;
    residency_.predict(layer, ranked_, ra_loads_);
    if (int(ra_loads_.size()) > max_read_ahead_loads_)
      fail("gpu expert tier: layer {}: {} read-ahead loads exceed the {} the tier was sized for", layer,
           ra_loads_.size(), max_read_ahead_loads_);
    bytes = gather_copies(layer, ra_loads_, size_t(n_transient_) + size_t(seq & 1u) * size_t(max_read_ahead_loads_));
    // The layer's row after the guess: the read-ahead kernel leaves it pending for the layer's
    // next wait (whose self-release rule reads it); this thread's copy of the device row follows.
    // Without self-release the wait's job carries the whole row anyway: no pending row then.
    if (self_release_) {
      residency_row(layer, row_);
      device_rows_.write(layer, row_);
      std::memcpy(job + sizeof(TierJobHeader), row_.data(), size_t(n_expert_) * 4);
      header->layer = uint32_t(layer);
      header->has_row = 1;
    }
  }
  stats_.loaded_bytes += bytes;
  stats_.read_ahead_bytes += bytes;
  if (!copies_.empty())
    std::memcpy(job + sizeof(TierJobHeader) + row_bytes, copies_.data(), copies_.size() * sizeof(TierCopy));
  header->n_copies = uint32_t(copies_.size());
  std::atomic_thread_fence(std::memory_order_release);
  header->ready = seq;  // volatile: the read-ahead kernel sees it after the job above
  stats_.serve_source_ms += ms_since(start);
  if (trace())
    std::fprintf(stderr, "tier: seq %u read-ahead layer %d: %d guessed pairs, %zu ranked, %zu loads\n", seq, layer,
                 n_guess, ranked_.size(), ra_loads_.size());
}

}  // namespace strata::compute::cuda
