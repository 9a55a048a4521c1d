#!/bin/sh
# fragmentation.sh — the fragmentation table over every allocation trace we have: each trace's
# requests replayed (`allocview replay`, sim device, CPU only) under cualloc's default, PyTorch's
# classic policy, and classic with max_split_size_mb; per configuration the utilisation (peak
# allocated / peak reserved) and the min-fit ratio (smallest capacity on which the whole trace
# completes / peak requested).
#
# usage: bench/fragmentation.sh [BUILD]      (default: build; set up with meson if missing)
# environment:
#   FRAG_SNAPSHOTS  folder of real PyTorch snapshots, *.pickle (default: ../shared/traces from
#                   the repository root); skipped with a note when it has none
#   FRAG_CORPUS     extra *.pickle (imported) and *.trace (used as they are) (default: bench/corpus)
#   FRAG_OUT        where fragmentation.md (the table) and fragmentation.json go
#                   (default: BUILD/fragmentation)
#   FRAG_PASSES     replay every trace's requests this many times on the same heap, as a job
#                   repeats its steps (`allocview replay --passes`; peaks over all passes, min-fit
#                   for all of them): the steady state (default 1, at most 1000)
#   FRAG_BUILD=0    do not run ninja (the meson test sets it: meson has built the programs)
# Exit status: 0 when every trace was recorded or imported and replayed, 1 otherwise, 77 without
# python3 (needed to read the JSON).
#
# The corpus:
#   - the real snapshots, converted with `allocview import X.pickle -o X.trace` (the recorded
#     capacity is import's assumed 80 GiB: a snapshot holds none);
#   - the scenario traces the test suite records through libcualloc.so on the sim device, recorded
#     here again with the tests' configurations: every scenario of tests/trace_scenarios (its
#     `--list`, which tests/check_allocview_reports.sh records too; devicefull on the tests' fake
#     driver), tests/replay_fixture and tests/trace_fixture (as in
#     tests/check_replay.sh), plus the demo job (tools/cualloc-demo, 20 steps of a GPT-2-small-shaped
#     training loop) with CUALLOC_CONF=trace:...;
#   - bench/corpus/*.pickle and *.trace, where snapshots recorded on a GPU are put.
# Not included: tests/trace_sites_fixture (its records are written directly, not by the allocator),
# the reports test's `capped` trace (shortage's requests under a cap) and replay_fixture's classic
# recording (the same requests as its default recording; a replay
# sees only the requests, so its row would be identical).
#
# The configurations (checked with build/tools/cualloc-conf, keys in src/conf.c):
#   default                                      cualloc's default: expandable (VMM) segments
#   expandable_segments:0                        classic segments = PyTorch's default allocator
#   expandable_segments:0,max_split_size_mb:512  classic, blocks over 512 MiB never split
#   expandable_segments:0,max_split_size_mb:64   classic, blocks over 64 MiB never split
# max_split_size_mb goes with classic mode because that is the only mode it acts in: cualloc's
# expandable pool ignores it (src/heap.c), so expandable_segments:1,max_split_size_mb:N replays
# exactly like default. 512 and 64: a mild and a strict setting of the kind PyTorch users try
# against fragmentation (the key accepts 21 and up).
#
# Each replay runs at the trace's recorded capacity (what the job had). Utilisation is read there
# (a cell says "N OOM" when requests failed at that capacity). The min-fit ratio divides min-fit by
# the peak requested of a second replay at the min-fit capacity, where every request is served: a
# run with OOMs has a peak requested that lacks the failed requests, which would inflate the ratio.
# --help prints the comment above; any other option is refused (it would be taken for a folder).
case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '$d'; exit 0 ;;
-*) echo "$(basename "$0"): unknown option '$1' (--help prints the usage)" >&2; exit 1 ;;
esac
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
snapdir=${FRAG_SNAPSHOTS:-$root/../shared/traces}
fakecuda=$build/tests/fakecuda
corpus=${FRAG_CORPUS:-$root/bench/corpus}
out=${FRAG_OUT:-$build/fragmentation}
passes=${FRAG_PASSES:-1}
case $passes in
'' | *[!0-9]* | 0 | 0*) passes_ok=0 ;;
*) passes_ok=1; [ ${#passes} -le 4 ] && [ "$passes" -le 1000 ] || passes_ok=0 ;;
esac
[ $passes_ok = 1 ] || { echo "fragmentation.sh: FRAG_PASSES must be a number from 1 to 1000, not '$passes'" >&2; exit 1; }
confs='default
expandable_segments:0
expandable_segments:0,max_split_size_mb:512
expandable_segments:0,max_split_size_mb:64'

command -v python3 >/dev/null 2>&1 || { echo "fragmentation.sh: python3 not found (it reads the JSON); skipping"; exit 77; }

if [ "${FRAG_BUILD:-1}" != 0 ]; then
    if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" "$root" >/dev/null || { echo "fragmentation.sh: meson setup $build failed" >&2; exit 1; }
    fi
    # -j 2: the machines this runs on are small and shared.
    ninja -C "$build" -j 2 tools/allocview/allocview tests/trace_scenarios tests/replay_fixture \
        tests/trace_fixture tools/cualloc-demo tests/fakecuda/libcuda.so.1 >/dev/null ||
        { echo "fragmentation.sh: building the replay tool and the fixtures failed" >&2; exit 1; }
fi
allocview=$build/tools/allocview/allocview
for exe in "$allocview" "$build/tests/trace_scenarios" "$build/tests/replay_fixture" "$build/tests/trace_fixture" \
    "$build/tools/cualloc-demo"; do
    [ -x "$exe" ] || { echo "fragmentation.sh: $exe is missing (build it, or run without FRAG_BUILD=0)" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
status=0
notes=$tmp/notes.txt   # lines for the Markdown output, under the table
: >"$notes"
list=$tmp/traces.tsv   # name <TAB> source <TAB> trace file, one line per trace in table order
: >"$list"
unset RANK LOCAL_RANK  # they would name the rank in the fixtures' traces

fail() { echo "fragmentation.sh: $*" >&2; status=1; }

# import NAME SOURCE SNAPSHOT: a PyTorch snapshot into a trace, added to the list.
import_snapshot() {
    if "$allocview" import "$3" -o "$tmp/$1.trace" 2>"$tmp/$1.import.log"; then
        printf '%s\t%s\t%s\n' "$1" "$2" "$tmp/$1.trace" >>"$list"
    else
        fail "import of $3 failed: $(cat "$tmp/$1.import.log")"
    fi
}

# record NAME SOURCE CONF COMMAND...: runs COMMAND with CUALLOC_CONF=CONF (on driver:sim unless CONF
# names a driver); the scenario must
# leave a trace (the shortage and frag scenarios die with their OOM, exit 1, as in the tests).
# trace_stack_depth:0: a replay uses no stacks, and recording then needs no unwinder.
record() {
    name=$1 source=$2 conf=$3
    shift 3
    case $conf in driver:*) ;; *) conf="driver:sim,$conf" ;; esac
    CUALLOC_CONF="trace_stack_depth:0,$conf" "$@" </dev/null >"$tmp/$name.log" 2>&1 || true
    if [ -s "$tmp/$name.trace" ]; then
        printf '%s\t%s\t%s\n' "$name" "$source" "$tmp/$name.trace" >>"$list"
    else
        fail "$name wrote no trace: $(tail -3 "$tmp/$name.log")"
    fi
}

# 1. The real PyTorch snapshots.
found=0
if [ -d "$snapdir" ]; then
    for f in "$snapdir"/*.pickle; do
        [ -r "$f" ] || continue
        found=1
        import_snapshot "$(basename "$f" .pickle)" "PyTorch snapshot" "$f"
    done
fi
if [ $found = 0 ]; then
    echo "fragmentation.sh: note: no PyTorch snapshots in $snapdir (FRAG_SNAPSHOTS); their rows are skipped" >&2
    echo "No PyTorch snapshots were found in \`$snapdir\`: their rows are missing." >>"$notes"
fi

# 2. The test fixtures, recorded as the tests record them (configurations from
#    tests/check_allocview_reports.sh and tests/check_replay.sh).
# Every scenario, under the configuration `trace_scenarios --list` gives it (as
# tests/check_allocview_reports.sh records it). devicefull and waiting run on the fake driver the
# tests build (tests/fakecuda): their replays, like every replay here, are on the sim device at the
# recorded capacity, without the memory devicefull took past cualloc and without waiting's CUDA
# graph capture, so their OOMs need not recur there.
scen=$build/tests/trace_scenarios
"$scen" --list >"$tmp/scenarios.tsv" || fail "trace_scenarios --list failed"
while IFS='	' read -r sname sconf; do
    case $sconf in
    driver:cuda,*)
        if [ ! -e "$fakecuda/libcuda.so.1" ]; then
            echo "fragmentation.sh: note: no $fakecuda/libcuda.so.1; scenario $sname is skipped" >&2
            echo "Scenario \`$sname\` needs the fake driver (\`$fakecuda\`), which was not built: its row is missing." >>"$notes"
            continue
        fi
        record "scenario-$sname" "tests/trace_scenarios $sname (fake driver)" "$sconf" \
            env "LD_LIBRARY_PATH=$fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$scen" "$sname" "$tmp/scenario-$sname.trace"
        case $sname in
        waiting) why="while a stream captured a CUDA graph; a replay knows no capture (the side stream's frees settle as usual)" ;;
        *) why="with memory taken past cualloc; the replays do not take it" ;;
        esac
        echo "\`scenario-$sname\` was recorded on the fake driver $why, so the recorded OOM need not recur in them." >>"$notes"
        ;;
    *) record "scenario-$sname" "tests/trace_scenarios $sname" "$sconf" "$scen" "$sname" "$tmp/scenario-$sname.trace" ;;
    esac
done <"$tmp/scenarios.tsv"
record replay-fixture "tests/replay_fixture" sim_memory_mb:1024 "$build/tests/replay_fixture" "$tmp/replay-fixture.trace"
record trace-fixture "tests/trace_fixture (2 devices)" sim_devices:2,sim_memory_mb:256 \
    "$build/tests/trace_fixture" "$tmp/trace-fixture.trace"
# The demo: its own default configuration (sim device of 16 GiB), traced.
record demo-gpt2s "tools/cualloc-demo (20 steps)" "sim_memory_mb:16384,trace:$tmp/demo-gpt2s.trace" \
    "$build/tools/cualloc-demo" --quiet

# 3. bench/corpus, when there is one.
if [ -d "$corpus" ]; then
    for f in "$corpus"/*.pickle; do
        [ -r "$f" ] || continue
        import_snapshot "corpus-$(basename "$f" .pickle)" "bench/corpus (PyTorch snapshot)" "$f"
    done
    for f in "$corpus"/*.trace; do
        [ -r "$f" ] || continue
        printf '%s\t%s\t%s\n' "corpus-$(basename "$f" .trace)" "bench/corpus (trace)" "$f" >>"$list"
    done
fi

# Per trace: its summary (events, recorded peaks, capacity), its recorded configuration, the replay
# with --min-fit under every configuration, then one replay per configuration at its min-fit.
set -- # the --conf arguments
nl='
'
IFS_save=$IFS
IFS=$nl
for c in $confs; do set -- "$@" --conf "$c"; done
IFS=$IFS_save
while IFS='	' read -r name source trace; do
    echo "fragmentation.sh: $name" >&2
    rc=0
    # </dev/null on every command in this loop: its standard input is the list being read.
    "$allocview" summary --json "$trace" </dev/null >"$tmp/$name.summary.json" 2>"$tmp/$name.err" || rc=$?
    # 3: the trace is damaged past some record; the summary of the records before is still written
    # (a trace cut short by a job that died reads as 0).
    if [ $rc != 0 ] && [ $rc != 3 ]; then fail "$name: summary exited $rc: $(cat "$tmp/$name.err")"; continue; fi
    "$allocview" dump "$trace" </dev/null 2>/dev/null | sed -n '/^#[0-9]* config "/{s/^#[0-9]* config "\(.*\)"$/\1/p;q;}' \
        >"$tmp/$name.config" || true
    if ! "$allocview" replay "$trace" --passes "$passes" --min-fit --json "$@" </dev/null >"$tmp/$name.replay.json" 2>"$tmp/$name.err"; then
        fail "$name: replay exited non-zero: $(tail -3 "$tmp/$name.err")"
        continue
    fi
    # "index <TAB> conf <TAB> min_fit_bytes" for each configuration that has a min-fit.
    python3 -c 'import json, sys
for i, o in enumerate(json.load(open(sys.argv[1]))):
    if o["min_fit_bytes"] is not None:
        print("%d\t%s\t%d" % (i, o["conf"], o["min_fit_bytes"]))' "$tmp/$name.replay.json" >"$tmp/$name.fits"
    while IFS='	' read -r i conf bytes; do
        "$allocview" replay "$trace" --passes "$passes" --conf "$conf" --memory "$bytes" --json </dev/null >"$tmp/$name.atfit.$i.json" 2>"$tmp/$name.err" ||
            fail "$name: replay of $conf at its min-fit $bytes B exited non-zero: $(tail -3 "$tmp/$name.err")"
    done <"$tmp/$name.fits"
done <"$list"

# The table and the JSON.
python3 - "$tmp" "$list" "$notes" "$out" "$passes" <<'PY' || status=1
import json, os, sys

tmp, listfile, notesfile, out = sys.argv[1:5]
passes = int(sys.argv[5])
labels = {  # short column names for the configurations
    "default": "default (expandable)",
    "expandable_segments:0": "classic",
    "expandable_segments:0,max_split_size_mb:512": "classic, max_split 512",
    "expandable_segments:0,max_split_size_mb:64": "classic, max_split 64",
}
confs = list(labels)
problems = []

def human(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return "%.2f %s" % (b / scale, unit)
    return "%d B" % b

rows = []
for line in open(listfile):
    name, source, trace = line.rstrip("\n").split("\t")
    try:
        summ = json.load(open(os.path.join(tmp, name + ".summary.json")))
        rep = json.load(open(os.path.join(tmp, name + ".replay.json")))
    except (OSError, ValueError) as e:
        problems.append("%s: no results (%s)" % (name, e))
        continue
    config = open(os.path.join(tmp, name + ".config")).read().strip()
    recorder = summ["process"]["recorder"] or "?"
    who = "PyTorch" if "PyTorch" in recorder else "cualloc" if recorder.startswith("cualloc") else recorder
    expandable = None
    for kv in config.split(","):
        if kv.startswith("expandable_segments:"):
            expandable = kv.split(":", 1)[1].lower() in ("1", "true")
    mode = "" if expandable is None else " expandable" if expandable else " classic"
    row = {
        "trace": name, "source": source,
        "recorded_by": who + mode, "recorded_config": config,
        "events": summ["num_allocs"] + summ["num_frees"],
        "initial_blocks": summ["num_init_blocks"],
        "capacity_bytes": max(d["capacity_bytes"] for d in summ["devices"]),
        "devices": len(summ["devices"]),
        "truncated": summ["truncated"],
        "recorded": {k: summ[k] for k in ("peak_requested_bytes", "peak_allocated_bytes",
                                           "peak_reserved_bytes", "num_ooms")},
        "confs": [],
    }
    rs = row["recorded"]
    rs["utilisation"] = rs["peak_allocated_bytes"] / rs["peak_reserved_bytes"] if rs["peak_reserved_bytes"] else None
    for i, o in enumerate(rep):
        c = dict(o)
        c["min_fit_ratio"] = None
        c["at_min_fit"] = None
        if o["min_fit_bytes"] is not None:
            try:
                f = json.load(open(os.path.join(tmp, "%s.atfit.%d.json" % (name, i))))[0]
            except (OSError, ValueError, IndexError) as e:
                problems.append("%s, %s: no replay at min-fit (%s)" % (name, o["conf"], e))
                f = None
            if f is not None:
                c["at_min_fit"] = f
                if f["num_ooms"]:
                    problems.append("%s, %s: %d OOMs at min-fit" % (name, o["conf"], f["num_ooms"]))
                # Several devices: min-fit is a capacity per device, the peaks are totals over the
                # devices; their ratio would mean nothing.
                if row["devices"] == 1:
                    c["min_fit_ratio"] = o["min_fit_bytes"] / f["peak_requested_bytes"]
        # Accounting sanity: requested <= allocated <= reserved, and min-fit no smaller than the need.
        if not o["peak_requested_bytes"] <= o["peak_allocated_bytes"] <= o["peak_reserved_bytes"]:
            problems.append("%s, %s: peaks out of order: %s" % (name, o["conf"], o))
        if c["min_fit_ratio"] is not None and c["min_fit_ratio"] < 1:
            problems.append("%s, %s: min-fit below the peak requested" % (name, o["conf"]))
        row["confs"].append(c)
    if [c["conf"] for c in row["confs"]] != confs:
        problems.append("%s: replay returned configurations %s" % (name, [c["conf"] for c in row["confs"]]))
    # The requests' own peak: that of a completed run (all completed runs serve the same requests).
    done = sorted({c["at_min_fit"]["peak_requested_bytes"] for c in row["confs"] if c["at_min_fit"]})
    if len(done) > 1:
        problems.append("%s: completed runs disagree on the peak requested: %s" % (name, done))
    row["peak_requested_bytes"] = done[-1] if done else None
    rows.append(row)

def cell(c):
    if c is None:
        return "–"
    u = "%.4f" % c["utilisation"]
    if c["num_ooms"]:
        u += " (%d OOM)" % c["num_ooms"]
    r = "%.4f" % c["min_fit_ratio"] if c["min_fit_ratio"] is not None else "–"
    return "%s / %s" % (u, r)

head = ["trace", "recorded by", "events", "capacity", "peak requested", "recorded util"] + \
       [labels[c] for c in confs]
md = ["| " + " | ".join(head) + " |",
      "|" + "|".join(["---", "---", "---:", "---:", "---:", "---:"] + ["---:"] * len(confs)) + "|"]
for r in rows:
    by_conf = {c["conf"]: c for c in r["confs"]}
    rec = r["recorded"]
    ru = "%.4f" % rec["utilisation"] if rec["utilisation"] is not None else "–"
    if rec["num_ooms"]:
        ru += " (%d OOM)" % rec["num_ooms"]
    md.append("| " + " | ".join([
        r["trace"] + (" (truncated)" if r["truncated"] else ""), r["recorded_by"], str(r["events"]),
        human(r["capacity_bytes"]), human(r["peak_requested_bytes"]) if r["peak_requested_bytes"] else "–", ru]
        + [cell(by_conf.get(c)) for c in confs]) + " |")
md.append("")
md.append("Cells: utilisation (peak allocated / peak reserved, replayed at the recorded capacity) / "
          "min-fit ratio (min-fit / peak requested). events: allocs + frees (initial blocks apart); "
          "recorded util: what the recording allocator reached; \"N OOM\": requests that failed at "
          "the recorded capacity; no min-fit ratio for traces of several devices (min-fit is per "
          "device, the peaks are totals)." + (
          " Each replay ran the trace's requests %d times on the same heap (`allocview replay --passes %d`): "
          "peaks and min-fit are over all passes." % (passes, passes) if passes > 1 else ""))
md.append("Configurations: " + "; ".join("%s = `%s`" % (labels[c], c) for c in confs) + ".")
for line in open(notesfile):
    md.append(line.rstrip("\n"))
for p in problems:
    md.append("PROBLEM: " + p)
text = "\n".join(md) + "\n"
open(os.path.join(out, "fragmentation.md"), "w").write(text)
json.dump({"configurations": confs, "passes": passes, "traces": rows, "problems": problems},
          open(os.path.join(out, "fragmentation.json"), "w"), indent=1)
sys.stdout.write(text)
sys.exit(1 if problems else 0)
PY
echo "fragmentation.sh: wrote $out/fragmentation.md and $out/fragmentation.json" >&2
exit $status
