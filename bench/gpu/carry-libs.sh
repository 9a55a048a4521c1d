#!/bin/sh
# carry-libs.sh [BUILD [DEST]] — on the build machine, before the build folder is copied to a GPU
# machine that has no package registry: copies the shared libraries that BUILD's programs need and
# a machine with PyTorch may lack (jemalloc, elfutils' libdw and libelf, their compressors) into
# DEST (default BUILD/gpu-libs/, where it travels with the build). bench/gpu/run.sh puts
# BUILD/gpu-libs on LD_LIBRARY_PATH for the programs of BUILD it runs (allocview, the trace
# scenarios), and for nothing else: PyTorch keeps its own.
#
# Left out: the C library's own (libc, libm, libdl, libpthread, librt, the loader), which must be
# the machine's, and libstdc++ / libgcc_s, which every PyTorch installation brings; copying older
# ones over newer would break the programs that need the newer. The files are the ones this
# machine's programs load (ldd), so a build made against other versions picks up the right ones.
# Exit status 0 when every library was found and copied; 1 otherwise (the missing ones named).
set -eu
case ${1:-} in
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -le 2 ] || { echo "carry-libs.sh: at most two arguments, BUILD and DEST" >&2; exit 2; }

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
[ -d "$build" ] || { echo "carry-libs.sh: no build folder '$build'" >&2; exit 1; }
build=$(cd "$build" && pwd)
dest=${2:-$build/gpu-libs}

# What run.sh runs from BUILD on the GPU machine (the rest of its programs link only the C library
# and libcualloc.so, or are built there).
programs="tools/allocview/allocview tests/trace_scenarios tools/cualloc-demo bench/driver_costs
bench/property_cuda src/libcualloc.so"

rm -rf "$dest"
mkdir -p "$dest"
status=0
for p in $programs; do
    exe=$build/$p
    [ -e "$exe" ] || { echo "carry-libs.sh: $exe is missing: build first (meson compile -C $build)" >&2; status=1; continue; }
    # "libX.so.N => /path (0x...)", or "libX.so.N => not found".
    ldd "$exe" | while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        case $name in
            libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|ld-linux*) continue ;;
            libstdc++.so.*|libgcc_s.so.*) continue ;;
            libcualloc.so) continue ;; # BUILD's own
        esac
        if [ "$path" = not ]; then
            echo "carry-libs.sh: $p needs $name, which this machine does not have either" >&2
            echo missing >"$dest/.missing"
            continue
        fi
        # (set -e would end the loop's subshell at a failed cp without a word: say which.)
        if [ ! -e "$dest/$name" ] && ! cp -L "$path" "$dest/$name"; then
            echo "carry-libs.sh: copying $path (for $p) to $dest failed" >&2
            echo missing >"$dest/.missing"
        fi
    done
done
if [ -e "$dest/.missing" ]; then
    rm -f "$dest/.missing"
    status=1
fi
echo "carry-libs.sh: $(ls "$dest" | wc -l) libraries in $dest: $(ls "$dest" | tr '\n' ' ')"
exit "$status"
