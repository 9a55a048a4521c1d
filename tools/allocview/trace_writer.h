/* trace_writer.h — an offline writer of cualloc trace files (include/cualloc_trace.h), for
 * `allocview import`: records with given times, devices, streams and stacks, written to a linear
 * file (no ring) in the recorder's layout (4096-byte header, 65536-byte blocks, META and EVENT
 * blocks in serial order). src/trace.c's recorder cannot serve: it is one global live recorder
 * that stamps its own clock, threads and stacks. Events are written with CUA_TRACE_F_BYTES and
 * every field explicit (no SAME_* flags) except the per-block address delta; times must not go
 * backwards (a smaller time is written as the previous one).
 */
#ifndef CUALLOC_TRACE_WRITER_H
#define CUALLOC_TRACE_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tw tw_t;

/* Creates the trace file `path` and writes its header; NULL with the reason in err otherwise, which
 * names the file `shown` (the destination, where path is a temporary file beside it). */
tw_t *tw_open(const char *path, const char *shown, char *err, size_t errlen);
/* Closes the file, writing an END record (reason stop, no statistics) first when end is true.
 * Returns false when any write failed (the message in err). */
bool tw_close(tw_t *w, bool end, char *err, size_t errlen);

/* Definitions (META). Ids of streams, PYFRAMEs and stacks are chosen by the caller: 1, 2, ... */
bool tw_process(tw_t *w, const char *cmdline, const char *recorder, uint64_t realtime_ns);
bool tw_config(tw_t *w, const char *conf);
bool tw_device(tw_t *w, uint32_t dev, uint64_t total, uint64_t capacity, uint64_t granularity, bool vmm,
               const char *name);
bool tw_stream(tw_t *w, uint32_t id, uint64_t handle);
bool tw_pyframe(tw_t *w, uint32_t id, uint64_t line, const char *function, const char *file);
bool tw_stack(tw_t *w, uint32_t id, uint32_t parent, uint8_t kind, uint64_t value);

/* Events. size = allocated (rounded) bytes, requested <= size. */
bool tw_alloc(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size,
              uint64_t requested, uint32_t stack, bool initial);
bool tw_free(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size, bool completed);
bool tw_free_done(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size);
bool tw_map(tw_t *w, uint64_t time_ns, uint32_t dev, uint64_t addr, uint64_t size, bool unmap, bool initial);
bool tw_trim(tw_t *w, uint64_t time_ns, uint32_t dev);
bool tw_oom(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint32_t stack, uint64_t requested,
            uint64_t rounded, uint64_t capacity, uint64_t allocated, uint64_t reserved, uint64_t device_free,
            uint64_t largest_free);
/* A label longer than TW_LABEL_MAX bytes is cut there (a record must fit in one block). */
#define TW_LABEL_MAX 60000u
bool tw_mark(tw_t *w, uint64_t time_ns, const char *label);

#endif
