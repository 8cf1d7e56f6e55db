// WebAsset — the browser page (`GET /`: chat and the expert dashboard), compiled into the binary.
//
// The files under src/serve/web/ are turned into byte arrays at build time by
// src/serve/web/embed_web.cmake (CMake only: nothing is fetched, no JavaScript toolchain), so
// `strata serve` needs no files next to it and the page works with no network access: it loads
// nothing from elsewhere (no CDN, no web fonts). Immutable data; safe from any thread.
#pragma once

#include <span>
#include <string_view>

namespace strata::serve {

struct WebAsset {
  std::string_view path;          // URL path ("/", "/app.js")
  std::string_view content_type;  // "text/html; charset=utf-8"
  std::string_view body;
  std::string_view etag;  // quoted, from the file's SHA-256: "\"0123456789abcdef\""
};

// Every embedded file (generated source).
std::span<const WebAsset> web_assets();

// The asset served at `path`, or nullptr.
inline const WebAsset* find_web_asset(std::string_view path) {
  for (const WebAsset& asset : web_assets())
    if (asset.path == path) return &asset;
  return nullptr;
}

}  // namespace strata::serve
