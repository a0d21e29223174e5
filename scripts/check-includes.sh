#!/usr/bin/env bash
# The component boundaries (scripts/check_includes.py): includes across runtime/,
# transfer/, remote/ and python/ go through public headers or a private header declared
# in cmake/component_interfaces.txt.
#
#   scripts/check-includes.sh [--self-test]   --self-test: plants crossings in a copy
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/check_includes.py "$@"
