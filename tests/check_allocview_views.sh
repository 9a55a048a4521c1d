#!/usr/bin/env bash
# check_allocview_views.sh FIXTURE SITES_FIXTURE ALLOCVIEW EXPECTED_DIR — allocview's timeline, diff
# and folded against deterministic traces: tests/trace_fixture.c (recorder, sim device) and
# tests/trace_sites_fixture.c (chosen call sites, variants A and B differing by one site).
#   timeline --ascii --no-color --width 48 equals expected/timeline_*.txt; --svg parses as XML
#   with one area path per top site (plus "other") and one reserved line, and never overwrites
#   the trace it draws; diff A B names the one
#   site that grew; folded gives 'frames bytes' lines; every command on a cut-short trace exits
#   0 or 3 and never crashes; --help for each.   UPDATE_EXPECTED=1 rewrites the expected files.
set -u
fixture=$1 sites=$2 allocview=$3 expected=$4
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
fixture=$(abs "$fixture") sites=$(abs "$sites") allocview=$(abs "$allocview")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

export CUALLOC_CONF=driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:0
unset RANK LOCAL_RANK NO_COLOR
"$fixture" "$tmp/fx.trace" 2>/dev/null || { echo "FAIL: trace_fixture did not run"; exit 1; }
"$sites" A "$tmp/a.trace" || { echo "FAIL: trace_sites_fixture A did not run"; exit 1; }
"$sites" B "$tmp/b.trace" || { echo "FAIL: trace_sites_fixture B did not run"; exit 1; }

compare() { # NAME FILE
    if [ "${UPDATE_EXPECTED:-0}" = 1 ]; then
        cp "$2" "$expected/$1"; echo "updated $expected/$1"
    elif ! diff -u "$expected/$1" "$2"; then
        bad "$1 differs (UPDATE_EXPECTED=1 to regenerate)"
    fi
}

# 1. timeline text, exactly (paths replaced by a fixed name).
( cd "$tmp" && "$allocview" timeline --ascii --no-color --width 48 fx.trace ) >"$tmp/tl_fx.txt" || bad "timeline fixture exited $?"
compare timeline_fixture.txt "$tmp/tl_fx.txt"
( cd "$tmp" && "$allocview" timeline --ascii --no-color --width 48 --top 3 a.trace ) >"$tmp/tl_a.txt" || bad "timeline sites exited $?"
compare timeline_sites.txt "$tmp/tl_a.txt"
grep -q '\^' "$tmp/tl_fx.txt" || bad "timeline: no peak marker"
# One column: the time axis still reads "0", then the end (it read "023.000 us", the 0 run into it).
"$allocview" timeline --ascii --no-color --width 1 "$tmp/fx.trace" >"$tmp/tl_w1.txt" || bad "timeline --width 1 exited $?"
grep -q '^time      0 23.000 us$' "$tmp/tl_w1.txt" || bad "timeline --width 1: time axis $(grep "^time  " "$tmp/tl_w1.txt")"
grep -q '^! OOM ' "$tmp/tl_fx.txt" || bad "timeline: the fixture's OOM is not shown"
# Unicode by default; no colour when not on a terminal.
"$allocview" timeline --width 30 "$tmp/fx.trace" >"$tmp/tl_u.txt" || bad "timeline (unicode) exited $?"
grep -q '▁\|▂\|▃\|▄\|▅\|▆\|▇\|█' "$tmp/tl_u.txt" || bad "timeline: no block characters by default"
if grep -q $'\033' "$tmp/tl_u.txt"; then bad "timeline: colour escapes when stdout is not a terminal"; fi
"$allocview" timeline --json "$tmp/a.trace" >"$tmp/tl.json" || bad "timeline --json exited $?"

# 2. SVG: valid XML, one area per top site (+ other), the reserved line, marks, the OOM.
"$allocview" timeline --top 3 --no-color --svg "$tmp/a.svg" "$tmp/a.trace" >/dev/null || bad "timeline --svg exited $?"
"$allocview" timeline --no-color --svg "$tmp/fx.svg" "$tmp/fx.trace" >/dev/null || bad "timeline --svg (fixture) exited $?"
areas=$(grep -c '<path class="area"' "$tmp/a.svg")
[ "$areas" = 4 ] || bad "svg: $areas area paths, want 3 top sites + other"
[ "$(grep -c '<path class="reserved"' "$tmp/a.svg")" = 1 ] || bad "svg: want one reserved line"
[ "$(grep -c 'class="mark"' "$tmp/a.svg")" = 4 ] || bad "svg: want 4 mark rules"
grep -q 'class="oom"' "$tmp/fx.svg" || bad "svg: the fixture's OOM is not marked"
grep -q 'MiB</text>' "$tmp/a.svg" || bad "svg: no axis in MiB"
if command -v python3 >/dev/null 2>&1; then
    for f in a.svg fx.svg; do
        python3 -c "import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])" "$tmp/$f" || bad "$f is not valid XML"
    done
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['columns'])==72 and d['peak_live_bytes']>0" \
        "$tmp/tl.json" || bad "timeline --json: not the expected JSON"
    # Its times count from the first event, as peak --json's do; column i starts at the first
    # nanosecond the column rule (t * width / (duration + 1), rounded down) puts in it.
    "$allocview" peak --json "$tmp/a.trace" >"$tmp/peak.json" || bad "peak --json exited $?"
    python3 - "$tmp/tl.json" "$tmp/peak.json" <<'PY' || bad "timeline --json: times not from the first event, or columns misplaced"
import json, sys
t, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert t["peak_live_time_ns"] == p["peak"]["time_ns"] and t["first_event_ns"] > 0, (t["peak_live_time_ns"], p["peak"])
n, w = t["duration_ns"] + 1, t["width"]
assert [c["start_ns"] for c in t["columns"]] == [-(-i * n // w) for i in range(w)], t["columns"][:3]
assert all(0 <= m["time_ns"] <= t["duration_ns"] for m in t["marks"]), t["marks"]
PY
else
    echo "python3 not found: skipping the XML and JSON parse checks"
fi

# The legend's names, cut to fit, lose their middle, not their end, where labels that begin alike
# differ (variant L: two sites "libtorch_cuda.so+0x7000 <- forward (model.py:42) <- block
# (model.py:100)" and "...:200)").
"$sites" L "$tmp/l.trace" || bad "trace_sites_fixture L did not run"
"$allocview" timeline --no-color --svg "$tmp/l.svg" "$tmp/l.trace" >/dev/null || bad "timeline --svg (L) exited $?"
legend=$(sed -n '/<g class="legend">/,/<\/g>/s/.*<text[^>]*>\(.*\)<\/text>.*/\1/p' "$tmp/l.svg")
[ "$(echo "$legend" | grep -c 'model.py:[12]00)$')" = 2 ] && [ -z "$(echo "$legend" | sort | uniq -d)" ] ||
    bad "svg (L): legend entries that cannot be told apart: $legend"
# --top 32 (the most allowed) on variant K's 45 sites: each of the 32 areas has a colour of its
# own, and every row of the legend (32 sites and "other") lies inside the chart (the palette had
# 12 colours, repeated, and the legend ran past the chart's 520 pixels from its 28th row).
"$sites" K "$tmp/k.trace" || bad "trace_sites_fixture K did not run"
"$allocview" timeline --no-color --top 32 --svg "$tmp/k.svg" "$tmp/k.trace" >/dev/null || bad "timeline --svg (K) exited $?"
if command -v python3 >/dev/null 2>&1; then
    python3 - "$tmp/k.svg" <<'PY' || bad "svg --top 32: colours repeated or legend outside the chart"
import sys, xml.dom.minidom
d = xml.dom.minidom.parse(sys.argv[1])
svg = d.documentElement
h = float(svg.getAttribute("height"))
assert svg.getAttribute("viewBox").split()[3] == svg.getAttribute("height"), svg.getAttribute("viewBox")
fills = [p.getAttribute("fill") for p in d.getElementsByTagName("path") if p.getAttribute("class") == "area"]
assert len(fills) == 33 and len(set(fills)) == 33, fills
legend = [g for g in d.getElementsByTagName("g") if g.getAttribute("class") == "legend"][0]
rows = legend.getElementsByTagName("rect")
assert len(rows) == 33, len(rows)
for r in rows:
    assert float(r.getAttribute("y")) + float(r.getAttribute("height")) <= h, (r.getAttribute("y"), h)
PY
fi

# 2a. --svg naming the trace itself (or a link to it) is refused, status 1, and the trace is
#     left as it was; an unwritable chart names why.
cp "$tmp/a.trace" "$tmp/keep.trace"
ln -s a.trace "$tmp/a-link.trace"
for svg in "$tmp/a.trace" "$tmp/a-link.trace"; do
    "$allocview" timeline --svg "$svg" "$tmp/a.trace" >/dev/null 2>"$tmp/svg.err"; rc=$?
    [ "$rc" = 1 ] || bad "timeline --svg $svg onto its trace exited $rc, want 1"
    grep -q "is the trace itself" "$tmp/svg.err" || bad "timeline --svg onto its trace: $(cat "$tmp/svg.err")"
    cmp -s "$tmp/a.trace" "$tmp/keep.trace" || { bad "timeline --svg $svg overwrote the trace"; cp "$tmp/keep.trace" "$tmp/a.trace"; }
done
"$allocview" timeline --svg "$tmp" "$tmp/a.trace" >/dev/null 2>"$tmp/svg.err"; rc=$?
[ "$rc" = 2 ] || bad "timeline --svg onto a directory exited $rc, want 2 (an output that cannot be written, as import and export)"
grep -q "cannot write $tmp: Is a directory" "$tmp/svg.err" || bad "timeline --svg onto a directory: $(cat "$tmp/svg.err")"
rm -f "$tmp/a-link.trace"

# 2b. Mark labels that are not UTF-8 (Latin-1) or long: --json stays JSON (UTF-8 text; a byte that
#     is no character reads U+FFFD), and a label cut to fit is cut between characters.
"$sites" U "$tmp/u.trace" || bad "trace_sites_fixture U did not run"
"$allocview" timeline --json "$tmp/u.trace" >"$tmp/u.json" || bad "timeline --json (U) exited $?"
if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
assert "caf\ufffd" in [m["label"] for m in d["marks"]], d["marks"]
' "$tmp/u.json" || bad "timeline --json of Latin-1 marks is not UTF-8 JSON: $(grep -o '"marks".*' "$tmp/u.json")"
    # the long label is cut before its first e-acute, not inside it
    python3 -c '
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
assert "x" * 94 in [m["label"] for m in d["marks"]], d["marks"]
' "$tmp/u.json" || bad "timeline cuts a mark inside a UTF-8 character: $(grep -o '"marks".*' "$tmp/u.json")"
    # the report's phase label (63 bytes at most) is cut before the e-acute that straddles its end
    "$allocview" --json "$tmp/u.trace" >"$tmp/u-report.json" || bad "report --json (U) exited $?"
    python3 -c '
import json, sys
text = open(sys.argv[1], "rb").read().decode("utf-8")
json.loads(text)
assert "\"" + "y" * 62 + "\"" in text, "no label of the 62 y"
' "$tmp/u-report.json" || bad "the report cuts a phase label inside a UTF-8 character: $(grep -o '"y[^"]*"' "$tmp/u-report.json")"
fi

# 3. diff: the site B adds, and nothing else changed.
"$allocview" diff "$tmp/a.trace" "$tmp/b.trace" >"$tmp/diff.txt" || bad "diff exited $?"
grep -q '+24.00 MiB .*libtorch_cuda.so+0x6000  (new in B)' "$tmp/diff.txt" || bad "diff does not name the new site: $(cat "$tmp/diff.txt")"
[ "$(grep -c '(new in B)\|(gone in B)\|MiB  [^(]' "$tmp/diff.txt")" -ge 1 ] || bad "diff: no site lines"
grep -q '5 sites unchanged' "$tmp/diff.txt" || bad "diff: sites matched across traces should be unchanged: $(cat "$tmp/diff.txt")"
# A device with no blocks in either trace: no site to sort (qsort was given a null array, which
# the sanitizer build's UBSan stops at).
"$allocview" diff --device 5 "$tmp/a.trace" "$tmp/b.trace" >"$tmp/diff5.txt" 2>"$tmp/diff5.err" ||
    bad "diff --device 5 exited $?: $(cat "$tmp/diff5.err")"
if grep -q "runtime error" "$tmp/diff5.err"; then bad "diff --device 5: $(cat "$tmp/diff5.err")"; fi
grep -q '^peak allocated  297.00 MiB -> 321.00 MiB' "$tmp/diff.txt" || bad "diff: peaks: $(cat "$tmp/diff.txt")"
"$allocview" diff --json "$tmp/a.trace" "$tmp/b.trace" >"$tmp/diff.json" || bad "diff --json exited $?"
grep -q '"stack": "main (train.py:10);remember (cache.py:9);' "$tmp/diff.json" || bad "diff --json: $(cat "$tmp/diff.json")"
"$allocview" diff "$tmp/a.trace" "$tmp/a.trace" | grep -q 'no call site changed' || bad "diff A A: changes"
# Stacks with one label are one site in diff too (variant G, made in 4c below: its two operators
# under act.py:66 are one row of 39 MiB, as in peak), the JSON's stack the frames of the larger.
"$sites" G "$tmp/g.trace" || bad "trace_sites_fixture G did not run"
"$allocview" diff "$tmp/a.trace" "$tmp/g.trace" >"$tmp/diff_g.txt" || bad "diff A G exited $?"
[ "$(grep -c 'libtorch_cuda.so+0x7000' "$tmp/diff_g.txt")" = 1 ] &&
    grep -q '^ *+39.00 MiB  *0 B  *39.00 MiB  libtorch_cuda.so+0x7000  (new in B)$' "$tmp/diff_g.txt" ||
    bad "diff A G: the gelu line is not one site of 39 MiB: $(cat "$tmp/diff_g.txt")"
"$allocview" diff --json "$tmp/a.trace" "$tmp/g.trace" | grep -q '"stack": "main (train.py:10);gelu (act.py:66);libtorch_cuda.so+0x2200;libtorch_cuda.so+0x7000", "a_bytes": 0, "b_bytes": 40894464' ||
    bad "diff --json A G: $("$allocview" diff --json "$tmp/a.trace" "$tmp/g.trace")"

# 4. folded: root first, bytes last, the allocator's frame folded away.
"$allocview" folded "$tmp/a.trace" >"$tmp/a.folded" || bad "folded exited $?"
[ "$(wc -l <"$tmp/a.folded")" = 5 ] || bad "folded: want 5 lines: $(cat "$tmp/a.folded")"
grep -q '^main (train.py:10);step (optim.py:120);libtorch_cuda.so+0x4000 134217728$' "$tmp/a.folded" || bad "folded: $(cat "$tmp/a.folded")"
if grep -q '0x4321' "$tmp/a.folded"; then bad "folded: the allocator's frame is not folded"; fi
"$allocview" sites --folded "$tmp/a.trace" | cmp -s - "$tmp/a.folded" || bad "sites --folded differs from folded"
sum=$(awk '{s += $NF} END {print s}' "$tmp/a.folded")
[ "$sum" = $((297 * 1048576)) ] || bad "folded: bytes sum to $sum, want the peak 297 MiB"

# 4b. A trace naming a FIFO (or any file not regular) as a module: allocview does not open it to
#     wait for a writer, and names the frames module+offset.
mkfifo "$tmp/libtorch_cuda.so"
SITES_TORCH_PATH=$tmp/libtorch_cuda.so "$sites" A "$tmp/fifo.trace" || bad "trace_sites_fixture A (FIFO) did not run"
timeout 20 "$allocview" folded "$tmp/fifo.trace" >"$tmp/fifo.folded" 2>&1
st=$?
[ $st = 0 ] || bad "folded on a trace naming a FIFO as a module: exit $st (124: it waited on the FIFO)"
grep -q 'libtorch_cuda.so+0x4000 134217728$' "$tmp/fifo.folded" || bad "folded (FIFO module): $(cat "$tmp/fifo.folded")"

# 4b2. Modules whose files are regular but not ELF (200 of them, variant J) use no file descriptor
#      once looked at: with 64 descriptors allowed, the one real site after them is still named.
mkdir "$tmp/junk"
i=0
while [ $i -lt 200 ]; do echo "not an ELF file" >"$tmp/junk/$i"; i=$((i + 1)); done
SITES_JUNK_DIR=$tmp/junk "$sites" J "$tmp/junk.trace" || bad "trace_sites_fixture J did not run"
(ulimit -n 64 && "$allocview" folded "$tmp/junk.trace") >"$tmp/junk.folded" 2>&1 || bad "folded (J) exited $?"
grep -q '^junk_sites_real (trace_sites_fixture.c:[0-9]*) 512$' "$tmp/junk.folded" ||
    bad "folded (J): the real site is not named after 200 non-ELF modules: $(grep -v '^0 ' "$tmp/junk.folded" | tail -3)"

# 4c. Call sites a label cannot tell apart (variant G: one Python line through two operators that
# allocate through one shared frame) are one row, in the text and in --json: 6 blocks, 39 MiB.
"$sites" G "$tmp/g.trace" || bad "trace_sites_fixture G did not run"
"$allocview" peak --no-color "$tmp/g.trace" >"$tmp/g_peak.txt" || bad "peak (G) exited $?"
rows=$(grep -c 'gelu (act.py:66)' "$tmp/g_peak.txt")
[ "$rows" = 1 ] || bad "peak (G): the gelu line is on $rows rows, want 1"
grep -q '39.00 MiB .* 6  libtorch_cuda.so+0x7000 <- gelu (act.py:66)' "$tmp/g_peak.txt" ||
    bad "peak (G): the gelu row does not hold both operators' 6 blocks: $(grep gelu "$tmp/g_peak.txt")"
dups=$(sed -n 's/^ *[0-9.]* [KMG]*i*B *[0-9.]*% *[0-9]*  //p' "$tmp/g_peak.txt" | sort | uniq -d)
[ -z "$dups" ] || bad "peak (G): rows with the same call site: $dups"
if command -v python3 >/dev/null 2>&1; then
    "$allocview" peak --json "$tmp/g.trace" | python3 -c '
import json, sys
d = json.load(sys.stdin)
def lists(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, list) and v and isinstance(v[0], dict) and "site" in v[0]:
                yield v
            else:
                yield from lists(v)
    elif isinstance(x, list):
        for v in x:
            yield from lists(v)
found = False
for l in lists(d):
    sites = [s["site"] for s in l]
    assert len(sites) == len(set(sites)), sites
    g = [s for s in l if "gelu" in s["site"]]
    if g:
        assert len(g) == 1 and g[0]["blocks"] == 6 and g[0]["bytes"] == 39 << 20, g
        found = True
assert found, "no gelu site in the JSON"
' || bad "peak --json (G): the gelu site is not one entry of 6 blocks"
fi

# 4d. Stacks that differ only in the allocator's frames (variant W: the activations enter libcualloc.so
# through two of its functions) are one call site in the timeline, as in folded and peak: one row of
# top sites holding the site's own largest live bytes (39 MiB, the six blocks of a step; each stack
# alone held 18 or 21 MiB), one area of the SVG, one entry of --json's sites.
"$sites" W "$tmp/w.trace" || bad "trace_sites_fixture W did not run"
"$allocview" timeline --ascii --no-color "$tmp/w.trace" >"$tmp/w_tl.txt" || bad "timeline (W) exited $?"
rows=$(grep -c 'libtorch_cuda.so+0x2000' "$tmp/w_tl.txt")
[ "$rows" = 1 ] || bad "timeline (W): the activations' site is on $rows rows, want 1: $(sed -n '/top sites/,$p' "$tmp/w_tl.txt")"
grep -q '^ *39.00 MiB  libtorch_cuda.so+0x2000$' "$tmp/w_tl.txt" ||
    bad "timeline (W): the activations' site does not hold both stacks' 39 MiB: $(grep 0x2000 "$tmp/w_tl.txt")"
"$allocview" timeline --no-color --svg "$tmp/w.svg" "$tmp/w.trace" >/dev/null || bad "timeline --svg (W) exited $?"
areas=$(grep -c '<path class="area"' "$tmp/w.svg")
[ "$areas" = 5 ] || bad "svg (W): $areas area paths, want the 5 sites of A"
[ "$(grep -c '<title>libtorch_cuda.so+0x2000</title>' "$tmp/w.svg")" = 1 ] || bad "svg (W): the activations' site is not one area"
if command -v python3 >/dev/null 2>&1; then
    "$allocview" timeline --json "$tmp/w.trace" | python3 -c '
import json, sys
d = json.load(sys.stdin)
s = [x for x in d["sites"] if "0x2000" in x["name"]]
assert len(d["sites"]) == 5 and len(s) == 1 and s[0]["max_live_bytes"] == 39 << 20, d["sites"]
for c in d["columns"]:
    assert sum(c["sites"]) == c["live_bytes"], c
' || bad "timeline --json (W): the activations are not one site of 39 MiB"
fi
[ "$("$allocview" folded "$tmp/w.trace" | grep -c 'libtorch_cuda.so+0x2000')" = 1 ] || bad "folded (W): not one line for the activations"
# Variant G's two operators under one Python line have different frames but one label: one row of
# the timeline too (39 MiB), as in peak (4c), not two rows of the same text.
"$allocview" timeline --ascii --no-color "$tmp/g.trace" >"$tmp/g_tl.txt" || bad "timeline (G) exited $?"
rows=$(grep -c 'libtorch_cuda.so+0x7000' "$tmp/g_tl.txt")
[ "$rows" = 1 ] && grep -q '^ *39.00 MiB  libtorch_cuda.so+0x7000' "$tmp/g_tl.txt" ||
    bad "timeline (G): the gelu line is not one site of 39 MiB: $(sed -n '/top sites/,$p' "$tmp/g_tl.txt")"

# 5. Cut-short and corrupt traces: exit 0 or 3, never a crash.
for t in fx a; do
    size=$(wc -c <"$tmp/$t.trace")
    for cut in 4200 $((4096 + 65536 + 200)) $((size / 2)) $((size - 1000)); do
        head -c "$cut" "$tmp/$t.trace" >"$tmp/cut.trace"
        for cmd in "timeline" "timeline --json" "timeline --svg $tmp/cut.svg" "folded" "diff $tmp/a.trace"; do
            $allocview $cmd "$tmp/cut.trace" >/dev/null 2>&1
            st=$?
            [ $st = 0 ] || [ $st = 3 ] || bad "$cmd on $t cut at $cut: exit $st"
        done
        # --svg writes its file even when the cut left no event (an empty chart)
        rm -f "$tmp/cut.svg"
        $allocview timeline --svg "$tmp/cut.svg" "$tmp/cut.trace" >/dev/null 2>&1
        [ -s "$tmp/cut.svg" ] || bad "timeline --svg on $t cut at $cut wrote no file"
    done
    cp "$tmp/$t.trace" "$tmp/bad.trace"
    printf '\377\377\377\377\377' | dd of="$tmp/bad.trace" bs=1 seek=$((4096 + 65536 + 40)) conv=notrunc status=none
    for cmd in "timeline" "timeline --svg $tmp/bad.svg" "folded" "diff $tmp/a.trace"; do
        $allocview $cmd "$tmp/bad.trace" >/dev/null 2>&1
        st=$?
        [ $st = 0 ] || [ $st = 3 ] || bad "$cmd on corrupt $t: exit $st"
    done
done

# 5b. More leaking call sites (variant K: 40) than the report keeps diagnoses: `leaks --top N`
#     lists N of them (it stopped near 32, yet said --top N lists more), the default report says how
#     many it left out, and --json lists --top of them.
"$sites" K "$tmp/k.trace" || bad "trace_sites_fixture K did not run"
"$allocview" leaks --no-color --top 100 "$tmp/k.trace" >"$tmp/k100.txt" || bad "leaks --top 100 (K) exited $?"
[ "$(grep -c '^  [0-9]*\. Leak: call site keep_' "$tmp/k100.txt")" = 40 ] && ! grep -q "more leaking" "$tmp/k100.txt" ||
    bad "leaks --top 100 does not list the 40 leaks: $(grep -c 'Leak:' "$tmp/k100.txt") listed; $(grep 'more leaking' "$tmp/k100.txt")"
"$allocview" leaks --no-color --top 35 "$tmp/k.trace" | grep -q '^  \.\.\. 5 more leaking call sites (--top N lists more)$' ||
    bad "leaks --top 35 does not say 5 more"
"$allocview" --no-color "$tmp/k.trace" | grep -q '^  \.\.\. [0-9]* more leaking call sites: allocview leaks --top 40 lists every one$' ||
    bad "the report does not say it left leaks out: $("$allocview" --no-color "$tmp/k.trace" | tail -2)"
if command -v python3 >/dev/null 2>&1; then
    "$allocview" leaks --json --top 38 "$tmp/k.trace" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert len(d["diagnosis"]) == 38 and d["num_leaks"] == 40, (len(d["diagnosis"]), d["num_leaks"])
' || bad "leaks --json --top 38 (K) does not list 38 of 40"
fi

# 5c. A leak in a small trace without step marks (variant M: 100 allocations in a file of two 64 KiB
#     blocks): judged over windows of allocations, counted, not guessed from the file's size (the
#     guess made one window of a thousand allocations: no leak could show). A trace with too few
#     allocations for any window says so rather than "none".
"$sites" M "$tmp/m.trace" || bad "trace_sites_fixture M did not run"
"$allocview" leaks --no-color "$tmp/m.trace" >"$tmp/m.txt" || bad "leaks (M) exited $?"
grep -q '^  1\. Leak: call site keep (losses.py:7) grew from .* over [0-9]* time windows' "$tmp/m.txt" ||
    bad "the leak without step marks is not found: $(cat "$tmp/m.txt")"
"$allocview" --no-color "$tmp/m.trace" | grep -q 'Leak: call site keep (losses.py:7)' ||
    bad "the report does not diagnose the leak without step marks"
"$sites" X "$tmp/x1.trace" || bad "trace_sites_fixture X did not run"
"$allocview" leaks --no-color "$tmp/x1.trace" | grep -q '^  none found: too few allocations to judge (1 allocation: 0 windows of 16;' ||
    bad "leaks on one allocation: $("$allocview" leaks --no-color "$tmp/x1.trace")"
# One step mark (variant N, M with a mark at its end): a step's own build-up would read as a leak
# over windows (a one-step PyTorch snapshot's activations and optimizer state did), so no leak is
# judged. Memory kept only in the last quarter of the windows (F: an optimizer's state made late)
# is not judged a leak without marks.
"$sites" N "$tmp/n.trace" && "$sites" F "$tmp/f.trace" || bad "trace_sites_fixture N or F did not run"
"$allocview" leaks --no-color "$tmp/n.trace" | grep -q '^  none judged: the trace has 1 step mark, and a leak shows over 3 steps or more\.$' ||
    bad "leaks with one step mark: $("$allocview" leaks --no-color "$tmp/n.trace")"
"$allocview" leaks --no-color "$tmp/f.trace" >"$tmp/f.txt"
! grep -q 'Leak:' "$tmp/f.txt" && grep -q "^  none: no call site's live bytes grew window after window (16 windows of 21 allocations)" "$tmp/f.txt" ||
    bad "memory kept in the last quarter taken for a leak: $(cat "$tmp/f.txt")"
# A site that grew over the first 48 of 80 steps and then held its memory to the end (E) stopped
# growing before the last quarter of the windows: no leak.
"$sites" E "$tmp/e.trace" || bad "trace_sites_fixture E did not run"
"$allocview" leaks --no-color "$tmp/e.trace" >"$tmp/e.txt"
! grep -q 'Leak:' "$tmp/e.txt" && grep -q "^  none: no call site's live bytes grew window after window" "$tmp/e.txt" ||
    bad "growth that stopped before the last quarter taken for a leak: $(cat "$tmp/e.txt")"

# 5b'. sites --folded takes --no-color as the other views do, and a --top it cannot use is named as
#      such, under the command typed (both were "allocview folded: unknown option").
"$allocview" sites --folded --no-color "$tmp/k.trace" | grep -q '^main (train.py:10);keep_1 (leaks.py:1) 5242880$' ||
    bad "sites --folded --no-color: $("$allocview" sites --folded --no-color "$tmp/k.trace" 2>&1 | head -3)"
"$allocview" sites --folded --top 5 "$tmp/k.trace" >/dev/null 2>"$tmp/kf.err"; rc=$?
[ $rc = 1 ] && grep -q "^allocview sites --folded: folded stacks list every call site, so they take no --top" "$tmp/kf.err" ||
    bad "sites --folded --top 5: exit $rc, $(cat "$tmp/kf.err")"

# 5b''. A peak in the column of an OOM: the '!' is drawn, and the legend says the peak is under it
#       (it named a '^' the line did not show).
"$allocview" timeline --ascii --no-color --width 1 "$tmp/fx.trace" | grep -q "^\^ peak .* (in the column of the OOM's '!'); " ||
    bad "timeline --width 1: the peak under the OOM's '!' is not said: $("$allocview" timeline --ascii --no-color --width 1 "$tmp/fx.trace" 2>&1)"
"$allocview" timeline --ascii --no-color "$tmp/a.trace" | grep -q "in the column of the OOM" &&
    bad "a peak with no OOM in its column said to be under one"

# 5c. Replay of devices no sim device can be: a granularity of 3 bytes is named and replaced by
#     2 MiB, and device 70 (past the sim's 64) is named as what cannot be replayed (exit 2); both
#     said "the heap could not be set up", with no reason.
"$sites" X "$tmp/x.trace" || bad "trace_sites_fixture X did not run"
"$allocview" replay "$tmp/x.trace" >"$tmp/x.out" 2>"$tmp/x.err" &&
    grep -q "device 0's recorded granularity (3 B) is not a power of two from 4 KiB to 1 GiB; replaying it with 2 MiB" "$tmp/x.err" &&
    grep -q '^default .* 1.00 MiB ' "$tmp/x.out" ||
    bad "replay of a 3-byte granularity: exit $?, $(cat "$tmp/x.err" "$tmp/x.out")"
"$sites" Y "$tmp/y.trace" || bad "trace_sites_fixture Y did not run"
rc=0
"$allocview" replay --min-fit "$tmp/y.trace" >"$tmp/y.out" 2>"$tmp/y.err" || rc=$?
[ $rc = 2 ] && grep -q "device 70 holds requests, but the sim device has 64 devices at most (0 to 63): this trace cannot be replayed" "$tmp/y.err" ||
    bad "replay of device 70: exit $rc, $(cat "$tmp/y.err" "$tmp/y.out")"

# 6. Usage.
for cmd in timeline diff folded; do
    "$allocview" $cmd --help | grep -q "^usage: allocview $cmd" || bad "$cmd --help"
    "$allocview" $cmd >/dev/null 2>&1
    [ $? = 1 ] || bad "$cmd without a trace: want exit 1"
    "$allocview" $cmd --bogus "$tmp/a.trace" >/dev/null 2>&1
    [ $? = 1 ] || bad "$cmd --bogus: want exit 1"
done
"$allocview" timeline --width 0 "$tmp/a.trace" >/dev/null 2>&1
[ $? = 1 ] || bad "timeline --width 0: want exit 1"
"$allocview" timeline "$tmp/missing.trace" >/dev/null 2>&1
[ $? = 2 ] || bad "timeline of a missing file: want exit 2"

[ $fail = 0 ] && echo "check_allocview_views: all passed"
exit $fail
