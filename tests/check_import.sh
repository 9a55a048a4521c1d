#!/usr/bin/env bash
# check_import.sh ALLOCVIEW SNAPSHOT [VARLEN_SNAPSHOT] — `allocview import` of a real PyTorch snapshot (see
# shared/traces/README.md): the imported trace reads back, and its peaks match what the snapshot
# implies, computed here with python3 (a restricted unpickler: plain data only): reserved from the
# segments (final total_size - segment_alloc + segment_free at the start, then the segment events),
# allocated from the final allocated_size - allocs + frees, then the alloc/free_completed events;
# within 0.3% (the README's size-kind difference, about 0.25%); `allocview summary` of the import
# equals expected/import_summary_NAME.txt (UPDATE_EXPECTED=1 rewrites it); the report names call
# sites by the user's frames, PyTorch's machinery left out, cuts the run into the steps PyTorch's
# optimizer annotations mark, and names the optimizer's step as where the 2.7B run peaked.
# VARLEN_SNAPSHOT (a run with variable sequence lengths, optional): its report cuts it into steps
# and names the longest batch. Before those, always: the same on small snapshots made by
# tests/make_snapshot.py, and refusal of a pickle with objects in it; without the corpus snapshot
# only those run. Skips (77) without python3.
set -u
allocview=$1 snap=${CUALLOC_SNAPSHOT:-${2:-}} varlen=${3:-}
command -v python3 >/dev/null 2>&1 || { echo "python3 not found; skipping"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
st=0

# The report: call sites named by the frames that tell them apart, never by PyTorch's own
# machinery (its caching allocator, its stack capture, its dispatcher, the interpreter's loop,
# nn.Module's call wrappers), which every stack of a snapshot passes through.
machinery='unwind::unwind|CapturedTraceback|CUDACachingAllocator|_PyEval_|PyObject_|wrap_kernel_functor|Register[A-Za-z]*\.cpp|_call_impl|__libc_start|at::_ops'
check_report() { # TRACE NAME
    "$allocview" report --no-color "$1" >"$tmp/$2.txt" 2>&1 || { echo "FAIL: report on $2 exited $?"; st=1; }
    sed -n '/call sites holding memory at the peak/,/^Steps/p' "$tmp/$2.txt" >"$tmp/$2.sites"
    [ "$(grep -c ' <- \|^ *[0-9.]* [KMG]iB .*[a-z]' "$tmp/$2.sites")" -ge 3 ] || { echo "FAIL: $2: no call sites: $(cat "$tmp/$2.txt")"; st=1; }
    if grep -E "$machinery" "$tmp/$2.sites"; then echo "FAIL: $2: call sites named by PyTorch's machinery (above)"; st=1; fi
    grep -q '\.py:[0-9]*)' "$tmp/$2.sites" || { echo "FAIL: $2: no Python line names a site: $(cat "$tmp/$2.sites")"; st=1; }
    grep -q '^  step 1 ' "$tmp/$2.txt" || { echo "FAIL: $2: the optimizer's annotations do not cut steps: $(cat "$tmp/$2.txt")"; st=1; }
}

# Small snapshots made here (tests/make_snapshot.py), with real snapshots' frames: the operator and
# the user's line name each site; six annotated steps of drawn lengths are the longest batches'; a
# peak inside the annotated optimizer step is the optimizer's.
for kind in varlen optstep; do
    python3 "$(dirname "$0")/make_snapshot.py" "$tmp/made-$kind.pickle" $kind || { echo "FAIL: make_snapshot.py $kind"; st=1; }
    "$allocview" import "$tmp/made-$kind.pickle" -o "$tmp/made-$kind.trace" 2>/dev/null || { echo "FAIL: import of made-$kind exited $?"; st=1; }
    check_report "$tmp/made-$kind.trace" "made-$kind"
done
grep -q '  at::native::gelu <- forward (/home/u/model.py:20)$' "$tmp/made-varlen.sites" ||
    { echo "FAIL: made-varlen: want the operator and the user's line: $(cat "$tmp/made-varlen.sites")"; st=1; }
grep -q '^  step 6 ' "$tmp/made-varlen.txt" || { echo "FAIL: made-varlen: want 6 steps: $(cat "$tmp/made-varlen.txt")"; st=1; }
grep -q 'Longest batches: step 2 peaked at 384.00 MiB' "$tmp/made-varlen.txt" ||
    { echo "FAIL: made-varlen: $(sed -n '/^Diagnosis/,$p' "$tmp/made-varlen.txt")"; st=1; }
grep -q 'Optimizer step: the peak (320.00 MiB) lies inside the optimizer.s step (Optimizer.step#AdamW.step), whose own first allocations hold 256.00 MiB' "$tmp/made-optstep.txt" ||
    { echo "FAIL: made-optstep: $(sed -n '/^Diagnosis/,$p' "$tmp/made-optstep.txt")"; st=1; }
if grep -q 'Optimizer step:' "$tmp/made-varlen.txt"; then echo "FAIL: made-varlen: its peak is not in the optimizer"; st=1; fi
# An optimizer whose annotations are longer than most (a module path of 330 characters): its START
# and END still pair up, its steps still count, and `--at` finds its marks.
long=research_lab.training.optimizers.distributed.zero_redundancy.ShardedAdamWWithDecoupledWeightDecayAndGradientClipping
long=$long.$long.$long
python3 "$(dirname "$0")/make_snapshot.py" "$tmp/made-long.pickle" varlen "$long" || { echo "FAIL: make_snapshot.py long"; st=1; }
"$allocview" import "$tmp/made-long.pickle" -o "$tmp/made-long.trace" 2>/dev/null || { echo "FAIL: import of made-long exited $?"; st=1; }
"$allocview" report --no-color "$tmp/made-long.trace" >"$tmp/made-long.txt" 2>&1
grep -q '^  step 6 ' "$tmp/made-long.txt" || { echo "FAIL: made-long: want 6 steps: $(cat "$tmp/made-long.txt")"; st=1; }
"$allocview" peak --no-color --at "END Optimizer.step#$long.step" "$tmp/made-long.trace" >"$tmp/made-long-at.txt" 2>&1 ||
    { echo "FAIL: made-long: --at does not find the long mark: $(cat "$tmp/made-long-at.txt")"; st=1; }
grep -q '^State at END Optimizer.step#research_lab' "$tmp/made-long-at.txt" ||
    { echo "FAIL: made-long: --at: $(head -5 "$tmp/made-long-at.txt")"; st=1; }
# A diagnosis that quotes a name of 2000 characters and a call site is written whole (it was cut
# at 1024 bytes, mid-sentence).
huge=$long
for i in 1 2 3 4 5 6; do huge=$huge.$long; done
python3 "$(dirname "$0")/make_snapshot.py" "$tmp/made-huge.pickle" optstep "$huge" || { echo "FAIL: make_snapshot.py huge"; st=1; }
"$allocview" import "$tmp/made-huge.pickle" -o "$tmp/made-huge.trace" 2>/dev/null || { echo "FAIL: import of made-huge exited $?"; st=1; }
"$allocview" report --no-color "$tmp/made-huge.trace" >"$tmp/made-huge.txt" 2>&1
grep -q "Optimizer step: the peak (320.00 MiB) lies inside the optimizer.s step (Optimizer.step#$huge.step), .* — largest: at::native::empty_like <- step (/home/u/model.py:80), 64.00 MiB in 1 block\.$" "$tmp/made-huge.txt" ||
    { echo "FAIL: made-huge: the optimizer's diagnosis is not whole: $(grep 'Optimizer step' "$tmp/made-huge.txt" | cut -c1-200)..."; st=1; }

# A pickle with objects in it is refused with the opcode named.
printf '\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.' >"$tmp/evil.pickle"
"$allocview" import "$tmp/evil.pickle" -o "$tmp/evil.trace" 2>"$tmp/evil.err"
[ $? = 2 ] || { echo "FAIL: a pickle with STACK_GLOBAL was not refused"; st=1; }
grep -q "STACK_GLOBAL" "$tmp/evil.err" || { echo "FAIL: refusal does not name the opcode: $(cat "$tmp/evil.err")"; st=1; }
[ -n "$snap" ] && [ -r "$snap" ] || { echo "snapshot ${snap:-(none)} not found; the corpus checks are skipped"; [ $st = 0 ] && echo "check_import: made snapshots passed"; exit $st; }
"$allocview" import "$snap" -o "$tmp/t.trace" || { echo "FAIL: import exited $?"; exit 1; }
"$allocview" summary --json "$tmp/t.trace" >"$tmp/s.json" || { echo "FAIL: summary exited $?"; exit 1; }
"$allocview" replay --json "$tmp/t.trace" >"$tmp/r.json" || { echo "FAIL: replay exited $?"; exit 1; }
# The golden summary of the import (paths replaced): counts, initial state, peaks, live blocks.
expected_summary=$(dirname "$0")/expected/import_summary_$(basename "$snap" .pickle).txt
"$allocview" summary "$tmp/t.trace" | sed -e "s|$tmp/t.trace|TRACE|" -e "s|$snap|SNAPSHOT|" >"$tmp/summary.txt"
if [ "${UPDATE_EXPECTED:-0}" = 1 ]; then
    cp "$tmp/summary.txt" "$expected_summary"; echo "updated $expected_summary"
elif [ -r "$expected_summary" ]; then
    diff -u "$expected_summary" "$tmp/summary.txt" || { echo "FAIL: the import's summary differs from $expected_summary"; exit 1; }
else
    echo "FAIL: no golden summary $expected_summary (UPDATE_EXPECTED=1 to write it)"; exit 1
fi
python3 - "$snap" "$tmp/s.json" "$tmp/r.json" <<'PY'
import json, pickle, sys
class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused %s.%s" % (module, name))
snap = Plain(open(sys.argv[1], "rb")).load()
s = json.load(open(sys.argv[2])); r = json.load(open(sys.argv[3]))
ev = snap["device_traces"][0]
segs = [g for g in snap["segments"] if g["device"] == 0]
alloc = sum(g["allocated_size"] for g in segs) - sum(e["size"] for e in ev if e["action"] == "alloc") \
    + sum(e["size"] for e in ev if e["action"] == "free_completed")
res = sum(g["total_size"] for g in segs) - sum(e["size"] for e in ev if e["action"] == "segment_alloc") \
    + sum(e["size"] for e in ev if e["action"] == "segment_free")
pa, pr = alloc, res
for e in ev:
    a = e["action"]
    if a == "alloc": alloc += e["size"]
    elif a == "free_completed": alloc -= e["size"]
    elif a == "segment_alloc": res += e["size"]
    elif a == "segment_free": res -= e["size"]
    pa, pr = max(pa, alloc), max(pr, res)
G = 2.0 ** 30
print("snapshot implies: peak allocated %.3f GiB, reserved %.3f GiB; imported: requested %.3f, allocated %.3f, "
      "reserved %.3f GiB" % (pa / G, pr / G, s["peak_requested_bytes"] / G, s["peak_allocated_bytes"] / G,
                             s["peak_reserved_bytes"] / G))
ok = True
for name, want, got in (("allocated", pa, s["peak_allocated_bytes"]), ("reserved", pr, s["peak_reserved_bytes"])):
    if abs(got - want) > 0.003 * want:
        print("FAIL: peak %s %d, the snapshot implies %d" % (name, got, want)); ok = False
if s["num_allocs"] != sum(1 for e in ev if e["action"] == "alloc"):
    print("FAIL: num_allocs %d" % s["num_allocs"]); ok = False
if s["truncated"] or s["error"] is not None:
    print("FAIL: the imported trace does not read back cleanly: %s" % s); ok = False
if not (isinstance(r, list) and r[0]["peak_requested_bytes"] == s["peak_requested_bytes"]):
    print("FAIL: replay's peak requested differs from the trace's: %s" % r); ok = False
sys.exit(0 if ok else 1)
PY
[ $? = 0 ] || st=1
# Classic mode predicts PyTorch's default allocator: the replay reports its error against the
# reserved peak the snapshot records (0 on this snapshot).
"$allocview" replay "$tmp/t.trace" --conf default --conf expandable_segments:0 >"$tmp/replay.txt" 2>/dev/null
grep -q "^peak reserved against the recorded .*expandable_segments:0 +0.000%" "$tmp/replay.txt" ||
    { echo "FAIL: no prediction error reported, or not 0: $(cat "$tmp/replay.txt")"; st=1; }
check_report "$tmp/t.trace" snapshot
# Its peak lies inside the optimizer's (annotated) step, where AdamW's state is made.
grep -q 'Optimizer step: the peak (51.30 GiB) lies inside the optimizer.s step (Optimizer.step#AdamW.step)' "$tmp/snapshot.txt" ||
    [ "$(basename "$snap")" != pytorch-2.7b-ctx128-fullstep.pickle ] ||
    { echo "FAIL: snapshot: the optimizer step is not named: $(sed -n '/^Diagnosis/,$p' "$tmp/snapshot.txt")"; st=1; }
if [ -n "$varlen" ] && [ -r "$varlen" ]; then
    "$allocview" import "$varlen" -o "$tmp/v.trace" 2>/dev/null || { echo "FAIL: import of $varlen exited $?"; st=1; }
    check_report "$tmp/v.trace" varlen
    grep -q '^  step 6 ' "$tmp/varlen.txt" || { echo "FAIL: varlen: want 6 steps: $(cat "$tmp/varlen.txt")"; st=1; }
    grep -q 'Longest batch: step [0-9]* peaked at' "$tmp/varlen.txt" || { echo "FAIL: varlen: the longest batch is not named: $(tail -4 "$tmp/varlen.txt")"; st=1; }
    if grep -q 'Optimizer step:' "$tmp/varlen.txt"; then echo "FAIL: varlen: its peak is not in the optimizer"; st=1; fi
    # Steady state: the job's steps again and again. Reserved memory must not climb pass by pass
    # (parked large blocks once took it from 25.3 GiB in one pass to 54.1 GiB over ten).
    "$allocview" replay --json "$tmp/v.trace" >"$tmp/v1.json" && "$allocview" replay --passes 10 --json "$tmp/v.trace" >"$tmp/v10.json" ||
        { echo "FAIL: replay --passes of varlen exited $?"; st=1; }
    python3 - "$tmp/v1.json" "$tmp/v10.json" <<'PY' || { echo "FAIL: varlen: reserved memory grows over passes"; st=1; }
import json, sys
one, ten = (json.load(open(f))[0] for f in sys.argv[1:3])
print("varlen: peak reserved %d B in one pass, %d B over ten" % (one["peak_reserved_bytes"], ten["peak_reserved_bytes"]))
assert ten["passes"] == 10 and ten["num_ooms"] == 0
assert ten["peak_requested_bytes"] == one["peak_requested_bytes"]
assert ten["peak_reserved_bytes"] <= one["peak_reserved_bytes"] * 1.01
PY
fi
[ $st = 0 ] && echo "check_import: all passed"
exit $st
