#!/bin/bash
# check_library_host_oom.sh — libcualloc when host memory runs out. All of cualloc's own host memory
# (the heap record, free indexes, chunk tables, block records, the map of live blocks, the
# recorder's tables) is anonymous mappings; tests/failing_mmap.c, preloaded, refuses the k-th of
# them, alone (a passing shortage) or with every later one (memory gone for good). For each
# scenario below a run with no failure counts the process's mappings, then every k from 1 to that
# count is refused in both ways. Each run must end as a program with a working allocator ends:
#   - never killed by a signal, never hung;
#   - exit 0: the work completed and cualloc's own checks agree (for the demo: "heap check
#     consistent", "stats agree with the demo's own counts", "completed yes");
#   - exit 1 (an allocation failed): stderr has cualloc's message saying that host memory ran out
#     (not a device error's name for it, which would send the user to the device), and the program's
#     own line for the failed allocation;
#   - under the driver front door, every allocation is usable memory or an out-of-memory error,
#     every free succeeds, and a failed allocation comes with a word from cualloc, which says that
#     host memory ran out when the one refused mapping was its own (not the fake driver's device
#     memory); after one refused mapping alone, cualloc serves again (a heap that could not be set
#     up is set up later);
#   - with the recorder on, the trace file, when there is one, reads whole (allocview summary); a
#     recorder refused memory says so on stderr (it could not start, or its records from then on
#     may lack stacks or names), and then its trace has a LOST record, which the report, summary,
#     export, timeline, diff and folded take (the views warn, their --json says recorder_lost); one
#     that said nothing, in a run that completed, wrote a trace whose report is the full run's;
#     after one refused mapping, the trace has every module the full run's has;
#   - allocview replay, whose heaps and sim device are the library's (replaying the demo's trace
#     under two configurations): the full run's figures to the byte, or "allocview: out of host
#     memory" with status 2 and nothing on standard output, never other figures.
#
# usage: check_library_host_oom.sh FAILING_MMAP_SO CUALLOC_DEMO ALLOCVIEW INTERPOSE_DRIVER_PROG
#   (the last runs with libcualloc.so preloaded on the fake driver: the environment must set
#   LD_LIBRARY_PATH to the fake's folder and CUALLOC_LIB to libcualloc.so)
set -u
shim=$1
demo=$2
av=$3
driver_prog=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
runs=0
lost_runs=0

# run SCENARIO K PERSIST: one run, refusing mapping K (0: none); stdout+stderr in $tmp/out, status in rc.
run() {
    local scenario=$1 k=$2 persist=$3 conf preload=$shim
    rm -f "$tmp/t.trace"
    case $scenario in
    demo) conf="" ;;
    classic) conf="expandable_segments:0" ;;
    trace) conf="trace:$tmp/t.trace,trace_stack_depth:16" ;;
    ring) conf="trace:$tmp/t.trace,trace_max_mb:1,trace_ring:1,trace_stack_depth:4" ;;
    esac
    if [ "$scenario" = replay ]; then
        LD_PRELOAD=$preload FAILING_MMAP_NTH=$k FAILING_MMAP_PERSIST=$persist FAILING_MMAP_REPORT=1 \
            timeout 60 "$av" replay --conf default --conf expandable_segments:0 "$tmp/demo.trace" \
            >"$tmp/stdout" 2>"$tmp/out"
    elif [ "$scenario" = preload ]; then
        LD_PRELOAD="$CUALLOC_LIB $shim" FAILING_MMAP_NTH=$k FAILING_MMAP_PERSIST=$persist FAILING_MMAP_REPORT=1 \
            CUALLOC_CONF=driver:cuda,sim_host_backed:1,sim_memory_mb:256 \
            timeout 60 "$driver_prog" --host-oom >"$tmp/out" 2>&1
    else
        LD_PRELOAD=$preload FAILING_MMAP_NTH=$k FAILING_MMAP_PERSIST=$persist FAILING_MMAP_REPORT=1 \
            CUALLOC_CONF="$conf" timeout 60 "$demo" --quiet --steps 6 >"$tmp/out" 2>&1
    fi
    rc=$?
    runs=$((runs + 1))
}

# The modules a trace records (path and build id: their addresses differ from run to run).
modules() { "$av" dump "$1" | sed -n 's/^#[0-9]* module .*build_id=\([^ ]*\) path=\(.*\)$/\2 \1/p' | sort -u; }

# judge SCENARIO WHAT PERSIST: the rules above for the run just made.
judge() {
    local scenario=$1 what=$2
    if [ "$rc" -ge 124 ]; then
        bad "$what: killed or hung (status $rc)"
        tail -5 "$tmp/out"
        return
    fi
    if [ "$scenario" = replay ]; then
        if [ "$rc" = 0 ]; then
            cmp -s "$tmp/stdout" "$tmp/replay.ref" ||
                { bad "$what: exit 0 with figures other than the full run's"; diff "$tmp/replay.ref" "$tmp/stdout" | head -6; }
        elif [ "$rc" = 2 ]; then
            grep -q "^allocview: out of host memory" "$tmp/out" && [ ! -s "$tmp/stdout" ] ||
                { bad "$what: exit 2, but not 'out of host memory' with nothing on standard output"; tail -3 "$tmp/out"; }
        else
            bad "$what: exit status $rc"
            tail -5 "$tmp/out"
        fi
        return
    fi
    if [ "$scenario" = preload ]; then
        grep -q "^interpose_driver_prog --host-oom: all checks passed" "$tmp/out" ||
            { bad "$what: the program's checks failed (status $rc)"; tail -5 "$tmp/out"; }
        # (the fake driver's device memory is anonymous mappings too: a refused one is the device's
        # shortage, which cualloc reports as such, or CUDA's own when the heap could not be set up)
        grep -q "^host-oom: .*, 0 failed" "$tmp/out" || grep -q "^cualloc: " "$tmp/out" ||
            bad "$what: allocations failed and cualloc said nothing"
        # One of cualloc's own mappings refused: what failed for it says host memory.
        if [ "$3" = 0 ] && grep -q "^failing_mmap: .* the first by .*libcualloc" "$tmp/out"; then
            if grep -q "^cualloc: .*cannot set up the heap" "$tmp/out" || ! grep -q "^host-oom: .*, 0 failed" "$tmp/out"; then
                grep -q "^cualloc: .*host memory ran out" "$tmp/out" ||
                    { bad "$what: cualloc's own mapping refused, and it did not say that host memory ran out"; grep "^cualloc" "$tmp/out" | head -3; }
            fi
        fi
        # A passing shortage passes: a heap that could not be set up is set up at a later allocation.
        if [ "$3" = 0 ] && grep -q "^host-oom: .*cualloc served 0$" "$tmp/out"; then
            bad "$what: one refused mapping, and cualloc served nothing after it"
        fi
    elif [ "$rc" = 0 ]; then
        grep -q "heap check *consistent" "$tmp/out" && grep -q "stats agree with the demo's own counts" "$tmp/out" &&
            grep -q "completed *yes" "$tmp/out" || { bad "$what: exit 0 without a completed, consistent run"; tail -5 "$tmp/out"; }
    elif [ "$rc" = 1 ]; then
        grep -q "^cualloc: .*host memory ran out" "$tmp/out" ||
            { bad "$what: an allocation failed and cualloc did not say that host memory ran out"; grep -v '^ \|^step' "$tmp/out" | tail -5; }
        grep -q "allocation of .* failed" "$tmp/out" || bad "$what: exit 1 without the demo's failed allocation"
    else
        bad "$what: exit status $rc"
        tail -5 "$tmp/out"
    fi
    if [ -e "$tmp/t.trace" ]; then
        "$av" summary "$tmp/t.trace" >"$tmp/summary" 2>&1 ||
            { bad "$what: allocview cannot read the trace"; tail -3 "$tmp/summary"; }
    fi
    if [ "$scenario" = trace ] || [ "$scenario" = ring ]; then
        # One refused mapping costs a record at most: every module is in the trace all the same
        # (a module scan refused memory is made again), so frames still get their names.
        if [ "$3" = 0 ] && [ "$rc" = 0 ] && [ -e "$tmp/t.trace" ] && [ -e "$tmp/$scenario.modules" ]; then
            modules "$tmp/t.trace" >"$tmp/modules"
            cmp -s "$tmp/modules" "$tmp/$scenario.modules" ||
                { bad "$what: the trace lacks modules the full run's has"; diff "$tmp/$scenario.modules" "$tmp/modules" | head -4; }
        fi
        # A table refused while recording is in the trace too (LOST), so that a report read long
        # after the message tells the frames and stacks the recorder lost from the program's.
        if grep -q "^cualloc: trace .*records from now on may lack" "$tmp/out" && [ -e "$tmp/t.trace" ]; then
            lost_runs=$((lost_runs + 1))
            "$av" dump "$tmp/t.trace" 2>/dev/null | grep -q "^#[0-9]* lost .*table=" ||
                bad "$what: the recorder said a table was refused, and its trace has no LOST record"
            "$av" report --no-color "$tmp/t.trace" 2>&1 | grep -q "^  warning   the recorder ran out of host memory" ||
                bad "$what: the recorder said a table was refused, and the report does not warn"
            "$av" summary "$tmp/t.trace" 2>&1 | grep -q "^lost       the recorder ran out of host memory" ||
                bad "$what: the recorder said a table was refused, and the summary does not say so"
            "$av" export --pytorch "$tmp/t.pickle" "$tmp/t.trace" >/dev/null 2>"$tmp/export.err" ||
                { bad "$what: a trace with LOST records does not export"; head -2 "$tmp/export.err"; }
            # ... and so do the views that name call sites, and the JSON of each.
            "$av" timeline --no-color "$tmp/t.trace" 2>&1 | grep -q "^warning   the recorder ran out of host memory" ||
                bad "$what: the recorder said a table was refused, and the timeline does not warn"
            "$av" folded "$tmp/t.trace" 2>&1 >/dev/null | grep -q "warning: the recorder ran out of host memory" ||
                bad "$what: the recorder said a table was refused, and folded does not warn on stderr"
            "$av" diff "$tmp/t.trace" "$tmp/t.trace" 2>&1 | grep -q "^   warning   the recorder ran out of host memory" ||
                bad "$what: the recorder said a table was refused, and diff does not warn"
            for view in "report --json" "timeline --json" "summary --json"; do
                # shellcheck disable=SC2086
                "$av" $view "$tmp/t.trace" 2>/dev/null | grep -q '"recorder_lost": {"tables": \["' ||
                    bad "$what: the recorder said a table was refused, and $view has no recorder_lost"
            done
            "$av" diff --json "$tmp/t.trace" "$tmp/t.trace" 2>/dev/null | grep -q '"recorder_lost": {"a": true, "b": true}' ||
                bad "$what: the recorder said a table was refused, and diff --json has no recorder_lost"
        fi
        if ! grep -q "^cualloc: trace .*host memory ran out" "$tmp/out"; then
            if [ ! -e "$tmp/t.trace" ]; then
                bad "$what: no trace, and no word why"
            elif [ "$rc" = 0 ] && [ -e "$tmp/$scenario.report" ]; then
                # Nothing refused the recorder said: its trace must tell what the full run's does.
                "$av" report "$tmp/t.trace" 2>&1 | grep -v "pid " >"$tmp/report"
                cmp -s "$tmp/report" "$tmp/$scenario.report" ||
                    { bad "$what: the report differs from the full run's, and the recorder said nothing"; diff "$tmp/$scenario.report" "$tmp/report" | head -6; }
            fi
        fi
    fi
}

# The trace the replay scenario replays (recorded without the shim).
CUALLOC_CONF="trace:$tmp/demo.trace" "$demo" --quiet --steps 6 >/dev/null 2>&1 && [ -s "$tmp/demo.trace" ] ||
    { bad "the demo recorded no trace"; exit 1; }
for scenario in demo classic trace ring preload replay; do
    run "$scenario" 0 0
    if [ "$scenario" = replay ]; then
        [ "$rc" = 0 ] || { bad "replay: the run without a failure exited $rc"; cat "$tmp/out"; continue; }
        cp "$tmp/stdout" "$tmp/replay.ref"
    else
        judge "$scenario" "$scenario, nothing refused" 0
        grep -q "completed *yes\|all checks passed" "$tmp/out" ||
            { bad "$scenario: the run without a failure did not complete"; cat "$tmp/out"; continue; }
    fi
    n=$(sed -n 's/^failing_mmap: \([0-9]*\) calls.*/\1/p' "$tmp/out")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { bad "$scenario: no mapping counted (is the shim preloaded?)"; continue; }
    echo "$scenario: $n anonymous mappings"
    rm -f "$tmp/$scenario.report" "$tmp/$scenario.modules"
    if [ -e "$tmp/t.trace" ]; then
        "$av" report "$tmp/t.trace" 2>&1 | grep -v "pid " >"$tmp/$scenario.report"
        modules "$tmp/t.trace" >"$tmp/$scenario.modules"
        [ -s "$tmp/$scenario.modules" ] || bad "$scenario: the full run's trace has no module"
    fi
    for k in $(seq 1 "$n"); do
        for persist in 0 1; do
            run "$scenario" "$k" "$persist"
            judge "$scenario" "$scenario, mapping $k refused$([ "$persist" = 1 ] && echo ' and every later one')" "$persist"
        done
    done
done
echo "$runs runs ($lost_runs with a table refused while recording)"
[ "$lost_runs" -gt 0 ] || bad "no run refused a table while recording: the LOST checks checked nothing"
[ "$fail" = 0 ] && echo "check_library_host_oom: all runs ended cleanly"
exit "$fail"
