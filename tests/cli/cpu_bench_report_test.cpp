// `strata bench cpu`'s report read back from a JSON (src/cli/cpu_bench_report.h, what
// `--from-json FILE --svg OUT` runs): hand-written records with known tok/s give the plot's points,
// whiskers and ratios, and the tables' numbers; records without llama.cpp or without prompt runs
// draw what they have; bad input names the file and the field.
#include "cli/cpu_bench_report.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "util/error.h"

namespace strata::cli {
namespace {

// Five thread counts, two rounds; n_decode 32, so decode tok/s = 32 / seconds:
//   threads        1       2        4       8       16
//   strata decode  4, 5    8, 10    16, 16  20, 20  25, 20   (medians 4.5 9 16 20 22.5)
//   llama decode   5       10       10      16      30       (ratios 0.90 0.90 1.60 1.25 0.75)
//   strata prompt  -       20       40      80      160      (512 / seconds, first round only)
//   llama prompt   -       25       40      100     160      (ratios 0.80 1.00 0.80 1.00)
constexpr const char* kFullRecord = R"({
  "model": "/models/tiny-test.gguf", "date": "2026-12-01 10:00 UTC",
  "n_decode": 32, "prompt_tokens": 512, "chunk_rows": 64, "decode_context": 16, "rounds": 2,
  "bitwise_identical": true,
  "threads": {
    "1": {"inline_work_ns": 0,
          "decode": [{"seconds": 8.0, "pool_jobs": 0, "part_ms": {"routed experts": 4000.0,
                                                                    "a later build's part": 1.0}},
                     {"seconds": 6.4, "pool_jobs": 0}],
          "llama_cpp": [{"decode_tok_s": 5, "prompt_tok_s": 0}, {"decode_tok_s": 5, "prompt_tok_s": 0}]},
    "2": {"decode": [{"seconds": 4.0, "pool_jobs": 320}, {"seconds": 3.2, "pool_jobs": 320}],
          "prompt": [{"seconds": 25.6, "pool_jobs": 8000}],
          "llama_cpp": [{"decode_tok_s": 10, "prompt_tok_s": 25}, {"decode_tok_s": 10, "prompt_tok_s": 0}]},
    "4": {"decode": [{"seconds": 2.0}, {"seconds": 2.0}],
          "prompt": [{"seconds": 12.8}],
          "llama_cpp": [{"decode_tok_s": 10, "prompt_tok_s": 40}, {"decode_tok_s": 10, "prompt_tok_s": 0}]},
    "8": {"decode": [{"seconds": 1.6}, {"seconds": 1.6}],
          "prompt": [{"seconds": 6.4}],
          "llama_cpp": [{"decode_tok_s": 16, "prompt_tok_s": 100}, {"decode_tok_s": 16, "prompt_tok_s": 0}]},
    "16": {"decode": [{"seconds": 1.28}, {"seconds": 1.6}],
           "prompt": [{"seconds": 3.2}],
           "llama_cpp": [{"decode_tok_s": 30, "prompt_tok_s": 160}, {"decode_tok_s": 30, "prompt_tok_s": 0}]}
  }
})";

// Decode only (no --llama-bench, --prompt-tokens 0), three counts.
constexpr const char* kDecodeOnlyRecord = R"({
  "model": "strata-default.gguf", "n_decode": 10, "prompt_tokens": 0, "chunk_rows": 64,
  "decode_context": 16, "rounds": 1,
  "threads": {"1": {"decode": [{"seconds": 1.0}]}, "2": {"decode": [{"seconds": 0.5}]},
              "4": {"decode": [{"seconds": 0.4}]}}
})";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every element closed, in order (self-closing or by its end tag), and one root: "<svg ...>".
// Returns "" when well formed, else what is wrong.
std::string tag_balance_error(const std::string& svg) {
  std::vector<std::string> open;
  size_t roots = 0;
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    if (end == std::string::npos) return "a tag without '>' at " + std::to_string(at);
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.empty()) return "an empty tag at " + std::to_string(at);
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1))
        return "unexpected </" + tag.substr(1) + ">";
      open.pop_back();
      continue;
    }
    if (open.empty()) ++roots;
    if (tag.back() == '/') continue;
    open.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return roots == 1 ? "" : std::to_string(roots) + " root elements";
}

// The message of the strata::Error that reading `text` as a bench JSON throws ("" if none).
std::string read_error(const std::string& text, const std::string& path) {
  {
    std::ofstream out(path);
    out << text;
  }
  try {
    (void)read_cpu_bench_json(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpuBenchReport, PlotFromJsonHasAPointWhiskerAndRatioPerThreadCount) {
  test_support::ScratchDir dir("cpu-bench-report");
  const std::string json = dir.file("bench.json"), svg_path = dir.file("bench.svg");
  std::ofstream(json) << kFullRecord;
  redraw_cpu_bench(json, svg_path);
  const std::string svg = read_text(svg_path);

  ASSERT_EQ(svg.rfind("<svg ", 0), 0u) << svg.substr(0, 80);
  ASSERT_GE(svg.size(), 7u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(tag_balance_error(svg), "");
  EXPECT_NE(svg.find("width='900'"), std::string::npos);
  // Title: both series, the model's file name and the date.
  EXPECT_NE(svg.find("strata vs llama.cpp, CPU tok/s by thread count: tiny-test.gguf, 2026-12-01 "
                     "10:00 UTC</text>"),
            std::string::npos);
  // Two panels, each with its x axis of five counts.
  EXPECT_EQ(count(svg, ">threads</text>"), 2u);
  EXPECT_EQ(count(svg, ">tok/s</text>"), 2u);
  EXPECT_EQ(count(svg, ">prompt (512 tokens)</text>"), 1u);
  EXPECT_EQ(count(svg, "text-anchor='middle'>16</text>"), 2u);
  // Decode: 5 strata points, 5 llama.cpp; prompt: 4 and 4 (1 thread ran no prompt).
  EXPECT_EQ(count(svg, "class='strata-point'"), 9u);
  EXPECT_EQ(count(svg, "class='llama-point'"), 9u);
  // Whiskers where the rounds differ: decode at 1, 2 and 16 threads.
  EXPECT_EQ(count(svg, "class='whisker'"), 3u);
  // One line per series per panel.
  EXPECT_EQ(count(svg, "<polyline"), 4u);
  // The ratios, strata ÷ llama.cpp, over every count that has both.
  EXPECT_EQ(count(svg, "class='ratio'"), 9u);
  for (const char* ratio : {">0.90×<", ">1.60×<", ">1.25×<", ">0.75×<", ">0.80×<", ">1.00×<"})
    EXPECT_NE(svg.find(ratio), std::string::npos) << ratio;
  EXPECT_EQ(count(svg, ">0.90×<"), 2u);
  EXPECT_EQ(count(svg, ">1.00×<"), 2u);
}

TEST(CpuBenchReport, TablesFromJsonGiveTheRunsNumbers) {
  const CpuBenchRecord record =
      cpu_bench_record_from_json(nlohmann::json::parse(kFullRecord), "full.json");
  EXPECT_EQ(record.counts, (std::vector<int>{1, 2, 4, 8, 16}));  // numeric, not the keys' order
  const std::string tables = cpu_bench_tables(record, "### from full.json");
  // 4 threads: 16 tok/s, 16 / 4.5 faster than 1 thread; llama.cpp 10 (1.60x), prompt 40 both.
  EXPECT_NE(tables.find("| 4 | 16.00 (16.00-16.00) | 3.56x | 0 | 40.0 (40.0-40.0) | 2.00x | 0 | "
                        "10.00 | 1.60x | 40.0 | 1.00x |"),
            std::string::npos)
      << tables;
  EXPECT_NE(tables.find("| 1 | 4.50 (4.00-5.00) | 1.00x | 0 | - | - | - | 5.00 | 0.90x | - | - |"),
            std::string::npos)
      << tables;
  // A part the JSON names: the 1-thread median of 4000 ms and 0 over 32 tokens.
  EXPECT_NE(tables.find("| routed experts | 62.500 |"), std::string::npos) << tables;
  EXPECT_NE(tables.find("bitwise identical at every thread count: yes"), std::string::npos);
}

TEST(CpuBenchReport, JsonWrittenByARunReadsBackToTheSameReport) {
  const CpuBenchRecord record =
      cpu_bench_record_from_json(nlohmann::json::parse(kFullRecord), "full.json");
  const CpuBenchRecord again = cpu_bench_record_from_json(cpu_bench_json(record), "again.json");
  EXPECT_EQ(cpu_bench_tables(again, "#"), cpu_bench_tables(record, "#"));
  EXPECT_EQ(cpu_bench_svg(again), cpu_bench_svg(record));
}

TEST(CpuBenchReport, WithoutLlamaCppOrPromptRunsOnePanelWithOneLine) {
  const CpuBenchRecord record =
      cpu_bench_record_from_json(nlohmann::json::parse(kDecodeOnlyRecord), "decode-only.json");
  const std::string svg = cpu_bench_svg(record);
  EXPECT_EQ(tag_balance_error(svg), "");
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("strata, CPU tok/s by thread count: strata-default.gguf</text>"),
            std::string::npos);
  EXPECT_EQ(count(svg, ">threads</text>"), 1u);  // the decode panel alone
  EXPECT_EQ(svg.find("prompt ("), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_EQ(count(svg, "class='strata-point'"), 3u);
  EXPECT_EQ(count(svg, "class='llama-point'"), 0u);
  EXPECT_EQ(count(svg, "class='ratio'"), 0u);
  EXPECT_EQ(count(svg, "class='whisker'"), 0u);
  EXPECT_EQ(svg.find("llama.cpp"), std::string::npos);
  const std::string tables = cpu_bench_tables(record, "#");
  EXPECT_NE(tables.find("| 4 | 25.00 (25.00-25.00) | 2.50x | 0 | - | - | - |\n"), std::string::npos)
      << tables;
}

TEST(CpuBenchReport, LlamaCppWithoutPromptRunsTwoLinesInTheDecodePanel) {
  nlohmann::json j = nlohmann::json::parse(kDecodeOnlyRecord);
  for (auto& [n, t] : j["threads"].items())
    t["llama_cpp"] = nlohmann::json::array({nlohmann::json{{"decode_tok_s", 8.0}}});
  const std::string svg = cpu_bench_svg(cpu_bench_record_from_json(j, "decode-llama.json"));
  EXPECT_EQ(tag_balance_error(svg), "");
  EXPECT_EQ(count(svg, ">threads</text>"), 1u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "class='llama-point'"), 3u);
  EXPECT_EQ(count(svg, "class='ratio'"), 3u);
  EXPECT_NE(svg.find(">1.25×<"), std::string::npos);  // 10 tok/s ÷ 8
  EXPECT_NE(svg.find(">3.12×<"), std::string::npos);  // 25 ÷ 8 = 3.125

  // llama.cpp missing at 2 threads: its line breaks there (two lone points), not drawn across.
  j["threads"]["2"].erase("llama_cpp");
  const std::string gap = cpu_bench_svg(cpu_bench_record_from_json(j, "decode-llama-gap.json"));
  EXPECT_EQ(count(gap, "<polyline"), 1u);
  EXPECT_EQ(count(gap, "class='llama-point'"), 2u);
  EXPECT_EQ(count(gap, "class='ratio'"), 2u);
}

TEST(CpuBenchReport, BadInputNamesTheFileAndTheField) {
  test_support::ScratchDir dir("cpu-bench-report");
  const std::string path = dir.file("bad.json");
  auto expect = [&](const std::string& text, std::vector<std::string> parts) {
    const std::string message = read_error(text, path);
    ASSERT_FALSE(message.empty()) << "no error for " << text;
    parts.push_back(path);
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };
  expect("bench cpu: round 1/3", {"not JSON"});
  expect("[1, 2]", {"expected a JSON object", "found an array"});
  nlohmann::json j = nlohmann::json::parse(kFullRecord);
  j.erase("threads");
  expect(j.dump(), {"field threads:", "found nothing"});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["4"]["decode"][1]["seconds"] = "fast";
  expect(j.dump(), {"field threads.4.decode[1].seconds:", "expected the run's seconds",
                    "found a string \"fast\""});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["2"].erase("decode");
  expect(j.dump(), {"field threads.2.decode:", "expected an array of runs", "found nothing"});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["2"]["decode"] = nlohmann::json::array();
  expect(j.dump(), {"field threads.2.decode:", "expected at least one run", "found an array []"});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["four"] = j["threads"]["4"];
  expect(j.dump(), {"field threads.four:", "thread count", "found \"four\""});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["8"]["llama_cpp"][0].erase("decode_tok_s");
  expect(j.dump(), {"field threads.8.llama_cpp[0].decode_tok_s:", "found nothing"});
  j = nlohmann::json::parse(kFullRecord);
  j["n_decode"] = "32";
  expect(j.dump(), {"field n_decode:", "expected an integer >= 1", "found a string \"32\""});
  j = nlohmann::json::parse(kFullRecord);
  j["threads"]["16"]["prompt"] = {{"seconds", 1.0}};
  expect(j.dump(), {"field threads.16.prompt:", "expected an array of runs"});
  EXPECT_NE(read_error("", dir.file("missing/none.json")).find("missing/none.json"),
            std::string::npos);
}

// The measurement docs/bench-cpu-scaling.md shows stays readable by this code.
TEST(CpuBenchReport, TheDocumentedSixteenCoreRunRedraws) {
  const CpuBenchRecord record =
      read_cpu_bench_json(std::string(STRATA_SOURCE_DIR) + "/docs/bench-cpu-scaling-16core.json");
  EXPECT_EQ(record.counts, (std::vector<int>{1, 2, 4, 8, 16}));
  const std::string svg = cpu_bench_svg(record);
  EXPECT_EQ(tag_balance_error(svg), "");
  EXPECT_EQ(count(svg, "class='strata-point'"), 9u);  // no prompt at 1 thread
  EXPECT_EQ(count(svg, "class='llama-point'"), 9u);
  EXPECT_EQ(count(svg, "class='ratio'"), 9u);
}

}  // namespace
}  // namespace strata::cli
