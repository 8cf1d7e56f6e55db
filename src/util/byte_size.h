// Parsing sizes given on the command line: "8G", "512MiB", "1.5g", "123456", or "25%" (a share
// of a whole the caller supplies, e.g. the model's expert bytes).
#pragma once

#include <cstdint>
#include <string_view>

namespace strata {

// Decimal and binary suffixes both mean powers of 1024 (K, KB, KiB = 1024), as memory budgets
// are read. Throws strata::Error naming `what` (e.g. "--ram-budget") and the text when invalid.
uint64_t parse_byte_size(std::string_view text, uint64_t percent_of, std::string_view what);

}  // namespace strata
