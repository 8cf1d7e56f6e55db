// The pure parts of the web page's server side: the event-stream options parser, the snapshot
// hub across threads, a snapshot's JSON, and the embedded files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "serve/dashboard.h"
#include "serve/web_assets.h"
#include "serve/web_routes.h"

namespace strata::serve {
namespace {

using namespace std::chrono_literals;

TEST(WebEventOptions, AcceptsIntervalAndLastEventId) {
  const auto parsed = parse_event_options({{"interval_ms", "500"}}, "42");
  ASSERT_TRUE(std::holds_alternative<EventOptions>(parsed));
  EXPECT_EQ(std::get<EventOptions>(parsed).interval_ms, 500);
  EXPECT_EQ(std::get<EventOptions>(parsed).last_event_id, 42u);
  const auto defaults = parse_event_options({}, "");
  EXPECT_EQ(std::get<EventOptions>(defaults).interval_ms, 250);
  EXPECT_EQ(std::get<EventOptions>(defaults).last_event_id, 0u);
  EXPECT_EQ(std::get<EventOptions>(parse_event_options({{"interval_ms", "50"}}, "")).interval_ms,
            50);
  EXPECT_EQ(std::get<EventOptions>(parse_event_options({{"interval_ms", "10000"}}, "")).interval_ms,
            10000);
}

TEST(WebEventOptions, RefusesWhatItDoesNotUnderstand) {
  struct Case {
    QueryParams params;
    std::string last_event_id, param, message;
  };
  const std::vector<Case> cases = {
      {{{"interval_ms", "49"}},
       "",
       "interval_ms",
       "interval_ms: expected an integer between 50 and 10000 (milliseconds), found \"49\""},
      {{{"interval_ms", "10001"}}, "", "interval_ms", "found \"10001\""},
      {{{"interval_ms", ""}}, "", "interval_ms", "found \"\""},
      {{{"interval_ms", "1e3"}}, "", "interval_ms", "found \"1e3\""},
      {{{"interval_ms", " 100"}}, "", "interval_ms", "found \" 100\""},
      {{{"interval_ms", "100"}, {"interval_ms", "100"}},
       "",
       "interval_ms",
       "interval_ms: given more than once"},
      {{{"fields", "heat"}}, "", "fields", "fields: unknown query parameter"},
      {{},
       "-1",
       "Last-Event-ID",
       "Last-Event-ID: expected a snapshot version (a non-negative integer), found \"-1\""},
      {{}, "12a", "Last-Event-ID", "found \"12a\""},
      {{}, "123456789012345678901234", "Last-Event-ID", "found \"123456789012345678901234\""},
  };
  for (const Case& c : cases) {
    const auto parsed = parse_event_options(c.params, c.last_event_id);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << c.message;
    const ApiError& error = std::get<ApiError>(parsed);
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, c.param);
    EXPECT_NE(error.message.find(c.message), std::string::npos) << error.message;
  }
  EXPECT_FALSE(check_no_params({}, "/api/dashboard"));
  const auto error = check_no_params({{"x", "1"}}, "/api/dashboard");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->message, "x: /api/dashboard takes no query parameters");
}

std::shared_ptr<DashboardSnapshot> small_snapshot() {
  auto fixed = std::make_shared<DashboardStatic>();
  fixed->n_expert = 4;
  fixed->blocks = {{true, false, 4096}, {false, false, 0}, {true, true, 8192}};
  auto s = std::make_shared<DashboardSnapshot>();
  s->fixed = fixed;
  s->heat = {1, 2, 0, 4, 0, 0, 0, 0, 0.5f, 0, 0, 0};
  s->residency = "srps----rrss";
  return s;
}

TEST(DashboardSnapshot, JsonScalesHeatAndSplitsResidencyPerBlock) {
  DashboardHub hub;
  hub.publish(small_snapshot());
  const nlohmann::json j = nlohmann::json::parse(hub.latest()->json());
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["heat"]["max"], 4);
  EXPECT_EQ(j["heat"]["rows"], nlohmann::json::parse("[[250,500,0,1000],[],[125,0,0,0]]"));
  EXPECT_EQ(j["residency"]["rows"], nlohmann::json::parse(R"(["srps","----","rrss"])"));
  EXPECT_EQ(j["placement"]["ram"]["resident_experts"], 4);
  EXPECT_EQ(j["placement"]["ram"]["pinned_experts"], 1);
  EXPECT_TRUE(j["experts"].is_null());
  EXPECT_TRUE(j["spec"].is_null());
  EXPECT_TRUE(j["moce"].is_null());
  EXPECT_TRUE(j["generation"]["ttft_ms"].is_null());
  EXPECT_FALSE(j.contains("server"));  // appended by the route
  // Cached: the same string object every time.
  EXPECT_EQ(&hub.latest()->json(), &hub.latest()->json());
}

TEST(DashboardHub, WaitersWakeOnPublishAndOnClose) {
  DashboardHub hub;
  hub.publish(small_snapshot());
  EXPECT_EQ(hub.wait_newer(1, 10ms)->version, 1u);  // times out, returns the latest
  std::thread engine([&] {
    std::this_thread::sleep_for(20ms);
    hub.publish(small_snapshot());
  });
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(hub.wait_newer(1, 10s)->version, 2u);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  engine.join();
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    hub.close();
  });
  EXPECT_EQ(hub.wait_newer(2, 10s)->version, 2u);
  EXPECT_TRUE(hub.closed());
  closer.join();
}

TEST(WebAssets, EmbedsThePage) {
  const WebAsset* page = find_web_asset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<!doctype html>"), std::string_view::npos);
  size_t total = 0;
  for (const WebAsset& asset : web_assets()) {
    EXPECT_EQ(asset.etag.size(), 18u);  // "\"" + 16 hex + "\""
    total += asset.body.size();
  }
  ASSERT_NE(find_web_asset("/dashboard.js"), nullptr);
  EXPECT_EQ(find_web_asset("/dashboard.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(find_web_asset("/nope.js"), nullptr);
  EXPECT_LT(total, 64u * 1024);
}

}  // namespace
}  // namespace strata::serve
