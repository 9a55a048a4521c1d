#!/usr/bin/env bash
# check_allocview.sh FIXTURE ALLOCVIEW EXPECTED_DIR — allocview against a deterministic trace
# (tests/trace_fixture.c on the sim device): `dump --redact` must equal expected/trace_dump.txt
# byte for byte; `summary --json` must have its fixed keys with the fixture's values; a cut-short
# trace is reported truncated (exit 0), a corrupt one gives its readable prefix and exit 3, a newer
# format, a missing file, a non-trace and a FIFO or directory exit 2 with a message; usage errors
# exit 1; standard output on a full disk exits 2 with a message.
#   UPDATE_EXPECTED=1 check_allocview.sh ...   rewrites the expected file instead of comparing.
set -u
fixture=$1 allocview=$2 expected=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

export CUALLOC_CONF=driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:0
unset RANK LOCAL_RANK
trace=$tmp/fixture.trace
if ! "$fixture" "$trace" 2>"$tmp/fixture.err"; then
    cat "$tmp/fixture.err"; echo "FAIL: the fixture did not run"; exit 1
fi

# 1. dump, compared exactly.
"$allocview" dump --redact "$trace" >"$tmp/dump.txt" || bad "dump exited $?"
if [ "${UPDATE_EXPECTED:-0}" = 1 ]; then
    cp "$tmp/dump.txt" "$expected/trace_dump.txt"
    echo "updated $expected/trace_dump.txt"
elif ! diff -u "$expected/trace_dump.txt" "$tmp/dump.txt"; then
    bad "dump --redact differs from expected/trace_dump.txt (UPDATE_EXPECTED=1 to regenerate)"
fi
lines=$(wc -l <"$tmp/dump.txt")
records=$("$allocview" summary --json "$trace" | sed -n 's/.*"num_records": \([0-9]*\).*/\1/p')
[ "$lines" = "$records" ] || bad "dump has $lines lines, summary counts $records records"

# 2. summary --json: the fixed keys, and the fixture's numbers.
"$allocview" summary --json "$trace" >"$tmp/summary.json" || bad "summary --json exited $?"
for key in num_allocs num_frees peak_requested_bytes peak_allocated_bytes peak_reserved_bytes num_ooms truncated; do
    grep -q "\"$key\": " "$tmp/summary.json" || bad "summary --json lacks \"$key\""
done
expect_json() { # KEY VALUE
    grep -q "\"$1\": $2[,}]" "$tmp/summary.json" || bad "summary --json: want \"$1\": $2 in $(cat "$tmp/summary.json")"
}
expect_json num_allocs 4
expect_json num_frees 6
expect_json num_ooms 1
expect_json num_init_blocks 2
expect_json truncated false
expect_json end_reason '"stop"'
expect_json num_marks 3
expect_json unmatched_frees 0
expect_json live_blocks_at_end 0
if command -v python3 >/dev/null 2>&1; then
    python3 - "$tmp/summary.json" <<'PY' || bad "summary --json is not valid JSON with consistent peaks"
import json, sys
s = json.load(open(sys.argv[1]))
assert isinstance(s, dict)
for d in s["devices"]:
    rep = d["reported"]
    assert rep is not None, d
    for k in ("requested", "allocated", "reserved"):
        assert d["peak_%s_bytes" % k] == rep["%s_peak" % k], (d, k)
assert s["peak_allocated_bytes"] >= s["peak_requested_bytes"] > 0
assert s["peak_reserved_bytes"] >= s["peak_allocated_bytes"]
PY
fi

# 3. summary text of a complete trace; `allocview TRACE` is the after-a-crash report
#    (tests/check_allocview_reports.sh checks its content).
"$allocview" summary "$trace" >"$tmp/summary.txt" || bad "summary exited $?"
grep -q "^ended      stop (complete)" "$tmp/summary.txt" || bad "summary text: $(cat "$tmp/summary.txt")"
"$allocview" "$trace" >"$tmp/plain.txt" || bad "allocview TRACE exited $?"
grep -q "^allocview report" "$tmp/plain.txt" || bad "allocview TRACE is not the report: $(head -3 "$tmp/plain.txt")"
# The report's options go before the trace as well as after it.
"$allocview" --no-color "$trace" >"$tmp/plain2.txt" || bad "allocview --no-color TRACE exited $?"
cmp -s "$tmp/plain.txt" "$tmp/plain2.txt" || bad "allocview --no-color TRACE differs from allocview TRACE (no tty)"
"$allocview" --json "$trace" | grep -q '^{"report": "report"' || bad "allocview --json TRACE is not the report's JSON"

# 4. A trace cut short (like a copy taken while the process ran): truncated, exit 0, a warning.
head -c $((4096 + 65536 + 300)) "$trace" >"$tmp/cut.trace"
"$allocview" summary --json "$tmp/cut.trace" >"$tmp/cut.json" 2>"$tmp/cut.err" || bad "summary of a cut trace exited $?"
grep -q '"truncated": true' "$tmp/cut.json" || bad "cut trace not reported truncated: $(cat "$tmp/cut.json")"
grep -q '"warning": "' "$tmp/cut.json" || bad "cut trace: no warning in $(cat "$tmp/cut.json")"
"$allocview" dump "$tmp/cut.trace" >"$tmp/cut.txt" 2>"$tmp/cut.err" || bad "dump of a cut trace exited $?"
grep -q "cut" "$tmp/cut.err" || bad "dump of a cut trace says nothing: $(cat "$tmp/cut.err")"

# 5. Corrupt: record #13's length overwritten with an endless varint. The records before it are
#    printed exactly as in the full dump, then the error names its offset; exit 3.
off=$("$allocview" dump --offsets "$trace" | sed -n 's/^@\([0-9]*\) #13 .*/\1/p')
[ -n "$off" ] || bad "dump --offsets did not give record #13's offset"
cp "$trace" "$tmp/bad.trace"
printf '\377\377\377\377\377' | dd of="$tmp/bad.trace" bs=1 seek="${off:-0}" conv=notrunc status=none
"$allocview" dump "$tmp/bad.trace" >"$tmp/bad.txt" 2>"$tmp/bad.err"
st=$?
[ $st = 3 ] || bad "dump of a corrupt trace exited $st, want 3"
grep -q "corrupt trace: record at offset $off: bad length" "$tmp/bad.err" || bad "corrupt: $(cat "$tmp/bad.err")"
"$allocview" dump "$trace" | head -n 12 >"$tmp/prefix.txt"
cmp -s "$tmp/prefix.txt" "$tmp/bad.txt" || bad "corrupt trace: the output is not the 12 records before the corrupt one"
"$allocview" summary --json "$tmp/bad.trace" >"$tmp/bad.json" 2>/dev/null
[ $? = 3 ] || bad "summary of a corrupt trace: want exit 3"
grep -q '"error": "record at offset' "$tmp/bad.json" || bad "corrupt summary json: $(cat "$tmp/bad.json")"

# 6. A newer major version, a missing file, not a trace, an empty file.
cp "$trace" "$tmp/new.trace"
printf '\002' | dd of="$tmp/new.trace" bs=1 seek=8 conv=notrunc status=none
"$allocview" dump "$tmp/new.trace" >/dev/null 2>"$tmp/new.err"
st=$?
[ $st = 2 ] || bad "newer version: exit $st, want 2"
grep -q "version 2\.[0-9]* is newer than this reader's 1\.[0-9]*; update allocview" "$tmp/new.err" || bad "newer version: $(cat "$tmp/new.err")"
"$allocview" summary "$tmp/missing.trace" >/dev/null 2>"$tmp/missing.err"
[ $? = 2 ] || bad "missing file: want exit 2"
grep -q "cannot open" "$tmp/missing.err" || bad "missing: $(cat "$tmp/missing.err")"
echo "not a trace" >"$tmp/text.trace"
"$allocview" summary "$tmp/text.trace" >/dev/null 2>"$tmp/text.err"
[ $? = 2 ] || bad "not a trace: want exit 2"
grep -q "not a cualloc trace" "$tmp/text.err" || bad "not a trace: $(cat "$tmp/text.err")"
: >"$tmp/empty.trace"
"$allocview" dump "$tmp/empty.trace" >/dev/null 2>&1
[ $? = 2 ] || bad "empty file: want exit 2"
# A FIFO, a directory, a device: refused at once (a FIFO's open waited for a writer), exit 2.
mkfifo "$tmp/fifo.trace"
for f in "$tmp/fifo.trace" "$tmp" /dev/null; do
    timeout 10 "$allocview" summary "$f" >/dev/null 2>"$tmp/special.err"; st=$?
    [ $st = 2 ] && grep -q "$f is not a regular file" "$tmp/special.err" ||
        bad "summary $f: exit $st, want 2: $(cat "$tmp/special.err")"
done

# 7. Usage.
"$allocview" --help | grep -q "^usage: allocview" || bad "--help"
# dump and summary have their own help (they printed the general one).
for c in dump summary; do
    "$allocview" $c --help | head -1 | grep -q "^usage: allocview $c " || bad "$c --help: $("$allocview" $c --help | head -1)"
done
"$allocview" >/dev/null 2>&1
[ $? = 1 ] || bad "no arguments: want exit 1"
"$allocview" frobnicate "$trace" >/dev/null 2>&1
[ $? = 1 ] || bad "unknown command: want exit 1"
"$allocview" summary --bogus "$trace" >/dev/null 2>"$tmp/bogus.err"
[ $? = 1 ] || bad "unknown option: want exit 1"
grep -q "^allocview summary: unknown option --bogus (see allocview summary --help)$" "$tmp/bogus.err" ||
    bad "unknown option: the message points to the command's own help: $(cat "$tmp/bogus.err")"
"$allocview" --bogus "$trace" >/dev/null 2>&1
[ $? = 1 ] || bad "unknown leading option: want exit 1"
# Option values: a bad one is a usage error that names the option, never a silent default.
for args in "--top -1" "report --top abc" "sites --top 0" "peak --top 3x" "timeline --width 12x" \
        "timeline --width -3" "timeline --top 99999999999999999999999"; do
    # shellcheck disable=SC2086
    "$allocview" $args "$trace" >/dev/null 2>"$tmp/opt.err"
    st=$?
    [ $st = 1 ] || bad "allocview $args: exit $st, want 1"
    grep -q "wants a number" "$tmp/opt.err" || bad "allocview $args: $(cat "$tmp/opt.err")"
done
"$allocview" report --top 2 "$trace" >/dev/null || bad "report --top 2 exited $?"
# peak --at a moment the trace does not have: an error that says so, not an empty state.
"$allocview" peak --at no-such-mark "$trace" >/dev/null 2>"$tmp/at.err"
st=$?
[ $st = 1 ] || bad "peak --at no-such-mark: exit $st, want 1"
grep -q "no mark 'no-such-mark' in the trace (it has [0-9]* mark" "$tmp/at.err" || bad "peak --at no-such-mark: $(cat "$tmp/at.err")"
"$allocview" peak --at 1000000s "$trace" >/dev/null 2>"$tmp/at.err"
st=$?
[ $st = 1 ] || bad "peak --at 1000000s: exit $st, want 1"
grep -q "past the trace's end" "$tmp/at.err" || bad "peak --at 1000000s: $(cat "$tmp/at.err")"
"$allocview" peak --at 0 "$trace" >/dev/null || bad "peak --at 0 exited $?"
# Times beyond int64 nanoseconds are past the end too (they overflowed to "no --at": the peak), and
# what strtod alone would take as a number (inf, hex, a leading blank) names a mark.
for v in 1e10 1e300; do
    "$allocview" peak --at $v "$trace" >/dev/null 2>"$tmp/at.err"; st=$?
    [ $st = 1 ] && grep -q -- "--at $v is past the trace's end" "$tmp/at.err" || bad "peak --at $v: exit $st, $(cat "$tmp/at.err")"
done
for v in inf 0x10 ' 1'; do
    "$allocview" peak --at "$v" "$trace" >/dev/null 2>"$tmp/at.err"; st=$?
    [ $st = 1 ] && grep -q "no mark '$v'" "$tmp/at.err" || bad "peak --at '$v': exit $st, $(cat "$tmp/at.err")"
done
"$allocview" peak "$trace" --at >/dev/null 2>"$tmp/at.err"; st=$?
[ $st = 1 ] && grep -q -- "--at needs a time" "$tmp/at.err" || bad "peak --at without a value: exit $st, $(cat "$tmp/at.err")"
"$allocview" --verbose summary "$trace" >/dev/null 2>"$tmp/verbose.err" || bad "--verbose exited $?"
[ -s "$tmp/verbose.err" ] || bad "--verbose printed no allocator statistics"

# Recorded with trace_stack_depth:0, every block is "(stack not recorded)": the report says what
# that row holds, under the table.
"$allocview" --no-color "$trace" >"$tmp/report.txt" 2>/dev/null
grep -q '^  (stack not recorded: blocks allocated before recording began' "$tmp/report.txt" ||
    bad "the report does not explain its '(stack not recorded)' row: $(grep -m1 'stack not recorded' "$tmp/report.txt")"

# Standard output that cannot be written (a full disk): status 2 and a message, not 0 and an
# empty or cut answer; a usage error stays 1.
if [ -w /dev/full ]; then
    for cmd in "summary --json" "dump" "report" "timeline --json" "folded" "--help"; do
        # shellcheck disable=SC2086
        "$allocview" $cmd "$trace" >/dev/full 2>"$tmp/full.err"; st=$?
        [ $st = 2 ] && grep -q "^allocview: writing standard output failed" "$tmp/full.err" ||
            bad "$cmd into a full disk: exit $st, $(head -1 "$tmp/full.err")"
    done
    "$allocview" summary --bogus "$trace" >/dev/full 2>/dev/null; st=$?
    [ $st = 1 ] || bad "a usage error into a full disk: exit $st, want 1"
else
    echo "no /dev/full: the full-disk checks are skipped"
fi

[ $fail = 0 ] && echo "check_allocview: all passed"
exit $fail
