# The layers of src/ (issue 19 item 6), declared once, lowest first.
#
# A layer is one folder of src/ (its subfolders included, unless one is a layer of its own:
# compute/cuda) built as one static library, strata_<name>, that links exactly the layers after
# DEPENDS. Every one of them must be declared above it, so the libraries form a DAG in this order
# and a lower folder can never link a higher one. What a folder's files may #include is the same
# set: the layers it depends on, directly or through them (ctest Layering.*, tests/layering/, also
# checks the libraries' undefined symbols against it).
#
# The order, and why each layer sits where it does:
#   util      error type, fp16, atomic files, byte sizes, progress, the plots' SVG pieces: no strata
#             dependency.
#   quant     ggml block formats and their kernels (scalar, AVX2, AVX-512).
#   gguf      the GGUF reader and writer; tensor types are quant's.
#   text      tokenizer (its vocabulary comes from a GGUF), chat templates, Unicode.
#   convert   Hugging Face checkpoints -> GGUF (gguf's writer, quant's quantizers).
#   compute   the CPU kernels (compute/cpu: thread pool, matmul, ops, gemm, workspace) and the
#             Backend interface (compute/backend.h, expert_tier.h). The interface only declares the
#             layer structs it passes through (weights, states, layers/dims.h); it uses none.
#   experts   expert sidecar, arena, residency, I/O pool, ExpertStore: it takes an expert layout
#             (compute/expert_tier.h), never the model.
#   route     MoCE, routing traces, cache replay: they read experts/' residency and statistics.
#   layers    the shared blocks on compute/cpu's kernels, sized by their own dims
#             (layers/dims.h); moe reads experts through experts/ and routes with route/.
#   backends  the CPU backend (it wraps layers/) and the registry that makes a backend by name.
#   cuda      compute/cuda, the CUDA backend (OPTIONAL: built where STRATA_CUDA_ENABLED; only the
#             strata binary, cuda tests and benches link it, so strata_core never needs CUDA).
#   model     architectures: hyper-parameters, the tensor table, the layer sequence on a Backend.
#   synth     synthetic GGUF models from an architecture's tensor table (and convert's tokenizer).
#   engine    Session, WindowRunner, Sampler.
#   spec      drafters, acceptance, SpecGate, SpecDecoder on engine's Session and Sampler.
#   decode    the generation loop and the conversation state cache: they drive spec/, so they
#             cannot live in engine/ (moved from there to break the engine <-> spec cycle).
#   grammar   JSON schema / GBNF -> grammar, its matcher and token masks (an engine SamplingConstraint).
#   serve     the HTTP server.
#   cli       the `strata` executable (a target of its own, not a library).
#
# strata_layer(<name> FOLDER <path under src/> [DEPENDS <layers>...] [OPTIONAL] [EXECUTABLE])

set(STRATA_LAYERS "")

function(strata_layer name)
  cmake_parse_arguments(L "OPTIONAL;EXECUTABLE" "FOLDER" "DEPENDS" ${ARGN})
  if(NOT L_FOLDER OR L_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "strata_layer(${name}): expected FOLDER <path> [DEPENDS ...] [OPTIONAL] [EXECUTABLE]")
  endif()
  if(name IN_LIST STRATA_LAYERS)
    message(FATAL_ERROR "strata_layer(${name}): declared twice")
  endif()
  set(below "")
  foreach(dep IN LISTS L_DEPENDS)
    if(NOT dep IN_LIST STRATA_LAYERS)
      message(FATAL_ERROR "strata_layer(${name}): depends on '${dep}', which is not declared above it "
                          "(cmake/StrataLayers.cmake: a layer may depend only on the layers below it)")
    endif()
    if(STRATA_LAYER_${dep}_EXECUTABLE)
      message(FATAL_ERROR "strata_layer(${name}): '${dep}' is an executable, not a library")
    endif()
    list(APPEND below ${dep} ${STRATA_LAYER_${dep}_BELOW})
  endforeach()
  list(REMOVE_DUPLICATES below)
  list(APPEND STRATA_LAYERS ${name})
  set(STRATA_LAYERS ${STRATA_LAYERS} PARENT_SCOPE)
  set(STRATA_LAYER_${name}_FOLDER ${L_FOLDER} PARENT_SCOPE)
  set(STRATA_LAYER_${name}_DEPENDS ${L_DEPENDS} PARENT_SCOPE)
  set(STRATA_LAYER_${name}_BELOW ${below} PARENT_SCOPE)
  set(STRATA_LAYER_${name}_OPTIONAL ${L_OPTIONAL} PARENT_SCOPE)
  set(STRATA_LAYER_${name}_EXECUTABLE ${L_EXECUTABLE} PARENT_SCOPE)
endfunction()

strata_layer(util     FOLDER util)
strata_layer(quant    FOLDER quant    DEPENDS util)
strata_layer(gguf     FOLDER gguf     DEPENDS quant util)
strata_layer(text     FOLDER text     DEPENDS gguf util)
strata_layer(convert  FOLDER convert  DEPENDS gguf quant util)
strata_layer(compute  FOLDER compute  DEPENDS quant util)
strata_layer(experts  FOLDER experts  DEPENDS compute gguf quant util)
strata_layer(route    FOLDER route    DEPENDS experts util)
strata_layer(layers   FOLDER layers   DEPENDS route experts compute gguf quant util)
strata_layer(backends FOLDER backends DEPENDS layers compute quant util)
strata_layer(cuda     FOLDER compute/cuda OPTIONAL
                      DEPENDS backends layers experts compute quant util)
strata_layer(model    FOLDER model    DEPENDS backends layers experts compute gguf quant util)
strata_layer(synth    FOLDER synth    DEPENDS model convert gguf quant util)
strata_layer(engine   FOLDER engine   DEPENDS model backends experts compute util)
strata_layer(spec     FOLDER spec     DEPENDS engine experts compute util)
strata_layer(decode   FOLDER decode   DEPENDS spec engine util)
strata_layer(grammar  FOLDER grammar  DEPENDS engine text util)
strata_layer(serve    FOLDER serve
                      DEPENDS grammar decode spec engine model route experts text gguf compute util)
strata_layer(cli      FOLDER cli      EXECUTABLE
                      DEPENDS cuda serve grammar decode spec engine synth model route experts
                              compute convert text gguf quant backends util)

# The layer's library, from a src/<folder>/CMakeLists.txt: strata_layer_library(<name> <sources>...).
# Links the layers it DEPENDS on (PUBLIC: their headers are part of its interface).
function(strata_layer_library name)
  if(NOT name IN_LIST STRATA_LAYERS OR STRATA_LAYER_${name}_EXECUTABLE)
    message(FATAL_ERROR "strata_layer_library(${name}): no such library layer in cmake/StrataLayers.cmake")
  endif()
  add_library(strata_${name} STATIC ${ARGN})
  target_include_directories(strata_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(strata_${name} PRIVATE ${STRATA_FUZZ_COVERAGE_FLAGS})
  # Unity batches (STRATA_UNITY, top-level CMakeLists): not for CUDA's library, whose .cu files
  # nvcc compiles one by one. Sources with their own COMPILE_OPTIONS (the AVX kernels) are never
  # batched by CMake.
  if(STRATA_UNITY AND NOT name STREQUAL "cuda")
    set_target_properties(strata_${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
  strata_link_layers(strata_${name} PUBLIC ${name})
endfunction()

# Links `target` with the libraries of the layers `layer` DEPENDS on (an optional one only where
# it is built).
function(strata_link_layers target scope layer)
  foreach(dep IN LISTS STRATA_LAYER_${layer}_DEPENDS)
    if(TARGET strata_${dep})
      target_link_libraries(${target} ${scope} strata_${dep})
    elseif(NOT STRATA_LAYER_${dep}_OPTIONAL)
      message(FATAL_ERROR "layer ${layer}: the library of '${dep}' (below it) was not built")
    endif()
  endforeach()
endfunction()

# The table the Layering tests read (tests/layering/layering_test.cpp): one line per layer,
#   <name>|<folder>|<layers below it, comma-separated>|<its library file, or empty>
function(strata_write_layer_table path)
  set(content "")
  foreach(name IN LISTS STRATA_LAYERS)
    string(REPLACE ";" "," below "${STRATA_LAYER_${name}_BELOW}")
    set(library "")
    if(TARGET strata_${name} AND NOT STRATA_LAYER_${name}_EXECUTABLE)
      set(library "$<TARGET_FILE:strata_${name}>")
    endif()
    string(APPEND content "${name}|${STRATA_LAYER_${name}_FOLDER}|${below}|${library}\n")
  endforeach()
  file(GENERATE OUTPUT ${path} CONTENT "${content}")
endfunction()
