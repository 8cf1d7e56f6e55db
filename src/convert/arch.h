// The per-architecture HF → GGUF mappings. Each writes its metadata into ctx.writer and appends the
// tensors to ctx.tensors(), naming and transforming them exactly as llama.cpp's converter does (see
// docs/convert.md for the tables and what could not be confirmed). Internal to src/convert.
#pragma once

#include "convert/plan.h"

namespace strata::convert {

struct ArchOptions {
  bool include_mtp = true;  // qwen4exp, qwen3next: export the MTP head as the trailing block (blk.<L>.*)
};

void plan_qwen3moe(ConversionContext& ctx);
void plan_qwen3next(ConversionContext& ctx, const ArchOptions& options);
void plan_qwen4exp(ConversionContext& ctx, const ArchOptions& options);

// lm_head.weight → output.weight; with tie_word_embeddings and no lm_head, no output tensor (the
// loader falls back to token_embd, as llama.cpp's does).
void add_output_head(ConversionContext& ctx, int64_t vocab, int64_t hidden);

// Gated DeltaNet metadata shared by qwen3next and qwen4exp (ssm.*, full_attention_interval,
// rope.dimension_count). The interval comes from the trunk pattern `is_linear`; the explicit
// per-block list (written only when there is no interval) also covers the `mtp_blocks` trailing
// MTP blocks, which attend.
void add_gdn_metadata(ConversionContext& ctx, const std::vector<bool>& is_linear, int64_t mtp_blocks);

}  // namespace strata::convert
