#!/usr/bin/env bash
# Line coverage of the library by the test suite: a --coverage build in
# build-coverage/, the suite run once, then gcovr's line coverage of
# runtime/ and transfer/, per folder and in all, as a Markdown table
# (build-coverage/coverage.md) and on stdout.
#
#   scripts/coverage.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh gcovr
# Threads update the counters at once: atomic updates, else some come out
# negative.
cmake -S . -B build-coverage -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=g++-12 \
  "-DCMAKE_CXX_FLAGS=--coverage -fprofile-update=atomic" -DCMAKE_EXE_LINKER_FLAGS=--coverage -DDLASYNC_BUILD_BENCH=OFF \
  >/dev/null
cmake --build build-coverage --parallel "$(nproc)"
find build-coverage -name '*.gcda' -delete
# The install test builds other projects, which add nothing to the library's lines.
ctest --test-dir build-coverage --parallel "$(nproc)" --timeout 600 -E install_and_consume \
  --output-on-failure
gcovr --root . --object-directory build-coverage --filter 'runtime/' --filter 'transfer/' \
  --exclude-unreachable-branches --gcov-ignore-parse-errors --json-summary build-coverage/coverage.json \
  --txt build-coverage/coverage.txt >/dev/null
python3 - <<'PY'
import collections, json
data = json.load(open("build-coverage/coverage.json"))
folders = collections.OrderedDict()
for f in sorted(data["files"], key=lambda f: f["filename"]):
    folder = f["filename"].rsplit("/", 1)[0]
    covered, total = folders.get(folder, (0, 0))
    folders[folder] = (covered + f["line_covered"], total + f["line_total"])
rows = ["| folder | lines | covered | % |", "|---|---|---|---|"]
all_covered = all_total = 0
for folder, (covered, total) in folders.items():
    rows.append(f"| `{folder}/` | {total} | {covered} | {100 * covered / total:.1f} |")
    all_covered += covered
    all_total += total
rows.append(f"| all | {all_total} | {all_covered} | {100 * all_covered / all_total:.1f} |")
open("build-coverage/coverage.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
