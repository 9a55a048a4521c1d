#!/bin/bash
# check_allocview_oom.sh — allocview when host memory runs out. allocview_failalloc is allocview
# with each allocation of its own, and of the cualloc library it links (replay's heaps and sim
# device), countable and failable (tests/failalloc.h); for each command
# below, a run with no failure counts its allocations and gives the reference output, then the
# allocation N fails, for N = 1 up to FAILALLOC_FIRST and then FAILALLOC_SPREAD more spread over the
# rest. Each such run must end either with exit status 2 and "out of host memory" on stderr,
# nothing on standard output and no output file (none half-written beside it either), or as the
# reference run did, the same output to the byte: never a crash, a sanitizer's report, or a
# different answer given as a whole one (a table that could not grow, dropped without a word).
#
# usage: check_allocview_oom.sh ALLOCVIEW_FAILALLOC TRACE_SCENARIOS
set -u
av=$1
scen=$2
first=${FAILALLOC_FIRST:-30}
spread=${FAILALLOC_SPREAD:-30}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

record() { # NAME SCENARIO CONF
    CUALLOC_CONF="driver:sim,$3" "$scen" "$2" "$tmp/$1.trace" 2>"$tmp/$1.err"
    [ -s "$tmp/$1.trace" ] || { cat "$tmp/$1.err"; bad "scenario $2 wrote no trace"; exit 1; }
}
record leakoom leak sim_memory_mb:70
record frag frag sim_memory_mb:512
record twodev twodev sim_memory_mb:512
"$av" export --pytorch "$tmp/frag.pickle" "$tmp/frag.trace" 2>"$tmp/export.err" ||
    { cat "$tmp/export.err"; bad "export of the frag trace failed"; exit 1; }

# run NAME N OUT: one run of command NAME with allocation N failing (0: none); its stdout, stderr and
# status in $tmp/NAME.{out,err,rc}; OUT, when given, is the file the command writes.
run() {
    local name=$1 n=$2 out=${3:-} rc
    rm -rf "$tmp/outdir" && mkdir "$tmp/outdir"
    shift 3
    FAILALLOC_AT=$n FAILALLOC_REPORT=1 "$av" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    echo "$rc" >"$tmp/$name.rc"
}

# sweep NAME OUTFILE|- ARGS...: the whole check for one command.
sweep() {
    local name=$1 out=$2 k n ns rc checked=0 failed_runs=0
    shift 2
    [ "$out" = - ] && out=
    run "$name" 0 "$out" "$@"
    rc=$(cat "$tmp/$name.rc")
    [ "$rc" = 0 ] || { cat "$tmp/$name.err"; bad "$name: the run without a failure exited $rc"; return; }
    k=$(sed -n 's/^failalloc: \([0-9]*\) allocations.*/\1/p' "$tmp/$name.err")
    [ -n "$k" ] && [ "$k" -gt 0 ] || { bad "$name: no allocation counted"; return; }
    cp "$tmp/$name.out" "$tmp/$name.ref"
    if [ -n "$out" ]; then cp "$out" "$tmp/$name.refout"; fi
    ns=$(seq 1 $((k < first ? k : first)))
    if [ "$k" -gt "$first" ]; then
        ns="$ns $(awk -v a="$first" -v k="$k" -v s="$spread" 'BEGIN { for (i = 1; i <= s; i++) printf "%d ", a + int((k - a) * i / s) }')"
    fi
    for n in $(echo $ns | tr ' ' '\n' | sort -un); do
        run "$name" "$n" "$out" "$@"
        rc=$(cat "$tmp/$name.rc")
        checked=$((checked + 1))
        local what="$name, allocation $n of $k failing"
        if [ "$rc" -ge 128 ]; then
            bad "$what: killed by signal $((rc - 128)): $(grep -v '^failalloc' "$tmp/$name.err" | head -3 | tr '\n' ' ')"
        elif grep -q "Sanitizer\|runtime error" "$tmp/$name.err"; then
            bad "$what: $(grep -m1 "Sanitizer\|runtime error" "$tmp/$name.err")"
        elif ! grep -q "^failalloc: .*failed at $n\$" "$tmp/$name.err"; then
            bad "$what: the failure was not made ($(grep '^failalloc' "$tmp/$name.err"))"
        elif [ "$rc" = 2 ] && grep -q "out of host memory" "$tmp/$name.err"; then
            failed_runs=$((failed_runs + 1))
            # nothing of the answer: these outputs are far smaller than allocview's 1 MiB buffer
            if [ -s "$tmp/$name.out" ]; then bad "$what: standard output kept $(wc -c <"$tmp/$name.out") bytes"; fi
            if [ -n "$(ls -A "$tmp/outdir")" ]; then bad "$what: left $(ls -A "$tmp/outdir" | tr '\n' ' ')"; fi
        elif [ "$rc" = 0 ] && cmp -s "$tmp/$name.out" "$tmp/$name.ref" &&
             { [ -z "$out" ] || cmp -s "$out" "$tmp/$name.refout"; }; then
            # the failure was absorbed (a cache that could not grow): the same answer, and no
            # partial file beside the output
            if [ "$(ls -A "$tmp/outdir")" != "$(basename "${out:-}")" ]; then
                bad "$what: left $(ls -A "$tmp/outdir" | tr '\n' ' ')"
            fi
        else
            bad "$what: exit $rc, $(grep -v '^failalloc' "$tmp/$name.err" | head -2 | tr '\n' ' ')$(
                cmp -s "$tmp/$name.out" "$tmp/$name.ref" || echo "; output differs: $(diff "$tmp/$name.ref" "$tmp/$name.out" | sed -n 2p)")"
        fi
    done
    echo "ok: $name: $k allocations, $checked failing in turn ($failed_runs ended out of host memory)"
}

sweep report - --no-color "$tmp/leakoom.trace"
sweep report-json - report --json "$tmp/leakoom.trace"
sweep report-twodev - --no-color "$tmp/twodev.trace"
sweep summary - summary --json "$tmp/frag.trace"
sweep timeline - timeline --no-color --width 60 "$tmp/frag.trace"
sweep timeline-json - timeline --json "$tmp/leakoom.trace"
sweep timeline-svg "$tmp/outdir/t.svg" timeline --svg "$tmp/outdir/t.svg" "$tmp/frag.trace"
sweep diff - diff "$tmp/frag.trace" "$tmp/leakoom.trace"
sweep diff-json - diff --json --all "$tmp/frag.trace" "$tmp/leakoom.trace"
sweep folded - folded "$tmp/leakoom.trace"
sweep peak - peak "$tmp/leakoom.trace"
sweep leaks - leaks "$tmp/leakoom.trace"
sweep oom - oom "$tmp/leakoom.trace"
sweep dump - dump --redact "$tmp/frag.trace"
sweep replay - replay --conf default --conf expandable_segments:0 --memory 70MiB "$tmp/leakoom.trace"
sweep import "$tmp/outdir/i.trace" import "$tmp/frag.pickle" -o "$tmp/outdir/i.trace"
sweep export "$tmp/outdir/e.pickle" export --pytorch "$tmp/outdir/e.pickle" "$tmp/frag.trace"
exit $fail
