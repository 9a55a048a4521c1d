#!/usr/bin/env python3
"""viewer_check.py OUT.jsonl HTML_DIR SNAPSHOT... — PyTorch's own memory viewer code on snapshots
written by `allocview export --pytorch`.

For each snapshot: the checks of tests/check_snapshot.py (the viewer's opcodes, plain data, blocks
tiling segments, the viewer's backward replay re-implemented in Python), then — where torch is
installed — torch.cuda._memory_viz itself: segsum() (which asserts free + allocated == total for
every segment), trace() (the event list as text), trace_plot() and segment_plot() (the HTML pages
that embed the snapshot for MemoryViz.js: "Active Memory Timeline" and "Allocator State History").
The first snapshot's two pages are written to HTML_DIR for a person to open in a browser (the
pages load MemoryViz.js from the internet). One JSON line per snapshot goes to OUT.jsonl; without
torch the line says so ("torch": null) and only the Python re-implementation has run.
Exit status 0 when every snapshot passed everything that could run.
"""
import json
import os
import pickle
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests"))
import check_snapshot  # noqa: E402


def check_one(path, html_dir, write_html):
    rec = {"part": "viewer", "op": "viewer", "file": os.path.basename(path), "bytes": os.path.getsize(path)}
    data = open(path, "rb").read()
    try:
        check_snapshot.check_opcodes(data)
        snap = check_snapshot.PlainData(open(path, "rb")).load()
        check_snapshot.check_structure(snap)
        check_snapshot.viewer_replay(snap)
        rec["python_checks"] = "pass"
    except check_snapshot.Failure as f:
        rec["python_checks"] = "FAIL: %s" % f
        rec["pass"] = False
        return rec
    rec["events"] = sum(len(t) for t in snap["device_traces"])
    rec["segments"] = len(snap["segments"])
    try:
        import torch
        from torch.cuda import _memory_viz as mv
    except ImportError:
        rec["torch"] = None
        rec["pass"] = True
        return rec
    rec["torch"] = torch.__version__
    try:
        with open(path, "rb") as f:
            snap = pickle.load(f)  # as torch.cuda._memory_viz's own command line loads it
        rec["segsum_lines"] = len(mv.segsum(snap).splitlines())
        rec["trace_lines"] = len(mv.trace(snap).splitlines())
        page = mv.trace_plot(snap)
        rec["trace_plot_bytes"] = len(page)
        seg_page = mv.segment_plot(snap) if hasattr(mv, "segment_plot") else None
        rec["segment_plot_bytes"] = len(seg_page) if seg_page else None
        if write_html:
            base = os.path.join(html_dir, os.path.splitext(os.path.basename(path))[0])
            open(base + "-trace.html", "w").write(page)
            if seg_page:
                open(base + "-segments.html", "w").write(seg_page)
        rec["pass"] = True
    except Exception as e:  # the viewer's code refusing our file is the finding
        rec["pass"] = False
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    return rec


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    out, html_dir, paths = argv[1], argv[2], argv[3:]
    ok = True
    with open(out, "a") as f:
        for i, p in enumerate(paths):
            rec = check_one(p, html_dir, i == 0)
            ok &= rec["pass"]
            print(json.dumps(rec))
            f.write(json.dumps(rec) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
