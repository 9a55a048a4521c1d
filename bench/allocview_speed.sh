#!/usr/bin/env bash
# allocview_speed.sh BUILD_DIR [EVENTS] [TRACE] — the analyzer's speed: writes a synthetic trace
# of EVENTS alloc/free records (default 50 M; bench/trace_synth.c) to TRACE (default a temporary
# file, removed after), then times `allocview summary` on it three times with /usr/bin/time -v:
# wall seconds, events/s, peak RSS; then `allocview replay` once per configuration (cualloc's
# default and classic mode; REPLAY=0 skips it): requests/s and peak RSS (a replay holds the
# request sequence in memory, 24 bytes per request). Not a test; results go to bench/RESULTS.md by
# hand.
# --help prints the comment above; any other option is refused (it would be taken for a folder).
case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '$d'; exit 0 ;;
-*) echo "$(basename "$0"): unknown option '$1' (--help prints the usage)" >&2; exit 1 ;;
esac
set -eu
build=${1:?usage: allocview_speed.sh BUILD_DIR [EVENTS] [TRACE]}
events=${2:-50000000}
trace=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -n "$trace" ] || trace=$tmp/synth.trace
av=$build/tools/allocview/allocview
if [ ! -s "$trace" ]; then
    "$build/bench/trace_synth" "$trace" "$events"
fi
ls -l "$trace"
"$av" summary --json "$trace" >"$tmp/s.json"
n=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['num_allocs']+s['num_frees'])" "$tmp/s.json")
recs=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_records'])" "$tmp/s.json")
echo "events (alloc+free): $n, records: $recs"
for run in 1 2 3; do
    /usr/bin/time -v "$av" summary "$trace" >/dev/null 2>"$tmp/time.txt"
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tmp/time.txt")
    user=$(sed -n 's/.*User time (seconds): //p' "$tmp/time.txt")
    sys=$(sed -n 's/.*System time (seconds): //p' "$tmp/time.txt")
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time.txt")
    secs=$(python3 -c "import sys; p=sys.argv[1].split(':'); print(sum(float(x)*60**i for i,x in enumerate(reversed(p))))" "$wall")
    # A run shorter than /usr/bin/time's resolution (0.01 s) reads 0 s: no rate can be given for it.
    python3 -c "import sys; n,s,r=int(sys.argv[1]),float(sys.argv[2]),int(sys.argv[7]); rate='%.1f M events/s, %.1f M records/s' % (n/s/1e6, r/s/1e6) if s > 0 else 'too short to time (under 0.01 s), no rate'; print('run %s: %.2f s wall (user %s, sys %s), %s, peak RSS %s KiB' % (sys.argv[3], s, sys.argv[4], sys.argv[5], rate, sys.argv[6]))" \
        "$n" "$secs" "$run" "$user" "$sys" "$rss" "$recs"
done
[ "${REPLAY:-1}" = 0 ] && exit 0
for conf in default expandable_segments:0; do
    /usr/bin/time -v "$av" replay --conf "$conf" "$trace" >"$tmp/replay.txt" 2>"$tmp/time.txt"
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tmp/time.txt")
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time.txt")
    rate=$(sed -n 's/^allocview replay: .*requests in \([0-9.]*\) s (\([0-9.]*\) M requests\/s)/\1 s replaying, \2 M requests\/s/p' "$tmp/time.txt")
    secs=$(python3 -c "import sys; p=sys.argv[1].split(':'); print(sum(float(x)*60**i for i,x in enumerate(reversed(p))))" "$wall")
    echo "replay --conf $conf: $secs s wall in all (loading included), $rate, peak RSS $rss KiB"
    grep -E "^(conf|$conf) " "$tmp/replay.txt"
done
