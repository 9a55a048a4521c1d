#!/bin/bash
# pending.sh [--mock] [--deadline-s S] [--out DIR] [--build DIR] — the GPU runs still to make
# (bench/gpu/README.md, "What is still to run"), most telling first, in one command that ends
# within S seconds (default 570: one command of a GPU machine may run 10 minutes). Each group is one
# `run.sh` with what is left of S (at most what it needs); a group with under 90 s left is not
# started. Each group's results are packed into GROUP.tgz and its output kept in GROUP.log, in $OUT
# when set (a GPU machine returns only the files under it, at most 8), else in DIR (default
# ./gpu-pending). --mock and --build are passed to run.sh (--mock: CI runs the whole sequence on
# the machine without a GPU). Exit status: 0 when every group ran and passed, 1 otherwise.
#
# When a group has run on a GPU and its figures are in bench/RESULTS.md, take it off the list below
# and the README's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
deadline=570 out=./gpu-pending pass=()
while [ $# -gt 0 ]; do
    case $1 in
        --mock) pass+=(--mock) ;;
        --deadline-s) deadline=${2:?--deadline-s needs seconds}; shift ;;
        --out) out=${2:?--out needs a folder}; shift ;;
        --build) pass+=(--build "${2:?--build needs a folder}"); shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "pending.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
case $deadline in ''|*[!0-9]*) echo "pending.sh: --deadline-s takes whole seconds, not '$deadline'" >&2; exit 2 ;; esac
dest=${OUT:-$out}
unset OUT # run.sh writes under $OUT when set: here each group has a folder of its own
mkdir -p "$dest" || exit 1
end=$((SECONDS + deadline))

# NAME SECONDS-WANTED PART [ARGS...], in the order they run.
groups=(
    "driver-questions 90 driver-questions"
    "capacity-medium-a 330 torch-capacity-medium-varlen --modes expandable,cualloc-preload-nocache"
    "capacity-medium-b 200 torch-capacity-medium-varlen --modes cualloc-preload-cache"
    "torch-rounds 330 torch --repeat 3 --modes default,cualloc-enable,cualloc-preload-cache"
)
status=0
for g in "${groups[@]}"; do
    read -r name want part args <<<"$g"
    left=$((end - SECONDS))
    [ "$left" -lt "$want" ] && want=$left
    if [ "$want" -lt 90 ]; then
        echo "pending.sh: $name not started: ${left} s of the ${deadline} s left"
        status=1
        continue
    fi
    work=$(mktemp -d)
    # shellcheck disable=SC2086
    "$here/run.sh" "$part" $args "${pass[@]}" --out "$work" --deadline-s "$want" --pack "$dest/$name.tgz" \
        >"$dest/$name.log" 2>&1
    rc=$?
    echo "pending.sh: $name ($part $args): exit $rc in the $want s it had"
    tail -3 "$dest/$name.log"
    [ "$rc" = 0 ] || status=1
    rm -rf "$work"
done
exit "$status"
