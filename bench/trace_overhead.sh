#!/bin/sh
# trace_overhead.sh — the trace recorder's cost in one go: builds bench/trace_overhead if needed,
# runs it natively (ns added per cached alloc+free pair, bytes per event; medians over --runs), then
# counts instructions per pair under callgrind, with tracing off and on, for 16-frame stacks and for
# none (callgrind collects only inside overhead_timed_off or overhead_timed_on, one run each; the
# counts repeat exactly, unlike time on a shared machine).
#
# usage: bench/trace_overhead.sh [builddir]     (default: build-bench; set up with meson if missing)
# environment:
#   TRACE_OVERHEAD_RUNS   native runs per configuration (default 7)
#   TRACE_OVERHEAD_NATIVE=0  skip the native run
#   TRACE_OVERHEAD_PAIRS  pairs per native run (default 200000, at least 16384)
#   TRACE_OVERHEAD_BUILD=0   do not run ninja (the smoke test sets it: meson has built the program)
# The callgrind profiles stay in <builddir>/trace-overhead-callgrind/ for callgrind_annotate.
# --help prints the comment above; any other option is refused (it would be taken for a folder).
case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '$d'; exit 0 ;;
-*) echo "$(basename "$0"): unknown option '$1' (--help prints the usage)" >&2; exit 1 ;;
esac
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
runs=${TRACE_OVERHEAD_RUNS:-7}
pairs=${TRACE_OVERHEAD_PAIRS:-200000}
# Checked before anything runs (trace_overhead itself refuses them, but only after the build).
for v in "TRACE_OVERHEAD_RUNS=$runs" "TRACE_OVERHEAD_PAIRS=$pairs"; do
    case ${v#*=} in
    '' | *[!0-9]* | 0*) echo "trace_overhead.sh: ${v%%=*} must be a whole number, 1 or more, not '${v#*=}'" >&2; exit 1 ;;
    esac
done
cg_pairs=16384 # one period of the program's request sequence

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" >/dev/null || { echo "trace_overhead.sh: meson setup $build failed" >&2; exit 1; }
fi
if [ "${TRACE_OVERHEAD_BUILD:-1}" != 0 ]; then
    ninja -C "$build" bench/trace_overhead >/dev/null ||
        { echo "trace_overhead.sh: building bench/trace_overhead failed" >&2; exit 1; }
fi
exe=$build/bench/trace_overhead

echo "== trace recorder overhead: $(date -u +%F), $(nproc) cpus, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ "${TRACE_OVERHEAD_NATIVE:-1}" != 0 ]; then
    for depth in 16 0; do
        echo "== native: $exe --runs $runs --pairs $pairs --depth $depth"
        "$exe" --runs "$runs" --pairs "$pairs" --depth "$depth"
        echo
    done
fi

if ! command -v valgrind >/dev/null 2>&1; then
    echo "trace_overhead.sh: valgrind is not installed; no instruction counts" >&2
    exit 0
fi
out=$build/trace-overhead-callgrind
mkdir -p "$out"

# Instructions collected inside overhead_timed_MODE for one run of cg_pairs pairs.
cg_count() { # mode depth
    f=$out/cg.$1.d$2
    rm -f "$f"
    if ! valgrind --tool=callgrind --toggle-collect="overhead_timed_$1" --callgrind-out-file="$f" \
        "$exe" --runs 1 --pairs "$cg_pairs" --depth "$2" >"$f.log" 2>&1; then
        echo "trace_overhead.sh: callgrind run $1/depth $2 failed (see $f.log):" >&2
        tail -5 "$f.log" >&2
        exit 1
    fi
    # A run that wrote no profile, or collected nothing (the timed function renamed or inlined),
    # has no count: an empty or zero one would print as a figure.
    n=$(sed -n 's/^totals: *//p' "$f" 2>/dev/null | head -1)
    case $n in
    '' | *[!0-9]* | 0)
        echo "trace_overhead.sh: callgrind run $1/depth $2 counted no instructions in overhead_timed_$1 (see $f and $f.log)" >&2
        exit 1 ;;
    esac
    echo "$n"
}

echo "== instructions per alloc+free pair (callgrind Ir inside the timed loop, $cg_pairs pairs, the"
echo "   benchmark's own loop and 20-deep recursion included in both columns)"
printf '%-12s %12s %12s %12s\n' stack-depth tracing-off tracing-on added
for depth in 16 0; do
    # (exit in a command substitution leaves only the subshell: the status is tested here)
    off=$(cg_count off "$depth") || exit 1
    on=$(cg_count on "$depth") || exit 1
    awk -v d="$depth" -v a="$off" -v b="$on" -v n="$cg_pairs" \
        'BEGIN { printf "%-12s %12.1f %12.1f %12.1f\n", d, a / n, b / n, (b - a) / n }'
done
echo "profiles: $out/cg.<off|on>.d<depth> (callgrind_annotate <file>)"
