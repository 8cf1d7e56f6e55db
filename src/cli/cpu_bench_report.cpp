// `strata bench cpu`'s report: JSON, tables and plot of a CpuBenchRecord. Contract in
// cpu_bench_report.h.
#include "cli/cpu_bench_report.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "util/atomic_file.h"
#include "util/error.h"
#include "util/svg.h"

namespace strata::cli {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// units / seconds of every sample: tok/s of a run of `units` tokens.
std::vector<double> rates(const std::vector<CpuBenchSample>& samples, double units) {
  std::vector<double> v;
  for (const CpuBenchSample& s : samples) v.push_back(units / s.seconds);
  return v;
}

// llama.cpp's tok/s of every round that ran the test (the prompt runs only in some rounds).
std::vector<double> llama_rates(const std::vector<LlamaSample>& samples, bool prompt) {
  std::vector<double> v;
  for (const LlamaSample& l : samples)
    if (const double tps = prompt ? l.prompt_tps : l.decode_tps; tps > 0) v.push_back(tps);
  return v;
}

bool has_llama(const CpuBenchRecord& record) {
  for (const auto& [n, t] : record.threads)
    if (!t.llama.empty()) return true;
  return false;
}

// ---- JSON -------------------------------------------------------------------------------------

nlohmann::json sample_json(const CpuBenchSample& s) {
  nlohmann::json parts = nlohmann::json::object();
  for (size_t p = 0; p < size_t(Part::kCount); ++p)
    parts[std::string(part_name(Part(p)))] = s.times.part_ms[p];
  return {{"seconds", s.seconds},
          {"pool_jobs", s.jobs},
          {"pool_jobs_inline", s.jobs_inline},
          {"part_ms", parts}};
}

// Reads fields of one JSON file; every complaint names the file and the field's path.
class FieldReader {
 public:
  explicit FieldReader(const std::string& file) : file_(file) {}

  [[noreturn]] void wrong(const std::string& path, std::string_view expected,
                          const nlohmann::json* found) const {
    fail("{}: field {}: expected {}, found {}", file_, path, expected,
         found ? describe(*found) : std::string("nothing"));
  }

  // The member `key` of `object` (at `path`), or nullptr when it has none.
  static const nlohmann::json* find(const nlohmann::json& object, const std::string& key) {
    const auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }
  const nlohmann::json& need(const nlohmann::json& object, const std::string& path,
                             std::string_view expected) const {
    const nlohmann::json* value = find(object, leaf(path));
    if (!value) wrong(path, expected, nullptr);
    return *value;
  }
  double number(const nlohmann::json& value, const std::string& path, double min,
                std::string_view expected) const {
    if (!value.is_number() || !(value.get<double>() >= min)) wrong(path, expected, &value);
    return value.get<double>();
  }
  int integer(const nlohmann::json& value, const std::string& path, int min) const {
    const std::string expected = fmt::format("an integer >= {}", min);
    if (!value.is_number_integer() || value.get<int64_t>() < min || value.get<int64_t>() > 1 << 30)
      wrong(path, expected, &value);
    return value.get<int>();
  }
  const nlohmann::json& array(const nlohmann::json& value, const std::string& path,
                              std::string_view expected) const {
    if (!value.is_array()) wrong(path, expected, &value);
    return value;
  }
  const nlohmann::json& object(const nlohmann::json& value, const std::string& path,
                               std::string_view expected) const {
    if (!value.is_object()) wrong(path, expected, &value);
    return value;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  static std::string leaf(const std::string& path) {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? path : path.substr(dot + 1);
  }
  static std::string describe(const nlohmann::json& value) {
    std::string text = value.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    const char* type = value.is_object()   ? "an object "
                       : value.is_array()  ? "an array "
                       : value.is_string() ? "a string "
                                           : "";
    return type + text;
  }

  const std::string& file_;
};

CpuBenchSample sample_from_json(const FieldReader& r, const nlohmann::json& j,
                                const std::string& path) {
  r.object(j, path, "a run (an object with seconds, part_ms, pool_jobs)");
  CpuBenchSample s;
  const std::string seconds_path = FieldReader::join(path, "seconds");
  s.seconds = r.number(r.need(j, seconds_path, "the run's seconds (a positive number)"),
                       seconds_path, 1e-12, "the run's seconds (a positive number)");
  for (const char* key : {"pool_jobs", "pool_jobs_inline"})
    if (const nlohmann::json* v = FieldReader::find(j, key)) {
      const double count =
          r.number(*v, FieldReader::join(path, key), 0, "a count of hand-outs (a number >= 0)");
      (std::string(key) == "pool_jobs" ? s.jobs : s.jobs_inline) = uint64_t(count);
    }
  if (const nlohmann::json* parts = FieldReader::find(j, "part_ms")) {
    const std::string parts_path = FieldReader::join(path, "part_ms");
    r.object(*parts, parts_path, "an object of ms per part");
    // Parts this build does not know (a later one's) are left out: the "other" row takes them.
    for (size_t p = 0; p < size_t(Part::kCount); ++p) {
      const std::string name(part_name(Part(p)));
      if (const nlohmann::json* ms = FieldReader::find(*parts, name))
        s.times.part_ms[p] = r.number(*ms, parts_path + "." + name, 0, "ms (a number >= 0)");
    }
  }
  return s;
}

std::vector<CpuBenchSample> samples_from_json(const FieldReader& r, const nlohmann::json& t,
                                              const std::string& path, const char* key,
                                              bool required) {
  const std::string field = FieldReader::join(path, key);
  const char* expected = "an array of runs";
  const nlohmann::json* runs = FieldReader::find(t, key);
  if (!runs) {
    if (required) r.wrong(field, expected, nullptr);
    return {};
  }
  r.array(*runs, field, expected);
  if (required && runs->empty()) r.wrong(field, "at least one run", runs);
  std::vector<CpuBenchSample> samples;
  for (size_t i = 0; i < runs->size(); ++i)
    samples.push_back(sample_from_json(r, (*runs)[i], fmt::format("{}[{}]", field, i)));
  return samples;
}

// ---- tables -----------------------------------------------------------------------------------

// Markdown table of ms per unit by part (medians over the rounds), one column per thread count.
void append_parts(std::string& out, const std::string& title, const std::vector<int>& counts,
                  const std::map<int, std::vector<CpuBenchSample>>& samples, double units) {
  auto to = std::back_inserter(out);
  fmt::format_to(to, "\n{}\n\n| part |", title);
  for (int n : counts) fmt::format_to(to, " {} t |", n);
  fmt::format_to(to, " {}→{} t |\n|---|", counts.front(), counts.back());
  for (size_t i = 0; i <= counts.size(); ++i) out += "---|";
  out += "\n";
  auto row = [&](const std::string& name, auto value) {
    std::vector<double> med;
    bool any = false;
    for (int n : counts) {
      std::vector<double> v;
      for (const CpuBenchSample& s : samples.at(n)) v.push_back(value(s) / units);
      med.push_back(median(v));
      any = any || med.back() > 0.0005;
    }
    if (!any) return;
    fmt::format_to(to, "| {} |", name);
    for (double m : med) fmt::format_to(to, " {:.3f} |", m);
    fmt::format_to(to, " {} |\n",
                   med.back() > 0 ? fmt::format("{:.2f}x", med.front() / med.back()) : "-");
  };
  for (size_t p = 0; p < size_t(Part::kCount); ++p)
    row(std::string(part_name(Part(p))),
        [p](const CpuBenchSample& s) { return s.times.part_ms[p]; });
  row("other", [](const CpuBenchSample& s) {
    double parts = 0;
    for (double ms : s.times.part_ms) parts += ms;
    return s.seconds * 1e3 - parts;
  });
  row("**total**", [](const CpuBenchSample& s) { return s.seconds * 1e3; });
  row("pool hand-outs (count)", [](const CpuBenchSample& s) { return double(s.jobs); });
  row("run on the caller by the inline rule (count)",
      [](const CpuBenchSample& s) { return double(s.jobs_inline); });
}

// "median (min-max)" of a non-empty series.
std::string range_cell(const std::vector<double>& v, int decimals) {
  return fmt::format("{:.{}f} ({:.{}f}-{:.{}f})", median(v), decimals,
                     *std::min_element(v.begin(), v.end()), decimals,
                     *std::max_element(v.begin(), v.end()), decimals);
}

// ---- plot -------------------------------------------------------------------------------------

// One thread count's point of a series: the median of its rounds and their range.
struct Point {
  bool present = false;
  double median = 0, lo = 0, hi = 0;
};

Point summarize(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {true, median(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end())};
}

struct Panel {
  std::string title;
  std::vector<Point> strata, llama;  // one per thread count
};

constexpr double kWidth = 900, kHeight = 466;
constexpr double kPlotTop = 112, kPlotBottom = 410;
constexpr const char* kStrataColor = "#3b6fd0";
constexpr const char* kLlamaColor = "#e08a2c";

// A series' line, broken where a thread count has no point.
std::string series_line(const std::vector<Point>& points, const std::vector<double>& xs,
                        const std::function<double(double)>& y, const char* color) {
  std::string svg, run;
  int in_run = 0;
  auto flush = [&] {
    if (in_run > 1)
      svg += fmt::format(
          "<polyline points='{}' fill='none' stroke='{}' stroke-width='2' "
          "stroke-linejoin='round'/>\n",
          run, color);
    run.clear();
    in_run = 0;
  };
  for (size_t i = 0; i < points.size(); ++i) {
    if (!points[i].present) {
      flush();
      continue;
    }
    run += fmt::format("{}{:.1f},{:.1f}", run.empty() ? "" : " ", xs[i], y(points[i].median));
    ++in_run;
  }
  flush();
  return svg;
}

std::string draw_panel(const Panel& panel, const std::vector<int>& counts, double x0,
                       double width) {
  const double left = x0 + 66, right = x0 + width - 18;
  double max_value = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    max_value = std::max({max_value, panel.strata[i].hi, panel.llama[i].median});
  // Headroom above the highest point for the ratio written over it.
  const svg::Scale scale = svg::nice_scale(max_value * 1.1, 6);
  const std::function<double(double)> y = [&](double v) {
    return kPlotBottom - v / scale.top * (kPlotBottom - kPlotTop);
  };
  std::string svg = fmt::format("<text x='{}' y='{}' font-size='13' font-weight='bold'>{}</text>\n",
                                left, kPlotTop - 16, svg::escape(panel.title));
  for (int i = 0; double(i) * scale.step <= scale.top * (1 + 1e-9); ++i) {
    const double v = double(i) * scale.step;
    svg += svg::gridline(y(v), left, right, left - 6, svg::tick_label(v, scale.step), "end");
  }
  svg += fmt::format(
      "<line x1='{0}' x2='{0}' y1='{1}' y2='{2}' stroke='#888'/>"
      "<line x1='{0}' x2='{3}' y1='{2}' y2='{2}' stroke='#888'/>\n"
      "<text transform='translate({4},{5}) rotate(-90)' text-anchor='middle'>tok/s</text>\n"
      "<text x='{6}' y='{7}' text-anchor='middle'>threads</text>\n",
      left, kPlotTop, kPlotBottom, right, x0 + 20, (kPlotTop + kPlotBottom) / 2, (left + right) / 2,
      kPlotBottom + 38);
  const double slot = (right - left) / double(counts.size());
  std::vector<double> xs;
  for (size_t i = 0; i < counts.size(); ++i) {
    xs.push_back(left + slot * (double(i) + 0.5));
    svg += fmt::format(
        "<line x1='{0:.1f}' x2='{0:.1f}' y1='{1}' y2='{2}' stroke='#888'/>"
        "<text x='{0:.1f}' y='{3}' text-anchor='middle'>{4}</text>\n",
        xs[i], kPlotBottom, kPlotBottom + 5, kPlotBottom + 19, counts[i]);
  }
  svg += series_line(panel.llama, xs, y, kLlamaColor);
  svg += series_line(panel.strata, xs, y, kStrataColor);
  for (size_t i = 0; i < counts.size(); ++i) {
    const Point& l = panel.llama[i];
    if (l.present)
      svg += fmt::format(
          "<rect class='llama-point' x='{:.1f}' y='{:.1f}' width='9' height='9' fill='{}'/>\n",
          xs[i] - 4.5, y(l.median) - 4.5, kLlamaColor);
    const Point& s = panel.strata[i];
    if (!s.present) continue;
    if (s.hi > s.lo)
      svg += fmt::format(
          "<path class='whisker' d='M{0:.1f},{1:.1f}V{2:.1f}M{3:.1f},{1:.1f}H{4:.1f}M{3:.1f},"
          "{2:.1f}H{4:.1f}' stroke='{5}' stroke-width='1.5' fill='none'/>\n",
          xs[i], y(s.lo), y(s.hi), xs[i] - 5, xs[i] + 5, kStrataColor);
    svg += fmt::format(
        "<circle class='strata-point' cx='{:.1f}' cy='{:.1f}' r='4.5' fill='{}' "
        "stroke='white'/>\n",
        xs[i], y(s.median), kStrataColor);
    if (l.present) {
      const double ratio = s.median / l.median;
      svg += fmt::format(
          "<text class='ratio' x='{:.1f}' y='{:.1f}' text-anchor='middle' font-size='12' "
          "font-weight='bold' fill='{}' stroke='white' stroke-width='3' "
          "paint-order='stroke'>{:.2f}×</text>\n",
          xs[i], y(std::max(s.hi, l.median)) - 9, ratio >= 1 ? "#2a7a2a" : "#b03030", ratio);
    }
  }
  return svg;
}

}  // namespace

std::string utc_minute(std::chrono::system_clock::time_point time) {
  return fmt::format("{:%Y-%m-%d %H:%M} UTC",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(time)));
}

// ---- JSON -------------------------------------------------------------------------------------

nlohmann::json cpu_bench_json(const CpuBenchRecord& record) {
  nlohmann::json j;
  j["model"] = record.model;
  if (!record.date.empty()) j["date"] = record.date;
  j["prompt_tokens"] = record.prompt_tokens;
  j["chunk_rows"] = record.chunk_rows;
  j["n_decode"] = record.n_decode;
  j["decode_context"] = record.decode_context;
  j["rounds"] = record.rounds;
  if (record.bitwise_identical) j["bitwise_identical"] = *record.bitwise_identical;
  for (const auto& [cpu, ns] : record.round_trips)
    j["cache_line_round_trip_ns"][std::to_string(cpu)] = ns;
  for (int n : record.counts) {
    const CpuBenchThreads& r = record.threads.at(n);
    nlohmann::json t;
    t["inline_work_ns"] = r.inline_work_ns;
    if (!r.inline_rule.empty()) t["inline_rule"] = r.inline_rule;
    for (const CpuBenchSample& s : r.decode) t["decode"].push_back(sample_json(s));
    for (const CpuBenchSample& s : r.prompt) t["prompt"].push_back(sample_json(s));
    for (const LlamaSample& l : r.llama)
      t["llama_cpp"].push_back({{"decode_tok_s", l.decode_tps}, {"prompt_tok_s", l.prompt_tps}});
    j["threads"][std::to_string(n)] = t;
  }
  return j;
}

CpuBenchRecord cpu_bench_record_from_json(const nlohmann::json& j, const std::string& file) {
  const FieldReader r(file);
  if (!j.is_object())
    fail("{}: expected a JSON object (what strata bench cpu --json writes), found {}", file,
         j.is_array() ? "an array" : j.type_name());
  CpuBenchRecord record;
  const nlohmann::json& model = r.need(j, "model", "the model's path (a string)");
  if (!model.is_string()) r.wrong("model", "the model's path (a string)", &model);
  record.model = model.get<std::string>();
  if (const nlohmann::json* date = FieldReader::find(j, "date")) {
    if (!date->is_string()) r.wrong("date", "a string", date);
    record.date = date->get<std::string>();
  }
  record.n_decode = r.integer(r.need(j, "n_decode", "an integer >= 1"), "n_decode", 1);
  record.prompt_tokens =
      r.integer(r.need(j, "prompt_tokens", "an integer >= 0"), "prompt_tokens", 0);
  record.chunk_rows = r.integer(r.need(j, "chunk_rows", "an integer >= 1"), "chunk_rows", 1);
  if (const nlohmann::json* v = FieldReader::find(j, "decode_context"))
    record.decode_context = r.integer(*v, "decode_context", 0);
  if (const nlohmann::json* v = FieldReader::find(j, "bitwise_identical")) {
    if (!v->is_boolean()) r.wrong("bitwise_identical", "true or false", v);
    record.bitwise_identical = v->get<bool>();
  }
  if (const nlohmann::json* trips = FieldReader::find(j, "cache_line_round_trip_ns")) {
    r.object(*trips, "cache_line_round_trip_ns", "an object of ns per cpu");
    for (const auto& [cpu, ns] : trips->items()) {
      const std::string path = "cache_line_round_trip_ns." + cpu;
      int id = -1;
      std::istringstream(cpu) >> id;
      if (id < 0 || std::to_string(id) != cpu)
        fail("{}: field {}: expected a cpu number as the key, found \"{}\"", file, path, cpu);
      record.round_trips.emplace_back(id, r.number(ns, path, 0, "ns (a number >= 0)"));
    }
    std::sort(record.round_trips.begin(), record.round_trips.end());
  }

  const char* threads_expected = "an object of thread counts (\"1\": {\"decode\": [...]}, ...)";
  const nlohmann::json& threads =
      r.object(r.need(j, "threads", threads_expected), "threads", threads_expected);
  if (threads.empty()) r.wrong("threads", "at least one thread count", &threads);
  size_t most_decode_rounds = 0;
  for (const auto& [key, t] : threads.items()) {
    const std::string path = "threads." + key;
    int n = 0;
    std::istringstream(key) >> n;
    if (n < 1 || n > 1024 || std::to_string(n) != key)
      fail("{}: field {}: expected a thread count 1..1024 as the key, found \"{}\"", file, path,
           key);
    r.object(t, path, "an object with decode, prompt and llama_cpp runs");
    CpuBenchThreads& out = record.threads[n];
    record.counts.push_back(n);
    if (const nlohmann::json* v = FieldReader::find(t, "inline_work_ns"))
      out.inline_work_ns = r.number(*v, path + ".inline_work_ns", 0, "ns (a number >= 0)");
    if (const nlohmann::json* v = FieldReader::find(t, "inline_rule")) {
      if (!v->is_string()) r.wrong(path + ".inline_rule", "a string", v);
      out.inline_rule = v->get<std::string>();
    }
    out.decode = samples_from_json(r, t, path, "decode", /*required=*/true);
    out.prompt = samples_from_json(r, t, path, "prompt", /*required=*/false);
    if (!out.prompt.empty() && record.prompt_tokens == 0)
      fail("{}: field prompt_tokens: expected > 0 since {}.prompt has runs, found 0", file, path);
    most_decode_rounds = std::max(most_decode_rounds, out.decode.size());
    if (const nlohmann::json* llama = FieldReader::find(t, "llama_cpp")) {
      const std::string llama_path = path + ".llama_cpp";
      r.array(*llama, llama_path, "an array of llama-bench results");
      for (size_t i = 0; i < llama->size(); ++i) {
        const std::string item = fmt::format("{}[{}]", llama_path, i);
        const nlohmann::json& l =
            r.object((*llama)[i], item, "an object with decode_tok_s and prompt_tok_s");
        LlamaSample s;
        const char* tps = "tok/s (a number >= 0)";
        s.decode_tps =
            r.number(r.need(l, item + ".decode_tok_s", tps), item + ".decode_tok_s", 0, tps);
        if (const nlohmann::json* p = FieldReader::find(l, "prompt_tok_s"))
          s.prompt_tps = r.number(*p, item + ".prompt_tok_s", 0, tps);
        out.llama.push_back(s);
      }
    }
  }
  std::sort(record.counts.begin(), record.counts.end());
  record.rounds = int(most_decode_rounds);
  if (const nlohmann::json* v = FieldReader::find(j, "rounds"))
    record.rounds = r.integer(*v, "rounds", 0);
  record.repeats = record.rounds;
  return record;
}

CpuBenchRecord read_cpu_bench_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open the bench JSON: {}", path, std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: expected the JSON of strata bench cpu --json, found text that is not JSON ({})", path,
         e.what());
  }
  CpuBenchRecord record = cpu_bench_record_from_json(j, path);
  if (record.date.empty()) {
    std::error_code error;
    const auto written = std::filesystem::last_write_time(path, error);
    if (!error)
      record.date = utc_minute(std::chrono::time_point_cast<std::chrono::system_clock::duration>(
                        std::chrono::file_clock::to_sys(written))) +
                    " (file time)";
  }
  return record;
}

// ---- tables -----------------------------------------------------------------------------------

std::string cpu_bench_tables(const CpuBenchRecord& record, const std::string& heading) {
  std::string out;
  auto to = std::back_inserter(out);
  const std::vector<int>& counts = record.counts;
  const int n_windows = (record.prompt_tokens + record.chunk_rows - 1) / record.chunk_rows;
  const bool peer = has_llama(record);
  fmt::format_to(to, "\n{}\n", heading);
  fmt::format_to(
      to,
      "\n| threads | decode tok/s median (min-max) | speedup | pool hand-outs / token | prompt "
      "{} tok/s median (min-max) | speedup | pool hand-outs / window |{}\n",
      record.prompt_tokens,
      peer ? " llama.cpp decode | strata / llama.cpp | llama.cpp prompt | strata / llama.cpp |"
           : "");
  fmt::format_to(to, "|---|---|---|---|---|---|---|{}\n", peer ? "---|---|---|---|" : "");
  const double base_decode =
      median(rates(record.threads.at(counts.front()).decode, record.n_decode));
  double base_prompt = 0;
  for (int n : counts) {
    const CpuBenchThreads& r = record.threads.at(n);
    const std::vector<double> d = rates(r.decode, record.n_decode),
                              p = rates(r.prompt, record.prompt_tokens);
    std::vector<double> djobs, pjobs;
    for (const CpuBenchSample& s : r.decode) djobs.push_back(double(s.jobs) / record.n_decode);
    for (const CpuBenchSample& s : r.prompt) pjobs.push_back(double(s.jobs) / n_windows);
    if (base_prompt == 0 && !p.empty()) base_prompt = median(p);
    std::string llama;
    if (peer) {
      const std::vector<double> ld = llama_rates(r.llama, false), lp = llama_rates(r.llama, true);
      llama = fmt::format(
          " {} | {} | {} | {} |", ld.empty() ? "-" : fmt::format("{:.2f}", median(ld)),
          ld.empty() ? "-" : fmt::format("{:.2f}x", median(d) / median(ld)),
          lp.empty() ? "-" : fmt::format("{:.1f}", median(lp)),
          lp.empty() || p.empty() ? "-" : fmt::format("{:.2f}x", median(p) / median(lp)));
    }
    fmt::format_to(to, "| {} | {} | {:.2f}x | {:.0f} | {} | {} | {} |{}\n", n, range_cell(d, 2),
                   median(d) / base_decode, median(djobs), p.empty() ? "-" : range_cell(p, 1),
                   p.empty() ? "-" : fmt::format("{:.2f}x", median(p) / base_prompt),
                   p.empty() ? "-" : fmt::format("{:.0f}", median(pjobs)), llama);
  }
  std::map<int, std::vector<CpuBenchSample>> decode, prompt;
  std::vector<int> with_prompt;
  for (int n : counts) {
    decode[n] = record.threads.at(n).decode;
    if (!record.threads.at(n).prompt.empty()) {
      prompt[n] = record.threads.at(n).prompt;
      with_prompt.push_back(n);
    }
  }
  append_parts(out,
               fmt::format("Decode, ms per token by part (medians of {} rounds, {} steps each "
                           "after a {}-token prompt)",
                           record.rounds, record.n_decode, record.decode_context),
               counts, decode, record.n_decode);
  if (!with_prompt.empty())
    append_parts(
        out,
        fmt::format("Prompt, ms per {}-row window by part (medians of {} rounds, {} tokens)",
                    record.chunk_rows, prompt.begin()->second.size(), record.prompt_tokens),
        with_prompt, prompt, n_windows);
  if (record.bitwise_identical)
    fmt::format_to(to, "\ntokens and logits bitwise identical at every thread count: {}\n",
                   *record.bitwise_identical ? "yes" : "NO (a bug)");
  out += "\nthe pools' inline rule (first round; each round's pool measures its own):\n";
  for (int n : counts) {
    const CpuBenchThreads& r = record.threads.at(n);
    fmt::format_to(to, "- {} threads: {}\n", n,
                   !r.inline_rule.empty()
                       ? r.inline_rule
                       : fmt::format("inline under {:.1f} µs", r.inline_work_ns * 1e-3));
  }
  return out;
}

// ---- plot -------------------------------------------------------------------------------------

std::string cpu_bench_svg(const CpuBenchRecord& record) {
  const std::vector<int>& counts = record.counts;
  Panel decode{"decode", {}, {}},
      prompt{fmt::format("prompt ({} tokens)", record.prompt_tokens), {}, {}};
  bool any_prompt = false;
  size_t prompt_rounds = 0;
  for (int n : counts) {
    const CpuBenchThreads& t = record.threads.at(n);
    decode.strata.push_back(summarize(rates(t.decode, record.n_decode)));
    decode.llama.push_back(summarize(llama_rates(t.llama, false)));
    prompt.strata.push_back(summarize(rates(t.prompt, record.prompt_tokens)));
    prompt.llama.push_back(summarize(llama_rates(t.llama, true)));
    any_prompt = any_prompt || prompt.strata.back().present || prompt.llama.back().present;
    prompt_rounds = std::max(prompt_rounds, t.prompt.size());
  }
  const bool peer = has_llama(record);
  const std::string name = std::filesystem::path(record.model).filename().string();
  std::string svg = svg::open(
      kWidth, kHeight,
      fmt::format("{}, CPU tok/s by thread count: {}{}", peer ? "strata vs llama.cpp" : "strata",
                  name, record.date.empty() ? "" : ", " + record.date),
      20);
  std::string details = fmt::format("decode: {} greedy steps after a {}-token prompt",
                                    record.n_decode, record.decode_context);
  if (any_prompt)
    details += fmt::format("; prompt: {} tokens in {}-row windows", record.prompt_tokens,
                           record.chunk_rows);
  details += fmt::format("; {} round{}", record.rounds, record.rounds == 1 ? "" : "s");
  if (any_prompt && prompt_rounds < size_t(record.rounds))
    details += fmt::format(" (the prompt in {})", prompt_rounds);
  svg += fmt::format("<text x='20' y='40' fill='#555'>{}</text>\n", svg::escape(details));
  // The legend: a line and marker per series, a sample ratio.
  svg += fmt::format(
      "<line x1='20' x2='46' y1='62' y2='62' stroke='{0}' stroke-width='2'/><circle cx='33' "
      "cy='62' r='4.5' fill='{0}'/><text x='54' y='66'>strata: median of the rounds, whiskers "
      "min–max</text>\n",
      kStrataColor);
  if (peer)
    svg += fmt::format(
        "<line x1='370' x2='396' y1='62' y2='62' stroke='{0}' stroke-width='2'/><rect x='378.5' "
        "y='57.5' width='9' height='9' fill='{0}'/><text x='404' y='66'>llama.cpp "
        "(llama-bench): median</text>\n<text x='630' y='66'>ratio over a point: strata ÷ "
        "llama.cpp</text>\n",
        kLlamaColor);
  const std::vector<const Panel*> panels =
      any_prompt ? std::vector<const Panel*>{&decode, &prompt} : std::vector<const Panel*>{&decode};
  const double panel_width = kWidth / double(panels.size());
  for (size_t i = 0; i < panels.size(); ++i)
    svg += draw_panel(*panels[i], counts, panel_width * double(i), panel_width);
  return svg + std::string(svg::kClose);
}

void redraw_cpu_bench(const std::string& json_path, const std::string& svg_path) {
  const CpuBenchRecord record = read_cpu_bench_json(json_path);
  fmt::print("model {} ({}), from {}\n", record.model, record.date, json_path);
  fmt::print("{}", cpu_bench_tables(
                       record, fmt::format("### {} rounds, from {}", record.rounds, json_path)));
  if (!svg_path.empty()) {
    write_text_file(svg_path, cpu_bench_svg(record));
    fmt::print("\nplot: {}\n", svg_path);
  }
}

}  // namespace strata::cli
