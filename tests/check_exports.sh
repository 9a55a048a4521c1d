#!/bin/sh
# check_exports.sh LIBCUALLOC_SO — the ABI test (suite 'abi'): libcualloc.so exports only the public
# API (names starting with cualloc_) and the CUDA entry points it interposes (the allow-list
# below), nothing else; and the cualloc_ symbols are unversioned (no @VERSION other than the
# library's base version). Fails naming every offending symbol. Exits 77 (skip) without nm/readelf.
set -u

lib=${1:-}
if [ -z "$lib" ] || [ ! -f "$lib" ]; then
    echo "check_exports: usage: check_exports.sh path/to/libcualloc.so (got '${lib}')" >&2
    exit 2
fi

# CUDA runtime/driver entry points the library may interpose, and dlsym (for interposers that
# resolve CUDA through it). Anything else not starting with cualloc_ is a leak.
allow="cudaMalloc cudaFree cudaMallocAsync cudaFreeAsync cuMemAlloc cuMemAlloc_v2 cuMemFree cuMemFree_v2
cuMemAllocAsync cuMemFreeAsync cuGetProcAddress cuGetProcAddress_v2 dlsym cudaStreamCreate
cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy cudaMemGetInfo
cuMemAllocAsync_ptsz cuMemFreeAsync_ptsz cuStreamDestroy_v2 cuStreamCreate cuStreamCreateWithPriority
cudaDeviceEnablePeerAccess cuCtxEnablePeerAccess cudaIpcGetMemHandle cuMemGetAddressRange_v2 cuMemGetInfo_v2
cudaGetLastError cudaPeekAtLastError cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2 cuGreenCtxStreamCreate cuDeviceSetMemPool"
# Linker-defined symbols that may show as defined.
ignore="_init _fini _edata _end __bss_start __end__ _DYNAMIC _GLOBAL_OFFSET_TABLE_"
# The public API of include/cualloc.h must be there.
required="cualloc_malloc cualloc_free cualloc_get_stats cualloc_oom_message cualloc_trim cualloc_check cualloc_reset_peaks"

for tool in nm readelf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "check_exports: $tool not found; skipping" >&2
        exit 77
    fi
done

in_list() { # in_list WORD LIST
    for w in $2; do [ "$w" = "$1" ] && return 0; done
    return 1
}

fail=0
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# ---- 1. nm -D --defined-only: every defined dynamic symbol is cualloc_* or allowed.
if ! nm -D --defined-only "$lib" >"$tmp/nm" 2>"$tmp/nm.err"; then
    echo "check_exports: nm -D --defined-only $lib failed:" >&2
    cat "$tmp/nm.err" >&2
    exit 1
fi
# Lines: "ADDRESS TYPE NAME" (newer nm appends @VERSION / @@VERSION to NAME).
awk 'NF >= 3 { print $2, $3 } NF == 2 { print $1, $2 }' "$tmp/nm" >"$tmp/syms"
nsyms=0
while read -r type name; do
    base=${name%%@*}
    nsyms=$((nsyms + 1))
    case "$base" in
        cualloc_*) continue ;;
    esac
    if in_list "$base" "$allow"; then continue; fi
    if in_list "$base" "$ignore"; then continue; fi
    echo "check_exports: FAIL: $lib exports '$name' (nm type $type): only cualloc_* and the CUDA entry-point allow-list may be exported" >&2
    fail=1
done <"$tmp/syms"

for r in $required; do
    if ! awk '{ sub(/@.*/, "", $2); print $2 }' "$tmp/syms" | grep -qx "$r"; then
        echo "check_exports: FAIL: $lib does not export '$r' (public API of include/cualloc.h)" >&2
        fail=1
    fi
done

# ---- 2. readelf: the exported cualloc_ symbols carry no symbol version (or only the base one).
if ! readelf --dyn-syms -W "$lib" >"$tmp/dyn" 2>"$tmp/dyn.err"; then
    echo "check_exports: readelf --dyn-syms -W $lib failed:" >&2
    cat "$tmp/dyn.err" >&2
    exit 1
fi
# Version definitions flagged BASE (the file's own name) are not real versions.
readelf -V -W "$lib" 2>/dev/null | awk '/Flags: BASE/ { for (i = 1; i <= NF; i++) if ($i == "Name:") print $(i + 1) }' >"$tmp/base"
base_versions=$(cat "$tmp/base")
# Columns: Num: Value Size Type Bind Vis Ndx Name; defined symbols have Ndx != UND.
awk 'NF >= 8 && $1 ~ /^[0-9]+:$/ && $7 != "UND" { print $8 }' "$tmp/dyn" >"$tmp/dynnames"
while read -r name; do
    case "$name" in
        cualloc_*@*)
            ver=${name#*@}
            ver=${ver#@}
            if in_list "$ver" "$base_versions"; then continue; fi
            echo "check_exports: FAIL: '${name%%@*}' is versioned ('$name', version '$ver'): the public cualloc_ symbols must be unversioned" >&2
            fail=1
            ;;
    esac
done <"$tmp/dynnames"
# Cross-check: readelf and nm agree on the cualloc_ symbols.
ncu_nm=$(awk '{ print $2 }' "$tmp/syms" | grep -c '^cualloc_')
ncu_re=$(grep -c '^cualloc_' "$tmp/dynnames")
if [ "$ncu_nm" != "$ncu_re" ]; then
    echo "check_exports: FAIL: nm lists $ncu_nm defined cualloc_ symbols, readelf $ncu_re" >&2
    fail=1
fi

if [ "$fail" -ne 0 ]; then
    echo "check_exports: $lib: export check FAILED" >&2
    exit 1
fi
echo "check_exports: $lib: $nsyms defined dynamic symbols, $ncu_nm cualloc_ symbols, all allowed and unversioned"
exit 0
