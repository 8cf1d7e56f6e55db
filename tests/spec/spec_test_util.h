// Helpers shared by the speculative-decoding tests: the committed fixtures, synthetic models, and
// plain vs speculative generation.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/fixture_models.h"
#include "compute/cpu/thread_pool.h"
#include "decode/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "spec/spec_decoder.h"

namespace strata::spec_test {

inline std::string fixture_path(const std::string& arch) {
  return test_support::fixture_model_gguf(arch);
}

// The plain loop of `strata run`: sample, emit, decode.
inline std::vector<int32_t> plain_generate(const Model& model, compute::ThreadPool& pool,
                                           const std::vector<int32_t>& prompt, int n,
                                           const SamplerConfig& sampling, int chunk_rows = 16) {
  Session session(model, pool);
  Sampler sampler(sampling);
  session.prefill(prompt, chunk_rows);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = sampler.sample(session.logits(), session.tokens());
    out.push_back(next);
    if (i + 1 < n) session.decode(next);
  }
  return out;
}

inline std::vector<int32_t> spec_generate(const Model& model, compute::ThreadPool& pool,
                                          const std::vector<int32_t>& prompt, int n,
                                          const SamplerConfig& sampling,
                                          const spec::SpecOptions& options,
                                          std::unique_ptr<spec::Drafter> extra = nullptr,
                                          std::string* summary = nullptr, int chunk_rows = 16) {
  Session session(model, pool);
  Sampler sampler(sampling);
  spec::SpecDecoder decoder(session, sampler, options, pool);
  if (extra) decoder.add_drafter(std::move(extra));
  decoder.prefill(prompt, chunk_rows);
  std::vector<int32_t> out;
  generate(
      session, sampler, session.logits(), n, std::nullopt, [&](int32_t t) { out.push_back(t); },
      &decoder);
  if (summary) *summary = decoder.summary();
  return out;
}

}  // namespace strata::spec_test
