#!/usr/bin/env python3
"""torch_api.py — what real PyTorch does with cualloc_torch.enable(), one check at a time.

tests/test_cualloc_torch.py checks tools/cualloc_torch.py against a test double of torch; this asks
the real PyTorch the same questions on a GPU, and the questions the README answers about PyTorch's
own behaviour under a pluggable allocator (cuDNN's benchmark mode, CUDA graphs, record_stream,
memory pools). One process: enable() first, then the checks in order, each printing one line

    torch_api: RESULT {"check": NAME, "pass": true|false|null, ...}

(null: a question whose answer is recorded, not judged). Exit status 0 when no check failed.
--dry-run imports no torch and prints one `torch_api: PLAN {"check": NAME, "what": ...}` line a check.

  python3 bench/gpu/torch_api.py [--build DIR] [--only NAME,...] [--dry-run]

Run it with CUALLOC_CONF=trace:PATH to record the job; bench/gpu/run.sh (part torch-api) then reads
the trace with allocview and checks that the optimizer's step marks are in it.
"""
import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20

# The keys memory_stats() gives under cualloc (README, "Using it under PyTorch"): PyTorch's "all"
# figures of five byte statistics, the allocation counts and five counters. Nothing else.
EXPECTED_KEYS = sorted(
    ["%s_bytes.all.%s" % (g, w) for g in ("allocated", "reserved", "active", "requested", "inactive_split")
     for w in ("current", "peak")]
    + ["allocation.all.current", "allocation.all.allocated", "allocation.all.freed",
       "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams"])

CHECKS = [
    ("served", "a CUDA tensor is allocated by cualloc (cualloc_torch.stats() counts it)"),
    ("stats_match", "torch.cuda.memory_allocated/reserved and their peaks are cualloc's figures"),
    ("standin_keys", "torch.cuda.memory_stats() has exactly the README's keys; a left-out key is a KeyError"),
    ("accelerator", "torch.accelerator.memory_allocated() (PyTorch >= 2.9) answers as torch.cuda's"),
    ("reset_peak", "reset_peak_memory_stats() brings max_memory_allocated() down to memory_allocated()"),
    ("reset_accumulated", "after reset_accumulated_memory_stats(), 5 tensors count 5 allocated and 5 freed"),
    ("empty_cache", "empty_cache() returns 512 MiB freed by a tensor to the driver (mem_get_info)"),
    ("memory_summary", "torch.cuda.memory_summary() is cualloc's"),
    ("train_marks", "5 AdamW steps of a small MLP under bf16 autocast train (finite losses)"),
    ("oom", "an impossible tensor raises RuntimeError('CUDA out of memory. Tried to allocate ...'), "
            "num_ooms counts it, and a tensor afterwards works"),
    ("graph_guard", "torch.cuda.graph raises cualloc's RuntimeError before a capture starts, and leaves "
                    "the current stream as it was"),
    ("cudnn_benchmark", "a convolution with torch.backends.cudnn.benchmark = True runs, or setting the mode warned "
                        "that it will fail"),
    ("record_stream", "Tensor.record_stream on a side stream, then free: no error"),
    ("caching_allocator_alloc", "torch.cuda.caching_allocator_alloc/_delete go through cualloc"),
    ("mempool", "question: torch.cuda.MemPool + use_mem_pool under the pluggable allocator"),
    ("compile_cudagraphs", "torch.compile(mode='reduce-overhead') meets the graph guard's RuntimeError, or runs "
                           "correctly without capturing; eager work goes on afterwards"),
]


def emit(check, ok, **fields):
    d = {"check": check, "pass": ok}
    d.update(fields)
    print("torch_api: RESULT " + json.dumps(d, sort_keys=True), flush=True)
    return ok


def first_line(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0] if text else "")


class Job:
    def __init__(self, torch, ct):
        self.torch = torch
        self.ct = ct
        self.keep = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")

    def sync(self):
        self.torch.cuda.synchronize()

    # ---------------------------------------------------------------------------- the checks

    def served(self):
        t, ct = self.torch, self.ct
        before = ct.stats()
        x = t.empty(3 * MiB, dtype=t.uint8, device="cuda")
        after = ct.stats()
        grew = after["allocated_bytes"] - before["allocated_bytes"]
        del x
        return emit("served", after["num_allocs"] == before["num_allocs"] + 1 and grew >= 3 * MiB,
                    allocs_counted=after["num_allocs"] - before["num_allocs"], allocated_grew=grew,
                    enabled=ct.is_enabled())

    def stats_match(self):
        t, ct = self.torch, self.ct
        x = t.empty(5 * MiB + 123, dtype=t.uint8, device="cuda")
        s = ct.stats()
        pairs = {"memory_allocated": (t.cuda.memory_allocated(), s["allocated_bytes"]),
                 "max_memory_allocated": (t.cuda.max_memory_allocated(), s["allocated_peak"]),
                 "memory_reserved": (t.cuda.memory_reserved(), s["reserved_bytes"]),
                 "max_memory_reserved": (t.cuda.max_memory_reserved(), s["reserved_peak"]),
                 "memory_stats.allocated_bytes.all.current":
                     (t.cuda.memory_stats()["allocated_bytes.all.current"], s["allocated_bytes"])}
        del x
        wrong = {k: v for k, v in pairs.items() if v[0] != v[1]}
        return emit("stats_match", not wrong, compared=sorted(pairs), wrong=wrong)

    def standin_keys(self):
        t = self.torch
        keys = sorted(t.cuda.memory_stats().keys())
        missing = sorted(set(EXPECTED_KEYS) - set(keys))
        extra = sorted(set(keys) - set(EXPECTED_KEYS))
        try:
            t.cuda.memory_stats()["active_bytes.large_pool.current"]
            keyerror = False
        except KeyError:
            keyerror = True
        nested = t.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"]
        flat = t.cuda.memory_stats()["allocated_bytes.all.current"]
        return emit("standin_keys", not missing and not extra and keyerror and nested == flat,
                    missing=missing, extra=extra, left_out_key_is_keyerror=keyerror,
                    nested_matches_flat=nested == flat)

    def accelerator(self):
        t = self.torch
        acc = getattr(t, "accelerator", None)
        if acc is None or not hasattr(acc, "memory_allocated"):
            return emit("accelerator", None, detail="this PyTorch has no torch.accelerator.memory_allocated")
        x = t.empty(7 * MiB, dtype=t.uint8, device="cuda")
        a, c = acc.memory_allocated(), t.cuda.memory_allocated()
        stats_keys = None
        if hasattr(acc, "memory_stats"):
            stats_keys = sorted(acc.memory_stats().keys()) == EXPECTED_KEYS
        del x
        return emit("accelerator", a == c and stats_keys is not False, accelerator=a, cuda=c,
                    memory_stats_keys_match=stats_keys)

    def reset_peak(self):
        t = self.torch
        y = t.empty(64 * MiB, dtype=t.uint8, device="cuda")
        del y
        self.sync()
        before = t.cuda.max_memory_allocated()
        cur = t.cuda.memory_allocated()
        t.cuda.reset_peak_memory_stats()
        after = t.cuda.max_memory_allocated()
        return emit("reset_peak", before >= cur + 64 * MiB and after == t.cuda.memory_allocated(),
                    peak_before=before, current=cur, peak_after=after)

    def reset_accumulated(self):
        t = self.torch
        self.sync()
        t.cuda.reset_accumulated_memory_stats()
        zero = t.cuda.memory_stats()["allocation.all.allocated"]
        ts = [t.empty(4096 * (i + 1), dtype=t.uint8, device="cuda") for i in range(5)]
        allocated = t.cuda.memory_stats()["allocation.all.allocated"]
        del ts
        freed = t.cuda.memory_stats()["allocation.all.freed"]
        since_start = self.ct.stats()["num_allocs"]
        return emit("reset_accumulated", zero == 0 and allocated == 5 and freed == 5,
                    at_reset=zero, allocated=allocated, freed=freed, cualloc_num_allocs_since_start=since_start)

    def empty_cache(self):
        t = self.torch
        z = t.empty(512 * MiB, dtype=t.uint8, device="cuda")
        z.fill_(1)
        del z
        self.sync()
        r0, free0 = t.cuda.memory_reserved(), t.cuda.mem_get_info()[0]
        t.cuda.empty_cache()
        r1, free1 = t.cuda.memory_reserved(), t.cuda.mem_get_info()[0]
        return emit("empty_cache", r0 - r1 >= 512 * MiB and free1 - free0 >= 512 * MiB,
                    reserved_before=r0, reserved_after=r1, driver_free_gained=free1 - free0)

    def memory_summary(self):
        s = self.torch.cuda.memory_summary()
        return emit("memory_summary", isinstance(s, str) and s.startswith("cualloc memory summary"),
                    first_line=s.splitlines()[0] if s else "")

    def train_marks(self):
        t = self.torch
        t.manual_seed(0)
        model = t.nn.Sequential(t.nn.Linear(1024, 4096), t.nn.GELU(), t.nn.Linear(4096, 1024)).cuda()
        opt = t.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(5):
            x = t.randn(64, 1024, device="cuda")
            with t.autocast("cuda", dtype=t.bfloat16):
                loss = (model(x).float() - x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        ok = all(l == l and abs(l) != float("inf") for l in losses)
        del model, opt
        return emit("train_marks", ok, losses=[round(l, 5) for l in losses])

    def oom(self):
        t = self.torch
        before = t.cuda.memory_stats()["num_ooms"]
        try:
            t.empty(1 << 50, dtype=t.uint8, device="cuda")
            return emit("oom", False, detail="a 1 PiB tensor was allocated")
        except Exception as e:
            err = e
        after = t.cuda.memory_stats()["num_ooms"]
        x = t.ones(MiB, device="cuda")
        works = float(x.sum()) == MiB
        text = str(err)
        is_torch_oom = isinstance(err, getattr(t, "OutOfMemoryError", ()) or ())
        return emit("oom", isinstance(err, RuntimeError) and text.startswith("CUDA out of memory. Tried to allocate")
                    and after == before + 1 and works,
                    exception=type(err).__name__, is_torch_OutOfMemoryError=is_torch_oom,
                    message=text[:400], num_ooms_counted=after - before, allocation_after_works=works)

    def graph_guard(self):
        t = self.torch
        x = t.ones(1024, device="cuda")
        s0 = t.cuda.current_stream()
        g = t.cuda.CUDAGraph()
        raised = None
        try:
            with t.cuda.graph(g):
                x.mul_(2)
        except RuntimeError as e:
            raised = str(e)
        same_stream = t.cuda.current_stream() == s0
        capturing = t.cuda.is_current_stream_capturing()
        direct = None
        try:
            t.cuda.CUDAGraph().capture_begin()
        except RuntimeError as e:
            direct = str(e)
        self.sync()
        works = float(x.sum()) == 1024
        guard = "not supported under cualloc_torch.enable()"
        return emit("graph_guard", bool(raised and guard in raised and direct and guard in direct)
                    and same_stream and not capturing and works,
                    raised=(raised or "")[:160], capture_begin_raised=(direct or "")[:160],
                    stream_unchanged=same_stream, still_capturing=capturing, tensor_untouched=works)

    def cudnn_benchmark(self):
        """PyTorch's pluggable allocator refuses cacheInfo, which the benchmark mode asks for: the
        convolution may fail, but then setting the mode must have warned (cualloc_torch)."""
        t = self.torch
        old = t.backends.cudnn.benchmark
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            t.backends.cudnn.benchmark = True
        warned = [str(w.message)[:120] for w in seen
                  if issubclass(w.category, RuntimeWarning) and str(w.message).startswith("cualloc_torch:")]
        try:
            conv = t.nn.Conv2d(16, 32, 3, padding=1).cuda()
            inp = t.randn(8, 16, 64, 64, device="cuda", requires_grad=True)
            out = conv(inp)
            out.sum().backward()
            self.sync()
            return emit("cudnn_benchmark", True, ran=True, warned=warned, detail="forward and backward ran")
        except Exception as e:
            return emit("cudnn_benchmark", bool(warned), ran=False, warned=warned, detail=first_line(e)[:400])
        finally:
            t.backends.cudnn.benchmark = old

    def record_stream(self):
        t = self.torch
        side = t.cuda.Stream()
        x = t.ones(4 * MiB, device="cuda")
        with t.cuda.stream(side):
            y = x * 3
        x.record_stream(side)
        del x
        side.synchronize()
        ok = float(y[0]) == 3.0
        return emit("record_stream", ok, detail="record_stream, free and the side stream's result checked")

    def caching_allocator_alloc(self):
        t, ct = self.torch, self.ct
        before = ct.stats()["num_allocs"]
        p = t.cuda.caching_allocator_alloc(2 * MiB)
        counted = ct.stats()["num_allocs"] - before
        t.cuda.caching_allocator_delete(p)
        return emit("caching_allocator_alloc", p != 0 and counted == 1, pointer_nonzero=p != 0, allocs_counted=counted)

    def mempool(self):
        t = self.torch
        if not hasattr(t.cuda, "MemPool") or not hasattr(t.cuda, "use_mem_pool"):
            return emit("mempool", None, detail="this PyTorch has no torch.cuda.MemPool")
        before = self.ct.stats()["num_allocs"]
        try:
            pool = t.cuda.MemPool()
            with t.cuda.use_mem_pool(pool):
                x = t.ones(MiB, device="cuda")
            ok = float(x.sum()) == MiB
            counted = self.ct.stats()["num_allocs"] - before
            del x
            return emit("mempool", None, ran=ok, cualloc_allocs_counted=counted)
        except Exception as e:
            return emit("mempool", None, ran=False, detail=first_line(e)[:400])


    def compile_cudagraphs(self):
        """torch.compile's reduce-overhead mode records CUDA graphs (CUDA graph trees) through
        torch.cuda.graph, so under enable() its first recording must meet the graph guard's
        RuntimeError, raised to the caller; or, where the compiler decides not to use graphs (it
        counts a skip), the function runs and gives eager's result. Fail: a wrong result, capturing
        left on, or another current stream. Not judged (null) when it fails otherwise (e.g. no Triton
        or no C compiler on the machine), or runs with no refusal and no skip counted. Last
        in the list: a refused recording may leave the compiler's graph trees unusable."""
        t = self.torch
        guard = "not supported under cualloc_torch.enable()"

        def f(x):
            return (x * 2).sin() + 1

        x = t.randn(4096, device="cuda")
        want = f(x)
        s0 = t.cuda.current_stream()
        calls, right, raised = 0, [], None
        t0 = time.monotonic()
        try:
            cf = t.compile(f, mode="reduce-overhead")
            for _ in range(3):  # CUDA graph trees warm up on the first call and record on a later one
                y = cf(x)
                calls += 1
                right.append(bool(t.allclose(y, want)))
        except Exception as e:
            raised = e
        seconds = round(time.monotonic() - t0, 1)
        chain, e = [], raised
        while e is not None and len(chain) < 5:
            chain.append(first_line(e)[:300])
            e = e.__cause__ or e.__context__
        met_guard = any(guard in c for c in chain)
        capturing = t.cuda.is_current_stream_capturing()
        same_stream = t.cuda.current_stream() == s0
        if capturing:  # reading a result or synchronizing now would raise and lose these facts
            return emit("compile_cudagraphs", False, still_capturing=True, stream_unchanged=same_stream,
                        exception_chain=chain, met_graph_guard=met_guard, calls_completed=calls, seconds=seconds)
        eager = bool(t.allclose(f(x), want))
        self.sync()
        skips = None
        try:
            from torch._dynamo.utils import counters
            skips = dict(counters.get("inductor", {})).get("cudagraph_skips")
        except Exception:
            pass
        facts = dict(calls_completed=calls, results_right=right, exception_chain=chain, met_graph_guard=met_guard,
                     still_capturing=capturing, stream_unchanged=same_stream, eager_after_right=eager,
                     cudagraph_skips=skips, seconds=seconds)
        try:
            t._dynamo.reset()
        except Exception:
            pass
        if capturing or not same_stream or not eager or (right and not all(right)):
            return emit("compile_cudagraphs", False, **facts)
        if met_guard:
            return emit("compile_cudagraphs", True, outcome="the graph guard refused the recording", **facts)
        if raised is None and skips:
            return emit("compile_cudagraphs", True, outcome="the compiler skipped CUDA graphs; results right", **facts)
        if raised is None:  # no refusal and no skip counted: whether anything was captured is not known
            return emit("compile_cudagraphs", None, outcome="ran, results right, no skip counted (not judged)", **facts)
        return emit("compile_cudagraphs", None, outcome="failed before any recording (not judged)", **facts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", default="", help="checks to run, comma-separated (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="list the checks; imports no torch")
    a = ap.parse_args(argv)
    names = [n for n, _ in CHECKS]
    only = [n for n in a.only.split(",") if n] or names
    unknown = [n for n in only if n not in names]
    if unknown:
        ap.error("unknown check(s) %s; the checks: %s" % (", ".join(unknown), ", ".join(names)))
    shim = os.path.join(a.build, "src", "libcualloc_torch.so")
    if a.dry_run:
        print("torch_api: would enable %s, then run: %s" % (shim, ", ".join(only)))
        for n, what in CHECKS:
            if n in only:
                print("torch_api: PLAN " + json.dumps({"check": n, "what": what}))
        return 0
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import cualloc_torch as ct  # noqa: E402
    ct.enable(shim, step_marks=True)
    import torch  # noqa: E402
    if not torch.cuda.is_available():
        print("torch_api: no CUDA device", file=sys.stderr)
        return 77
    print("torch_api: torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)), flush=True)
    job = Job(torch, ct)
    failed = 0
    for n in only:
        try:
            ok = getattr(job, n)()
        except Exception as e:
            ok = emit(n, False, error=first_line(e)[:400])
        failed += ok is False
    print("torch_api: %d check(s) failed" % failed, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
