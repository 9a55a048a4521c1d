#!/bin/sh
# check_help.sh — every script and program a user runs answers --help: exit status 0, its usage on
# standard output naming it, nothing on standard error, within 20 s (a script that took --help for
# a build folder, or ran its whole job, fails here), and no file left in the folder it ran in. The
# programs (allocview, cualloc-demo, cualloc-conf) exit non-zero, saying so, when standard output
# cannot be written.
#
# usage: check_help.sh SOURCE_ROOT BUILD_ROOT
set -u
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# check NAME COMMAND...: COMMAND --help, run in an empty folder.
check() {
    name=$1
    shift
    rm -rf "$work/cwd" && mkdir "$work/cwd"
    (cd "$work/cwd" && timeout 20 "$@" --help >"$work/out" 2>"$work/err")
    rc=$?
    if [ "$rc" != 0 ]; then
        echo "FAIL: $name --help exited $rc: $(head -2 "$work/err" "$work/out" | tr '\n' ' ')"; fail=1
    elif [ -s "$work/err" ]; then
        echo "FAIL: $name --help wrote to standard error: $(head -2 "$work/err" | tr '\n' ' ')"; fail=1
    elif ! grep -q -- "$name" "$work/out"; then
        echo "FAIL: $name --help does not name it: $(head -2 "$work/out" | tr '\n' ' ')"; fail=1
    elif [ -n "$(ls -A "$work/cwd")" ]; then
        echo "FAIL: $name --help left files behind: $(ls -A "$work/cwd" | tr '\n' ' ')"; fail=1
    else
        echo "ok: $name --help ($(wc -l <"$work/out") lines)"
    fi
}

for s in bench/allocview_speed.sh bench/fastpath.sh bench/fragmentation.sh bench/trace_overhead.sh \
         bench/gpu/run.sh bench/gpu/carry-libs.sh tools/run-tests.sh tools/update-readme-conf.sh; do
    check "$(basename "$s")" "$src/$s"
done
for p in bench/gpu/torch_train.py bench/gpu/torch_api.py bench/gpu/summarize.py bench/gpu/viewer_check.py \
         tools/cualloc_torch.py; do
    check "$(basename "$p")" python3 "$src/$p"
done
for p in tools/allocview/allocview tools/cualloc-demo tools/cualloc-conf bench/fastpath bench/trace_overhead \
         bench/trace_synth bench/cross_stream bench/driver_costs bench/property_cuda; do
    if [ -x "$build/$p" ]; then
        check "$(basename "$p")" "$build/$p"
    else
        echo "not built here: $p"
    fi
done
# The programs also say when standard output cannot be written (a full disk), with a status other
# than 0; the scripts' usage is sed's and the shell's to write.
if [ -w /dev/full ]; then
    for p in tools/allocview/allocview tools/cualloc-demo tools/cualloc-conf; do
        [ -x "$build/$p" ] || continue
        "$build/$p" --help >/dev/full 2>"$work/err"; rc=$?
        if [ "$rc" = 0 ] || ! grep -q "writing standard output failed" "$work/err"; then
            echo "FAIL: $(basename "$p") --help into a full disk: exit $rc, $(head -1 "$work/err")"; fail=1
        else
            echo "ok: $(basename "$p") --help into a full disk: exit $rc"
        fi
    done
    CUALLOC_CONF=driver:sim "$build/tools/cualloc-demo" --steps 1 >/dev/full 2>"$work/err"; rc=$?
    [ "$rc" = 2 ] && grep -q "writing standard output failed" "$work/err" ||
        { echo "FAIL: cualloc-demo into a full disk: exit $rc, $(head -1 "$work/err")"; fail=1; }
fi
exit $fail
