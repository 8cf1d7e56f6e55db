#include "backends/backend_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu_backend.h"
#include "util/error.h"

namespace strata::compute {
namespace {

std::vector<BackendEntry>& entries() {
  static std::vector<BackendEntry> list = [] {
    std::vector<BackendEntry> initial;
    initial.push_back(BackendEntry{"cpu", [] { return true; }, [] { return std::string("host CPU"); },
                                   [](BackendShared&) { return std::make_unique<CpuBackend>(); }});
    return initial;
  }();
  return list;
}

const BackendEntry* find(std::string_view name) {
  for (const BackendEntry& e : entries())
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace

void register_backend(BackendEntry entry) {
  for (BackendEntry& e : entries())
    if (e.name == entry.name) {
      e = std::move(entry);
      return;
    }
  entries().push_back(std::move(entry));
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendEntry& e : entries()) names.push_back(e.name);
  return names;
}

std::string resolve_backend(std::string_view requested) {
  if (requested == "auto") {
    for (const BackendEntry& e : entries())
      if (e.name != "cpu" && e.usable()) return e.name;
    return "cpu";
  }
  const BackendEntry* e = find(requested);
  if (!e)
    fail("--backend {}: this build has no such backend (it has: {}, auto){}", requested,
         fmt::join(backend_names(), ", "),
         requested == "cuda" ? "; build with -DSTRATA_CUDA=ON where the CUDA toolkit is installed"
                             : "");
  if (!e->usable()) fail("--backend {}: not usable here: {}", requested, e->describe());
  return e->name;
}

std::unique_ptr<Backend> make_backend(std::string_view name, BackendShared& shared) {
  const BackendEntry* e = find(name);
  if (!e) fail("no backend named '{}' (this build has: {})", name, fmt::join(backend_names(), ", "));
  return e->make(shared);
}

}  // namespace strata::compute
