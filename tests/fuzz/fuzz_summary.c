/* fuzz_summary.c — libFuzzer target for allocview's `summary` and `dump` (tools/allocview/summary.c,
 * dump.c): any bytes given as a trace must give an answer or a clear refusal — never a crash, an
 * out-of-bounds access or a hang — through `summary` (text and --json, which print the process's
 * strings, each device's name and figures, and the END record's statistics) and `dump` (plain,
 * --redact and --offsets, every record's line). The options are main.c's to parse; the target
 * calls the commands with what each option sets. Seeds: the report fuzzer's (corpus_summary links
 * to corpus_report: real traces with 4 KiB blocks, an import of a PyTorch-shaped snapshot).
 */
// sources: tools/allocview/summary.c tools/allocview/dump.c tools/allocview/folded.c tools/allocview/devices.c tools/allocview/symbolize.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c tools/allocview/text.c tools/allocview/xalloc.c src/error.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../tools/allocview/views.h"
#include "fuzz_tmpdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 0 (read), 2 (unreadable), 3 (corrupt after a readable prefix): nothing else. */
static void expect_status(int st)
{
    if (st != VW_EXIT_OK && st != VW_EXIT_UNREADABLE && st != VW_EXIT_CORRUPT)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_trace_input(data, size);
    if (!path)
        return 0;
    expect_status(av_cmd_summary(path, false));
    expect_status(av_cmd_summary(path, true));
    expect_status(av_cmd_dump(path, 0));
    expect_status(av_cmd_dump(path, TR_FMT_REDACT));
    expect_status(av_cmd_dump(path, TR_FMT_OFFSETS));
    return 0;
}
