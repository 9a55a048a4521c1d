#!/usr/bin/env bash
# check_replay.sh TRACE_FIXTURE REPLAY_FIXTURE ALLOCVIEW — `allocview replay` against deterministic
# traces recorded on the sim device (tests/trace_fixture.c, tests/replay_fixture.c):
#  1. replay under the recording configuration reproduces the recorded peaks (requested, allocated,
#     reserved, from `allocview summary --json`) exactly — default (VMM) and classic recordings,
#     one and two devices;
#  2. a trace with an OOM recorded under a small cap completes in replay with a larger --memory;
#  3. classic mode (expandable_segments:0) reserves more than the default on a fragmenting trace;
#  4. --min-fit finds a capacity on which the sequence completes, and one granule less fails (or
#     the report says "not monotone"), and none a few granules under it completes;
#  5. --json: a list, one object per --conf, exactly the fixed keys;
#  6. blocks whose addresses differ only in the top bits stay apart;
#  7. usage errors exit 1, an unreadable trace exits 2; capacities past the largest sim device (1 PiB)
#     are refused (--memory), searched no further (--min-fit) or cut to it (a recorded one); keys of
#     a --conf that replay sets itself are named as ignored;
#  8. --passes N closes each pass so that the next starts where the trace started: the peak of
#     requested bytes over several passes is that of one;
#  9. --cudafree replays every free device-wide: the same requests and no OOM at any --device-lag
#     (what the bound on waiting bytes buys is tested in test_streams and measured in
#     bench/RESULTS.md); --device-lag alone or out of range is a usage error.
set -u
trace_fixture=$1 replay_fixture=$2 allocview=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
command -v python3 >/dev/null 2>&1 || { echo "python3 not found; skipping"; exit 77; }
unset RANK LOCAL_RANK

# jq-free JSON field reader: jget FILE EXPR (python expression over `j`)
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# The recorded peaks of TRACE (summary) against replay --conf recorded.
check_reproduces() { # NAME TRACE
    "$allocview" summary --json "$2" >"$tmp/$1.summary.json" || bad "$1: summary exited $?"
    "$allocview" replay --conf recorded --json "$2" >"$tmp/$1.replay.json" 2>"$tmp/$1.replay.err" ||
        bad "$1: replay exited $? ($(cat "$tmp/$1.replay.err"))"
    for k in requested allocated reserved; do
        want=$(jget "$tmp/$1.summary.json" "j['peak_${k}_bytes']")
        got=$(jget "$tmp/$1.replay.json" "j[0]['peak_${k}_bytes']")
        # (a key missing from both would read "" = "": a number is required)
        [ -n "$want" ] && [ "$want" = "$got" ] || bad "$1: replay peak $k '$got', recorded '$want'"
    done
    want=$(jget "$tmp/$1.summary.json" "j['num_ooms']")
    got=$(jget "$tmp/$1.replay.json" "j[0]['num_ooms']")
    [ -n "$want" ] && [ "$want" = "$got" ] || bad "$1: replay OOMs '$got', recorded '$want'"
}

# 1. Reproduction: trace_fixture (two devices, initial blocks, streams, trim, an OOM), and
#    replay_fixture recorded under the default and under classic mode.
CUALLOC_CONF=driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:0 "$trace_fixture" "$tmp/fx.trace" \
    2>/dev/null || bad "trace_fixture failed"
check_reproduces fixture "$tmp/fx.trace"
CUALLOC_CONF=driver:sim,sim_memory_mb:1024,trace_stack_depth:0 "$replay_fixture" "$tmp/frag.trace" ||
    bad "replay_fixture (default) failed"
check_reproduces frag_default "$tmp/frag.trace"
CUALLOC_CONF=driver:sim,sim_memory_mb:1024,trace_stack_depth:0,expandable_segments:0 "$replay_fixture" \
    "$tmp/frag_classic.trace" || bad "replay_fixture (classic) failed"
check_reproduces frag_classic "$tmp/frag_classic.trace"
# The recording configuration spelled out is the same as 'recorded'.
"$allocview" replay --conf expandable_segments:0 --json "$tmp/frag_classic.trace" >"$tmp/c.json"
[ "$(jget "$tmp/c.json" "j[0]['peak_reserved_bytes']")" = "$(jget "$tmp/frag_classic.replay.json" "j[0]['peak_reserved_bytes']")" ] ||
    bad "--conf expandable_segments:0 differs from --conf recorded on a classic trace"

# 2. The fixture's OOM (1000 MiB on a 256 MiB device) goes through with 2 GiB.
[ "$(jget "$tmp/fixture.replay.json" "j[0]['num_ooms']")" -ge 1 ] || bad "the fixture's OOM did not recur at 256 MiB"
"$allocview" replay --memory 2GiB --json "$tmp/fx.trace" >"$tmp/big.json" || bad "replay --memory 2GiB exited $?"
[ "$(jget "$tmp/big.json" "j[0]['num_ooms']")" = 0 ] || bad "--memory 2GiB: OOMs remain: $(cat "$tmp/big.json")"
"$allocview" replay --memory 2147483648 --json "$tmp/fx.trace" | cmp -s - "$tmp/big.json" || bad "--memory in bytes differs from 2GiB"
# The capacity simulated is whole granules (2 MiB here): the header says what ran, not what was typed.
"$allocview" replay --memory 3MiB "$tmp/fx.trace" 2>/dev/null | grep -q "sim memory 4.00 MiB per device" ||
    bad "replay --memory 3MiB does not state the 4 MiB it simulates"

# 3. Classic reserves more than the default on the fragmenting trace.
"$allocview" replay --conf default --conf expandable_segments:0 --json "$tmp/frag.trace" >"$tmp/modes.json" ||
    bad "replay of two confs exited $?"
d=$(jget "$tmp/modes.json" "j[0]['peak_reserved_bytes']")
c=$(jget "$tmp/modes.json" "j[1]['peak_reserved_bytes']")
[ "$c" -gt "$d" ] || bad "classic reserved $c, default $d: classic should reserve more here"

# 4. --min-fit, both modes.
"$allocview" replay --conf default --conf expandable_segments:0 --min-fit "$tmp/frag.trace" >"$tmp/fit.txt" ||
    bad "--min-fit exited $?"
"$allocview" replay --conf default --conf expandable_segments:0 --min-fit --json "$tmp/frag.trace" >"$tmp/fit.json" ||
    bad "--min-fit --json exited $?"
for i in 0 1; do
    conf=$(jget "$tmp/fit.json" "j[$i]['conf']")
    m=$(jget "$tmp/fit.json" "j[$i]['min_fit_bytes']")
    case $m in ''|None) bad "$conf: no min_fit_bytes"; continue ;; esac
    "$allocview" replay --conf "$conf" --memory "$m" --json "$tmp/frag.trace" >"$tmp/at.json"
    [ "$(jget "$tmp/at.json" "j[0]['num_ooms']")" = 0 ] || bad "$conf: OOMs at min-fit $m"
    below=$((m - 2 * 1024 * 1024))
    "$allocview" replay --conf "$conf" --memory "$below" --json "$tmp/frag.trace" >"$tmp/below.json"
    if [ "$(jget "$tmp/below.json" "j[0]['num_ooms']")" = 0 ] && ! grep -q "NOT MONOTONE" "$tmp/fit.txt"; then
        bad "$conf: $below (min-fit minus a granule) completes too"
    fi
    # at least peak requested, and utilisation at min-fit is reported in the text
    req=$(jget "$tmp/fit.json" "j[$i]['peak_requested_bytes']")
    [ "$m" -ge "$req" ] || bad "$conf: min-fit $m below the peak requested $req"
done
grep -q "^min-fit" "$tmp/fit.txt" || bad "--min-fit text: $(cat "$tmp/fit.txt")"
# Completion is not monotone in capacity (classic mode on this trace: 390 MiB completes, 392 MiB
# fails, 394 MiB completes): no capacity a few granules under the min-fit may complete.
for conf in default expandable_segments:0; do
    m=$("$allocview" replay --conf "$conf" --min-fit --json "$tmp/frag.trace" 2>/dev/null | python3 -c \
        "import json,sys; print(json.load(sys.stdin)[0]['min_fit_bytes'])")
    for k in 2 3 4; do
        below=$((m - k * 2 * 1024 * 1024))
        n=$("$allocview" replay --conf "$conf" --memory "$below" --json "$tmp/frag.trace" 2>/dev/null | python3 -c \
            "import json,sys; print(json.load(sys.stdin)[0]['num_ooms'])")
        [ "$n" != 0 ] || bad "$conf: $below ($k granules under the min-fit $m) completes"
    done
done

# 5. JSON keys, exactly; min_fit_bytes null without --min-fit.
python3 - "$tmp/modes.json" "$tmp/fit.json" <<'PY' || bad "replay --json keys"
import json, sys
keys = {"conf", "passes", "cudafree", "device_lag", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "utilisation",
        "num_ooms", "num_syncs", "min_fit_bytes"}
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert isinstance(a, list) and len(a) == 2, a
for o in a + b:
    assert set(o) == keys, sorted(o)
    assert o["peak_reserved_bytes"] >= o["peak_allocated_bytes"] >= o["peak_requested_bytes"] > 0, o
    assert abs(o["utilisation"] - o["peak_allocated_bytes"] / o["peak_reserved_bytes"]) < 1e-5, o
for o in a:
    assert o["min_fit_bytes"] is None, o
for o in b:
    assert isinstance(o["min_fit_bytes"], int), o
assert [o["conf"] for o in a] == ["default", "expandable_segments:0"]
PY

# 6. Any address is a block's: two blocks whose addresses differ only above bit 55, allocated and
#    freed in turn, then two more (an imported snapshot, built here). Every free must find its own
#    block: the replay peaks at the two live blocks, 2 MiB, not 3 (a free that missed leaks one).
python3 - "$tmp/hi.pickle" <<'PY'
import pickle, sys
A, M = 0x7f0000000000, 1 << 20
B = A + (1 << 56)
ev = []
def e(action, addr, size):
    ev.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": len(ev) + 1,
               "frames": []})
e("segment_alloc", A, 4 * M); e("segment_alloc", B, 4 * M)
e("alloc", A, M); e("alloc", B, M)
e("free_requested", A, M); e("free_completed", A, M)
e("free_requested", B, M); e("free_completed", B, M)
e("alloc", A + M, M); e("alloc", B + M, M)
pickle.dump({"segments": [], "device_traces": [ev]}, open(sys.argv[1], "wb"), protocol=2)
PY
"$allocview" import "$tmp/hi.pickle" -o "$tmp/hi.trace" >/dev/null 2>&1 || bad "import of the high-address snapshot failed"
"$allocview" replay --json "$tmp/hi.trace" >"$tmp/hi.json" || bad "replay of the high-address trace failed"
python3 - "$tmp/hi.json" <<'PY' || bad "high addresses: a free found another block"
import json, sys
o = json.load(open(sys.argv[1]))[0]
assert o["peak_requested_bytes"] == 2 << 20 and o["peak_allocated_bytes"] == 2 << 20, o
PY

# 7. Usage and unreadable input.
for m in 12XB 0x10 0x1p30 " 2GiB" +2GiB -0 inf; do
    "$allocview" replay --memory "$m" "$tmp/fx.trace" >/dev/null 2>&1; [ $? = 1 ] || bad "bad --memory '$m': want exit 1"
done
# Each refusal names what was wrong, in the --name=V form as in the --name V one.
many=$(for i in $(seq 33); do printf -- '--conf=expandable_segments:0 '; done)
while IFS='|' read -r args want; do
    rc=0
    "$allocview" replay $args "$tmp/fx.trace" >/dev/null 2>"$tmp/usage.err" || rc=$?
    [ $rc = 1 ] && grep -qF "$want" "$tmp/usage.err" || bad "replay $args: exit $rc, said '$(cat "$tmp/usage.err")', want '$want'"
done <<CASES
--memory=0|allocview replay: bad --memory '0' (bytes, or e.g. 16GiB, 40G, 512MiB)
--memory 12XB|allocview replay: bad --memory '12XB' (bytes, or e.g. 16GiB, 40G, 512MiB)
$many|allocview replay: at most 32 --conf
CASES
# A capacity above the largest sim device (1 PiB, sim_memory_mb's bound) is refused as such, not
# left to fail for want of host memory; 1 PiB itself runs.
rc=0
"$allocview" replay --memory 2048TiB "$tmp/fx.trace" >/dev/null 2>"$tmp/usage.err" || rc=$?
[ $rc = 1 ] && grep -qF "bad --memory '2048TiB' (at most 1 PiB, the largest sim device)" "$tmp/usage.err" ||
    bad "--memory 2048TiB: exit $rc, said '$(cat "$tmp/usage.err")'"
# A ThreadSanitizer build cannot have the host tables of a 1 PiB sim device (their reservations
# and its shadow of them): there a run at 1 PiB may end in allocview's "out of host memory" (exit 2),
# which says so; every other build runs it.
tsan_build=0
ldd "$allocview" 2>/dev/null | grep -q libtsan && tsan_build=1
at_1pib_ok() { # EXIT: the run at 1 PiB completed, or met the TSan build's host memory limit
    [ "$1" = 0 ] || { [ $tsan_build = 1 ] && [ "$1" = 2 ] && grep -q "out of host memory" "$tmp/usage.err"; }
}
rc=0
"$allocview" replay --memory 1024TiB --json "$tmp/fx.trace" >/dev/null 2>"$tmp/usage.err" || rc=$?
at_1pib_ok $rc || bad "--memory 1024TiB (1 PiB): exit $rc, said '$(cat "$tmp/usage.err")'"
# --min-fit on requests that no sim device can hold: said, at once, not a capacity past 1 PiB tried.
python3 - "$tmp/huge.pickle" <<'PY'
import pickle, sys
A, M = 0x7f0000000000, 1 << 20
ev = []
def e(action, addr, size):
    ev.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": len(ev) + 1, "frames": []})
e("alloc", A, M); e("alloc", A + (1 << 62), 1 << 60); e("free_requested", A, M); e("free_completed", A, M)
pickle.dump({"segments": [], "device_traces": [ev]}, open(sys.argv[1], "wb"), protocol=2)
PY
"$allocview" import "$tmp/huge.pickle" -o "$tmp/huge.trace" >/dev/null 2>&1 || bad "import of the huge-request snapshot failed"
rc=0
"$allocview" replay --min-fit "$tmp/huge.trace" >"$tmp/huge.txt" 2>"$tmp/usage.err" || rc=$?
[ $rc = 0 ] && grep -q "no capacity up to 1 PiB completes" "$tmp/huge.txt" ||
    bad "--min-fit of a 1 EiB request: exit $rc, said '$(cat "$tmp/usage.err" "$tmp/huge.txt")'"
# A recorded capacity above 1 PiB is replayed on 1 PiB, with a line that says so.
"$allocview" import --device-memory 65536TiB "$tmp/huge.pickle" -o "$tmp/hugecap.trace" >/dev/null 2>&1 ||
    bad "import --device-memory 65536TiB failed"
rc=0
"$allocview" replay "$tmp/hugecap.trace" >/dev/null 2>"$tmp/usage.err" || rc=$?
at_1pib_ok $rc && grep -q "is above the largest sim device; replaying on 1 PiB" "$tmp/usage.err" ||
    bad "replay of a 64 PiB recorded capacity: exit $rc, said '$(cat "$tmp/usage.err")'"
"$allocview" replay --conf no_such_key:1 "$tmp/fx.trace" >/dev/null 2>&1; [ $? = 1 ] || bad "bad --conf: want exit 1"
# Keys replay sets itself (the sim device is the trace's and --memory's) are named when a --conf
# gives them, not dropped without a word; the replay goes on.
rc=0
"$allocview" replay --conf sim_memory_mb:64,expandable_segments:0 --conf sim_vmm:0 --json "$tmp/frag.trace" \
    >"$tmp/over.json" 2>"$tmp/usage.err" || rc=$?
[ $rc = 0 ] &&
    grep -qF "allocview replay: --conf 'sim_memory_mb:64,expandable_segments:0': sim_memory_mb is replay's own (--memory); ignored" "$tmp/usage.err" &&
    grep -qF "allocview replay: --conf 'sim_vmm:0': sim_vmm is replay's own (the trace's device); ignored" "$tmp/usage.err" ||
    bad "--conf with replay's own keys: exit $rc, said '$(cat "$tmp/usage.err")'"
"$allocview" replay --conf expandable_segments:0,sim_va_base:0x100000000 --json "$tmp/frag.trace" >/dev/null 2>"$tmp/usage.err"
! grep -q "ignored" "$tmp/usage.err" || bad "--conf expandable_segments:0 said '$(cat "$tmp/usage.err")'"
"$allocview" replay >/dev/null 2>&1; [ $? = 1 ] || bad "no trace: want exit 1"
"$allocview" replay "$tmp/missing.trace" >/dev/null 2>&1; [ $? = 2 ] || bad "missing trace: want exit 2"
"$allocview" replay --help | grep -q "usage: allocview replay" || bad "replay --help"

# 8. Passes. The fixture has initial blocks (one freed during the trace), two devices, streams, a
#    trim and an OOM (retried, with 2 GiB, and left live to the end of its pass). A block left live
#    by the closing of a pass, or an initial block not allocated again, would move the peak.
for tr in fx frag; do
    "$allocview" replay --memory 2GiB --json "$tmp/$tr.trace" >"$tmp/$tr.p1.json" || bad "$tr: replay exited $?"
    "$allocview" replay --memory 2GiB --passes 4 --json "$tmp/$tr.trace" >"$tmp/$tr.p4.json" || bad "$tr: --passes 4 exited $?"
    python3 - "$tmp/$tr.p1.json" "$tmp/$tr.p4.json" <<'PY' || bad "$tr: four passes differ from one"
import json, sys
one, four = (json.load(open(f))[0] for f in sys.argv[1:3])
assert one["passes"] == 1 and four["passes"] == 4, (one, four)
assert four["peak_requested_bytes"] == one["peak_requested_bytes"], (one, four)
assert four["num_ooms"] == 0 and one["num_ooms"] == 0, (one, four)
PY
done
"$allocview" replay --passes 4 "$tmp/fx.trace" | grep -q "; 4 passes (peaks over all of them)" || bad "--passes: not said in the text"
for v in 0 1001 x ""; do
    "$allocview" replay --passes "$v" "$tmp/fx.trace" >/dev/null 2>"$tmp/passes.err"; [ $? = 1 ] || bad "--passes '$v': want exit 1"
    grep -q "bad --passes" "$tmp/passes.err" || bad "--passes '$v': $(cat "$tmp/passes.err")"
done

# 9. Every free as cudaFree. Under lag 0 the device finishes each request's work before the next;
#    under lag 100000 it never finishes during the replay, so only waits (the heap's bound on
#    waiting device-wide bytes, and its synchronize before mapping) make memory reusable.
for lag in 0 100000; do
    "$allocview" replay --memory 2GiB --passes 2 --cudafree --device-lag $lag --json "$tmp/frag.trace" \
        >"$tmp/cf$lag.json" || bad "--cudafree --device-lag $lag exited $?"
done
"$allocview" replay --memory 2GiB --passes 2 --json "$tmp/frag.trace" >"$tmp/cfplain.json" || bad "plain replay exited $?"
python3 - "$tmp/cfplain.json" "$tmp/cf0.json" "$tmp/cf100000.json" <<'PY' || bad "--cudafree figures"
import json, sys
plain, lag0, lagbig = (json.load(open(f))[0] for f in sys.argv[1:4])
assert plain["cudafree"] is False and lag0["cudafree"] is True and lagbig["device_lag"] == 100000, (plain, lagbig)
for o in (lag0, lagbig):
    assert o["peak_requested_bytes"] == plain["peak_requested_bytes"], (plain, o)
    assert o["num_ooms"] == 0 and o["peak_reserved_bytes"] >= o["peak_allocated_bytes"], o
PY
"$allocview" replay --cudafree --device-lag 64 "$tmp/frag.trace" >"$tmp/cf.txt"
grep -q "every free replayed as cudaFree" "$tmp/cf.txt" || bad "--cudafree: not said in the text"
grep -q "^waits for the device (synchronizations and event waits): default [0-9]" "$tmp/cf.txt" || bad "--cudafree: no waits line"
"$allocview" replay --device-lag 4 "$tmp/frag.trace" >/dev/null 2>"$tmp/lag.err"; [ $? = 1 ] || bad "--device-lag without --cudafree: want exit 1"
grep -q "needs --cudafree" "$tmp/lag.err" || bad "--device-lag without --cudafree: $(cat "$tmp/lag.err")"
for v in -1 1000001 x ""; do
    "$allocview" replay --cudafree --device-lag "$v" "$tmp/frag.trace" >/dev/null 2>&1; [ $? = 1 ] || bad "--device-lag '$v': want exit 1"
done

[ $fail = 0 ] && echo "check_replay: all passed"
exit $fail
