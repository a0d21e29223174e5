#!/usr/bin/env bash
# `pip install` of the repository, as a Python user runs it, offline:
#   run_pip_install.sh <python> <source dir> <work dir> <version>
# makes a fresh virtual environment from <python> (with its site-packages, for
# NumPy) in <work dir>, installs <source dir> into it with the environment's
# pip and Debian's setuptools (--no-build-isolation --no-index), then runs
# smoke.py with the environment's python from a folder outside the source and
# build trees. setup.py builds in <work dir>/pip-build (kept: a rerun rebuilds
# only what changed). It fails when the install leaves anything in the source
# tree or changes what <python> itself imports.
set -euo pipefail
python=$1 source_dir=$2 work_dir=$3 version=$4
here=$(cd "$(dirname "$0")" && pwd)

# Nothing from the caller's environment decides what is imported or installed.
unset PYTHONPATH PYTHONHOME PYTHONUSERBASE PIP_USER PIP_TARGET PIP_PREFIX PIP_FIND_LINKS VIRTUAL_ENV
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export DLASYNC_PIP_BUILD_DIR=$work_dir/pip-build

venv=$work_dir/venv
rm -rf "$venv"
mkdir -p "$work_dir"
if ! "$python" -m venv --system-site-packages "$venv"; then
  echo "FAIL: $python -m venv failed (Debian: apt-get install python3-venv)" >&2
  exit 1
fi

# What pip or setuptools could leave in the source tree: an egg-info or a
# build folder at the top, in python/ or in the package; setuptools' build/
# (which would be the CMake build folder's name too) holds lib.*, temp.*, bdist.*.
source_entries() {
  (cd "$source_dir" && ls -A . python python/dlasync &&
   ls -d build/lib.* build/temp.* build/bdist.* 2>/dev/null) || true
}
# Where <python> itself finds dlasync (nowhere, unless a user put it there).
system_dlasync() {
  "$python" -I -c 'import importlib.util as u; s = u.find_spec("dlasync"); print(s and s.origin)'
}
source_before=$(source_entries)
system_before=$(system_dlasync)

"$venv/bin/python" -m pip install -v --no-build-isolation --no-index "$source_dir"

status=0
source_after=$(source_entries)
if [ "$source_before" != "$source_after" ]; then
  echo "FAIL: pip install changed the source tree $source_dir:" >&2
  diff <(echo "$source_before") <(echo "$source_after") >&2 || true
  status=1
fi
system_after=$(system_dlasync)
if [ "$system_before" != "$system_after" ]; then
  echo "FAIL: $python finds dlasync at $system_after after the install ($system_before before):" \
       "the install wrote outside the virtual environment" >&2
  status=1
fi

outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
(cd "$outside" && "$venv/bin/python" -I "$here/smoke.py" "$venv" "$version") || status=1
exit $status
