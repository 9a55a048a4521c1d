/* fuzz_import.c — libFuzzer target for `allocview import` (tools/allocview/import.c): any bytes
 * given as a PyTorch memory snapshot must be converted or refused with a message — never a crash,
 * an out-of-bounds access or unbounded memory — and a trace it does write must read back whole
 * with allocview's own trace reader. The pickle reader is fuzzed alone by fuzz_pickle; here the
 * mutations reach the conversion: segments, blocks, device traces, frames and annotations of any
 * shape. Seeds: the pickle corpus (real snapshots cut short, and crafted documents).
 */
// sources: tools/allocview/import.c tools/allocview/trace_writer.c tools/allocview/pickle.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c tools/allocview/u64map.c tools/allocview/text.c src/error.c tools/allocview/ranges.c tools/allocview/xalloc.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tools/allocview/reader.h"
#include "../../tools/allocview/replay.h"
#include "fuzz_tmpdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char in_path[96], out_path[96];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!in_path[0]) {
        snprintf(in_path, sizeof in_path, "%s/in.pickle", fuzz_tmpdir());
        snprintf(out_path, sizeof out_path, "%s/out.trace", fuzz_tmpdir());
    }
    if (!fuzz_write_input(in_path, data, size))
        return 0;
    unlink(out_path); /* what is there afterwards is this run's */
    char *argv[] = {"import", in_path, "-o", out_path, NULL};
    int st = av_cmd_import(4, argv);
    if (st == 0) {
        /* What was written reads back to its end, every record known to the reader. */
        char err[256];
        tr_reader_t *r = tr_open(out_path, err, sizeof err);
        if (!r)
            abort();
        tr_record_t rec;
        int k;
        while ((k = tr_next(r, &rec)) > 0)
            ;
        if (k < 0)
            abort();
        tr_close(r);
    }
    return 0;
}
