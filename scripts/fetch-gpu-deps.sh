#!/usr/bin/env bash
# Downloads the Debian packages dlasync builds with and unpacks them into
# .gpu-deps/root, for a machine that has a GPU but none of these packages and
# no network: carry .gpu-deps there; scripts/gpu-check.sh picks it up.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-deps && mkdir -p .gpu-deps/debs .gpu-deps/root
(cd .gpu-deps/debs && apt-get download libasio-dev libabsl-dev libabsl20220623 libdlpack-dev \
  catch2 libbenchmark-dev libbenchmark1debian)
for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps/root; done
rm -rf .gpu-deps/debs .gpu-deps/root/usr/share/doc
du -sh .gpu-deps
