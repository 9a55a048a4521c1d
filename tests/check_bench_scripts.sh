#!/bin/sh
# check_bench_scripts.sh — the benchmark scripts still run and print their tables: bench/fastpath.sh
# and bench/trace_overhead.sh on a short run (few pairs, callgrind included), each row of their
# instruction tables present with numbers; bench/allocview_speed.sh on a tiny trace; the benchmark
# programs refuse a bad argument, naming it.
# The figures themselves are not judged here (a timed test on a shared machine would be noise);
# bench/RESULTS.md records them.
#
# usage: check_bench_scripts.sh SOURCE_ROOT BUILD_ROOT      (skipped, 77, without valgrind)
set -eu
src=$1
build=$2
command -v valgrind >/dev/null 2>&1 || { echo "valgrind is not installed: skipping"; exit 77; }
fail=0
out=$(mktemp)

# fastpath: a native run short enough that cualloc may still map (status 3: "not all cached", a
# finding, not a failure of the script), callgrind on 1024 pairs at 1 and 2 threads, at 1 thread
# with a second seed of the mix, and on a recorded job's requests (the trace pattern: a
# variable-length training scenario recorded here).
trace=$(mktemp --suffix=.trace)
rm -f "$trace"
trap 'rm -f "$out" "$trace"' EXIT
CUALLOC_CONF=driver:sim,sim_memory_mb:512 "$build/tests/trace_scenarios" varlen "$trace" 2>/dev/null ||
    { echo "FAIL: trace_scenarios varlen failed"; exit 1; }
rc=0
FASTPATH_BUILD=0 FASTPATH_PAIRS=20000 FASTPATH_CG_PAIRS=1024 FASTPATH_CG_THREADS=2 FASTPATH_SEEDS=7 \
    FASTPATH_TRACES="$trace" "$src/bench/fastpath.sh" "$build" >"$out" 2>&1 || rc=$?
if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
    echo "FAIL: bench/fastpath.sh exited with $rc"; cat "$out"; fail=1
fi
# fragmentation.sh refuses a bad FRAG_PASSES at once, naming it (the table itself is the meson test
# `fragmentation`).
for bad in ten 0 1001; do
    if FRAG_PASSES=$bad FRAG_BUILD=0 FRAG_OUT="$out.frag" "$src/bench/fragmentation.sh" "$build" >"$out.fragerr" 2>&1 ||
        ! grep -q "FRAG_PASSES must be a number from 1 to 1000, not '$bad'" "$out.fragerr"; then
        echo "FAIL: bench/fragmentation.sh took FRAG_PASSES=$bad:"; cat "$out.fragerr"; fail=1
    fi
done
rm -rf "$out.frag" "$out.fragerr"
for pat in random stack repeat; do
    for t in 1 2; do
        # pattern threads cualloc jemalloc loop cualloc-net ... : cualloc's gross and net counts are numbers > 0
        if ! awk -v p="$pat" -v t="$t" '$1 == p && $2 == t && $3 + 0 > 0 && $6 + 0 > 0 { ok = 1 } END { exit !ok }' "$out"; then
            echo "FAIL: bench/fastpath.sh printed no instruction row for $pat, $t thread(s)"; fail=1
        fi
    done
    awk -v p="$pat-turns" '$1 == p && $2 == 2 && $3 + 0 > 0 && $6 + 0 > 0 { ok = 1 } END { exit !ok }' "$out" ||
        { echo "FAIL: bench/fastpath.sh printed no instruction row for $pat with 2 threads in turns"; fail=1; }
    grep -q "^cualloc  *$pat  *1 " "$out" || { echo "FAIL: bench/fastpath.sh printed no native row for $pat"; fail=1; }
    # FASTPATH_SEEDS=7: a row for seed 7 after the seeds table's header, and the range over both seeds
    awk -v p="$pat" '/other seeds of the mix/ { seeds = 1 } seeds && $1 == p && $2 == 7 && $6 + 0 > 0 { ok = 1 } END { exit !ok }' "$out" ||
        { echo "FAIL: bench/fastpath.sh printed no row for $pat with seed 7"; fail=1; }
    grep -q "^   $pat over 2 seeds: cualloc-net [0-9.]*\.\.[0-9.]*" "$out" ||
        { echo "FAIL: bench/fastpath.sh printed no range over the seeds for $pat"; fail=1; }
done
# The trace row: the trace's name, 1 thread, cualloc's gross and net counts numbers > 0; and the
# description of what a pass replays.
name=$(basename "$trace" .trace)
awk -v n="$name" '$1 == n && $2 == 1 && $3 + 0 > 0 && $6 + 0 > 0 { ok = 1 } END { exit !ok }' "$out" ||
    { echo "FAIL: bench/fastpath.sh printed no instruction row for the trace $name"; fail=1; }
grep -q "^   $trace: 52 pairs per pass" "$out" || { echo "FAIL: bench/fastpath.sh did not describe the trace"; fail=1; }
grep -q "where cualloc's instructions go (random, 1 thread)" "$out" ||
    { echo "FAIL: bench/fastpath.sh printed no profile"; fail=1; }
[ "$fail" = 0 ] || cat "$out"

# fastpath.sh and trace_overhead.sh refuse a bad count at once, naming it (every native and
# callgrind run failed in turn).
for v in "FASTPATH_PAIRS=-1" "FASTPATH_CG_PAIRS=x" "FASTPATH_CG_THREADS=-2" "TRACE_OVERHEAD_RUNS=7x" "TRACE_OVERHEAD_PAIRS=0x100"; do
    case $v in FASTPATH*) script=fastpath.sh ;; *) script=trace_overhead.sh ;; esac
    if env "$v" FASTPATH_BUILD=0 TRACE_OVERHEAD_BUILD=0 timeout 60 "$src/bench/$script" "$build" >/dev/null 2>"$out.toerr" ||
        ! grep -q "^$script: ${v%%=*} must be a whole number\(, 1 or more\)\?, not '${v#*=}'" "$out.toerr"; then
        echo "FAIL: $script with $v did not refuse at once:"; head -5 "$out.toerr"; fail=1
    fi
done
# trace_overhead refuses a bad number with a message naming it, before any work: too few pairs or a
# bad run count (it exited 1 silently, so bench/trace_overhead.sh stopped without a word at
# TRACE_OVERHEAD_PAIRS below 16384), a sign, junk or hex ("-1" pairs was 2^64 - 1, a run without
# end; "7x" runs was 7), a depth the recorder would cut to 64 while the table named the one asked.
for args in "--pairs 2000" "--runs 0" "--pairs -1" "--runs 7x" "--pairs 0x8000" "--depth 65" "--depth -1"; do
    opt=${args% *} val=${args#* }
    if timeout 20 "$build/bench/trace_overhead" --runs 1 --pairs 16384 $args >/dev/null 2>"$out.toerr" ||
        ! grep -q "^trace_overhead: bad $opt '$val' (a number from" "$out.toerr"; then
        echo "FAIL: trace_overhead $args did not refuse with a message:"; cat "$out.toerr"; fail=1
    fi
done
# fastpath likewise: a sign or a blank ("-1" pairs wrapped to a table of 0 pairs at "inf" ns, exit
# 0), more pairs than it can round up to whole steps.
for args in "--pairs -1" "--pairs  5" "--pairs 18446744073709551600" "--seed -3"; do
    opt=${args%% *} val=${args#* }
    if timeout 20 "$build/bench/fastpath" --quiet --threads 1 --allocator cualloc --pattern repeat $opt "$val" \
        >/dev/null 2>"$out.toerr" || ! grep -q "^fastpath: bad argument '$opt' $val\$" "$out.toerr"; then
        echo "FAIL: fastpath $args did not refuse with a message:"; cat "$out.toerr"; fail=1
    fi
done
# trace_synth: an option-like first word is no trace name (--help wrote a 50 M-event file named
# '--help'), and EVENTS is a whole number ("-1" wrote until the disk was full, "5x" 5 events).
synth=$(mktemp -d)
( cd "$synth" && "$build/bench/trace_synth" --help ) | grep -q "^usage: trace_synth TRACE" ||
    { echo "FAIL: trace_synth --help printed no usage"; fail=1; }
for args in "-x 1000" "t.trace -1" "t.trace 5x" "t.trace 0" "t.trace 5 extra"; do
    # The file size limit keeps a regression from filling the disk: the write fails instead.
    if ( cd "$synth" && ulimit -f 20480 && trap '' XFSZ && timeout 20 "$build/bench/trace_synth" $args ) \
        >/dev/null 2>"$out.toerr" ||
        ! grep -q "^trace_synth: .*'\(-x\|-1\|5x\|0\|extra\)'" "$out.toerr"; then
        echo "FAIL: trace_synth $args did not refuse with a message:"; cat "$out.toerr"; fail=1
    fi
done
[ -z "$(ls -A "$synth")" ] || { echo "FAIL: a refused trace_synth wrote $(ls -A "$synth")"; fail=1; }
rm -rf "$synth"
rm -f "$out.toerr"

# allocview_speed.sh on a trace small enough that /usr/bin/time reads 0 s wall for it (its
# resolution is 0.01 s): each run's line is still printed, without a rate. It stopped at the first
# such run with a Python ZeroDivisionError traceback.
if [ -x /usr/bin/time ]; then
    if ! REPLAY=0 "$src/bench/allocview_speed.sh" "$build" 1000 >"$out" 2>&1 ||
        [ "$(grep -c '^run [123]: [0-9.]* s wall' "$out")" != 3 ] || grep -q Traceback "$out"; then
        echo "FAIL: bench/allocview_speed.sh on 1000 events:"; cat "$out"; fail=1
    fi
fi

# The loop baseline costs what the loop costs: the timed loop's own instructions (self cost of
# bench_loop_*, per pair) under the do-nothing allocator are those under cualloc and jemalloc, less
# at most 3 a pair (the two PLT jumps of a call into a shared library, and cualloc's device argument).
# When the compiler could see that null_alloc and null_free clobber no register, the null loop kept
# its values in caller-saved registers and took 4-8 fewer, which the net columns then charged to
# both allocators.
loop_self() { # callgrind file, log -> the loop's self instructions per pair
    awk '
    function fname(line, key,    rest, id, name) {
        rest = substr(line, length(key) + 2)
        if (rest ~ /^\(/) {
            id = substr(rest, 1, index(rest, ")")); name = substr(rest, length(id) + 2)
            if (name != "") names[id] = name; else name = names[id]
            return name
        }
        return rest
    }
    FNR == NR { if ($1 ~ /^(null|cualloc|jemalloc)$/ && $4 ~ /^[0-9]+$/) pairs = $4; next }
    /^fn=/ { cur = fname($0, "fn"); next }
    /^cfn=/ { fname($0, "cfn"); next }
    /^calls=/ { incall = 1; next }
    /^[0-9+*-]/ { if (incall) incall = 0; else if (cur ~ /^bench_loop_/) self += $2; next }
    END { if (pairs > 0 && self > 0) printf "%.2f\n", self / pairs }' "$2" "$1"
}
cgdir=$build/fastpath-callgrind
for run in random stack repeat "trace.$name.trace"; do
    base=$(loop_self "$cgdir/cg.null.$run.t1" "$cgdir/cg.null.$run.t1.log")
    for a in cualloc jemalloc; do
        [ -s "$cgdir/cg.$a.$run.t1" ] || continue
        self=$(loop_self "$cgdir/cg.$a.$run.t1" "$cgdir/cg.$a.$run.t1.log")
        awk -v a="$self" -v b="$base" 'BEGIN { exit !(a != "" && b != "" && a - b >= 0 && a - b <= 3.01) }' || {
            echo "FAIL: bench/fastpath.sh's loop baseline ($run): $base instructions of its own per pair, against $self under $a"
            fail=1
        }
    done
done

# In turns the interleaving is fixed, so the count repeats to the instruction: the same runs as
# fastpath.sh's, again, read what they read (free-running threads read what callgrind's thread
# switches make of them). Random three times more: it keeps its slots live from the first fill on,
# so a fill left to the scheduler (as it was) moved its count in about one run in three.
turns_count() { sed -n 's/^totals: *//p' "$1" | head -1; }
opt=$(case " $("$build/bench/fastpath" --features) " in *" callgrind-markers "*) echo --instr-atstart=no ;; esac)
for run in repeat random random random; do
    first=$(turns_count "$cgdir/cg.cualloc.$run.t2.turns")
    valgrind --tool=callgrind $opt --toggle-collect='bench_loop_*' --callgrind-out-file="$out.cg" "$build/bench/fastpath" \
        --allocator cualloc --pattern $run --threads 2 --pairs 1024 --turns --quiet >/dev/null 2>&1
    again=$(turns_count "$out.cg")
    rm -f "$out.cg"
    [ -n "$first" ] && [ "$first" = "$again" ] ||
        { echo "FAIL: fastpath --pattern $run --turns under callgrind counted '$first', then '$again'"; fail=1; }
done

# A callgrind run that fails (here the loop baseline's, through a valgrind that refuses it) gives no
# number: its cells and every cell computed from them read "-", and the script exits 1. It read 0.0,
# so the loop subtracted nothing and the net columns were the gross counts, with exit status 0.
fake=$(mktemp -d)
cat >"$fake/valgrind" <<EOF
#!/bin/sh
case " \$* " in *" --allocator null "*) echo "valgrind: refused" >&2; exit 1 ;; esac
exec "$(command -v valgrind)" "\$@"
EOF
chmod +x "$fake/valgrind"
rc=0
PATH="$fake:$PATH" FASTPATH_BUILD=0 FASTPATH_NATIVE=0 FASTPATH_PROFILE=0 FASTPATH_CG_PAIRS=1024 FASTPATH_CG_THREADS=0 \
    FASTPATH_TRACES= "$src/bench/fastpath.sh" "$build" >"$out" 2>&1 || rc=$?
rm -rf "$fake"
if [ "$rc" != 1 ]; then
    echo "FAIL: bench/fastpath.sh exited with $rc after a failed callgrind run (expected 1)"; cat "$out"; fail=1
fi
for pat in random stack repeat; do
    # pattern threads cualloc jemalloc loop cualloc-net jemalloc-net je/cua: loop and what needs it are "-"
    awk -v p="$pat" '$1 == p && $2 == 1 && $3 + 0 > 0 && $5 == "-" && $6 == "-" && $7 == "-" && $8 == "-" { ok = 1 }
        END { exit !ok }' "$out" ||
        { echo "FAIL: bench/fastpath.sh printed a number computed from a failed callgrind run ($pat)"; cat "$out"; fail=1; }
done

# trace_overhead: one native run per depth, callgrind off and on for both depths.
if ! TRACE_OVERHEAD_BUILD=0 TRACE_OVERHEAD_RUNS=1 TRACE_OVERHEAD_PAIRS=16384 \
    "$src/bench/trace_overhead.sh" "$build" >"$out" 2>&1; then
    echo "FAIL: bench/trace_overhead.sh failed"; cat "$out"; exit 1
fi
for depth in 16 0; do
    # stack-depth tracing-off tracing-on added: tracing costs instructions, and more with stacks
    awk -v d="$depth" '$1 == d && NF == 4 && $2 + 0 > 0 && $3 + 0 > $2 + 0 { ok = 1 } END { exit !ok }' "$out" ||
        { echo "FAIL: bench/trace_overhead.sh printed no instruction row for depth $depth"; cat "$out"; fail=1; }
done
[ "$(grep -c 'added by tracing' "$out")" = 2 ] ||
    { echo "FAIL: bench/trace_overhead.sh did not print both native runs"; cat "$out"; fail=1; }
# A callgrind run that succeeds but leaves no profile (here tracing on, through a valgrind that
# writes none) gives no figure: trace_overhead.sh says which run and exits 1. It printed 0.0 for it,
# and an "added" column of minus the cost of tracing off, with exit status 0.
fake=$(mktemp -d)
cat >"$fake/valgrind" <<EOF
#!/bin/sh
case " \$* " in *" --toggle-collect=overhead_timed_on "*) exit 0 ;; esac
exec "$(command -v valgrind)" "\$@"
EOF
chmod +x "$fake/valgrind"
rc=0
PATH="$fake:$PATH" TRACE_OVERHEAD_BUILD=0 TRACE_OVERHEAD_NATIVE=0 "$src/bench/trace_overhead.sh" "$build" >"$out" 2>&1 || rc=$?
rm -rf "$fake"
if [ "$rc" != 1 ] || ! grep -q "callgrind run on/depth 16 counted no instructions" "$out"; then
    echo "FAIL: bench/trace_overhead.sh exited $rc after a callgrind run without a count (expected 1, naming it)"
    cat "$out"; fail=1
fi
# --help: each script prints its header (the line naming it first) and exits 0; an option it does
# not know is refused with status 1 (it was taken for a build folder: "ninja: chdir to '--help'").
for s in fastpath.sh trace_overhead.sh allocview_speed.sh fragmentation.sh; do
    rc=0
    "$src/bench/$s" --help >"$out" 2>&1 || rc=$?
    [ "$rc" = 0 ] && head -1 "$out" | grep -q "^$s " ||
        { echo "FAIL: bench/$s --help: exit $rc, first line: $(head -1 "$out")"; fail=1; }
    rc=0
    "$src/bench/$s" --bogus >"$out" 2>&1 || rc=$?
    [ "$rc" = 1 ] && grep -q "unknown option '--bogus'" "$out" ||
        { echo "FAIL: bench/$s --bogus: exit $rc, $(cat "$out")"; fail=1; }
done
for p in cross_stream trace_overhead; do
    rc=0
    "$build/bench/$p" --help >"$out" 2>&1 || rc=$?
    [ "$rc" = 0 ] && grep -q "^usage: $p " "$out" || { echo "FAIL: bench/$p --help: exit $rc, $(cat "$out")"; fail=1; }
done
for bad in "--steps 7x" "--seed -1" "--steps"; do
    rc=0
    "$build/bench/cross_stream" $bad >/dev/null 2>"$out" || rc=$?
    [ "$rc" = 2 ] && grep -q "^cross_stream: .*--s" "$out" || { echo "FAIL: cross_stream $bad: exit $rc, $(cat "$out")"; fail=1; }
done
[ "$fail" = 0 ] && echo "bench scripts: fastpath.sh and trace_overhead.sh ran and printed every row; every script's --help"
exit "$fail"
