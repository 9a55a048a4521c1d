#!/usr/bin/env python3
"""summarize.py PART RESULTS.jsonl — the human-readable summary (Markdown) of one part of
bench/gpu/run.sh, from its JSON lines.

summarize.py driver-questions-verdict RESULTS.jsonl MOCK FAKECUDA_DIR — the driver-questions part's
status ("pass|detail", ...); appends capture_vs_misses compared with and without cualloc.

summarize.py targets PATH... — the torch parts side by side per model against the targets (step
time vs default, peak vs expandable, tokens per step vs expandable and default); each PATH is a
results.jsonl or a folder searched for them (several commands' results fetched separately can be
put together). Standard library only."""

import json
import os
import re
import statistics
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
            tab.append([r["cudart"], r["mode"], "not run (%s)" % r["reason"], "-", "-", "-", "-", "-", "-", "-"])
            continue
        # The cross-stream rounds (older results have none): S's buffers T reused, and sums S read wrong.
        xs = ("%s rounds, %s reused, %s wrong" % (res["xs_rounds"], res.get("xs_reuses", "-"), res.get("xs_mismatches", "-"))
              if "xs_rounds" in res else "-")
        # The hand-over rounds (older results have none): T's buffers that were S's, and wrong sums.
        ho = ("%s rounds, %s handed over, %s wrong" % (res["handover_rounds"], res.get("handover_reuses", "-"),
                                                        res.get("handover_mismatches", "-"))
              if "handover_rounds" in res else "-")
        tab.append([r["cudart"], r["mode"], "pass" if r.get("pass") else "FAIL rc %s" % r.get("rc"),
                    fmt(r.get("wall_s"), "%.2f"), fmt(res.get("seconds"), "%.2f"),
                    "%s + %s async" % (res.get("cudaMalloc", "-"), res.get("cudaMallocAsync", "-")),
                    res.get("cualloc_num_allocs", "-"), xs, ho, r.get("lookups_answered") or "-"])
    if tab:
        out += table(["cudart", "run", "result", "wall s", "program s", "allocations", "served by cualloc",
                      "cross-stream rounds", "hand-over rounds", "cuGetProcAddress look-ups answered"], tab)
        out.append("")
    for r in runs:
        if r.get("cualloc_summary"):
            out += ["cualloc summary (%s, %s):" % (r["cudart"], r["mode"]), "", "```", r["cualloc_summary"], "```", ""]
            break
    return out


def dq_facts(check, res):
    """The facts of one driver_questions RESULT line, in a table cell."""
    if res.get("error"):
        return "error: %s" % res["error"]
    mib = lambda v: "%.1f MiB" % (v / MiB) if isinstance(v, (int, float)) else "-"
    if check == "legacy_lookup_flags":
        f = ["flags %s: %s %s (%s)" % (k[5:], (res.get(k) or {}).get("symbol"), (res.get(k) or {}).get("pointer"),
                                       (res.get(k) or {}).get("result")) for k in ("flags0", "flags1", "flags2")]
        t = res.get("through_cualloc")
        if t:
            f.append("through cualloc's cuGetProcAddress: %s" % ("the same" if t.get("same_as_driver") else
                                                                 "flags 0 %s, flags 1 %s" % (t["flags0"], t["flags1"])))
        return "; ".join(f)
    if check == "stream_get_ctx_under_capture":
        return ("capturing before %s, cuStreamGetCtx %s (the current context: %s), capturing after %s, end %s"
                % (res.get("capturing_before"), res.get("get_ctx"), res.get("ctx_is_current"),
                   res.get("capturing_after"), res.get("end")))
    if check == "meminfo_counted_once":
        return ("cudaMemGetInfo free %s, the driver's %s, cualloc's cached %s: off by %s bytes (counted twice "
                "would be %s)" % (mib(res.get("runtime_free")), mib(res.get("driver_free")), mib(res.get("cached")),
                                  res.get("diff"), res.get("counted_twice_diff")))
    if dq_is_capture(check):
        text = ("%s capture, steps by %s; phase 1: %s invalidation(s)%s; end %s, instantiate %s, graph launch %s, value %s"
                % (res.get("capture_mode", "global"), res.get("steps_by", "another thread"),
                   res.get("phase1_invalidations"), " (first: %s)" % res["first_invalidating_step"]
                   if res.get("first_invalidating_step") else "", res.get("end"), res.get("instantiate"),
                   res.get("graph_launch"), res.get("value")))
        if "cualloc_maps" in res:
            text += "; cualloc: %s maps, %s unmaps, %s syncs" % (res["cualloc_maps"], res["cualloc_unmaps"],
                                                              res["cualloc_syncs"])
        return text
    if check == "event_idle_at_once":
        return ("an event recorded on an idle stream complete at the first query: %s of %s (polls until complete: "
                "mean %s, max %s); after a kernel of %s cycles: %s of %s"
                % (res.get("idle_complete_at_once"), res.get("idle_records"), res.get("idle_polls_mean"),
                   res.get("idle_polls_max"), res.get("kernel_cycles"), res.get("busy_complete_at_once"),
                   res.get("busy_records")))
    if check in ("cudafree_blocking_streams", "legacy_free_nonblocking"):
        how = ("read late on one blocking stream, cudaFree'd and allocated again for another"
               if check == "cudafree_blocking_streams" else
               "read late on the legacy stream, cudaFreeAsync'd there and cudaMalloc'd again for a non-blocking stream")
        return ("a buffer %s: its contents intact in %s of %s rounds (the address came back in %s; most words wrong %s)"
                % (how, res.get("intact"), res.get("rounds"), res.get("same_address"), res.get("words_wrong_max")))
    if check == "device_reset":
        return ("before %s; cudaDeviceReset %s; after it: 1 MiB %s (same address: %s), 96 MiB %s; last error %s"
                % (res.get("before_reset"), res.get("reset"), res.get("after_1MiB"), res.get("same_address_as_before"),
                   res.get("after_96MiB"), res.get("last_error")))
    return json.dumps(res)[:300]


def dq_is_capture(check):
    """capture_vs_misses and its variants (driver_questions.cu's CAPTURE_VARIANTS), which are judged
    against CUDA's own answer rather than alone."""
    return check == "capture_vs_misses" or check.startswith("capture_vs_misses_")


DQ_WHO = {"plain": "without cualloc", "preload": "LD_PRELOAD cualloc",
          "preload-classic": "LD_PRELOAD cualloc, classic segments"}


def dq_compare(plain, pre, check="capture_vs_misses", mode="preload"):
    """A capture check without cualloc (plain) and under it (pre), step by step: op "compare". CUDA
    itself may refuse an application's cudaMalloc during another thread's global-mode capture, so
    the verdict is relative: fail when cualloc refused a phase-1 call CUDA allowed or invalidated
    the capture at a phase-1 step where CUDA left it intact, whatever cualloc's own verdict (a
    refused miss maps nothing, which leaves that verdict undecided, and a capture can survive a
    refusal); else pass when the capture survived under cualloc, or when it did not but only where
    CUDA's did not either. Phase 2 (the driver called directly, the same calls in both) is facts
    only."""
    cmp = {"part": "driver-questions", "op": "compare", "check": check, "mode": mode, "pass": None}
    pr, cr = (plain or {}).get("result") or {}, (pre or {}).get("result") or {}
    if not (pr.get("steps") and cr.get("steps")):
        return cmp
    steps, extra_inval, extra_err = [], [], []
    for a, b in zip(pr["steps"], cr["steps"]):
        steps.append({"op": a["op"], "phase": a["phase"], "plain_error": a["error"],
                      "plain_capture": a["capture_after"], "cualloc_error": b["error"],
                      "cualloc_capture": b["capture_after"]})
        if a["phase"] != 1:
            continue
        if b["capture_after"] != "active" and a["capture_after"] == "active":
            extra_inval.append(a["op"])
        if b["error"] not in ("cudaSuccess", "not loaded") and a["error"] in ("cudaSuccess", "not loaded"):
            extra_err.append("%s: %s" % (a["op"], b["error"]))
    cmp.update(steps=steps, cualloc_extra_invalidations=extra_inval, cualloc_extra_errors=extra_err,
               plain_pass=plain.get("pass"), cualloc_pass=pre.get("pass"))
    if extra_inval or extra_err:
        cmp["pass"] = False
    elif pre.get("pass") is not None:
        cmp["pass"] = True
    return cmp


def dq_verdict(rows, mock, fake):
    """The driver-questions part's status, detail and the records to append. Each check counts
    under cualloc and without it, except capture_vs_misses and its variants, for which each cualloc
    process's comparison with CUDA's own run of the same variant counts (the reference); a process
    that crashed or timed out fails. In --mock the probes against the fake driver must have found the driver's own
    cuGetProcAddress (in the fake's folder), under the preload too, past cualloc's dlsym."""
    if mock:
        probes = {r["mode"]: r for r in rows if r.get("op") == "probe"}
        if not probes:
            return "mock", "no nvcc: nothing built or run", []
        bad = []
        for mode in ("plain", "preload"):
            r = probes.get(mode) or {}
            res = r.get("result") or {}
            if not (r.get("pass") is True and res.get("get_proc_file", "").startswith(fake)
                    and res.get("cualloc") is (mode == "preload")
                    and res.get("dlsym_get_proc_is_driver") is (mode == "plain")):
                bad.append("%s: %s" % (mode, json.dumps(res)[:300] if res else "no result"))
        if bad:
            return "fail", "legacy_lookup_flags against the fake driver: " + "; ".join(bad), []
        return "mock", "legacy_lookup_flags ran against the fake driver (plain and under the preload); the rest not run", []
    runs = {(r["check"], r["mode"]): r for r in rows if r.get("op") == "check" and r.get("status") != "not-run"}
    if not runs:
        return "skipped", "nothing ran", []
    verdicts, extra = [], []
    for (check, mode), pre in sorted(runs.items()):
        if not dq_is_capture(check):
            verdicts.append((check, mode, pre.get("pass"), pre.get("rc", 0)))
        elif mode != "plain":
            plain = runs.get((check, "plain"))
            cmp = dq_compare(plain, pre, check, mode)
            extra.append(cmp)
            verdicts.append((check, "%s compared" % mode, cmp["pass"], max((plain or {}).get("rc", 0), pre.get("rc", 0))))
    for (check, mode), plain in sorted(runs.items()):  # CUDA's own run, with nothing to compare it to
        if dq_is_capture(check) and mode == "plain" and not any(c == check and m != "plain" for c, m in runs):
            verdicts.append((check, "plain, nothing compared", None, plain.get("rc", 0)))
    failed = ["%s (%s)%s" % (c, m, "" if rc == 0 else " exited %d" % rc) for c, m, p, rc in verdicts
              if p is False or rc != 0]
    undecided = ["%s (%s)" % (c, m) for c, m, p, rc in verdicts if p is None and rc == 0]
    detail = "; ".join(x for x in ["failed: " + ", ".join(failed) if failed else "",
                                     "undecided: " + ", ".join(undecided) if undecided else ""] if x)
    return ("fail" if failed else "pass"), detail or "every check passed", extra


def dq_verdict_main(path, mock, fake):
    status, detail, extra = dq_verdict(load(path), mock == "1", fake)
    with open(path, "a", encoding="utf-8") as f:
        for r in extra:
            f.write(json.dumps(r) + "\n")
    print("%s|%s" % (status, detail))
    return 0


def driver_questions(rows):
    out = []
    builds = [r for r in rows if r.get("op") == "build"]
    if builds:
        out += ["nvcc build (shared runtime): " + ", ".join("ok" if b["ok"] else "FAILED" for b in builds), ""]
    tab = []
    for r in rows:
        if r.get("op") not in ("check", "probe"):
            continue
        who = DQ_WHO.get(r["mode"], r["mode"])
        if r["op"] == "probe":
            who += " (fake driver)"
        if r.get("status") == "not-run":
            tab.append([r["check"], who, "not run (%s)" % r["reason"], "-", "-", "-"])
            continue
        res = r.get("result")
        if res is None:
            tail = (r.get("log_tail") or "").strip().splitlines()
            tab.append([r["check"], who, "no result (rc %s)" % r["rc"], (tail[-1] if tail else "-").replace("|", "/"),
                        r["rc"], fmt(r.get("wall_s"), "%.2f")])
            continue
        verdict = {True: "pass", False: "**FAIL**", None: "undecided"}[r.get("pass")]
        tab.append([r["check"], who, verdict, dq_facts(r["check"], res).replace("|", "/"), r["rc"],
                    fmt(r.get("wall_s"), "%.2f")])
    if tab:
        out += table(["check", "process", "result", "facts", "rc", "wall s"], tab)
        out.append("")
    for c in (r for r in rows if r.get("op") == "compare"):
        out.append("%s, %s against CUDA alone, step by step (the step's call and the capture's status after it; "
                   "phase 2 calls the driver directly in both processes): %s"
                   % (c.get("check", "capture_vs_misses"), DQ_WHO.get(c.get("mode", "preload"), c.get("mode")),
                      {True: "pass", False: "**FAIL**", None: "undecided"}[c.get("pass")]))
        out.append("")
        if c.get("cualloc_extra_invalidations") or c.get("cualloc_extra_errors"):
            out.append("- only under cualloc: invalidations %s; errors %s" % (
                ", ".join(c.get("cualloc_extra_invalidations") or []) or "none",
                ", ".join(c.get("cualloc_extra_errors") or []) or "none"))
            out.append("")
        out += table(["phase", "step", "without cualloc", "capture", "under cualloc", "capture"],
                     [[s["phase"], s["op"], s["plain_error"], s["plain_capture"], s["cualloc_error"],
                       s["cualloc_capture"]] for s in c.get("steps") or []])
        out.append("")
    return out


MODES = ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]
CUALLOC_MODES = ["cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]


def model_of(r):
    return r.get("model", "small")  # records made before --model existed were GPT-2 small


def measured(r, phase):
    """A real (not dry-run, not error) record of a torch phase."""
    return r.get("phase") == phase and "mode" in r and r.get("op") != "error" and not r.get("dry_run")


def dry_runs(rows):
    runs = [r for r in rows if r.get("dry_run") and r.get("phase") != "probe"]
    if not runs:
        return []
    out = ["Dry run (mock): the plan of each mode was validated; nothing was measured.", ""]
    out += table(["model", "mode", "phase", "valid", "problems"],
                 [[model_of(r), r["mode"], r["phase"], r.get("valid"), "; ".join(r.get("problems") or []) or "-"]
                  for r in runs])
    out.append("")
    return out


def errors(rows):
    out = []
    for e in rows:
        if e.get("op") == "error":
            last = ((e.get("log_tail") or "").strip().splitlines() or [""])[-1]
            out.append("- %s %s%s exited %s: `%s`" % (e["mode"], e["phase"], " (%s)" % e["label"] if e.get("label") else "",
                                                      e["rc"], last))
    return out + [""] if out else out


def gib(v, spec="%.2f"):
    return fmt(v / GiB, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


class Timed:
    """A mode's timed training runs of one model (one per --repeat round): the step time is the
    median of the runs' median step times; the peaks are the highest of the runs."""

    def __init__(self, recs):
        self.first = recs[0]
        self.steps = sorted(r["median_step_ms"] for r in recs)
        self.step = statistics.median(self.steps)
        peaks = [r["peak_bytes"] for r in recs if isinstance(r.get("peak_bytes"), (int, float))]
        self.peak = max(peaks) if peaks else None
        # Where a step's time goes (records made before these were kept have neither): the host's
        # time to issue it and the main thread's CPU time in that, medians of the runs' medians.
        issue = [r["median_issue_ms"] for r in recs if r.get("median_issue_ms") is not None]
        cpu = [r["median_issue_cpu_ms"] for r in recs if r.get("median_issue_cpu_ms") is not None]
        self.issue = statistics.median(issue) if issue else None
        self.issue_cpu = statistics.median(cpu) if cpu else None

    def range_text(self):
        return "%.1f-%.1f (%d runs)" % (self.steps[0], self.steps[-1], len(self.steps))

    def apart_from(self, other):
        """Whether every run of one is faster than every run of the other: only then is the
        difference of the medians more than the spread between runs. None with a single run."""
        if len(self.steps) < 2 or len(other.steps) < 2:
            return None
        return self.steps[-1] < other.steps[0] or other.steps[-1] < self.steps[0]


def timed_runs(rows):
    """{model: {mode: Timed}} of the measured training runs in rows, in the order first seen."""
    recs = {}
    for r in rows:
        if measured(r, "train"):
            recs.setdefault(model_of(r), {}).setdefault(r["mode"], []).append(r)
    return {model: {m: Timed(v) for m, v in modes.items()} for model, modes in recs.items()}


def apart_text(t, base):
    if t is base or base is None:
        return "-"
    a = t.apart_from(base)
    return "-" if a is None else ("yes" if a else "no: the runs overlap")


def torch(rows):
    out = dry_runs(rows)
    train = timed_runs(rows)
    oom = {r["mode"]: r for r in rows if measured(r, "oom")}
    for model, runs in train.items():
        base = runs.get("default")
        repeated = any(len(t.steps) > 1 for t in runs.values())
        tab = []
        for m, t in runs.items():
            r = t.first
            ratio = t.step / base.step if base else None
            diff = None
            if base and len(base.first.get("losses", [])) == len(r.get("losses", [])):
                diff = max((abs(x - y) for x, y in zip(r["losses"], base.first["losses"])), default=0.0)
            cu = r.get("cualloc") if isinstance(r.get("cualloc"), dict) else {}
            row = [m, fmt(t.step, "%.1f")]
            if repeated:
                row += [t.range_text()]
            row += [fmt(ratio, "%.3f")]
            if repeated:
                row += [apart_text(t, base)]
            row += [fmt(t.issue, "%.1f"), fmt(t.issue_cpu, "%.1f"), gib(t.peak), r.get("peak_source"), gib(r.get("peak_bytes_mem_get_info")),
                    gib(r.get("torch_max_memory_allocated")), gib(r.get("torch_max_memory_reserved")),
                    gib(cu.get("reserved_peak")) if cu else "-",
                    cu.get("num_maps", "-") if cu else "-",
                    fmt(diff, "%.2e"), "yes" if diff is not None and diff <= 1e-3 else ("-" if diff is None else "NO"),
                    fmt(r.get("losses", [None])[-1], "%.4f")]
            tab.append(row)
        first = next(iter(runs.values())).first
        out.append("GPT-2 %s, batch %s, %s steps (median after the warm-up), attention %s, %s, torch %s:" % (
            model, first.get("batch"), first.get("steps"), first.get("attn_implementation", "?"),
            first.get("device_name", "?"), first.get("torch_version", "?")))
        out.append("")
        header = ["mode", "median step ms"]
        if repeated:
            header += ["run medians, lowest-highest"]
        header += ["vs default"]
        if repeated:
            header += ["apart from default"]
        header += ["issue ms", "issue CPU ms", "peak GiB", "source", "peak GiB (mem_get_info)",
                   "torch max alloc GiB", "torch max reserved GiB", "cualloc reserved peak GiB", "cualloc maps",
                   "max abs loss diff vs default", "within 1e-3", "last loss"]
        out += table(header, tab)
        if repeated:
            out += ["", "With several runs per mode: the median step time is the median of the runs' medians; "
                    "\"apart from default\" says whether every run of the mode was on one side of every run of "
                    "the default (only then is the ratio more than the spread between runs)."]
        out.append("")
    if oom:
        out.append("Forced OOM under a cap:")
        out.append("")
        out += table(["mode", "pass", "trained under cap", "raised", "exception", "recovered", "message (start)"],
                     [[m, r.get("pass"), r.get("trained_under_cap"), r.get("raised"), r.get("exception_type", "-"),
                       r.get("recovered"), (r.get("message") or "-")[:160].replace("|", "/").replace("\n", " ")]
                      for m, r in oom.items()])
        out.append("")
    reports = [r for r in rows if r.get("op") == "oom-report"]
    if reports:
        out.append("allocview on cualloc's trace of each forced OOM (`allocview TRACE`; the text is in logs.txt):")
        out.append("")
        out += table(["mode", "trace", "OOM found", "diagnosis rules", "failing call site (innermost first)",
                      "largest live site at the OOM", "pass"],
                     [[r["mode"], r.get("trace"), r.get("oom_found", "-"), ", ".join(r.get("rules") or []) or "-",
                       " <- ".join(r.get("failing_site") or [])[:160].replace("|", "/") or "-",
                       (r.get("top_live_site") or "-")[:120].replace("|", "/"), r.get("pass", False)]
                      for r in reports])
        out.append("")
    snaps = [r for r in rows if r.get("op") == "snapshot" and not r.get("dry_run")]
    if snaps:
        out.append("PyTorch memory snapshots (replay corpus; `allocview import FILE -o TRACE`):")
        out.append("")
        out += table(["mode", "file", "MB", "MB as dumped", "shrunk", "trace entries", "segments", "steps"],
                     [[r["mode"], r["file"], fmt(r["bytes"] / 1e6, "%.2f"), fmt(r["bytes_as_dumped"] / 1e6, "%.2f"),
                       r["shrunk"], r["trace_entries"], r["segments"], r["steps"]] for r in snaps])
        out.append("")
    return out + errors(rows)


def step_controls(rows):
    """torch-step-controls: each configuration's runs (one a round) side by side: step time, its
    spread between runs, and where a step's time goes (issued by the host, the main thread's CPU)."""
    out = dry_runs(rows)
    runs = {}
    for r in rows:
        if measured(r, "train"):
            runs.setdefault((r["mode"], r.get("label") or "-"), []).append(r)
    if runs:
        first = next(iter(runs.values()))[0]
        out += ["GPT-2 %s, batch %s, %s steps (medians after the warm-up), %s, torch %s; one run per configuration "
                "a round, the rounds in turn:" % (model_of(first), first.get("batch"), first.get("steps"),
                                                   first.get("device_name", "?"), first.get("torch_version", "?")), ""]
        tab = []
        for (mode, label), recs in runs.items():
            t = Timed(recs)
            tab.append([label, mode, " / ".join("%.1f" % r["median_step_ms"] for r in recs), fmt(t.step, "%.1f"),
                        fmt(100.0 * (t.steps[-1] / t.steps[0] - 1), "%.0f%%") if len(t.steps) > 1 else "-",
                        fmt(t.issue, "%.1f"), fmt(t.issue_cpu, "%.1f"),
                        recs[0].get("sample_ms", "-"), recs[0].get("deterministic", "-"), gib(t.peak)])
        out += table(["configuration", "mode", "run medians, ms", "median ms", "spread", "issue ms", "issue CPU ms",
                      "sampler ms", "deterministic", "peak GiB"], tab)
        out += ["", "issue ms: the host's time to launch a step (before its loss is read); issue CPU ms: the main "
                "thread's CPU time in it. Issue time near the step time: the host sets the pace; issue time well "
                "above its CPU time: the main thread waits (the GIL, a full launch queue, a lock).", ""]
    return out + errors(rows)


def alloc_cost(rows):
    out = dry_runs(rows)
    runs = {r["mode"]: r for r in rows if r.get("op") == "allocpair" and not r.get("dry_run")}
    if runs:
        base = runs.get("default", {}).get("pair_ns")
        first = next(iter(runs.values()))
        out.append("ns per cached alloc + free from Python (median of %s repetitions of %s pairs; sizes %s B):" % (
            first.get("reps"), first.get("pairs_per_rep"), ", ".join(str(x) for x in first.get("sizes", []))))
        out.append("")
        out += table(["mode", "torch.empty + del", "vs default", "bare loop", "net of the loop",
                      "burst (16 alive, LIFO)", "caching_allocator_alloc/_delete"],
                     [[m, fmt(r.get("pair_ns")), fmt(r["pair_ns"] / base, "%.2f")
                       if base and isinstance(r.get("pair_ns"), (int, float)) else "-",
                       fmt(r.get("bare_loop_ns")), fmt(r.get("pair_ns_net")), fmt(r.get("burst_ns")),
                       fmt(r.get("raw_ns")) if r.get("raw_ns") is not None else (r.get("raw_error") or "-")[:60]]
                      for m, r in runs.items()])
        out.append("")
    return out + errors(rows)


def tokens_bracket(c):
    def one(p):
        return "%d (%d x %d)" % (p["tokens"], p["batch"], p["seq"]) if p else "-"
    return one(c.get("largest_pass")), one(c.get("smallest_fail"))


def peak_at(rows, c, which):
    """The largest pass's (which="largest_pass") memory at its peak, from its probe's record: live bytes
    (PyTorch's max_memory_allocated, or cualloc's allocated peak where PyTorch's cache is off and its
    counters read 0) and held bytes (reserved), as "live / held (live % of the budget)". How close a
    mode came to the budget: no allocator fits more live bytes than the budget leaves."""
    p = c.get(which)
    if not p:
        return "-"
    probes = [r for r in rows if r.get("op") == "probe" and r.get("outcome") == "pass" and r.get("mode") == c["mode"]
              and model_of(r) == model_of(c) and r.get("batch") == p["batch"] and r.get("seq") == p["seq"]]
    if not probes:
        return "-"
    r = probes[-1]
    live, held = r.get("torch_max_memory_allocated") or 0, r.get("torch_max_memory_reserved") or 0
    if not live and isinstance(r.get("cualloc"), dict):
        live, held = r["cualloc"].get("allocated_peak") or 0, r["cualloc"].get("reserved_peak") or 0
    if not live or not r.get("budget_bytes"):
        return "-"
    return "%s / %s (%.1f%%)" % (gib(live), gib(held), 100.0 * live / r["budget_bytes"])


def capacity(rows):
    out = dry_runs(rows)
    caps = [r for r in rows if r.get("op") == "capacity"]
    if caps:
        c0 = caps[0]
        out.append("%sGPT-2 %s: the most tokens per step (batch x sequence) that train %d steps%s without OOM "
                   "within %.1f GiB (ballast: cuMemCreate of free - budget before torch, in every mode); batch "
                   "bisected at sequence %d, then the sequence in steps of %d at the first failing batch; each "
                   "probe a fresh process." % (
                       "MOCK (dry-run probes, made-up limits): " if c0.get("mock") else "", model_of(c0),
                       c0["probe_steps"], " (%s)" % varlen_text(c0) if c0.get("varlen") else "", c0["budget_gb"], c0["seq"], c0["seq_step"]))
        out.append("")
        base = {model_of(c): {} for c in caps}
        for c in caps:
            base[model_of(c)][c["mode"]] = c.get("largest_pass_tokens")
        tab = []
        for c in caps:
            b = base[model_of(c)]
            t = c.get("largest_pass_tokens")
            p, f = tokens_bracket(c)
            tab.append([c["mode"], p, peak_at(rows, c, "largest_pass"), f, c.get("batch_at_seq"), ratio_text(t, b.get("default")),
                        ratio_text(t, b.get("expandable")), c["probes"],
                        ", ".join("%s %d" % kv for kv in sorted(c.get("outcomes", {}).items())),
                        "yes" if c.get("complete") else "no: %s" % c.get("stopped"),
                        "NO" if c.get("non_monotonic") else "yes", fmt(c.get("wall_s"), "%.0f")])
        out += table(["mode", "largest passed (tokens, b x s)", "its peak: live / held GiB (live % of budget)",
                      "smallest failed", "batch at seq", "vs default",
                      "vs expandable", "probes", "outcomes", "complete", "monotonic", "s"], tab)
        out.append("")
    bad = [r for r in rows if r.get("op") == "probe" and r.get("outcome") not in ("pass", "oom")]
    for r in bad:  # a probe that neither trained nor ran out of memory: the bisection treated it as failed
        last = ((r.get("error") or r.get("log_tail") or "").strip().splitlines() or [""])[-1]
        out.append("- probe %s %d x %d: %s (rc %s): `%s`" % (r["mode"], r["batch"], r["seq"], r.get("outcome"),
                                                           r.get("rc", "?"), last[:300]))
    if bad:
        out.append("")
    return out + errors(rows)


def varlen_text(c):
    """How a variable-length capacity search's probes chose their sequence lengths, for a sentence."""
    return ("their sequence lengths drawn from %s to the probe's, the first and last step at the probe's: the "
            "tokens per step count the longest" % c.get("seq_min", "?"))


def ratio_text(x, y, spec="%.3f"):
    return spec % (x / y) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else "-"


# ------------------------------------------------------------------------------------ targets

STEP_TARGET = 1.01           # step time <= 1.01 x default, for enable() and preload beneath the cache
STEP_TARGET_MODES = {"cualloc-enable", "cualloc-preload-cache"}
TOKENS_VS_DEFAULT = 1.10     # tokens/step >= 1.10 x default's; >= expandable's; peak <= expandable's


def verdict(value, ok):
    if value is None:
        return "not measured"
    return "met" if ok else "**NOT met**"


def tokens_cells(c, bc, ec, cu):
    """The tokens-per-step cells of a targets row: the bracket, then the ratio and the verdict against
    expandable's and against the default's (c, bc, ec: the mode's, default's and expandable's
    capacity records, or None; cu: the mode is one of cualloc's, which the targets are for)."""
    tok = c.get("largest_pass_tokens") if c else None
    tok_e = tok / ec["largest_pass_tokens"] if tok and ec and ec.get("largest_pass_tokens") else None
    tok_d = tok / bc["largest_pass_tokens"] if tok and bc and bc.get("largest_pass_tokens") else None
    note = ""
    if c and not c.get("complete"):
        note += " (search incomplete)"
    if c and c.get("non_monotonic"):
        note += " (non-monotonic)"
    return [("%s / %s" % tokens_bracket(c) if c else "-") + note, fmt(tok_e, "%.3f"),
            verdict(tok_e, tok_e is not None and tok_e >= 1.0) if cu else "-", fmt(tok_d, "%.3f"),
            verdict(tok_d, tok_d is not None and tok_d >= TOKENS_VS_DEFAULT) if cu else "-"]


TOKENS_HEADER = ["tokens/step passed / failed", "vs expandable", ">= 1", "vs default", ">= %.2f" % TOKENS_VS_DEFAULT]


def capacity_groups(rows):
    """The capacity records by search: {(model, varlen, probe_steps, budget_bytes): {mode: record}}.
    Only searches made the same way are compared: a mode's tokens per step at 40-step probes, or
    within another budget, say nothing against another mode's at 8 steps. Later files win: a rerun
    replaces an earlier run of the same search."""
    groups = {}
    for r in rows:
        if r.get("op") == "capacity":
            key = (model_of(r), bool(r.get("varlen")), r.get("probe_steps"), r.get("budget_bytes"))
            groups.setdefault(key, {})[r["mode"]] = r
    return groups


def capacity_table(model, caps):
    """One table of a model's searches made the same way (caps: {mode: record}), every mode against
    that search's default and expandable."""
    c0 = next(iter(caps.values()))
    if c0.get("varlen"):
        head = ("GPT-2 %s, sequence lengths drawn per step as in training (capacity budget %.1f GiB; each probe "
                "%d steps%s):" % (model, c0["budget_gb"], c0["probe_steps"], ", " + varlen_text(c0)))
    else:
        head = "GPT-2 %s, probes of %d steps at one length (capacity budget %.1f GiB):" % (
            model, c0["probe_steps"], c0["budget_gb"])
    out = [head, ""]
    out += table(["mode"] + TOKENS_HEADER,
                 [[m] + tokens_cells(caps.get(m), caps.get("default"), caps.get("expandable"), m in CUALLOC_MODES)
                  for m in MODES])
    out.append("")
    return out


def targets(rows, sources):
    """Side by side per model: step time vs default, peak vs expandable, tokens/step vs expandable and
    default, each against its target."""
    mock = any(r.get("op") == "meta" and r.get("mock") for r in rows)
    train = {}
    groups = capacity_groups(rows)
    # The rounds of one file (--repeat) go together; a later file's runs of a mode replace them.
    files = {}
    for r in rows:
        if measured(r, "train"):
            files.setdefault((model_of(r), r["mode"]), {}).setdefault(r.get("_file", 0), []).append(r)
    for key, by_file in files.items():
        train[key] = Timed(by_file[max(by_file)])
    out = ["## torch targets", ""]
    out.append("From %s." % ", ".join(sources) if sources else "No results found.")
    if mock:
        out.append("MOCK: some figures come from dry runs (made-up capacity limits): they are not measurements.")
    out += ["", "Targets: median step time <= %.2f x default for cualloc-enable and cualloc-preload-cache; peak "
            "device memory in use (NVML) <= expandable's; most tokens per step >= expandable's and >= %.2f x "
            "default's (for every cualloc mode)." % (STEP_TARGET, TOKENS_VS_DEFAULT), ""]
    for model in ("small", "medium"):
        fixed_groups = [k for k in groups if k[0] == model and not k[1]]
        if not any(k[0] == model for k in list(train) + list(groups)):
            out += ["GPT-2 %s: not measured." % model, ""]
            continue
        # The fixed-length searches that share the table with the training runs: those with the most
        # modes (the latest read on a tie); searches made another way get tables of their own.
        main = max(fixed_groups, key=lambda k: (len(groups[k]), max(r.get("_file", 0) for r in groups[k].values())),
                   default=None)
        cap = groups[main] if main else {}
        bt, et = train.get((model, "default")), train.get((model, "expandable"))
        bc, ec = cap.get("default"), cap.get("expandable")
        c0 = next(iter(cap.values()), None)
        if c0 is not None or any(k[0] == model for k in train):
            out.append("GPT-2 %s%s:" % (model, " (capacity budget %.1f GiB%s)" % (
                c0["budget_gb"], "" if c0.get("probe_steps", 3) == 3 else "; each probe %d steps" % c0["probe_steps"])
                if c0 else ""))
            out.append("")
            tab = []
            for m in MODES:
                t, c = train.get((model, m)), cap.get(m)
                step = t.step if t else None
                step_r = step / bt.step if t and bt else None
                peak = t.peak if t else None
                peak_r = peak / et.peak if peak is not None and et and et.peak else None
                apart = t.apart_from(bt) if t and bt and t is not bt else None
                cu = m in CUALLOC_MODES
                step_v = (verdict(step_r, step_r is not None and step_r <= STEP_TARGET) if m in STEP_TARGET_MODES
                          else "-")
                if m in STEP_TARGET_MODES and apart is False:
                    step_v += " (runs overlap the default's)"
                tab.append([m, fmt(step, "%.1f") + (" (%d runs)" % len(t.steps) if t and len(t.steps) > 1 else ""),
                            fmt(step_r, "%.3f"), step_v,
                            gib(peak), fmt(peak_r, "%.3f"),
                            verdict(peak_r, peak_r is not None and peak_r <= 1.0) if cu else "-"]
                           + tokens_cells(c, bc, ec, cu))
            out += table(["mode", "step ms", "vs default", "<= %.2f" % STEP_TARGET, "peak GiB", "vs expandable",
                          "<= 1"] + TOKENS_HEADER, tab)
            out.append("")
        others = sorted((k for k in groups if k[0] == model and k != main),
                        key=lambda k: (k[1], k[2] or 0, k[3] or 0))
        for k in others:
            out += capacity_table(model, groups[k])
    return out


def natural_key(path):
    """The order folders are read in: by name, with numbers compared as numbers, so that run10 comes
    after run9 (results/DATE-DEVICE/runN-COMMIT/) and a later run's results replace an earlier's."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def targets_main(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = [os.path.join(d, n) for d, _, names in os.walk(p) for n in names if n == "results.jsonl"]
            files += sorted(found, key=natural_key)
        else:
            files.append(p)
    rows, sources = [], []
    for i, f in enumerate(files):
        part_rows = load(f)
        for r in part_rows:
            r["_file"] = i
        meta = next((r for r in part_rows if r.get("op") == "meta"), {})
        # the controls' runs time one mode several ways: not a mode's figures against the targets
        if not str(meta.get("part", "torch")).startswith("torch") or meta.get("part") == "torch-step-controls":
            continue
        rows += part_rows
        sources.append("%s (%s)" % (meta.get("part", f), (meta.get("date") or "?")))
    print("\n".join(targets(rows, sources)))
    return 0


def viewer(rows):
    runs = [r for r in rows if r.get("op") == "viewer"]
    out = ["allocview export --pytorch, read by PyTorch's viewer code (torch.cuda._memory_viz) where torch is "
           "installed, and always by tests/check_snapshot.py's re-implementation of its checks:", ""]
    out += table(["snapshot", "bytes", "events", "segments", "Python checks", "torch", "segsum lines", "trace lines",
                  "trace_plot bytes", "segment_plot bytes", "pass"],
                 [[r.get("file"), r.get("bytes", "-"), r.get("events", "-"), r.get("segments", "-"),
                   r.get("python_checks", "-"), r.get("torch") or "not installed", r.get("segsum_lines", "-"),
                   r.get("trace_lines", "-"), r.get("trace_plot_bytes", "-"), r.get("segment_plot_bytes", "-"),
                   r.get("pass")] for r in runs])
    errs = [r for r in runs if r.get("error")]
    for r in errs:
        out.append("- %s: %s" % (r["file"], r["error"]))
    return out


def torch_api(rows):
    """torch_api.py's checks: the verdict and the rest of each check's record as facts."""
    out = []
    tab = []
    for r in rows:
        if r.get("op") != "check":
            continue
        if r.get("status") == "not-run":
            tab.append([r["check"], "not run (%s)" % r.get("reason"), r.get("what", "").replace("|", "/")])
            continue
        facts = "; ".join("%s=%s" % (k, json.dumps(v)) for k, v in sorted(r.items())
                          if k not in ("part", "op", "check", "pass"))
        tab.append([r["check"], {True: "pass", False: "**FAIL**", None: "question (recorded)"}[r.get("pass")],
                    facts.replace("|", "/")])
    if tab:
        out += table(["check", "result", "what was seen"], tab)
        out.append("")
    for r in rows:
        if r.get("op") == "trace":
            out.append("- the job's trace (%d bytes): %d step marks found by allocview dump" % (
                r.get("trace_bytes", 0), r.get("step_marks", 0)))
    return out


PARTS = {"driver-costs": driver_costs, "property-cuda": property_cuda, "ld-preload": ld_preload,
         "driver-questions": driver_questions, "torch-api": torch_api, "torch": torch,
         "torch-medium": torch, "torch-alloc-cost": alloc_cost, "torch-capacity": capacity,
         "torch-capacity-medium": capacity, "torch-capacity-varlen": capacity,
         "torch-capacity-medium-varlen": capacity, "torch-step-controls": step_controls, "viewer": viewer}


def main(argv):
    if len(argv) >= 3 and argv[1] == "targets":
        return targets_main(argv[2:])
    if len(argv) == 5 and argv[1] == "driver-questions-verdict":
        return dq_verdict_main(*argv[2:])
    text = ("usage: summarize.py %s RESULTS.jsonl\n       summarize.py targets RESULTS_DIR_OR_JSONL...\n"
            "A part's results.jsonl as markdown, or the comparison with the targets of every torch part found."
            % "|".join(PARTS))
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(text)
        return 0
    if len(argv) != 3 or argv[1] not in PARTS:
        print(text, file=sys.stderr)
        return 2
    rows = load(argv[2])
    print("\n".join(head(argv[1], rows) + PARTS[argv[1]](rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
