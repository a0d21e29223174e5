#!/usr/bin/env bash
# clang-tidy over the library's sources (runtime/, transfer/, remote/, python/) and over
# tests/, examples/ and bench/, with the checks of .clang-tidy and warnings as errors.
# Configures build-tidy/ (tests, examples and benchmarks on) and, for the libFuzzer
# targets, build-tidy-fuzz/ (clang) for their compile commands (no build needed), and
# runs one clang-tidy a core.
#
#   scripts/tidy.sh [files...]   default: every tracked .cpp that a compile database holds
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh clang-tidy-14 clang-14 pybind11-dev python3-dev
cmake -S . -B build-tidy -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=g++-12 \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDLASYNC_BUILD_TESTS=ON -DDLASYNC_BUILD_EXAMPLES=ON \
  -DDLASYNC_BUILD_BENCH=ON -DDLASYNC_BUILD_PYTHON=ON -DPYTHON_EXECUTABLE=/usr/bin/python3 \
  >/dev/null
# The fuzzers build only with clang and DLASYNC_FUZZ (scripts/fuzz.sh's configuration).
cmake -S . -B build-tidy-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDLASYNC_FUZZ=ON -DDLASYNC_WITH_CUDA=OFF \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=OFF >/dev/null
# Sources that the builds generate (the inference server's gRPC messages, from
# its .proto) are made, as tidy reads the files that include them.
cmake --build build-tidy --target dlasync_examples_kserve_proto_sources >/dev/null
cmake --build build-tidy-fuzz --target dlasync_fuzz_kserve_proto_sources >/dev/null

# Which database compiles each file: "<build folder> <file>" lines, the fuzzers' from
# build-tidy-fuzz. A tracked source no database holds is named, not checked.
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files 'runtime/*.cpp' 'transfer/*.cpp' 'remote/*.cpp' \
    'python/*.cpp' 'tests/*.cpp' 'examples/*.cpp' 'bench/*.cpp')
fi
mapfile -t jobs < <(/usr/bin/python3 - "${files[@]}" <<'PY'
import json, os, sys
held = {}
for build in ("build-tidy-fuzz", "build-tidy"):
    for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
        held[os.path.realpath(entry["file"])] = build
for name in sys.argv[1:]:
    build = held.get(os.path.realpath(name))
    print(f"{build} {name}" if build else f"- {name}")
PY
)
checked=0
: >build-tidy/tidy.jobs
for job in "${jobs[@]}"; do
  if [ "${job%% *}" = "-" ]; then
    echo "tidy: ${job#- } is in no compile database (another project, or a missing package); not checked"
  else
    echo "$job" >>build-tidy/tidy.jobs
    checked=$((checked + 1))
  fi
done
# g++'s warning flags are not all clang's: those unknown to clang are not
# findings. Asio looks for clang's coroutines only in libc++; clang 14 has C++20's
# with libstdc++ (as tests/fuzz/CMakeLists.txt says), so the coroutines are checked
# rather than compiled out.
status=0
xargs -P "$(nproc)" -L 1 sh -c 'clang-tidy-14 -p "$0" --quiet \
  --extra-arg=-Wno-unknown-warning-option --extra-arg=-DASIO_HAS_CO_AWAIT=1 "$1"' <build-tidy/tidy.jobs \
  >build-tidy/tidy.log 2>&1 || status=$?
grep -v '^[0-9]* warnings\? \(and [0-9]* errors\? \)\?generated' build-tidy/tidy.log || true
if [ "$status" -eq 0 ]; then
  echo "tidy: $checked files clean"
else
  echo "tidy: findings above (warnings are errors)"
fi
exit "$status"
