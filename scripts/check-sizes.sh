#!/usr/bin/env bash
# Short files (docs/architecture.md): no C++ source of the library (runtime/, transfer/,
# remote/, python/src/) is longer than 500 lines. Prints each one that is, with its count.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=500
status=0
while IFS= read -r -d '' file; do
  lines=$(wc -l <"$file")
  if [ "$lines" -gt "$limit" ]; then
    echo "$file: $lines lines, over the limit of $limit: split it by job"
    status=1
  fi
done < <(find runtime transfer remote python/src -type f \
  \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) \
  -print0 | sort -z)
[ "$status" -eq 0 ] && echo "check-sizes: every library source is at most $limit lines"
exit "$status"
