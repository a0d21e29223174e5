#!/usr/bin/env bash
# dlasync's remote imports beside NIXL and Mooncake's transfer engine,
# moving the same sizes of host memory between two processes on this
# machine, alternated library by library, round by round (the machines are
# shared and noisy: a figure measured at another moment is no baseline).
#
#   bench/remote_libraries.sh BUILD_DIR [ROUNDS] [SIZES]
#       defaults: 3 rounds, sizes 65536,1048576,16777216,268435456
#
# Per round:
#   - dlasync: dlasync_bench_remote over shm and tcp (each import its whole
#     protocol, into new budgeted memory, 4 in flight), with ucx_perftest
#     interleaved as its own baseline;
#   - NIXL (UCX backend, its own UCX) over shm,tcp and over tcp;
#   - Mooncake's transfer engine over tcp;
# the libraries each with prepared, registered, warm buffers and one
# transfer in flight (bench/python/remote_peers.py says what they include).
# Then bundles: 64 members of 64 KiB, dlasync's --bundles=64 against 64
# descriptors in one batched transfer.
set -uo pipefail
build=${1:?usage: remote_libraries.sh BUILD_DIR [ROUNDS] [SIZES]}
rounds=${2:-3}
sizes=${3:-65536,1048576,16777216,268435456}
here=$(cd "$(dirname "$0")" && pwd)
bench="$build/bench/dlasync_bench_remote"
[ -x "$bench" ] || { echo "remote_libraries.sh: no $bench (build dlasync with UCX)" >&2; exit 2; }
peers="$here/python/remote_peers.sh"
export UCX_MEM_MMAP_HOOK_MODE=none
common=(--reps 3 --bytes_per_rep 268435456)
for r in $(seq 1 "$rounds"); do
  echo "=== round $r: dlasync (shm, tcp)"
  "$bench" --transports=shm,tcp --sizes="$sizes" --reps=3 2>&1 | grep -E "^(tls|shm|tcp) "
  echo "=== round $r: NIXL, UCX_TLS=shm,tcp"
  "$peers" --lib nixl --ucx_tls shm,tcp --sizes "$sizes" --count 1 "${common[@]}" 2>&1 |
    grep -E "^ +[0-9#]"
  echo "=== round $r: NIXL, UCX_TLS=tcp"
  "$peers" --lib nixl --ucx_tls tcp --sizes "$sizes" --count 1 "${common[@]}" 2>&1 |
    grep -E "^ +[0-9#]"
  echo "=== round $r: Mooncake, tcp"
  "$peers" --lib mooncake --sizes "$sizes" --count 1 "${common[@]}" 2>&1 | grep -E "^ +[0-9#]"
  echo "=== round $r: bundles of 64 x 64 KiB: dlasync (shm, tcp)"
  "$bench" --transports=shm,tcp --sizes=65536 --bundles=64 --reps=3 2>&1 |
    grep -E "^(bundles|member|[0-9]+ [KM]iB) "
  echo "=== round $r: bundles of 64 x 64 KiB: NIXL shm,tcp; NIXL tcp; Mooncake"
  "$peers" --lib nixl --ucx_tls shm,tcp --sizes 65536 --count 64 "${common[@]}" 2>&1 |
    grep -E "^ +[0-9]"
  "$peers" --lib nixl --ucx_tls tcp --sizes 65536 --count 64 "${common[@]}" 2>&1 |
    grep -E "^ +[0-9]"
  "$peers" --lib mooncake --sizes 65536 --count 64 "${common[@]}" 2>&1 | grep -E "^ +[0-9]"
done
