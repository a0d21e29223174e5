#!/usr/bin/env bash
# The demo: on a fresh Debian 12 machine too, installs the Debian packages
# that are missing, builds dlasync and its examples (Release, in build-demo/),
# and runs the data-pipeline example on the default device: the first real
# GPU when there is one, else the host. Arguments go to the pipeline:
#
#   scripts/demo.sh                  10 s on the default device
#   scripts/demo.sh --sim_gpus=2     onto simulated GPUs (no GPU needed)
#   scripts/demo.sh --help           the pipeline's flags
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++-12 \
  -DDLASYNC_BUILD_TESTS=OFF -DDLASYNC_BUILD_EXAMPLES=ON -DDLASYNC_BUILD_BENCH=OFF >/dev/null
cmake --build build-demo --parallel "$(nproc)" --target dlasync_pipeline
exec build-demo/examples/dlasync_pipeline "$@"
