// Work estimates for ThreadPool's inline rule (thread_pool.h): how many nanoseconds one thread
// needs for a piece of work, from rates this process measured on this machine.
//
// Contract
// - dot_work_ns(type, n_dots, n_in): n_dots dot products of n_in weights of `type` against
//   converted activation rows, at the rate `type`'s dot kernel (quant::dot_kernel) ran over 32
//   cache-resident rows of 1024 weights: matmul's decode path (a window of several rows runs the
//   tile kernels, faster per row, so a window is over-estimated: it splits, as it should).
// - f32_loop_work_ns(multiply_adds): the layers' plain f32 loops (attention's scores and value
//   sums, the DeltaNet conv), at the rate of eight independent multiply-add chains over eight
//   rows, compiled like the layers (score_tokens's shape).
// - The rates are measured on the first call of either (every type with kernels, ~1.5 ms in all
//   on the 2-vCPU build VM) and kept for the process, as quant's kernel table is. They only decide
//   where work runs, never a result bit. Each rate is the best of 3 passes, so a loaded machine
//   still measures about its unloaded speed.
// - Thread safety: any thread.
#pragma once

#include <cstdint>

#include "quant/ggml_type.h"

namespace strata::compute {

double dot_work_ns(GgmlType type, int64_t n_dots, int64_t n_in);
double f32_loop_work_ns(int64_t multiply_adds);

}  // namespace strata::compute
