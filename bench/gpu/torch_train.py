#!/usr/bin/env python3
"""torch_train.py — GPT-2 small training under one allocator mode (bench/gpu/run.sh torch).

One mode per process (run.sh starts a fresh process for each, with the mode's environment):

  default                  PyTorch's caching allocator
  expandable               PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cualloc-enable           cualloc_torch.enable() (pluggable allocator) before any CUDA tensor
  cualloc-preload-nocache  LD_PRELOAD=libcualloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1
  cualloc-preload-cache    LD_PRELOAD=libcualloc.so beneath PyTorch's default cache

Phase `train`: GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)), random init after
torch.manual_seed(seed), synthetic tokens from a seeded generator, AdamW, bf16 autocast, batch 8,
sequence lengths drawn from [128, 1024] with random.Random(seed) — the same in every mode. Records
every step's loss (to compare modes), the median step time after the warm-up steps, and the peak
device memory in use, measured the same way in every mode: a sampler thread reads the device's
used memory every few ms — from NVML (libnvidia-ml.so.1 through ctypes) where it loads, else from
torch.cuda.mem_get_info() — and peak = max(used) - used before the job (after the context exists).
NVML is preferred because under LD_PRELOAD cualloc answers cudaMemGetInfo (and so mem_get_info)
with the driver's free memory plus its own cached free memory; both figures are recorded.

Phase `oom`: under a cap (CUALLOC_CONF=max_memory_mb:... for the cualloc modes, set by run.sh;
torch.cuda.set_per_process_memory_fraction for the PyTorch modes) two normal steps must train and
a too-large batch must raise a Python exception (RuntimeError / torch.OutOfMemoryError), whose type
and text are recorded; then one small step must train again (recovery).

--dry-run validates the arguments and the environment against the mode and prints the plan
without importing torch (run.sh --mock). Results: one JSON object per line appended to --out.
"""

import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import threading
import time

MODES = ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]
CUALLOC_MODES = {"cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"}
PRELOAD_MODES = {"cualloc-preload-nocache", "cualloc-preload-cache"}
VOCAB = 50257
GiB = 1 << 30


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--phase", default="train", choices=["train", "oom"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median step time")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-min", type=int, default=128)
    p.add_argument("--seq-max", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-ms", type=float, default=2.0, help="memory sampler period")
    p.add_argument("--oom-cap-gb", type=float, default=16.0)
    p.add_argument("--oom-batch", type=int, default=48, help="batch that must not fit under the cap")
    p.add_argument("--oom-seq", type=int, default=1024)
    p.add_argument("--no-deterministic", action="store_true",
                   help="do not call torch.use_deterministic_algorithms(True, warn_only=True)")
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(here)))
    p.add_argument("--build", default=None, help="meson build folder (default REPO/build)")
    p.add_argument("--out", default=None, help="JSON lines file to append to (default: stdout only)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; no torch")
    a = p.parse_args(argv)
    a.build = a.build or os.path.join(a.repo, "build")
    return a


def seq_lengths(a):
    rng = random.Random(a.seed)
    return [rng.randint(a.seq_min, a.seq_max) for _ in range(a.steps)]


def validate(a):
    """Returns a list of problems with the arguments and the environment for this mode."""
    bad = []
    if a.steps <= a.warmup:
        bad.append("--steps (%d) must exceed --warmup (%d)" % (a.steps, a.warmup))
    if a.batch < 1 or a.oom_batch < 1:
        bad.append("batch sizes must be positive")
    if not 1 <= a.seq_min <= a.seq_max <= 1024:
        bad.append("need 1 <= --seq-min <= --seq-max <= 1024 (GPT-2's n_positions)")
    if a.oom_cap_gb <= 0:
        bad.append("--oom-cap-gb must be positive")
    env = os.environ
    preload = env.get("LD_PRELOAD", "")
    lib = os.path.join(a.build, "src", "libcualloc.so")
    if a.mode in PRELOAD_MODES:
        if "libcualloc.so" not in preload:
            bad.append("mode %s needs LD_PRELOAD=.../libcualloc.so (LD_PRELOAD=%r)" % (a.mode, preload))
        for part in preload.replace(":", " ").split():
            if "libcualloc" in part and not os.path.exists(part):
                bad.append("LD_PRELOAD names %s, which does not exist" % part)
    elif "libcualloc" in preload:
        bad.append("mode %s must run without libcualloc in LD_PRELOAD" % a.mode)
    nocache = "PYTORCH_NO_CUDA_MEMORY_CACHING" in env
    if (a.mode == "cualloc-preload-nocache") != nocache:
        bad.append("PYTORCH_NO_CUDA_MEMORY_CACHING must be set exactly in mode cualloc-preload-nocache "
                   "(PyTorch treats it as set whatever its value)")
    expandable = "expandable_segments:true" in env.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    if (a.mode == "expandable") != expandable:
        bad.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True must be set exactly in mode expandable")
    if a.mode == "cualloc-enable":
        tools = os.path.join(a.repo, "tools", "cualloc_torch.py")
        torch_lib = os.path.join(a.build, "src", "libcualloc_torch.so")
        if not os.path.exists(tools):
            bad.append("%s is missing" % tools)
        if not os.path.exists(torch_lib):
            bad.append("%s is missing (build with a C++ compiler)" % torch_lib)
    if a.mode in CUALLOC_MODES and not os.path.exists(lib):
        bad.append("%s is missing" % lib)
    if a.phase == "oom" and a.mode in CUALLOC_MODES and "max_memory_mb:" not in env.get("CUALLOC_CONF", ""):
        bad.append("phase oom in a cualloc mode needs CUALLOC_CONF=...max_memory_mb:N (the cap)")
    return bad


def emit(a, record):
    record = dict({"part": "torch", "mode": a.mode, "phase": a.phase}, **record)
    line = json.dumps(record, sort_keys=False)
    print("torch_train: RESULT " + (line if len(line) < 600 else line[:600] + "..."))
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def plan(a):
    seqs = seq_lengths(a)
    return {
        "model": "GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)), random init, seed %d" % a.seed,
        "optimizer": "AdamW lr 1e-4", "autocast": "bfloat16", "batch": a.batch,
        "steps": a.steps, "warmup": a.warmup, "seq_lengths": seqs,
        "deterministic": not a.no_deterministic,
        "memory": "sampler every %.1f ms: NVML used (else mem_get_info); peak - baseline" % a.sample_ms,
        "oom": ("cap %.1f GiB (%s), 2 steps at batch %d seq 512, then batch %d seq %d must raise; then batch 2 "
                "seq 256 must train" % (a.oom_cap_gb, "CUALLOC_CONF max_memory_mb" if a.mode in CUALLOC_MODES
                                         else "set_per_process_memory_fraction", a.batch, a.oom_batch, a.oom_seq))
               if a.phase == "oom" else None,
        "env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                                                "PYTORCH_CUDA_ALLOC_CONF", "CUALLOC_CONF")},
    }


# ---------------------------------------------------------------------------------------------
# Device memory in use, sampled.

class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """Device used memory straight from NVML (no CUDA runtime, no interposition)."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle)) != 0:
            raise OSError("nvmlDeviceGetHandleByIndex_v2(%d) failed" % index)
        self.mem = _NvmlMemory()

    def used(self):
        if self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(self.mem)) != 0:
            raise OSError("nvmlDeviceGetMemoryInfo failed")
        return int(self.mem.used)


class Sampler(threading.Thread):
    """Peak device memory in use during the job, the same way for every mode."""

    def __init__(self, torch, period_s):
        super().__init__(daemon=True)
        self.torch = torch
        self.period = period_s
        self.nvml = None
        try:
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            self.nvml = Nvml(int(vis) if vis.isdigit() else 0)
        except (OSError, AttributeError) as e:
            self.nvml_error = str(e)
        self.stop_flag = threading.Event()
        self.samples = 0
        free, self.total = torch.cuda.mem_get_info()
        self.base_mgi = self.total - free
        self.base_nvml = self.nvml.used() if self.nvml else None
        self.max_mgi = self.base_mgi
        self.max_nvml = self.base_nvml

    def sample(self):
        free, _ = self.torch.cuda.mem_get_info()
        self.max_mgi = max(self.max_mgi, self.total - free)
        if self.nvml:
            self.max_nvml = max(self.max_nvml, self.nvml.used())
        self.samples += 1

    def run(self):
        self.torch.cuda.set_device(0)
        while not self.stop_flag.is_set():
            self.sample()
            time.sleep(self.period)

    def finish(self):
        self.stop_flag.set()
        self.join()
        self.sample()
        out = {"peak_bytes_mem_get_info": self.max_mgi - self.base_mgi, "baseline_used_bytes": self.base_mgi,
               "samples": self.samples, "device_total_bytes": self.total}
        if self.nvml:
            out.update(peak_bytes=self.max_nvml - self.base_nvml, peak_source="nvml",
                       baseline_used_bytes_nvml=self.base_nvml)
        else:
            out.update(peak_bytes=self.max_mgi - self.base_mgi, peak_source="mem_get_info",
                       nvml_error=getattr(self, "nvml_error", None))
        return out


# ---------------------------------------------------------------------------------------------
# The job.

def setup(a):
    """Imports torch (after cualloc_torch.enable() in that mode) and returns (torch, cualloc_torch|None)."""
    if not a.no_deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    ct = None
    if a.mode == "cualloc-enable":
        sys.path.insert(0, os.path.join(a.repo, "tools"))
        import cualloc_torch as ct  # noqa: E402
        ct.enable(os.path.join(a.build, "src", "libcualloc_torch.so"))
    elif a.mode in PRELOAD_MODES:
        sys.path.insert(0, os.path.join(a.repo, "tools"))
        import cualloc_torch as ct  # noqa: E402 (statistics only: the preloaded copy)
        ct.load(os.path.join(a.build, "src", "libcualloc.so"))
    import torch  # noqa: E402
    if not torch.cuda.is_available():
        raise SystemExit("torch_train: no CUDA device")
    if not a.no_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    return torch, ct


def build_model(torch, a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=VOCAB)
    model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def step(torch, model, opt, tokens):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss.item())


def alloc_stats(torch, ct):
    out = {}
    for name in ("max_memory_allocated", "max_memory_reserved"):
        try:
            out["torch_" + name] = int(getattr(torch.cuda, name)())
        except Exception as e:  # pluggable allocators without stand-ins raise
            out["torch_" + name] = "error: %s" % e
    if ct is not None:
        try:
            s = ct.stats(0)
            out["cualloc"] = {k: s[k] for k in ("allocated_peak", "reserved_peak", "num_allocs", "num_frees",
                                                "num_maps", "num_unmaps", "num_alloc_retries", "num_ooms",
                                                "num_syncs")}
        except Exception as e:
            out["cualloc"] = "error: %s" % e
    return out


def run_train(a):
    t_start = time.time()
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    sampler = Sampler(torch, a.sample_ms / 1000.0)  # baseline: context made, nothing allocated
    sampler.start()
    model, opt = build_model(torch, a)
    gen = torch.Generator().manual_seed(a.seed + 1)
    seqs = seq_lengths(a)
    losses, times = [], []
    for L in seqs:
        tokens = torch.randint(0, VOCAB, (a.batch, L), generator=gen).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step(torch, model, opt, tokens))
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    mem = sampler.finish()
    rec = {"steps": a.steps, "batch": a.batch, "seed": a.seed, "seq_lengths": seqs, "losses": losses,
           "step_ms": [round(t, 3) for t in times], "median_step_ms": statistics.median(times[a.warmup:]),
           "deterministic": not a.no_deterministic, "wall_s": round(time.time() - t_start, 2),
           "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "device_name": torch.cuda.get_device_name(0)}
    rec.update(mem)
    rec.update(alloc_stats(torch, ct))
    emit(a, rec)


def run_oom(a):
    t_start = time.time()
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    cap = int(a.oom_cap_gb * GiB)
    _, total = torch.cuda.mem_get_info()
    how = "CUALLOC_CONF=%s" % os.environ.get("CUALLOC_CONF")
    if a.mode not in CUALLOC_MODES:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
        how = "set_per_process_memory_fraction(%.4f)" % (cap / total)
    model, opt = build_model(torch, a)
    gen = torch.Generator().manual_seed(a.seed + 1)
    rec = {"cap_bytes": cap, "cap_how": how, "oom_batch": a.oom_batch, "oom_seq": a.oom_seq}
    try:
        for _ in range(2):
            step(torch, model, opt, torch.randint(0, VOCAB, (a.batch, 512), generator=gen).cuda())
        rec["trained_under_cap"] = True
    except Exception as e:
        rec["trained_under_cap"] = False
        rec["train_error"] = "%s: %s" % (type(e).__name__, str(e)[:2000])
    raised = None
    try:
        step(torch, model, opt, torch.randint(0, VOCAB, (a.oom_batch, a.oom_seq), generator=gen).cuda())
    except Exception as e:  # what the user's code would see
        raised = e
    rec["raised"] = raised is not None
    if raised is not None:
        oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
        rec.update(exception_type="%s.%s" % (type(raised).__module__, type(raised).__name__),
                   is_runtime_error=isinstance(raised, RuntimeError),
                   is_out_of_memory_error=bool(oom_type) and isinstance(raised, oom_type),
                   message=str(raised)[:4000])
    raised = None
    opt.zero_grad(set_to_none=True)
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    try:
        step(torch, model, opt, torch.randint(0, VOCAB, (2, 256), generator=gen).cuda())
        rec["recovered"] = True
    except Exception as e:
        rec["recovered"] = False
        rec["recover_error"] = "%s: %s" % (type(e).__name__, str(e)[:2000])
    rec["pass"] = bool(rec["raised"] and rec.get("is_runtime_error") and rec["recovered"]
                       and rec["trained_under_cap"])
    rec["wall_s"] = round(time.time() - t_start, 2)
    rec.update(alloc_stats(torch, ct))
    emit(a, rec)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    problems = validate(a)
    if a.dry_run:
        p = plan(a)
        print("torch_train: dry run, mode %s, phase %s" % (a.mode, a.phase))
        for k, v in p.items():
            print("  %-12s %s" % (k, v))
        emit(a, {"dry_run": True, "valid": not problems, "problems": problems, "plan": p})
        for msg in problems:
            print("torch_train: invalid: " + msg, file=sys.stderr)
        return 1 if problems else 0
    if problems:
        for msg in problems:
            print("torch_train: invalid: " + msg, file=sys.stderr)
        return 2
    (run_train if a.phase == "train" else run_oom)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
