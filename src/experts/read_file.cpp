#include "experts/read_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace strata {

namespace {
int open_read_only(const char* path, int flags) {
  return ::open(path, flags);
}
}  // namespace

ReadFile::ReadFile(std::string path, bool want_direct, Opener opener) : path_(std::move(path)) {
  if (!opener) opener = open_read_only;
  buffered_fd_ = opener(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (buffered_fd_ < 0) fail("{}: cannot open: {}", path_, std::strerror(errno));
  if (!want_direct) return;
  direct_fd_ = opener(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (direct_fd_ < 0) {
    const int error = errno;
    refused_ = true;
    fmt::print(stderr,
               "strata: warning: {}: O_DIRECT refused at open ({}; tmpfs before Linux 6.6 and some "
               "network/FUSE filesystems do this); reading experts through the page cache\n",
               path_, std::strerror(error));
  }
}

ReadFile::~ReadFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

bool ReadFile::refuse_direct(const char* why) {
  if (direct_fd_ < 0) return false;
  if (!refused_.exchange(true))
    fmt::print(stderr,
               "strata: warning: {}: O_DIRECT reads refused ({}); reading experts through the page "
               "cache\n",
               path_, why);
  return true;
}

uint64_t ReadFile::size_now() const {
  struct stat st {};
  return fstat(buffered_fd_, &st) == 0 ? uint64_t(st.st_size) : 0;
}

}  // namespace strata
