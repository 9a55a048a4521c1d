#!/usr/bin/env bash
# check_run_mock.sh SOURCE_ROOT BUILD_ROOT — meson test 'gpu_run_mock' (suite 'bench'): runs
# bench/gpu/run.sh all --mock into a temporary folder and checks that every part left its
# results.jsonl (every line JSON, a meta line first, a status line last, status pass or mock), its
# summary.md, env.txt and logs.txt, that `all` wrote the combined summary and the targets table,
# and that the capacity parts' searches (dry-run probes against made-up limits) found each limit
# to within one step.
set -u
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

env -u OUT "$src/bench/gpu/run.sh" all --mock --out "$tmp/results" --build "$build" --steps 5 >"$tmp/log" 2>&1
rc=$?
cat "$tmp/log"
[ "$rc" = 0 ] || bad "run.sh all --mock exited $rc"
[ -s "$tmp/results/summary.md" ] || bad "no combined summary.md"
parts="driver-costs property-cuda ld-preload driver-questions torch-api torch torch-medium torch-alloc-cost torch-capacity
torch-capacity-medium torch-capacity-varlen torch-capacity-medium-varlen torch-step-controls viewer"
# Every part `all` ran is one of these: a part left off the list would go unchecked.
for d in "$tmp/results"/*/; do
    [ -d "$d" ] || continue
    case " $(echo $parts) " in *" $(basename "$d") "*) ;; *) bad "$(basename "$d"): a part this script does not check" ;; esac
done
for part in $parts; do
    f=$tmp/results/$part/results.jsonl
    [ -s "$f" ] || { bad "$part: no results.jsonl"; continue; }
    [ -s "$tmp/results/$part/summary.md" ] || bad "$part: no summary.md"
    [ -s "$tmp/results/$part/env.txt" ] || bad "$part: no env.txt"
    grep -q unparsable "$tmp/results/$part/summary.md" && bad "$part: results.jsonl has unparsable lines"
    python3 - "$part" "$f" <<'PY' || bad "$part: results.jsonl is not as expected"
import json, sys
part, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.strip()]
assert rows[0]["op"] == "meta" and rows[0]["mock"] is True and rows[0]["part"] == part, rows[0]
assert rows[-1]["op"] == "status" and rows[-1]["status"] in ("pass", "mock"), rows[-1]
body = rows[1:-1]
MODES = ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]


def dry(body):
    return sorted((r["mode"], r["phase"]) for r in body if r.get("dry_run") and r.get("valid"))


def capacity_ok(body, model):
    """Each mode searched to completion; the bracket holds the made-up limit of its dry-run probes
    (mock_tokens), to within one stage-2 step."""
    caps = {r["mode"]: r for r in body if r.get("op") == "capacity"}
    assert sorted(caps) == sorted(MODES), caps.keys()
    for m, c in caps.items():
        limit = next(r["mock_tokens"] for r in body if r.get("op") == "probe" and r["mode"] == m)
        lp, sf = c["largest_pass_tokens"], c["smallest_fail_tokens"]
        assert c["model"] == model and c["mock"] and c["complete"] and not c["non_monotonic"], c
        assert lp <= limit < sf and sf - lp <= c["fail_batch_at_seq"] * c["seq_step"], (m, lp, limit, sf)
        probes = [r for r in body if r.get("op") == "probe" and r["mode"] == m]
        assert c["probes"] == len(probes), m
        # The ballast ran against the fake driver's 80 GiB device and left exactly the budget free.
        assert all(r["ballast_checked"] == "fake driver" and r["free_after_ballast"] == c["budget_bytes"]
                   and r["ballast_bytes"] == r["free_before_ballast"] - c["budget_bytes"] for r in probes), probes[0]
    # Every mode after the first starts from the previous mode's answer.
    assert all(caps[b]["guess_batch"] == caps[a]["batch_at_seq"] for a, b in zip(MODES, MODES[1:])), caps
    return True


def varlen_ok(body):
    """The -varlen parts: every search and probe says so, and each probe's 8 steps start and end at
    its sequence length with the others drawn between --seq-min and it."""
    caps = [r for r in body if r.get("op") == "capacity"]
    probes = [r for r in body if r.get("op") == "probe"]
    assert caps and all(c["varlen"] and c["probe_steps"] == 8 for c in caps), caps
    for p in probes:
        n = p["lengths"]
        assert p["varlen"] and len(n) == 8 and n[0] == n[-1] == p["seq"], p
        assert all(min(128, p["seq"]) <= x <= p["seq"] for x in n) and len(set(n)) > 1, p
    return True


need = {
    "driver-costs": lambda: {r["op"] for r in body} >= {"device", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                                                         "cuMemUnmap", "cuMemRelease", "cuMemAlloc", "cuMemFree",
                                                         "build_create_map_access"}
                            and {r["chunk_bytes"] for r in body if r["op"] == "cuMemCreate"} == {2 << 20, 20 << 20, 256 << 20},
    "property-cuda": lambda: len([r for r in body if r.get("pass") is True]) >= 5
                             and {r["mode"] for r in body if "mode" in r} == {"vmm", "classic"},
    "ld-preload": lambda: len([r for r in body if r["op"] == "run"]) == 6,
    # every check listed in both processes, not run; where nvcc built the program, its driver
    # look-up probed against the fake driver, plain and under the preload (dq_verdict judged them)
    "driver-questions": lambda: sorted((r["check"], r["mode"]) for r in body if r["op"] == "check"
                                       and r["status"] == "not-run")
                                == sorted([(c, m) for c in ["capture_vs_misses", "capture_vs_misses_thread_local",
                                                            "capture_vs_misses_relaxed", "capture_vs_misses_own_thread",
                                                            "stream_get_ctx_under_capture", "legacy_lookup_flags",
                                                            "meminfo_counted_once", "event_idle_at_once",
                                                            "cudafree_blocking_streams", "legacy_free_nonblocking",
                                                            "device_reset"]
                                           for m in ["plain", "preload"]]
                                          + [(c, "preload-classic") for c in ["capture_vs_misses",
                                                                              "capture_vs_misses_own_thread",
                                                                              "legacy_free_nonblocking"]])
                                and all(b["ok"] for b in body if b["op"] == "build")
                                and (not any(b["op"] == "build" for b in body)
                                     or sorted(r["mode"] for r in body if r["op"] == "probe" and r["pass"])
                                     == ["plain", "preload"]),
    # every check of torch_api.py listed, none run
    "torch-api": lambda: [r["check"] for r in body if r["op"] == "check" and r["status"] == "not-run"]
                         == ["served", "stats_match", "standin_keys", "accelerator", "reset_peak",
                             "reset_accumulated", "empty_cache", "memory_summary", "train_marks", "oom",
                             "graph_guard", "cudnn_benchmark", "record_stream", "caching_allocator_alloc",
                             "mempool", "compile_cudagraphs"],
    "torch": lambda: dry(body) == sorted([(m, p) for m in MODES for p in ["train", "oom"]]
                                         + [("default", "snapshot"), ("expandable", "snapshot")])
                     and all(r["shrink_check"]["ok"] for r in body if r.get("phase") == "snapshot")
                     # allocview diagnosed each cualloc mode's forced OOM from its trace (in the mock,
                     # the demo's OOM on the sim device stands in)
                     and sorted(r["mode"] for r in body if r.get("op") == "oom-report" and r.get("pass")
                                and r["failing_site"] and any(x.startswith("oom-") for x in r["rules"]))
                         == sorted(MODES[2:]),
    "torch-medium": lambda: dry(body) == sorted((m, "train") for m in MODES)
                            and all(r["model"] == "medium" for r in body if r.get("dry_run")),
    "torch-alloc-cost": lambda: dry(body) == sorted((m, "allocpair") for m in MODES),
    "torch-capacity": lambda: capacity_ok(body, "small"),
    "torch-capacity-medium": lambda: capacity_ok(body, "medium"),
    "torch-capacity-varlen": lambda: capacity_ok(body, "small") and varlen_ok(body),
    "torch-capacity-medium-varlen": lambda: capacity_ok(body, "medium") and varlen_ok(body),
    # the default mode's training planned in each configuration, with its sampler and determinism
    "torch-step-controls": lambda: sorted((r["label"], r["plan"]["memory"].split(":")[0], r["plan"]["deterministic"])
                                          for r in body if r.get("dry_run") and r.get("valid")
                                          and (r["mode"], r["phase"]) == ("default", "train"))
                                   == [("no-sampler", "read after each step", True),
                                       ("no-sampler-nondeterministic", "read after each step", False),
                                       ("sampler-2ms", "sampler every 2.0 ms", True)],
    # exports of the sim traces (frag, leak, demo) and of the shared snapshots when present
    "viewer": lambda: len([r for r in body if r.get("op") == "viewer" and r.get("python_checks") == "pass"]) >= 3
                      and all(r.get("pass") for r in body if r.get("op") == "viewer"),
}[part]
assert need(), "%s: missing records: %s" % (part, [r.get("op") for r in body])
PY
    [ -s "$tmp/results/$part/logs.txt" ] || [ -s "$tmp/results/$part/log.txt" ] || bad "$part: no logs"
    ls "$tmp/results/$part"/*.log >/dev/null 2>&1 && bad "$part: *.log left beside logs.txt"
    n=$(find "$tmp/results/$part" -mindepth 1 -maxdepth 1 | wc -l)
    [ "$n" -le 7 ] || bad "$part: $n files (at most 8 files per command come back from the GPU machine, torch-targets.md included)"
done
# The targets table: both models, and the mock capacity figures compared (made-up limits chosen so
# that some targets are met and some not).
t=$tmp/results/torch-targets.md
[ -s "$t" ] || bad "no torch-targets.md"
for want in "GPT-2 small (capacity budget 24.0 GiB)" "GPT-2 medium (capacity budget 40.0 GiB)" "MOCK" \
        "GPT-2 small, sequence lengths drawn per step as in training (capacity budget 24.0 GiB; each probe 8 steps" \
        "GPT-2 medium, sequence lengths drawn per step as in training" \
        "| met |" "NOT met" "not measured"; do
    grep -qF "$want" "$t" || bad "torch-targets.md lacks '$want'"
done
grep -q "torch targets" "$tmp/results/summary.md" || bad "the combined summary lacks the targets"
# --probe-steps reaches every probe of a capacity part (each probe trains that many steps, the
# first and last at the probe's length), and nonsense is refused.
env -u OUT "$src/bench/gpu/run.sh" torch-capacity-varlen --mock --modes default --probe-steps 12 \
    --out "$tmp/steps" --build "$build" >"$tmp/steps.log" 2>&1 || { cat "$tmp/steps.log"; bad "run.sh --probe-steps 12 exited $?"; }
python3 - "$tmp/steps/torch-capacity-varlen/results.jsonl" <<'PY' || bad "--probe-steps 12 did not reach the probes"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
caps = [r for r in rows if r.get("op") == "capacity"]
probes = [r for r in rows if r.get("op") == "probe"]
assert caps and all(c["probe_steps"] == 12 for c in caps), caps
assert probes and all(len(p["lengths"]) == 12 and p["lengths"][0] == p["lengths"][-1] == p["seq"] for p in probes), probes
PY
grep -qF "each probe 12 steps" "$tmp/steps/torch-targets.md" || bad "the targets table does not say 12 steps"
for n in 0 x -3; do
    env -u OUT "$src/bench/gpu/run.sh" torch-capacity --mock --probe-steps "$n" --out "$tmp/bad" --build "$build" \
        >/dev/null 2>&1
    [ $? = 2 ] || bad "run.sh --probe-steps $n: want exit 2 (usage)"
done
# driver_costs stopped by run.sh's timeout (a driver call that hangs) keeps the lines it wrote:
# run.sh appends its JSON file to results.jsonl either way. A program that ended within the second
# tells nothing (rc not 124).
LD_LIBRARY_PATH=$build/tests/fakecuda CUALLOC_CONF=sim_memory_mb:4096 timeout 1 "$build/bench/driver_costs" \
    --calls 2000000 --json "$tmp/dc.jsonl" >"$tmp/dc.log" 2>&1
if [ $? = 124 ]; then
    grep -q '"op":"device"' "$tmp/dc.jsonl" && grep -q '^driver_costs: ' "$tmp/dc.log" ||
        bad "driver_costs stopped by its timeout left no figures (JSON $(wc -c <"$tmp/dc.jsonl") bytes)"
fi
grep -q '^date: ' "$tmp/results/driver-costs/env.txt" || bad "env.txt has no date"
grep -q '^commit (build): ' "$tmp/results/driver-costs/env.txt" || bad "env.txt has no commit"
# torch_train.py refuses a mode whose environment is wrong.
if env -u LD_PRELOAD python3 "$src/bench/gpu/torch_train.py" --mode cualloc-preload-cache --dry-run \
        --build "$build" >/dev/null 2>&1; then
    bad "torch_train.py accepted cualloc-preload-cache without LD_PRELOAD"
fi
# PyTorch reads its allocator settings from PYTORCH_ALLOC_CONF as well as PYTORCH_CUDA_ALLOC_CONF:
# one left in the machine's environment would configure the default mode too. torch_train.py
# refuses it, and run.sh unsets it for every mode.
if env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF=expandable_segments:True python3 \
        "$src/bench/gpu/torch_train.py" --mode default --dry-run --build "$build" >/dev/null 2>&1; then
    bad "torch_train.py accepted mode default with PYTORCH_ALLOC_CONF=expandable_segments:True"
fi
env -u OUT PYTORCH_ALLOC_CONF=expandable_segments:True "$src/bench/gpu/run.sh" torch-alloc-cost --mock \
    --modes default,expandable --out "$tmp/allocconf" --build "$build" >"$tmp/allocconf.log" 2>&1 ||
    bad "run.sh torch-alloc-cost with PYTORCH_ALLOC_CONF in the environment failed: $(tail -5 "$tmp/allocconf.log")"
# Which exceptions count as "out of device memory" (an OOM ends a capacity probe as a failure of
# the size, any other error as a failure of the run).
PYTHONPATH="$src/bench/gpu" python3 - <<'PY' || bad "torch_train.is_memory_error misclassifies"
import torch_train as t


class OutOfMemoryError(RuntimeError):
    pass


class FakeTorch:
    OutOfMemoryError = OutOfMemoryError


cases = [
    (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("cualloc: CUDA out of memory: tried to allocate 1.5 GiB"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasLtCreate(&handle)`"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasSgemm(...)`"), False),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("shapes do not match"), False),
]
for e, want in cases:
    assert t.is_memory_error(FakeTorch, e) is want, (e, want)
PY
# The memory sampler against a fake device: the peak over the job less the baseline, from NVML
# where it loads (mem_get_info then every tenth sample and at the end), else from mem_get_info.
PYTHONPATH="$src/bench/gpu" python3 - <<'PY' || bad "torch_train.Sampler measures wrongly"
import torch_train as t

GiB = 1 << 30


class Device:
    used = 5 * GiB
    mgi_calls = 0


class Cuda:
    @staticmethod
    def mem_get_info():
        Device.mgi_calls += 1
        return 80 * GiB - Device.used, 80 * GiB

    @staticmethod
    def set_device(i):
        pass


class FakeTorch:
    cuda = Cuda


class FakeNvml:
    def __init__(self, index):
        pass

    def used(self):
        return Device.used + GiB  # NVML also counts what the driver keeps for itself


for with_nvml in (True, False):
    if with_nvml:
        t.Nvml = FakeNvml
    else:
        def no_nvml(index):
            raise OSError("no libnvidia-ml.so.1")
        t.Nvml = no_nvml
    Device.used, Device.mgi_calls = 5 * GiB, 0
    s = t.Sampler(FakeTorch, 0.001)
    s.stop_flag.set()  # its thread ends at once: the samples below are the test's
    s.start()
    for used in (7, 12, 9):  # the job's memory over time; the sampler samples each level 20 times
        Device.used = used * GiB
        for _ in range(20):
            s.sample()
    Device.used = 6 * GiB
    out = s.finish()
    assert out["peak_bytes"] == 7 * GiB, out
    assert out["peak_source"] == ("nvml" if with_nvml else "mem_get_info"), out
    assert out["samples"] == 61, out
    # one call at the start, then every sample without NVML; every tenth (and the last) with it
    assert Device.mgi_calls == (1 + 7 if with_nvml else 1 + 61), (with_nvml, Device.mgi_calls)
    if with_nvml:
        assert out["baseline_used_bytes_nvml"] == 6 * GiB, out
PY

# driver-questions' verdict on made-up results of a GPU run: capture_vs_misses is judged against
# CUDA's own answer (the run without cualloc), a crashed process fails, an undecided check is named.
PYTHONPATH="$src/bench/gpu" python3 - <<'PY' || bad "summarize.dq_verdict judges driver-questions wrongly"
import summarize as s


def step(op, phase, error, capture):
    return {"op": op, "phase": phase, "error": error, "capture_after": capture}


def capture(mode, passed, steps, check="capture_vs_misses"):
    return {"op": "check", "check": check, "mode": mode, "rc": 0, "pass": passed,
            "result": {"check": check, "pass": passed, "steps": steps}}


def other(check, mode, passed, rc=0):
    return {"op": "check", "check": check, "mode": mode, "rc": rc, "pass": passed, "result": {"pass": passed}}


ok = [other(c, m, True) for c in ["legacy_lookup_flags", "stream_get_ctx_under_capture", "meminfo_counted_once",
                                  "device_reset"] for m in ["plain", "preload"]]
refused = "cudaErrorStreamCaptureImplicit"
# CUDA refuses the cudaMalloc and loses the capture; so does cualloc (its trim is its own): pass.
same = [capture("plain", False, [step("cudaMalloc 4 MiB", 1, refused, "invalidated"),
                                 step("cualloc_trim(0)", 1, "not loaded", "active"),
                                 step("cuCtxSynchronize (control)", 2, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "invalidated")]),
        capture("preload", False, [step("cudaMalloc 4 MiB", 1, refused, "invalidated"),
                                   step("cualloc_trim(0)", 1, "cudaSuccess", "active"),
                                   step("cuCtxSynchronize (control)", 2, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "invalidated")])]
status, detail, extra = s.dq_verdict(ok + same, False, "")
assert status == "pass" and extra[0]["pass"] is True and len(extra[0]["steps"]) == 3, (status, detail, extra)
# cualloc's trim invalidates a capture CUDA kept: fail, and the step is named.
worse = same[:1] + [capture("preload", False, [step("cudaMalloc 4 MiB", 1, refused, "invalidated"),
                                                step("cualloc_trim(0)", 1, "cudaSuccess", "invalidated"),
                                                step("cuCtxSynchronize (control)", 2, "x", "invalidated")])]
status, detail, extra = s.dq_verdict(ok + worse, False, "")
assert status == "fail" and extra[0]["cualloc_extra_invalidations"] == ["cualloc_trim(0)"], (status, extra)
# cualloc answers OOM where CUDA succeeded: fail.
oom = [capture("plain", True, [step("cudaMalloc 4 MiB", 1, "cudaSuccess", "active")]),
       capture("preload", False, [step("cudaMalloc 4 MiB", 1, "cudaErrorMemoryAllocation", "active")])]
status, detail, extra = s.dq_verdict(ok + oom, False, "")
assert status == "fail" and extra[0]["cualloc_extra_errors"], (status, extra)
# The same refusal when cualloc's own verdict is undecided (nothing it did reached the driver: a
# refused miss maps nothing) or a pass (the capture survived the refusal): still fail.
for verdict in (None, True):
    refused_only = [oom[0], capture("preload", verdict, [step("cudaMalloc 4 MiB", 1, "cudaErrorMemoryAllocation",
                                                              "active")])]
    status, detail, extra = s.dq_verdict(ok + refused_only, False, "")
    assert status == "fail" and extra[0]["pass"] is False and extra[0]["cualloc_extra_errors"], (verdict, status, extra)
# cualloc invalidating a capture CUDA kept, with cualloc's own verdict undecided: fail.
inval_only = same[:1] + [capture("preload", None, [step("cudaMalloc 4 MiB", 1, refused, "invalidated"),
                                                    step("cualloc_trim(0)", 1, "cudaSuccess", "invalidated")])]
status, detail, extra = s.dq_verdict(ok + inval_only, False, "")
assert status == "fail" and extra[0]["cualloc_extra_invalidations"] == ["cualloc_trim(0)"], (status, extra)
# a crash (no RESULT line) fails; an undecided check is named, and does not fail the part.
status, detail = s.dq_verdict(ok[:-1] + [other("device_reset", "preload", None, rc=139)] + same, False, "")[:2]
assert status == "fail" and "device_reset (preload) exited 139" in detail, detail
status, detail = s.dq_verdict(ok[:-1] + [other("device_reset", "preload", None)] + same, False, "")[:2]
assert status == "pass" and "undecided: device_reset (preload)" in detail, detail
# the summary shows the comparison
text = "\n".join(s.driver_questions(ok + same + s.dq_verdict(ok + same, False, "")[2]))
assert "| 1 | cualloc_trim(0) | not loaded | active | cudaSuccess | active |" in text, text
# every variant and every cualloc process is compared with CUDA's run of the same variant: classic
# segments invalidating where CUDA did not fail, named by variant and process; the expandable
# process of the same variant, and another variant, are judged on their own.
def variant(check, mode, capture_after_trim):
    return capture(mode, capture_after_trim == "active", [step("cualloc_trim(0)", 1, "cudaSuccess", capture_after_trim)],
                   check)
own = [variant("capture_vs_misses_own_thread", "plain", "active"),
       variant("capture_vs_misses_own_thread", "preload", "active"),
       variant("capture_vs_misses_own_thread", "preload-classic", "invalidated"),
       variant("capture_vs_misses_relaxed", "plain", "active"), variant("capture_vs_misses_relaxed", "preload", "active")]
status, detail, extra = s.dq_verdict(ok + same + own, False, "")
assert status == "fail" and detail == "failed: capture_vs_misses_own_thread (preload-classic compared)", detail
assert sorted((c["check"], c["mode"], c["pass"]) for c in extra) == [
    ("capture_vs_misses", "preload", True), ("capture_vs_misses_own_thread", "preload", True),
    ("capture_vs_misses_own_thread", "preload-classic", False), ("capture_vs_misses_relaxed", "preload", True)], extra
text = "\n".join(s.driver_questions(ok + same + own + extra))
assert ("capture_vs_misses_own_thread, LD_PRELOAD cualloc, classic segments against CUDA alone, step by step "
        in text and "**FAIL**" in text), text
# CUDA's own run of a variant with no cualloc run beside it: named undecided, not failed
status, detail = s.dq_verdict(ok + same + own[3:4], False, "")[:2]
assert status == "pass" and "undecided: capture_vs_misses_relaxed (plain, nothing compared)" in detail, detail
PY

# torch-step-controls' summary of made-up GPU records: each configuration's runs, their spread and
# where the steps' time went; and the targets leave the controls' default-mode runs out.
PYTHONPATH="$src/bench/gpu" python3 - "$tmp" <<'PY' || bad "summarize.py summarizes torch-step-controls wrongly"
import json, os, sys
import summarize as s


def run(label, step, issue, cpu, sample_ms, det, rnd):
    return {"part": "torch-step-controls", "model": "small", "mode": "default", "phase": "train", "round": rnd,
            "label": label, "batch": 8, "steps": 30, "median_step_ms": step, "median_issue_ms": issue,
            "median_issue_cpu_ms": cpu, "sample_ms": sample_ms, "deterministic": det, "peak_bytes": 16 << 30}


rows = [run("sampler-2ms", 200.0, 195.0, 60.0, 2.0, True, 1), run("no-sampler", 40.0, 30.0, 29.0, 0.0, True, 1),
        run("sampler-2ms", 230.0, 225.0, 61.0, 2.0, True, 2), run("no-sampler", 41.0, 30.5, 29.5, 0.0, True, 2)]
text = "\n".join(s.step_controls(rows))
assert "| sampler-2ms | default | 200.0 / 230.0 | 215.0 | 15% | 210.0 | 60.5 | 2.0 | True | 16.00 |" in text, text
assert "| no-sampler | default | 40.0 / 41.0 | 40.5 | 2% | 30.2 | 29.2 | 0.0 | True | 16.00 |" in text, text
d = os.path.join(sys.argv[1], "controls-only")
os.makedirs(d)
with open(os.path.join(d, "results.jsonl"), "w") as f:
    f.write(json.dumps({"op": "meta", "part": "torch-step-controls"}) + "\n")
    f.writelines(json.dumps(r) + "\n" for r in rows)
import contextlib, io
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    s.targets_main([d])
assert "No results found." in buf.getvalue() and "215.0" not in buf.getvalue(), buf.getvalue()
PY

# carry-libs.sh into a folder of its own: every library the build's programs load that is not the
# C library's or libstdc++/libgcc_s must then come from there.
libs=$tmp/gpu-libs
if "$src/bench/gpu/carry-libs.sh" "$build" "$libs" >"$tmp/carry.log" 2>&1; then
    for p in tools/allocview/allocview tests/trace_scenarios tools/cualloc-demo; do
        LD_LIBRARY_PATH=$libs ldd "$build/$p" | awk -v d="$libs/" '$2 == "=>" && $1 !~ /^(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s)\.so|^ld-linux|^libcualloc/ && index($3, d) != 1 { print }' >"$tmp/outside"
        [ -s "$tmp/outside" ] && bad "carry-libs.sh: $p still loads from outside gpu-libs: $(cat "$tmp/outside")"
    done
    if ldd "$build/tools/allocview/allocview" | grep -q libjemalloc; then
        [ -f "$libs/libjemalloc.so.2" ] || bad "carry-libs.sh did not copy libjemalloc.so.2"
    fi
    [ -e "$libs/libc.so.6" ] && bad "carry-libs.sh copied the C library"
else
    bad "carry-libs.sh failed: $(cat "$tmp/carry.log")"
fi
# A copy that fails (a cp that refuses) is named, and the status is 1; it ended without a word.
mkdir "$tmp/failcp" && printf '#!/bin/sh\nexit 1\n' >"$tmp/failcp/cp" && chmod +x "$tmp/failcp/cp"
if PATH="$tmp/failcp:$PATH" "$src/bench/gpu/carry-libs.sh" "$build" "$tmp/gpu-libs-failcp" >"$tmp/carry.log" 2>&1 ||
    ! grep -q "^carry-libs.sh: copying .* failed" "$tmp/carry.log"; then
    bad "carry-libs.sh with a failing cp: $(cat "$tmp/carry.log")"
fi

# On a machine without allocview's libraries the viewer part stops at once and says what to do.
nb=$tmp/nolibs-build
mkdir -p "$nb/tools/allocview" "$nb/tests"
printf '#!/bin/sh\necho "$0: error while loading shared libraries: libjemalloc.so.2: cannot open shared object file: No such file or directory" >&2\nexit 127\n' \
    >"$nb/tools/allocview/allocview"
chmod +x "$nb/tools/allocview/allocview"
: >"$nb/tests/trace_scenarios"
env -u OUT "$src/bench/gpu/run.sh" viewer --mock --out "$tmp/nolibs" --build "$nb" >"$tmp/nolibs.log" 2>&1
rc=$?
[ "$rc" != 0 ] || bad "run.sh viewer without allocview's libraries exited 0"
grep -q "libjemalloc.so.2 is missing" "$tmp/nolibs.log" && grep -q "carry-libs.sh" "$tmp/nolibs.log" ||
    bad "run.sh viewer without allocview's libraries did not say so: $(cat "$tmp/nolibs.log")"
grep -q '"status":"fail"' "$tmp/nolibs/viewer/results.jsonl" 2>/dev/null || bad "the viewer part's status line is not fail"

# Several parts in one command, under one deadline, packed into one archive (how a GPU machine,
# which returns few files per command, is used); and a deadline already spent starts nothing.
env -u OUT "$src/bench/gpu/run.sh" driver-costs,torch-alloc-cost --mock --out "$tmp/multi" --build "$build" \
    --deadline-s 300 --pack "$tmp/multi.tgz" >"$tmp/multi.log" 2>&1 || bad "run.sh driver-costs,torch-alloc-cost exited non-zero"
tar tzf "$tmp/multi.tgz" >"$tmp/multi.list" 2>/dev/null || bad "--pack wrote no readable archive"
for f in ./driver-costs/results.jsonl ./torch-alloc-cost/results.jsonl ./torch-alloc-cost/summary.md ./summary.md; do
    grep -qx "$f" "$tmp/multi.list" || bad "the packed archive lacks $f"
done
grep -q "## driver-costs" "$tmp/multi/summary.md" && grep -q "## torch-alloc-cost" "$tmp/multi/summary.md" ||
    bad "the summary of several parts lacks one"
env -u OUT "$src/bench/gpu/run.sh" driver-costs --mock --out "$tmp/late" --build "$build" --deadline-s 20 \
    >"$tmp/late.log" 2>&1 && bad "a part started with under 30 s of its deadline left, or exited 0"
grep -q "not started" "$tmp/late.log" || bad "run.sh did not say the part was not started: $(cat "$tmp/late.log")"
env -u OUT "$src/bench/gpu/run.sh" driver-costs,nonsense --mock --out "$tmp/bad" --build "$build" >/dev/null 2>&1
[ $? = 2 ] || bad "an unknown part in a list was not refused"

# A part without a budget of its own ends within PART_BUDGET_S (540 s by default) whatever hangs:
# ld-preload's two builds (150 s each) and six runs (80 s each) could take 13 minutes, more than a
# command's 10. Here nvcc hangs, and the part must give up within its (small) budget.
mkdir "$tmp/slownvcc" && printf '#!/bin/sh\nsleep 40\nexit 1\n' >"$tmp/slownvcc/nvcc" && chmod +x "$tmp/slownvcc/nvcc"
t0=$(date +%s)
env -u OUT PATH="$tmp/slownvcc:$PATH" PART_BUDGET_S=14 "$src/bench/gpu/run.sh" ld-preload --mock --out "$tmp/slow" \
    --build "$build" >"$tmp/slow.log" 2>&1
st=$? took=$(($(date +%s) - t0))
[ "$st" = 1 ] && [ "$took" -lt 30 ] || bad "ld-preload with a hanging nvcc and PART_BUDGET_S=14: exit $st after $took s"
[ "$(grep -c '"op":"build".*"ok":false' "$tmp/slow/ld-preload/results.jsonl" 2>/dev/null)" = 2 ] ||
    bad "ld-preload with a hanging nvcc: the two builds are not recorded as failed"
# --repeat: every mode's timed training in each round, the rounds through the modes in turn, each
# round's log kept; a bad count refused.
env -u OUT "$src/bench/gpu/run.sh" torch-medium --mock --repeat 3 --modes default,cualloc-enable --steps 5 \
    --out "$tmp/rep" --build "$build" >"$tmp/rep.log" 2>&1 || bad "run.sh torch-medium --repeat 3 exited non-zero"
python3 - "$tmp/rep/torch-medium/results.jsonl" <<'PY' || bad "--repeat 3: not three rounds of both modes in turn"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
runs = [(r["round"], r["mode"]) for r in runs if r.get("phase") == "train" and r.get("dry_run")]
assert runs == [(k, m) for k in (1, 2, 3) for m in ("default", "cualloc-enable")], runs
PY
grep -q '^==> cualloc-enable-train-round3.log <==' "$tmp/rep/torch-medium/logs.txt" || bad "--repeat 3: no log of round 3"
# A torch part whose budget runs out is incomplete, not failed: the runs it made are measured, the
# rest recorded as not made, and the command's status is 1.
env -u OUT TORCH_BUDGET_S=21 "$src/bench/gpu/run.sh" torch-step-controls --mock --repeat 40 --steps 5 \
    --out "$tmp/cut" --build "$build" >"$tmp/cut.log" 2>&1
st=$?
python3 - "$tmp/cut/torch-step-controls/results.jsonl" <<'PY' || bad "a torch part cut by its budget: not reported as incomplete (exit $st)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
status = [r for r in rows if r.get("op") == "status"]
made = [r for r in rows if r.get("phase") == "train" and r.get("dry_run")]
cut = [r for r in rows if r.get("op") == "error" and r.get("rc") == 124]
assert len(status) == 1 and status[0]["status"] == "incomplete" and status[0]["rc"] == 1, status
assert made and cut and len(made) + len(cut) == 120, (len(made), len(cut))
assert "%d run(s) not made" % len(cut) in status[0]["detail"], status[0]["detail"]
PY
[ "$st" = 1 ] || bad "a torch part cut by its budget: exit $st, not 1"
grep -q '^- status: \*\*incomplete\*\*' "$tmp/cut/torch-step-controls/summary.md" ||
    bad "a torch part cut by its budget: the summary does not say incomplete"
# pending.sh: the runs still to make, each group packed with its log, in $OUT when set; a group
# with under 90 s of the deadline left is not started.
OUT="$tmp/pending" "$src/bench/gpu/pending.sh" --mock --build "$build" --deadline-s 400 >"$tmp/pending.log" 2>&1 ||
    bad "pending.sh --mock exited non-zero: $(tail -3 "$tmp/pending.log")"
for name in driver-questions capacity-medium-a capacity-medium-b torch-rounds; do
    [ -s "$tmp/pending/$name.tgz" ] && [ -s "$tmp/pending/$name.log" ] || bad "pending.sh: no $name.tgz and .log in \$OUT"
done
[ "$(ls "$tmp/pending" | wc -l)" -le 8 ] || bad "pending.sh: more files than a GPU machine returns"
tar -tzf "$tmp/pending/torch-rounds.tgz" | grep -q 'torch/results.jsonl' || bad "pending.sh: torch-rounds.tgz lacks the torch part's results"
env -u OUT "$src/bench/gpu/pending.sh" --mock --build "$build" --deadline-s 80 --out "$tmp/pending-late" \
    >"$tmp/pending-late.log" 2>&1 && bad "pending.sh with 80 s: exit 0"
[ "$(grep -c 'not started' "$tmp/pending-late.log")" = 4 ] || bad "pending.sh with 80 s: not every group refused"
for n in 0 x; do
    env -u OUT "$src/bench/gpu/run.sh" torch-medium --mock --repeat "$n" --out "$tmp/rep0" --build "$build" >/dev/null 2>&1
    [ $? = 2 ] || bad "--repeat $n was not refused"
done
# A bad --steps, --budget-gb or --sample-ms, an empty --modes or a list of no part: refused at once (status 2,
# named), nothing run; torch_train.py refused the first two in every mode's job in turn, and the
# last two ran all five modes or no part with status 0.
for args in "torch --steps x" "torch --steps -3" "torch --steps 0" "torch-capacity --budget-gb lots" \
    "torch-capacity --budget-gb 0" "torch-capacity --budget-gb -5" "torch --modes ," "," "torch --sample-ms fast" \
    "torch --sample-ms -1"; do
    set -f
    env -u OUT "$src/bench/gpu/run.sh" $args --mock --out "$tmp/badarg" --build "$build" >/dev/null 2>"$tmp/badarg.err"
    st=$?
    set +f
    [ $st = 2 ] && grep -q "^run.sh: \(--steps\|--budget-gb\|--modes\|--sample-ms\|no part\)" "$tmp/badarg.err" ||
        bad "run.sh $args: exit $st, want 2 naming it: $(head -1 "$tmp/badarg.err")"
    [ -z "$(ls "$tmp/badarg" 2>/dev/null)" ] || bad "run.sh $args ran a part: $(ls "$tmp/badarg")"
    rm -rf "$tmp/badarg"
done
# The summaries of repeated runs: the median of the run medians, the range, and whether a mode's
# runs all lie on one side of the default's (made-up step times).
PYTHONPATH="$src/bench/gpu" python3 - <<'PY' || bad "summarize.py: repeated runs summarized wrongly"
import summarize as s
def run(mode, ms, f=0, peak=10 << 30):
    return {"part": "torch-medium", "model": "medium", "mode": mode, "phase": "train", "op": "train",
            "median_step_ms": ms, "peak_bytes": peak, "losses": [1.0], "_file": f,
            "median_issue_ms": ms * 0.9, "median_issue_cpu_ms": ms / 2}
rows = [run("default", x) for x in (200.0, 220.0, 210.0)]
rows += [run("cualloc-enable", x) for x in (150.0, 170.0, 160.0)]
rows += [run("cualloc-preload-cache", x, peak=p) for x, p in ((205.0, 11 << 30), (300.0, 12 << 30), (215.0, 11 << 30))]
rows += [run("expandable", 400.0, f=0), run("expandable", 100.0, f=1)]  # a later file replaces
text = "\n".join(s.torch([r for r in rows if r["_file"] == 0]))
line = lambda m: next(l for l in text.splitlines() if l.startswith("| %s |" % m))
assert "| 210.0 | 200.0-220.0 (3 runs) | 1.000 | - |" in line("default"), line("default")
assert "| 160.0 | 150.0-170.0 (3 runs) | 0.762 | yes |" in line("cualloc-enable"), line("cualloc-enable")
assert "| 215.0 | 205.0-300.0 (3 runs) | 1.024 | no: the runs overlap | 193.5 | 107.5 | 12.00 |" in line("cualloc-preload-cache"), \
    line("cualloc-preload-cache")
t = "\n".join(s.targets(rows, ["made up"]))
tl = lambda m: next(l for l in t.splitlines() if l.startswith("| %s |" % m))
assert tl("cualloc-enable").startswith("| cualloc-enable | 160.0 (3 runs) | 0.762 | met |"), tl("cualloc-enable")
assert "| **NOT met** (runs overlap the default's) |" in tl("cualloc-preload-cache"), tl("cualloc-preload-cache")
assert tl("expandable").startswith("| expandable | 100.0 | 0.476 |"), tl("expandable")
PY

# summarize.py targets over fetched folders: a later run replaces an earlier one in folder order with
# numbers compared as numbers (run10 after run9), and only searches made the same way (probe steps,
# budget) are compared: 40-step probes of two modes get a table of their own, apart from the 8-step
# searches of all five.
mkdir -p "$tmp/fetched/run9-a/torch-capacity-varlen" "$tmp/fetched/run10-b/torch-capacity-varlen"
PYTHONPATH="$src/bench/gpu" python3 - "$tmp/fetched" <<'PY' || bad "summarize.py targets: folder order or probe steps mixed up"
import json, os, subprocess, sys
root = sys.argv[1]
def cap(mode, tokens, steps, fail=None):
    return {"part": "torch-capacity-varlen", "model": "small", "mode": mode, "phase": "capacity", "op": "capacity",
            "varlen": True, "seq_min": 128, "probe_steps": steps, "budget_gb": 24.0, "budget_bytes": 24 << 30,
            "seq": 1024, "seq_step": 8, "complete": True, "non_monotonic": False,
            "largest_pass_tokens": tokens, "largest_pass": {"tokens": tokens, "batch": tokens // 1000, "seq": 1000},
            "smallest_fail": {"tokens": tokens + 8, "batch": tokens // 1000, "seq": 1008}}
def write(folder, recs):
    with open(os.path.join(root, folder, "torch-capacity-varlen", "results.jsonl"), "w") as f:
        f.write(json.dumps({"part": "torch-capacity-varlen", "op": "meta", "date": folder, "mock": False}) + "\n")
        for r in recs:
            f.write(json.dumps(r) + "\n")
modes = ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache", "cualloc-preload-cache"]
# run9: 8-step searches of every mode; run10 (later): 40-step searches of two modes, and a rerun of
# the 8-step search of cualloc-preload-cache that must replace run9's.
write("run9-a", [cap(m, 15000, 8) for m in modes])
write("run10-b", [cap("default", 12000, 40), cap("cualloc-enable", 15000, 40), cap("cualloc-preload-cache", 16000, 8)])
text = subprocess.run([sys.executable, os.path.join(os.environ["PYTHONPATH"], "summarize.py"), "targets", root],
                      stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
tables = text.split("GPT-2 small, sequence lengths drawn per step")[1:]
assert len(tables) == 2 and "each probe 8 steps" in tables[0] and "each probe 40 steps" in tables[1], text
row = lambda t, m: next(l for l in t.splitlines() if l.startswith("| %s |" % m))
# 8 steps: run10's rerun of cualloc-preload-cache wins over run9's
assert row(tables[0], "cualloc-preload-cache").startswith("| cualloc-preload-cache | 16000 (16 x 1000)"), tables[0]
# 40 steps: cualloc-enable against the 40-step default (1.25), with no 40-step expandable to compare
assert row(tables[1], "cualloc-enable") == ("| cualloc-enable | 15000 (15 x 1000) / 15008 (15 x 1008) | - | "
                                            "not measured | 1.250 | met |"), row(tables[1], "cualloc-enable")
assert row(tables[1], "expandable").startswith("| expandable | - |"), tables[1]
assert text.index("(run9-a)") < text.index("(run10-b)"), text
PY

[ "$fail" = 0 ] && echo "gpu_run_mock: ok"
exit "$fail"
