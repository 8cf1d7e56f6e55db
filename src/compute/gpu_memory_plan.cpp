// The GPU memory plan's arithmetic. Contract in gpu_memory_plan.h.
#include "compute/gpu_memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"
#include "util/progress.h"

namespace strata::compute {
namespace {

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// The budget as the user gave it, or what the options say when no flag was recorded.
std::string describe_budget(const GpuTierOptions& t) {
  if (!t.budget_flag.empty()) return t.budget_flag;
  if (t.slots_per_layer > 0) return fmt::format("{} GPU expert slots per layer", t.slots_per_layer);
  if (t.budget_bytes > 0)
    return fmt::format("a GPU expert budget of {}", format_bytes(t.budget_bytes));
  return "no --gpu-budget (every routed expert in GPU memory)";
}

// "37.5" for the share of `part` in `whole`, rounded down to 0.1 (so that parse_byte_size's
// floor(whole · share / 100) stays at or below `part`).
std::string percent_floor(uint64_t part, uint64_t whole) {
  const uint64_t tenths =
      whole > 0 ? uint64_t((long double)part * 1000.0L / (long double)whole) : 0;
  return tenths % 10 == 0 ? fmt::format("{}", tenths / 10)
                          : fmt::format("{}.{}", tenths / 10, tenths % 10);
}

bool is_percent_flag(const GpuTierOptions& t) {
  return !t.budget_flag.empty() && t.budget_flag.back() == '%';
}

}  // namespace

void GpuArenaPlan::set_slots(int n) {
  slots = n;
  size_t offset = 0;
  for (GpuArenaLayer& l : layers) {
    if (!l.present) continue;
    l.first_offset = offset;
    offset += size_t(n) * l.slot_bytes;
  }
  transient_offset = offset;
  arena_bytes = offset + transient_bytes();
}

GpuArenaPlan layout_gpu_arena(const std::vector<ExpertLayerLayout>& layers, int n_expert, int k,
                              int64_t max_rows) {
  if (n_expert < 1 || k < 1 || max_rows < 1)
    fail("gpu expert tier: {} experts, top-{}, {} rows per window", n_expert, k, max_rows);
  GpuArenaPlan plan;
  plan.max_rows = max_rows;
  plan.layers.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const ExpertLayerLayout& src = layers[l];
    if (!src.present) continue;
    GpuArenaLayer& t = plan.layers[l];
    t.present = true;
    t.up_offset = align_up(src.gate.bytes(), 16);
    t.down_offset = t.up_offset + align_up(src.up.bytes(), 16);
    t.slot_bytes = align_up(t.down_offset + src.down.bytes(), kGpuArenaUnit);
    plan.slot_sum += t.slot_bytes;
    plan.transient_slot_bytes = std::max(plan.transient_slot_bytes, t.slot_bytes);
  }
  if (plan.slot_sum == 0) fail("gpu expert tier: the model has no routed experts");
  plan.transient_slots = int(std::min<int64_t>(n_expert, int64_t(k) * max_rows));
  return plan;
}

int gpu_tier_slots(const GpuTierOptions& options, const GpuArenaPlan& plan, int n_expert) {
  if (options.slots_per_layer > 0) return std::min(options.slots_per_layer, n_expert);
  if (options.budget_bytes < plan.smallest_bytes())
    fail(
        "--gpu-budget {:.1f} MiB is below the smallest GPU expert arena: 1 slot per layer "
        "({:.1f} MiB) + {} transient slots for a {}-row window ({:.1f} MiB) = {:.1f} MiB",
        double(options.budget_bytes) / (1 << 20), double(plan.slot_sum) / (1 << 20),
        plan.transient_slots, plan.max_rows, double(plan.transient_bytes()) / (1 << 20),
        double(plan.smallest_bytes()) / (1 << 20));
  return int(std::min<uint64_t>(uint64_t(n_expert),
                                (options.budget_bytes - plan.transient_bytes()) / plan.slot_sum));
}

GpuArenaPlan plan_gpu_arena(const GpuTierOptions& options, int n_expert, int k, int64_t max_rows) {
  GpuArenaPlan plan = layout_gpu_arena(options.layers, n_expert, k, max_rows);
  plan.set_slots(gpu_tier_slots(options, plan, n_expert));
  return plan;
}

bool uses_gpu_tier(const GpuTierOptions& options, int n_expert) {
  if (!options.tiered()) return false;
  if (options.slots_per_layer > 0) return options.slots_per_layer < n_expert;
  return options.budget_bytes < options.all_expert_bytes(n_expert);
}

uint64_t all_resident_arena_bytes(const GpuArenaPlan& layout, int n_expert) {
  uint64_t bytes = 0;
  for (const GpuArenaLayer& l : layout.layers)
    if (l.present) bytes += (uint64_t(l.slot_bytes) + 4) * uint64_t(n_expert);  // + its slot map
  return bytes;
}

GpuFit check_gpu_fit(const std::string& device, uint64_t free_bytes,
                     const GpuModelFootprint& footprint, const GpuTierOptions& tier) {
  GpuFit fit;
  fit.free_bytes = free_bytes;
  fit.dense_bytes = footprint.dense_weight_bytes;
  fit.working_bytes = footprint.working_bytes();
  const uint64_t base = fit.dense_bytes + fit.working_bytes;
  const int n_expert = footprint.n_expert;
  const bool has_experts =
      n_expert > 0 && footprint.n_expert_used > 0 &&
      std::any_of(footprint.expert_layers.begin(), footprint.expert_layers.end(),
                  [](const ExpertLayerLayout& l) { return l.present; });
  GpuTierOptions options = tier;
  options.layers = footprint.expert_layers;
  std::string arena_text = "no routed experts";
  GpuArenaPlan layout;
  uint64_t all_resident = 0, tier_maps = 0;
  if (has_experts) {
    layout =
        layout_gpu_arena(options.layers, n_expert, footprint.n_expert_used, kGpuTierMinWindowRows);
    all_resident = all_resident_arena_bytes(layout, n_expert);
    // The tier's slot map and its pending rows, a row per layer each.
    tier_maps = 2 * uint64_t(options.layers.size()) * uint64_t(n_expert) * 4;
    fit.tiered = uses_gpu_tier(options, n_expert);
    if (fit.tiered) {
      // A budget below the smallest arena is its own error (gpu_tier_slots throws it), unless the
      // dense part does not fit either: that is said first, with the smallest arena.
      const bool below_smallest =
          options.slots_per_layer == 0 && options.budget_bytes < layout.smallest_bytes();
      layout.set_slots(
          below_smallest && base > free_bytes ? 1 : gpu_tier_slots(options, layout, n_expert));
      fit.arena_bytes = layout.arena_bytes + tier_maps;
      arena_text = fmt::format("{} slots per layer + {} transient slots", layout.slots,
                               layout.transient_slots);
    } else {
      fit.arena_bytes = all_resident;
      arena_text = fmt::format("a slot for each of the {} experts of every MoE layer", n_expert);
    }
  }
  fit.need_bytes = base + fit.arena_bytes;
  fit.fits = fit.need_bytes <= free_bytes;
  // The largest budget that fits: what is left beside the dense part; any budget up to it gives an
  // arena no larger than itself (cache slots + transient slots <= budget).
  const uint64_t left = free_bytes > base ? free_bytes - base : 0;
  if (has_experts) {
    fit.everything_fits = left >= all_resident;
    if (fit.everything_fits) {
      fit.largest_budget_bytes = options.all_expert_bytes(n_expert);
      fit.largest_slots = n_expert;
    } else if (left > tier_maps) {
      // Below every expert's bytes, so that the budget stays a tier (a budget of them all is the
      // all-resident arena, which does not fit).
      const uint64_t largest = std::min(left - tier_maps, options.all_expert_bytes(n_expert) - 1);
      if (largest >= layout.smallest_bytes()) {
        fit.largest_budget_bytes = largest;
        fit.largest_slots = int(std::min<uint64_t>(
            uint64_t(n_expert - 1), (largest - layout.transient_bytes()) / layout.slot_sum));
      }
    }
  }
  if (fit.fits) return fit;

  std::string& m = fit.message;
  m = fmt::format(
      "{} does not fit on the GPU, {}: {} free, {} needed = the dense weights {} + one "
      "sequence's working memory {} (per-op scratch {}, the tensors of a {}-row window {}, layer "
      "states for {} tokens {}) + the routed-expert arena {} ({}).",
      describe_budget(tier), device, format_bytes(free_bytes), format_bytes(fit.need_bytes),
      format_bytes(fit.dense_bytes), format_bytes(fit.working_bytes),
      format_bytes(footprint.scratch_bytes()), kGpuFirstWindowRows,
      format_bytes(footprint.window_bytes), kGpuFirstKvTokens, format_bytes(footprint.state_bytes),
      format_bytes(fit.arena_bytes), arena_text);
  if (base > free_bytes) {
    m += fmt::format(
        " The dense weights and the working memory alone are {} more than is free: no "
        "--gpu-budget makes room for them. Run on the CPU (--backend cpu), or free GPU memory.",
        format_bytes(base - free_bytes));
  } else if (!has_experts) {
    m += " Run on the CPU (--backend cpu), or free GPU memory.";
  } else if (fit.everything_fits) {
    m += fmt::format(
        " Every routed expert fits in GPU memory ({} beside the dense part): drop the budget.",
        format_bytes(all_resident));
  } else if (fit.largest_budget_bytes == 0) {
    m += fmt::format(
        " Even the smallest arena ({}: 1 slot per layer + {} transient slots) does not fit in "
        "the {} left beside the dense part: no --gpu-budget fits. Run on the CPU (--backend "
        "cpu), or free GPU memory.",
        format_bytes(layout.smallest_bytes() + tier_maps), layout.transient_slots,
        format_bytes(left));
  } else {
    const uint64_t all = options.all_expert_bytes(n_expert);
    const uint64_t b = fit.largest_budget_bytes;
    const std::string bytes_flag = b >= (uint64_t(1) << 20)
                                       ? fmt::format("--gpu-budget {}M", b >> 20)
                                       : fmt::format("--gpu-budget {}K", b >> 10);
    const std::string percent_flag = fmt::format("--gpu-budget {}%", percent_floor(b, all));
    std::string largest;
    if (tier.slots_per_layer > 0)
      largest = fmt::format("--gpu-slots-per-layer {} (or {})", fit.largest_slots, bytes_flag);
    else if (is_percent_flag(tier))
      largest = fmt::format("{} (or {})", percent_flag, bytes_flag);
    else
      largest = fmt::format("{} ({} of the routed experts' {})", bytes_flag,
                            percent_flag.substr(percent_flag.find(' ') + 1), format_bytes(all));
    m += fmt::format(" The largest budget that fits: {}, {} cache slots per layer.", largest,
                     fit.largest_slots);
  }
  return fit;
}

}  // namespace strata::compute
