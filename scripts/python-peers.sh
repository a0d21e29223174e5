#!/usr/bin/env bash
# Makes the virtual environment of today's Python peers from PyPI
# (tests/python/peers-requirements.txt: NumPy 2, PyTorch 2, JAX, tvm-ffi,
# array-api-strict) and prints its interpreter. Debian's /usr/bin/python3 is
# left as it is (PEP 668): the environment is made with --system-site-packages,
# so Debian's pytest serves it, and the pinned peers shadow Debian's old ones.
#
#   scripts/python-peers.sh [DIR [REQUIREMENTS]]
#       default DIR: build-peers/venv, REQUIREMENTS: tests/python/peers-requirements.txt
#
# The inference server's clients (tritonclient) have an environment of their
# own, made the same way from tests/examples/client-requirements.txt.
#
# Made once, and again only when the requirements change (a stamp holds their
# hash). PyTorch's wheel pulls NVIDIA's CUDA libraries: about 6 GB, and a
# minute on a fast link.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${1:-build-peers/venv}"
requirements="${2:-tests/python/peers-requirements.txt}"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
stamp="$venv/.dlasync-requirements"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  bash scripts/install-deps.sh python3-venv python3-pip python3-pytest >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$requirements" >&2; then
    rm -rf "$venv"
    echo "python-peers: pip could not install $requirements (is PyPI reachable?);" \
      "DLASYNC_PEERS=skip runs the tests with Debian's peers only" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
# The pins took: a peer Debian also has must come from the environment.
"$venv/bin/python" - "$requirements" >&2 <<'PY'
import importlib.metadata as md
import sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    name = name.split("[")[0]  # an extra ("pkg[extra]") is the package's
    got = md.version(name)
    if got != version:
        sys.exit(f"python-peers: {name} is {got} in the environment, {version} was asked for")
PY
echo "$PWD/$venv/bin/python"
