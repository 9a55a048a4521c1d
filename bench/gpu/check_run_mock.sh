#!/usr/bin/env bash
# check_run_mock.sh SOURCE_ROOT BUILD_ROOT — meson test 'gpu_run_mock' (suite 'bench'): runs
# bench/gpu/run.sh all --mock into a temporary folder and checks that every part left its
# results.jsonl (every line JSON, a meta line first, a status line last, status pass or mock) and
# its summary.md, and that `all` wrote the combined summary.
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
for part in driver-costs property-cuda ld-preload torch; do
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
need = {
    "driver-costs": lambda: {r["op"] for r in body} >= {"device", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                                                         "cuMemUnmap", "cuMemRelease", "cuMemAlloc", "cuMemFree",
                                                         "build_create_map_access"}
                            and {r["chunk_bytes"] for r in body if r["op"] == "cuMemCreate"} == {2 << 20, 20 << 20, 256 << 20},
    "property-cuda": lambda: len([r for r in body if r.get("pass") is True]) >= 5
                             and {r["mode"] for r in body if "mode" in r} == {"vmm", "classic"},
    "ld-preload": lambda: len([r for r in body if r["op"] == "run"]) == 6,
    "torch": lambda: sorted((r["mode"], r["phase"]) for r in body if r.get("dry_run") and r.get("valid"))
                     == sorted((m, p) for m in ["default", "expandable", "cualloc-enable", "cualloc-preload-nocache",
                                                "cualloc-preload-cache"] for p in ["train", "oom"]),
}[part]
assert need(), "%s: missing records: %s" % (part, [r.get("op") for r in body])
PY
done
grep -q '^date: ' "$tmp/results/driver-costs/env.txt" || bad "env.txt has no date"
grep -q '^commit (build): ' "$tmp/results/driver-costs/env.txt" || bad "env.txt has no commit"
# torch_train.py refuses a mode whose environment is wrong.
if env -u LD_PRELOAD python3 "$src/bench/gpu/torch_train.py" --mode cualloc-preload-cache --dry-run \
        --build "$build" >/dev/null 2>&1; then
    bad "torch_train.py accepted cualloc-preload-cache without LD_PRELOAD"
fi
[ "$fail" = 0 ] && echo "gpu_run_mock: ok"
exit "$fail"
