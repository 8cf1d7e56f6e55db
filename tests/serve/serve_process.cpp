#include "serve_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace strata::serve::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return text;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  char pattern[] = "/tmp/strata-serve-test-XXXXXX";
  if (!mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir_ + "/stdout").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir_ + "/stderr").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw std::runtime_error(fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
}

ChildProcess::~ChildProcess() {
  if (running()) {
    signal(SIGKILL);
    wait(10);
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void ChildProcess::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait(double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!exit_code_) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_code_;
}

bool ChildProcess::running() {
  return !wait(0);
}
std::string ChildProcess::stdout_text() const {
  return read_file(dir_ + "/stdout");
}
std::string ChildProcess::stderr_text() const {
  return read_file(dir_ + "/stderr");
}

ServeProcess::ServeProcess(const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {STRATA_BINARY, "serve", "--port", "0", "--quiet"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  process_ = std::make_unique<ChildProcess>(argv);
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    const std::string out = process_->stdout_text();
    const size_t at = out.find(" on http://");
    const size_t end = out.find(" (", at == std::string::npos ? 0 : at);
    if (at != std::string::npos && end != std::string::npos) {
      const std::string address = out.substr(at, end - at);
      port_ = std::atoi(address.substr(address.rfind(':') + 1).c_str());
      return;
    }
    if (!process_->running())
      throw std::runtime_error(
          fmt::format("strata serve exited at start:\n{}", process_->stderr_text()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("strata serve did not start listening within 120 s");
}

ServeProcess::~ServeProcess() {
  if (process_->running()) {
    process_->signal(SIGTERM);
    if (!process_->wait(10)) process_->signal(SIGKILL);
    return;
  }
  // The server ended before the test let it go (terminate() was not called): a crash or a
  // sanitizer report. Its stderr is the only trace of it once the process directory goes.
  if (!terminated_) {
    const std::string err = process_->stderr_text();
    ADD_FAILURE() << "strata serve ended on its own, exit status " << process_->wait(0).value_or(-1)
                  << "; the end of its stderr:\n"
                  << err.substr(err.size() > 8000 ? err.size() - 8000 : 0);
  }
}

std::string ServeProcess::url(const std::string& path) const {
  return fmt::format("http://127.0.0.1:{}{}", port_, path);
}

std::optional<int> ServeProcess::terminate(double timeout_s) {
  terminated_ = true;
  process_->signal(SIGTERM);
  return process_->wait(timeout_s);
}

nlohmann::json HttpReply::json() const {
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << body;
  return parsed;
}

std::string HttpReply::header(const std::string& name) const {
  std::istringstream lines(headers);
  std::string line;
  const std::string key = lower(name) + ":";
  while (std::getline(lines, line)) {
    if (lower(line).rfind(key, 0) == 0) {
      std::string value = line.substr(key.size());
      value.erase(0, value.find_first_not_of(' '));
      while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
      return value;
    }
  }
  return {};
}

HttpReply curl(const std::string& method, const std::string& url,
               const std::optional<std::string>& body, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {"curl", "-s", "-i", "-N", "-H", "Expect:", "-X", method, url};
  if (body)
    argv.insert(argv.end(), {"-H", "Content-Type: application/json", "--data-binary", *body});
  argv.insert(argv.end(), extra.begin(), extra.end());
  ChildProcess process(argv);
  HttpReply reply;
  const std::optional<int> code = process.wait(300);
  if (!code) {
    process.signal(SIGKILL);
    ADD_FAILURE() << "curl did not finish: " << url;
  }
  reply.curl_exit = code.value_or(-1);
  const std::string out = process.stdout_text();
  const size_t split = out.find("\r\n\r\n");
  if (split == std::string::npos) return reply;
  reply.headers = out.substr(0, split + 2);
  reply.body = out.substr(split + 4);
  const size_t space = reply.headers.find(' ');
  if (space != std::string::npos) reply.status = std::atoi(reply.headers.c_str() + space + 1);
  return reply;
}

HttpReply get(const ServeProcess& server, const std::string& path) {
  return curl("GET", server.url(path));
}

HttpReply post(const ServeProcess& server, const std::string& path, const std::string& body,
               const std::vector<std::string>& extra) {
  return curl("POST", server.url(path), body, extra);
}

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> events;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find("\n\n", start);
    const std::string event =
        body.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (event.rfind("data: ", 0) == 0) {
      events.push_back(event.substr(6));
    } else {
      events.push_back("<not a data event: " + event + ">");
    }
    if (end == std::string::npos) break;
    start = end + 2;
  }
  return events;
}

std::vector<std::pair<std::string, nlohmann::json>> anthropic_events(const std::string& body) {
  std::vector<std::pair<std::string, nlohmann::json>> events;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find("\n\n", start);
    const std::string event = body.substr(start, end == std::string::npos ? end : end - start);
    const size_t data = event.find("\ndata: ");
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_NE(data, std::string::npos) << event;
    if (event.rfind("event: ", 0) != 0 || data == std::string::npos) break;
    events.emplace_back(event.substr(7, data - 7), nlohmann::json::parse(event.substr(data + 7)));
    if (end == std::string::npos) break;
    start = end + 2;
  }
  return events;
}

std::optional<double> metric(const std::string& metrics_text, const std::string& series) {
  std::istringstream lines(metrics_text);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind(series + " ", 0) == 0)
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
  return std::nullopt;
}

double metric_now(const ServeProcess& server, const std::string& series) {
  const HttpReply reply = get(server, "/metrics");
  const std::optional<double> value = metric(reply.body, series);
  EXPECT_TRUE(value) << series << " missing from /metrics (status " << reply.status << ", curl exit "
                     << reply.curl_exit << "): "
                     << reply.body.substr(0, 300);
  return value.value_or(-1);
}

RawClient::RawClient(int port, const std::string& request, int receive_buffer_bytes) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0)
    throw std::runtime_error("RawClient: connect failed");
  if (!send_more(request)) throw std::runtime_error("RawClient: send failed");
}

bool RawClient::send_more(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += size_t(n);
  }
  return true;
}

RawClient::~RawClient() {
  close();
}

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string RawClient::read_until(const std::string& needle, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buffer[65536];
  while (received_.find(needle) == std::string::npos && Clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      peer_closed_ = true;
      break;
    }
    received_.append(buffer, size_t(n));
  }
  return received_;
}

std::string http_post_request(const std::string& path, const std::string& body) {
  return fmt::format(
      "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
      "{}\r\n\r\n{}",
      path, body.size(), body);
}

}  // namespace strata::serve::test
