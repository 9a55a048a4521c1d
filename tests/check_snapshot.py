#!/usr/bin/env python3
"""check_snapshot.py SNAPSHOT.pickle [--like ORIGINAL.pickle] [--counts]

Checks a PyTorch memory snapshot written by `allocview export --pytorch` the way PyTorch's own
viewer would read it, without PyTorch:

1. opcodes: only those MemoryViz.js's unpickler knows (protocol 2-4), read with pickletools;
2. it loads with Python's pickle refusing every class (plain data only);
3. structure: the keys _dump_snapshot writes, segment blocks tiling each segment exactly (the
   viewer recomputes block addresses from the segment start), _memory_viz.segsum's identity
   free + allocated == total_size per segment and overall, and each segment's totals summed as
   CUDACachingAllocator's snapshot sums them (allocated_size over active_allocated blocks,
   active_size and requested_size over active_allocated and active_pending_free ones);
4. the viewer's two replays, re-implemented from torch/utils/viz/MemoryViz.js: annotate_snapshot
   (stream numbering, free_requested/free_completed folded into "free") and, for the "Allocator
   State History" view, simulate_memory walking every event backwards from the final segments:
   a free_requested must meet a live block, a segment_map/segment_alloc undone must find its
   segment (merging and splitting expandable segments the way the viewer does), and every live
   block must lie in a segment at every step (the viewer dereferences find_segment's result).
   (The "Active Memory Timeline" view accepts any sequence: a free it never saw allocated is drawn
   as memory allocated before the trace.)

--like ORIGINAL: the snapshot came from `allocview export` of `allocview import ORIGINAL`; its
alloc, free_completed, segment and oom events must equal ORIGINAL's, in order, and it must have as
many free_requested events, plus one at its start for each block ORIGINAL has waiting for its
streams throughout (active_pending_free at the end, named by no event).

--counts: print one JSON line with the event counts per action (summed over devices), the
number of segments and of live blocks, for the calling test to compare with the trace.
Exit status 0 when every check passed; the first failure is printed.
"""
import bisect
import json
import pickle
import pickletools
import sys

VIEWER_OPCODES = {
    "PROTO", "FRAME", "MARK", "STOP", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BININT",
    "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "MEMOIZE",
}
EVENT_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot"}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}


class Failure(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Failure(msg)


class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise Failure("the snapshot names a class (%s.%s): not plain data" % (module, name))


def check_opcodes(data):
    memo_ops = set()
    for op, arg, pos in pickletools.genops(data):
        need(op.name in VIEWER_OPCODES, "offset %d: opcode %s is not one MemoryViz.js reads" % (pos, op.name))
        if op.name == "PROTO":
            need(2 <= arg <= 4, "protocol %d: the viewer reads 2-4" % arg)
        if op.name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo_ops.add(op.name)
    # MemoryViz.js numbers MEMOIZE'd values itself and ignores BINPUT's index for that count.
    need(not ("MEMOIZE" in memo_ops and memo_ops & {"BINPUT", "LONG_BINPUT"}),
         "MEMOIZE mixed with BINPUT: the viewer would number the memo differently")


def check_structure(snap):
    need(isinstance(snap, dict), "the snapshot is not a dict")
    for key in ("segments", "device_traces"):
        need(key in snap, "no %r" % key)
    need(isinstance(snap["device_traces"], list), "device_traces is not a list")
    tot_reserved = tot_alloc = tot_free = 0
    for seg in snap["segments"]:
        for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                    "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"):
            need(key in seg, "segment without %r: %r" % (key, {k: seg[k] for k in seg if k != "blocks"}))
        need(seg["segment_type"] in ("small", "large"), "segment_type %r" % seg["segment_type"])
        need(isinstance(seg["segment_pool_id"], tuple), "segment_pool_id is not a tuple")
        off = 0
        allocated = internal = external = 0
        for b in seg["blocks"]:
            for key in ("address", "size", "requested_size", "state", "frames"):
                need(key in b, "block without %r" % key)
            need(b["state"] in BLOCK_STATES, "block state %r" % b["state"])
            need(b["address"] == seg["address"] + off,
                 "segment 0x%x: block 0x%x is not where the sizes before it put it (0x%x)"
                 % (seg["address"], b["address"], seg["address"] + off))
            need(b["size"] > 0, "segment 0x%x: empty block" % seg["address"])
            if b["state"] == "active_allocated":
                need(b["requested_size"] <= b["size"], "block 0x%x: requested > size" % b["address"])
                allocated += b["requested_size"]
                internal += b["size"] - b["requested_size"]
            else:
                external += b["size"]
            off += b["size"]
        need(off == seg["total_size"], "segment 0x%x: blocks cover %d of %d bytes" % (seg["address"], off,
                                                                                   seg["total_size"]))
        # _memory_viz.segsum's assertion
        need(allocated + internal + external == seg["total_size"], "segsum identity fails")
        need(seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"),
             "segment 0x%x: allocated_size is not the sum of its active blocks" % seg["address"])
        # CUDACachingAllocator's snapshot sums active_size and requested_size over the active
        # blocks: allocated ones and those whose free waits for a stream (active_pending_free).
        active = [b for b in seg["blocks"] if b["state"] != "inactive"]
        need(seg["active_size"] == sum(b["size"] for b in active),
             "segment 0x%x: active_size %d is not the sum of its active blocks' sizes (%d)"
             % (seg["address"], seg["active_size"], sum(b["size"] for b in active)))
        need(seg["requested_size"] == sum(b["requested_size"] for b in active),
             "segment 0x%x: requested_size %d is not the sum of its active blocks' requested sizes (%d), "
             "pending ones included" % (seg["address"], seg["requested_size"], sum(b["requested_size"] for b in active)))
        tot_reserved += seg["total_size"]
        tot_alloc += allocated
        tot_free += internal + external
    need(tot_alloc + tot_free == tot_reserved, "segsum: free + allocated != reserved")
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace:
            need(e.get("action") in EVENT_ACTIONS, "device %d: action %r" % (dev, e.get("action")))
            need("size" in e and "stream" in e and "time_us" in e and "frames" in e, "event without keys: %r" % e)
            need(("device_free" in e) if e["action"] == "oom" else ("addr" in e), "event %r" % e)
            for f in e["frames"]:
                need(isinstance(f.get("name"), str) and isinstance(f.get("filename"), str)
                     and isinstance(f.get("line"), int), "frame %r" % f)
    for a in snap.get("external_annotations", []):
        need(a.get("stage") in ("START", "END") and isinstance(a.get("name"), str), "annotation %r" % a)


def annotate(snap):
    """MemoryViz.js annotate_snapshot: stream numbering and the free_requested/free_completed fold."""
    names = {0: 0}

    def stream_name(s):
        if s not in names:
            names[s] = len(names)
        return names[s]

    traces = []
    for trace in snap["device_traces"]:
        out = []
        for t in trace:
            t = dict(t)
            t["stream"] = stream_name(t["stream"])
            if t["action"] == "free_completed" and out and out[-1]["action"] == "free_requested" \
                    and out[-1]["addr"] == t["addr"]:
                out[-1]["action"] = "free"
                continue
            out.append(t)
        traces.append(out)
    if len(names) == 1:  # every event on the default stream: the viewer prints no streams
        for trace in traces:
            for t in trace:
                t["stream"] = None
    segs = []
    for seg in snap["segments"]:
        seg = dict(seg)
        seg["stream"] = stream_name(seg["stream"])
        addr = seg["address"]
        blocks = []
        for b in seg["blocks"]:
            b = dict(b)
            b["addr"] = addr
            addr += b["size"]
            blocks.append(b)
        seg["blocks"] = blocks
        segs.append(seg)
    return traces, segs


class Segments:
    """l_segments of simulate_memory: a list sorted by address, with the viewer's merge rules."""

    def __init__(self, segs):
        self.v = sorted(segs, key=lambda s: s["addr"])

    def map(self, merge, seg):
        idx = next((i for i, e in enumerate(self.v) if e["addr"] > seg["addr"]), -1)
        if not merge:
            self.v.insert(idx if idx != -1 else len(self.v), seg)  # (the viewer splices at -1; order only)
            return
        if idx == -1:
            idx = len(self.v)
        self.v.insert(idx, seg)
        if idx + 1 < len(self.v):
            nxt = self.v[idx + 1]
            if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                seg["size"] += nxt["size"]
                del self.v[idx + 1]
        if idx > 0:
            prev = self.v[idx - 1]
            if prev["addr"] + prev["size"] == seg["addr"] and prev["stream"] == seg["stream"]:
                prev["size"] += seg["size"]
                del self.v[idx]

    def unmap(self, merge, seg):
        if not merge:
            idx = next((i for i, e in enumerate(self.v) if e["addr"] == seg["addr"]), -1)
            need(idx != -1, "undoing segment_alloc 0x%x: no segment there (the viewer would drop the last "
                            "segment instead)" % seg["addr"])
            del self.v[idx]
            return
        end = seg["addr"] + seg["size"]
        idx = next((i for i, e in enumerate(self.v) if e["addr"] <= seg["addr"] and end <= e["addr"] + e["size"]), -1)
        need(idx != -1, "undoing segment_map 0x%x (%d bytes): no one segment holds it (the viewer would crash)"
             % (seg["addr"], seg["size"]))
        ex = self.v[idx]
        ex_end = ex["addr"] + ex["size"]
        if ex["addr"] == seg["addr"]:
            ex["addr"] += seg["size"]
            ex["size"] -= seg["size"]
            if ex["size"] == 0:
                del self.v[idx]
        elif ex_end == end:
            ex["size"] -= seg["size"]
        else:
            ex["size"] = seg["addr"] - ex["addr"]
            self.v.insert(idx + 1, {"addr": end, "size": ex_end - end, "stream": seg["stream"]})

    def find(self, addr):
        starts = [s["addr"] for s in self.v]
        i = bisect.bisect_right(starts, addr) - 1
        return i >= 0 and addr < self.v[i]["addr"] + self.v[i]["size"]


def viewer_replay(snap):
    traces, segs = annotate(snap)
    for dev, events in enumerate(traces):
        l_segs = Segments([{"addr": s["address"], "size": s["total_size"], "stream": s["stream"]}
                           for s in segs if s["device"] == dev])
        blocks = {}
        for s in segs:
            if s["device"] != dev:
                continue
            for b in s["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    blocks[b["addr"]] = {"pending": b["state"] == "active_pending_free"}
        for addr in blocks:
            need(l_segs.find(addr), "device %d: final block 0x%x outside the final segments" % (dev, addr))
        for i in range(len(events) - 1, -1, -1):
            e = events[i]
            a = e["action"]
            where = "device %d event %d (%s 0x%x)" % (dev, i, a, e.get("addr", 0))
            if a == "free":
                blocks[e["addr"]] = {"pending": False}
            elif a == "free_requested":
                need(e["addr"] in blocks, where + ": free_requested of a block the viewer does not have")
                blocks[e["addr"]]["pending"] = False
            elif a == "free_completed":
                blocks[e["addr"]] = {"pending": True}
            elif a == "alloc":
                blocks.pop(e["addr"], None)
            elif a in ("segment_free", "segment_unmap"):
                l_segs.map(a == "segment_unmap", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
            elif a in ("segment_alloc", "segment_map"):
                l_segs.unmap(a == "segment_map", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
                for addr in blocks:  # a block in the memory just unmapped would be drawn in no segment
                    if e["addr"] <= addr < e["addr"] + e["size"]:
                        need(l_segs.find(addr), where + ": block 0x%x left outside every segment" % addr)
            if a in ("free", "free_completed"):
                need(l_segs.find(e["addr"]), where + ": the block lies outside every segment")


def event_key(e):
    if e["action"] == "oom":
        return ("oom", e["size"], e["device_free"])
    return (e["action"], e["addr"], e["size"])


def annotate_blocks(seg):
    """seg's blocks with the address the viewer gives them (the sizes before them added up)."""
    addr, out = seg["address"], []
    for b in seg["blocks"]:
        out.append(dict(b, addr=addr))
        addr += b["size"]
    return out


def compare_like(snap, orig):
    kept = ("alloc", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
    need(len(snap["device_traces"]) >= len([t for t in orig["device_traces"] if t]), "devices lost")
    for dev, otrace in enumerate(orig["device_traces"]):
        ntrace = snap["device_traces"][dev] if dev < len(snap["device_traces"]) else []
        a = [event_key(e) for e in otrace if e["action"] in kept]
        b = [event_key(e) for e in ntrace if e["action"] in kept]
        for i, (x, y) in enumerate(zip(a, b)):
            need(x == y, "device %d: event %d differs: original %r, exported %r" % (dev, i, x, y))
        need(len(a) == len(b), "device %d: %d events kept, original has %d" % (dev, len(b), len(a)))
        # plus one for each block the original has waiting for its streams throughout (pending at
        # the end, no event names it): the import frees it at the start, the export says when
        named = {e.get("addr") for e in otrace}
        waiting = sum(1 for seg in orig["segments"] if seg["device"] == dev for b in annotate_blocks(seg)
                      if b["state"] == "active_pending_free" and b["addr"] not in named)
        nreq = sum(1 for e in otrace if e["action"] == "free_requested")
        mreq = sum(1 for e in ntrace if e["action"] == "free_requested")
        need(nreq + waiting == mreq, "device %d: %d free_requested, original has %d (and %d blocks waiting throughout)"
             % (dev, mreq, nreq, waiting))
        # frames of allocations travel too
        fa = [[(f["name"], f["filename"], f["line"]) for f in e["frames"]] for e in otrace if e["action"] == "alloc"]
        fb = [[(f["name"], f["filename"], f["line"]) for f in e["frames"]] for e in ntrace if e["action"] == "alloc"]
        need(fa == fb, "device %d: allocation stacks differ" % dev)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    path = argv[1]
    data = open(path, "rb").read()
    try:
        check_opcodes(data)
        snap = PlainData(open(path, "rb")).load()
        check_structure(snap)
        viewer_replay(snap)
        if "--like" in argv:
            orig = PlainData(open(argv[argv.index("--like") + 1], "rb")).load()
            compare_like(snap, orig)
    except Failure as f:
        print("FAIL: %s: %s" % (path, f))
        return 1
    if "--counts" in argv:
        counts = {}
        for trace in snap["device_traces"]:
            for e in trace:
                counts[e["action"]] = counts.get(e["action"], 0) + 1
        counts["segments"] = len(snap["segments"])
        counts["live_blocks"] = sum(1 for s in snap["segments"] for b in s["blocks"] if b["state"] != "inactive")
        counts["annotations"] = len(snap.get("external_annotations", []))
        print(json.dumps(counts, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
