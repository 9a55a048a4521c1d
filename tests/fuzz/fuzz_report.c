/* fuzz_report.c — libFuzzer target for allocview's reports on a trace (tools/allocview/report.c,
 * analysis.c, symbolize.c, and folded.c's views): any bytes given as a trace must give a report or
 * a clear refusal — never a crash or an out-of-bounds access — through the after-a-crash report,
 * `oom --json` and `folded`, whose call-site naming (frame texts, C++ name shortening, labels that
 * tell sites apart, step and optimizer marks) reads every string a trace holds. Seeds: the trace
 * reader's corpus (real traces with 4 KiB blocks), an optimizer-step scenario and the import of a
 * PyTorch-shaped snapshot (tests/make_snapshot.py varlen).
 */
// sources: tools/allocview/report.c tools/allocview/analysis.c tools/allocview/devices.c tools/allocview/symbolize.c tools/allocview/folded.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c tools/allocview/text.c tools/allocview/ranges.c src/oom.c src/conf.c src/error.c tools/allocview/xalloc.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../tools/allocview/report.h"
#include "../../tools/allocview/views.h"
#include "fuzz_tmpdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_trace_input(data, size);
    if (!path)
        return 0;
    char *report[] = {"--no-color", path, NULL};
    int st = report_main("report", 2, report);
    char *oom[] = {"--json", path, NULL};
    int st2 = report_main("oom", 2, oom);
    char *folded[] = {"folded", path, NULL};
    int st3 = av_cmd_folded(2, folded);
    /* 0 (read), 2 (unreadable), 3 (corrupt after a readable prefix): nothing else. */
    if ((st != 0 && st != 2 && st != 3) || (st2 != 0 && st2 != 2 && st2 != 3) || (st3 != 0 && st3 != 2 && st3 != 3))
        abort();
    return 0;
}
