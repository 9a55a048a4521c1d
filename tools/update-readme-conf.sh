#!/usr/bin/env bash
# Rewrites README.md's configuration table from the descriptor table (build/tools/cualloc-conf).
set -eu
cd "$(dirname "$0")/.."
tool=${1:-build/tools/cualloc-conf}
table=$("$tool" --markdown)
python3 - "$table" <<'PY'
import sys
table = sys.argv[1]
s = open("README.md").read()
a = s.index("<!-- conf-table-begin -->") + len("<!-- conf-table-begin -->\n")
b = s.index("<!-- conf-table-end -->")
open("README.md", "w").write(s[:a] + table + "\n" + s[b:])
PY
