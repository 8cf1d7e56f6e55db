// Routing traces: the format round-trips what was written (window boundaries, ids, fp16 weights,
// predictions), a damaged or cut file is refused naming the file and the field, an unfinished
// writer leaves no file, and a TracingSource is transparent for the source it wraps.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/temp_dir.h"
#include "route/routing_trace.h"
#include "util/error.h"
#include "util/fp16.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

RoutingTraceHeader small_header() {
  RoutingTraceHeader h;
  h.model_identity = 0x0123456789abcdefULL;
  h.n_block = 4;
  h.n_expert = 8;
  h.k = 2;
  h.record_bytes = {4096, 0, 8192, 4096};  // block 1 is dense
  return h;
}

Routing routing(std::vector<int32_t> ids, std::vector<float> weights) {
  Routing r;
  r.k = 2;
  r.experts = std::move(ids);
  r.weights = std::move(weights);
  return r;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::string load_error(const std::string& path) {
  try {
    RoutingTrace::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << path << ": loaded without an error";
  return "";
}

// Two-row prefill over blocks 0, 2, 3, then two decode steps; the second step's block 3 has no
// prediction (the last MoE block never predicts).
std::string write_example(const test_support::ScratchDir& dir) {
  const std::string path = dir.file("t.trace");
  RoutingTraceWriter w(path, small_header());
  w.add_layer(0, routing({1, 5, 0, 5}, {0.75f, 0.25f, 0.5f, 0.5f}));
  w.add_prediction(2, std::vector<int32_t>{5, 1, 7});
  w.add_layer(2, routing({2, 3, 3, 6}, {0.6f, 0.4f, 0.9f, 0.1f}));
  w.add_prediction(3, std::vector<int32_t>{});
  w.add_layer(3, routing({0, 7, 1, 7}, {0.5f, 0.5f, 0.3f, 0.7f}));
  for (int step = 0; step < 2; ++step) {
    w.add_layer(0, routing({step, 4}, {0.8f, 0.2f}));
    w.add_prediction(2, std::vector<int32_t>{4});
    w.add_layer(3, routing({6, 7}, {0.55f, 0.45f}));  // a window may skip blocks
  }
  w.finish();
  return path;
}

TEST(RoutingTrace, RoundTripsWindowsRoutingAndPredictions) {
  test_support::ScratchDir dir("route");
  const RoutingTrace t = RoutingTrace::load(write_example(dir));
  EXPECT_EQ(t.header.model_identity, 0x0123456789abcdefULL);
  EXPECT_EQ(t.header.n_block, 4u);
  EXPECT_EQ(t.header.n_expert, 8u);
  EXPECT_EQ(t.header.k, 2u);
  EXPECT_EQ(t.header.record_bytes, (std::vector<uint64_t>{4096, 0, 8192, 4096}));
  EXPECT_EQ(t.header.expert_bytes(), 16384u * 8);

  ASSERT_EQ(t.windows.size(), 3u);
  EXPECT_EQ(t.windows[0].n_rows, 2u);
  EXPECT_EQ(t.windows[0].n_records, 3u);
  EXPECT_EQ(t.windows[1].n_rows, 1u);
  EXPECT_EQ(t.windows[2].first_record, 5u);
  ASSERT_EQ(t.records.size(), 7u);
  EXPECT_EQ(t.tokens(), 4u);
  EXPECT_EQ(t.tokens(true), 2u);

  const RoutingTrace::LayerRecord& r0 = t.records[0];
  EXPECT_EQ(r0.layer, 0);
  EXPECT_EQ(std::vector<uint16_t>(t.ids.begin() + ptrdiff_t(r0.routing_offset),
                                  t.ids.begin() + ptrdiff_t(r0.routing_offset) + 4),
            (std::vector<uint16_t>{1, 5, 0, 5}));
  EXPECT_EQ(f16_to_f32(t.weights_f16[r0.routing_offset]), 0.75f);
  EXPECT_EQ(t.weights_f16[r0.routing_offset + 1], f32_to_f16(0.25f));
  EXPECT_EQ(std::vector<uint16_t>(t.union_ids.begin() + ptrdiff_t(r0.union_offset),
                                  t.union_ids.begin() + ptrdiff_t(r0.union_offset + r0.union_size)),
            (std::vector<uint16_t>{0, 1, 5}));
  EXPECT_EQ(r0.predict_layer, 2);
  EXPECT_EQ(
      std::vector<uint16_t>(t.predicted.begin() + ptrdiff_t(r0.predict_offset),
                            t.predicted.begin() + ptrdiff_t(r0.predict_offset + r0.predict_size)),
      (std::vector<uint16_t>{5, 1, 7}));
  EXPECT_EQ(t.records[1].predict_layer, 3);  // an empty prediction is still a predict() call
  EXPECT_EQ(t.records[1].predict_size, 0u);
  EXPECT_EQ(t.records[2].predict_layer, -1);
  EXPECT_EQ(t.records[4].layer, 3);
  EXPECT_EQ(t.records[4].predict_layer, -1);
  EXPECT_EQ(t.records[5].union_size, 2u);
}

TEST(RoutingTrace, TruncatedFileNamesTheFieldWhereItEnds) {
  test_support::ScratchDir dir("route");
  const std::string path = write_example(dir);
  const std::vector<uint8_t> bytes = read_bytes(path);
  const std::string cut = dir.file("cut.trace");
  struct Case {
    size_t size;
    const char* expected;
  };
  const size_t header = 8 + 4 + 8 + 4 * 3 + 8 * 4;
  const Case cases[] = {
      {0, "header: field 'magic'"},
      {10, "header: field 'version'"},
      {header - 3, "header: field 'record_bytes'"},
      {header, "truncated after window 0"},
      {header + 6, "window 0: field 'n_rows'"},
      {header + 10 + 3 + 5, "window 0, layer record 0: field 'ids/weights'"},
      {bytes.size() - 28, "truncated after window 3"},
      {bytes.size() - 3, "end record: field 'xxh3'"},
  };
  for (const Case& c : cases) {
    write_bytes(cut, std::span(bytes).first(c.size));
    const std::string error = load_error(cut);
    EXPECT_NE(error.find(cut), std::string::npos) << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << "cut at " << c.size << ": " << error;
  }
}

TEST(RoutingTrace, CorruptOrForeignFileIsRefusedNamingTheField) {
  test_support::ScratchDir dir("route");
  const std::string path = write_example(dir);
  const std::vector<uint8_t> good = read_bytes(path);
  const std::string bad = dir.file("bad.trace");
  auto with = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> b = good;
    b[at] = value;
    write_bytes(bad, b);
    return load_error(bad);
  };
  EXPECT_NE(with(0, 'X').find("field 'magic': expected \"STRTRACE\", found \"XTRTRACE\""),
            std::string::npos);
  EXPECT_NE(with(8, 9).find("field 'version': expected 1 (what this strata reads), found 9"),
            std::string::npos);
  // A flipped bit in the routing is caught by the checksum before any field is believed.
  const std::string flipped = with(good.size() / 2, uint8_t(good[good.size() / 2] ^ 0x10));
  EXPECT_NE(flipped.find("field 'xxh3'"), std::string::npos) << flipped;
  EXPECT_NE(flipped.find("corrupt"), std::string::npos) << flipped;

  // Without the end record there is no checksum: the fields themselves are checked.
  const size_t first_record = 8 + 4 + 8 + 4 * 3 + 8 * 4 + 10;
  std::vector<uint8_t> open_ended(good.begin(), good.end() - 28);
  open_ended[first_record] = 1;  // block 1 has no routed experts
  write_bytes(bad, open_ended);
  EXPECT_NE(load_error(bad).find("window 0, layer record 0: field 'layer'"), std::string::npos);
  open_ended[first_record] = 0;
  open_ended[first_record + 3] = 8;  // first expert id: n_expert is 8
  write_bytes(bad, open_ended);
  const std::string id_error = load_error(bad);
  EXPECT_NE(id_error.find("field 'ids': expected expert ids below n_expert 8, found 8"),
            std::string::npos)
      << id_error;

  EXPECT_NE(load_error(dir.file("missing.trace")).find("cannot open routing trace"),
            std::string::npos);
}

TEST(RoutingTrace, UnfinishedWriterLeavesNoFile) {
  test_support::ScratchDir dir("route");
  const std::string path = dir.file("t.trace");
  {
    RoutingTraceWriter w(path, small_header());
    w.add_layer(0, routing({1, 2}, {0.5f, 0.5f}));
  }
  EXPECT_FALSE(fs::exists(path));
  RoutingTraceWriter w(path, small_header());
  EXPECT_THROW(w.add_layer(1, routing({1, 2}, {0.5f, 0.5f})), Error);  // a dense block
  EXPECT_THROW(w.add_prediction(2, std::vector<int32_t>{1}), Error);   // no layer yet
  w.finish();
  EXPECT_EQ(RoutingTrace::load(path).windows.size(), 0u);
}

// Records what it is asked; wants a prediction only while `want` is set.
class RecordingSource final : public ExpertSource {
 public:
  void publish(int layer, std::span<const int32_t> experts) override {
    calls.push_back(fmt::format("begin {} {}", layer, fmt::join(experts, ",")));
  }
  std::span<const DeliveredExpert> wait() override { return {}; }
  bool wants_guess() const override { return want; }
  void publish_guess(int layer, std::span<const int32_t> experts) override {
    calls.push_back(fmt::format("predict {} {}", layer, fmt::join(experts, ",")));
  }
  bool want = false;
  std::vector<std::string> calls;
};

TEST(TracingSource, PassesCallsThroughAndPredictionsOnlyWhenWanted) {
  test_support::ScratchDir dir("route");
  const std::string path = dir.file("t.trace");
  RecordingSource inner;
  {
    TracingSource tracer(inner, path, small_header());
    EXPECT_TRUE(tracer.wants_guess());
    const Routing r = routing({3, 1, 1, 6}, {0.5f, 0.5f, 0.5f, 0.5f});
    tracer.observe_routing(0, r);
    tracer.publish(0, std::vector<int32_t>{1, 3, 6});
    tracer.publish_guess(2, std::vector<int32_t>{4, 2});
    inner.want = true;
    tracer.observe_routing(2, r);
    tracer.publish(2, std::vector<int32_t>{1, 3, 6});
    tracer.publish_guess(3, std::vector<int32_t>{5});
    tracer.observe_routing(3, r);
    EXPECT_THROW(tracer.publish(3, std::vector<int32_t>{1, 3}),
                 Error);  // not the routing's union
  }                       // the destructor writes the trace
  EXPECT_EQ(inner.calls,
            (std::vector<std::string>{"begin 0 1,3,6", "begin 2 1,3,6", "predict 3 5"}));
  const RoutingTrace t = RoutingTrace::load(path);
  ASSERT_EQ(t.records.size(), 2u);
  EXPECT_EQ(t.records[0].predict_layer, 2);  // recorded although the inner source did not want it
  EXPECT_EQ(t.records[1].predict_layer, 3);
}

}  // namespace
}  // namespace strata
