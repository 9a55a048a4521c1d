#!/usr/bin/env bash
# bench/gpu/run.sh PART[,PART...] [--mock] [--out DIR] [--build DIR] [--steps N] [--modes LIST]
#                  [--budget-gb G] [--probe-steps N] [--deadline-s S] [--pack FILE] [--repeat N]
#                  [--sample-ms MS]
# — the runs made on a GPU machine, one command each (see bench/gpu/README.md).
#
#   PART  driver-costs | property-cuda | ld-preload | driver-questions | torch-api | torch | torch-medium |
#         torch-alloc-cost | torch-capacity | torch-capacity-medium | torch-capacity-varlen |
#         torch-capacity-medium-varlen | torch-step-controls | viewer | all; several,
#         comma-separated, run in the order given within one command. The -varlen capacity parts
#         search the same way with probes whose 8 steps have sequence lengths drawn as training's
#         are (the longest first and last). torch-step-controls times GPT-2 small's training in
#         the default mode (--modes to change) as the torch part does, without the memory sampler
#         thread, and without it and deterministic algorithms, in --repeat rounds: what makes its
#         steps host-bound and their times spread between runs
#   --mock       no GPU: driver-costs and property-cuda run against the fake libcuda.so.1
#                (BUILD/tests/fakecuda), ld-preload and driver-questions only build (when nvcc
#                exists), probe the fake driver and print what they would run, the torch parts
#                run torch_train.py --dry-run per mode (the capacity parts run their whole search
#                with dry-run probes), torch-api lists its checks. Tests the script.
#   --out DIR    where results go when $OUT is not set (default ./gpu-results); $OUT wins.
#   --build DIR  the meson build folder (default: $CUALLOC_BUILD, else REPO/build).
#   --steps N    training steps per torch mode (default 30).
#   --modes LIST torch modes to run, comma-separated (default: all five, in the usual order).
#   --budget-gb G  the capacity parts' memory budget (default 24 for small, 40 for medium).
#   --probe-steps N  training steps per capacity probe (default 3; 8 in the -varlen parts). A probe
#                passes only if all N steps train: more steps give fragmentation time to build up, as
#                it does over a real job (the replay of GPT-2 small's variable-length job put
#                PyTorch's policy 1.2% above its peak after one pass and 8.1% after ten).
#   --deadline-s S the whole command ends within S seconds: each part's time limits shrink to
#                what is left (a part with under 30 s left is not started).
#   --pack FILE  afterwards, every file under the results folder goes into the tar archive FILE
#                (gzip): a GPU machine returns only a few files per command.
#   --repeat N   the torch and torch-medium parts time each mode's training N times, in N rounds
#                that go through the modes in turn (default 1): one process's step time can differ
#                from the next one's of the same mode by more than the modes differ, and rounds
#                spread the machine's changing load over all modes alike. The forced OOM and the
#                snapshots run in the first round only.
#   --sample-ms MS the memory sampler's period in the torch and torch-medium parts' timed training
#                (default 2); 0: no sampler thread, the device's used memory read after each step,
#                outside its timing.
#   TORCH_BUDGET_S, PART_BUDGET_S (environment; default 540 each): the seconds a torch part, and
#                driver-costs, property-cuda, ld-preload, driver-questions or torch-api, may take in all.
#
# Each part writes RESULTS/PART/results.jsonl (one JSON object per line; the first is a "meta"
# line with date, device and commit), RESULTS/PART/summary.md (human-readable), env.txt and
# logs.txt (every log of the part). The torch parts also write RESULTS/torch-targets.md (the
# comparison with the targets, from every torch part under RESULTS). `all` also writes
# RESULTS/summary.md (every part's summary). Every part prints `date -u`, the GPU (nvidia-smi, or
# "mock") and the commit. Exit status: 0 when every part ran and passed (a part with no GPU in
# --mock mode counts as passed), 1 otherwise (a torch part whose budget ran out before all its runs
# says "incomplete").
set -u
set -o pipefail

# usage: the header above on stderr, exit 2 (a bad command line); help: the same on stdout, exit 0.
header() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
usage() { header >&2; exit 2; }
help() { header; exit 0; }

[ $# -ge 1 ] || usage
case $1 in -h|--help) help ;; esac
PART=$1
shift
MOCK=0
OUT_ARG=
BUILD=${CUALLOC_BUILD:-}
STEPS=30
MODES_ARG=
MODES_SEEN=0
BUDGET_GB=
PROBE_STEPS=
DEADLINE_S=
PACK=
REPEAT=1
SAMPLE_MS=2
while [ $# -gt 0 ]; do
    case $1 in
        --mock) MOCK=1 ;;
        --out) [ $# -ge 2 ] || usage; OUT_ARG=$2; shift ;;
        --build) [ $# -ge 2 ] || usage; BUILD=$2; shift ;;
        --steps) [ $# -ge 2 ] || usage; STEPS=$2; shift ;;
        --modes) [ $# -ge 2 ] || usage; MODES_ARG=$(echo "$2" | tr ',' ' '); MODES_SEEN=1; shift ;;
        --budget-gb) [ $# -ge 2 ] || usage; BUDGET_GB=$2; shift ;;
        --probe-steps) [ $# -ge 2 ] || usage; PROBE_STEPS=$2; shift ;;
        --deadline-s) [ $# -ge 2 ] || usage; DEADLINE_S=$2; shift ;;
        --pack) [ $# -ge 2 ] || usage; PACK=$2; shift ;;
        --repeat) [ $# -ge 2 ] || usage; REPEAT=$2; shift ;;
        --sample-ms) [ $# -ge 2 ] || usage; SAMPLE_MS=$2; shift ;;
        -h|--help) help ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
done
PARTS="driver-costs property-cuda ld-preload driver-questions torch-api torch torch-medium torch-alloc-cost torch-capacity torch-capacity-medium \
torch-capacity-varlen torch-capacity-medium-varlen torch-step-controls viewer"
ALL_TORCH_MODES="default expandable cualloc-enable cualloc-preload-nocache cualloc-preload-cache"
if [ "$PART" = all ]; then
    RUN_PARTS=$PARTS
else
    RUN_PARTS=$(echo "$PART" | tr ',' ' ')
    # A list of no part (",") ran nothing and exited 0.
    [ -n "$(echo $RUN_PARTS)" ] || { echo "run.sh: no part named in '$PART'" >&2; usage; }
    for p in $RUN_PARTS; do
        case " $PARTS " in *" $p "*) ;; *) echo "run.sh: unknown part '$p'" >&2; usage ;; esac
    done
fi
case $DEADLINE_S in ''|*[!0-9]*) [ -z "$DEADLINE_S" ] || { echo "run.sh: --deadline-s takes whole seconds" >&2; usage; } ;; esac
case $REPEAT in ''|*[!0-9]*|0) echo "run.sh: --repeat takes a whole number of rounds, 1 or more" >&2; usage ;; esac
[[ $SAMPLE_MS =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || { echo "run.sh: --sample-ms takes milliseconds, 0 or more (not '$SAMPLE_MS')" >&2; usage; }
case $PROBE_STEPS in ''|*[!0-9]*|0) [ -z "$PROBE_STEPS" ] || { echo "run.sh: --probe-steps takes a whole number of steps, 1 or more" >&2; usage; } ;; esac
# Checked here, before any part starts: torch_train.py refused a bad --steps or --budget-gb only
# when each of its jobs started, every mode's job failing in turn; an empty --modes ran all five.
case ${PART_BUDGET_S:-540} in ''|*[!0-9]*) echo "run.sh: PART_BUDGET_S takes whole seconds (not '$PART_BUDGET_S')" >&2; usage ;; esac
case $STEPS in ''|*[!0-9]*|0) echo "run.sh: --steps takes a whole number of steps, 1 or more (not '$STEPS')" >&2; usage ;; esac
if [ -n "$BUDGET_GB" ] && ! { [[ $BUDGET_GB =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v g="$BUDGET_GB" 'BEGIN { exit !(g > 0) }'; }; then
    echo "run.sh: --budget-gb takes a number of GB above 0 (not '$BUDGET_GB')" >&2; usage
fi
if [ "$MODES_SEEN" = 1 ] && [ -z "$(echo $MODES_ARG)" ]; then
    echo "run.sh: --modes names no mode (one or more of: $ALL_TORCH_MODES, comma-separated)" >&2; usage
fi
T_COMMAND=$(date +%s)
for m in $MODES_ARG; do
    case " $ALL_TORCH_MODES " in *" $m "*) ;; *) echo "run.sh: unknown torch mode '$m'" >&2; usage ;; esac
done

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "run.sh: no build folder '$BUILD' (meson setup build && meson compile -C build)" >&2; exit 2; }
RESULTS=${OUT:-${OUT_ARG:-./gpu-results}}
mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
PY=${PYTHON:-python3}
FAKECUDA=$BUILD/tests/fakecuda
LIBCUALLOC=$BUILD/src/libcualloc.so
GPU_LIBS=$BUILD/gpu-libs  # bench/gpu/carry-libs.sh: libraries BUILD's programs need and a GPU machine may lack

# Estimated device time per part on an H100 (minutes), printed before each part.
estimate() {
    case $1 in
        driver-costs) echo "about 1 minute" ;;
        property-cuda) echo "about 1-3 minutes" ;;
        ld-preload) echo "about 1-2 minutes (two nvcc builds, six runs)" ;;
        driver-questions) echo "about 1 minute (one small nvcc build, twenty-two processes of about a second each, at most 30 s each)" ;;
        torch-api) echo "1-2 minutes (one PyTorch process under cualloc_torch.enable(), torch.compile's first compile included, then allocview on its trace)" ;;
        torch) echo "about 4-7 minutes (5 modes x (training run + forced-OOM run) + 2 snapshot runs, each a fresh process; capped at 9 minutes)" ;;
        torch-medium) echo "about 2-4 minutes (5 GPT-2 medium training runs; capped at 9 minutes)" ;;
        torch-alloc-cost) echo "about 1 minute (5 short processes)" ;;
        torch-capacity) echo "about 4-8 minutes (5 modes x about 5-10 probes of ~10 s, each a fresh process; capped at 9 minutes)" ;;
        torch-capacity-medium) echo "about 5-9 minutes (5 modes x about 5-10 probes of ~15 s; capped at 9 minutes)" ;;
        torch-capacity-varlen) echo "about 5-9 minutes (5 modes x about 5-10 probes of ~12-20 s; capped at 9 minutes)" ;;
        torch-capacity-medium-varlen) echo "about 6-9 minutes (5 modes x about 5-10 probes of ~15-25 s; capped at 9 minutes)" ;;
        torch-step-controls) echo "about 1.5 minutes a round (3 GPT-2 small training runs of ~25 s; capped at 9 minutes)" ;;
        viewer) echo "under a minute (CPU only: traces on the sim device, exports, PyTorch's viewer code)" ;;
    esac
}

commit_of_tree() {
    if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1; then
        local c d
        c=$(git -C "$ROOT" rev-parse HEAD)
        d=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
        [ "$d" -gt 0 ] && c="$c-dirty"
        echo "$c"
    else
        echo "no-git"
    fi
}
commit_of_build() { cat "$BUILD/bench/gpu_commit.txt" 2>/dev/null || echo unknown; }

# nvidia-smi under a bound: a wedged driver can leave it waiting for ever, and the part's results
# (with --pack, every part's) would then never be written.
gpu_present() {
    command -v nvidia-smi >/dev/null 2>&1 && timeout 30 nvidia-smi -L >/dev/null 2>&1
}

json_str() { "$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

# header PART: prints date, device, commit; writes them to PART/env.txt and the meta line.
header() {
    local part=$1 dir=$RESULTS/$1 date device tree build
    date=$(date -u)
    if [ "$MOCK" = 1 ]; then
        device="mock"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        device=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 ||
                 echo "nvidia-smi: failed or timed out (30 s)")
    else
        device="nvidia-smi: not found"
    fi
    tree=$(commit_of_tree)
    build=$(commit_of_build)
    {
        echo "== $part =="
        echo "date: $date"
        echo "device:"
        echo "$device" | sed 's/^/  /'
        echo "commit (tree): $tree"
        echo "commit (build): $build"
        echo "mock: $MOCK"
        echo "estimated: $(estimate "$part")"
    } | tee "$dir/env.txt"
    printf '{"part":"%s","op":"meta","date":%s,"device":%s,"commit_tree":"%s","commit_build":"%s","mock":%s}\n' \
        "$part" "$(json_str "$date")" "$(json_str "$device")" "$tree" "$build" \
        "$([ "$MOCK" = 1 ] && echo true || echo false)" >"$dir/results.jsonl"
}

# status_line PART STATUS RC DETAIL: the part's final JSON line.
status_line() {
    printf '{"part":"%s","op":"status","status":"%s","rc":%s,"detail":%s}\n' "$1" "$2" "$3" "$(json_str "$4")" \
        >>"$RESULTS/$1/results.jsonl"
}

summarize() {
    "$PY" "$HERE/summarize.py" "$1" "$RESULTS/$1/results.jsonl" >"$RESULTS/$1/summary.md" || {
        echo "run.sh: summarize.py $1 failed" >&2
        return 1
    }
    cat "$RESULTS/$1/summary.md"
}

need() {
    [ -e "$1" ] || { echo "run.sh: $1 is missing: build first (meson compile -C $BUILD)" >&2; return 1; }
}

# build_prog PROGRAM ARGS...: runs a program of BUILD with the carried libraries (GPU_LIBS) found
# first. Only BUILD's own programs: PyTorch and nvcc's programs keep the machine's libraries.
build_prog() {
    if [ -d "$GPU_LIBS" ]; then
        LD_LIBRARY_PATH="$GPU_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
    else
        "$@"
    fi
}

# starts PROGRAM: PROGRAM (of BUILD) can start here, its shared libraries found; else says which
# are missing and how to bring them.
starts() {
    local out missing
    out=$(build_prog "$1" --version 2>&1) && return 0
    missing=$(echo "$out" | sed -n 's/.*error while loading shared libraries: \([^:]*\):.*/\1/p' | head -1)
    if [ -n "$missing" ]; then
        echo "run.sh: $1 cannot start here: $missing is missing. On the build machine run" \
            "bench/gpu/carry-libs.sh $BUILD (it copies the libraries into $GPU_LIBS), then copy the build folder again" >&2
    else
        echo "run.sh: $1 --version failed: $out" >&2
    fi
    return 1
}

# command_left: the seconds left of --deadline-s (set it before calling).
command_left() { echo $((DEADLINE_S - ($(date +%s) - T_COMMAND))); }

# limit SECONDS: SECONDS, or less when --deadline-s or the part's budget (PART_END, set by run_part
# for the parts without a budget of their own) leaves less; 10 s are kept for the summaries.
limit() {
    local want=$1 left
    if [ -n "$DEADLINE_S" ]; then
        left=$(($(command_left) - 10))
        [ "$left" -lt "$want" ] && want=$left
    fi
    if [ -n "$PART_END" ]; then
        left=$((PART_END - $(date +%s) - 10))
        [ "$left" -lt "$want" ] && want=$left
    fi
    [ "$want" -lt 1 ] && want=1
    echo "$want"
}

# ------------------------------------------------------------------------------------ parts

part_driver_costs() {
    local dir=$RESULTS/driver-costs rc
    need "$BUILD/bench/driver_costs" || return 1
    local tmp=$dir/driver_costs.jsonl
    if [ "$MOCK" = 1 ]; then
        echo "run: (fake driver) LD_LIBRARY_PATH=$FAKECUDA CUALLOC_CONF=sim_memory_mb:4096 driver_costs"
        LD_LIBRARY_PATH=$FAKECUDA CUALLOC_CONF=sim_memory_mb:4096 timeout 300 \
            "$BUILD/bench/driver_costs" --json "$tmp" >"$dir/log.txt" 2>&1
    else
        timeout "$(limit 540)" "$BUILD/bench/driver_costs" --json "$tmp" >"$dir/log.txt" 2>&1
    fi
    rc=$?
    cat "$dir/log.txt"
    [ -f "$tmp" ] && cat "$tmp" >>"$dir/results.jsonl" && rm -f "$tmp"
    case $rc in
        0) status_line driver-costs pass 0 "measured" ;;
        77) status_line driver-costs skipped 77 "no driver or device" ;;
        *) status_line driver-costs fail "$rc" "driver_costs exited $rc" ;;
    esac
    summarize driver-costs
    [ "$rc" = 0 ]
}

part_property_cuda() {
    local dir=$RESULTS/property-cuda rc
    need "$BUILD/bench/property_cuda" || return 1
    local tmp=$dir/property_cuda.jsonl
    rm -f "$tmp"
    if [ "$MOCK" = 1 ]; then
        echo "run: (fake driver, host-backed) property_cuda --ops 300"
        LD_LIBRARY_PATH=$FAKECUDA CUALLOC_CONF=driver:cuda,sim_host_backed:1,sim_memory_mb:2048 timeout 300 \
            "$BUILD/bench/property_cuda" --ops 300 --json "$tmp" >"$dir/log.txt" 2>&1
    else
        CUALLOC_CONF=driver:cuda timeout "$(limit 540)" "$BUILD/bench/property_cuda" --json "$tmp" >"$dir/log.txt" 2>&1
    fi
    rc=$?
    cat "$dir/log.txt"
    [ -f "$tmp" ] && cat "$tmp" >>"$dir/results.jsonl" && rm -f "$tmp"
    case $rc in
        0) status_line property-cuda pass 0 "every variant passed" ;;
        77) status_line property-cuda skipped 77 "no driver or device" ;;
        124) status_line property-cuda fail 124 "timed out" ;;
        *) status_line property-cuda fail "$rc" "property_cuda exited $rc (see log.txt: the failed expectation)" ;;
    esac
    summarize property-cuda
    [ "$rc" = 0 ]
}

find_nvcc() {
    if command -v nvcc >/dev/null 2>&1; then command -v nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc
    fi
}

# cudart_dir_of NVCC: where the shared libcudart lies beside this nvcc (toolkit installs: lib64;
# others: lib or targets/<arch>/lib): a shared build's rpath. Empty when not found.
cudart_dir_of() {
    local d
    for d in lib64 lib "targets/$(uname -m)-linux/lib"; do
        if ls "$(dirname "$1")/../$d"/libcudart.so* >/dev/null 2>&1; then
            (cd "$(dirname "$1")/../$d" && pwd)
            return
        fi
    done
}

# One run of a preload_kernels build: appends its JSON line. run_prog KIND MODE PROG [ENV...]
# At most 80 s each, and within the part's budget: two builds of up to 150 s and six runs of up to
# 80 s would be 13 minutes, more than one command's 10.
run_prog() {
    local kind=$1 mode=$2 prog=$3 dir=$RESULTS/ld-preload
    shift 3
    local log=$dir/run-$kind-$mode.log rc t0 t1 result interpose
    echo "run: $* $prog"
    t0=$(date +%s.%N)
    env "$@" timeout "$(limit 80)" "$prog" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    result=$(sed -n 's/^preload_kernels: RESULT //p' "$log" | tail -1)
    [ -n "$result" ] || result=null
    interpose=$(grep -c '^cualloc: interpose:' "$log")
    local lookups
    lookups=$(grep -o 'cuGetProcAddress("[A-Za-z_0-9]*"' "$log" | sed 's/.*("//; s/"$//' | sort -u | tr '\n' ' ')
    printf '{"part":"ld-preload","op":"%s","cudart":"%s","mode":"%s","rc":%d,"pass":%s,"wall_s":%s,"interpose_log_lines":%d,"lookups_answered":%s,"result":%s,"cualloc_summary":%s}\n' \
        "${RUN_OP:-run}" "$kind" "$mode" "$rc" "$([ "$rc" = 0 ] && echo true || echo false)" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')" "$interpose" "$(json_str "$lookups")" \
        "$result" "$(json_str "$(grep -A22 '^cualloc stats, device' "$log" | head -46)")" >>"$dir/results.jsonl"
    tail -5 "$log"
    # With libcualloc.so preloaded, cualloc must have served the program's allocations.
    if [ "$rc" = 0 ] && [ "$mode" != plain ] && ! echo "$result" | grep -q '"cualloc_num_allocs":[1-9]'; then
        echo "run.sh: FAIL: $kind $mode: the program passed but cualloc served none of its allocations"
        return 1
    fi
    # cualloc hands S's memory to T once S is seen past its free: in the hand-over rounds, every
    # round but the first (tests/test_streams.c, test_handover_rounds, on the sim).
    if [ "$rc" = 0 ] && [ "$mode" != plain ] && echo "$result" | grep -q '"handover_rounds":[1-9][0-9]' &&
        echo "$result" | grep -q '"handover_reuses":0,'; then
        echo "run.sh: FAIL: $kind $mode: in the hand-over rounds T never got memory S had freed"
        return 1
    fi
    return "$rc"
}

part_ld_preload() {
    local dir=$RESULTS/ld-preload nvcc bin fail=0
    need "$LIBCUALLOC" || return 1
    nvcc=$(find_nvcc)
    bin=$(mktemp -d "${TMPDIR:-/tmp}/cualloc-preload.XXXXXX") || return 1
    # shellcheck disable=SC2064
    trap "rm -rf '$bin'" RETURN
    local kinds="static shared" kind
    # shellcheck disable=SC2054
    local arch=(-gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75)
    if [ -n "$nvcc" ]; then
        local cudart_dir
        cudart_dir=$(cudart_dir_of "$nvcc")
        for kind in $kinds; do
            echo "build: $nvcc -O2 -cudart $kind ${arch[*]} -o preload_kernels_$kind preload_kernels.cu -ldl"
            # Bounded, as the runs are: a hung compiler must not take the part past one device command.
            if ! timeout "$(limit 150)" "$nvcc" -O2 -cudart "$kind" "${arch[@]}" -o "$bin/preload_kernels_$kind" \
                "$HERE/preload_kernels.cu" -ldl -Xlinker "-rpath=$cudart_dir" >"$dir/build-$kind.log" 2>&1; then
                cat "$dir/build-$kind.log"
                printf '{"part":"ld-preload","op":"build","cudart":"%s","ok":false}\n' "$kind" >>"$dir/results.jsonl"
                fail=1
            else
                printf '{"part":"ld-preload","op":"build","cudart":"%s","ok":true}\n' "$kind" >>"$dir/results.jsonl"
            fi
        done
    else
        echo "run.sh: no nvcc: the programs cannot be built here"
    fi
    local can_run=1
    if [ "$MOCK" = 1 ] || ! gpu_present || [ -z "$nvcc" ]; then can_run=0; fi
    local conf="summary:1"
    for kind in $kinds; do
        local prog=$bin/preload_kernels_$kind
        if [ "$can_run" = 1 ] && [ -x "$prog" ]; then
            run_prog "$kind" plain "$prog" -u LD_PRELOAD || fail=1
            run_prog "$kind" preload "$prog" LD_PRELOAD="$LIBCUALLOC" CUALLOC_CONF="$conf" || fail=1
            run_prog "$kind" preload-log "$prog" LD_PRELOAD="$LIBCUALLOC" CUALLOC_CONF="$conf" CUALLOC_LOG_INTERPOSE=1 || fail=1
        else
            local why="mock"
            [ "$MOCK" = 1 ] || why="no GPU or no nvcc"
            for mode in plain preload preload-log; do
                local envs=""
                case $mode in
                    preload) envs="LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=$conf " ;;
                    preload-log) envs="LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=$conf CUALLOC_LOG_INTERPOSE=1 " ;;
                esac
                echo "would run ($why): ${envs}preload_kernels_$kind"
                printf '{"part":"ld-preload","op":"run","cudart":"%s","mode":"%s","status":"not-run","reason":"%s","command":%s}\n' \
                    "$kind" "$mode" "$why" "$(json_str "${envs}preload_kernels_$kind")" >>"$dir/results.jsonl"
            done
        fi
    done
    if [ "$MOCK" = 1 ] && [ -n "$nvcc" ]; then
        # The script's own run path, against the fake driver: the program stops at its first
        # runtime call (the fake is older than the runtime), after the runtime's driver look-ups,
        # which cualloc must have answered.
        for kind in $kinds; do
            [ -x "$bin/preload_kernels_$kind" ] || continue
            RUN_OP=probe run_prog "$kind" fake-driver "$bin/preload_kernels_$kind" LD_LIBRARY_PATH="$FAKECUDA" \
                LD_PRELOAD="$LIBCUALLOC" CUALLOC_CONF=driver:cuda,sim_host_backed:1,sim_memory_mb:256 CUALLOC_LOG_INTERPOSE=1
            if ! grep -q '"op":"probe","cudart":"'"$kind"'".*"lookups_answered":"[^"]*cuMemAlloc ' "$dir/results.jsonl"; then
                echo "run.sh: FAIL: with the fake driver, cualloc did not answer the $kind runtime's cuMemAlloc look-up"
                fail=1
            fi
        done
    fi
    if [ "$can_run" = 1 ]; then
        [ "$fail" = 0 ] && status_line ld-preload pass 0 "every run passed" || status_line ld-preload fail 1 "see logs.txt (run-*.log)"
    elif [ "$MOCK" = 1 ]; then
        [ "$fail" = 0 ] && status_line ld-preload mock 0 "built: $([ -n "$nvcc" ] && echo yes || echo no); not run" \
            || status_line ld-preload fail 1 "nvcc build failed"
    else
        status_line ld-preload skipped 77 "no GPU or no nvcc"
        fail=1
    fi
    summarize ld-preload
    [ "$fail" = 0 ]
}

# ------------------------------------------------------------------ driver-questions
# driver_questions.cu asks the real driver what the fake driver and the sim cannot answer (see
# that file and the README). Each check runs in a process of its own, once without cualloc (CUDA's
# own answer: the reference) and once under LD_PRELOAD; device_reset last, since a reset could
# leave the device unusable for whatever came after it. A process is bounded by 30 s: the
# twenty take under a second each on an H100. capture_vs_misses and its own-thread variant run a
# third time under the preload with classic segments (cuMemAlloc'd, released with cuMemFree), whose
# driver calls differ, and so does legacy_free_nonblocking, whose classic path differs.
DQ_CHECKS="legacy_lookup_flags stream_get_ctx_under_capture meminfo_counted_once capture_vs_misses
capture_vs_misses_thread_local capture_vs_misses_relaxed capture_vs_misses_own_thread event_idle_at_once
cudafree_blocking_streams legacy_free_nonblocking device_reset"
DQ_CLASSIC_CHECKS="capture_vs_misses capture_vs_misses_own_thread legacy_free_nonblocking"

# dq_modes CHECK: the processes a check runs in.
dq_modes() {
    case " $DQ_CLASSIC_CHECKS " in
        *" $1 "*) echo "plain preload preload-classic" ;;
        *) echo "plain preload" ;;
    esac
}

# dq_env MODE: the environment of a driver-questions process, as arguments of env(1).
dq_env() {
    case $1 in
        plain) echo "-u LD_PRELOAD -u CUALLOC_CONF" ;;
        preload) echo "LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=summary:1" ;;
        preload-classic) echo "LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=summary:1,expandable_segments:False" ;;
    esac
}

# dq_run CHECK MODE PROG [ENV...]: one process; appends its record (op "check", or $RUN_OP) with the
# program's RESULT line as "result" and its verdict as "pass" (null when the line is missing: then
# the log's tail is kept). The log goes to run-CHECK-MODE.log.
dq_run() {
    local check=$1 mode=$2 prog=$3 dir=$RESULTS/driver-questions
    shift 3
    local log=$dir/run-$check-$mode.log rc t0 t1
    echo "run: $* driver_questions --check $check"
    t0=$(date +%s.%N)
    env "$@" timeout "$(limit 30)" "$prog" --check "$check" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    "$PY" - "$log" "$check" "$mode" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')" \
        "${RUN_OP:-check}" >>"$dir/results.jsonl" <<'PY'
import json, sys
log, check, mode, rc, wall, op = sys.argv[1:7]
text = open(log, errors="replace").read()
res = None
for line in text.splitlines():
    if line.startswith("driver_questions: RESULT "):
        try:
            res = json.loads(line[len("driver_questions: RESULT "):])
        except ValueError:
            pass
rec = {"part": "driver-questions", "op": op, "check": check, "mode": mode, "rc": int(rc), "wall_s": float(wall),
       "pass": res.get("pass") if res else None, "result": res}
if res is None:
    rec["log_tail"] = "\n".join(text.splitlines()[-15:])
print(json.dumps(rec))
PY
    grep '^driver_questions: RESULT' "$log" | cut -c1-400
    [ "$rc" = 0 ] || echo "run.sh: driver-questions $check ($mode) exited $rc (see run-$check-$mode.log in logs.txt)"
}

# dq_verdict: the part's status and detail on one line ("pass|...", "fail|...", "mock|...",
# "skipped|..."), from summarize.py, which also appends the comparison of capture_vs_misses with
# and without cualloc (op "compare"). See dq_verdict in summarize.py for the rules.
dq_verdict() {
    "$PY" "$HERE/summarize.py" driver-questions-verdict "$RESULTS/driver-questions/results.jsonl" "$MOCK" "$FAKECUDA"
}

part_driver_questions() {
    local dir=$RESULTS/driver-questions nvcc bin prog check mode fail=0
    need "$LIBCUALLOC" || return 1
    nvcc=$(find_nvcc)
    bin=$(mktemp -d "${TMPDIR:-/tmp}/cualloc-dq.XXXXXX") || return 1
    # shellcheck disable=SC2064
    trap "rm -rf '$bin'" RETURN
    prog=$bin/driver_questions
    # shellcheck disable=SC2054
    local arch=(-gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75)
    if [ -n "$nvcc" ]; then
        local cudart_dir
        cudart_dir=$(cudart_dir_of "$nvcc")
        echo "build: $nvcc -O2 -cudart shared ${arch[*]} -o driver_questions driver_questions.cu -ldl -lpthread"
        if timeout "$(limit 150)" "$nvcc" -O2 -cudart shared "${arch[@]}" -o "$prog" "$HERE/driver_questions.cu" \
            -ldl -lpthread -Xlinker "-rpath=$cudart_dir" >"$dir/build.log" 2>&1; then
            printf '{"part":"driver-questions","op":"build","cudart":"shared","ok":true}\n' >>"$dir/results.jsonl"
        else
            cat "$dir/build.log"
            printf '{"part":"driver-questions","op":"build","cudart":"shared","ok":false}\n' >>"$dir/results.jsonl"
            fail=1
        fi
    else
        echo "run.sh: no nvcc: driver_questions.cu cannot be built here"
    fi
    local can_run=1
    if [ "$MOCK" = 1 ] || ! gpu_present || [ ! -x "$prog" ]; then can_run=0; fi
    for check in $DQ_CHECKS; do
        for mode in $(dq_modes "$check"); do
            if [ "$can_run" = 1 ]; then
                # shellcheck disable=SC2046
                dq_run "$check" "$mode" "$prog" $(dq_env "$mode")
            else
                local why="mock" envs=""
                [ "$MOCK" = 1 ] || why="no GPU or no nvcc"
                [ "$mode" = plain ] || envs="$(dq_env "$mode") "
                echo "would run ($why): ${envs}driver_questions --check $check"
                printf '{"part":"driver-questions","op":"check","check":"%s","mode":"%s","status":"not-run","reason":"%s","command":%s}\n' \
                    "$check" "$mode" "$why" "$(json_str "${envs}driver_questions --check $check")" >>"$dir/results.jsonl"
            fi
        done
    done
    if [ "$MOCK" = 1 ] && [ -x "$prog" ]; then
        # The program's driver look-up against the fake driver, which legacy_lookup_flags needs
        # nothing else for (the runtime stops at once: the fake is older than it): it must reach
        # the driver's own cuGetProcAddress, also past cualloc's dlsym.
        for mode in plain preload; do
            # shellcheck disable=SC2046
            RUN_OP=probe dq_run legacy_lookup_flags "$mode" "$prog" $(dq_env "$mode") LD_LIBRARY_PATH="$FAKECUDA" \
                CUALLOC_CONF=driver:cuda,sim_host_backed:1,sim_memory_mb:256
        done
    fi
    local verdict status
    verdict=$(dq_verdict) || verdict="fail|the verdict could not be made"
    status=${verdict%%|*}
    [ "$fail" = 1 ] && status=fail && verdict="fail|nvcc build failed; ${verdict#*|}"
    echo "driver-questions: $status: ${verdict#*|}"
    case $status in
        pass) status_line driver-questions pass 0 "${verdict#*|}" ;;
        mock) status_line driver-questions mock 0 "built: $([ -x "$prog" ] && echo yes || echo no); ${verdict#*|}" ;;
        skipped) status_line driver-questions skipped 77 "no GPU or no nvcc"; fail=1 ;;
        *) status_line driver-questions fail 1 "${verdict#*|}"; fail=1 ;;
    esac
    summarize driver-questions
    [ "$fail" = 0 ]
}

# What real PyTorch does under cualloc_torch.enable(): torch_api.py's checks (the stand-ins, the graph
# guard, the OOM, cuDNN's benchmark mode, ...) in one process whose job is recorded (trace:); then
# allocview must read the trace and find the optimizer's step marks in it ("step 1" .. "step 5").
part_torch_api() {
    local dir=$RESULTS/torch-api av=$BUILD/tools/allocview/allocview rc marks fail=0
    local trace=$dir/api.trace log=$dir/run-torch-api.log
    need "$BUILD/src/libcualloc_torch.so" || return 1
    if [ "$MOCK" = 1 ] || ! gpu_present; then
        local why="mock"
        [ "$MOCK" = 1 ] || why="no GPU"
        echo "would run ($why): CUALLOC_CONF=summary:1,trace:$trace $PY torch_api.py --build $BUILD"
        "$PY" "$HERE/torch_api.py" --build "$BUILD" --dry-run | tee "$log"
        rc=${PIPESTATUS[0]}
        sed -n 's/^torch_api: PLAN //p' "$log" | "$PY" -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); r.update(part="torch-api", op="check", status="not-run", reason=sys.argv[1]); print(json.dumps(r))' \
            "$why" >>"$dir/results.jsonl"
        if [ "$rc" = 0 ] && [ "$MOCK" = 1 ]; then
            status_line torch-api mock 0 "checks listed, not run"
        else
            status_line torch-api "$([ "$rc" = 0 ] && echo skipped || echo fail)" "$([ "$rc" = 0 ] && echo 77 || echo "$rc")" \
                "not run ($why); torch_api.py --dry-run exited $rc"
            fail=1
        fi
        summarize torch-api
        [ "$fail" = 0 ]
        return
    fi
    rm -f "$trace"
    # shellcheck disable=SC2046
    env $(mode_env torch-api cualloc-enable train) CUALLOC_CONF="summary:1,trace:$trace" PYTHONUNBUFFERED=1 \
        timeout "$(limit 240)" "$PY" "$HERE/torch_api.py" --build "$BUILD" >"$log" 2>&1
    rc=$?
    cat "$log"
    sed -n 's/^torch_api: RESULT //p' "$log" |
        "$PY" -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); r.update(part="torch-api", op="check"); print(json.dumps(r))' >>"$dir/results.jsonl"
    if [ -s "$trace" ] && starts "$av"; then
        build_prog "$av" report --no-color "$trace" >"$dir/report.log" 2>&1 || fail=1
        marks=$(build_prog "$av" dump "$trace" 2>>"$dir/report.log" | grep -c ' mark .*"step [0-9]*"')
    else
        echo "run.sh: torch-api: no trace at $trace, or allocview cannot start" | tee -a "$log"
        marks=0
        fail=1
    fi
    printf '{"part":"torch-api","op":"trace","step_marks":%d,"trace_bytes":%d}\n' "$marks" \
        "$(stat -c %s "$trace" 2>/dev/null || echo 0)" >>"$dir/results.jsonl"
    rm -f "$trace"
    [ "$marks" -ge 5 ] || { echo "run.sh: torch-api: $marks step marks in the trace, wanting 5 or more"; fail=1; }
    if [ "$rc" = 0 ] && [ "$fail" = 0 ]; then
        status_line torch-api pass 0 "every check passed; $marks step marks in the trace"
    else
        status_line torch-api fail "$rc" "torch_api.py exited $rc; $marks step marks in the trace (see logs.txt)"
        fail=1
    fi
    summarize torch-api
    [ "$fail" = 0 ]
}

TORCH_MODES=${MODES_ARG:-$ALL_TORCH_MODES}
TORCH_CAP_GB=16
# oom_trace PART MODE: the trace cualloc records of MODE's forced OOM (oom_report reads it).
oom_trace() { echo "$RESULTS/$1/$2-oom.trace"; }

# mode_env PART MODE PHASE: the environment of a torch mode, as arguments of env(1). Variables a mode
# must not have are unset (-u), not emptied: PyTorch treats PYTORCH_NO_CUDA_MEMORY_CACHING as set
# whatever its value. PYTORCH_ALLOC_CONF is unset in every mode: PyTorch reads its allocator
# settings from it too, so one left in the environment would configure every mode alike. Only
# phase oom caps memory through CUALLOC_CONF; the capacity parts enforce their budget with a
# ballast instead, the same way for every mode.
mode_env() {
    local part=$1 mode=$2 phase=$3 cap=""
    local unset_all="-u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_NO_CUDA_MEMORY_CACHING -u LD_PRELOAD"
    unset_all="$unset_all -u CUALLOC_CONF"
    # The forced OOM under cualloc is recorded (oom_report reads the trace).
    [ "$phase" = oom ] && cap=",max_memory_mb:$((TORCH_CAP_GB * 1024)),trace:$(oom_trace "$part" "$mode")"
    case $mode in
        default) echo "$unset_all" ;;
        expandable) echo "$unset_all PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" ;;
        cualloc-enable) echo "$unset_all CUALLOC_CONF=summary:1$cap" ;;
        cualloc-preload-nocache) echo "$unset_all PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=summary:1$cap" ;;
        cualloc-preload-cache) echo "$unset_all LD_PRELOAD=$LIBCUALLOC CUALLOC_CONF=summary:1$cap" ;;
    esac
}

# Every torch part must end within one command's 10 minutes: each process gets at most what is
# left of TORCH_BUDGET_S (default 540 s) from the part's start (T_PART, set by torch_start).
torch_start() { T_PART=$(date +%s); PART_BUDGET=$(limit "${TORCH_BUDGET_S:-540}"); TORCH_FAIL=0; TORCH_CUT=0; }
torch_left() { echo $((PART_BUDGET - ($(date +%s) - T_PART))); }

# torch_job PART MODE PHASE LIMIT [ARGS...]: one torch_train.py process with the mode's environment
# and at most LIMIT seconds (less when the part's budget has less left), its output in
# PART/MODE-PHASE.log. An exit other than 0 is recorded as an "error" line and sets TORCH_FAIL; no
# time left, as an "error" line too, counted in TORCH_CUT (the part is then incomplete, not
# failed: what ran is measured). In --mock the process is a --dry-run.
torch_job() {
    local part=$1 mode=$2 phase=$3 limit=$4 dir=$RESULTS/$1 rc left round=${ROUND:-1}
    shift 4
    local log=$dir/$mode-$phase${JOB_TAG:+-$JOB_TAG}.log dry=()
    [ "$round" -gt 1 ] && log=$dir/$mode-$phase${JOB_TAG:+-$JOB_TAG}-round$round.log
    [ "$MOCK" = 1 ] && dry=(--dry-run)
    left=$(torch_left)
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then
        echo "run.sh: $part $mode $phase: no time left in the part's budget (${PART_BUDGET} s); not run"
        printf '{"part":"%s","op":"error","mode":"%s","phase":"%s","label":"%s","rc":124,"log_tail":"not run: the part budget of %s s was spent"}\n' \
            "$part" "$mode" "$phase" "${JOB_TAG:-}" "$PART_BUDGET" >>"$dir/results.jsonl"
        TORCH_CUT=$((TORCH_CUT + 1))
        return 1
    fi
    # shellcheck disable=SC2046
    echo "run: $(mode_env "$part" "$mode" "$phase") $PY torch_train.py --mode $mode --phase $phase --round $round $* ${dry[*]}"
    # shellcheck disable=SC2046
    env $(mode_env "$part" "$mode" "$phase") timeout "$limit" "$PY" "$HERE/torch_train.py" --part "$part" --mode "$mode" \
        --phase "$phase" --round "$round" --repo "$ROOT" --build "$BUILD" --out "$dir/results.jsonl" "${dry[@]}" "$@" >"$log" 2>&1
    rc=$?
    tail -4 "$log"
    if [ "$rc" != 0 ]; then
        echo "run.sh: $part $mode $phase exited $rc (see $(basename "$log") in $dir/logs.txt)"
        printf '{"part":"%s","op":"error","mode":"%s","phase":"%s","label":"%s","round":%d,"rc":%d,"log_tail":%s}\n' \
            "$part" "$mode" "$phase" "${JOB_TAG:-}" "$round" "$rc" "$(json_str "$(tail -25 "$log")")" >>"$dir/results.jsonl"
        TORCH_FAIL=1
        return 1
    fi
}

# oom_report PART MODE: what allocview says of the trace cualloc recorded in MODE's forced-OOM run
# (PART/MODE-oom.trace, with PyTorch's Python frames): the report's text among the logs
# (MODE-oom-report.log) and an "oom-report" line in results.jsonl (whether it found the OOM, its
# rules, the failing call site); the trace itself is removed (the files that come back from the GPU
# machine are few). In --mock a dry run records nothing: the demo's OOM on a 4 GiB sim device
# stands in, so that the pipeline is what the mock tests.
oom_report() {
    local part=$1 mode=$2 dir=$RESULTS/$1 av=$BUILD/tools/allocview/allocview trace
    trace=$(oom_trace "$part" "$mode")
    if [ "$MOCK" = 1 ] && [ ! -s "$trace" ]; then
        CUALLOC_CONF=trace:$trace,trace_stack_depth:8 build_prog "$BUILD/tools/cualloc-demo" --steps 3 --quiet \
            --memory-mb 4096 >/dev/null 2>&1
    fi
    if [ ! -s "$trace" ]; then
        echo "run.sh: $part $mode: no trace of the forced OOM ($trace)"
        printf '{"part":"%s","op":"oom-report","mode":"%s","trace":false}\n' "$part" "$mode" >>"$dir/results.jsonl"
        TORCH_FAIL=1
        return 1
    fi
    local text=$dir/$mode-oom-report.log json=$dir/$mode-oom-report.json.tmp
    build_prog "$av" report --no-color "$trace" >"$text" 2>&1
    build_prog "$av" report --json "$trace" >"$json" 2>>"$text"
    if ! "$PY" - "$json" "$part" "$mode" >>"$dir/results.jsonl" <<'PY'
import json, sys
path, part, mode = sys.argv[1:4]
d = json.load(open(path))
oom = d.get("oom") or {}
rules = [x.get("rule") for x in d.get("diagnosis") or []]
ok = bool(oom) and any(r and r.startswith("oom-") for r in rules)
print(json.dumps({"part": part, "op": "oom-report", "mode": mode, "trace": True, "ended": d.get("ended"),
                  "oom_found": bool(oom), "rules": rules, "failing_site": (oom.get("failing_site") or [])[:4],
                  "top_live_site": ((oom.get("live_sites") or [{}])[0]).get("site"), "pass": ok}))
sys.exit(0 if ok else 1)
PY
    then
        echo "run.sh: $part $mode: allocview did not diagnose the OOM (see $(basename "$text") in logs.txt)"
        TORCH_FAIL=1
    fi
    sed -n '/^OOM at/,/^Steps/p;/^Diagnosis/,$p' "$text" | head -12
    rm -f "$json" "$trace"
}

# torch_end PART [no-targets]: the status line and the part's summary; also, unless no-targets, the
# side-by-side comparison with the targets (RESULTS/torch-targets.md) from every torch part present
# under RESULTS.
torch_end() {
    local part=$1
    if [ "$TORCH_FAIL" != 0 ]; then
        status_line "$part" fail 1 "a mode failed"
    elif [ "$TORCH_CUT" != 0 ]; then
        status_line "$part" incomplete 1 "$TORCH_CUT run(s) not made: the part's budget of $PART_BUDGET s was spent"
    else
        status_line "$part" "$([ "$MOCK" = 1 ] && echo mock || echo pass)" 0 "every mode ran"
    fi
    [ "$TORCH_CUT" = 0 ] || TORCH_FAIL=1 # the command's status: not every run was made
    summarize "$part" || TORCH_FAIL=1
    [ "${2:-}" = no-targets ] && { [ "$TORCH_FAIL" = 0 ]; return; }
    if "$PY" "$HERE/summarize.py" targets "$RESULTS" >"$RESULTS/torch-targets.md"; then
        cat "$RESULTS/torch-targets.md"
    else
        echo "run.sh: summarize.py targets failed" >&2
        TORCH_FAIL=1
    fi
    [ "$TORCH_FAIL" = 0 ]
}

# more_rounds PART LIMIT ARGS...: rounds 2..REPEAT (--repeat) of PART's timed training, every mode
# in turn in each round.
more_rounds() {
    local part=$1 limit=$2 mode
    shift 2
    for ROUND in $(seq 2 "$REPEAT"); do
        for mode in $TORCH_MODES; do
            torch_job "$part" "$mode" train "$limit" "$@"
        done
    done
    ROUND=1
}

# GPT-2 small: a timed training run and a forced-OOM run per mode, then PyTorch's own snapshots;
# with --repeat, more rounds of the timed runs.
part_torch() {
    local mode
    torch_start
    for mode in $TORCH_MODES; do
        torch_job torch "$mode" train 200 --model small --steps "$STEPS" --sample-ms "$SAMPLE_MS"
        torch_job torch "$mode" oom 120 --model small --steps "$STEPS" --oom-cap-gb "$TORCH_CAP_GB"
        case $mode in cualloc-*) oom_report torch "$mode" ;; esac
    done
    for mode in $TORCH_MODES; do
        case $mode in default|expandable)
            torch_job torch "$mode" snapshot 120 --model small --steps "$STEPS" ;;
        esac
    done
    more_rounds torch 200 --model small --steps "$STEPS" --sample-ms "$SAMPLE_MS"
    torch_end torch
}

# GPT-2 medium: a timed training run per mode, in --repeat rounds.
part_torch_medium() {
    local mode
    torch_start
    for mode in $TORCH_MODES; do
        torch_job torch-medium "$mode" train 240 --model medium --steps "$STEPS" --sample-ms "$SAMPLE_MS"
    done
    more_rounds torch-medium 240 --model medium --steps "$STEPS" --sample-ms "$SAMPLE_MS"
    torch_end torch-medium
}

# What sets GPT-2 small's step time: the torch part's timed training (default mode unless --modes)
# in three configurations, in --repeat rounds that go through them in turn. As the torch part runs
# it (a memory sampler thread every 2 ms, deterministic algorithms); without the sampler thread (the
# memory read after each step, outside its timing); without it and without deterministic
# algorithms. The steps of earlier runs took about 200 ms whatever their length and spread by up to
# 34% between runs of one mode; each step's issue time and the main thread's CPU time in it (in
# every train record) say whether the host sets the time and whether the thread waits.
STEP_CONTROLS="sampler-2ms no-sampler no-sampler-nondeterministic"
step_control_args() {
    case $1 in
        sampler-2ms) echo "--sample-ms 2" ;;
        no-sampler) echo "--sample-ms 0" ;;
        no-sampler-nondeterministic) echo "--sample-ms 0 --no-deterministic" ;;
    esac
}
part_torch_step_controls() {
    local mode JOB_TAG
    torch_start
    for ROUND in $(seq 1 "$REPEAT"); do
        for mode in ${MODES_ARG:-default}; do
            for JOB_TAG in $STEP_CONTROLS; do
                # shellcheck disable=SC2046
                torch_job torch-step-controls "$mode" train 150 --model small --steps "$STEPS" --label "$JOB_TAG" \
                    $(step_control_args "$JOB_TAG")
            done
        done
    done
    ROUND=1
    JOB_TAG=
    torch_end torch-step-controls no-targets
}

# PyTorch's host cost per cached alloc+free pair, per mode.
part_torch_alloc_cost() {
    local mode
    torch_start
    for mode in $TORCH_MODES; do
        torch_job torch-alloc-cost "$mode" allocpair 120
    done
    torch_end torch-alloc-cost
}

# part_torch_capacity PART MODEL [ARGS...]: the most tokens per step within the model's budget, per
# mode (ARGS go to every search: --varlen). Each mode gets an equal share of what is left of the
# part's budget (a mode that ends early leaves its time to the next); a mode's search starts from the
# previous mode's answer.
part_torch_capacity() {
    local part=$1 model=$2 mode n share budget=()
    shift 2
    torch_start
    [ -n "$BUDGET_GB" ] && budget=(--budget-gb "$BUDGET_GB")
    n=$(echo "$TORCH_MODES" | wc -w)
    for mode in $TORCH_MODES; do
        share=$(( $(torch_left) / n ))
        n=$((n - 1))
        torch_job "$part" "$mode" capacity "$share" --model "$model" --time-s $((share - 10)) "${budget[@]}" "$@"
    done
    torch_end "$part"
}

# allocview export --pytorch under PyTorch's own viewer code (torch.cuda._memory_viz): traces
# recorded here on the sim device (a classic one with an OOM and native stacks, an expandable one,
# the demo job), PyTorch's own snapshots (the torch part's, the shared corpus's, bench/corpus)
# imported and exported back; viewer_check.py runs the checks and writes the first snapshot's two
# viewer pages. CPU only: it needs torch, not the GPU; without torch (--mock here) only the
# Python re-implementation of the viewer's checks runs.
part_viewer() {
    local dir=$RESULTS/viewer av=$BUILD/tools/allocview/allocview work rc s t
    need "$av" || return 1
    need "$BUILD/tests/trace_scenarios" || return 1
    if ! starts "$av" 2>"$dir/log.txt"; then
        cat "$dir/log.txt" >&2
        status_line viewer fail 1 "$(cat "$dir/log.txt")"
        summarize viewer
        return 1
    fi
    work=$(mktemp -d "${TMPDIR:-/tmp}/cualloc-viewer.XXXXXX") || return 1
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    {
        CUALLOC_CONF=driver:sim,sim_memory_mb:128,expandable_segments:0 build_prog "$BUILD/tests/trace_scenarios" frag "$work/frag.trace"
        CUALLOC_CONF=driver:sim,sim_memory_mb:256 build_prog "$BUILD/tests/trace_scenarios" leak "$work/leak.trace"
        CUALLOC_CONF=trace:$work/demo.trace,trace_stack_depth:8 build_prog "$BUILD/tools/cualloc-demo" --steps 3 --quiet
        # Each device command starts with an empty $OUT: the torch part's snapshots are found here
        # only when both ran in one command; otherwise put them in bench/corpus first.
        for s in "$RESULTS"/torch/snapshot-*.pickle "$ROOT"/../shared/traces/*.pickle "$ROOT"/shared/traces/*.pickle \
            "$ROOT"/bench/corpus/*.pickle; do
            [ -r "$s" ] && build_prog "$av" import "$s" -o "$work/$(basename "$s" .pickle).trace"
        done
    } >"$dir/log.txt" 2>&1
    local snaps=()
    for t in "$work"/*.trace; do
        [ -s "$t" ] || continue
        if build_prog "$av" export --pytorch "${t%.trace}.pickle" "$t" >>"$dir/log.txt" 2>&1; then
            snaps+=("${t%.trace}.pickle")
        else
            echo "run.sh: export of $(basename "$t") failed" | tee -a "$dir/log.txt"
            printf '{"part":"viewer","op":"viewer","file":"%s","pass":false,"error":"export failed"}\n' \
                "$(basename "$t" .trace).pickle" >>"$dir/results.jsonl"
        fi
    done
    "$PY" "$HERE/viewer_check.py" "$dir/results.jsonl" "$dir" "${snaps[@]}" >>"$dir/log.txt" 2>&1
    rc=$?
    cat "$dir/log.txt"
    if [ "$rc" != 0 ] || grep -q '"pass": *false' "$dir/results.jsonl"; then
        status_line viewer fail 1 "a snapshot failed (see log.txt)"
        rc=1
    elif grep -q '"torch": *null' "$dir/results.jsonl"; then
        status_line viewer "$([ "$MOCK" = 1 ] && echo mock || echo skipped)" 0 "no torch: only the Python re-implementation ran"
    else
        status_line viewer pass 0 "${#snaps[@]} snapshots through torch.cuda._memory_viz"
    fi
    summarize viewer
    [ "$rc" = 0 ]
}
# bundle_logs DIR: gathers the part's *.log files into DIR/logs.txt, each under a "==> NAME <=="
# line. At most 8 files per command come back from the GPU machine; one log file per mode and
# phase would crowd out results.jsonl and the snapshots.
bundle_logs() {
    ls -1tr "$1"/*.log 2>/dev/null | while IFS= read -r f; do  # oldest first: the order they ran in
        { echo "==> $(basename "$f") <=="; cat "$f"; echo; } >>"$1/logs.txt"
        rm -f "$f"
    done
}

# PART_BUDGET_S (default 540): the seconds a part without a budget of its own (driver-costs,
# property-cuda, ld-preload, driver-questions) may take with all its steps, so that it ends within
# one command's 10 minutes whatever hangs; the torch parts have TORCH_BUDGET_S.
PART_END=
run_part() {
    local part=$1 t0 rc
    mkdir -p "$RESULTS/$part"
    rm -f "$RESULTS/$part"/*.log "$RESULTS/$part/logs.txt"  # a rerun into the same folder starts clean
    header "$part"
    t0=$(date +%s)
    case $part in
        driver-costs|property-cuda|ld-preload|driver-questions|torch-api) PART_END=$((t0 + ${PART_BUDGET_S:-540})) ;;
        *) PART_END= ;;
    esac
    case $part in
        driver-costs) part_driver_costs ;;
        property-cuda) part_property_cuda ;;
        ld-preload) part_ld_preload ;;
        driver-questions) part_driver_questions ;;
        torch-api) part_torch_api ;;
        torch) part_torch ;;
        torch-medium) part_torch_medium ;;
        torch-alloc-cost) part_torch_alloc_cost ;;
        torch-capacity) part_torch_capacity torch-capacity small --probe-steps "${PROBE_STEPS:-3}" ;;
        torch-capacity-medium) part_torch_capacity torch-capacity-medium medium --probe-steps "${PROBE_STEPS:-3}" ;;
        torch-capacity-varlen) part_torch_capacity torch-capacity-varlen small --varlen --probe-steps "${PROBE_STEPS:-8}" ;;
        torch-capacity-medium-varlen)
            part_torch_capacity torch-capacity-medium-varlen medium --varlen --probe-steps "${PROBE_STEPS:-8}" ;;
        torch-step-controls) part_torch_step_controls ;;
        viewer) part_viewer ;;
    esac
    rc=$?
    PART_END=
    bundle_logs "$RESULTS/$part"
    echo "== $part: $([ "$rc" = 0 ] && echo ok || echo FAILED) in $(($(date +%s) - t0)) s; results in $RESULTS/$part =="
    return "$rc"
}

# pack: every file of the results folder into the archive --pack names.
pack() {
    [ -n "$PACK" ] || return 0
    if tar czf "$PACK" -C "$RESULTS" . ; then
        echo "run.sh: results packed into $PACK ($(du -h "$PACK" | cut -f1))"
    else
        echo "run.sh: packing the results into $PACK failed" >&2
        return 1
    fi
}

echo "run.sh: results in $RESULTS (build $BUILD)"
n_parts=$(echo "$RUN_PARTS" | wc -w)
if [ "$n_parts" -gt 1 ]; then
    for p in $RUN_PARTS; do
        echo "== $p: estimated $(estimate "$p") =="
    done
    [ "$PART" = all ] && echo "== all: about 20-35 minutes in all; the GPU machine allows 10 minutes per command, so there run the parts one command each (or a few, with --deadline-s) =="
fi
overall=0
for p in $RUN_PARTS; do
    if [ -n "$DEADLINE_S" ] && [ "$(command_left)" -lt 30 ]; then
        echo "== $p: not started: under 30 s of the command's $DEADLINE_S s are left =="
        overall=1
        continue
    fi
    run_part "$p" || overall=1
done
if [ "$n_parts" -gt 1 ]; then
    {
        echo "# GPU runs: $(date -u)"
        echo
        for p in $RUN_PARTS; do
            cat "$RESULTS/$p/summary.md" 2>/dev/null
            echo
        done
        cat "$RESULTS/torch-targets.md" 2>/dev/null
    } >"$RESULTS/summary.md"
    echo "run.sh: parts $([ "$overall" = 0 ] && echo passed || echo 'done, some FAILED'); summary in $RESULTS/summary.md"
fi
pack || overall=1
exit "$overall"
