#!/bin/sh
# fastpath.sh — the fast-path benchmark in one go: builds bench/fastpath if needed, prints the
# ns/pair table from a native run, then instructions per cached alloc+free pair for cualloc and
# jemalloc side by side, counted by callgrind (repeatable, unlike time), and where cualloc's
# instructions go, function by function.
#
# usage: bench/fastpath.sh [builddir]       (default: build-bench; set up with meson if missing)
# environment:
#   FASTPATH_PAIRS      timed pairs per thread, native run (default 200000)
#   FASTPATH_CG_PAIRS   timed pairs under callgrind, a multiple of 64 (default 20480)
#   FASTPATH_CG_THREADS thread count also counted under callgrind, for cualloc, jemalloc and the
#                       loop alike (default 8; 0 = skip): once free-running, once in turns
#   FASTPATH_SEEDS      more seeds of the mix (e.g. "2 3 4"), counted at 1 thread after the main
#                       table, with the range over all seeds per pattern: one seed's figure can
#                       flatter or wrong an allocator (default: none)
#   FASTPATH_TRACES     recorded jobs whose own requests are replayed pass after pass (the trace
#                       pattern), counted at 1 thread after the main table: cualloc traces, or
#                       PyTorch snapshots (*.pickle, converted with allocview import first). Default:
#                       the PyTorch snapshots in ../shared/traces when there are any; "" for none
#   FASTPATH_NATIVE=0   skip the native run;  FASTPATH_PROFILE=0  skip the per-function profile
#   FASTPATH_BUILD=0    do not run ninja (the smoke test sets it: meson has built the program)
# The callgrind profiles stay in <builddir>/fastpath-callgrind/ for callgrind_annotate.
# Exit status: 0; 3 when the native run's cualloc loop mapped memory (not all cached); 1 when a
# callgrind run failed or counted nothing (its cells, and the nets and ratio that need them, read -).
# --help prints the comment above; any other option is refused (it would be taken for a folder).
case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '$d'; exit 0 ;;
-*) echo "$(basename "$0"): unknown option '$1' (--help prints the usage)" >&2; exit 1 ;;
esac
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
pairs=${FASTPATH_PAIRS:-200000}
cg_pairs=${FASTPATH_CG_PAIRS:-20480}
cg_threads=${FASTPATH_CG_THREADS:-8}
# Checked before anything runs: a bad count made every native and callgrind run fail in turn.
for v in "FASTPATH_PAIRS=$pairs" "FASTPATH_CG_PAIRS=$cg_pairs"; do
    case ${v#*=} in
    '' | *[!0-9]* | 0*) echo "fastpath.sh: ${v%%=*} must be a whole number, 1 or more, not '${v#*=}'" >&2; exit 1 ;;
    esac
done
case $cg_threads in
'' | *[!0-9]*) echo "fastpath.sh: FASTPATH_CG_THREADS must be a whole number, not '$cg_threads'" >&2; exit 1 ;;
esac

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" >/dev/null || { echo "fastpath.sh: meson setup $build failed" >&2; exit 1; }
fi
if [ "${FASTPATH_BUILD:-1}" != 0 ]; then
    ninja -C "$build" bench/fastpath tools/allocview/allocview >/dev/null ||
        { echo "fastpath.sh: building bench/fastpath failed" >&2; exit 1; }
fi
exe=$build/bench/fastpath
features=$("$exe" --features)
case " $features " in *" jemalloc "*) allocs="cualloc jemalloc" ;; *) allocs="cualloc" ;; esac
case " $features " in *" callgrind-markers "*) instr_opt="--instr-atstart=no" ;; *) instr_opt="" ;; esac
if grep -q '"name": "b_sanitize", "value": "none"' "$build/meson-info/intro-buildoptions.json" 2>/dev/null; then :; else
    echo "fastpath.sh: warning: $build is a sanitizer build; numbers will not mean much" >&2
fi

echo "== fast path (cached alloc+free): $(date -u +%F), $(nproc) cpus, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
status=0
if [ "${FASTPATH_NATIVE:-1}" != 0 ]; then
    echo "== native: $exe --pairs $pairs"
    "$exe" --pairs "$pairs" || status=$?
    echo
fi

if ! command -v valgrind >/dev/null 2>&1; then
    echo "fastpath.sh: valgrind is not installed; no instruction counts" >&2
    exit "$status"
fi

out=$build/fastpath-callgrind
mkdir -p "$out"
failed=$out/failed-runs.txt # the callgrind runs that gave no count, one a line
cg_turns= # non-empty: cg_run runs the threads in turns (--turns)
: >"$failed"

# Runs one configuration under callgrind, collecting only inside bench_loop_* (the timed loop);
# prints the instructions collected and the pairs timed (a trace rounds them up to whole passes),
# or nothing when the run failed or left no count: the run is then listed in $failed, and its cells
# (and every cell computed from them) read "-".
# SEED: the mix's seed (default: the program's own). PATTERN trace=FILE: FILE's requests.
cg_run() { # allocator pattern threads [seed]
    case $2 in
    trace=*) name=trace.$(basename "${2#trace=}"); set -- "$1" trace "$3" "" "${2#trace=}" ;;
    *) name=$2 ;;
    esac
    f=$out/cg.$1.$name.t$3${4:+.s$4}${cg_turns:+.turns}
    rm -f "$f"
    rc=0
    valgrind --tool=callgrind $instr_opt --toggle-collect='bench_loop_*' --callgrind-out-file="$f" \
        "$exe" --allocator "$1" --pattern "$2" --threads "$3" --pairs "$cg_pairs" ${4:+--seed "$4"} \
        ${5:+--trace "$5"} ${cg_turns:+--turns} --quiet >"$f.log" 2>&1 || rc=$?
    if [ "$rc" = 3 ]; then # ran, but cualloc mapped memory inside the timed loop
        echo "fastpath.sh: note: $1/$2/$3 threads under callgrind: $(sed -n 's/.* \([0-9]* maps\), .*/\1/p' "$f.log") in the timed loop" >&2
    elif [ "$rc" != 0 ]; then
        echo "fastpath.sh: callgrind run $1/$2/$3 failed (exit $rc; see $f.log):" >&2
        tail -5 "$f.log" >&2
        echo "$1/$2/$3${4:+/seed$4}" >>"$failed"
        return
    fi
    instr=$(sed -n 's/^totals: *//p' "$f" 2>/dev/null | head -1)
    pairs_timed=$(awk -v a="$1" '$1 == a { print $4; exit }' "$f.log")
    case "$instr.$pairs_timed" in
    [1-9]*.[1-9]*) echo "$instr $pairs_timed" ;; # 0 instructions: the timed loop was never entered
    *)
        echo "fastpath.sh: callgrind run $1/$2/$3 left no instruction count or no pairs (see $f and $f.log)" >&2
        echo "$1/$2/$3${4:+/seed$4}" >>"$failed" ;;
    esac
}

per_pair() { # "instructions pairs" -> per pair, one decimal; "-" without a count
    echo "$1" | awk 'NF == 2 && $2 > 0 { printf "%.1f", $1 / $2; ok = 1 } END { if (!ok) printf "-" }'
}

# One table row: the loop baseline, cualloc and jemalloc for PATTERN with THREADS threads, each per
# pair over all threads' pairs, and net of the loop. The same row for 1 and for N threads, so that
# both allocators are counted on the same mix in the same run. Under callgrind the threads run one
# at a time (callgrind serializes them), so an N-thread row is the cost with N threads' heaps,
# caches and streams alive but without lock contention.
cg_row() { # pattern threads [seed [label]]
    loop=$(per_pair "$(cg_run null "$1" "$2" "${3:-}")")
    cua=$(per_pair "$(cg_run cualloc "$1" "$2" "${3:-}")")
    je=-
    case "$allocs" in *jemalloc*) je=$(per_pair "$(cg_run jemalloc "$1" "$2" "${3:-}")") ;; esac
    cua_net=- je_net=- ratio=-
    if [ "$cua" != - ] && [ "$loop" != - ]; then
        cua_net=$(awk -v a="$cua" -v b="$loop" 'BEGIN { printf "%.1f", a - b }')
    fi
    if [ "$je" != - ] && [ "$loop" != - ]; then
        je_net=$(awk -v a="$je" -v b="$loop" 'BEGIN { printf "%.1f", a - b }')
    fi
    if [ "$cua_net" != - ] && [ "$je_net" != - ]; then
        ratio=$(awk -v a="$je_net" -v b="$cua_net" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else printf "-" }')
    fi
    printf '%-8s %7s %10s %10s %8s %12s %12s %8s\n' "${4:-$1}" "${3:-$2}" "$cua" "$je" "$loop" "$cua_net" "$je_net" "$ratio"
}

echo "== instructions per alloc+free pair (callgrind Ir inside the timed loop, $cg_pairs pairs per thread after warm-up)"
echo "   'loop' is the benchmark loop itself (a do-nothing allocator); 'net' subtracts it."
printf '%-8s %7s %10s %10s %8s %12s %12s %8s\n' pattern threads cualloc jemalloc loop cualloc-net jemalloc-net je/cua
main_rows=$out/rows.txt
for pat in random stack repeat; do
    cg_row "$pat" 1
done | tee "$main_rows"
if [ "$cg_threads" -gt 1 ]; then
    for pat in random stack repeat; do
        cg_row "$pat" "$cg_threads"
    done
    echo "   ($cg_threads threads: callgrind serializes threads, so this is the instruction cost without contention;"
    echo "   where it switches threads varies from run to run, and these counts with it)"
    echo
    echo "== the same, $cg_threads threads taking turns (fastpath --turns): one thread at a time, a step each (random:"
    echo "   64 pairs), in thread order, so that every step's memory was last freed on another stream; the"
    echo "   interleaving is fixed, and the counts repeat from run to run"
    printf '%-8s %7s %10s %10s %8s %12s %12s %8s\n' pattern threads cualloc jemalloc loop cualloc-net jemalloc-net je/cua
    cg_turns=1
    for pat in random stack repeat; do
        cg_row "$pat" "$cg_threads" "" "$pat-turns"
    done
    cg_turns=
fi
if [ -n "${FASTPATH_SEEDS:-}" ]; then
    seeds_out=$out/seeds.txt
    echo
    echo "== the same, 1 thread, other seeds of the mix ($FASTPATH_SEEDS; the table above is the default seed)"
    printf '%-8s %7s %10s %10s %8s %12s %12s %8s\n' pattern seed cualloc jemalloc loop cualloc-net jemalloc-net je/cua
    for seed in $FASTPATH_SEEDS; do
        for pat in random stack repeat; do
            cg_row "$pat" 1 "$seed"
        done
    done | tee "$seeds_out"
    # The range per pattern over every seed counted, the default's 1-thread row included.
    for pat in random stack repeat; do
        awk -v p="$pat" '$1 == p && $6 + 0 > 0 {
            n++; c = $6 + 0; if (n == 1 || c < cmin) cmin = c; if (n == 1 || c > cmax) cmax = c
            if ($8 != "-") { r = $8 + 0; if (nr++ == 0 || r < rmin) rmin = r; if (r > rmax) rmax = r } }
            END { if (n) printf "   %s over %d seeds: cualloc-net %.1f..%.1f%s\n", p, n, cmin, cmax,
                  nr ? sprintf(", je/cua %.1fx..%.1fx", rmin, rmax) : "" }' "$seeds_out" "$main_rows"
    done
fi

# Recorded jobs: each trace's own requests, pass after pass (bench/fastpath.c, "the trace program").
traces=${FASTPATH_TRACES-$(ls "$root"/../shared/traces/*.pickle 2>/dev/null || true)}
if [ -n "$traces" ]; then
    echo
    echo "== the same, 1 thread, on recorded jobs' own requests (the trace pattern; rows: the trace's name)"
    for t in $traces; do
        case $t in
        *.pickle)
            conv=$out/$(basename "$t" .pickle).trace
            rm -f "$conv"
            "$build/tools/allocview/allocview" import "$t" -o "$conv" >/dev/null 2>"$conv.log" ||
                { echo "fastpath.sh: allocview import $t failed:" >&2; cat "$conv.log" >&2; status=1; continue; }
            t=$conv ;;
        esac
        "$exe" --pattern trace --trace "$t" --threads 1 --pairs 1 --allocator null 2>/dev/null | sed -n 's/^trace: /   /p'
        cg_row "trace=$t" 1 "" "$(basename "$t" .trace)"
    done
fi

# Self instructions and calls per pair, by function, from a callgrind profile (call counts are
# exact when the build has the callgrind markers: only the timed loop is instrumented).
cg_profile() { # file pairs
    awk -v pairs="$2" '
    function fname(line, key,    rest, id, name) {
        rest = substr(line, length(key) + 2)
        if (rest ~ /^\(/) {
            id = substr(rest, 1, index(rest, ")"))
            name = substr(rest, length(id) + 2)
            if (name != "") names[id] = name
            else name = names[id]
            return name
        }
        return rest
    }
    /^fn=/   { cur = fname($0, "fn"); next }
    /^cfn=/  { callee = fname($0, "cfn"); next }
    /^calls=/ { split(substr($0, 7), a, " "); calls[callee] += a[1]; incall = 1; next }
    /^[0-9+*-]/ { if (incall) incall = 0; else self[cur] += $2; next }
    END {
        for (f in self) {
            if (self[f] <= 0) continue
            if (calls[f] > 0) printf "%10.1f %10.2f %9.1f  %s\n", self[f] / pairs, calls[f] / pairs, self[f] / calls[f], f
            else printf "%10.1f %10s %9s  %s\n", self[f] / pairs, "-", "-", f
        }
    }' "$1" | sort -rn | head -"${3:-30}"
}

if [ "${FASTPATH_PROFILE:-1}" != 0 ]; then
    for a in $allocs; do
        for pat in random stack repeat; do
            f=$out/cg.$a.$pat.t1
            [ -s "$f" ] || continue
            echo
            echo "== where $a's instructions go ($pat, 1 thread): self instructions per pair, by function"
            [ -n "$instr_opt" ] || echo "   (built without valgrind/callgrind.h: call counts include warm-up)"
            printf '%10s %10s %9s  %s\n' Ir/pair calls/pair Ir/call function
            if [ "$a" = cualloc ]; then cg_profile "$f" "$cg_pairs" 30; else cg_profile "$f" "$cg_pairs" 12; fi
        done
    done
    echo
    echo "profiles: $out/cg.<allocator>.<pattern>.t<threads> (callgrind_annotate --inclusive=yes <file>)"
fi
if [ -s "$failed" ]; then
    echo "fastpath.sh: $(wc -l <"$failed") callgrind run(s) gave no count ($(tr '\n' ' ' <"$failed")): their cells read -" >&2
    status=1
fi
exit "$status"
