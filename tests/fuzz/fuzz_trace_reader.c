/* fuzz_trace_reader.c — libFuzzer target for the trace reader (tools/allocview/reader.c): any
 * bytes given as a trace file must neither crash, hang nor read out of bounds; the reader returns
 * records in increasing sequence order, each inside the input, then ends or reports an error; the
 * formatter, the stack walk and the accounting take whatever it returns. Seeds: real traces with
 * 4 KiB blocks (tests/fuzz/corpus_trace_reader, written by `test_trace --corpus DIR`).
 * Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc
 *        tests/fuzz/fuzz_trace_reader.c tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c -o fuzz_trace_reader
 */
// sources: tools/allocview/reader.c tools/allocview/devaddr_map.c tools/allocview/lib_oom.c
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/allocview/reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    tr_reader_t *r = tr_open_mem(data, size, err, sizeof err);
    if (!r) {
        if (!err[0] || strlen(err) >= sizeof err)
            abort(); /* a refusal always says why */
        return 0;
    }
    static tr_acct_t acct;
    tr_acct_init(&acct);
    tr_record_t rec;
    char line[8192];
    tr_frame_t frames[128];
    uint64_t prev = 0;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        if (rec.seq <= prev || rec.offset + rec.length > size || rec.length == 0)
            abort();
        prev = rec.seq;
        tr_format(r, &rec, 0, line, sizeof line);
        tr_format(r, &rec, TR_FMT_REDACT | TR_FMT_OFFSETS, line, 64); /* a short buffer: cut, terminated */
        if (strlen(line) >= 64)
            abort();
        if (rec.known && (rec.type == CUA_TRACE_ALLOC || rec.type == CUA_TRACE_OOM))
            tr_stack_frames(r, rec.stack, frames, 128);
        uint64_t handle, tid;
        const char *name;
        tr_stream_handle(r, rec.stream, &handle);
        tr_thread_info(r, rec.thread, &tid, &name);
        tr_acct_add(&acct, &rec);
    }
    if (k < 0 && !tr_error(r)[0])
        abort(); /* an error always says where */
    tr_acct_free(&acct);
    tr_close(r);
    return 0;
}
