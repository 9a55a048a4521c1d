#!/bin/sh
# check_allocview_modules.sh FIXTURE LIB ALLOCVIEW LIBCUALLOC — allocview names the frames of modules
# whose files it must find from the paths a trace recorded (tests/trace_module_fixture.c, copied
# with LIB to a temporary folder, as it replaces its own file):
#  - a library the loader found by a relative name (dlopen("./lib.so"), LD_LIBRARY_PATH=.): the
#    trace records the file's absolute path, so allocview, run from anywhere, opens it;
#  - a library rebuilt since the run: its frames stay module+offset, and allocview says so on stderr;
#  - an executable whose file was replaced while it ran (the kernel names the running image
#    "PATH (deleted)"): allocview reads the file now at PATH when its build id is the recorded one.
set -u
fixture=$1 lib=$2 allocview=$3 libcualloc=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
LD_LIBRARY_PATH=$(dirname "$libcualloc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
mkdir "$tmp/lib"
cp "$fixture" "$tmp/fixture" && cp "$lib" "$tmp/lib/libmodule.so" || exit 1

# A library opened by a relative name, named by allocview run from another folder.
(cd "$tmp/lib" && CUALLOC_CONF=driver:sim "$tmp/fixture" "$tmp/rel.trace" relative ./libmodule.so) ||
    bad "the fixture (relative) exited non-zero"
"$allocview" dump "$tmp/rel.trace" | grep ' module .*libmodule' | grep -q "path=\"$tmp/lib/libmodule.so\"" ||
    bad "the library's recorded path is not absolute: $("$allocview" dump "$tmp/rel.trace" | grep ' module .*libmodule')"
"$allocview" folded "$tmp/rel.trace" >"$tmp/rel.folded" || bad "allocview folded (relative)"
grep -q 'module_lib_alloc (trace_module_lib.c:13)' "$tmp/rel.folded" ||
    bad "library loaded by a relative name: $(cat "$tmp/rel.folded")"

# The library's file replaced by another build after the run: its frames are not named from it
# (they would name other code), and allocview says why.
cp "$tmp/lib/libmodule.so" "$tmp/libmodule.so.orig"
cp "$tmp/fixture" "$tmp/lib/libmodule.so"
"$allocview" folded "$tmp/rel.trace" >"$tmp/changed.folded" 2>"$tmp/changed.err" || bad "allocview folded (changed)"
grep -q ';libmodule.so+0x[0-9a-f]* 1048576$' "$tmp/changed.folded" ||
    bad "a library rebuilt since the run is named from the new file: $(cat "$tmp/changed.folded")"
grep -q "$tmp/lib/libmodule.so.*build id" "$tmp/changed.err" ||
    bad "allocview does not say that the library changed since the run: '$(cat "$tmp/changed.err")'"
cp "$tmp/libmodule.so.orig" "$tmp/lib/libmodule.so"

# An executable replaced by a copy of itself while it ran.
CUALLOC_CONF=driver:sim "$tmp/fixture" "$tmp/repl.trace" replaced || bad "the fixture (replaced) exited non-zero"
"$allocview" folded "$tmp/repl.trace" >"$tmp/repl.folded" || bad "allocview folded (replaced)"
grep -q 'fixture_alloc (trace_module_fixture.c:[0-9]*);main (trace_module_fixture.c:[0-9]*)\|main (trace_module_fixture.c:[0-9]*);fixture_alloc' "$tmp/repl.folded" ||
    bad "executable replaced while it ran: $(cat "$tmp/repl.folded")"

[ "$fail" = 0 ] && echo "check_allocview_modules: all passed"
exit "$fail"
