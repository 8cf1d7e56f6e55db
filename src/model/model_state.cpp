// copy_sequence_state / sequence_state_bytes (model/model.h): the one place that lists which
// ModelState fields are a sequence's data. A field added to ModelState (or to KvCache,
// GatedDeltaNetState, PleState, MtpState) must be added here, or the conversation state cache
// would resume from a partial state (tests/decode/state_cache_test.cpp would catch the token
// drift).
#include <algorithm>

#include "model/model.h"

namespace strata {
namespace {

template <typename T>
uint64_t vector_bytes(const std::vector<T>& v) {
  return uint64_t(v.capacity()) * sizeof(T);
}

void copy_kv(const KvCache& from, KvCache& to) {
  to.n_tokens = from.n_tokens;
  to.k = from.k;
  to.v = from.v;
  to.index_k_raw = from.index_k_raw;
  to.block_keys = from.block_keys;
}

uint64_t kv_bytes(const KvCache& kv) {
  return vector_bytes(kv.k) + vector_bytes(kv.v) + vector_bytes(kv.index_k_raw) +
         vector_bytes(kv.block_keys);
}

}  // namespace

void copy_sequence_state(const ModelState& from, ModelState& to) {
  to.n_past = from.n_past;
  to.deltanet.resize(from.deltanet.size());
  for (size_t l = 0; l < from.deltanet.size(); ++l) {
    to.deltanet[l].conv = from.deltanet[l].conv;
    to.deltanet[l].ssm = from.deltanet[l].ssm;
    to.deltanet[l].window_log.valid = false;
  }
  to.kv.resize(from.kv.size());
  for (size_t l = 0; l < from.kv.size(); ++l) copy_kv(from.kv[l], to.kv[l]);
  to.ple.context = from.ple.context;
  to.ple.conv_history = from.ple.conv_history;
  to.ple.window_log.valid = false;
  to.residuals = from.residuals;
  copy_kv(from.mtp.kv, to.mtp.kv);
  to.record_windows = false;
  to.window_log.valid = false;
  to.window_log.tokens.clear();
}

uint64_t sequence_state_bytes(const ModelState& state) {
  uint64_t bytes = sizeof(ModelState);
  for (const GatedDeltaNetState& d : state.deltanet)
    bytes += vector_bytes(d.conv) + vector_bytes(d.ssm);
  for (const KvCache& kv : state.kv) bytes += kv_bytes(kv);
  bytes += vector_bytes(state.ple.conv_history) + vector_bytes(state.residuals) +
           kv_bytes(state.mtp.kv);
  return bytes;
}

}  // namespace strata
