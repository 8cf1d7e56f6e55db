# Sourced by the device scripts that run llama.cpp beside strata (cpu-scaling.sh, cpu-bench-ab.sh,
# cuda-bench-gpu.sh, cuda-bench-peer.sh, cuda-bench-flagship.sh): one recipe for building its
# llama-bench from the peer's source, node-llama-cpp 3.21.1's bundled llama.cpp, which
# ../shared/device/make-kit.sh packs into .device/peer/llama-src.tar.xz (LLAMA_SRC overrides).
#
# start_llama_build KIND DIR DONE LOG JOBS
#   Starts the build in the background in its own session (setsid: it outlives a device call, so
#   a later call on the warm machine finds it) and returns at once. KIND is cpu (GGML_NATIVE, no
#   CUDA) or cuda (GGML_NATIVE, sm_90a); the source goes to DIR, the binary to
#   DIR/build/bin/llama-bench; DONE is touched when the build has ended, whatever its result
#   (check the binary); the build's output goes to LOG; JOBS parallel jobs. Sets
#   LLAMA_BUILD_PID, the session's leader: `kill -- -$LLAMA_BUILD_PID` stops the whole build.
start_llama_build() {
  local kind=$1 dir=$2 done=$3 log=$4 jobs=$5 cuda
  case "$kind" in
    cpu) cuda="-DGGML_CUDA=OFF" ;;
    cuda) cuda="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a" ;;
    *) echo "start_llama_build: KIND is cpu or cuda, found '$kind'" >&2; return 2 ;;
  esac
  rm -f "$done"
  mkdir -p "$dir"
  setsid bash -c "tar xJf '${LLAMA_SRC:-.device/peer/llama-src.tar.xz}' -C '$dir' && cd '$dir' &&
    cmake -B build -G Ninja $cuda -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >'$log' 2>&1 &&
    cmake --build build --target llama-bench -j $jobs >>'$log' 2>&1; touch '$done'" \
    </dev/null >/dev/null 2>&1 &
  LLAMA_BUILD_PID=$!
}
