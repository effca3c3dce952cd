#!/usr/bin/env bash
# Packs Loom's binaries from a build folder, with the shared libraries they
# need beyond glibc, for a machine without Loom's build dependencies (the GPU
# machine of the device tool):
#
#   tools/bench/make_bundle.sh BUILD_DIR OUT.txz [binary...]
#
# Binaries default to tools/loom and every tests/loom_*tests and
# tools/bench/loom_*bench that the build folder has. The archive unpacks to
# bundle/ (the binaries) and bundle/lib/; run with LD_LIBRARY_PATH=bundle/lib.
set -euo pipefail
build="$1"
out="$2"
shift 2
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bundle/lib"
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  bins=("$build/tools/loom")
  for f in "$build"/tests/loom_*tests "$build"/tools/bench/loom_*bench; do
    [ -x "$f" ] && bins+=("$f")
  done
fi
for b in "${bins[@]}"; do
  cp "$b" "$stage/bundle/"
  # Every resolved library but glibc's own and the dynamic loader.
  ldd "$b" | awk '$3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -Ln "$lib" "$stage/bundle/lib/"; done
done
tar -C "$stage" -cJf "$out" bundle
ls -l "$out"
