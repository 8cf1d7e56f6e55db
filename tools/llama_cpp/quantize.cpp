// llama_cpp_quantize — re-quantizes a GGUF with llama.cpp's own quantizer (llama_model_quantize of
// the prebuilt libllama that node-llama-cpp@3.21.1 ships), so strata can be checked on files made
// exactly as llama-quantize makes them (tests/llama_cpp/llama_cpp_quantized_parity_test.cpp).
//
// Usage: llama_cpp_quantize LIBLLAMA.so IN.gguf OUT.gguf FTYPE [NTHREAD [requantize]]
//   FTYPE is llama.h's public llama_ftype number (ALL_F32 = 0, MOSTLY_Q4_1 = 3, Q5_0 = 8,
//   Q5_1 = 9, Q3_K_M = 12, Q5_K_M = 17, IQ4_NL = 25, IQ4_XS = 30, ...). "requantize" sets
//   allow_requantize, which lets FTYPE 0 turn a quantized file into F32 with ggml's own
//   dequantizers (the reference the parity test compares strata's dequantization with).
//   Exit status 0 on success.
//
// The library is dlopen()ed at run time: llama.cpp is never vendored or built here, and none of its
// headers is copied. The two entry points are declared by hand:
//   uint32_t llama_model_quantize(const char* in, const char* out,
//                                 const llama_model_quantize_params* params);   // 0 = success
//   llama_model_quantize_params llama_model_quantize_default_params(void);
// Only the first fields of the params struct are touched, as llama.h declares them:
// `int32_t nthread; llama_ftype ftype; ggml_type output_tensor_type; ggml_type
// token_embedding_type; bool allow_requantize;` (enums of int size, so the bool is at byte 16). The
// struct is larger than 16 bytes, so the x86-64 SysV ABI returns it through a caller-provided
// buffer (hidden pointer); declaring the return type as a 4 KiB buffer makes that buffer generously
// larger than the real struct (about 100 bytes in v0.4.0), and the fields after the first two keep
// llama.cpp's own defaults.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct alignas(16) QuantizeParamsBuffer {
  unsigned char bytes[4096];
};
static_assert(sizeof(QuantizeParamsBuffer) > 16, "must be returned in memory (sret)");

using DefaultParamsFn = QuantizeParamsBuffer (*)();
using QuantizeFn = uint32_t (*)(const char*, const char*, const void*);

int parse_int(const char* text, const char* what) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value > 1024) {
    std::fprintf(stderr, "llama_cpp_quantize: %s: expected a number in 0..1024, found '%s'\n", what,
                 text);
    std::exit(2);
  }
  return int(value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 7 || (argc == 7 && std::strcmp(argv[6], "requantize") != 0)) {
    std::fprintf(stderr, "usage: %s LIBLLAMA.so IN.gguf OUT.gguf FTYPE [NTHREAD [requantize]]\n",
                 argv[0]);
    return 2;
  }
  const int ftype = parse_int(argv[4], "FTYPE");
  const int nthread = argc >= 6 ? parse_int(argv[5], "NTHREAD") : 2;
  const bool allow_requantize = argc == 7;
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "llama_cpp_quantize: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto default_params =
      reinterpret_cast<DefaultParamsFn>(dlsym(library, "llama_model_quantize_default_params"));
  auto quantize = reinterpret_cast<QuantizeFn>(dlsym(library, "llama_model_quantize"));
  if (default_params == nullptr || quantize == nullptr) {
    std::fprintf(stderr, "llama_cpp_quantize: %s lacks llama_model_quantize*: %s\n", argv[1],
                 dlerror());
    return 1;
  }
  QuantizeParamsBuffer params = default_params();
  const int32_t fields[2] = {nthread, ftype};
  std::memcpy(params.bytes, fields, sizeof fields);
  if (allow_requantize) params.bytes[16] = 1;
  const uint32_t status = quantize(argv[2], argv[3], &params);
  if (status != 0) {
    std::fprintf(stderr,
                 "llama_cpp_quantize: llama_model_quantize(%s -> %s, ftype %d) returned %u\n",
                 argv[2], argv[3], ftype, status);
    return 1;
  }
  // The library stays loaded until exit: ggml's backends register atexit handlers.
  return 0;
}
