#!/usr/bin/env bash
# The README's configuration table is the descriptor table: fails when they differ.
set -eu
conf_tool=$1 readme=$2
expected=$("$conf_tool" --markdown)
actual=$(sed -n '/<!-- conf-table-begin -->/,/<!-- conf-table-end -->/p' "$readme" | sed '1d;$d')
if [ "$expected" != "$actual" ]; then
    echo "README.md's configuration table differs from the descriptor table in src/conf.c."
    echo "Regenerate it with: tools/update-readme-conf.sh"
    diff <(echo "$expected") <(echo "$actual") || true
    exit 1
fi
echo "README configuration table matches ($(echo "$expected" | wc -l) lines)"
