#!/usr/bin/env python3
"""summarize.py PART RESULTS.jsonl — the human-readable summary (Markdown) of one part of
bench/gpu/run.sh, from its JSON lines. Standard library only."""

import json
import sys

MiB = 1 << 20
GiB = 1 << 30


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                rows.append({"op": "unparsable", "line": n, "error": str(e)})
    return rows


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def fmt(v, spec="%.1f"):
    return spec % v if isinstance(v, (int, float)) and not isinstance(v, bool) else ("-" if v is None else str(v))


def head(part, rows):
    meta = next((r for r in rows if r.get("op") == "meta"), {})
    status = next((r for r in rows if r.get("op") == "status"), {})
    out = ["## %s" % part, ""]
    device = (meta.get("device") or "?").strip().replace("\n", "; ")
    out.append("- date: %s; device: %s; commit: %s (build %s)%s" % (
        meta.get("date", "?"), device, meta.get("commit_tree", "?"), meta.get("commit_build", "?"),
        "; MOCK (no GPU: figures are not measurements)" if meta.get("mock") else ""))
    out.append("- status: **%s** (rc %s) %s" % (status.get("status", "unknown"), status.get("rc", "?"),
                                               status.get("detail", "")))
    bad = [r for r in rows if r.get("op") == "unparsable"]
    if bad:
        out.append("- %d unparsable line(s) in results.jsonl" % len(bad))
    out.append("")
    return out


def driver_costs(rows):
    out = []
    dev = next((r for r in rows if r.get("op") == "device"), None)
    if dev:
        out.append("%s, %.1f GiB, granularity %d KiB, driver API %s; median us over %s calls." % (
            dev["name"], dev["total_bytes"] / GiB, dev["granularity"] // 1024, dev["driver_version"], dev["calls"]))
        out.append("")
    ops = ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "vmm_all_five",
           "cuMemAlloc", "cuMemFree"]
    per = {}
    for r in rows:
        if r.get("op") in ops:
            per.setdefault(r["chunk_bytes"], {})[r["op"]] = r["median_us"]
    if per:
        out += table(["chunk"] + [o if o != "vmm_all_five" else "all five" for o in ops],
                     [["%g MiB" % (c / MiB)] + [fmt(per[c].get(o), "%.2f") for o in ops] for c in sorted(per)])
        out.append("")
    builds = [r for r in rows if r.get("op") == "build_create_map_access"]
    tears = {(r["chunk_bytes"], r["access"]): r for r in rows if r.get("op") == "teardown_unmap_release"}
    if builds:
        out.append("Mapping %.0f MiB (cuMemCreate + cuMemMap + cuMemSetAccess), median of %d:" % (
            builds[0]["total_bytes"] / MiB, builds[0]["reps"]))
        out.append("")
        out += table(["chunk", "chunks", "cuMemSetAccess", "build ms", "us per chunk", "ms per GiB",
                      "teardown ms", "teardown us per chunk"],
                     [["%g MiB" % (b["chunk_bytes"] / MiB), b["chunks"], b["access"], fmt(b["median_ms"], "%.2f"),
                       fmt(b["per_chunk_us"]), fmt(b["per_gib_ms"], "%.2f"),
                       fmt(tears.get((b["chunk_bytes"], b["access"]), {}).get("median_ms"), "%.2f"),
                       fmt(tears.get((b["chunk_bytes"], b["access"]), {}).get("per_chunk_us"))] for b in builds])
        out.append("")
    return out


def property_cuda(rows):
    out = []
    dev = next((r for r in rows if r.get("variant") == "device"), None)
    if dev:
        out.append("%s, %.1f GiB, granularity %d KiB, VMM %s." % (dev["name"], dev["total_bytes"] / GiB,
                                                                  dev["granularity"] // 1024, dev["vmm_supported"]))
        out.append("")
    vs = [r for r in rows if r.get("part") == "property-cuda" and r.get("variant") not in (None, "device")]
    if vs:
        out += table(["variant", "mode", "ops", "allocs", "OOMs", "retries", "maps", "unmaps", "reserved peak MiB",
                      "MiB written", "probes", "s"],
                     [[v["variant"], v["mode"], v["ops"], v["allocs"], v["ooms"], v["retries"], v["maps"], v["unmaps"],
                       fmt(v["reserved_peak"] / MiB, "%.0f"), fmt(v["bytes_written"] / MiB, "%.0f"), v["probes"],
                       fmt(v["seconds"], "%.2f")] for v in vs])
        out.append("")
        out.append("Seed %s (repeat with CUALLOC_SEED). Every variant: heap_check after every operation, device "
                   "read-back of every block at allocation and at free." % vs[0].get("seed"))
        out.append("")
    return out


def ld_preload(rows):
    out = []
    builds = [r for r in rows if r.get("op") == "build"]
    if builds:
        out.append("nvcc builds: " + ", ".join("%s %s" % (b["cudart"], "ok" if b["ok"] else "FAILED") for b in builds))
        out.append("")
    runs = [r for r in rows if r.get("op") == "run"]
    tab = []
    for r in runs:
        res = r.get("result") or {}
        if r.get("status") == "not-run":
            tab.append([r["cudart"], r["mode"], "not run (%s)" % r["reason"], "-", "-", "-", "-", "-"])
            continue
        tab.append([r["cudart"], r["mode"], "pass" if r.get("pass") else "FAIL rc %s" % r.get("rc"),
                    fmt(r.get("wall_s"), "%.2f"), fmt(res.get("seconds"), "%.2f"),
                    "%s + %s async" % (res.get("cudaMalloc", "-"), res.get("cudaMallocAsync", "-")),
                    res.get("cualloc_num_allocs", "-"), r.get("lookups_answered") or "-"])
    if tab:
        out += table(["cudart", "run", "result", "wall s", "program s", "allocations", "served by cualloc",
                      "cuGetProcAddress look-ups answered"], tab)
        out.append("")
    for r in runs:
        if r.get("cualloc_summary"):
            out += ["cualloc summary (%s, %s):" % (r["cudart"], r["mode"]), "", "```", r["cualloc_summary"], "```", ""]
            break
    return out


def torch(rows):
    out = []
    train = {r["mode"]: r for r in rows if r.get("phase") == "train" and r.get("part") == "torch"
             and "mode" in r and r.get("op") != "error"}
    oom = {r["mode"]: r for r in rows if r.get("phase") == "oom" and r.get("part") == "torch"
           and "mode" in r and r.get("op") != "error"}
    errors = [r for r in rows if r.get("op") == "error"]
    if any(r.get("dry_run") for r in train.values()):
        out.append("Dry run (mock): the plan of each mode was validated; nothing was measured.")
        out.append("")
        out += table(["mode", "phase", "valid", "problems"],
                     [[m, r["phase"], r.get("valid"), "; ".join(r.get("problems") or []) or "-"]
                      for d in (train, oom) for m, r in d.items()])
        out.append("")
    else:
        base = train.get("default")
        tab = []
        for m, r in train.items():
            ratio = r["median_step_ms"] / base["median_step_ms"] if base else None
            diff = None
            if base and len(base.get("losses", [])) == len(r.get("losses", [])):
                diff = max((abs(x - y) for x, y in zip(r["losses"], base["losses"])), default=0.0)
            cu = r.get("cualloc") if isinstance(r.get("cualloc"), dict) else {}
            tab.append([m, fmt(r["median_step_ms"], "%.1f"), fmt(ratio, "%.3f"), fmt(r["peak_bytes"] / GiB, "%.2f"),
                        r.get("peak_source"), fmt(r.get("peak_bytes_mem_get_info", 0) / GiB, "%.2f"),
                        fmt(r["torch_max_memory_allocated"] / GiB, "%.2f")
                        if isinstance(r.get("torch_max_memory_allocated"), int) else "-",
                        fmt(r["torch_max_memory_reserved"] / GiB, "%.2f")
                        if isinstance(r.get("torch_max_memory_reserved"), int) else "-",
                        fmt(cu.get("reserved_peak", 0) / GiB, "%.2f") if cu else "-",
                        cu.get("num_maps", "-") if cu else "-",
                        fmt(diff, "%.2e"), "yes" if diff is not None and diff <= 1e-3 else ("-" if diff is None else "NO"),
                        fmt(r.get("losses", [None])[-1], "%.4f")])
        if tab:
            out += table(["mode", "median step ms", "vs default", "peak GiB", "source", "peak GiB (mem_get_info)",
                          "torch max alloc GiB", "torch max reserved GiB", "cualloc reserved peak GiB", "cualloc maps",
                          "max abs loss diff vs default", "within 1e-3", "last loss"], tab)
            out.append("")
        if oom:
            out.append("Forced OOM under a cap:")
            out.append("")
            out += table(["mode", "pass", "trained under cap", "raised", "exception", "recovered", "message (start)"],
                         [[m, r.get("pass"), r.get("trained_under_cap"), r.get("raised"), r.get("exception_type", "-"),
                           r.get("recovered"), (r.get("message") or "-")[:160].replace("|", "/").replace("\n", " ")]
                          for m, r in oom.items()])
            out.append("")
    for e in errors:
        last = ((e.get("log_tail") or "").strip().splitlines() or [""])[-1]
        out.append("- %s %s exited %s: `%s`" % (e["mode"], e["phase"], e["rc"], last))
    if errors:
        out.append("")
    return out


PARTS = {"driver-costs": driver_costs, "property-cuda": property_cuda, "ld-preload": ld_preload, "torch": torch}


def main(argv):
    if len(argv) != 3 or argv[1] not in PARTS:
        print("usage: summarize.py %s RESULTS.jsonl" % "|".join(PARTS), file=sys.stderr)
        return 2
    rows = load(argv[2])
    print("\n".join(head(argv[1], rows) + PARTS[argv[1]](rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
