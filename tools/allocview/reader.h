/* reader.h — a streaming reader of cualloc trace files (include/cualloc_trace.h), for allocview
 * and the tests. It owns decoding, validation and the definition tables (threads, streams, stack
 * nodes, Python frames, modules, devices); what to make of the events is its callers' (plus one
 * helper, tr_acct, that keeps the running totals every report needs).
 *
 * Use:  tr_reader_t *r = tr_open(path, err, sizeof err);
 *       tr_record_t rec;  int k;
 *       while ((k = tr_next(r, &rec)) > 0) { ... }
 *       if (k < 0) fprintf(stderr, "%s\n", tr_error(r));
 *       tr_close(r);
 *
 * Memory grows with the definitions (stacks, threads, streams, modules) and, in tr_acct, with
 * live blocks — never with the number of events: blocks are read one at a time per kind. The
 * reader never trusts the file: every length, varint and id is checked; on the first corrupt
 * record it stops with a message naming the offset, having returned every record before it.
 * A file cut short (a partial copy) ends like a crash: tr_next returns 0 and tr_warning() says
 * where. An event naming a stack id larger than the file could define reads as stack 0 (unknown). Not thread-safe: one reader per thread.
 */
#ifndef CUALLOC_READER_H
#define CUALLOC_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "cualloc_trace.h"
#include "devaddr_map.h"

typedef struct tr_reader tr_reader_t;

/* A string field: points into the reader's buffers, valid until the next tr_next; not
 * NUL-terminated. */
typedef struct tr_str { const char *p; size_t len; } tr_str_t;

typedef struct tr_end_dev {
    uint32_t dev;
    uint32_t nfields;                  /* fields the file had (the rest of v[] is 0) */
    uint64_t v[CUA_TRACE_STAT_COUNT];  /* enum cua_trace_stat */
} tr_end_dev_t;

/* One record, decoded. Events carry absolute values (the deltas resolved); sizes in bytes. */
typedef struct tr_record {
    uint8_t type;          /* enum cua_trace_record, or a type this reader does not know */
    bool known;            /* false: an unknown type, skipped (only seq/offset/length are set) */
    uint64_t seq;
    uint64_t offset;       /* file offset of the record (its length prefix) */
    uint32_t length;       /* bytes of the whole record, length prefix included */
    uint8_t flags;         /* events: CUA_TRACE_F_* as written */
    /* events */
    uint64_t time_ns;
    uint32_t dev, thread, stream, stack;
    uint64_t addr, size, requested;
    union {
        struct { uint64_t pid, ppid; int64_t rank; uint64_t realtime_ns, monotonic_ns; uint8_t clock;
                 tr_str_t host, cmdline, recorder; } process;
        tr_str_t text; /* CONFIG, MARK */
        struct { uint64_t dev, total, capacity, granularity; uint8_t mode; tr_str_t name; } device;
        struct { uint64_t base, start, end; tr_str_t path, build_id; } module;
        struct { uint64_t id, tid; tr_str_t name; } thread;
        struct { uint64_t id, handle; } stream;
        struct { uint64_t id, line; tr_str_t function, file; } pyframe;
        struct { uint64_t id, parent; uint8_t kind; uint64_t value; } stack;
        struct {
            uint64_t requested, rounded, capacity, allocated, reserved, device_free, largest_free;
            uint64_t vmm_failure; /* CUA_TRACE_VMM_*: 0 where the record has none (before format 1.1) */
        } oom;
        struct { uint64_t reason, dropped; uint32_t ndev; const tr_end_dev_t *devs; } end;
        struct { uint64_t table, since; } lost; /* LOST: CUA_TRACE_LOST_*; the refusal's time */
    } u;
} tr_record_t;

typedef struct tr_info {
    unsigned major, minor;
    uint32_t header_size, block_size, flags;
    uint64_t max_blocks;
    uint64_t file_size;
    bool ring;
    uint64_t first_event_serial;  /* ring: serial of the oldest surviving EVENT block */
    bool overwritten;             /* ring: older events were overwritten */
} tr_info_t;
/* How every command's warning about an overwritten ring begins (each says what its figures then
 * cover). */
#define TR_RING_OVERWRITTEN "a ring trace whose oldest events were overwritten"

/* Opens path for reading if it is a regular file, the only kind allocview reads (a trace, a
 * snapshot, a module a trace names): the descriptor, with *st filled; -1 when it cannot be opened
 * (errno says why); -2 when it is something else. O_NONBLOCK: opening a FIFO for reading would
 * wait for a writer, so it is refused at once; on a regular file the flag changes nothing. */
int tr_open_regular(const char *path, struct stat *st);

/* Opens a trace; NULL with a message in err (missing file, not a trace, newer major version
 * — "trace format version 2.0 is newer than this reader's 1.0" —, bad header). */
tr_reader_t *tr_open(const char *path, char *err, size_t errlen);
/* The same over bytes in memory (not copied: they must outlive the reader). */
tr_reader_t *tr_open_mem(const void *data, size_t len, char *err, size_t errlen);
/* The next record in sequence order: 1, 0 at the end, -1 on a corrupt record (tr_error). */
int tr_next(tr_reader_t *r, tr_record_t *rec);
const char *tr_error(const tr_reader_t *r);    /* "" when none */
const char *tr_warning(const tr_reader_t *r);  /* the file ended inside a block or record; "" */
const tr_info_t *tr_info(const tr_reader_t *r);
void tr_close(tr_reader_t *r);

/* Definitions seen so far. */
typedef struct tr_frame {
    uint8_t kind;            /* CUA_TRACE_FRAME_* */
    uint64_t addr;           /* NATIVE: return address */
    const char *module;      /* NATIVE: path of the module holding addr, or NULL */
    uint64_t module_offset;  /* addr - the module's base */
    const char *function, *file; /* PYTHON */
    uint64_t line;
} tr_frame_t;
/* The frames of stack `id`, innermost first; returns how many (<= max). */
size_t tr_stack_frames(const tr_reader_t *r, uint32_t id, tr_frame_t *out, size_t max);
uint32_t tr_stack_count(const tr_reader_t *r);
/* The build id recorded for the module at `path` (its latest record): its length, 0 when none
 * (*id then NULL). The bytes belong to the reader. */
size_t tr_module_build_id(const tr_reader_t *r, const char *path, const unsigned char **id);
bool tr_stream_handle(const tr_reader_t *r, uint32_t id, uint64_t *handle);
bool tr_thread_info(const tr_reader_t *r, uint32_t id, uint64_t *tid, const char **name);

/* Text of one record for `allocview dump`: one line, no newline. TR_FMT_REDACT replaces what
 * differs between runs (pids, host, command line, wall-clock times, thread ids, module paths and
 * addresses, native frame addresses, the trace path in the configuration) with '*'. */
#define TR_FMT_REDACT 1u
#define TR_FMT_OFFSETS 2u  /* start the line with "@OFFSET " (the record's file offset) */
size_t tr_format(const tr_reader_t *r, const tr_record_t *rec, unsigned flags, char *buf, size_t len);
const char *tr_type_name(uint8_t type);   /* "alloc", ...; NULL when unknown */
const char *tr_end_reason_name(uint64_t reason);
/* "stacks", "streams", "python_frames", "python_names", "modules"; NULL for a table this reader
 * does not know. */
const char *tr_lost_table_name(uint64_t table);
/* A set of tables (bit 1 << CUA_TRACE_LOST_*; bit 0: table 0 or past 63) as text, "stacks, modules"
 * (a table this reader does not know: "table N", bit 0 "another table"); snprintf's return. */
size_t tr_lost_tables_text(uint64_t tables, char *buf, size_t len);

/* What a trace's LOST records say: which of the recorder's tables were refused host memory, and
 * when first. Every view that names call sites warns with tr_lost_text. */
typedef struct tr_lost {
    uint64_t tables; /* bit 1 << CUA_TRACE_LOST_* (bit 0: table 0 or past 63); 0: none */
    uint64_t time;   /* the earliest refusal's time (a ring's repeated LOST says when it came) */
} tr_lost_t;
void tr_lost_add(tr_lost_t *l, const tr_record_t *rec); /* any record; only LOST counts */
/* The warning, "the recorder ran out of host memory for its tables (stacks) at 1.234567 s: records
 * after that may lack call sites, streams or frame names that the program had" (the time counted
 * from t0, "before the first event here" when earlier, left out when t0 is NULL); "" and 0 when l
 * holds none. */
size_t tr_lost_text(const tr_lost_t *l, const uint64_t *t0, char *buf, size_t len);

/* ------------------------------------------------------------------------------ accounting */

/* Running totals over the records fed to tr_acct_add in order: counts, current and peak bytes
 * (requested, allocated = rounded, reserved = mapped), per device and summed over devices, and
 * the anomalies a consistent trace never has. */
typedef struct tr_acct_dev {
    bool seen;
    uint64_t requested, allocated, reserved;
    uint64_t requested_peak, allocated_peak, reserved_peak;
    uint64_t num_allocs, num_frees, num_maps, num_unmaps, num_trims, num_ooms;
    uint64_t live_blocks;
} tr_acct_dev_t;

typedef struct tr_acct {
    uint64_t num_records, num_unknown;
    uint64_t num_allocs, num_frees, num_free_done, num_maps, num_unmaps, num_trims, num_ooms, num_marks;
    uint64_t num_init_blocks, num_init_maps;
    uint64_t requested, allocated, reserved;               /* all devices */
    uint64_t requested_peak, allocated_peak, reserved_peak;
    uint64_t unmatched_frees;   /* free of an address not live (expected only in rings) */
    uint64_t double_allocs;     /* alloc of an address already live */
    uint64_t size_mismatches;   /* free whose size differs from its alloc's */
    uint64_t first_time, last_time;
    uint64_t event_bytes;       /* bytes of ALLOC and FREE records (the per-event figure) */
    bool any_event;
    bool end_seen;
    uint64_t end_reason, end_dropped;
    tr_lost_t lost;             /* LOST records */
    tr_acct_dev_t dev[CUA_TRACE_MAX_DEVICES];
    tr_end_dev_t end_devs[CUA_TRACE_MAX_DEVICES];
    uint32_t end_ndev;
    devaddr_map_t live;         /* live blocks; live.count: how many */
} tr_acct_t;

void tr_acct_init(tr_acct_t *a);
void tr_acct_add(tr_acct_t *a, const tr_record_t *rec);
/* tr_acct_add's first part: counts the record and moves the trace's clock (first and last event
 * times). True for an event, which tr_acct_add goes on to count; an analysis that leaves a record
 * out calls only this. */
bool tr_acct_clock(tr_acct_t *a, const tr_record_t *rec);
void tr_acct_free(tr_acct_t *a);

#endif
