#!/usr/bin/env bash
# Builds dlasync and runs its test suite, on a fresh Debian 12 machine too:
# installs the Debian packages that are missing, configures, builds, and runs
# ctest.
#
#   scripts/run-tests.sh                    plain build in build/
#   scripts/run-tests.sh --sanitize address ASan+UBSan build in build-asan/
#   scripts/run-tests.sh --sanitize thread  TSan build in build-tsan/
#
# The remote component (remote/) is built with UCX, and its two-process
# tests run over UCX's shared-memory and TCP transports on loopback.
#
# The Python module (python/) is built and its pytest suite run by ctest in
# every build, with Debian's Python (/usr/bin/python3) and its NumPy and
# PyTorch, then again with today's peers from PyPI in a virtual environment
# (scripts/python-peers.sh); in the sanitized builds the sanitizer's runtime
# is preloaded into it. The plain build also installs it with pip into a
# virtual environment (the pip_install test).
#
# CUDA support is built when a CUDA toolkit is found (also at /usr/local/cuda
# when nvcc is not on PATH); tests that need a GPU skip themselves without one.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="${2:?--sanitize needs address or thread}"; shift 2 ;;
    *) echo "usage: $0 [--sanitize address|thread]" >&2; exit 2 ;;
  esac
done

# The Python module's build and tests: Debian's pybind11, Python, pytest,
# NumPy and PyTorch (about 40 s and 650 MB the first time).
bash scripts/install-deps.sh pybind11-dev python3-dev python3-pytest python3-numpy python3-torch
# The pip_install test: a virtual environment, and pip building a wheel in it
# offline with Debian's setuptools (--no-build-isolation).
bash scripts/install-deps.sh python3-venv python3-pip python3-setuptools python3-wheel
# Today's Python peers from PyPI (NumPy 2, PyTorch 2, JAX, tvm-ffi,
# array-api-strict) in a virtual environment made once for every build
# (scripts/python-peers.sh): the Python suite runs with them as well.
# DLASYNC_PEERS=skip leaves them out, for a machine that cannot reach PyPI.
# The inference server's REST front is driven by Triton's client library,
# from an environment of its own (tests/examples/client-requirements.txt).
peers_python=""
clients_python=""
if [ "${DLASYNC_PEERS:-}" = skip ]; then
  echo "run-tests: DLASYNC_PEERS=skip: the Python suite runs with Debian's peers only," \
    "and the server's REST tests without tritonclient"
else
  peers_python="$(bash scripts/python-peers.sh)"
  clients_python="$(bash scripts/python-peers.sh build-peers/clients \
    tests/examples/client-requirements.txt)"
fi
# Remote imports (remote/) and their two-process tests: UCX, with
# ucx_perftest for the benchmarks; hiredis for the directory of names, and
# the Redis server its tests start.
bash scripts/install-deps.sh libucx-dev ucx-utils libhiredis-dev redis-server
# The inference server's REST front is driven by curl in its tests, and by
# h2load in its benchmark's smoke run.
bash scripts/install-deps.sh curl nghttp2-client

build_dir=build${sanitize:+-$sanitize}
[ "$sanitize" = address ] && build_dir=build-asan
[ "$sanitize" = thread ] && build_dir=build-tsan

# The benchmarks are built, and smoke-run once, in the plain build only.
# The sanitized builds compile at -O1, as the sanitizers' own documentation
# advises: a quarter less compile time than -O2, full debug information kept
# for their reports.
bench=ON
opt=()
if [ -n "$sanitize" ]; then
  bench=OFF
  opt=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG")
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=g++-12 -DDLASYNC_SANITIZE="$sanitize" -DDLASYNC_BUILD_BENCH=$bench \
  -DPYTHON_EXECUTABLE=/usr/bin/python3 -DDLASYNC_PEERS_PYTHON="$peers_python" \
  -DDLASYNC_CLIENTS_PYTHON="$clients_python" "${opt[@]}"
cmake --build "$build_dir" --parallel "$(nproc)"
# ASan: LeakSanitizer's suppressions cover UCX's own leaks only.
if [ "$sanitize" = address ]; then
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp ${LSAN_OPTIONS:-}"
fi
# TSan: the suppressions cover Debian's uninstrumented abseil only.
if [ "$sanitize" = thread ]; then
  export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}"
  # UCX patches madvise (its memory hooks), which glibc calls as a thread
  # exits, after TSan has let go of the thread: a crash. No hooks under TSan.
  export UCX_MEM_MMAP_HOOK_MODE=none
fi
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)" --timeout 300
