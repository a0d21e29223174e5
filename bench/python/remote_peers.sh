#!/usr/bin/env bash
# Runs remote_peers.py (NIXL and Mooncake's transfer engine between two
# local processes) in the environment that has them, which it makes first
# (scripts/python-peers.sh, build-peers/remote, from
# bench/python/remote-peers-requirements.txt).
#
#   bench/python/remote_peers.sh --lib nixl|mooncake [remote_peers.py options]
#
# Mooncake's engine.so loads libcuda.so.1 and libcudart.so.12 even where no
# GPU is used: libcuda.so.1 here is a link to the CUDA toolkit's stub driver
# (/usr/local/cuda/lib64/stubs/libcuda.so, whose every call fails: no GPU
# memory is touched), and the environment's nvidia-cuda-runtime-cu12 gives
# libcudart.so.12.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=build-peers/remote
py=$(cd "$root" && bash scripts/python-peers.sh "$venv" bench/python/remote-peers-requirements.txt)
stub="$root/$venv/cudastub"
if [ ! -e "$stub/libcuda.so.1" ]; then
  [ -e /usr/local/cuda/lib64/stubs/libcuda.so ] || {
    echo "remote_peers.sh: no CUDA toolkit stub driver at /usr/local/cuda/lib64/stubs" >&2
    exit 2
  }
  mkdir -p "$stub"
  ln -sf /usr/local/cuda/lib64/stubs/libcuda.so "$stub/libcuda.so.1"
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$stub:$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$py" "$here/remote_peers.py" "$@"
