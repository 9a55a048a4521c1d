/* fuzz_export.c — libFuzzer target for `allocview export --pytorch` (tools/allocview/export.c):
 * any bytes given as a trace must be exported or refused with a message — never a crash, an
 * out-of-bounds access or a half-written file — and a snapshot it does write must parse with
 * allocview's own pickle reader, with the keys the viewer needs. The exporter's consistency checks
 * (blocks in mapped memory, maps and unmaps that agree, inferred starting state) are what the
 * mutations reach. Seeds: the trace reader's corpus (real traces with 4 KiB blocks).
 */
// sources: tools/allocview/export.c tools/allocview/analysis.c tools/allocview/devices.c tools/allocview/symbolize.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c tools/allocview/pickle_writer.c tools/allocview/pickle.c tools/allocview/text.c src/error.c tools/allocview/ranges.c tools/allocview/xalloc.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tools/allocview/pickle.h"
#include "../../tools/allocview/replay.h"
#include "fuzz_tmpdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char in_path[96], out_path[96];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!in_path[0]) {
        snprintf(in_path, sizeof in_path, "%s/in.trace", fuzz_tmpdir());
        snprintf(out_path, sizeof out_path, "%s/out.pickle", fuzz_tmpdir());
    }
    if (!fuzz_write_input(in_path, data, size))
        return 0;
    unlink(out_path); /* what is there afterwards is this run's */
    char *argv[] = {"export", "--pytorch", out_path, in_path, NULL};
    int st = av_cmd_export(4, argv);
    FILE *o = fopen(out_path, "rb");
    if (st != 0 && st != 3 && o)
        abort(); /* refused as unreadable, yet something was written */
    if (o) {
        static uint8_t buf[1 << 24];
        size_t n = fread(buf, 1, sizeof buf, o);
        fclose(o);
        char err[256];
        pk_doc_t *doc = pk_load(buf, n, NULL, err, sizeof err);
        if (!doc) {
            fprintf(stdout, "the export does not parse: %s\n", err);
            abort();
        }
        const py_t *root = pk_root(doc);
        if (!py_dict_get(root, "segments") || !py_dict_get(root, "device_traces"))
            abort();
        pk_free(doc);
    }
    /* No partial file may be left behind. */
    char partial[160];
    snprintf(partial, sizeof partial, "%s.partial.%ld", out_path, (long)getpid());
    if (access(partial, F_OK) == 0)
        abort();
    return 0;
}
