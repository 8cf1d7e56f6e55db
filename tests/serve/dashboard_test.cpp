// The web page's routes end to end (src/serve/web_routes.h), driven with curl against the real
// binary: the embedded page, GET /api/dashboard against docs/serve-dashboard.schema.json and
// against /metrics (the same counters), the event stream while a reply is generated (the heat map
// moves), speculative decoding and MoCE sections, the bench plots folder, and bad requests.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "serve_process.h"

namespace strata::serve::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kSchemaPath =
    std::string(STRATA_TEST_DATA_DIR) + "/../../docs/serve-dashboard.schema.json";
const std::string kDefaultModel =
    std::string(STRATA_TEST_DATA_DIR) + "/../../models/strata-default.gguf";

// A generation longer than any test waits for (cancelled when its curl is killed).
const std::string kEndless =
    R"({"prompt":"And God said","max_tokens":4000,"ignore_eos":true,"stream":true})";

// The one pattern form the schema uses, "^[chars]*$" (std::regex is avoided: GCC 12 warns
// inside it under -O2 with the sanitizers, and warnings are errors).
bool matches_char_class(const std::string& pattern, const std::string& text) {
  EXPECT_TRUE(pattern.size() >= 5 && pattern.rfind("^[", 0) == 0 && pattern.ends_with("]*$"))
      << "unsupported pattern " << pattern;
  const std::string chars = pattern.substr(2, pattern.size() - 5);
  return text.find_first_not_of(chars) == std::string::npos;
}

// The subset of JSON Schema the dashboard schema uses: type (one or a list), enum, required,
// properties, additionalProperties: false, items, minimum, pattern. Failures name the JSON path.
void validate(const json& schema, const json& value, const std::string& path,
              std::vector<std::string>& errors) {
  if (schema.contains("enum")) {
    bool found = false;
    for (const json& option : schema["enum"]) found |= option == value;
    if (!found)
      errors.push_back(path + ": " + value.dump() + " is not one of " + schema["enum"].dump());
    return;
  }
  if (schema.contains("type")) {
    const json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
    bool ok = false;
    for (const json& type : types) {
      const std::string t = type;
      ok |= (t == "object" && value.is_object()) || (t == "array" && value.is_array()) ||
            (t == "string" && value.is_string()) || (t == "boolean" && value.is_boolean()) ||
            (t == "null" && value.is_null()) || (t == "number" && value.is_number()) ||
            (t == "integer" && value.is_number_integer());
    }
    if (!ok) {
      errors.push_back(path + ": expected " + types.dump() + ", found " +
                       value.dump().substr(0, 80));
      return;
    }
  }
  if (value.is_object()) {
    for (const json& key : schema.value("required", json::array()))
      if (!value.contains(key.get<std::string>()))
        errors.push_back(path + ": missing " + key.dump());
    const json properties = schema.value("properties", json::object());
    for (const auto& [key, member] : value.items()) {
      if (properties.contains(key))
        validate(properties[key], member, path + "." + key, errors);
      else if (schema.contains("additionalProperties") && !schema["additionalProperties"])
        errors.push_back(path + ": unexpected member \"" + key + "\"");
    }
  }
  if (value.is_array() && schema.contains("items"))
    for (size_t i = 0; i < value.size(); ++i)
      validate(schema["items"], value[i], fmt::format("{}[{}]", path, i), errors);
  if (value.is_number() && schema.contains("minimum") &&
      value.get<double>() < schema["minimum"].get<double>())
    errors.push_back(path + ": below the minimum");
  if (value.is_string() && schema.contains("pattern") &&
      !matches_char_class(schema["pattern"].get<std::string>(), value.get<std::string>()))
    errors.push_back(path + ": does not match " + schema["pattern"].get<std::string>());
}

void expect_valid(const json& snapshot) {
  std::ifstream file(kSchemaPath);
  ASSERT_TRUE(file) << kSchemaPath;
  const json schema = json::parse(file);
  std::vector<std::string> errors;
  validate(schema, snapshot, "$", errors);
  std::string all;
  for (const std::string& e : errors) all += e + "\n";
  EXPECT_TRUE(errors.empty()) << all;
}

json dashboard(const ServeProcess& server) {
  const HttpReply reply = get(server, "/api/dashboard");
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.header("Content-Type"), "application/json");
  return reply.json();
}

void expect_error(const HttpReply& reply, int status, const std::string& param,
                  const std::string& in_message) {
  EXPECT_EQ(reply.status, status) << reply.body;
  const json body = reply.json();
  ASSERT_TRUE(body.contains("error")) << reply.body;
  if (param.empty())
    EXPECT_TRUE(body["error"]["param"].is_null()) << reply.body;
  else
    EXPECT_EQ(body["error"]["param"], param) << reply.body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find(in_message), std::string::npos)
      << reply.body;
}

struct Event {
  std::string id, name, data;
};

// Parses an SSE body into events (comments and retry lines skipped).
std::vector<Event> parse_events(const std::string& body) {
  std::vector<Event> events;
  Event event;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) {
      if (!event.name.empty() || !event.data.empty()) events.push_back(event);
      event = Event{};
    } else if (line.rfind("id: ", 0) == 0) {
      event.id = line.substr(4);
    } else if (line.rfind("event: ", 0) == 0) {
      event.name = line.substr(7);
    } else if (line.rfind("data: ", 0) == 0) {
      event.data += line.substr(6);
    }
  }
  return events;
}

// A copy of the default model with its expert sidecar, in a temp dir (the repo stays clean).
class PackedModel {
 public:
  PackedModel() {
    dir_ = fs::temp_directory_path() / fmt::format("strata-dashboard-{}", ::getpid());
    fs::create_directories(dir_);
    path_ = (dir_ / "strata-default.gguf").string();
    fs::copy_file(kDefaultModel, path_, fs::copy_options::overwrite_existing);
    ChildProcess pack({STRATA_BINARY, "pack", path_});
    const std::optional<int> code = pack.wait(120);
    EXPECT_EQ(code.value_or(-1), 0) << pack.stderr_text();
  }
  ~PackedModel() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

uint64_t u(const json& value) {
  return value.get<uint64_t>();
}

TEST(ServeDashboard, PageIsEmbeddedAndLoadsNothingFromElsewhere) {
  ServeProcess server;
  const HttpReply page = get(server, "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page.header("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
  const std::string etag = page.header("ETag");
  ASSERT_FALSE(etag.empty());
  EXPECT_EQ(curl("GET", server.url("/"), {}, {"-H", "If-None-Match: " + etag}).status, 304);

  // Every file the page names is served, and none names another host.
  size_t total = page.body.size();
  std::set<std::string> files;
  for (const std::string attribute : {"src=\"", "href=\""}) {
    for (size_t at = page.body.find(attribute); at != std::string::npos;
         at = page.body.find(attribute, at + 1)) {
      const size_t begin = at + attribute.size();
      const std::string value = page.body.substr(begin, page.body.find('"', begin) - begin);
      if (value.rfind("/", 0) == 0) files.insert(value);
    }
  }
  EXPECT_TRUE(files.count("/app.js") && files.count("/chat.js") && files.count("/dashboard.js") &&
              files.count("/style.css"));
  for (const std::string& file : files) {
    const HttpReply asset = get(server, file);
    EXPECT_EQ(asset.status, 200) << file;
    EXPECT_EQ(asset.body.find("http://"), std::string::npos) << file;
    EXPECT_EQ(asset.body.find("https://"), std::string::npos) << file;
    total += asset.body.size();
  }
  EXPECT_EQ(page.body.find("http"), std::string::npos);
  std::printf("the page: %zu files, %zu bytes in all\n", files.size() + 1, total);
  EXPECT_LT(total, 64u * 1024) << "the page should stay small";
}

TEST(ServeDashboard, SnapshotFollowsTheSchemaAndAgreesWithMetrics) {
  PackedModel model;
  ServeProcess server({"-m", model.path(), "--ram-budget", "25%"});
  const json idle = dashboard(server);
  expect_valid(idle);
  EXPECT_EQ(idle["placement"]["source"], "store");
  EXPECT_EQ(idle["generation"]["id"], 0);
  EXPECT_FALSE(idle["placement"]["gpu"]["available"].get<bool>());

  const HttpReply done =
      post(server, "/v1/completions",
           R"({"prompt":"And the LORD spake unto Moses","max_tokens":24,"temperature":0})");
  ASSERT_EQ(done.status, 200) << done.body;
  const json usage = done.json()["usage"];
  const json s = dashboard(server);
  expect_valid(s);
  const std::string metrics = get(server, "/metrics").body;
  auto m = [&](const std::string& series) {
    const std::optional<double> value = metric(metrics, series);
    EXPECT_TRUE(value) << series;
    return uint64_t(value.value_or(-1));
  };
  // The same counters, through both doors.
  const json& e = s["experts"];
  ASSERT_TRUE(e.is_object());
  EXPECT_GT(u(e["needed"]), 0u);
  EXPECT_EQ(u(e["needed"]), m("strata_expert_needed_total"));
  EXPECT_EQ(u(e["hits"]), m("strata_expert_hits_total"));
  EXPECT_EQ(u(e["misses"]), m("strata_expert_misses_total"));
  EXPECT_EQ(u(e["bytes_read"]), m("strata_expert_bytes_read_total"));
  EXPECT_EQ(u(e["read_ahead_issued"]), m("strata_expert_read_ahead_issued_total"));
  EXPECT_EQ(u(e["read_ahead_used"]), m("strata_expert_read_ahead_used_total"));
  EXPECT_NEAR(e["io_wait_ms"].get<double>() / 1000,
              *metric(metrics, "strata_expert_io_wait_seconds_total"), 1e-5);
  const json& srv = s["server"];
  EXPECT_EQ(u(srv["completion_tokens_total"]), m("strata_completion_tokens_total"));
  EXPECT_EQ(u(srv["prompt_tokens_total"]), m("strata_prompt_tokens_total"));
  EXPECT_EQ(u(srv["generations"]["length"]),
            m("strata_generations_total{finish_reason=\"length\"}"));
  EXPECT_EQ(u(srv["completion_tokens_total"]), u(usage["completion_tokens"]));

  // The recorder watched the same expert stream the store served.
  EXPECT_EQ(u(s["tiers"]["ram"]["hits"]), u(e["hits"]));
  EXPECT_EQ(u(e["hits"]) + u(e["misses"]), u(e["needed"]));
  const json& g = s["generation"];
  EXPECT_EQ(g["id"], 1);
  EXPECT_FALSE(g["running"].get<bool>());
  EXPECT_EQ(g["finish_reason"], "length");
  EXPECT_EQ(g["completion_tokens"], usage["completion_tokens"]);
  EXPECT_EQ(g["prompt_tokens"], usage["prompt_tokens"]);
  EXPECT_GT(g["ttft_ms"].get<double>(), 0);
  // Prefill rows + one decode row per token after the first (which comes from the prefill).
  EXPECT_EQ(u(s["engine"]["rows_routed"]),
            u(usage["prompt_tokens"]) + u(usage["completion_tokens"]) - 1);
  EXPECT_GT(s["engine"]["phases_ms"]["routed_experts"].get<double>(), 0);

  // Residency: the arena holds at most its slots, the map shows exactly those.
  size_t resident = 0, blocks = 0;
  for (const json& row : s["residency"]["rows"]) {
    const std::string codes = row;
    if (codes.empty()) continue;
    ++blocks;
    EXPECT_EQ(codes.size(), u(s["model"]["n_expert"]));
    size_t in_ram = 0;
    for (const char c : codes) in_ram += c == 'r' || c == 'p';
    EXPECT_LE(in_ram, u(s["placement"]["ram"]["slots_per_layer"]));
    resident += in_ram;
  }
  EXPECT_EQ(resident, u(s["placement"]["ram"]["resident_experts"]));
  EXPECT_GT(resident, 0u);
  EXPECT_EQ(blocks, 9u);  // 8 trunk layers + the MTP block
  // Heat: every trunk layer routed top-4 of 64 for 47 rows.
  int hot_rows = 0;
  for (const json& row : s["heat"]["rows"]) {
    int nonzero = 0;
    for (const json& v : row) nonzero += v.get<int>() > 0;
    hot_rows += nonzero >= 4;
  }
  EXPECT_EQ(hot_rows, 8);
  EXPECT_GT(s["version"].get<uint64_t>(), idle["version"].get<uint64_t>());
}

TEST(ServeDashboard, EventStreamShowsTheHeatMapMovingDuringAReply) {
  ServeProcess server;
  auto endless = std::make_unique<ChildProcess>(
      std::vector<std::string>{"curl", "-s", "-N", "-H", "Content-Type: application/json",
                               "--data-binary", kEndless, server.url("/v1/completions")});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!dashboard(server)["generation"]["running"].get<bool>() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const HttpReply stream =
      curl("GET", server.url("/api/dashboard/events?interval_ms=100"), {}, {"--max-time", "2"});
  endless.reset();
  EXPECT_EQ(stream.status, 200);
  EXPECT_EQ(stream.header("Content-Type"), "text/event-stream");
  EXPECT_NE(stream.body.find("retry: 2000"), std::string::npos);
  const std::vector<Event> events = parse_events(stream.body);
  ASSERT_GE(events.size(), 4u) << stream.body.substr(0, 400);
  std::set<std::string> heat_maps;
  uint64_t last_id = 0;
  int64_t tokens_before = -1;
  for (const Event& event : events) {
    EXPECT_EQ(event.name, "snapshot");
    const json s = json::parse(event.data);
    EXPECT_EQ(std::to_string(s["version"].get<uint64_t>()), event.id);
    EXPECT_GT(s["version"].get<uint64_t>(), last_id);
    last_id = s["version"].get<uint64_t>();
    EXPECT_TRUE(s["generation"]["running"].get<bool>());
    EXPECT_GE(s["generation"]["completion_tokens"].get<int64_t>(), tokens_before);
    tokens_before = s["generation"]["completion_tokens"].get<int64_t>();
    heat_maps.insert(s["heat"]["rows"].dump());
  }
  expect_valid(json::parse(events.back().data));
  EXPECT_GE(heat_maps.size(), 3u) << "the heat map should change from snapshot to snapshot";

  // Reconnecting with Last-Event-ID gets only newer snapshots.
  const HttpReply again =
      curl("GET", server.url("/api/dashboard/events"), {},
           {"--max-time", "1", "-H", "Last-Event-ID: " + std::to_string(last_id)});
  for (const Event& event : parse_events(again.body)) EXPECT_GT(std::stoull(event.id), last_id);
}

TEST(ServeDashboard, SpeculativeAndMoceSectionsWhenOn) {
  PackedModel model;
  ServeProcess server(
      {"-m", model.path(), "--ram-budget", "25%", "--spec", "mtp", "--moce", "0.5"});
  const json before = dashboard(server);
  EXPECT_TRUE(before["spec"].is_object());
  EXPECT_EQ(before["spec"]["windows"], 0);
  ASSERT_EQ(post(server, "/v1/completions",
                 R"({"prompt":"And God said","max_tokens":32,"temperature":0})")
                .status,
            200);
  const json s = dashboard(server);
  expect_valid(s);
  const json& spec = s["spec"];
  EXPECT_EQ(spec["mode"], "mtp");
  EXPECT_GT(u(spec["windows"]), 0u);
  uint64_t windows = 0, drafted = 0;
  for (size_t k = 0; k < spec["depth_counts"].size(); ++k) {
    windows += u(spec["depth_counts"][k]);
    drafted += k * u(spec["depth_counts"][k]);
  }
  EXPECT_EQ(windows, u(spec["windows"]));
  EXPECT_EQ(drafted, u(spec["drafted"]));
  EXPECT_LE(u(spec["accepted"]), u(spec["drafted"]));
  ASSERT_TRUE(s["moce"].is_object());
  EXPECT_EQ(s["moce"]["lambda"], 0.5);
  EXPECT_GT(u(s["moce"]["rows"]), 0u);
}

TEST(ServeDashboard, PlotsFolderServesOnlyItsSvgFiles) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("strata-plots-{}", ::getpid());
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "mid.svg")
      << "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>\n";
  std::ofstream(dir / ".hidden.svg") << "<svg/>";
  std::ofstream(dir / "notes.txt") << "not a plot";
  std::ofstream(dir / "sub" / "deep.svg") << "<svg/>";
  {
    ServeProcess server({"--plots", dir.string()});
    const json list = get(server, "/api/plots").json();
    EXPECT_EQ(list["dir"], dir.string());
    ASSERT_EQ(list["plots"].size(), 1u) << list.dump();
    EXPECT_EQ(list["plots"][0]["name"], "mid.svg");
    EXPECT_EQ(list["plots"][0]["url"], "/plots/mid.svg");
    const HttpReply svg = get(server, "/plots/mid.svg");
    EXPECT_EQ(svg.status, 200);
    EXPECT_EQ(svg.header("Content-Type"), "image/svg+xml");
    EXPECT_NE(svg.header("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
    EXPECT_NE(svg.body.find("<svg"), std::string::npos);
    for (const char* bad : {"/plots/.hidden.svg", "/plots/notes.txt", "/plots/sub/deep.svg",
                            "/plots/..%2Fmid.svg", "/plots/nope.svg"})
      expect_error(get(server, bad), 404, "", "no plot named");
    // A way out of the folder is a 404 either from the plots route (httplib 0.11, Debian 12) or
    // before any route, once httplib has resolved the dots (0.18, Debian 13: "/etc/passwd").
    const HttpReply out = get(server, "/plots/%2e%2e/etc/passwd");
    EXPECT_EQ(out.status, 404) << out.body;
    const std::string message = out.json()["error"]["message"].get<std::string>();
    EXPECT_TRUE(message.find("no plot named") != std::string::npos ||
                message.find("no route for GET /etc/passwd") != std::string::npos)
        << out.body;
  }
  ServeProcess plain;
  const json none = get(plain, "/api/plots").json();
  EXPECT_TRUE(none["dir"].is_null());
  EXPECT_TRUE(none["plots"].empty());
  expect_error(get(plain, "/plots/mid.svg"), 404, "", "--plots DIR");
  fs::remove_all(dir);
}

TEST(ServeDashboard, BadRequestsGetClearErrors) {
  ServeProcess server;
  const std::string events = "/api/dashboard/events";
  expect_error(
      get(server, events + "?interval_ms=abc"), 400, "interval_ms",
      "interval_ms: expected an integer between 50 and 10000 (milliseconds), found \"abc\"");
  expect_error(get(server, events + "?interval_ms=10"), 400, "interval_ms", "found \"10\"");
  expect_error(get(server, events + "?interval_ms=-5"), 400, "interval_ms", "found \"-5\"");
  expect_error(get(server, events + "?interval_ms=99999999999999999999999"), 400, "interval_ms",
               "expected an integer");
  expect_error(get(server, events + "?interval_ms=100&interval_ms=200"), 400, "interval_ms",
               "more than once");
  expect_error(get(server, events + "?every=1"), 400, "every", "unknown query parameter");
  expect_error(curl("GET", server.url(events), {}, {"-H", "Last-Event-ID: yesterday"}), 400,
               "Last-Event-ID",
               "expected a snapshot version (a non-negative integer), found \"yesterday\"");
  expect_error(get(server, "/api/dashboard?heat=0"), 400, "heat", "takes no query parameters");
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    const HttpReply reply = curl(method, server.url("/api/dashboard"), std::string("{\"x\":1}"));
    expect_error(reply, 405, "", "answers GET");
    EXPECT_EQ(reply.header("Allow"), "GET, HEAD");
  }
  expect_error(curl("POST", server.url(events), std::string("not json")), 405, "", "answers GET");
  expect_error(get(server, "/api/nope"), 404, "", "no route for GET /api/nope");
  // The JSON endpoint still answers normally afterwards.
  expect_valid(dashboard(server));
}

TEST(ServeDashboard, EventStreamEndsOnShutdown) {
  ServeProcess server;
  auto stream = std::make_unique<ChildProcess>(
      std::vector<std::string>{"curl", "-s", "-N", server.url("/api/dashboard/events")});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(server.terminate(20).value_or(-1), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5))
      << "an open event stream must not hold the shutdown";
  ASSERT_TRUE(stream->wait(5));
  const std::vector<Event> events = parse_events(stream->stdout_text());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().name, "snapshot");
  EXPECT_EQ(events.back().name, "end");
}

}  // namespace
}  // namespace strata::serve::test
