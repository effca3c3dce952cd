#!/usr/bin/env bash
# Loom's set-up script (Debian 12; Ubuntu 24.04 too). Entry points:
#   packaging/dev.sh run [MODEL.gguf]   install dependencies, build loom + loom-chat, start Loom
#   packaging/dev.sh test               install dependencies, build and run every test
#   packaging/dev.sh deb                build build/loom_<version>_amd64.deb and check it with lintian
# Environment: LOOM_JOBS (parallel jobs, default nproc), LOOM_SKIP_APT=1 (skip apt-get),
# LOOM_FUZZ_SECONDS (fuzzing time in `test`, default 60).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
jobs="${LOOM_JOBS:-$(nproc)}"

# Debian 12 packages. Build tools, then libraries (see docs/ARCHITECTURE.md).
# ocl-icd-opencl-dev: Debian's oneDNN CMake config requires OpenCL, which libdnnl-dev
# only recommends.
packages=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libgtest-dev nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libxxhash-dev libcli11-dev libdnnl-dev
  ocl-icd-opencl-dev
  mesa-vulkan-drivers libvulkan-dev glslc vulkan-validationlayers
  libsqlite3-dev liburing-dev qt6-base-dev qt6-charts-dev libqt6opengl6-dev qt6-svg-dev fonts-inter xvfb xauth
)
# What `deb` needs besides: dpkg-shlibdeps (dpkg-dev, file), man pages, lintian, AppStream.
deb_packages=(dpkg-dev file help2man lintian appstream)

# Warnings are errors where CI proves the build free of them (Debian 12's compilers): there
# `run`, `test` and `deb` build with the same flags in one folder (build/), so `test` after
# `run` compiles only the tests. Elsewhere `run` and `deb` leave warnings as warnings and
# `test` builds apart, in build-ci/, with warnings as errors.
werror=OFF

# Supported systems: Debian 12, and Ubuntu 24.04 (where clang's sanitizer runtime has
# another name). Anywhere else, say what is needed and stop before building anything.
check_system() {
  local id="" version=""
  if [ -r /etc/os-release ]; then
    id="$(. /etc/os-release && echo "${ID:-}")"
    version="$(. /etc/os-release && echo "${VERSION_ID:-}")"
  fi
  case "$id $version" in
    "debian 12") werror=ON ;;
    "ubuntu 24.04") packages=("${packages[@]/libclang-rt-14-dev/libclang-rt-dev}") ;;
    *)
      [ "${LOOM_SKIP_APT:-0}" = 1 ] && return 0
      echo "dev.sh: this is ${id:-an unknown system} ${version}, not Debian 12 or Ubuntu 24.04." >&2
      echo "  Loom needs (Debian 12 names): ${packages[*]}" >&2
      echo "  and for the .deb: ${deb_packages[*]}." >&2
      echo "  Install their equivalents, then run again with LOOM_SKIP_APT=1." >&2
      exit 1
      ;;
  esac
}

# The CUDA toolkit is not a Debian package; where it sits at its usual prefix, use it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi

install_deps() {  # package...
  [ "${LOOM_SKIP_APT:-0}" = 1 ] && return 0
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "==> installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

configure() {  # dir, extra cmake args...
  local dir="$1"
  shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
}

configure_build() {  # dir, extra cmake args...
  configure "$@"
  cmake --build "$1" -j "$jobs"
}

cmd_run() {
  install_deps "${packages[@]}"
  # Only what is started: loom and loom-chat, no test suites.
  configure build -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR="$werror" -DLOOM_TESTS=OFF
  local targets=(loom)
  grep -q '^LOOM_GUI:BOOL=ON' build/CMakeCache.txt && targets+=(loom-chat)
  cmake --build build -j "$jobs" --target "${targets[@]}"
  local model="${1:-}"
  # The desktop app when it was built and there is a display to show it on.
  if [ -x ./build/app/loom-chat ]; then
    if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
      if [ -n "$model" ]; then exec ./build/app/loom-chat "$model"; fi
      exec ./build/app/loom-chat --demo  # writes the demo model on first use
    fi
    echo "==> loom-chat needs a desktop session (or: xvfb-run -a ./build/app/loom-chat --demo)."
    echo "    A preview without one: ./build/app/loom-chat --screenshot loom-demo.png --demo"
    echo "    Meanwhile, the same engine from the command line:"
  fi
  if [ -z "$model" ]; then
    # No model given: the built-in demo model (random weights, plainly labelled).
    model="${XDG_CACHE_HOME:-$HOME/.cache}/loom/demo-stories-like.gguf"
    if [ ! -f "$model" ]; then
      mkdir -p "$(dirname "$model")"
      ./build/tools/loom synth --preset stories-like --dtype q8_0 --seed 1 --out "$model"
    fi
    echo "==> demo model (random weights, not a trained model): $model"
  fi
  ./build/tools/loom info "$model"
  ./build/tools/loom run -m "$model" -p "Hello from Loom!" -n 32
}

cmd_test() {
  install_deps "${packages[@]}"
  # 1. Release build, warnings as errors, every test (fixture tests skip when ../shared is absent).
  local rel=build-ci
  [ "$werror" = ON ] && rel=build  # the same flags as `run`: its objects are reused
  echo "==> [$(date +%T)] release build with the tests ($rel/)"
  configure_build "$rel" -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON -DLOOM_TESTS=ON
  echo "==> [$(date +%T)] release tests"
  ctest --test-dir "$rel" --output-on-failure -j "$jobs"

  # 2. AddressSanitizer + UndefinedBehaviorSanitizer (clang) on the engine and storage
  #    tests, with libFuzzer coverage so the same objects serve the GGUF fuzzer. The GUI
  #    and CUDA (nvcc, no device here) are left out: their tests ran above.
  echo "==> [$(date +%T)] sanitizer build"
  CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOOM_WERROR=ON -DLOOM_SANITIZE=ON -DLOOM_FUZZ=ON -DLOOM_GUI=OFF -DLOOM_CUDA=OFF >/dev/null
  cmake --build build-asan -j "$jobs"
  echo "==> [$(date +%T)] sanitizer tests"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"

  # 3. Fuzz the GGUF reader for a bounded time, seeded with synthetic and fixture files.
  local corpus=build-asan/fuzz-corpus
  mkdir -p "$corpus"
  local tiny=(--layers 1 --dim 32 --ffn 32 --heads 2 --kv-heads 1)
  "./$rel/tools/loom" synth "${tiny[@]}" --dtype q8_0 --out "$corpus/seed-llama.gguf" 2>/dev/null
  "./$rel/tools/loom" synth "${tiny[@]}" --arch qwen2 --dtype f16 --out "$corpus/seed-qwen2.gguf" 2>/dev/null
  [ -d ../shared/fixtures/llama.cpp-vocab ] && cp ../shared/fixtures/gguf/stories260K.gguf "$corpus/" 2>/dev/null || true
  ASAN_OPTIONS=detect_leaks=1 ./build-asan/tests/loom_fuzz_gguf "$corpus" \
    -max_total_time="${LOOM_FUZZ_SECONDS:-60}" -max_len=65536 -malloc_limit_mb=256 \
    -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 15
  echo "fuzz: no crash in ${LOOM_FUZZ_SECONDS:-60} s"

  # 4. The safetensors reader the same way, seeded with a synthetic model's shards.
  local st_corpus=build-asan/fuzz-corpus-safetensors
  mkdir -p "$st_corpus"
  "./$rel/tools/loom" synth "${tiny[@]}" --dtype bf16 --format safetensors --shard-mib 1 \
    --out build-asan/fuzz-seed-hf 2>/dev/null
  cp build-asan/fuzz-seed-hf/*.safetensors "$st_corpus/"
  ASAN_OPTIONS=detect_leaks=1 ./build-asan/tests/loom_fuzz_safetensors "$st_corpus" \
    -max_total_time="${LOOM_FUZZ_ST_SECONDS:-30}" -max_len=65536 -malloc_limit_mb=256 \
    -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 15
  echo "fuzz (safetensors): no crash in ${LOOM_FUZZ_ST_SECONDS:-30} s"
}

cmd_deb() {
  install_deps "${packages[@]}" "${deb_packages[@]}"
  configure_build build -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR="$werror" -DLOOM_TESTS=OFF
  rm -f build/loom_*.deb
  (cd build && cpack --config CPackConfig.cmake >/dev/null)
  local deb
  deb="$(ls build/loom_*_amd64.deb)"
  echo "==> $deb ($(du -k "$deb" | cut -f1) KiB)"
  dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
  dpkg-deb --contents "$deb" | awk '{print $6}'
  if command -v appstreamcli >/dev/null 2>&1; then
    local tmp
    tmp="$(mktemp -d)"
    dpkg-deb -x "$deb" "$tmp"
    appstreamcli validate --no-net --explain "$tmp"/usr/share/metainfo/*.metainfo.xml || {
      rm -rf "$tmp"
      return 1
    }
    rm -rf "$tmp"
  fi
  # lintian: errors fail the build; warnings are printed.
  local report
  report="$(lintian --allow-root --no-tag-display-limit "$deb" 2>&1 || true)"
  [ -n "$report" ] && echo "$report"
  if echo "$report" | grep -q '^E: '; then
    echo "dev.sh: lintian found errors in $deb" >&2
    return 1
  fi
  echo "==> lintian: no errors"
}

check_system
case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  test) shift; cmd_test "$@" ;;
  deb) shift; cmd_deb "$@" ;;
  *) echo "usage: $0 run [MODEL.gguf] | test | deb" >&2; exit 2 ;;
esac
