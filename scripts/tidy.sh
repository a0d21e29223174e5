#!/usr/bin/env bash
# clang-tidy over the library's sources (runtime/, transfer/, remote/, python/), with the
# checks of .clang-tidy and warnings as errors. Configures build-tidy/ for
# its compile commands (no build needed) and runs one clang-tidy a core.
#
#   scripts/tidy.sh [files...]   default: every .cpp of runtime/, transfer/, remote/ and python/
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh clang-tidy-14 pybind11-dev python3-dev
cmake -S . -B build-tidy -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=g++-12 \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=OFF \
  -DDLASYNC_BUILD_PYTHON=ON -DPYTHON_EXECUTABLE=/usr/bin/python3 \
  >/dev/null
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files 'runtime/*.cpp' 'transfer/*.cpp' 'remote/*.cpp' 'python/*.cpp')
fi
# g++'s warning flags are not all clang's: those unknown to clang are not
# findings.
status=0
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy-14 -p build-tidy --quiet \
  --extra-arg=-Wno-unknown-warning-option >build-tidy/tidy.log 2>&1 || status=$?
grep -v '^[0-9]* warnings\? \(and [0-9]* errors\? \)\?generated' build-tidy/tidy.log || true
if [ "$status" -eq 0 ]; then
  echo "tidy: ${#files[@]} files clean"
else
  echo "tidy: findings above (warnings are errors)"
fi
exit "$status"
