// PLE n-gram embedding (qwen4exp, one Gated DeltaNet layer; shared/reference/qwen4exp.md §9).
//
// Row ids are a pure function of the tokens: for token t with contexts c0 = tok[t], c1, c2
// (previous tokens, replaced by eos at the sequence start or when an eos lies between them and t),
//   mix2 = (c0·m0) ^ (c1·m1);  mix3 = mix2 ^ (c2·m2)      (u64, wrapping)
//   row_h = mix2 mod Q_h + off_h (bigram heads), mix3 mod Q_h + off_h (trigram heads)
// The table (`per_layer_token_embd`, rows of ple_row_width) is far too large for RAM in the real
// model, so rows are read with pread on demand: `PleRowReader::start` issues a window's reads on a
// background thread as soon as its tokens are known; `collect` waits at the PLE layer.
// The layer:  K = G1p(W_key·E; nk);  V = W_value·E;  Qn = G1p(X; nq)
//   s_j = ⟨K_j, Qn_j⟩/√H;  Gv_j = σ(sign(s_j)·sqrt(max(|s_j|, 1e-6)))·V
//   N = G1p(Gv; nc);  C_t = silu(Σ_i w_i·N_{t-(K-1-i)·n});  X ← X + Gv + C
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "compute/backend.h"
#include "compute/cpu/matmul.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"
#include "gguf/gguf.h"
#include "layers/dims.h"

namespace strata {

struct PleWeights {
  const GgufFile* file = nullptr;
  TensorInfo table;                   // per_layer_token_embd {row_width, n_rows}
  compute::WeightMatrix key;          // [S·H x H_ple]
  compute::WeightMatrix value;        // [H x H_ple]
  std::vector<float> norm_key, norm_query, norm_conv;  // [S·H]
  std::vector<float> conv;            // [S·H][K] taps, oldest first
};

// N-gram context carried across windows: the last two token ids (eos at sequence start).
struct PleContext {
  int64_t prev[2] = {-1, -1};  // prev[1] is the most recent; -1 = none yet (treated as eos)
};

// Row ids [n_tokens][n_heads] for tokens following `context`; advances nothing.
std::vector<uint64_t> ple_row_ids(const PleDims& dims, const PleContext& context,
                                  std::span<const int32_t> tokens);
// The same into `rows` (resized; no allocation once it has the capacity).
void ple_row_ids(const PleDims& dims, const PleContext& context, std::span<const int32_t> tokens,
                 std::vector<uint64_t>& rows);
// Context after consuming tokens.
PleContext ple_advance(const PleDims& dims, PleContext context, std::span<const int32_t> tokens);

// Reads the table rows of one window at a time on its own background thread (started by the
// first `start`, joined by the destructor), into buffers it keeps, so a steady decode step
// allocates nothing. Owned by one sequence; start/collect from that sequence's window thread.
// A table of at most kMappedTableMaxBytes in a mapped file is instead copied from the mapping
// inside `start`, on the window thread (no reader thread, no system call): its pages stay cached
// once touched, and a row is a few dozen bytes, far less than the hand-over to a thread and a pread
// per row cost (16 sequences of a batched step each woke their own reader on 2 cores). The big
// tables this reader is for (the flagship's is larger than RAM) keep the preads, whose misses
// wait on the reader thread while the window computes, never as page faults on the window thread.
// The same bytes either way.
class PleRowReader {
 public:
  static constexpr uint64_t kMappedTableMaxBytes = uint64_t(64) << 20;
  // mapped_table_max_bytes: the bound above (0: always the reader thread; tests compare both).
  explicit PleRowReader(uint64_t mapped_table_max_bytes = kMappedTableMaxBytes)
      : mapped_table_max_bytes_(mapped_table_max_bytes) {}
  // Whether `start` copies w's rows from the mapping (above) rather than reading them.
  bool reads_from_mapping(const PleWeights& w) const;

  ~PleRowReader();
  PleRowReader(const PleRowReader&) = delete;
  PleRowReader& operator=(const PleRowReader&) = delete;

  // Issues the reads at once (after waiting for a previous window's reads that were never
  // collected). `w` must outlive the reads.
  void start(const PleDims& dims, const PleWeights& w, std::span<const uint64_t> row_ids);
  // Waits for the reads; the embeddings [n_tokens][n_heads·row_width], valid until the next
  // start. Rethrows a read error (naming the file and row).
  const std::vector<float>& collect();

 private:
  void run();
  // rows' embeddings into out_ (width_ each): from the mapping or with a pread each into raw_.
  // Throws naming the file, the tensor and a row outside the table or unreadable.
  void read_rows(const PleWeights& w, std::span<const uint64_t> rows);
  const uint64_t mapped_table_max_bytes_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;  // guards the flags below and hands jobs/results over
  bool has_job_ = false, done_ = true, stop_ = false;
  const PleWeights* weights_ = nullptr;
  int64_t width_ = 0;
  std::vector<uint64_t> rows_;
  std::vector<uint8_t> raw_;
  std::vector<float> out_;
  std::exception_ptr error_;
};

// What a recorded window keeps for `ple_rollback` (speculative verify). Both parts fold without
// per-row copies: the n-gram context after m rows is a function of the context before and the
// kept tokens, and the conv history is the last (K-1)·n rows of [history before | N of the kept
// rows], so the log holds the history from before the window and the window's N rows (moved).
struct PleWindowLog {
  bool valid = false;
  PleContext context_before;
  std::vector<float> history_before;
  std::vector<float> normed;  // [n_rows][S·H]: N of the window's rows
  int64_t n_rows = 0;
};

struct PleState {
  PleContext context;
  std::vector<float> conv_history;  // [(K-1)·n][S·H], oldest first; zeros at sequence start
  PleWindowLog window_log;          // the last recorded window (speculative verify only)
  // The next history is computed into next_history, then swapped in; a recorded window keeps its
  // N rows in spare_normed, swapped with the log's. The buffers never change role, so nothing
  // allocates once warm.
  std::vector<float> next_history, spare_normed;
  void reset(const PleDims& dims);
};

// X: [n_rows][S·H] updated in place; embeddings from PleRowReader::collect. record_window:
// keep state.window_log for ple_rollback (nothing else changes). Scratch comes from `ws` (the
// log's and the history's buffers are swapped with it, so nothing allocates once warm).
void ple_forward(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims,
                 const PleWeights& w, PleState& state, const float* embeddings, int64_t n_rows,
                 float* X, bool record_window = false);

// ple_forward over the rows of several sequences at once (a batched window: serve --parallel;
// never recorded): rows segments[s] of X belong to states[s], whose embeddings are embeddings[s]
// ([segments[s].n_rows][n_heads·row_width], its reader's collect()). The row-wise part (key and
// value projections of every row in one call, the gates, the norms) runs once; the conv per
// sequence over its own history. Each sequence's rows and state are bitwise what ple_forward
// gives it alone.
void ple_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims,
                      const PleWeights& w, std::span<PleState* const> states,
                      std::span<const float* const> embeddings, std::span<const compute::RowSegment> segments,
                      int64_t n_rows, float* X);

// Makes `state` what it would be had only the first kept_tokens.size() rows of the last recorded
// window been fed (kept_tokens: those rows' tokens). The context must have been advanced over the
// whole window by the caller after ple_forward, as the architecture does.
void ple_rollback(const PleDims& dims, PleState& state, std::span<const int32_t> kept_tokens);
// The n-gram context part of ple_rollback alone, for a backend that keeps the conv history in its
// own memory (it fills window_log.valid, context_before and n_rows when it records a window).
void ple_rollback_context(const PleDims& dims, PleState& state,
                          std::span<const int32_t> kept_tokens);

}  // namespace strata
