#!/usr/bin/env bash
# check_export.sh ALLOCVIEW FIXTURE SCENARIOS DEMO SNAPSHOT_DIR — `allocview export --pytorch`:
#  - every snapshot it writes passes check_snapshot.py: only the viewer's opcodes, plain data,
#    blocks tiling segments, segsum's identity, and PyTorch's viewer's backward replay;
#  - the fixture (two devices, stream-ordered frees, maps/unmaps, an OOM, marks): the snapshot's
#    event counts equal the trace's records;
#  - import(export(T)) keeps every alloc and free of T in order (address, requested and allocated
#    size), the starting blocks, the maps, the OOM and the marks — for the fixture, the six report
#    scenarios (native stacks), a classic trace, and ring traces whose oldest events were
#    overwritten (starting state inferred), of a VMM device and of a classic one (segments freed
#    whole);
#  - export(import(S)) has S's events (check_snapshot.py --like) for every real snapshot in
#    SNAPSHOT_DIR (skipped when there is none);
#  - --max-entries keeps the last N events; usage errors exit 1 (an output that is the input among
#    them: the input is left intact), a missing trace 2, a trace that
#    contradicts itself is refused (exit 3) naming why, leaving no file and an existing one intact.
set -u
allocview=$1 fixture=$2 scen=$3 demo=$4 snapdir=${CUALLOC_SNAPSHOT_DIR:-${5:-}}
command -v python3 >/dev/null 2>&1 || { echo "python3 not found; skipping"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
check=$here/check_snapshot.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
unset RANK LOCAL_RANK

# round_trip NAME: export NAME.trace, check the snapshot, import it back, compare with the trace.
round_trip() {
    local t=$tmp/$1.trace p=$tmp/$1.pickle r=$tmp/$1.back.trace
    "$allocview" export --pytorch "$p" "$t" 2>"$tmp/$1.export.err" || { local st=$?; cat "$tmp/$1.export.err"; bad "$1: export exited $st"; return; }
    python3 "$check" "$p" --counts >"$tmp/$1.counts" || { cat "$tmp/$1.counts"; bad "$1: the snapshot fails the viewer's checks"; return; }
    "$allocview" import "$p" -o "$r" 2>/dev/null || { bad "$1: import of the export exited $?"; return; }
    "$allocview" dump "$t" >"$tmp/$1.dump" && "$allocview" dump "$r" >"$tmp/$1.back.dump" || { bad "$1: dump failed"; return; }
    python3 - "$tmp/$1.dump" "$tmp/$1.back.dump" "$tmp/$1.counts" "$1" <<'PY' || bad "$1: the round trip lost events"
import json, re, sys
def events(path):
    """Per device: allocs (addr, requested, allocated size) and completed frees (addr) in order; the starting
    blocks (addr, requested) as a set; maps and unmaps; OOM sizes; marks."""
    ev = {}
    marks, init = [], set()
    pending = set()
    for line in open(path):
        f = line.split()
        if len(f) < 2: continue
        kind = f[1]
        kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
        if kind == "mark":
            marks.append(line.split('"', 1)[1].rstrip().rstrip('"')); continue
        if "dev" not in kv: continue
        d = ev.setdefault(kv["dev"], {"alloc": [], "free": [], "map": [], "unmap": [], "oom": []})
        if kind == "alloc": d["alloc"].append((kv["addr"], kv["requested"], kv["size"]))
        elif kind == "init_block": init.add((kv["dev"], kv["addr"], kv["requested"]))
        elif kind == "free":
            if f[-1] == "completed": d["free"].append(kv["addr"])
            else: pending.add((kv["dev"], kv["addr"]))
        elif kind == "free_done": d["free"].append(kv["addr"])
        elif kind == "map": d["map"].append((kv["addr"], kv["size"]))
        elif kind == "unmap": d["unmap"].append((kv["addr"], kv["size"]))
        elif kind == "oom": d["oom"].append(kv["requested"])
    return ev, init, marks
a, ainit, amarks = events(sys.argv[1])
b, binit, bmarks = events(sys.argv[2])
counts = json.load(open(sys.argv[3]))
ok = True
def fail(msg):
    global ok
    print("FAIL: %s: %s" % (sys.argv[4], msg)); ok = False
for dev in sorted(set(a) | set(b)):
    for k in ("alloc", "free", "map", "unmap", "oom"):
        x, y = a.get(dev, {}).get(k, []), b.get(dev, {}).get(k, [])
        if x != y:
            i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            fail("device %s: %s events differ at %d of %d/%d: %r vs %r" % (dev, k, i, len(x), len(y),
                 x[i] if i < len(x) else None, y[i] if i < len(y) else None))
# Starting blocks: the trace's own, and what a trace starting mid-run implies — blocks freed
# without being allocated — must come back as the re-import's starting blocks (those still live
# at the end come back too, from the segments).
if not ainit <= binit:
    fail("starting blocks lost: %r" % sorted(ainit - binit)[:5])
if amarks != bmarks:
    fail("marks differ: %r vs %r" % (amarks, bmarks))
nalloc = sum(len(d["alloc"]) for d in a.values())
nfree = sum(len(d["free"]) for d in a.values())
if counts.get("alloc", 0) != nalloc or counts.get("free_completed", 0) != nfree:
    fail("snapshot has %s allocs / %s free_completed, the trace %d / %d" % (counts.get("alloc"),
         counts.get("free_completed"), nalloc, nfree))
if counts.get("annotations", 0) != len(amarks):
    fail("snapshot has %s annotations, the trace %d marks" % (counts.get("annotations"), len(amarks)))
print("%s: %d allocs, %d frees, %d marks round-trip; %s" % (sys.argv[4], nalloc, nfree, len(amarks), json.dumps(counts)))
sys.exit(0 if ok else 1)
PY
}

# 1. The fixture: two devices, streams, stream-ordered frees, maps and unmaps, an OOM, marks.
CUALLOC_CONF=driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:0 "$fixture" "$tmp/fixture.trace" 2>/dev/null ||
    bad "the fixture did not run"
round_trip fixture
grep -q '"oom": 1' "$tmp/fixture.counts" || bad "fixture: the OOM is not in the snapshot"
grep -q '"segment_map": 2' "$tmp/fixture.counts" && grep -q '"segment_unmap": 2' "$tmp/fixture.counts" ||
    bad "fixture: maps/unmaps missing: $(cat "$tmp/fixture.counts")"

# 2. The report scenarios: native stacks (named frames in the snapshot), classic and VMM devices.
for s in "leak leak sim_memory_mb:256" "shortage shortage sim_memory_mb:128" \
         "frag frag sim_memory_mb:128,expandable_segments:0" "step2 step2 sim_memory_mb:256" \
         "longest longest sim_memory_mb:512" "phase phase sim_memory_mb:512"; do
    set -- $s
    CUALLOC_CONF="driver:sim,$3" "$scen" "$2" "$tmp/$1.trace" 2>/dev/null
    [ -s "$tmp/$1.trace" ] || { bad "scenario $2 wrote no trace"; continue; }
    round_trip "$1"
done
python3 - "$tmp/leak.pickle" <<'PY' || bad "leak: allocations carry no frames"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
allocs = [e for t in s["device_traces"] for e in t if e["action"] == "alloc"]
sys.exit(0 if allocs and all(e["frames"] for e in allocs) else 1)
PY
python3 - "$tmp/frag.pickle" <<'PY' || bad "frag: a classic trace should give classic segments"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
acts = {e["action"] for t in s["device_traces"] for e in t}
sys.exit(0 if "segment_alloc" in acts and not any(g["is_expandable"] for g in s["segments"]) else 1)
PY

# 3. A ring trace whose oldest events were overwritten: the starting state is inferred. On VMM
# devices (ring) and on classic ones (ring0), where a segment mapped before the window is seen in
# pieces (the blocks freed in it) and then freed whole: its pieces must be inferred as that one
# segment, or its segment_free matches none.
for s in "ring " "ring0 ,expandable_segments:0"; do
    set -- $s
    CUALLOC_CONF=trace:$tmp/$1.trace,trace_max_mb:1,trace_ring:1,trace_stack_depth:8${2:-} "$demo" --steps 100 --quiet >/dev/null 2>&1
    if "$allocview" summary "$tmp/$1.trace" | grep -q "overwritten"; then
        round_trip "$1"
        grep -q "starting state was inferred" "$tmp/$1.export.err" || bad "$1: the export does not say it inferred the start"
    else
        bad "the $1 trace was not overwritten (the test needs a longer run)"
    fi
done
python3 - "$tmp/ring0.pickle" <<'PY' || bad "ring0: a classic ring trace should give classic segments and segment_free events"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
acts = [e["action"] for t in s["device_traces"] for e in t]
sys.exit(0 if "segment_free" in acts and "segment_map" not in acts and s["segments"]
         and not any(g["is_expandable"] for g in s["segments"]) else 1)
PY

# 3b. A classic trace: blocks larger than PyTorch's rounding of their request (a remainder too
# small to split) keep their size through the round trip (cualloc_allocated_size).
CUALLOC_CONF=trace:$tmp/classic.trace,expandable_segments:0,trace_stack_depth:0 "$demo" --steps 10 --quiet >/dev/null 2>&1
"$allocview" dump "$tmp/classic.trace" 2>/dev/null | awk '$2 == "alloc" {
    for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    r = f["requested"] + 0; if (f["size"] + 0 != (r < 512 ? 512 : int((r + 511) / 512) * 512)) n++
} END { exit n > 0 ? 0 : 1 }' || bad "classic: no block larger than its rounded request (the case is not tested)"
round_trip classic

# 4. --max-entries: the last N events of each device, still a valid snapshot.
"$allocview" export --pytorch "$tmp/last.pickle" --max-entries 7 "$tmp/fixture.trace" 2>/dev/null || bad "--max-entries exited $?"
python3 "$check" "$tmp/last.pickle" || bad "--max-entries: invalid snapshot"
python3 - "$tmp/last.pickle" "$tmp/fixture.pickle" <<'PY' || bad "--max-entries did not keep the last 7 events"
import pickle, sys
a = pickle.load(open(sys.argv[1], "rb")); b = pickle.load(open(sys.argv[2], "rb"))
# (zip alone stops at the shorter list: a device's events dropped whole would pass)
sys.exit(0 if len(a["device_traces"]) == len(b["device_traces"]) == 2
         and all(x == y[-7:] for x, y in zip(a["device_traces"], b["device_traces"])) and a["segments"] == b["segments"] else 1)
PY

# 5. Real PyTorch snapshots: export(import(S)) has S's events.
nsnap=0
for snap in "$snapdir"/*.pickle; do
    [ -r "$snap" ] || continue
    nsnap=$((nsnap + 1))
    n=$(basename "$snap" .pickle)
    "$allocview" import "$snap" -o "$tmp/$n.trace" 2>/dev/null || { bad "$n: import exited $?"; continue; }
    "$allocview" export --pytorch "$tmp/$n.out.pickle" "$tmp/$n.trace" 2>/dev/null || { bad "$n: export exited $?"; continue; }
    python3 "$check" "$tmp/$n.out.pickle" --like "$snap" || bad "$n: export(import(S)) differs from S"
    echo "$n: export(import(S)) has S's events"
done
[ $nsnap -gt 0 ] || echo "no snapshots in '${snapdir:-}': the real-snapshot round trip was not run"

# 6. Errors.
"$allocview" export "$tmp/fixture.trace" 2>"$tmp/e1"; [ $? = 1 ] && grep -q -- "--pytorch" "$tmp/e1" || bad "no --pytorch: not a usage error"
"$allocview" export --pytorch "$tmp/x.pickle" "$tmp/missing.trace" 2>/dev/null; [ $? = 2 ] || bad "missing trace: not exit 2"
for v in 0 +5 ' 5' 5x -1 99999999999999999999999; do
    "$allocview" export --pytorch "$tmp/x.pickle" --max-entries "$v" "$tmp/fixture.trace" 2>"$tmp/e1"; st=$?
    [ $st = 1 ] && grep -q "bad --max-entries '$v'" "$tmp/e1" || bad "--max-entries '$v': exit $st, $(cat "$tmp/e1")"
done
[ ! -e "$tmp/x.pickle" ] || bad "a refused --max-entries wrote a snapshot"
"$allocview" export --pytorch "$tmp/x.pickle" "$tmp/fixture.trace" --max-entries 2>"$tmp/e1"; st=$?
[ $st = 1 ] && grep -q -- "--max-entries needs a value" "$tmp/e1" || bad "--max-entries without a value: exit $st, $(cat "$tmp/e1")"
# import's usage errors: exit 1 with the option named.
"$allocview" import "$tmp/fixture.pickle" -o 2>"$tmp/e1"; st=$?
[ $st = 1 ] && grep -q -- "-o needs a value" "$tmp/e1" || bad "import -o without a value: exit $st, $(cat "$tmp/e1")"
"$allocview" import "$tmp/fixture.pickle" -o "$tmp/y.trace" --device-memory lots 2>"$tmp/e1"; st=$?
[ $st = 1 ] && grep -q "bad --device-memory 'lots'" "$tmp/e1" || bad "import --device-memory lots: exit $st, $(cat "$tmp/e1")"
# A snapshot that is a FIFO, a directory or a device: refused at once (a FIFO's open waited for a
# writer), exit 2.
mkfifo "$tmp/fifo.pickle"
for f in "$tmp/fifo.pickle" "$tmp" /dev/null; do
    timeout 10 "$allocview" import "$f" -o "$tmp/special.trace" 2>"$tmp/e1"; st=$?
    [ $st = 2 ] && grep -q "$f: not a regular file" "$tmp/e1" || bad "import $f: exit $st, $(cat "$tmp/e1")"
done
[ ! -e "$tmp/special.trace" ] || bad "a refused import wrote a trace"
# An output that is the input itself (or a link to it) is refused, status 1, the input intact.
cp "$tmp/fixture.trace" "$tmp/self.trace"
cp "$tmp/fixture.pickle" "$tmp/self.pickle"
ln -s self.trace "$tmp/self-link.trace"
ln -s self.pickle "$tmp/self-link.pickle"
for o in self.trace self-link.trace; do
    "$allocview" export --pytorch "$tmp/$o" "$tmp/self.trace" 2>"$tmp/e1"; st=$?
    [ $st = 1 ] && grep -q "is the trace itself" "$tmp/e1" || bad "export --pytorch $o onto its trace: exit $st, $(cat "$tmp/e1")"
done
cmp -s "$tmp/self.trace" "$tmp/fixture.trace" || bad "export --pytorch onto its trace changed the trace"
for o in self.pickle self-link.pickle; do
    "$allocview" import "$tmp/self.pickle" -o "$tmp/$o" 2>"$tmp/e1"; st=$?
    [ $st = 1 ] && grep -q "is the snapshot itself" "$tmp/e1" || bad "import -o $o onto its snapshot: exit $st, $(cat "$tmp/e1")"
done
cmp -s "$tmp/self.pickle" "$tmp/fixture.pickle" || bad "import -o onto its snapshot changed the snapshot"
# An import that fails while writing (here: past a file size limit) leaves an existing trace at -o
# as it was and no partial file (it truncated the trace and left half a new one).
cp "$tmp/fixture.trace" "$tmp/kept.trace"
python3 - "$tmp/big.pickle" <<'PY'
import pickle, sys
ev = [dict(action=a, addr=(1 << 30) + i * 4096, size=4096, stream=0, time_us=i + 1, frames=[])
      for i in range(20000) for a in ("alloc", "free_completed")]
pickle.dump({"segments": [], "device_traces": [ev]}, open(sys.argv[1], "wb"), protocol=4)
PY
( ulimit -f 64 && trap '' XFSZ && "$allocview" import "$tmp/big.pickle" -o "$tmp/kept.trace" ) 2>"$tmp/e1"; st=$?
[ $st = 2 ] && grep -q "nothing written" "$tmp/e1" || bad "import past the size limit: exit $st, $(cat "$tmp/e1")"
cmp -s "$tmp/kept.trace" "$tmp/fixture.trace" || bad "a failed import changed the existing trace at -o"
ls "$tmp"/kept.trace.partial.* >/dev/null 2>&1 && bad "a failed import left its partial file"
# export into a FIFO (as /dev/stdout can be) writes into it, where it replaced it by a regular
# file (a trace, import's output, needs a file it can seek in); a directory is refused before any
# work.
mkfifo "$tmp/out.fifo"
for cmd in "export --pytorch $tmp/out.fifo $tmp/fixture.trace"; do
    timeout 20 cat "$tmp/out.fifo" >"$tmp/fifo.out" &
    timeout 20 "$allocview" $cmd 2>"$tmp/e1" || bad "$cmd: exit $?, $(cat "$tmp/e1")"
    wait
    [ -p "$tmp/out.fifo" ] || { bad "$cmd replaced the FIFO"; rm -f "$tmp/out.fifo"; mkfifo "$tmp/out.fifo"; }
    [ -s "$tmp/fifo.out" ] || bad "$cmd wrote nothing into the FIFO"
done
mkdir "$tmp/outdir"
for cmd in "export --pytorch $tmp/outdir $tmp/fixture.trace" "import $tmp/fixture.pickle -o $tmp/outdir"; do
    "$allocview" $cmd 2>"$tmp/e1"; st=$?
    [ $st = 2 ] && grep -q "Is a directory" "$tmp/e1" || bad "$cmd: exit $st, $(cat "$tmp/e1")"
done
[ -z "$(ls "$tmp/outdir")" ] && ! ls "$tmp"/outdir.partial.* >/dev/null 2>&1 || bad "an output onto a directory left files"
# An output in a folder that does not exist: exit 2, the message naming the path asked for, not the
# temporary file beside it that the command writes first.
for cmd in "export --pytorch $tmp/nodir/x.pickle $tmp/fixture.trace" "import $tmp/fixture.pickle -o $tmp/nodir/x.trace" \
        "timeline --svg $tmp/nodir/x.svg $tmp/fixture.trace"; do
    "$allocview" $cmd >/dev/null 2>"$tmp/e1"; st=$?
    [ $st = 2 ] && grep -q "$tmp/nodir/x\.[a-z]*: \(cannot create: \)\?No such file" "$tmp/e1" && ! grep -q partial "$tmp/e1" ||
        bad "$cmd: exit $st, $(cat "$tmp/e1")"
done
# A destination with a long name (two 250-byte folders that do not exist): the message still ends
# with the reason (a 512-byte message lost it).
long=$tmp/nodir/$(printf 'd%.0s' $(seq 250))/$(printf 'e%.0s' $(seq 250))
"$allocview" import "$tmp/fixture.pickle" -o "$long/x.trace" >/dev/null 2>"$tmp/e1"; st=$?
[ $st = 2 ] && grep -q "cannot create $long/x\.trace: No such file or directory$" "$tmp/e1" ||
    bad "import -o a long path: exit $st, $(cat "$tmp/e1")"
# A snapshot mapping the same segment twice imports (the import keeps what it reads) but cannot
# be exported consistently: refused, nothing written, an existing file left alone.
python3 - "$tmp/bad.pickle" <<'PY'
import pickle, sys
ev = [dict(action="segment_alloc", addr=1 << 30, size=2 << 20, stream=0, time_us=1, frames=[]),
      dict(action="segment_alloc", addr=1 << 30, size=2 << 20, stream=0, time_us=2, frames=[])]
pickle.dump({"segments": [], "device_traces": [ev]}, open(sys.argv[1], "wb"), protocol=4)
PY
"$allocview" import "$tmp/bad.pickle" -o "$tmp/bad.trace" 2>/dev/null || bad "the inconsistent snapshot did not import"
echo keep >"$tmp/existing.pickle"
"$allocview" export --pytorch "$tmp/existing.pickle" "$tmp/bad.trace" 2>"$tmp/e2"; st=$?
[ $st = 3 ] || bad "an inconsistent trace: exit $st, not 3"
grep -q "mapped while already mapped" "$tmp/e2" || bad "the refusal does not say why: $(cat "$tmp/e2")"
[ "$(cat "$tmp/existing.pickle")" = keep ] || bad "a refused export overwrote the existing file"
ls "$tmp"/existing.pickle.partial.* >/dev/null 2>&1 && bad "a refused export left its partial file"

[ $fail = 0 ] && echo "check_export: all passed"
exit $fail
