// LD_PRELOAD shim for the llama.cpp peer (node-llama-cpp 3.21.1's prebuilt libllama v0.4.0): returns
// llama_model_default_params() with use_extra_bufts = false, i.e. llama.cpp's `--no-repack`, which
// node-llama-cpp does not expose.  Without it, this CPU backend repacks every IQ4_NL tensor (the
// flagship's 640-wide ffn_down_exps) into an anonymous CPU_REPACK buffer at load: 450 MiB per layer,
// 21.1 GiB for the 48-layer flagship, more than this 24 GiB box can spare, so the mmapped run never
// starts (docs/bench-experts.md, "The flagship at full scale").  With the shim, every weight stays in
// the mmapped file, as llama.cpp runs a model larger than RAM.
// Build: cc -O2 -shared -fPIC -I LLAMA_SRC/include -I LLAMA_SRC/ggml/include bench/llama_no_repack.c -o /tmp/llama_no_repack.so -ldl
//   (LLAMA_SRC: `git clone tools/llama_cpp/node_modules/node-llama-cpp/llama/gitRelease.bundle`, for llama.h)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

// libllama is dlopen()ed by the addon (RTLD_LOCAL), so RTLD_NEXT cannot see it: open it by the path in
// LLAMA_LIB (already loaded: RTLD_NOLOAD returns its handle; else it is loaded here).
struct llama_model_params llama_model_default_params(void) {
  static struct llama_model_params (*real)(void) = 0;
  if (!real) {
    const char* lib = getenv("LLAMA_LIB");
    void* h = lib ? dlopen(lib, RTLD_LAZY | RTLD_NOLOAD) : 0;
    if (lib && !h) h = dlopen(lib, RTLD_LAZY);
    if (h) real = (struct llama_model_params (*)(void))dlsym(h, "llama_model_default_params");
    if (!real) real = (struct llama_model_params (*)(void))dlsym(RTLD_NEXT, "llama_model_default_params");
    if (!real) { fprintf(stderr, "llama_no_repack: cannot find llama_model_default_params (set LLAMA_LIB)\n"); abort(); }
  }
  struct llama_model_params p = real();
  p.use_extra_bufts = false;
  static int said = 0;
  if (!said++) fprintf(stderr, "llama_no_repack: llama_model_default_params: use_extra_bufts = false\n");
  return p;
}
