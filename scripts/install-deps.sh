#!/usr/bin/env bash
# Installs the Debian 12 packages dlasync builds with, when missing. Needs root
# (or sudo) only when something is missing.
set -euo pipefail

packages=(cmake ninja-build g++-12 pkg-config libasio-dev libabsl-dev libdlpack-dev catch2
          libbenchmark-dev libhttp-parser-dev nlohmann-json3-dev libgrpc++-dev libprotobuf-dev
          protobuf-compiler protobuf-compiler-grpc "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
