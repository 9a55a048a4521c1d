"""check_import_cases.py ALLOCVIEW — `allocview import` (and `export --pytorch` back) on small
snapshots crafted here, one case per behaviour the import must get right, each checked on the
records it writes (`allocview dump`) and on the snapshot the export makes of them:
  expand_grow     an expandable segment that grows inside the window: the starting state maps only
                  what was mapped before the window, so reserved memory is the final segment's size
  expand_remap    part of an expandable segment unmapped and mapped again inside the window: the
                  starting state maps the whole segment, and its live block lies in mapped memory
  expand_events   a snapshot whose only sign of expandable segments is its events (no
                  allocator_settings, every segment unmapped by the end): the trace is expandable,
                  so its piecewise unmaps export back
  roundup         allocator_settings' roundup_power2_divisions: a freed allocation (no final block to
                  size it) is sized as PyTorch's round_size sizes it under those divisions (1.2 GiB
                  at 4 divisions: 1.25 GiB; 1.2 MiB: 1.25 MiB), a power of two stays as it is, and a
                  division that is no power of two is ignored with a warning naming it
  user_defined    PyTorch's annotation entries in device_traces (action 'user_defined', the name
                  as the frames' innermost name) are marks at their times, not malformed events
  multidev        two devices whose events interleave in time, and an annotation between them: the
                  trace has every event at its own time, in time order, and the export gives each
                  device its events at their times
  early_marks     annotations older than the first event (PyTorch keeps them in a ring of their own,
                  which holds far more time than the events' ring): each keeps its time through
                  import and export, and the starting state is written before the first of them
  blocksize       a block live at the end that is larger than its rounded request (PyTorch did not
                  split off a small remainder): its allocation has the block's size, not the rounding
  pending         a free completed at once (the adjacent free_requested/free_completed pair) is one
                  completed FREE; a stream-ordered one is FREE then FREE_DONE; one still waiting at
                  the end (active_pending_free) is a FREE without FREE_DONE, and the export gives
                  back the same events and the block as active_pending_free, in a snapshot that
                  passes check_snapshot.py (its segment's requested_size counts the pending block,
                  as PyTorch's does); an OOM's allocated bytes leave a pending block out, as
                  PyTorch's allocated_bytes does
  pending_start   frees already waiting for a stream when the window starts: a block pending
                  throughout (active_pending_free, no event) starts allocated and freed at once
                  (FREE without FREE_DONE) and exports as active_pending_free; one whose lone
                  free_completed is in the window is no starting block but a FREE_DONE; one whose
                  free_requested is in the window is freed with its block's size. Allocated bytes
                  (summary, OOM) leave them all out, as PyTorch's do. Without free_requested events
                  at all (not recorded), a lone free_completed frees a block allocated from the start
  free_stacks     a block freed in the window that it never saw allocated has the frames of its
                  free as its call site only when the snapshot's frees carry their allocation's
                  stack (context='state'); with context='all' (a free that the window sees differ
                  from its allocation's stack) it has none, never the line that freed it
  malformed       bad events and annotations (negative size, no addr, not a dict, unknown action, a
                  size that is a str, an allocated size below the request, a time_us that is a str)
                  are skipped, each named by index and key, with a count at the end; the rest
                  imports. Past 20 warnings only the count grows. A bad segment or block (what the starting state is built from) refuses the
                  file naming it, and writes nothing
  longmark        an annotation name of 700 bytes (with a multi-byte character) comes back whole
                  from import and export; one past what a trace record holds is cut at a character
                  boundary, with a warning naming it
  torch20         PyTorch 2.0's snapshot shape: blocks without 'address' lie where PyTorch's viewer
                  puts them (the segment's address plus the sizes before them), with the stack of
                  their 'history'; events without time_us
  dupkey          a dict that sets a key twice holds the last value, as Python's pickle gives it
  deepstack       a stack of 600 frames: the export keeps the innermost 512 and ends the list with a
                  frame that says the outer ones were cut
  foldednames     frame names holding ';', a newline, or ending in whitespace and a number: each site
                  is one folded line whose only count is its bytes, as flamegraph.pl reads it
Exits 1 naming every failed check."""
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

AV = sys.argv[1]
tmp = tempfile.mkdtemp()
B = 0x7F0000000000
M = 1 << 20
failures = []


def check(case, cond, msg):
    if not cond:
        failures.append("%s: %s" % (case, msg))
        print("FAIL: %s: %s" % (case, msg))
    return cond


def run(*args):
    p = subprocess.run([AV] + [str(a) for a in args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# Snapshot pieces, shaped as torch.cuda.memory._snapshot() writes them.
def ev(action, addr, size, t, stream=0, frames=None, **kw):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": frames or []}
    e.update(kw)
    return e


def blk(addr, size, state="active_allocated", req=None):
    return {"address": addr, "size": size, "requested_size": size if req is None else req, "state": state,
            "frames": []}


def seg(addr, total, blocks, device=0, stream=0, expandable=False):
    live = [b for b in blocks if b["state"] != "inactive"]
    return {"device": device, "address": addr, "total_size": total, "allocated_size": sum(b["size"] for b in live),
            "active_size": sum(b["size"] for b in live), "requested_size": sum(b.get("requested_size", 0) for b in live),
            "stream": stream, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": [], "blocks": blocks}


def snap(segments, traces, ann=None, expandable=False):
    return {"segments": segments, "device_traces": traces, "external_annotations": ann or [],
            "allocator_settings": {"expandable_segments": expandable}}


def write(name, obj):
    path = os.path.join(tmp, name + ".pickle")
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)
    return path


def import_(name, obj):
    """Imports obj; returns (exit status, stderr, trace path)."""
    src = write(name, obj) if not isinstance(obj, str) else obj
    trace = os.path.join(tmp, name + ".trace")
    rc, _, err = run("import", src, "-o", trace)
    return rc, err, trace


def records(trace):
    """The trace's records as (kind, {key: value}, text after the first quote) from `allocview dump`."""
    rc, out, err = run("dump", trace)
    out_recs = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        kv = {}
        for x in f[2:]:
            if "=" in x and not x.startswith('"'):
                k, v = x.split("=", 1)
                kv[k] = v
        if "completed" in f[2:]:
            kv["completed"] = True
        label = line.split('"', 1)[1].rstrip()[:-1] if f[1] == "mark" else None
        out_recs.append((f[1], kv, label))
    return out_recs


def export(name, trace):
    """Exports trace; returns (exit status, stderr, the snapshot or None)."""
    out = os.path.join(tmp, name + ".out.pickle")
    rc, _, err = run("export", "--pytorch", out, trace)
    return rc, err, (pickle.load(open(out, "rb")) if rc == 0 else None)


def num(v):
    return int(v, 0)


def viewer_check(case):
    """The export of `case` read as PyTorch's viewer reads it, with the events of the snapshot it was
    imported from (check_snapshot.py --like)."""
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_snapshot.py"),
                        os.path.join(tmp, case + ".out.pickle"), "--like", os.path.join(tmp, case + ".pickle")],
                       capture_output=True, text=True)
    check(case, p.returncode == 0, "the export fails the viewer's checks: %s" % (p.stdout + p.stderr).strip())


def ranges(recs, kinds, dev="0"):
    return sorted((num(kv["addr"]), num(kv["addr"]) + num(kv["size"])) for k, kv, _ in recs
                  if k in kinds and kv.get("dev") == dev)


def summary_json(trace):
    import json
    rc, out, err = run("summary", "--json", trace)
    return json.loads(out) if rc == 0 else {}


cases = []


def case(fn):
    cases.append(fn)
    return fn


@case
def expand_grow():
    """[B, B+2M) mapped before the window; the window maps [B+2M, B+4M) and allocates there."""
    c = "expand_grow"
    tr = [ev("segment_map", B + 2 * M, 2 * M, 10), ev("alloc", B + 2 * M, 2 * M, 20)]
    s = snap([seg(B, 4 * M, [blk(B, 2 * M, "inactive", 0), blk(B + 2 * M, 2 * M)], expandable=True)], [tr],
             expandable=True)
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    recs = records(trace)
    check(c, ranges(recs, ("init_map",)) == [(B, B + 2 * M)],
          "starting mapped ranges %r, want only [B, B+2M)" % ranges(recs, ("init_map",)))
    sj = summary_json(trace)
    check(c, sj.get("peak_reserved_bytes") == 4 * M, "peak reserved %r, want 4 MiB" % sj.get("peak_reserved_bytes"))
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        check(c, [(g["address"], g["total_size"]) for g in out["segments"]] == [(B, 4 * M)],
              "exported segments %r" % out["segments"])


@case
def expand_remap():
    """A 4 MiB segment mapped before the window, a 1 MiB block live in it from before; the window
    unmaps [B, B+2M) and maps it again."""
    c = "expand_remap"
    tr = [ev("segment_unmap", B, 2 * M, 10), ev("segment_map", B, 2 * M, 20)]
    s = snap([seg(B, 4 * M, [blk(B, 2 * M, "inactive", 0), blk(B + 2 * M, M), blk(B + 3 * M, M, "inactive", 0)],
                  expandable=True)], [tr], expandable=True)
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    recs = records(trace)
    init = ranges(recs, ("init_map",))
    check(c, sum(e - a for a, e in init) == 4 * M and init[0][0] == B and init[-1][1] == B + 4 * M,
          "starting mapped ranges %r, want all of [B, B+4M)" % init)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        check(c, "inferred" not in err, "the export had to infer the starting state: %s" % err.strip())
        check(c, [(g["address"], g["total_size"]) for g in out["segments"]] == [(B, 4 * M)],
              "exported segments %r" % out["segments"])


@case
def expand_events():
    c = "expand_events"
    tr = [ev("segment_map", B, 4 * M, 10), ev("alloc", B, M, 20), ev("free_requested", B, M, 30),
          ev("free_completed", B, M, 30), ev("segment_unmap", B + 2 * M, 2 * M, 40), ev("segment_unmap", B, 2 * M, 50)]
    s = snap([], [tr])
    del s["allocator_settings"]
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    conf = [label or kv for k, kv, label in records(trace) if k == "config"]
    rc, out, _ = run("dump", trace)
    check(c, "expandable_segments:1" in out, "the trace is not expandable: %r" % conf)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        back = [(e["action"], e["addr"], e["size"]) for e in out["device_traces"][0] if e["action"].startswith("segment")]
        check(c, back == [(e["action"], e["addr"], e["size"]) for e in tr if e["action"].startswith("segment")],
              "segment events came back as %r" % back)


@case
def roundup():
    c = "roundup"
    G = 1 << 30
    div = {str(1 << i): 0 for i in range(16)}
    div.update({"1": 4, "2": 3, "1024": 4})  # 3 is no power of two: PyTorch refuses it
    big, small, odd, pow2 = 1288490189, 1258291, 2 * M + 100 * 1024, 1024 * M  # 1.2 GiB, 1.2 MiB, 2.1 MiB, 1 GiB
    tr = [ev("segment_alloc", B, 4 * G, 10)]
    t = 20
    for size in (big, small, odd, pow2):
        tr += [ev("alloc", B, size, t), ev("free_requested", B, size, t + 1), ev("free_completed", B, size, t + 1)]
        t += 10
    s = snap([seg(B, 4 * G, [blk(B, 4 * G, "inactive", 0)])], [tr])
    s["allocator_settings"]["roundup_power2_divisions"] = div
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    check(c, "roundup_power2_divisions for 2 MiB is 3" in err, "no warning naming the bad division: %r" % err)
    sizes = [num(kv["size"]) for k, kv, _ in records(trace) if k == "alloc"]
    want = [5 * G // 4, 5 * M // 4, (odd + 511) // 512 * 512, pow2]
    check(c, sizes == want, "allocated sizes %r, want %r (PyTorch's round_size under the divisions)" % (sizes, want))


@case
def user_defined():
    c = "user_defined"
    tr = [ev("segment_alloc", B, 2 * M, 10), ev("user_defined", 0, 0, 15, frames=[{"name": "forward", "filename": "", "line": 0}]),
          ev("alloc", B, M, 20), ev("user_defined", 0, 0, 25)]
    rc, err, trace = import_(c, snap([seg(B, 2 * M, [blk(B, M), blk(B + M, M, "inactive", 0)])], [tr]))
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    check(c, "skipped" not in err, "entries skipped: %s" % err)
    marks = [(num(kv["t"]) // 1000, label) for k, kv, label in records(trace) if k == "mark"]
    check(c, marks == [(15, "forward"), (25, "user_defined")], "marks %r" % marks)


@case
def multidev():
    c = "multidev"
    B1 = 0x7E0000000000
    d0 = [ev("segment_alloc", B, 2 * M, 100), ev("alloc", B, M, 110), ev("free_requested", B, M, 300),
          ev("free_completed", B, M, 300)]
    d1 = [ev("segment_alloc", B1, 2 * M, 105), ev("alloc", B1, M, 200), ev("free_requested", B1, M, 250),
          ev("free_completed", B1, M, 250)]
    ann = [{"stage": "START", "name": "fwd", "device": 1, "time_us": 150}]
    s = snap([seg(B, 2 * M, [blk(B, 2 * M, "inactive", 0)]), seg(B1, 2 * M, [blk(B1, 2 * M, "inactive", 0)], device=1)],
             [d0, d1], ann)
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    got = [(k, kv.get("dev"), num(kv["t"]) // 1000) for k, kv, _ in records(trace)
           if k in ("map", "alloc", "free", "mark")]
    want = [("map", "0", 100), ("map", "1", 105), ("alloc", "0", 110), ("mark", None, 150), ("alloc", "1", 200),
            ("free", "1", 250), ("free", "0", 300)]
    check(c, got == want, "records (kind, device, time_us) %r, want %r" % (got, want))
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        for d, orig in enumerate((d0, d1)):
            back = [(e["action"], e["time_us"]) for e in out["device_traces"][d]]
            check(c, back == [(e["action"], e["time_us"]) for e in orig], "device %d's events came back as %r" % (d, back))
        check(c, [a["time_us"] for a in out["external_annotations"]] == [150],
              "annotations %r" % out["external_annotations"])


@case
def early_marks():
    c = "early_marks"
    tr = [ev("alloc", B, M, 1000), ev("free_requested", B, M, 1100), ev("free_completed", B, M, 1100)]
    ann = [{"stage": "START", "name": "fwd", "device": 0, "time_us": 500},
           {"stage": "END", "name": "fwd", "device": 0, "time_us": 700},
           {"stage": "START", "name": "bwd", "device": 0, "time_us": 1050}]
    rc, err, trace = import_(c, snap([seg(B, 2 * M, [blk(B, 2 * M, "inactive", 0)])], [tr], ann))
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    got = [(k, num(kv["t"]) // 1000) for k, kv, _ in records(trace) if k in ("init_map", "mark", "alloc")]
    want = [("init_map", 500), ("mark", 500), ("mark", 700), ("alloc", 1000), ("mark", 1050)]
    check(c, got == want, "records (kind, time_us) %r, want %r" % (got, want))
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        check(c, [a["time_us"] for a in out["external_annotations"]] == [500, 700, 1050],
              "annotations came back as %r" % out["external_annotations"])


@case
def blocksize():
    c = "blocksize"
    # 1.5 MiB requested twice at B: the first is freed (512-byte rounding is all there is to go
    # by), the second is the block live at the end, 2 MiB.
    tr = [ev("segment_alloc", B, 20 * M, 100), ev("alloc", B, 3 * M // 2, 110), ev("free_requested", B, 3 * M // 2, 120),
          ev("free_completed", B, 3 * M // 2, 120), ev("alloc", B, 3 * M // 2, 130)]
    s = snap([seg(B, 20 * M, [blk(B, 2 * M, req=3 * M // 2), blk(B + 2 * M, 18 * M, "inactive", 0)])], [tr])
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    sizes = [(num(kv["size"]), num(kv["requested"])) for k, kv, _ in records(trace) if k == "alloc"]
    check(c, sizes == [(3 * M // 2, 3 * M // 2), (2 * M, 3 * M // 2)],
          "alloc (size, requested) %r, want the rounding then the live block's 2 MiB" % sizes)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        g = out["segments"][0]
        check(c, g["allocated_size"] == 2 * M and [(b["size"], b["state"]) for b in g["blocks"]][0] ==
              (2 * M, "active_allocated"), "exported segment %r" % g)


@case
def pending():
    c = "pending"
    S = 0x55550000
    tr = [ev("segment_alloc", B, 4 * M, 100),
          ev("alloc", B, M, 110, stream=S), ev("alloc", B + M, M, 120, stream=S), ev("alloc", B + 2 * M, M, 125, stream=S),
          ev("free_requested", B, M, 130, stream=S), ev("free_completed", B, M, 130, stream=S),
          ev("free_requested", B + M, M, 140, stream=S), ev("alloc", B + 3 * M, M, 150, stream=S),
          ev("free_completed", B + M, M, 160, stream=S),
          ev("free_requested", B + 2 * M, M, 170, stream=S),
          {"action": "oom", "device_free": 12345, "size": 80 << 30, "stream": S, "time_us": 180, "frames": []}]
    s = snap([seg(B, 4 * M, [blk(B, 2 * M, "inactive", 0), blk(B + 2 * M, M, "active_pending_free"), blk(B + 3 * M, M)],
                  stream=S)], [tr])
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    recs = records(trace)
    frees = [(k, num(kv["addr"]) - B, num(kv["t"]) // 1000, bool(kv.get("completed"))) for k, kv, _ in recs
             if k in ("free", "free_done")]
    want = [("free", 0, 130, True), ("free", M, 140, False), ("free_done", M, 160, False), ("free", 2 * M, 170, False)]
    check(c, frees == want, "frees (kind, offset, time_us, completed) %r, want %r" % (frees, want))
    oom = [kv for k, kv, _ in recs if k == "oom"]
    check(c, len(oom) == 1 and num(oom[0]["allocated"]) == M,
          "the OOM's allocated bytes %r, want 1 MiB (PyTorch's allocated bytes drop at free_requested: the "
          "pending block is not counted)" % oom)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        back = [(e["action"], e.get("addr"), e["time_us"]) for e in out["device_traces"][0]]
        check(c, back == [(e["action"], e.get("addr"), e["time_us"]) for e in tr], "events came back as %r" % back)
        states = [(b["address"] - B, b["state"]) for g in out["segments"] for b in g["blocks"] if b["state"] != "inactive"]
        check(c, states == [(2 * M, "active_pending_free"), (3 * M, "active_allocated")], "final blocks %r" % states)
        viewer_check(c)


@case
def pending_start():
    """Frees waiting for a stream when the window starts (their free_requested is older than the
    ring buffer): X pending throughout (active_pending_free at the end, no event), Y whose
    free_completed is the window's only event for it, Z whose free_requested is in the window and
    which is still pending at the end, W allocated in the window; an OOM after them."""
    c = "pending_start"
    S = 0x55550000
    X, Y, Z, W = B, B + 2 * M, B + 4 * M, B + 6 * M
    tr = [ev("alloc", W, 2 * M, 100, stream=S), ev("free_completed", Y, 149, 110, stream=S),
          ev("free_requested", Z, 3 * M // 2, 120, stream=S),
          {"action": "oom", "device_free": 0, "size": 80 << 30, "stream": S, "time_us": 130, "frames": []}]
    blocks = [blk(X, 2 * M, "active_pending_free", req=3 * M // 2), blk(Y, 2 * M, "inactive", 0),
              blk(Z, 2 * M, "active_pending_free", req=3 * M // 2), blk(W, 2 * M)]
    rc, err, trace = import_(c, snap([seg(B, 8 * M, blocks, stream=S)], [tr]))
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    recs = records(trace)
    init = sorted(num(kv["addr"]) for k, kv, _ in recs if k == "init_block")
    check(c, init == [X, Z], "starting blocks %r, want X and Z only (Y's free was requested before the window: it "
          "was not allocated)" % [hex(a - B) for a in init])
    frees = [(k, num(kv["addr"]), num(kv["t"]) // 1000, num(kv["size"]), bool(kv.get("completed"))) for k, kv, _ in recs
             if k in ("free", "free_done")]
    # Y's block size is unknown (its alloc and its free_requested are older than the window): its
    # completion keeps the size the event gives, PyTorch's requested size, not a rounding of it.
    want = [("free", X, 100, 2 * M, False), ("free_done", Y, 110, 149, False), ("free", Z, 120, 2 * M, False)]
    check(c, frees == want, "frees (kind, addr, time_us, size, completed) %r, want %r" % (frees, want))
    oom = [kv for k, kv, _ in recs if k == "oom"]
    check(c, len(oom) == 1 and num(oom[0]["allocated"]) == 2 * M,
          "the OOM's allocated bytes %r, want W's 2 MiB (X, Y and Z wait for their streams)" % oom)
    sj = summary_json(trace)
    got = {k: sj.get(k) for k in ("live_blocks_at_end", "allocated_bytes_at_end", "peak_allocated_bytes")}
    check(c, got == {"live_blocks_at_end": 1, "allocated_bytes_at_end": 2 * M, "peak_allocated_bytes": 4 * M},
          "summary %r, want W alone live at the end (the snapshot's allocated_size) and a peak of Z + W" % got)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        states = [(b["address"], b["state"]) for g in out["segments"] for b in g["blocks"] if b["state"] != "inactive"]
        check(c, states == [(X, "active_pending_free"), (Z, "active_pending_free"), (W, "active_allocated")],
              "final blocks %r" % [(hex(a - B), st) for a, st in states])
        ys = [(e["action"], e["size"]) for e in out["device_traces"][0] if e.get("addr") == Y]
        check(c, ys == [("free_completed", 149)], "Y's events came back as %r, want its free_completed of 149 "
              "bytes alone" % ys)
        viewer_check(c)
    # Recorded without free_requested events (every free a lone free_completed): a block freed in
    # the window that it never saw allocated was allocated at its start, as before.
    tr = [ev("alloc", W, 2 * M, 100), ev("free_completed", Y, 2 * M, 110)]
    rc, err, trace = import_(c + "-noreq", snap([seg(B, 8 * M, [blk(B, 6 * M, "inactive", 0), blk(W, 2 * M)])], [tr]))
    if check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        recs = records(trace)
        got = ([num(kv["addr"]) for k, kv, _ in recs if k == "init_block"],
               [(k, num(kv["addr"]), bool(kv.get("completed"))) for k, kv, _ in recs if k in ("free", "free_done")])
        check(c, got == ([Y], [("free", Y, True)]), "without free_requested events: %r, want Y allocated from the start "
              "and freed at once" % (got,))


@case
def free_stacks():
    """A block freed in the window that it never saw allocated: its call site is the stack its
    free carries only when frees carry their allocation's stack (history recorded with
    context='state' or 'alloc'); with context='all', PyTorch's default, a free carries the line
    that freed, which allocated nothing, and the block has no call site. Told apart on a block the
    window sees allocated and freed."""
    c = "free_stacks"

    def fr(name, line):
        return [{"name": name, "filename": "/home/u/model.py", "line": line}]

    for mode, want_site in (("all", None), ("state", "forward (/home/u/model.py:20)")):
        # X (allocated in forward, line 20, before the window) is freed first; then a block the
        # window sees allocated (line 30) and freed.
        x_free = fr("backward", 50) if mode == "all" else fr("forward", 20)
        y_free = fr("backward", 51) if mode == "all" else fr("step", 30)
        tr = [ev("free_requested", B, 4 * M, 100, frames=x_free), ev("free_completed", B, 4 * M, 100, frames=x_free),
              ev("alloc", B + 4 * M, M, 110, frames=fr("step", 30)),
              ev("free_requested", B + 4 * M, M, 120, frames=y_free),
              ev("free_completed", B + 4 * M, M, 120, frames=y_free)]
        rc, err, trace = import_(c + "-" + mode, snap([seg(B, 8 * M, [blk(B, 8 * M, "inactive", 0)])], [tr]))
        if not check(c, rc == 0, "%s: import exited %d: %s" % (mode, rc, err)):
            continue
        init = [kv.get("stack", "0") for k, kv, _ in records(trace) if k == "init_block"]
        rc, out, _ = run("sites", "--no-color", trace)  # the peak: X alone, at the start
        named = [l for l in out.splitlines() if "4.00 MiB 100.0%" in l]
        if want_site is None:
            check(c, init == ["0"] and named and "stack not recorded" in named[0] and "backward" not in out,
                  "context='all': X's call site must be unknown, not the line that freed it: init stacks %r, %r"
                  % (init, named))
        else:
            check(c, len(init) == 1 and init[0] != "0" and named and want_site in named[0],
                  "context='state': X's call site must be its free's (its allocation's) stack: init stacks %r, %r"
                  % (init, named))


@case
def malformed():
    c = "malformed"
    tr = [ev("segment_alloc", B, 4 * M, 100), ev("alloc", B, -1, 110),
          {"action": "alloc", "size": 4096, "stream": 0, "time_us": 120}, 42, ev("resize", B, M, 125),
          ev("alloc", B, "1024", 127), ev("alloc", B, M, 128, cualloc_allocated_size=M // 2), ev("alloc", B + M, M, 130)]
    ann = [{"stage": "START", "name": "ok", "time_us": 105}, {"stage": "START", "name": "bad", "time_us": "soon"}]
    s = snap([seg(B, 4 * M, [blk(B, M, "inactive", 0), blk(B + M, M), blk(B + 2 * M, 2 * M, "inactive", 0)])], [tr], ann)
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    for want in ("device_traces[0][1] 'size' is -1, below 0; event skipped",
                 "device_traces[0][2] no 'addr'; event skipped",
                 "device_traces[0][3] is an int, not a dict; event skipped",
                 "device_traces[0][4] unknown action 'resize'; event skipped",
                 "device_traces[0][5] 'size' is a str, not an integer; event skipped",
                 "device_traces[0][6] 'cualloc_allocated_size' is 524288, below its 'size' 1048576; event skipped",
                 "external_annotations[1] 'time_us' is a str, not an integer; annotation skipped",
                 "7 malformed events or annotations skipped"):
        check(c, want in err, "no %r in: %s" % (want, err))
    recs = records(trace)
    allocs = [(num(kv["addr"]), num(kv["size"])) for k, kv, _ in recs if k == "alloc"]
    check(c, allocs == [(B + M, M)], "allocs %r, want only the good one" % allocs)
    check(c, [l for k, _, l in recs if k == "mark"] == ["START ok"], "marks %r" % [l for k, _, l in recs if k == "mark"])
    # Many bad events: 20 named, all counted.
    rc, err, trace = import_(c + "-many", snap([], [[ev("alloc", B, -1, 10 + i) for i in range(25)]]))
    check(c, rc == 0 and err.count("event skipped") == 20 and "25 malformed events or annotations skipped" in err,
          "25 bad events: exit %d, %s" % (rc, err))
    # A bad segment or block refuses the file.
    for name, segs, want in (
            ("badseg", [seg(B, -5, [])], "segments[0]: 'total_size' is -5, below 0"),
            ("nodev", [{k: v for k, v in seg(B, 4 * M, []).items() if k != "device"}], "segments[0]: no 'device'"),
            ("bigdev", [seg(B, 4 * M, [], device=300)], "segments[0]: 'device' is 300, out of range"),
            ("badblk", [seg(B, 4 * M, [blk(B, M), {"address": B + M, "state": "inactive"}])],
             "segments[0]: blocks[1]: no 'size'"),
            ("blkpast", [seg(B, 4 * M, [blk(B, M), {"size": (1 << 63) - 1, "state": "inactive"}])],
             "segments[0]: blocks[1]: the blocks' sizes run past the end of the address space")):
        trace = os.path.join(tmp, name + ".trace")
        rc, _, err = run("import", write(name, snap(segs, [[]])), "-o", trace)
        check(c, rc == 2 and want in err and "refused" in err, "%s: exit %d, %s" % (name, rc, err))
        check(c, not os.path.exists(trace), "%s: a refused import wrote %s" % (name, trace))
    rc, _, err = run("import", write("badtraces", {"segments": [], "device_traces": [[], 7]}), "-o",
                     os.path.join(tmp, "badtraces.trace"))
    check(c, rc == 2 and "device_traces[1] is an int, not a list" in err, "device_traces[1] = 7: exit %d, %s" % (rc, err))


@case
def torch20():
    # PyTorch 2.0's shape: blocks without 'address' (PyTorch's viewer places them by adding sizes
    # from the segment's start) whose stack is in 'history', events without time_us.
    c = "torch20"
    fr = [{"name": "alloc_here", "filename": "train.py", "line": 7}]
    blocks = [{"size": M, "requested_size": M, "state": "inactive"},
              {"size": M, "requested_size": M - 512, "state": "active_allocated",
               "history": [{"addr": B + M, "real_size": M - 512, "frames": fr}]},
              {"size": 2 * M, "requested_size": 0, "state": "inactive"}]
    segs = [{"device": 0, "address": B, "total_size": 4 * M, "allocated_size": M, "active_size": M,
             "stream": 0, "segment_type": "large", "blocks": blocks},
            {"device": 0, "address": B + 8 * M, "total_size": 2 * M, "allocated_size": 2 * M,
             "active_size": 2 * M, "stream": 0, "segment_type": "large",
             "blocks": [{"size": 2 * M, "requested_size": 2 * M, "state": "active_allocated"}]}]
    tr = [{"action": "alloc", "addr": B + 8 * M, "size": 2 * M, "stream": 0, "frames": fr},
          {"action": "alloc", "addr": B + 2 * M, "size": M, "stream": 0},
          {"action": "free_requested", "addr": B + 2 * M, "size": M, "stream": 0},
          {"action": "free_completed", "addr": B + 2 * M, "size": M, "stream": 0}]
    rc, err, trace = import_(c, {"segments": segs, "device_traces": [tr]})
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    recs = records(trace)
    init = [(num(kv["addr"]) - B, num(kv["size"]), kv.get("stack")) for k, kv, _ in recs if k == "init_block"]
    check(c, [(a, n) for a, n, _ in init] == [(M, M)], "initial blocks (offset, size) %r, want [(1 MiB, 1 MiB)]" % init)
    check(c, init and init[0][2] not in (None, "0"), "the initial block has no stack (its history's frames): %r" % init)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        live = [(b["address"] - B, b["state"], [f["name"] for f in b["frames"]]) for g in out["segments"]
                for b in g["blocks"] if b["state"] != "inactive"]
        check(c, live == [(M, "active_allocated", ["alloc_here"]), (8 * M, "active_allocated", ["alloc_here"])],
              "final blocks %r" % live)


@case
def longmark():
    c = "longmark"
    name = "phase_\u00e9" + "x" * 692
    huge = "y" * 59993 + "\u00e9" + "z" * 5000  # "START " + this: the cut at 60000 bytes falls inside the é
    tr = [ev("segment_alloc", B, 4 * M, 100), ev("alloc", B, M, 110)]
    ann = [{"stage": "START", "name": name, "device": 0, "time_us": 105},
           {"stage": "END", "name": name, "device": 0, "time_us": 107},
           {"stage": "START", "name": huge, "device": 0, "time_us": 108}]
    rc, err, trace = import_(c, snap([seg(B, 4 * M, [blk(B, M), blk(B + M, 3 * M, "inactive", 0)])], [tr], ann))
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    check(c, "external_annotations[2]: its label (65001 bytes) is cut to 59999 bytes" in err,
          "no warning for the cut label: %s" % err)
    rc, err, out = export(c, trace)
    if check(c, rc == 0, "export exited %d: %s" % (rc, err)):
        back = [(a["stage"], a["name"]) for a in out["external_annotations"]]
        check(c, back[:2] == [("START", name), ("END", name)],
              "names came back %r" % [(st, len(n)) for st, n in back[:2]])
        check(c, len(back) == 3 and back[2][1] == "y" * 59993, "the cut label came back as %r bytes" %
              [len(n.encode()) for _, n in back[2:]])


@case
def dupkey():
    c = "dupkey"
    good = [seg(B, 4 * M, [blk(B, M), blk(B + M, 3 * M, "inactive", 0)])]
    body = pickle.dumps(good, protocol=4)[2:-1]  # without PROTO and STOP
    # protocol 4, by hand: {'segments': [], 'device_traces': [[]], 'segments': good}
    raw = (b"\x80\x04}(" + b"\x8c\x08segments]" + b"\x8c\x0ddevice_traces]]a" + b"\x8c\x08segments" + body + b"u.")
    check(c, len(pickle.loads(raw)["segments"]) == 1, "the crafted pickle is not what Python reads")
    path = os.path.join(tmp, c + ".pickle")
    open(path, "wb").write(raw)
    rc, err, trace = import_(c, path)
    if check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        recs = records(trace)
        got = (ranges(recs, ("init_map",)), [num(kv["addr"]) for k, kv, _ in recs if k == "init_block"])
        check(c, got == ([(B, B + 4 * M)], [B]), "starting state %r, want the last 'segments'" % (got,))



@case
def deepstack():
    c = "deepstack"
    frames = [{"filename": "model.py", "line": i + 1, "name": "f%d" % i} for i in range(600)]
    s = snap([seg(B, 2 * M, [blk(B, 2 * M, "inactive", 0)])], [[ev("alloc", B, M, 100, frames=frames)]])
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    rc, err, out = export(c, trace)
    if not check(c, rc == 0 and out is not None, "export exited %d: %s" % (rc, err)):
        return
    got = [e for t in out["device_traces"] for e in t if e["action"] == "alloc"]
    fr = got[0]["frames"] if got else []
    check(c, len(fr) == 513 and [f["name"] for f in fr[:512]] == ["f%d" % i for i in range(512)]
          and "frames cut" in fr[-1]["name"],
          "%d frames exported, the last %r: want the innermost 512 and a last one saying the rest were cut"
          % (len(fr), fr[-1]["name"] if fr else None))



@case
def foldednames():
    """Frame names that collide with the folded format: ';' and a newline inside a name, and leaves
    whose label ends in whitespace and a number ("(k 17", a tab before "14", "(v 1.5", "(w 12."),
    which flamegraph.pl would read as a second count (a differential line)."""
    c = "foldednames"
    names = [("(k 17", "??", 0), ("h\t14", "??", 0), ("(v 1.5", "??", 0), ("(w 12.", "??", 0),
             ("step;one\ntwo", "/a/model.py", 3), ("plain", "/a/model.py", 3)]
    tr = [ev("alloc", B + i * M, M, 10 + i, frames=[{"name": n, "filename": f, "line": ln}])
          for i, (n, f, ln) in enumerate(names)]
    s = snap([seg(B, 8 * M, [blk(B + i * M, M) for i in range(len(names))] +
                  [blk(B + len(names) * M, (8 - len(names)) * M, "inactive", 0)])], [tr])
    rc, err, trace = import_(c, s)
    if not check(c, rc == 0, "import exited %d: %s" % (rc, err)):
        return
    rc, out, err = run("folded", trace)
    if not check(c, rc == 0, "folded exited %d: %s" % (rc, err)):
        return
    lines = out.splitlines()
    check(c, len(lines) == len(names), "%d folded lines, want one per site: %r" % (len(lines), lines))
    total = 0
    for line in lines:
        # flamegraph.pl: (.*)\s+?(\d+(?:\.\d*)?)$ takes the count; a stack that still ends so is
        # read as a differential line.
        m = re.match(r"^(.*)\s+?(\d+(?:\.\d*)?)$", line)
        if not check(c, m is not None, "no count at the end of %r" % line):
            continue
        total += int(m.group(2))
        check(c, not re.search(r"\s\d+(?:\.\d*)?$", m.group(1)),
              "the stack of %r ends in whitespace and a number: flamegraph.pl reads two counts" % line)
        check(c, ";" not in m.group(1), "a frame's ';' was left in %r" % line)
    check(c, total == len(names) * M, "folded sums to %d, want %d" % (total, len(names) * M))
    check(c, all(any(n in l for l in lines) for n in ("17", "14", "1.5", "12.")),
          "the names' numbers were lost: %r" % lines)


only = sys.argv[2:]
for fn in cases:
    if not only or fn.__name__ in only:
        fn()
shutil.rmtree(tmp)
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("check_import_cases: all %d cases passed" % len(cases))
