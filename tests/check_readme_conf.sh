#!/usr/bin/env bash
# The README's configuration table is the descriptor table: fails when they differ. And the
# cualloc-conf [CONF] the README describes refuses a second word.
set -eu
conf_tool=$1 readme=$2
readme_err=$(mktemp)
trap 'rm -f "$readme_err"' EXIT
expected=$("$conf_tool" --markdown)
actual=$(sed -n '/<!-- conf-table-begin -->/,/<!-- conf-table-end -->/p' "$readme" | sed '1d;$d')
if [ "$expected" != "$actual" ]; then
    echo "README.md's configuration table differs from the descriptor table in src/conf.c."
    echo "Regenerate it with: tools/update-readme-conf.sh"
    diff <(echo "$expected") <(echo "$actual") || true
    exit 1
fi
# cualloc-conf takes one CONF: a second word is refused, status 2, naming it (it was left out of the
# configuration printed).
st=0
"$conf_tool" expandable_segments:0 max_split_size_mb:20 >/dev/null 2>"$readme_err" || st=$?
[ "$st" = 2 ] || { echo "cualloc-conf with two words exited $st, want 2"; exit 1; }
grep -q "got 'max_split_size_mb:20' after 'expandable_segments:0'" "$readme_err" ||
    { echo "cualloc-conf's refusal does not name the word: $(cat "$readme_err")"; exit 1; }
echo "README configuration table matches ($(echo "$expected" | wc -l) lines)"
