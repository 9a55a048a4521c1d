#!/bin/sh
# run_cuda_prog.sh PROGRAM LIBCUALLOC_SO FAKECUDA_DIR static|shared — runs an nvcc-built CUDA
# program (tests/cuda_prog.cu) on the fake libcuda.so.1 with libcualloc.so preloaded and
# CUALLOC_LOG_INTERPOSE=1, and checks from the log that cualloc answered the CUDA runtime's own
# cuGetProcAddress look-ups of cuMemAlloc (at 3020) and cuMemFree. With the shared runtime the
# program's cudaMalloc reaches cualloc's exported cudaMalloc, which must answer as the runtime does
# without cualloc (the program is run a second time without it): the runtime initializes the
# device's context for an allocation, and a runtime that cannot start fails it. The fake driver is
# older than a CUDA 13 runtime, which then answers cudaErrorInsufficientDriver with or without
# cualloc; where the runtime starts (a real driver) the allocation must succeed, served by cualloc.
# Exits 77 (skip) when the program was not built (no nvcc).
set -u
prog=$1 lib=$2 fakedir=$3 kind=$4
if [ "$prog" = "none" ] || [ ! -x "$prog" ]; then
    echo "run_cuda_prog: no nvcc-built program; skipping"
    exit 77
fi
log=$(mktemp) || exit 2
trap 'rm -f "$log"' EXIT
CUALLOC_LOG_INTERPOSE=1 CUALLOC_CONF=${CUALLOC_CONF:-driver:cuda,sim_host_backed:1,sim_memory_mb:256} \
    LD_LIBRARY_PATH="$fakedir" LD_PRELOAD="$lib" "$prog" >"$log" 2>&1
rc=$?
cat "$log"
fail=0
for sym in cuMemAlloc cuMemFree; do
    if ! grep -q "cualloc: interpose: cuGetProcAddress(\"$sym\", [0-9]*, flags [0-9]*) -> cualloc ${sym}_v2" "$log"; then
        echo "run_cuda_prog: FAIL: cualloc did not answer the runtime's cuGetProcAddress look-up of $sym" >&2
        fail=1
    fi
done
if ! grep -q 'cualloc: interpose: dlsym("cuGetProcAddress' "$log"; then
    echo "run_cuda_prog: FAIL: the runtime's dlsym of cuGetProcAddress did not reach cualloc" >&2
    fail=1
fi
if [ "$kind" = "shared" ]; then
    alone=$(CUALLOC_CONF=${CUALLOC_CONF:-driver:cuda,sim_host_backed:1,sim_memory_mb:256} \
        LD_LIBRARY_PATH="$fakedir" "$prog" 2>&1 | grep '^cuda_prog: cudaMalloc = ')
    with=$(grep '^cuda_prog: cudaMalloc = ' "$log")
    echo "run_cuda_prog: without cualloc: ${alone:-no answer}"
    if [ -z "$alone" ] || [ "$alone" != "$with" ]; then
        echo "run_cuda_prog: FAIL: with the shared runtime cudaMalloc must answer as the runtime alone does" \
            "(${alone:-no answer}), not ${with:-no answer}" >&2
        fail=1
    elif [ "$alone" = "cuda_prog: cudaMalloc = 0 (cudaSuccess)" ] &&
        { [ "$rc" -ne 0 ] || ! grep -q "cuda_prog: cualloc num_allocs = 1" "$log"; }; then
        echo "run_cuda_prog: FAIL: the runtime works, so cudaMalloc/cudaFree must succeed, served by cualloc (rc $rc)" >&2
        fail=1
    fi
fi
[ "$fail" -eq 0 ] && echo "run_cuda_prog ($kind): cualloc answered the runtime's look-ups (program rc $rc)"
exit "$fail"
