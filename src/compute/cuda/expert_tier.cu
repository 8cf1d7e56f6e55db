// Kernels of the GPU expert tier's handshake (contract in expert_tier.h).
#include <cuda_runtime.h>

#include "compute/cuda/expert_tier.h"
#include "compute/cuda/launch.cuh"

namespace strata::compute::cuda {
namespace {

constexpr size_t kMailboxHeader = 64;  // TierMailboxHeader, padded: the id arrays start after it
constexpr int kLoadThreads = 256;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The publish of one handshake by one block: waits until the host has read the previous
// handshake's mailbox when that one's wait released itself, writes the ids (and the guess) to the
// mailbox, its timestamp, then the header with `seq` last (the host polls it). REQUIRES: the
// block's threads all call it; the routed ids are complete (after griddepcontrol.wait).
__device__ void publish_block(const TierPublish& p, uint32_t seq, TierDeviceWords* words, const uint32_t* abort_flag,
                              TierTimes* times) {
  // A wait that released itself did not hear from the host: the host may still be reading the
  // mailbox of that handshake. Unless a read-ahead kernel has since seen the host's answer to it
  // (consumed_seq), ask the host word (one read across PCIe, usually already there).
  if (threadIdx.x == 0) {
    const volatile TierDeviceWords* v = words;
    const uint32_t unconsumed = v->unconsumed_seq;
    if (int32_t(unconsumed - v->consumed_seq) > 0) {
      const volatile uint32_t* host = p.consumed_host;
      const volatile uint32_t* abort = abort_flag;
      for (uint32_t spins = 1; int32_t(unconsumed - *host) > 0; ++spins)
        if ((spins & 255) == 0 && *abort != 0) break;
      words->consumed_seq = unconsumed;
    }
  }
  __syncthreads();
  uint8_t* mailbox = static_cast<uint8_t*>(p.mailbox);
  int32_t* out_ids = reinterpret_cast<int32_t*>(mailbox + kMailboxHeader);
  int32_t* out_guess = out_ids + p.capacity;
  float* out_weights = reinterpret_cast<float*>(out_guess + p.capacity);
  float* out_layer_weights = out_weights + p.capacity;
  for (int i = int(threadIdx.x); i < p.n_pairs; i += int(blockDim.x)) {
    out_ids[i] = p.ids[i];
    out_layer_weights[i] = p.weights[i];
  }
  for (int i = int(threadIdx.x); i < p.n_guess; i += int(blockDim.x)) {
    out_guess[i] = p.guess_ids[i];
    out_weights[i] = p.guess_weights[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    auto* header = reinterpret_cast<TierMailboxHeader*>(mailbox);
    header->layer = uint32_t(p.layer);
    header->n_pairs = uint32_t(p.n_pairs);
    header->n_guess = uint32_t(p.n_guess);
    TierTimes* t = times + seq % uint32_t(kTimelineRing);
    t->seq = seq;
    t->published_ns = global_ns();
    __threadfence_system();
    header->seq = seq;
    __threadfence_system();
  }
}

__global__ void publish_kernel(TierPublish p, const uint32_t* abort_flag, TierDeviceWords* words, TierTimes* times) {
  pdl_begin();
  const uint32_t seq = words->seq + 1;
  __syncthreads();  // every thread read the old seq before thread 0 writes the new one
  if (threadIdx.x == 0) words->seq = seq;
  publish_block(p, seq, words, abort_flag, times);
}

// The GPU side of a release: block 0 spins until the host marks the job of `seq` ready (a word
// in mapped host memory) and passes it on in device memory, where the other blocks spin; then the
// blocks copy the job's chunks (grid-stride, reading pinned host memory directly) and, for a
// layer's misses (channel 0), write the layer's slot-map row. The kernels after this one wait for
// its completion (stream order / PDL, or the read-ahead branch's join), so completion is the
// release: no ack word, and no CUDA call on the host side of the handshake. Not pdl_begin(): the
// kernels after this one must not be launched (and hold SMs at their own wait) before the copies
// are done.
// Why one poller: with every block polling the host word across PCIe, a release took ≈ 107 µs to
// be seen (H200, 64 blocks; the host had written it in ≈ 10 µs); with one, ≈ 4 µs. Back-off in
// the poll loop cost 2 % of decode speed at 100 ns (H200, 50 % budget), so there is none.
// Block 0 notes when it started spinning and when the job was ready; the last block to finish adds
// the spin and the copy time to the channel's sums (GpuTierStats::gpu_wait_ms / gpu_copy_ms and
// the read-ahead pair).
// seq: channel 0 serves the last published handshake (words->seq); channel 1 (read-ahead) the one
// whose wait ran last (channel 0's released_seq), which a later publish cannot change before this
// kernel ran: the next wait follows the branch's join.
// Self-release (channel 0, `self` non-null): block 0 first applies the layer's pending row (what
// the read-ahead job of the previous handshake made of it), then, when every routed id of the
// handshake has a cache slot in the row, releases at once: no job, no copy, the row kept. Else it
// spins for the host's job as above. The host evaluates the same rule on its copy of the device
// row and checks that such a handshake resolves with no miss (expert_tier.cpp serve).
// Read-ahead (channel 1): after its copies, the job's row of the guessed layer goes to that layer's
// pending row (flag set by the last block), for the layer's next wait to apply.
__global__ void release_and_copy_kernel(TierDeviceWords* words, int channel_index, const uint8_t* jobs,
                                        size_t job_bytes, int ring, int n_expert, uint32_t* smap_row,
                                        const uint32_t* abort_flag, TierTimes* times, TierSelfRelease self,
                                        uint32_t* pending_rows, uint32_t* pending_flags, TierPublish publish) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ int n_copies;
  __shared__ bool aborted, copy_row;
  __shared__ uint32_t pending_layer;  // read-ahead: the guessed layer whose row the job carries, or none
  TierChannel* channel = &words->channel[channel_index];
  // Fused with the publish (channel 0): every block reads the last published seq before any block
  // can have finished (the last block to finish stores the new one), so all agree on seq.
  const bool fused = channel_index == 0 && publish.mailbox != nullptr;
  const uint32_t seq = channel_index == 0
                           ? *reinterpret_cast<const volatile uint32_t*>(&words->seq) + (fused ? 1u : 0u)
                           : *reinterpret_cast<const volatile uint32_t*>(&words->channel[0].released_seq);
  const uint8_t* job = jobs + size_t(seq % uint32_t(ring)) * job_bytes;
  const auto* header = reinterpret_cast<const volatile TierJobHeader*>(job);
  if (fused && blockIdx.x == 0) publish_block(publish, seq, words, abort_flag, times);
  bool released_self = false;
  if (blockIdx.x == 0 && self.ids != nullptr) {
    // Only block 0 touches the row before the release; the other blocks write it after.
    volatile uint32_t* flag = self.pending_flag;
    if (*flag != 0) {
      for (int e = int(threadIdx.x); e < n_expert; e += int(blockDim.x)) smap_row[e] = self.pending_row[e];
      __threadfence();  // before the other blocks' writes of the job's row, if the host's job comes
      __syncthreads();
      if (threadIdx.x == 0) *flag = 0;
    }
    bool resident = true;
    for (int i = int(threadIdx.x); i < self.n_pairs; i += int(blockDim.x))
      resident = resident && smap_row[self.ids[i]] < self.resident_below;
    released_self = __syncthreads_and(resident) != 0;
  }
  if (threadIdx.x == 0) {
    aborted = false;
    copy_row = channel_index == 0;
    const uint64_t spin_start = global_ns();
    const volatile uint32_t* abort = abort_flag;
    if (blockIdx.x == 0) {
      if (released_self) {
        copy_row = false;
        channel->released_copies = 0;
        channel->released_row = 0;
        channel->released_pending_layer = UINT32_MAX;
        words->unconsumed_seq = seq;  // the host has not been heard from (publish_kernel)
        ++words->self_released;
      } else {
        for (uint32_t spins = 1; header->ready != seq; ++spins) {
          if ((spins & 255) == 0 && *abort != 0) {
            aborted = true;
            break;
          }
        }
        channel->released_copies = aborted ? 0u : header->n_copies;
        channel->released_row = aborted || channel_index != 0 ? 0u : 1u;
        // Block 0 alone reads the header's pending row fields across PCIe (as n_copies): one
        // mapped read per block before its copies cost the read-ahead branch 1.3 ms a token
        // (docs/bench-cuda.md, session 38).
        channel->released_pending_layer =
            !aborted && channel_index == 1 && pending_rows != nullptr && header->has_row != 0 ? header->layer
                                                                                              : UINT32_MAX;
        copy_row = !aborted && channel_index == 0;
      }
      __threadfence();
      *reinterpret_cast<volatile uint32_t*>(&channel->released_seq) = seq;
      const uint64_t released = global_ns();
      channel->spin_started_ns = spin_start;
      channel->released_ns = released;
      if (channel_index == 0) {
        TierTimes* t = times + seq % uint32_t(kTimelineRing);
        t->spin_ns = spin_start;
        t->released_ns = released_self ? 0 : released;  // not a round trip: left out of the latency stats
      }
    } else {
      const volatile uint32_t* released = &channel->released_seq;
      for (uint32_t spins = 1; *released != seq; ++spins) {
        if ((spins & 1023) == 0 && *abort != 0) {
          aborted = true;
          break;
        }
      }
      __threadfence();
      if (!aborted) copy_row = *reinterpret_cast<const volatile uint32_t*>(&channel->released_row) != 0;
    }
    n_copies = aborted ? 0 : int(*reinterpret_cast<const volatile uint32_t*>(&channel->released_copies));
    pending_layer =
        aborted ? UINT32_MAX : *reinterpret_cast<const volatile uint32_t*>(&channel->released_pending_layer);
  }
  __syncthreads();
  if (aborted) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Released with nothing to copy or write (a wait that released itself): the expert kernels may
  // be launched now, their blocks waiting at griddepcontrol.wait for this grid's completion, so
  // their launch overlaps this grid's last blocks. A wait with copies does not: the experts' blocks
  // would hold SMs while it copies.
  if (channel_index == 0 && self.launch_dependents_when_free && n_copies == 0 && !copy_row)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // Both kinds of job: the header, a row of n_expert words (the layer's slot-map row; in a
  // read-ahead job the guessed layer's row after the guess, when has_row), then the chunks.
  const size_t smap_bytes = (size_t(n_expert) * 4 + 15) / 16 * 16;
  const uint32_t* row = reinterpret_cast<const uint32_t*>(job + sizeof(TierJobHeader));
  if (copy_row)
    for (int e = int(blockIdx.x * blockDim.x + threadIdx.x); e < n_expert; e += int(gridDim.x * blockDim.x))
      smap_row[e] = row[e];
  const TierCopy* copies = reinterpret_cast<const TierCopy*>(job + sizeof(TierJobHeader) + smap_bytes);
  __shared__ TierCopy copy;
  for (int c = int(blockIdx.x); c < n_copies; c += int(gridDim.x)) {
    __syncthreads();
    if (threadIdx.x == 0) copy = copies[c];
    __syncthreads();
    const uint8_t* src = copy.src;
    uint8_t* dst = copy.dst;
    const uint32_t n = copy.bytes;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 15) == 0) {
      // Four 16-byte loads in flight per thread: the source is host memory across PCIe.
      const uint4* sv = reinterpret_cast<const uint4*>(src);
      uint4* dv = reinterpret_cast<uint4*>(dst);
      const uint32_t n16 = n / 16, step = blockDim.x;
      for (uint32_t i = threadIdx.x; i < n16; i += 4 * step) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * step < n16) v[u] = sv[i + u * step];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * step < n16) dv[i + u * step] = v[u];
      }
    } else {
      for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
  }
  // A read-ahead job's row becomes the guessed layer's pending row.
  if (pending_layer != UINT32_MAX) {
    uint32_t* pending = pending_rows + size_t(pending_layer) * size_t(n_expert);
    for (int e = int(blockIdx.x * blockDim.x + threadIdx.x); e < n_expert; e += int(gridDim.x * blockDim.x))
      pending[e] = row[e];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&channel->done_blocks, 1u) == gridDim.x - 1) {
    const volatile TierChannel* v = channel;
    if (pending_layer != UINT32_MAX) {
      __threadfence();
      *reinterpret_cast<volatile uint32_t*>(pending_flags + pending_layer) = 1;
    }
    // The host answered this handshake's read-ahead job after it had read the mailbox.
    if (channel_index == 1 && int32_t(seq - words->consumed_seq) > 0) words->consumed_seq = seq;
    if (fused) words->seq = seq;
    const uint64_t released = v->released_ns;
    channel->wait_ns += released - v->spin_started_ns;
    const uint64_t copied = global_ns();
    channel->copy_ns += copied - released;
    if (channel_index == 0) times[seq % uint32_t(kTimelineRing)].copied_ns = copied;
    channel->done_blocks = 0;
  }
}

}  // namespace

void tier_publish(const TierPublish& publish, const uint32_t* abort_flag, TierDeviceWords* words, TierTimes* times,
                  cudaStream_t stream) {
  launch(publish_kernel, dim3(1), dim3(256), 0, stream, publish, abort_flag, words, times);
}

void tier_wait(TierDeviceWords* words, const void* jobs_dev, size_t job_bytes, int ring, int n_expert,
               uint32_t* smap_row, const uint32_t* abort_flag, TierTimes* times, const TierSelfRelease& self,
               const TierPublish* publish, int blocks, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kLoadThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  STRATA_CUDA_CHECK(cudaLaunchKernelEx(&config, release_and_copy_kernel, words, 0,
                                       static_cast<const uint8_t*>(jobs_dev), job_bytes, ring, n_expert, smap_row,
                                       abort_flag, times, self, static_cast<uint32_t*>(nullptr),
                                       static_cast<uint32_t*>(nullptr), publish ? *publish : TierPublish{}));
}

void tier_read_ahead(TierDeviceWords* words, const void* jobs_dev, size_t job_bytes, int ring, int n_expert,
                     const uint32_t* abort_flag, uint32_t* pending_rows, uint32_t* pending_flags, int blocks,
                     cudaStream_t stream) {
  // The branch's first node: no programmatic dependency to wait for.
  release_and_copy_kernel<<<unsigned(blocks), kLoadThreads, 0, stream>>>(
      words, 1, static_cast<const uint8_t*>(jobs_dev), job_bytes, ring, n_expert, nullptr, abort_flag, nullptr,
      TierSelfRelease{}, pending_rows, pending_flags, TierPublish{});
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::compute::cuda
