// qwen4exp (Qwen3.8-Flash-Next): S hyper-connection streams; layers 3:1 Gated DeltaNet (sigmoid
// gate, tiled V heads in GGUF order) : QSA sparse attention; every layer a MoE with a shared
// expert; an n-gram PLE embedding added before one GDN layer's mixer; a final HC mixer (no norm)
// and an untied head. Reference: shared/reference/qwen4exp.md §4–§12.
#include <fmt/format.h>

#include "model/model.h"
#include "model/spec_builder.h"
#include "util/error.h"

namespace strata {
namespace {

std::string blk(int layer, const char* name) { return fmt::format("blk.{}.{}", layer, name); }

class Qwen4Exp final : public Model {
 public:
  Qwen4Exp(std::unique_ptr<GgufFile> file, HParams hp) : Model(std::move(file), std::move(hp)) {
    const TensorLoader loader(*file_);
    output_hc_ = load_hc(loader, "output_hc", /*with_inject=*/false);
    for (int l = 0; l < hp_.n_layer; ++l) {
      LayerWeights& lw = layers_[size_t(l)];
      lw.kind = hp_.layer_kinds[size_t(l)];
      lw.hc_attn = load_hc(loader, blk(l, "hc_attn"), true);
      lw.hc_ffn = load_hc(loader, blk(l, "hc_ffn"), true);
      if (lw.kind == LayerKind::GatedDeltaNet) {
        load_deltanet(loader, l, lw);
      } else {
        load_attention(loader, l, /*gated=*/true, lw);
        load_indexer(loader, l, lw.attention);
      }
      load_moe(loader, l, lw);
    }
    if (hp_.has_ple()) load_ple(loader);
  }

 protected:
  void run_layers(compute::ThreadPool& pool, ModelState& state, std::span<const int32_t> tokens,
                  ExpertSource& experts, std::vector<float>& hidden) const override {
    const int S = hp_.hc_count;
    const int64_t H = hp_.n_embd, width = S * H, n_rows = int64_t(tokens.size());

    // PLE rows depend only on the tokens: issue their reads before any layer runs.
    PleRowReader ple_reader;
    if (hp_.has_ple()) ple_reader.start(hp_, ple_, ple_row_ids(hp_, state.ple.context, tokens));

    std::vector<float> X(static_cast<size_t>(n_rows * width)), x(static_cast<size_t>(n_rows * H)), y(static_cast<size_t>(n_rows * H));
    std::vector<float> inject(static_cast<size_t>(n_rows * S));
    embed(tokens, x.data());
    for (int64_t t = 0; t < n_rows; ++t)
      for (int s = 0; s < S; ++s) std::copy_n(x.data() + t * H, H, X.data() + t * width + s * H);

    for (int l = 0; l < hp_.n_layer; ++l) {
      const LayerWeights& lw = layers_[size_t(l)];
      if (l == hp_.ple_layer()) {
        const std::vector<float> embeddings = ple_reader.collect();
        ple_forward(pool, hp_, ple_, state.ple, embeddings.data(), n_rows, X.data());
        state.ple.context = ple_advance(hp_, state.ple.context, tokens);
      }
      hyper_connection_in(pool, lw.hc_attn, S, H, hp_.rms_eps, X.data(), n_rows, x.data(),
                          inject.data());
      mixer_forward(pool, state, l, x.data(), n_rows, y.data());
      hyper_connection_out(S, H, y.data(), inject.data(), n_rows, X.data());

      hyper_connection_in(pool, lw.hc_ffn, S, H, hp_.rms_eps, X.data(), n_rows, x.data(),
                          inject.data());
      moe_forward(pool, hp_, lw.moe, experts, l, x.data(), n_rows, y.data());
      hyper_connection_out(S, H, y.data(), inject.data(), n_rows, X.data());
    }
    state.last_residual.assign(X.end() - width, X.end());
    hidden.resize(static_cast<size_t>(n_rows * H));
    hyper_connection_in(pool, output_hc_, S, H, hp_.rms_eps, X.data(), n_rows, hidden.data(),
                        nullptr);
  }

 private:
  HyperConnectionWeights load_hc(const TensorLoader& loader, const std::string& prefix,
                                 bool with_inject) const {
    const int64_t width = hp_.hc_count * hp_.n_embd;
    HyperConnectionWeights hc;
    hc.norm = loader.floats(prefix + "_norm", width);
    hc.down = loader.matrix(prefix + "_down", width, hp_.hc_low_rank);
    hc.up = loader.matrix(prefix + "_up", hp_.hc_low_rank, width);
    if (with_inject) hc.inject = loader.matrix(prefix + "_inject", width, hp_.hc_count);
    return hc;
  }

  void load_indexer(const TensorLoader& loader, int l, AttentionWeights& a) const {
    const int di = hp_.indexer_head_dim;
    a.index_q = loader.matrix(blk(l, "indexer.q_proj"), hp_.n_embd, int64_t(hp_.indexer_n_head) * di);
    a.index_k = loader.matrix(blk(l, "indexer.k_proj"), hp_.n_embd, di);
    a.index_q_norm = loader.floats(blk(l, "indexer.q_norm"), di);
    a.index_k_norm = loader.floats(blk(l, "indexer.k_norm"), di);
    a.compress_ratio = hp_.compress_ratios[size_t(l)];
  }

  void load_ple(const TensorLoader& loader) {
    const int l = hp_.ple_layer();
    const int64_t width = hp_.hc_count * hp_.n_embd;
    const int64_t ple_dim = hp_.ple_row_width * hp_.ple_n_heads();
    const TensorInfo* table = loader.find("per_layer_token_embd");
    if (!table) fail("{}: missing tensor per_layer_token_embd", file_->path());
    if (table->ne[0] != hp_.ple_row_width || table->n_dims != 2)
      fail("{}: tensor per_layer_token_embd: expected shape [{}, rows], found ne0 = {}",
           file_->path(), hp_.ple_row_width, table->ne[0]);
    const uint64_t last = hp_.ple_head_offsets.back() + hp_.ple_head_vocab_sizes.back();
    if (uint64_t(table->ne[1]) < last)
      fail("{}: tensor per_layer_token_embd: expected at least {} rows (ple.head_offsets + sizes), "
           "found {}",
           file_->path(), last, table->ne[1]);
    ple_.file = file_.get();
    ple_.table = *table;
    ple_.key = loader.matrix(blk(l, "ple_key"), ple_dim, width);
    ple_.value = loader.matrix(blk(l, "ple_value"), ple_dim, hp_.n_embd);
    ple_.norm_key = loader.floats(blk(l, "ple_norm_key"), width);
    ple_.norm_query = loader.floats(blk(l, "ple_norm_query"), width);
    ple_.norm_conv = loader.floats(blk(l, "ple_norm_conv"), width);
    ple_.conv = loader.floats(blk(l, "ple_conv1d"), width * hp_.ple_conv_kernel);
  }

  HyperConnectionWeights output_hc_;
  PleWeights ple_;
};

}  // namespace

namespace {

void add_hc_specs(SpecBuilder& b, const HParams& hp, const std::string& prefix, int layer,
                  bool with_inject) {
  const int64_t width = hp.hc_count * hp.n_embd, rank = hp.hc_low_rank;
  auto add = [&](const std::string& suffix, std::vector<int64_t> ne, TensorRole role) {
    if (layer < 0)
      b.global(prefix + suffix, std::move(ne), role);
    else
      b.layer(layer, prefix + suffix, std::move(ne), role);
  };
  add("_norm", {width}, TensorRole::Norm);
  add("_down", {width, rank}, TensorRole::Matrix);
  add("_up", {rank, width}, TensorRole::Matrix);
  if (with_inject) add("_inject", {width, hp.hc_count}, TensorRole::Matrix);
}

}  // namespace

std::vector<TensorSpec> qwen4exp_tensor_specs(const HParams& hp) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(specs);
  const int64_t H = hp.n_embd, width = hp.hc_count * hp.n_embd;
  b.global("token_embd", {H, hp.n_vocab}, TensorRole::Embedding);
  b.global("output", {H, hp.n_vocab}, TensorRole::Output);
  add_hc_specs(b, hp, "output_hc", -1, false);
  if (hp.has_ple()) {
    const uint64_t rows = hp.ple_head_offsets.back() + hp.ple_head_vocab_sizes.back();
    b.global("per_layer_token_embd", {hp.ple_row_width, int64_t(rows)}, TensorRole::PleTable);
  }
  const int64_t ple_dim = hp.ple_row_width * hp.ple_n_heads();
  for (int l = 0; l < hp.n_layer; ++l) {
    add_hc_specs(b, hp, "hc_attn", l, true);
    add_hc_specs(b, hp, "hc_ffn", l, true);
    if (hp.layer_kinds[size_t(l)] == LayerKind::GatedDeltaNet) {
      add_deltanet_specs(b, hp, l, /*fused_beta_alpha=*/false);
    } else {
      add_attention_specs(b, hp, l, /*gated=*/true);
      const int64_t di = hp.indexer_head_dim;
      b.layer(l, "indexer.q_proj", {H, hp.indexer_n_head * di}, TensorRole::Matrix);
      b.layer(l, "indexer.k_proj", {H, di}, TensorRole::Matrix);
      b.layer(l, "indexer.q_norm", {di}, TensorRole::Norm);
      b.layer(l, "indexer.k_norm", {di}, TensorRole::Norm);
    }
    add_moe_specs(b, hp, l);
    if (l == hp.ple_layer()) {
      b.layer(l, "ple_key", {ple_dim, width}, TensorRole::Matrix);
      b.layer(l, "ple_value", {ple_dim, H}, TensorRole::Matrix);
      b.layer(l, "ple_norm_key", {width}, TensorRole::Norm);
      b.layer(l, "ple_norm_query", {width}, TensorRole::Norm);
      b.layer(l, "ple_norm_conv", {width}, TensorRole::Norm);
      b.layer(l, "ple_conv1d", {hp.ple_conv_kernel, width}, TensorRole::Vector);
    }
  }
  return specs;
}

std::unique_ptr<Model> make_qwen4exp(std::unique_ptr<GgufFile> file, HParams hp) {
  return std::make_unique<Qwen4Exp>(std::move(file), std::move(hp));
}

}  // namespace strata
