// Layering (issue 19 item 6): every folder of src/ uses only the layers below it, in the one order
// cmake/StrataLayers.cmake declares. Two checks on the table CMake writes from that declaration
// (STRATA_LAYER_TABLE: one line per layer, name|folder|layers below it|its library):
// - includes: every #include "..." of every file under src/ names a file of its own layer or of
//   a layer below it (the failure names the file, the line and the include);
// - symbols: every symbol a layer's library leaves undefined that another layer's library defines
//   is defined by a layer below it, so a back-edge that slips past the includes (a forward
//   declaration, an extern) is caught where the linker would see it.
// No strata code is linked: the test reads the sources and runs nm on the libraries.
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Layer {
  std::string name;
  std::string folder;           // under src/, e.g. "compute/cuda"
  std::set<std::string> below;  // every layer it may use, directly or through another
  std::string library;          // the static library; empty when not built (or cli)
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

std::vector<Layer> read_layer_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the layer table");
  std::vector<Layer> layers;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> fields = split(line, '|');
    if (fields.size() != 4)
      throw std::runtime_error(path + ": expected name|folder|below|library, found '" + line + "'");
    Layer layer{fields[0], fields[1], {}, fields[3]};
    for (const std::string& name : split(fields[2], ','))
      if (!name.empty()) layer.below.insert(name);
    layers.push_back(std::move(layer));
  }
  return layers;
}

const std::vector<Layer>& layers() {
  static const std::vector<Layer> table = read_layer_table(STRATA_LAYER_TABLE);
  return table;
}

// The layer a path under src/ ("layers/moe.h") belongs to: the one with the longest folder that
// holds it, or nullptr.
const Layer* layer_of(const std::vector<Layer>& table, const std::string& path) {
  const Layer* best = nullptr;
  for (const Layer& layer : table) {
    const std::string prefix = layer.folder + "/";
    if (path.compare(0, prefix.size(), prefix) == 0 &&
        (!best || layer.folder.size() > best->folder.size()))
      best = &layer;
  }
  return best;
}

std::string join(const std::set<std::string>& names, const std::vector<Layer>& order) {
  std::string out;
  for (const Layer& layer : order)  // in the declared order, lowest first
    if (names.count(layer.name)) out += (out.empty() ? "" : ", ") + layer.name;
  return out.empty() ? "none" : out;
}

// The back-edges among the #include lines of `text`, the contents of src/<file>: one message per
// offending include, "src/<file>:<line>: #include "<path>": ...".
std::vector<std::string> include_violations(const std::vector<Layer>& table,
                                            const std::string& file, const std::string& text) {
  static const std::regex include_line(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<std::string> found;
  const Layer* own = layer_of(table, file);
  if (!own)
    return {"src/" + file +
            ": in no layer (cmake/StrataLayers.cmake declares none for its folder)"};
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::smatch match;
    if (!std::regex_search(line, match, include_line)) continue;
    std::string target = match[1].str();
    // A path without a folder, or one starting with ".", is relative to the including file.
    if (target.find('/') == std::string::npos || target[0] == '.')
      target = (fs::path(file).parent_path() / target).lexically_normal().generic_string();
    const Layer* used = layer_of(table, target);
    if (!used || used == own || own->below.count(used->name)) continue;
    found.push_back("src/" + file + ":" + std::to_string(number) + ": #include \"" +
                    match[1].str() + "\": layer '" + own->name + "' (src/" + own->folder +
                    ") may include only " + join(own->below, table) + "; '" + used->name +
                    "' (src/" + used->folder + ") is not below it");
  }
  return found;
}

bool is_source(const fs::path& path) {
  static const std::set<std::string> extensions = {".h",  ".hpp", ".cpp", ".cc",
                                                   ".cu", ".cuh", ".inc"};
  return extensions.count(path.extension().string()) > 0;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(Layering, EveryLayerFolderExistsAndEverySourceIsInALayer) {
  const fs::path src = fs::path(STRATA_SOURCE_DIR) / "src";
  for (const Layer& layer : layers())
    EXPECT_TRUE(fs::is_directory(src / layer.folder))
        << "layer '" << layer.name << "': no folder src/" << layer.folder;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file() || !is_source(entry.path())) continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    EXPECT_NE(layer_of(layers(), file), nullptr)
        << "src/" << file << ": its folder is in no layer of cmake/StrataLayers.cmake";
  }
}

TEST(Layering, IncludesOnlyFromTheLayersBelow) {
  const fs::path src = fs::path(STRATA_SOURCE_DIR) / "src";
  std::vector<std::string> found;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file() || !is_source(entry.path())) continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    for (std::string& v : include_violations(layers(), file, read_all(entry.path())))
      found.push_back(std::move(v));
    ++files;
  }
  EXPECT_GT(files, 300);  // the walk found the tree
  std::string report;
  for (const std::string& v : found) report += v + "\n";
  EXPECT_TRUE(found.empty()) << found.size() << " include(s) of a layer not below:\n" << report;
}

// The checker itself: a planted back-edge is reported with file, line and include; includes of
// the own layer, of a layer below and of a nested layer's parent are not.
TEST(Layering, ChecksFindAPlantedBackEdge) {
  const std::vector<Layer> table = {
      {"util", "util", {}, ""},
      {"compute", "compute", {"util"}, ""},
      {"layers", "layers", {"compute", "util"}, ""},
      {"cuda", "compute/cuda", {"layers", "compute", "util"}, ""},
      {"model", "model", {"layers", "compute", "util"}, ""},
  };
  const std::string text =
      "#include \"layers/dims.h\"\n"
      "#include <vector>\n"
      "#include \"compute/cpu/matmul.h\"\n"
      "  #  include \"model/hparams.h\"\n"
      "#include \"moe.h\"\n"
      "#include \"../model/model.h\"\n";
  const std::vector<std::string> found = include_violations(table, "layers/moe.h", text);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].rfind("src/layers/moe.h:4: #include \"model/hparams.h\": layer 'layers'", 0),
            0u)
      << found[0];
  EXPECT_NE(found[0].find("may include only util, compute"), std::string::npos) << found[0];
  EXPECT_EQ(found[1].rfind("src/layers/moe.h:6: #include \"../model/model.h\"", 0), 0u) << found[1];
  // compute/cuda is a layer of its own, above compute: compute may not include it, it may
  // include compute.
  EXPECT_EQ(
      include_violations(table, "compute/backend.h", "#include \"compute/cuda/ops.h\"\n").size(),
      1u);
  EXPECT_TRUE(
      include_violations(table, "compute/cuda/ops.cu", "#include \"compute/backend.h\"\n").empty());
  EXPECT_EQ(include_violations(table, "nowhere/x.h", "").size(), 1u);
}

// ---- symbols ----

struct Symbols {
  std::set<std::string> defined;
  std::map<std::string, std::string> undefined;  // symbol → the first object that uses it
};

std::string demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

// nm -P -A lines: "<archive>[<object>]: <name> <type> [<value> <size>]".
Symbols library_symbols(const std::string& library) {
  const std::string command = std::string("'") + STRATA_NM + "' -P -A '" + library + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  Symbols symbols;
  char buffer[8192];
  std::string output;
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  if (pclose(pipe) != 0) throw std::runtime_error(command + " failed:\n" + output);
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find("]: ");
    if (colon == std::string::npos) continue;  // an archive's index or an empty member
    const size_t open = line.rfind('[', colon);
    const std::string object = line.substr(open + 1, colon - open - 1);
    std::istringstream fields(line.substr(colon + 3));
    std::string name, type;
    if (!(fields >> name >> type) || type.size() != 1) continue;
    const char t = type[0];
    if (t == 'U') {
      symbols.undefined.emplace(name, object);
    } else if ((t >= 'A' && t <= 'Z') || t == 'u' || t == 'i') {
      symbols.defined.insert(name);  // global (strong or weak) definitions; locals are lowercase
    }
  }
  return symbols;
}

TEST(Layering, LibrariesUseOnlySymbolsFromTheLayersBelow) {
  std::map<std::string, Symbols> by_layer;
  for (const Layer& layer : layers())
    if (!layer.library.empty()) by_layer[layer.name] = library_symbols(layer.library);
  ASSERT_GE(by_layer.size(), 15u) << "the layer libraries (" STRATA_LAYER_TABLE ")";
  std::map<std::string, std::string> defined_in;  // symbol → a layer that defines it
  for (const Layer& layer : layers())
    if (by_layer.count(layer.name))
      for (const std::string& symbol : by_layer[layer.name].defined)
        defined_in.emplace(symbol, layer.name);
  std::string report;
  int n_found = 0;
  for (const Layer& layer : layers()) {
    if (!by_layer.count(layer.name)) continue;
    for (const auto& [symbol, object] : by_layer[layer.name].undefined) {
      auto it = defined_in.find(symbol);
      if (it == defined_in.end() || it->second == layer.name || layer.below.count(it->second))
        continue;
      // Also defined below (a weak copy of an inline function) is no back-edge.
      bool below = false;
      for (const std::string& lower : layer.below)
        if (by_layer.count(lower) && by_layer[lower].defined.count(symbol)) below = true;
      if (below) continue;
      ++n_found;
      report += layer.library + "(" + object + ") [layer '" + layer.name + "'] uses " +
                demangle(symbol) + ", defined by layer '" + it->second +
                "', which is not below it\n";
    }
  }
  EXPECT_EQ(n_found, 0) << report;
}

}  // namespace
}  // namespace strata
