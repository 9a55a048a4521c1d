#!/usr/bin/env python3
"""torch_train.py — GPT-2 training under one allocator mode (bench/gpu/run.sh torch, torch-medium,
torch-alloc-cost, torch-capacity, torch-capacity-medium, torch-step-controls).

One mode per process (run.sh starts a fresh process for each, with the mode's environment):

  default                  PyTorch's caching allocator
  expandable               PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cualloc-enable           cualloc_torch.enable() (pluggable allocator) before any CUDA tensor
  cualloc-preload-nocache  LD_PRELOAD=libcualloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1
  cualloc-preload-cache    LD_PRELOAD=libcualloc.so beneath PyTorch's default cache

Models (--model): GPT2LMHeadModel(GPT2Config(...)) from transformers, random init after
torch.manual_seed(seed), n_positions 1024, vocabulary 50257:
  small   12 layers, 768 wide, 12 heads (GPT-2 small, 124 M parameters)
  medium  24 layers, 1024 wide, 16 heads (GPT-2 medium, 355 M parameters)

Phase `train`: synthetic tokens from a seeded generator, AdamW, bf16 autocast, batch 8, sequence
lengths drawn from [128, 1024] with random.Random(seed) — the same in every mode. Records every
step's loss (to compare modes), the median step time after the warm-up steps, and the peak device
memory in use, measured the same way in every mode: a sampler thread reads the device's used
memory every few ms — from NVML (libnvidia-ml.so.1 through ctypes) where it loads, else from
torch.cuda.mem_get_info() — and peak = max(used) - used before the job (after the context exists).
With --sample-ms 0 there is no sampler thread: the used memory is read after each step, outside
its timing. Every mode's allocator caches what it frees, so what it holds after a step is what it
held at the step's peak unless it gave memory back within the step: PyTorch on an allocation
failure (emptying its cache and retrying), cualloc likewise and above garbage_collection_threshold
(off unless set); with 80 GiB and no cap, the train phase meets neither.
Each step's time is split where its work has been issued (the loss not yet read): `issue_ms`, the
host's time to launch the step, and `issue_cpu_ms`, the main thread's CPU time in that part. A step
whose issue time is its step time and its CPU time is host-bound; issue time well above its CPU time
is the main thread waiting (for the GIL, a full launch queue, a lock).
NVML is preferred because under LD_PRELOAD cualloc answers cudaMemGetInfo (and so mem_get_info)
with the driver's free memory plus its own cached free memory; both figures are recorded.

Phase `oom`: under a cap (CUALLOC_CONF=max_memory_mb:... for the cualloc modes, set by run.sh;
torch.cuda.set_per_process_memory_fraction for the PyTorch modes) two normal steps must train and
a too-large batch must raise a Python exception (RuntimeError / torch.OutOfMemoryError), whose type
and text are recorded; then one small step must train again (recovery).

Phase `snapshot` (default and expandable only): torch.cuda.memory._record_memory_history(
max_entries=N) from before the model exists, a few training steps, _dump_snapshot into the results
folder (snapshot-MODEL-MODE.pickle), shrunk below --snapshot-max-mb when larger (stack frames cut,
then the oldest events dropped, as PyTorch's own ring buffer does) so it can be kept as a replay
corpus for `allocview import`.

Phase `allocpair`: PyTorch's own host cost per cached allocation + free: a loop of
torch.empty(n, device='cuda') / del over a tensor-size mix after a warm-up, ns per pair (median of
--reps), beside the same loop without the allocation, a burst (twice the mix alive at once, freed
newest first) and torch.cuda.caching_allocator_alloc/_delete. No deterministic mode here: it would
launch a fill kernel per tensor.

Phase `capacity`: the most tokens per step (batch x sequence) that train without OOM within a fixed
memory budget. It never imports torch: it runs bisection probes, each a fresh process (phase
`probe`, same environment) that first takes (free - budget) bytes of device memory as ballast —
physical memory from the driver's cuMemCreate through ctypes, before torch or cualloc exist, which
no allocator sees or can give back, so the budget is enforced the same way under all five — then
trains --probe-steps steps at one (batch, seq). Stage 1 finds the largest batch that trains at
sequence --seq (1024) by galloping from a guess (the previous mode's answer in --out, else a
per-model guess) and bisecting; stage 2 fixes batch = that + 1 and bisects the sequence length in
--seq-step steps. Reported: the largest tokens/step that passed and the smallest that failed, over
every probe. --max-probes and --time-s bound the work.

--dry-run validates the arguments and the environment against the mode and prints the plan
without importing torch (run.sh --mock). In phase capacity it runs the whole bisection with probes
that are dry runs too: a probe "passes" when batch x seq <= --mock-tokens (a made-up figure per
model and mode), so the search, the subprocess path and the records are exercised without a GPU.
Results: one JSON object per line appended to --out.
"""

import argparse
import ctypes
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import threading
import time

MODES = ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]
CUALLOC_MODES = {"cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"}
PRELOAD_MODES = {"cualloc-preload-nocache", "cualloc-preload-cache"}
PHASES = ["train", "oom", "snapshot", "allocpair", "capacity", "probe"]
SNAPSHOT_MODES = {"default", "expandable"}  # a pluggable allocator records no PyTorch snapshot
VOCAB = 50257
N_POSITIONS = 1024
GiB = 1 << 30
MiB = 1 << 20

# GPT2Config shapes. `budget_gb` is the capacity part's memory budget, small enough that a probe's
# steps are short, and `guess_batch` the batch at sequence 1024 its first probe tries: an estimate
# from GPT-2 small fitting batch 9 at sequence 1024 in 16 GiB under the default allocator on an H100
# (about 1.4 GiB per 1024 tokens for small; medium is twice as deep and a third wider); a wrong guess
# costs a probe or two, not a wrong answer.
MODELS = {
    "small": {"config": dict(n_layer=12, n_embd=768, n_head=12), "budget_gb": 24.0, "guess_batch": 14},
    "medium": {"config": dict(n_layer=24, n_embd=1024, n_head=16), "budget_gb": 40.0, "guess_batch": 10},
}

# --dry-run probes pass when batch x seq <= these (made up, not measurements): different per mode so
# that the mock summary shows both "met" and "not met". With --varlen the figure is scaled by
# MOCK_VARLEN (made up too: PyTorch's cache losing more to mixed shapes).
MOCK_TOKENS = {
    "small": {"default": 14900, "expandable": 16100, "cualloc-enable": 17300, "cualloc-preload-nocache": 16600,
              "cualloc-preload-cache": 15200},
    "medium": {"default": 9900, "expandable": 10800, "cualloc-enable": 11100, "cualloc-preload-nocache": 10900,
               "cualloc-preload-cache": 10000},
}
MOCK_VARLEN = {"default": 0.8, "expandable": 0.97, "cualloc-enable": 1.0, "cualloc-preload-nocache": 0.98,
               "cualloc-preload-cache": 0.8}

# The tensor sizes of the allocpair loop, in bytes: 512 B (PyTorch's smallest block) to 12 MiB, GPT-2
# small's own shapes where they fit (768 x 4 B bias, 768 x 768 x 2 B, 768 x 3072 x 2 B).
ALLOC_SIZES = [512, 3072, 12288, 65536, 786432, 1179648, 4718592, 12582912]

# Exit statuses of a probe process (phase probe), read by phase capacity. Those four mean the probe
# wrote its own record; anything else (a crash, a timeout) is recorded by the capacity process.
RC_PASS, RC_OOM, RC_NO_BUDGET, RC_ERROR = 0, 3, 4, 5


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--phase", default="train", choices=PHASES)
    p.add_argument("--model", default="small", choices=sorted(MODELS))
    p.add_argument("--part", default="torch", help="the run.sh part named in every record")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median step time")
    p.add_argument("--batch", type=int, default=8, help="batch of phases train and snapshot, and of a probe")
    p.add_argument("--seq-min", type=int, default=128)
    p.add_argument("--seq-max", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round", type=int, default=1,
                   help="which of run.sh's --repeat rounds this process is (recorded, nothing else)")
    p.add_argument("--sample-ms", type=float, default=2.0,
                   help="memory sampler period; 0: no sampler thread, the memory read after each step instead")
    p.add_argument("--label", default=None, help="a name for this run's configuration, recorded (run.sh's controls)")
    p.add_argument("--oom-cap-gb", type=float, default=16.0)
    p.add_argument("--oom-batch", type=int, default=48, help="batch that must not fit under the cap")
    p.add_argument("--oom-seq", type=int, default=1024)
    p.add_argument("--snapshot-steps", type=int, default=4, help="training steps recorded in the snapshot")
    p.add_argument("--snapshot-entries", type=int, default=20000, help="max_entries of _record_memory_history")
    p.add_argument("--snapshot-max-mb", type=float, default=5.0, help="shrink a larger snapshot below this")
    p.add_argument("--snapshot-dir", default=None, help="where snapshots go (default: the folder of --out)")
    p.add_argument("--pairs", type=int, default=10000, help="allocpair: passes over the size mix per repetition")
    p.add_argument("--reps", type=int, default=5, help="allocpair: timed repetitions (the median is reported)")
    p.add_argument("--budget-gb", type=float, default=None,
                   help="capacity/probe: device memory left to the job (default: 24 small, 40 medium)")
    p.add_argument("--seq", type=int, default=1024, help="capacity: stage-1 sequence length; probe: its length")
    p.add_argument("--seq-step", type=int, default=8, help="capacity: stage-2 sequence length granularity")
    p.add_argument("--guess-batch", type=int, default=0,
                   help="capacity: first batch tried (0: the previous mode's answer in --out, else per model)")
    p.add_argument("--max-batch", type=int, default=1024, help="capacity: stop growing the batch here")
    p.add_argument("--probe-steps", type=int, default=3, help="training steps per probe")
    p.add_argument("--varlen", action="store_true",
                   help="capacity/probe: a probe's steps have sequence lengths drawn from --seq-min to the "
                        "probe's --seq (the first and last at --seq), as training's do; tokens per step count "
                        "the longest")
    p.add_argument("--probe-timeout-s", type=float, default=120.0)
    p.add_argument("--max-probes", type=int, default=12, help="capacity: probes per mode at most")
    p.add_argument("--time-s", type=float, default=500.0, help="capacity: start no probe after this many seconds")
    p.add_argument("--mock-tokens", type=int, default=0,
                   help="dry-run probes pass when batch x seq <= this (default: a made-up figure per mode)")
    p.add_argument("--no-deterministic", action="store_true",
                   help="do not call torch.use_deterministic_algorithms(True, warn_only=True)")
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(here)))
    p.add_argument("--build", default=None, help="meson build folder (default REPO/build)")
    p.add_argument("--out", default=None, help="JSON lines file to append to (default: stdout only)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; no torch")
    a = p.parse_args(argv)
    a.build = a.build or os.path.join(a.repo, "build")
    if a.budget_gb is None:
        a.budget_gb = MODELS[a.model]["budget_gb"]
    if not a.mock_tokens:
        a.mock_tokens = int(MOCK_TOKENS[a.model][a.mode] * (MOCK_VARLEN[a.mode] if a.varlen else 1.0))
    return a


def seq_lengths(a):
    rng = random.Random(a.seed)
    return [rng.randint(a.seq_min, a.seq_max) for _ in range(a.steps)]


def probe_lengths(a):
    """The sequence length of each of a probe's steps: --seq throughout; with --varlen, the first and
    the last at --seq and those between drawn from --seq-min to --seq, so that the longest batch
    comes again after shorter ones have left the cache holding blocks of their shapes (where
    PyTorch's default allocator fragments)."""
    if not a.varlen or a.probe_steps < 3:
        return [a.seq] * a.probe_steps
    rng = random.Random(a.seed + 2)
    lo = min(a.seq_min, a.seq)
    return [a.seq] + [rng.randint(lo, a.seq) for _ in range(a.probe_steps - 2)] + [a.seq]


def validate(a):
    """Returns a list of problems with the arguments and the environment for this mode."""
    bad = []
    if a.phase == "train" and a.steps <= a.warmup:
        bad.append("--steps (%d) must exceed --warmup (%d)" % (a.steps, a.warmup))
    if a.batch < 1 or a.oom_batch < 1:
        bad.append("batch sizes must be positive")
    if not 1 <= a.seq_min <= a.seq_max <= N_POSITIONS:
        bad.append("need 1 <= --seq-min <= --seq-max <= %d (GPT-2's n_positions)" % N_POSITIONS)
    if a.oom_cap_gb <= 0:
        bad.append("--oom-cap-gb must be positive")
    if a.sample_ms < 0 or (a.sample_ms == 0 and a.phase != "train"):
        bad.append("--sample-ms must be positive (0, no sampler thread, in phase train only)")
    if a.phase == "snapshot":
        if a.mode not in SNAPSHOT_MODES:
            bad.append("phase snapshot records PyTorch's own allocator: mode default or expandable only")
        if not 1 <= a.snapshot_steps <= a.steps or a.snapshot_entries < 1 or a.snapshot_max_mb <= 0:
            bad.append("need 1 <= --snapshot-steps <= --steps, --snapshot-entries >= 1, --snapshot-max-mb > 0")
    if a.phase == "allocpair" and (a.pairs < 10 or a.reps < 1):
        bad.append("need --pairs >= 10 and --reps >= 1")
    if a.phase in ("capacity", "probe"):
        if a.budget_gb <= 0:
            bad.append("--budget-gb must be positive")
        if a.varlen and a.probe_steps < 3:
            bad.append("--varlen needs --probe-steps >= 3 (the longest batch first, shorter ones, the longest again)")
        if not 1 <= a.seq <= N_POSITIONS or a.seq_step < 1 or a.probe_steps < 1 or a.max_probes < 1:
            bad.append("need 1 <= --seq <= %d, --seq-step >= 1, --probe-steps >= 1, --max-probes >= 1"
                       % N_POSITIONS)
        # The budget must be the ballast and nothing else, the same for every mode.
        conf = os.environ.get("CUALLOC_CONF", "")
        if "max_memory_mb:" in conf or "per_process_memory_fraction:" in conf:
            bad.append("phase %s enforces the budget with a ballast allocation: CUALLOC_CONF must not cap "
                       "memory (CUALLOC_CONF=%r)" % (a.phase, conf))
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
    # PyTorch's recent versions also read their allocator settings from PYTORCH_ALLOC_CONF (some
    # before PYTORCH_CUDA_ALLOC_CONF, some after it): set, it would configure every mode alike.
    if "PYTORCH_ALLOC_CONF" in env:
        bad.append("PYTORCH_ALLOC_CONF must not be set: PyTorch reads it as well as PYTORCH_CUDA_ALLOC_CONF "
                   "(PYTORCH_ALLOC_CONF=%r)" % env["PYTORCH_ALLOC_CONF"])
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
    record = dict({"part": a.part, "model": a.model, "mode": a.mode, "phase": a.phase, "round": a.round}, **record)
    if a.label:
        record["label"] = a.label
    line = json.dumps(record, sort_keys=False)
    print("torch_train: RESULT " + (line if len(line) < 600 else line[:600] + "..."))
    sys.stdout.flush()
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def model_text(a):
    c = MODELS[a.model]["config"]
    return ("GPT2LMHeadModel(GPT2Config(n_layer=%d, n_embd=%d, n_head=%d)) (%s), random init, seed %d"
            % (c["n_layer"], c["n_embd"], c["n_head"], a.model, a.seed))


def plan(a):
    p = {
        "model": model_text(a),
        "optimizer": "AdamW lr 1e-4", "autocast": "bfloat16",
        "deterministic": not a.no_deterministic and a.phase != "allocpair",
        "env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                                                "PYTORCH_CUDA_ALLOC_CONF", "CUALLOC_CONF")},
    }
    if a.phase in ("train", "oom"):
        p.update(batch=a.batch, steps=a.steps, warmup=a.warmup, seq_lengths=seq_lengths(a),
                 memory=("sampler every %.1f ms" % a.sample_ms if a.sample_ms else "read after each step")
                 + ": NVML used (else mem_get_info); peak - baseline")
    if a.label:
        p["label"] = a.label
    if a.phase == "oom":
        p["oom"] = ("cap %.1f GiB (%s), 2 steps at batch %d seq 512, then batch %d seq %d must raise; then batch 2 "
                    "seq 256 must train" % (a.oom_cap_gb, "CUALLOC_CONF max_memory_mb" if a.mode in CUALLOC_MODES
                                            else "set_per_process_memory_fraction", a.batch, a.oom_batch, a.oom_seq))
    if a.phase == "snapshot":
        p["snapshot"] = ("_record_memory_history(max_entries=%d, stacks='python'), %d steps at batch %d, seq %s; "
                         "_dump_snapshot to %s, shrunk below %.1f MB"
                         % (a.snapshot_entries, a.snapshot_steps, a.batch, seq_lengths(a)[:a.snapshot_steps],
                            snapshot_path(a), a.snapshot_max_mb))
    if a.phase == "allocpair":
        p["allocpair"] = ("torch.empty(n, uint8, cuda) + del over sizes %s, %d passes x %d reps after a warm-up; "
                          "bare loop, burst of 2 x the mix, caching_allocator_alloc/_delete"
                          % (ALLOC_SIZES, a.pairs, a.reps))
    if a.phase == "capacity":
        p["capacity"] = ("budget %.1f GiB (ballast: cuMemCreate of free - budget before torch), probes of %d steps%s, "
                         "each a fresh process (at most %d, %.0f s, %.0f s each); stage 1 batch at seq %d from "
                         "guess %s, stage 2 seq in steps of %d at the first failing batch"
                         % (a.budget_gb, a.probe_steps,
                            " (lengths from %d to the probe's, the first and last at its)" % a.seq_min if a.varlen
                            else "", a.max_probes, a.time_s, a.probe_timeout_s, a.seq,
                            a.guess_batch or "from --out or per model", a.seq_step))
        if a.dry_run:
            p["mock"] = "dry-run probes pass when batch x seq <= %d (made up)" % a.mock_tokens
    return p


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

    # With NVML, mem_get_info only every MGI_EVERY-th sample: under LD_PRELOAD it is cualloc's
    # cudaMemGetInfo, which takes the heap's lock, so polling it every few ms would cost the
    # preload modes more than the others. (NVML goes through ctypes, which lets go of the GIL.)
    MGI_EVERY = 10

    def sample(self, mgi=None):
        if mgi is None:
            mgi = not self.nvml or self.samples % self.MGI_EVERY == 0
        if mgi:
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
        if self.is_alive():
            self.join()
        self.sample(mgi=True)
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
# The memory budget of a probe: a ballast taken from the driver before torch exists.

class _CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _CUmemAllocationProp(ctypes.Structure):
    """CUmemAllocationProp (cuda.h; also src/cuda_decls.h), 32 bytes."""
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _CUmemAllocFlags)]


class BudgetError(Exception):
    pass


class Ballast:
    """Takes (free - budget) bytes of device 0 so that `budget` bytes stay free for the job.

    Physical memory from cuMemCreate, never mapped: cuMemCreate is not one of the entry points
    cualloc interposes (cudaMalloc, cuMemAlloc, ... — under LD_PRELOAD a cuMemAlloc through ctypes
    would reach cualloc's heap), PyTorch never sees it, and nobody can give it back under pressure,
    so the same budget holds under every allocator. Made in the primary context, which the CUDA
    runtime (and so torch and cualloc) then uses: the context's own memory is outside the budget.
    Kept until the process exits."""

    CHUNK = GiB  # a multiple of every granularity seen (2 MiB)

    def __init__(self, budget, lib="libcuda.so.1", wait_s=20.0, slack=256 * MiB):
        cu = ctypes.CDLL(lib)
        self.cu = cu
        cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        cu.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(ctypes.c_size_t),
                                                     ctypes.POINTER(_CUmemAllocationProp), ctypes.c_int]
        cu.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t,
                                   ctypes.POINTER(_CUmemAllocationProp), ctypes.c_ulonglong]
        self._check(cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self._check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        prop = _CUmemAllocationProp()
        prop.type = 1           # CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev.value
        gran = ctypes.c_size_t()
        self._check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
                    "cuMemGetAllocationGranularity")
        # The previous probe's memory may still be on its way back to the driver: wait until at
        # least the budget is free and two readings 0.2 s apart agree (a ballast sized while memory
        # was still coming back would leave this probe more than the budget).
        free, total = self.mem_info()
        prev = None
        t_end = time.time() + wait_s
        while (free < budget or free != prev) and time.time() < t_end:
            prev = free
            time.sleep(0.2)
            free, total = self.mem_info()
        self.budget, self.total, self.free_before, self.granularity = budget, total, free, gran.value
        if free < budget:
            raise BudgetError("only %.2f GiB free of %.2f GiB after the context: less than the budget of %.2f GiB"
                              % (free / GiB, total / GiB, budget / GiB))
        self.handles, self.bytes = [], 0
        want = (free - budget) // gran.value * gran.value
        chunk = self.CHUNK
        while want >= gran.value:
            n = min(chunk, want)
            h = ctypes.c_ulonglong()
            r = cu.cuMemCreate(ctypes.byref(h), n, ctypes.byref(prop), 0)
            if r == 0:
                self.handles.append(h)
                self.bytes += n
                want -= n
            elif chunk > gran.value:  # what is left may only come in smaller pieces
                chunk = max(gran.value, chunk // 2 // gran.value * gran.value)
            else:
                break
        self.free_after, _ = self.mem_info()
        if self.free_after > budget + slack:
            raise BudgetError("the ballast took %.2f GiB; %.2f GiB are still free, more than the budget of %.2f GiB"
                              % (self.bytes / GiB, self.free_after / GiB, budget / GiB))

    @staticmethod
    def _check(r, what):
        if r != 0:
            raise OSError("%s failed: CUresult %d" % (what, r))

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
        return free.value, total.value

    def info(self):
        return {"budget_bytes": self.budget, "device_total_bytes": self.total, "free_before_ballast": self.free_before,
                "ballast_bytes": self.bytes, "ballast_handles": len(self.handles), "free_after_ballast": self.free_after}


# ---------------------------------------------------------------------------------------------
# The job.

def setup(a):
    """Imports torch (after cualloc_torch.enable() in that mode) and returns (torch, cualloc_torch|None)."""
    deterministic = not a.no_deterministic and a.phase != "allocpair"
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    ct = None
    if a.mode == "cualloc-enable":
        sys.path.insert(0, os.path.join(a.repo, "tools"))
        import cualloc_torch as ct  # noqa: E402
        # step marks: a traced run (the forced OOM's) is cut into steps; untraced, a mark is a no-op
        ct.enable(os.path.join(a.build, "src", "libcualloc_torch.so"), step_marks=True)
    elif a.mode in PRELOAD_MODES:
        sys.path.insert(0, os.path.join(a.repo, "tools"))
        import cualloc_torch as ct  # noqa: E402 (statistics only: the preloaded copy)
        ct.load(os.path.join(a.build, "src", "libcualloc.so"))
    import torch  # noqa: E402
    if not torch.cuda.is_available():
        raise SystemExit("torch_train: no CUDA device")
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    return torch, ct


def build_model(torch, a, on_device=False):
    """The model and its optimizer. on_device: initialize the weights on the GPU (a probe's start-up
    time; the values differ from the CPU initialization, the shapes do not)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_positions=N_POSITIONS, vocab_size=VOCAB, **MODELS[a.model]["config"])
    if on_device:
        with torch.device("cuda"):
            model = GPT2LMHeadModel(cfg)
    else:
        model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def step_issue(torch, model, opt, tokens):
    """Launches one training step; returns its loss, not yet read (no synchronization)."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss


def step(torch, model, opt, tokens):
    return float(step_issue(torch, model, opt, tokens).item())


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


def versions(torch, model=None):
    out = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "device_name": torch.cuda.get_device_name(0)}
    if model is not None:
        out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    return out


def run_train(a):
    t_start = time.time()
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    sampler = Sampler(torch, a.sample_ms / 1000.0)  # baseline: context made, nothing allocated
    if a.sample_ms:
        sampler.start()
    model, opt = build_model(torch, a)
    gen = torch.Generator().manual_seed(a.seed + 1)
    seqs = seq_lengths(a)
    losses, times, issue, issue_cpu = [], [], [], []
    for L in seqs:
        tokens = torch.randint(0, VOCAB, (a.batch, L), generator=gen).cuda()
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = step_issue(torch, model, opt, tokens)
        t1, c1 = time.perf_counter(), time.thread_time()
        losses.append(float(loss.item()))
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        issue.append((t1 - t0) * 1e3)
        issue_cpu.append((c1 - c0) * 1e3)
        if not a.sample_ms:
            sampler.sample(mgi=True)
    mem = sampler.finish()
    rec = {"steps": a.steps, "batch": a.batch, "seed": a.seed, "seq_lengths": seqs, "losses": losses,
           "step_ms": [round(t, 3) for t in times], "median_step_ms": statistics.median(times[a.warmup:]),
           "issue_ms": [round(t, 3) for t in issue], "median_issue_ms": statistics.median(issue[a.warmup:]),
           "issue_cpu_ms": [round(t, 3) for t in issue_cpu],
           "median_issue_cpu_ms": statistics.median(issue_cpu[a.warmup:]), "sample_ms": a.sample_ms,
           "deterministic": not a.no_deterministic, "wall_s": round(time.time() - t_start, 2)}
    rec.update(versions(torch, model))
    rec.update(mem)
    rec.update(alloc_stats(torch, ct))
    emit(a, rec)
    return 0


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
        rec.update(exception_type="%s.%s" % (type(raised).__module__, type(raised).__name__),
                   is_runtime_error=isinstance(raised, RuntimeError),
                   is_out_of_memory_error=is_oom_type(torch, raised),
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
    return 0 if rec["pass"] else 1  # run.sh then marks the part failed, not only the summary's row


def is_oom_type(torch, e):
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return bool(oom_type) and isinstance(e, oom_type)


def is_memory_error(torch, e):
    """An exception that means "not enough device memory", whichever allocator ran out: PyTorch's
    OutOfMemoryError, cualloc's RuntimeError ("CUDA out of memory ..."), a CUDA error 2 raised
    elsewhere, or a library (cuBLAS) that could not get its workspace. cuBLAS reports a handle it
    could not create for want of memory as NOT_INITIALIZED ("CUBLAS_STATUS_NOT_INITIALIZED when
    calling `cublasCreate(handle)`"); the process got that far, so the driver itself works."""
    text = str(e)
    if is_oom_type(torch, e) or "out of memory" in text.lower() or "ALLOC_FAILED" in text:
        return True
    return "NOT_INITIALIZED" in text and ("cublasCreate" in text or "cublasLtCreate" in text)


# ---------------------------------------------------------------------------------------------
# Snapshots of PyTorch's own allocator.

def snapshot_path(a):
    folder = a.snapshot_dir or (os.path.dirname(os.path.abspath(a.out)) if a.out else ".")
    return os.path.join(folder, "snapshot-%s-%s.pickle" % (a.model, a.mode))


def _cut_frames(snap, keep):
    """Keeps the first `keep` (innermost) stack frames of every event, block and segment."""
    def cut(d):
        if isinstance(d.get("frames"), list):
            d["frames"] = d["frames"][:keep]
    for trace in snap.get("device_traces") or []:
        for e in trace:
            cut(e)
    for seg in snap.get("segments") or []:
        cut(seg)
        for b in seg.get("blocks") or []:
            cut(b)


def shrink_snapshot(snap, limit):
    """Returns (pickled bytes no larger than `limit` where it can, how). First fewer stack frames per
    entry; then the oldest events of each device's trace are dropped, half at a time — what PyTorch's
    ring buffer (max_entries) does anyway, and allocview import reconstructs the state at the start
    of the trace from the segments."""
    data = pickle.dumps(snap)
    if len(data) <= limit:
        return data, "as dumped"
    for keep in (8, 3, 1, 0):
        _cut_frames(snap, keep)
        data = pickle.dumps(snap)
        if len(data) <= limit:
            return data, "stack frames cut to %d per entry" % keep
    traces = snap.get("device_traces") or []
    while len(data) > limit and any(len(t) > 1 for t in traces):
        for i, t in enumerate(traces):
            traces[i] = t[len(t) // 2:]
        data = pickle.dumps(snap)
    return data, "stack frames cut to 0, oldest events dropped (%d kept)" % sum(len(t) for t in traces)


def fake_snapshot(entries, frames):
    """A snapshot-shaped dict (the keys allocview import reads), to test shrink_snapshot without torch."""
    trace = [{"action": "alloc" if i % 2 == 0 else "free_completed", "addr": 1 << 40 | (i // 2) * 512,
              "size": 512 * (1 + i % 7), "stream": 0, "time_us": i,
              "frames": [{"filename": "/x/model_%d.py" % f, "line": i % 977, "name": "forward_%d" % f}
                         for f in range(frames)]}
             for i in range(entries)]
    return {"segments": [{"device": 0, "address": 1 << 40, "total_size": 20 << 20, "stream": 0,
                          "segment_type": "large", "allocated_size": 0, "active_size": 0, "requested_size": 0,
                          "blocks": [{"address": 1 << 40, "size": 20 << 20, "requested_size": 0, "state": "inactive",
                                      "frames": []}]}],
            "device_traces": [trace], "allocator_settings": {"expandable_segments": False}}


def run_snapshot(a):
    t_start = time.time()
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    mem = torch.cuda.memory
    try:
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=a.snapshot_entries)
    except TypeError:  # PyTorch 2.0's signature, kept as _record_memory_history_legacy since: no max_entries
        mem._record_memory_history(True, trace_alloc_max_entries=a.snapshot_entries, trace_alloc_record_context=True)
    model, opt = build_model(torch, a)
    gen = torch.Generator().manual_seed(a.seed + 1)
    seqs = seq_lengths(a)[:a.snapshot_steps]
    losses = [step(torch, model, opt, torch.randint(0, VOCAB, (a.batch, L), generator=gen).cuda()) for L in seqs]
    torch.cuda.synchronize()
    path = snapshot_path(a)
    mem._dump_snapshot(path)
    mem._record_memory_history(enabled=None)
    dumped = os.path.getsize(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    data, how = shrink_snapshot(snap, int(a.snapshot_max_mb * 1e6))
    if how != "as dumped":
        with open(path, "wb") as f:
            f.write(data)
    rec = {"op": "snapshot", "file": os.path.basename(path), "bytes": os.path.getsize(path),
           "bytes_as_dumped": dumped, "shrunk": how, "max_entries": a.snapshot_entries, "steps": len(seqs),
           "batch": a.batch, "seq_lengths": seqs, "losses": losses,
           "trace_entries": sum(len(t) for t in snap.get("device_traces") or []),
           "segments": len(snap.get("segments") or []), "wall_s": round(time.time() - t_start, 2)}
    rec.update(versions(torch, model))
    emit(a, rec)
    return 0


# ---------------------------------------------------------------------------------------------
# PyTorch's host cost per cached alloc + free.

def run_allocpair(a):
    t_start = time.time()
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    u8 = torch.uint8
    empty = torch.empty
    sizes = ALLOC_SIZES
    n = a.pairs

    def pairs():  # allocate, free at once: every request is served from the cache
        t0 = time.perf_counter_ns()
        for _ in range(n):
            for s in sizes:
                x = empty(s, dtype=u8, device=dev)
                del x
        return (time.perf_counter_ns() - t0) / (n * len(sizes))

    def bare():  # the same loop without the allocation: what the Python around it costs
        t0 = time.perf_counter_ns()
        for _ in range(n):
            for s in sizes:
                x = s
                del x
        return (time.perf_counter_ns() - t0) / (n * len(sizes))

    mix = sizes + sizes
    m = max(1, n // 2)

    def burst():  # twice the mix alive at once, freed newest first
        t0 = time.perf_counter_ns()
        for _ in range(m):
            xs = [empty(s, dtype=u8, device=dev) for s in mix]
            while xs:
                xs.pop()
        return (time.perf_counter_ns() - t0) / (m * len(mix))

    def raw():  # PyTorch's raw allocator entry points, no tensor around the memory
        alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
        t0 = time.perf_counter_ns()
        for _ in range(n):
            for s in sizes:
                delete(alloc(s, 0))
        return (time.perf_counter_ns() - t0) / (n * len(sizes))

    rec = {"op": "allocpair", "sizes": sizes, "pairs_per_rep": n * len(sizes), "reps": a.reps}
    empty(1, dtype=u8, device=dev)  # the context and the allocator exist before any timing
    torch.cuda.synchronize()
    for name, fn in (("pair", pairs), ("bare_loop", bare), ("burst", burst), ("raw", raw)):
        try:
            fn()  # warm-up: every size is in the cache afterwards
            runs = [fn() for _ in range(a.reps)]
            rec[name + "_ns"] = round(statistics.median(runs), 1)
            rec[name + "_ns_reps"] = [round(r, 1) for r in runs]
        except Exception as e:  # e.g. caching_allocator_alloc under a pluggable allocator
            rec[name + "_ns"] = None
            rec[name + "_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    if rec.get("pair_ns") is not None and rec.get("bare_loop_ns") is not None:
        rec["pair_ns_net"] = round(rec["pair_ns"] - rec["bare_loop_ns"], 1)
    rec["wall_s"] = round(time.time() - t_start, 2)
    rec.update(versions(torch))
    rec.update(alloc_stats(torch, ct))
    emit(a, rec)
    return 0


# ---------------------------------------------------------------------------------------------
# The most tokens per step within a memory budget.

def run_probe(a):
    """One bisection probe: ballast, then --probe-steps steps at (--batch, --seq). Exit status
    RC_PASS, RC_OOM, RC_NO_BUDGET or RC_ERROR; the record is written in each case."""
    t_start = time.time()
    budget = int(a.budget_gb * GiB)
    lengths = probe_lengths(a)
    rec = {"op": "probe", "batch": a.batch, "seq": a.seq, "tokens": a.batch * a.seq, "budget_bytes": budget,
           "varlen": a.varlen, "lengths": lengths}
    if a.dry_run:  # the capacity search without a GPU (see --mock-tokens)
        # The ballast itself runs against the build's fake libcuda.so.1 (tests/fakecuda), whose
        # device (the sim, configured from CUALLOC_CONF at cuInit) is made 80 GiB like an H100's.
        fake = os.path.join(a.build, "tests", "fakecuda", "libcuda.so.1")
        if os.path.exists(fake):
            os.environ["CUALLOC_CONF"] = "sim_memory_mb:%d" % (80 * 1024)
            try:
                rec.update(Ballast(budget, lib=fake, wait_s=0).info(), ballast_checked="fake driver")
            except (BudgetError, OSError) as e:
                rec.update(outcome="no-budget", rc=RC_NO_BUDGET, error=str(e), dry_run=True)
                emit(a, rec)
                return RC_NO_BUDGET
        else:
            rec["ballast_checked"] = "no fake driver at %s" % fake
        ok = a.batch * a.seq <= a.mock_tokens
        rec.update(dry_run=True, valid=True, mock_tokens=a.mock_tokens, outcome="pass" if ok else "oom",
                   rc=RC_PASS if ok else RC_OOM)
        emit(a, rec)
        return rec["rc"]
    try:
        ballast = Ballast(budget)  # before torch, and before cualloc in the enable mode
    except (BudgetError, OSError) as e:
        rec.update(outcome="no-budget", rc=RC_NO_BUDGET, error=str(e))
        emit(a, rec)
        return RC_NO_BUDGET
    rec.update(ballast.info())
    torch, ct = setup(a)
    torch.cuda.set_device(0)
    try:
        model, opt = build_model(torch, a, on_device=True)
        gen = torch.Generator().manual_seed(a.seed + 1)
        losses = [step(torch, model, opt, torch.randint(0, VOCAB, (a.batch, n), generator=gen).cuda())
                  for n in lengths]
        torch.cuda.synchronize()
        rec.update(outcome="pass", rc=RC_PASS, losses=losses)
    except Exception as e:
        mem = is_memory_error(torch, e)
        rec.update(outcome="oom" if mem else "error", rc=RC_OOM if mem else RC_ERROR,
                   error="%s: %s" % (type(e).__name__, str(e)[:1500]))
    rec["wall_s"] = round(time.time() - t_start, 2)
    rec.update(alloc_stats(torch, ct))
    emit(a, rec)
    return rec["rc"]


class _Stop(Exception):
    """The capacity search stops early: probes or time spent, or the budget cannot be enforced."""


def previous_answer(a):
    """The largest batch at --seq found by an earlier mode in --out (same model, budget and seq), or 0."""
    if not a.out or not os.path.exists(a.out):
        return 0
    best = 0
    with open(a.out, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if (r.get("op") == "capacity" and r.get("model") == a.model and r.get("seq") == a.seq
                    and r.get("budget_bytes") == int(a.budget_gb * GiB) and bool(r.get("varlen")) == a.varlen
                    and r.get("batch_at_seq")):
                best = r["batch_at_seq"]
    return best


def probe_command(a, batch, seq):
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", a.mode, "--model", a.model, "--phase", "probe",
           "--part", a.part, "--batch", str(batch), "--seq", str(seq), "--budget-gb", repr(a.budget_gb),
           "--probe-steps", str(a.probe_steps), "--seed", str(a.seed), "--repo", a.repo, "--build", a.build]
    if a.out:
        cmd += ["--out", a.out]
    if a.no_deterministic:
        cmd.append("--no-deterministic")
    if a.varlen:
        cmd += ["--varlen", "--seq-min", str(a.seq_min)]
    if a.dry_run:
        cmd += ["--dry-run", "--mock-tokens", str(a.mock_tokens)]
    return cmd


def run_capacity(a):
    """The search; never imports torch (each probe must be the first to touch the device)."""
    t_start = time.time()
    deadline = t_start + a.time_s
    probes, durations = [], []

    def probe(batch, seq):
        """True when (batch, seq) trained; False when it ran out of memory (or failed otherwise)."""
        if len(probes) >= a.max_probes:
            raise _Stop("max probes (%d) reached" % a.max_probes)
        left = deadline - time.time()
        if left < max(5.0, 1.2 * max(durations, default=0.0)):
            raise _Stop("time budget (%.0f s) spent" % a.time_s)
        print("torch_train: probe %d: batch %d x seq %d = %d tokens" % (len(probes) + 1, batch, seq, batch * seq))
        sys.stdout.flush()
        t0 = time.time()
        # A probe stopped by the search's own deadline (not by --probe-timeout-s) says nothing about
        # memory: it is recorded as "cut", ends the search, and counts neither as pass nor as fail.
        cut = left < a.probe_timeout_s
        try:
            r = subprocess.run(probe_command(a, batch, seq), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=min(a.probe_timeout_s, left))
            rc, text = r.returncode, r.stdout
        except subprocess.TimeoutExpired as e:
            rc, text = 124, e.stdout or b""
        dt = time.time() - t0
        durations.append(dt)
        text = text.decode("utf-8", "replace")
        sys.stdout.write(text)  # the probe's own output goes to this mode's log
        outcome = {RC_PASS: "pass", RC_OOM: "oom", RC_NO_BUDGET: "no-budget", RC_ERROR: "error",
                   124: "cut" if cut else "timeout"}.get(rc, "crash")
        if rc not in (RC_PASS, RC_OOM, RC_NO_BUDGET, RC_ERROR):  # it wrote no record: write one for it
            emit(argparse.Namespace(**dict(vars(a), phase="probe")),
                 {"op": "probe", "batch": batch, "seq": seq, "tokens": batch * seq, "outcome": outcome, "rc": rc,
                  "wall_s": round(dt, 2), "log_tail": text[-1500:]})
        print("torch_train: probe %d: %s (rc %d, %.1f s)" % (len(probes) + 1, outcome, rc, dt))
        probes.append({"batch": batch, "seq": seq, "tokens": batch * seq, "outcome": outcome, "wall_s": round(dt, 2)})
        if rc == RC_NO_BUDGET:
            raise _Stop("the budget cannot be enforced (see the probe's record)")
        if outcome == "cut":
            raise _Stop("time budget (%.0f s) spent during a probe" % a.time_s)
        return outcome == "pass"

    guess = a.guess_batch or previous_answer(a) or max(1, round(MODELS[a.model]["guess_batch"] * a.budget_gb
                                                                / MODELS[a.model]["budget_gb"]))
    lo, hi, stopped = 0, None, None  # lo: largest batch known to train at --seq; hi: smallest known to fail
    try:
        # Stage 1: the batch at --seq. Gallop from the guess (1, 2, 4, ... away) to a bracket, then bisect.
        if probe(guess, a.seq):
            lo, d = guess, 1
            while hi is None and lo + d <= a.max_batch:
                if probe(lo + d, a.seq):
                    lo, d = lo + d, d * 2
                else:
                    hi = lo + d
        else:
            hi, d = guess, 1
            while lo == 0 and hi > 1:
                b = max(1, hi - d)
                if probe(b, a.seq):
                    lo = b
                else:
                    hi, d = b, d * 2
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid, a.seq):
                lo = mid
            else:
                hi = mid
        # Stage 2: at batch hi (fails at --seq), the longest sequence that trains, in --seq-step steps.
        # Below s_lo it holds no more tokens than lo x --seq, which trained.
        if hi is not None:
            s_lo = lo * a.seq // hi // a.seq_step * a.seq_step
            s_hi = a.seq
            while s_hi - s_lo > a.seq_step:
                mid = max(s_lo + a.seq_step, (s_lo + s_hi) // 2 // a.seq_step * a.seq_step)
                if probe(hi, mid):
                    s_lo = mid
                else:
                    s_hi = mid
    except _Stop as e:
        stopped = str(e)
    passed = [p for p in probes if p["outcome"] == "pass"]
    failed = [p for p in probes if p["outcome"] not in ("pass", "cut", "no-budget")]
    best = max(passed, key=lambda p: p["tokens"], default=None)
    worst = min(failed, key=lambda p: p["tokens"], default=None)
    counts = {}
    for p in probes:
        counts[p["outcome"]] = counts.get(p["outcome"], 0) + 1
    rec = {"op": "capacity", "budget_gb": a.budget_gb, "budget_bytes": int(a.budget_gb * GiB), "seq": a.seq,
           "seq_step": a.seq_step, "probe_steps": a.probe_steps, "varlen": a.varlen, "seq_min": a.seq_min,
           "guess_batch": guess,
           "batch_at_seq": lo, "fail_batch_at_seq": hi,
           "largest_pass": best, "smallest_fail": worst,
           "largest_pass_tokens": best["tokens"] if best else None,
           "smallest_fail_tokens": worst["tokens"] if worst else None,
           "non_monotonic": bool(best and worst and best["tokens"] > worst["tokens"]),
           "probes": len(probes), "outcomes": counts, "probe_list": probes,
           "complete": stopped is None, "stopped": stopped, "mock": a.dry_run,
           "wall_s": round(time.time() - t_start, 2)}
    emit(a, rec)
    print("torch_train: capacity %s%s %s: largest pass %s tokens, smallest fail %s tokens, %d probes%s"
          % (a.model, " (variable lengths)" if a.varlen else "", a.mode, rec["largest_pass_tokens"],
             rec["smallest_fail_tokens"], len(probes),
             "" if stopped is None else " (stopped: %s)" % stopped))
    # A search that found nothing that trains, or could not enforce the budget, failed.
    return 0 if best is not None and counts.get("no-budget", 0) == 0 else 1


# ---------------------------------------------------------------------------------------------

def dry_run(a, problems):
    """The plan, without torch; the capacity search runs with dry-run probes."""
    if a.phase == "probe":
        if problems:
            for msg in problems:
                print("torch_train: invalid: " + msg, file=sys.stderr)
            emit(a, {"op": "probe", "dry_run": True, "valid": False, "problems": problems})
            return 1
        return run_probe(a)
    p = plan(a)
    print("torch_train: dry run, model %s, mode %s, phase %s" % (a.model, a.mode, a.phase))
    for k, v in p.items():
        print("  %-12s %s" % (k, v))
    rec = {"dry_run": True, "valid": not problems, "problems": problems, "plan": p}
    if a.phase == "snapshot" and not problems:
        # The shrinking path, on a snapshot-shaped dict of the size a real one reaches.
        data, how = shrink_snapshot(fake_snapshot(min(a.snapshot_entries, 20000), 12), int(a.snapshot_max_mb * 1e6))
        rec["shrink_check"] = {"bytes": len(data), "how": how, "ok": len(data) <= a.snapshot_max_mb * 1e6
                               and isinstance(pickle.loads(data).get("device_traces"), list)}
        if not rec["shrink_check"]["ok"]:
            problems.append("shrink_snapshot left %d bytes (%s)" % (len(data), how))
            rec["valid"] = False
    emit(a, rec)
    for msg in problems:
        print("torch_train: invalid: " + msg, file=sys.stderr)
    if problems:
        return 1
    return run_capacity(a) if a.phase == "capacity" else 0


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    problems = validate(a)
    if a.dry_run:
        return dry_run(a, problems)
    if problems:
        for msg in problems:
            print("torch_train: invalid: " + msg, file=sys.stderr)
        return 2
    return {"train": run_train, "oom": run_oom, "snapshot": run_snapshot, "allocpair": run_allocpair,
            "capacity": run_capacity, "probe": run_probe}[a.phase](a)


if __name__ == "__main__":
    sys.exit(main())
