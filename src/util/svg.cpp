#include "util/svg.h"

#include <fmt/format.h>

#include <cmath>

namespace strata::svg {

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string open(double width, double height, std::string_view title, double title_x) {
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' font-family='sans-serif' "
      "font-size='12'>\n<rect width='{0}' height='{1}' fill='white'/>\n"
      "<text x='{2}' y='20' font-size='14'>{3}</text>\n",
      width, height, title_x, escape(title));
}

std::string gridline(double y, double x0, double x1, double label_x, std::string_view label,
                     std::string_view anchor) {
  return fmt::format(
      "<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/><text x='{}' "
      "y='{:.1f}'{}>{}</text>\n",
      x0, x1, y, y, label_x, y + 4,
      anchor == "start" ? std::string() : fmt::format(" text-anchor='{}'", escape(anchor)),
      escape(label));
}

Scale nice_scale(double max_value, int max_ticks) {
  if (!(max_value > 0) || !std::isfinite(max_value) || max_ticks < 1) return {};
  const double raw = max_value / max_ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  Scale s;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    s.step = m * magnitude;
    if (s.step * max_ticks >= max_value * (1 - 1e-9)) break;
  }
  s.top = std::ceil(max_value / s.step - 1e-9) * s.step;
  return s;
}

std::string tick_label(double value, double step) {
  int decimals = 0;
  // The fewest decimals that write the step exactly (2.5 → 1, 0.25 → 2), so every tick does.
  while (decimals < 6 && std::fabs(step * std::pow(10.0, decimals) -
                                   std::round(step * std::pow(10.0, decimals))) > 1e-6)
    ++decimals;
  return fmt::format("{:.{}f}", value, decimals);
}

}  // namespace strata::svg
