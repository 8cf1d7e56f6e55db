// A fresh scratch directory under the system temp dir for one test, removed with everything in it
// on destruction. Header-only so any test binary can use it.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace strata::test_support {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "test") {
    path_ = std::filesystem::temp_directory_path() / fmt::format("strata-{}-{}-{}", tag, getpid(), counter_++);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace strata::test_support
