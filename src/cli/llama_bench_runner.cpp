#include "cli/llama_bench_runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "util/error.h"

namespace strata::cli {
namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The last `limit` bytes of a file (the end of a log is where the reason is).
std::string file_tail(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() <= limit) return text;
  std::string tail = "…";
  tail.append(text, text.size() - limit, limit);
  return tail;
}

}  // namespace

nlohmann::json run_llama_bench_json(const std::string& binary, const std::vector<std::string>& args,
                                    const std::string& who) {
  std::string stderr_path = "/tmp/strata-llama-bench-XXXXXX";
  const int fd = mkstemp(stderr_path.data());
  if (fd < 0) fail("{}: cannot create a temporary file for llama-bench's stderr: {}", who, std::strerror(errno));
  close(fd);
  std::string command = shell_quote(binary);
  for (const std::string& a : args) {
    command += ' ';
    command += shell_quote(a);
  }
  command += " -o json";
  const std::string shown = command;
  command += " 2>";
  command += shell_quote(stderr_path);
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    std::remove(stderr_path.c_str());
    fail("{}: cannot start {}: {}", who, binary, std::strerror(errno));
  }
  std::string out;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) out.append(buffer.data(), n);
  const int status = pclose(pipe);
  const std::string err = file_tail(stderr_path, 1500);
  std::remove(stderr_path.c_str());
  const size_t open = out.find('[');
  const nlohmann::json j = status != 0 || open == std::string::npos
                               ? nlohmann::json()
                               : nlohmann::json::parse(out.substr(open), nullptr, /*allow_exceptions=*/false);
  if (status != 0 || !j.is_array())
    fail("{}: `{}` {} (stdout: {}); its stderr ends:\n{}", who, shown,
         status != 0 ? fmt::format("failed (status {})", status) : std::string("printed no JSON array"),
         out.substr(0, 200), err);
  return j;
}

std::optional<LlamaTestSpeed> llama_test_tps(const nlohmann::json& tests, bool has_prompt, bool has_gen) {
  for (const nlohmann::json& t : tests)
    if (t.is_object() && t.contains("avg_ts") && (t.value("n_prompt", 0) > 0) == has_prompt &&
        (t.value("n_gen", 0) > 0) == has_gen)
      return LlamaTestSpeed{t["avg_ts"].get<double>(), t.value("stddev_ts", 0.0)};
  return std::nullopt;
}

}  // namespace strata::cli
