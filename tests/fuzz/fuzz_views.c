/* fuzz_views.c — libFuzzer target for allocview's views and replay of a trace
 * (tools/allocview/timeline.c, diff.c, replay.c): any bytes given as a trace must give an answer or
 * a clear refusal — never a crash, an out-of-bounds access or a hang — through `timeline` (text,
 * --json and --svg, which lay out every record's time and call site), `diff` of the trace against
 * itself (which matches call sites across the two), and `replay`
 * (whose requests, streams and devices drive cualloc's own heap on the sim device: a record's size,
 * stream or device the reader accepts must not break the heap or the replay's bookkeeping), with
 * two configurations, two passes, and once with every free as cudaFree. Seeds: the report fuzzer's
 * (corpus_views links to corpus_report: real traces with 4 KiB blocks, an import of a PyTorch-
 * shaped snapshot).
 */
// sources: tools/min_fit_search.c tools/allocview/timeline.c tools/allocview/diff.c tools/allocview/replay.c tools/allocview/folded.c tools/allocview/analysis.c tools/allocview/devices.c tools/allocview/symbolize.c tools/allocview/report.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c tools/allocview/text.c tools/allocview/ranges.c tools/allocview/u64map.c tools/allocview/pickle.c tools/allocview/pickle_writer.c tools/allocview/trace_writer.c tools/allocview/import.c tools/allocview/export.c tools/allocview/xalloc.c src/api.c src/conf.c src/driver_cuda.c src/driver_sim.c src/error.c src/grow_table.c src/heap.c src/oom.c src/ptrmap.c src/sizeclass.c src/slab.c src/stats.c src/trace.c src/tree.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tools/allocview/replay.h"
#include "../../tools/allocview/views.h"
#include "fuzz_tmpdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char svg[96];

/* 0 (read), 1 (a usage refusal: a configuration the trace's devices cannot take), 2 (unreadable),
 * 3 (corrupt after a readable prefix): nothing else. */
static void expect_status(int st)
{
    if (st < 0 || st > 3)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_trace_input(data, size);
    if (!path)
        return 0;
    if (!svg[0])
        snprintf(svg, sizeof svg, "%s/out.svg", fuzz_tmpdir());

    char *timeline[] = {"timeline", "--width", "40", path, NULL};
    expect_status(av_cmd_timeline(4, timeline));
    char *timeline_json[] = {"timeline", "--json", path, NULL};
    expect_status(av_cmd_timeline(3, timeline_json));
    unlink(svg);
    char *timeline_svg[] = {"timeline", "--svg", svg, path, NULL};
    expect_status(av_cmd_timeline(4, timeline_svg));

    char *diff_self[] = {"diff", "--all", path, path, NULL};
    expect_status(av_cmd_diff(4, diff_self));
    char *diff_json[] = {"diff", "--json", path, path, NULL};
    expect_status(av_cmd_diff(4, diff_json));

    char *replay[] = {"replay", "--conf", "default", "--conf", "expandable_segments:0", "--passes", "2", path, NULL};
    expect_status(av_cmd_replay(8, replay));
    char *replay_cudafree[] = {"replay", "--cudafree", "--device-lag", "3", "--json", path, NULL};
    expect_status(av_cmd_replay(6, replay_cudafree));
    return 0;
}
