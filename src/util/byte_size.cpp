#include "util/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include "util/error.h"

namespace strata {

uint64_t parse_byte_size(std::string_view text, uint64_t percent_of, std::string_view what) {
  auto bad = [&]() -> uint64_t {
    fail("{}: expected a size like 8G, 512M, 1073741824 or 25%, found '{}'", what, text);
  };
  if (text.empty()) return bad();
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || !std::isfinite(value) || value < 0) return bad();
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double bytes = 0;
  if (unit == "%") {
    if (value > 100) fail("{}: a percentage must be at most 100%, found '{}'", what, text);
    bytes = std::floor(double(percent_of) * value / 100.0);
  } else {
    double scale = 0;
    if (unit.empty() || unit == "b") scale = 1;
    else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
    else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
    else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
    else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
    else return bad();
    bytes = std::floor(value * scale);
  }
  if (bytes >= 1.8e19) return bad();
  return uint64_t(bytes);
}

}  // namespace strata
