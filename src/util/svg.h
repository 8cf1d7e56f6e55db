// svg — the pieces every bench plot shares (`strata bench experts`, `bench cpu`, `bench gpu`):
// one look (a white background, sans-serif 12 px, a 14 px title at the top left, light grey
// gridlines with their values at the left edge), written as text so that a plot is a string its
// caller writes out (util/atomic_file.h write_text_file).
//
// Contract: pure functions of their arguments, no state (thread-safe). Text that goes into the
// document (titles, labels) is escaped here; the caller's own markup is not checked.
#pragma once

#include <string>
#include <string_view>

namespace strata::svg {

// `text` with & < > ' " replaced by their entities (for a text node or a quoted attribute).
std::string escape(std::string_view text);

// The document's start: `width` × `height` px, the white background and `title` (escaped) at
// (title_x, 20). Close it with kClose.
std::string open(double width, double height, std::string_view title, double title_x);
inline constexpr std::string_view kClose = "</svg>\n";

// A light grey horizontal gridline at `y` from x0 to x1 and its `label` (escaped) at
// (label_x, y + 4), anchored there by `anchor` (SVG text-anchor: start, middle or end).
std::string gridline(double y, double x0, double x1, double label_x, std::string_view label,
                     std::string_view anchor = "start");

// A value axis from 0 to `top` in steps of 1, 2, 2.5 or 5 × 10^k: the smallest such step that
// needs at most `max_ticks` steps to reach max_value, and top the first multiple of it at or
// above max_value. max_value <= 0 (nothing to show) gives top 1, step 0.25.
struct Scale {
  double top = 1, step = 0.25;
};
Scale nice_scale(double max_value, int max_ticks = 5);

// A tick value with as many decimals as `step` needs: 20 for step 5, 2.5 for step 2.5, 0.25 for
// step 0.25.
std::string tick_label(double value, double step);

}  // namespace strata::svg
