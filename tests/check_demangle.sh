#!/bin/sh
# check_demangle.sh TEST_TORCH_ABI LIBCUALLOC_TORCH ALLOCVIEW — C++ call sites read as C++: the shim's
# test (C++, its helpers in an anonymous namespace) runs with the recorder on, and allocview names
# its frames demangled and without parameter lists ("(anonymous namespace)::test_basic
# (test_torch_abi.cc:117)", not "_ZN12_GLOBAL__N_110test_basicERKNS_5lib_tE"), with the pluggable
# allocator's own frames folded away.
set -u
prog=$1 lib=$2 allocview=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CUALLOC_CONF=driver:sim,sim_memory_mb:256,trace:$tmp/t.trace,trace_stack_depth:8 "$prog" "$lib" >"$tmp/log" 2>&1 || {
    cat "$tmp/log"
    echo "FAIL: $prog exited non-zero"
    exit 1
}
"$allocview" folded "$tmp/t.trace" >"$tmp/folded" || { echo "FAIL: allocview folded"; exit 1; }
"$allocview" report --no-color "$tmp/t.trace" >"$tmp/report" || { echo "FAIL: allocview report"; exit 1; }
head -5 "$tmp/folded"
fail=0
if grep -q '_Z' "$tmp/folded" "$tmp/report"; then
    echo "FAIL: mangled names left:"
    grep '_Z' "$tmp/folded" "$tmp/report" | head -5
    fail=1
fi
grep -q '(anonymous namespace)::test_basic (test_torch_abi.cc:[0-9]*)' "$tmp/folded" ||
    { echo "FAIL: no demangled '(anonymous namespace)::test_basic (test_torch_abi.cc:N)' frame"; fail=1; }
grep -q 'test_basic(' "$tmp/folded" && { echo "FAIL: a parameter list was kept"; fail=1; }
grep -qi 'cualloc_torch_malloc\|libcualloc_torch' "$tmp/folded" && { echo "FAIL: the shim's frames were not folded"; fail=1; }
[ "$fail" = 0 ] && echo "check_demangle: all passed"
exit "$fail"
