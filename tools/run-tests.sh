#!/usr/bin/env bash
# Runs every test cualloc has, the way CI does: the normal build, an AddressSanitizer +
# UndefinedBehaviorSanitizer build, a ThreadSanitizer build, and a bounded fuzzing run of every
# parser. Prints one line "N passed, N failed, N skipped" at the end and exits non-zero when
# anything failed.
#
#   tools/run-tests.sh            everything (about 22 minutes on 2 cores, 8 of them fuzzing)
#   tools/run-tests.sh --quick    the normal build only
#   FUZZ_SECONDS=N                seconds per fuzz target (default 60)
set -u
quick=0
case $# in
    0) ;;
    1) case $1 in
           --quick) quick=1 ;;
           -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
           *) echo "run-tests.sh: unknown argument '$1' (--quick, or none)" >&2; exit 2 ;;
       esac ;;
    *) echo "run-tests.sh: one argument at most (--quick)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-60}
passed=0 failed=0 skipped=0
failures=()

# Adds the results of one meson test run (its testlog.json) to the totals.
count_meson() {
    local dir=$1 label=$2
    local line
    line=$(python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
names = []
try:
    for raw in open(sys.argv[1]):
        r = json.loads(raw)
        res = r.get("result")
        if res in ("OK", "EXPECTEDFAIL"): p += 1
        elif res == "SKIP": s += 1
        else:
            f += 1
            names.append(r.get("name", "?"))
            # The end of what the failed test printed, on stderr so that it stays out of this
            # line: the pipeline in build_and_test keeps only meson's summary lines.
            tail = (r.get("stdout") or "").splitlines()[-40:]
            print("---- %s (%s), the last %d lines it printed:" % (r.get("name", "?"), res, len(tail)), file=sys.stderr)
            for t in tail: print("  " + t, file=sys.stderr)
except FileNotFoundError:
    f += 1
    names.append("(no test log)")
print(p, f, s, " ".join(names))
PY
)
    read -r p f s names <<<"$line"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    [ "$f" -gt 0 ] && failures+=("$label: $names")
    echo "== $label: $p passed, $f failed, $s skipped"
}

# build_and_test DIR LABEL MESON_SETUP_ARGS... -- MESON_TEST_ARGS...
build_and_test() {
    local dir=$1 label=$2; shift 2
    local setup=() testargs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do setup+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    testargs=("$@")
    echo "== $label: building in $dir"
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "${setup[@]}" >"/tmp/cualloc-setup-$label.log" 2>&1 || {
            cat "/tmp/cualloc-setup-$label.log"; failed=$((failed + 1)); failures+=("$label: meson setup"); return; }
    fi
    if ! meson compile -C "$dir" >"/tmp/cualloc-build-$label.log" 2>&1; then
        tail -40 "/tmp/cualloc-build-$label.log"; failed=$((failed + 1)); failures+=("$label: build"); return
    fi
    rm -f "$dir/meson-logs/testlog.json"
    meson test -C "$dir" --print-errorlogs "${testargs[@]}" 2>&1 | grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):" || true
    count_meson "$dir" "$label"
}

build_and_test build default -- 
if [ $quick = 0 ]; then
    build_and_test build-asan asan+ubsan -Db_sanitize=address,undefined -Db_lundef=false -Db_lto=false -Dbuildtype=debug -- --no-suite gpu --no-suite bench --no-suite interpose
    build_and_test build-tsan tsan -Db_sanitize=thread -Db_lundef=false -Db_lto=false -Dbuildtype=debugoptimized -- --suite stress --suite unit --suite property --suite sim --suite api --suite driver --suite trace --suite interpose-threads

    # Fuzzing: every parser, a bounded time each, from its checked-in seed corpus.
    if command -v clang >/dev/null 2>&1; then
        for target in tests/fuzz/fuzz_*.c; do
            [ -e "$target" ] || continue
            name=$(basename "$target" .c)
            corpus=tests/fuzz/corpus_${name#fuzz_}
            exe=build/fuzz-$name
            srcs=$(sed -n 's|^// sources: *||p' "$target")
            [ -n "$srcs" ] || srcs="src/conf.c src/error.c"
            # shellcheck disable=SC2086
            if clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -Iinclude -Isrc "$target" $srcs \
                   -o "$exe" -lm -lpthread -ldl 2>"/tmp/cualloc-$name.log"; then
                work=$(mktemp -d)
                cp -r "$corpus"/. "$work"/ 2>/dev/null || true
                if "$exe" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 "$work" >"/tmp/cualloc-$name.run.log" 2>&1; then
                    echo "== fuzz $name: ${fuzz_seconds}s clean ($(grep -c . <(ls "$work")) corpus entries)"
                    passed=$((passed + 1))
                else
                    tail -30 "/tmp/cualloc-$name.run.log"
                    failed=$((failed + 1)); failures+=("fuzz: $name")
                fi
                rm -rf "$work"
            else
                cat "/tmp/cualloc-$name.log"; failed=$((failed + 1)); failures+=("fuzz: $name (build)")
            fi
        done
    else
        echo "== fuzz: clang not found, fuzzing skipped"; skipped=$((skipped + 1))
    fi
fi

for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
