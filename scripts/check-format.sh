#!/usr/bin/env bash
# Fails when clang-format would change a C++ file of the project.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  bash scripts/install-deps.sh clang-format
fi
files=$(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh' | grep -v '^tests/transfer/dlpack/newer_dlpack/')
[ -n "$files" ] || { echo "format: no files"; exit 0; }
clang-format --dry-run --Werror $files
echo "format: $(echo "$files" | wc -l) files clean"
