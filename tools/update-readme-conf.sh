#!/usr/bin/env bash
# Rewrites README.md's configuration table from the descriptor table (build/tools/cualloc-conf).
#
#   tools/update-readme-conf.sh [CUALLOC_CONF_TOOL]   (default build/tools/cualloc-conf)
set -eu
case ${1:-} in
    -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -le 1 ] || { echo "update-readme-conf.sh: one argument at most (the cualloc-conf program)" >&2; exit 2; }
cd "$(dirname "$0")/.."
tool=${1:-build/tools/cualloc-conf}
[ -x "$tool" ] || { echo "update-readme-conf.sh: no program '$tool' (meson compile -C build first)" >&2; exit 2; }
table=$("$tool" --markdown)
python3 - "$table" <<'PY'
import sys
table = sys.argv[1]
s = open("README.md").read()
a = s.index("<!-- conf-table-begin -->") + len("<!-- conf-table-begin -->\n")
b = s.index("<!-- conf-table-end -->")
open("README.md", "w").write(s[:a] + table + "\n" + s[b:])
PY
