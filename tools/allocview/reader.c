/* reader.c — reads cualloc trace files (include/cualloc_trace.h): the header, the blocks of each
 * kind in order, the records merged by sequence number, the definition tables; plus the record
 * formatter of `allocview dump` and the running totals (tr_acct) the reports share. It does not
 * print reports (the commands do) and never trusts its input: see reader.h.
 */
#include "reader.h"

#include "lib_oom.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_BLOCK_SIZE (1u << 24)
#define MIN_BLOCK_SIZE 256u

typedef struct cursor {
    uint8_t kind;
    bool done;              /* no more blocks */
    uint64_t scan;          /* linear: next file block to look at; ring events: index in order[] */
    uint8_t *buf;           /* the current block */
    size_t avail;           /* bytes of it the file has (< block_size: the file ends inside) */
    bool have;              /* a block is loaded */
    uint64_t block;         /* its number */
    size_t pos;
    bool started;           /* a block of this kind was seen (serial checks) */
    uint64_t serial;        /* the last block's serial */
    uint64_t last_seq;
    /* event delta state */
    uint64_t time;
    uint32_t dev, thread, stream, stack;
    uint64_t addr[CUA_TRACE_MAX_DEVICES];
    /* the next record, decoded (pending) */
    bool pending;
    bool bad;               /* hit a corrupt record: no more from this kind */
    tr_record_t rec;
    tr_end_dev_t end_devs[CUA_TRACE_MAX_DEVICES];
} cursor_t;

typedef struct node { uint64_t value; uint32_t parent; uint8_t kind; } node_t;
typedef struct pyf { char *function, *file; uint64_t line; } pyf_t;
typedef struct thr { uint64_t tid; char *name; } thr_t;
typedef struct mod { uint64_t base, start, end; char *path; unsigned char build_id[64]; unsigned build_id_len; } mod_t;

struct tr_reader {
    int fd;
    const uint8_t *mem;
    uint64_t size;
    tr_info_t info;
    uint64_t nblocks;       /* blocks the file has room for (a partial last one counts) */
    uint64_t *order;        /* ring: EVENT block numbers by serial */
    uint64_t norder;
    uint64_t *morder;       /* ring: META block numbers by serial (a META block takes the place of */
    uint64_t nmorder;       /* the oldest EVENT block, so file order is not serial order) */
    cursor_t meta, ev;
    char error[512];
    char warning[512];
    bool failed;            /* error[] holds the first error */
    bool stopped;           /* tr_next returns -1 from now on */
    uint64_t last_seq;      /* of the last record returned */
    /* definitions */
    node_t *nodes; uint32_t nnodes, cap_nodes;
    pyf_t *pyfs; uint32_t npyfs, cap_pyfs;
    thr_t *thrs; uint32_t nthrs, cap_thrs;
    uint64_t *streams; uint32_t nstreams, cap_streams;
    mod_t *mods; uint32_t nmods, cap_mods;
};

/* ---------------------------------------------------------------------------------- input */

static size_t read_at(tr_reader_t *r, uint64_t off, void *buf, size_t n)
{
    if (off >= r->size)
        return 0;
    if (n > r->size - off)
        n = (size_t)(r->size - off);
    if (r->mem) {
        memcpy(buf, r->mem + off, n);
        return n;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(r->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    return done;
}

__attribute__((format(printf, 2, 3))) static int fail(tr_reader_t *r, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->error, sizeof r->error, fmt, ap);
        va_end(ap);
        r->failed = true;
    }
    return -1;
}

__attribute__((format(printf, 2, 3))) static void warn(tr_reader_t *r, const char *fmt, ...)
{
    if (r->warning[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->warning, sizeof r->warning, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------- decoding */

/* A bounded reader over one record's body. */
typedef struct span { const uint8_t *p, *end; bool bad; } span_t;

static inline uint64_t sp_varint(span_t *s)
{
    /* Most fields are deltas below 128: one byte, decided at once. */
    if (__builtin_expect(s->p < s->end && *s->p < 0x80, 1))
        return *s->p++;
    uint64_t v = 0;
    for (unsigned i = 0; i < CUA_TRACE_VARINT_MAX; i++) {
        if (s->p >= s->end) {
            s->bad = true;
            return 0;
        }
        uint8_t b = *s->p++;
        if (i == CUA_TRACE_VARINT_MAX - 1 && b > 1) {
            s->bad = true;
            return 0;
        }
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80))
            return v;
    }
    s->bad = true;
    return 0;
}

static int64_t sp_svarint(span_t *s)
{
    uint64_t z = sp_varint(s);
    return (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
}

static uint8_t sp_u8(span_t *s)
{
    if (s->p >= s->end) {
        s->bad = true;
        return 0;
    }
    return *s->p++;
}

static tr_str_t sp_string(span_t *s)
{
    tr_str_t str = {"", 0};
    uint64_t n = sp_varint(s);
    if (s->bad || n > (uint64_t)(s->end - s->p)) {
        s->bad = true;
        return str;
    }
    str.p = (const char *)s->p;
    str.len = (size_t)n;
    s->p += n;
    return str;
}

static uint32_t sp_id(span_t *s)
{
    uint64_t v = sp_varint(s);
    if (v > UINT32_MAX)
        s->bad = true;
    return (uint32_t)v;
}

/* ---------------------------------------------------------------------------- definitions */

static char *dupstr(tr_str_t s)
{
    char *p = lib_malloc(s.len + 1);
    if (!p)
        return NULL;
    memcpy(p, s.p, s.len);
    p[s.len] = '\0';
    return p;
}

#define GROW(r, arr, n, cap)                                                                   \
    do {                                                                                       \
        if ((n) >= (cap)) {                                                                    \
            uint32_t nc = (cap) ? (cap) * 2 : 64;                                              \
            void *np = lib_realloc((arr), (size_t)nc * sizeof *(arr));                         \
            if (!np)                                                                           \
                return fail((r), "out of memory");                                             \
            (arr) = np;                                                                        \
            (cap) = nc;                                                                        \
        }                                                                                      \
    } while (0)

/* Takes in a definition record as it is emitted. -1 when it contradicts the format. */
static int define(tr_reader_t *r, const tr_record_t *rec)
{
    switch (rec->type) {
    case CUA_TRACE_STACK:
        if (rec->u.stack.id != (uint64_t)r->nnodes + 1 || rec->u.stack.parent >= rec->u.stack.id)
            return fail(r, "record at offset %" PRIu64 ": stack id %" PRIu64 " (parent %" PRIu64
                        ") out of order; expected %u",
                        rec->offset, rec->u.stack.id, rec->u.stack.parent, r->nnodes + 1);
        GROW(r, r->nodes, r->nnodes + 1, r->cap_nodes);
        r->nnodes++;
        r->nodes[r->nnodes] = (node_t){rec->u.stack.value, (uint32_t)rec->u.stack.parent, rec->u.stack.kind};
        return 0;
    case CUA_TRACE_PYFRAME: {
        if (rec->u.pyframe.id != (uint64_t)r->npyfs + 1)
            return fail(r, "record at offset %" PRIu64 ": Python frame id %" PRIu64 " out of order", rec->offset,
                        rec->u.pyframe.id);
        GROW(r, r->pyfs, r->npyfs + 1, r->cap_pyfs);
        pyf_t *f = &r->pyfs[++r->npyfs];
        f->function = dupstr(rec->u.pyframe.function);
        f->file = dupstr(rec->u.pyframe.file);
        f->line = rec->u.pyframe.line;
        return 0;
    }
    case CUA_TRACE_THREAD: {
        if (rec->u.thread.id != (uint64_t)r->nthrs + 1)
            return fail(r, "record at offset %" PRIu64 ": thread id %" PRIu64 " out of order", rec->offset,
                        rec->u.thread.id);
        GROW(r, r->thrs, r->nthrs + 1, r->cap_thrs);
        thr_t *t = &r->thrs[++r->nthrs];
        t->tid = rec->u.thread.tid;
        t->name = dupstr(rec->u.thread.name);
        return 0;
    }
    case CUA_TRACE_STREAM:
        if (rec->u.stream.id != (uint64_t)r->nstreams + 1)
            return fail(r, "record at offset %" PRIu64 ": stream id %" PRIu64 " out of order", rec->offset,
                        rec->u.stream.id);
        GROW(r, r->streams, r->nstreams + 1, r->cap_streams);
        r->streams[++r->nstreams] = rec->u.stream.handle;
        return 0;
    case CUA_TRACE_MODULE: {
        GROW(r, r->mods, r->nmods, r->cap_mods);
        mod_t *m = &r->mods[r->nmods++];
        m->base = rec->u.module.base;
        m->start = rec->u.module.start;
        m->end = rec->u.module.end;
        m->path = dupstr(rec->u.module.path);
        m->build_id_len = (unsigned)(rec->u.module.build_id.len < sizeof m->build_id ? rec->u.module.build_id.len
                                                                                   : sizeof m->build_id);
        memcpy(m->build_id, rec->u.module.build_id.p, m->build_id_len);
        return 0;
    }
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------------- blocks */

static uint64_t block_off(const tr_reader_t *r, uint64_t b) { return r->info.header_size + b * (uint64_t)r->info.block_size; }

typedef enum { BH_OK, BH_UNWRITTEN, BH_EOF, BH_BAD } bh_t;

/* Reads and checks block b's header. */
static bh_t block_header(tr_reader_t *r, uint64_t b, uint8_t h[CUA_TRACE_BLOCK_HEADER], const char **why)
{
    size_t n = read_at(r, block_off(r, b), h, CUA_TRACE_BLOCK_HEADER);
    if (n < 4)
        return BH_EOF; /* the file ends before the block's magic */
    if (cua_trace_get_le(h, 4) == 0)
        return BH_UNWRITTEN;
    if (memcmp(h, "CUAB", 4) != 0) {
        *why = "bad block magic";
        return BH_BAD;
    }
    if (n < CUA_TRACE_BLOCK_HEADER)
        return BH_EOF; /* the file ends inside the header: nothing of the block is there */
    if (cua_trace_get_le(h + CUA_TRACE_BOFF_CHECK, 2) != cua_trace_block_check(h)) {
        *why = "block header check mismatch";
        return BH_BAD;
    }
    if (h[CUA_TRACE_BOFF_KIND] != CUA_TRACE_BLOCK_META && h[CUA_TRACE_BOFF_KIND] != CUA_TRACE_BLOCK_EVENTS) {
        *why = "unknown block kind";
        return BH_BAD;
    }
    return BH_OK;
}

/* Loads block b into cursor c (its header already checked). */
static int cursor_load(tr_reader_t *r, cursor_t *c, uint64_t b, const uint8_t *h)
{
    uint64_t serial = cua_trace_get_le(h + CUA_TRACE_BOFF_SERIAL, 8), seq_base = cua_trace_get_le(h + CUA_TRACE_BOFF_SEQ_BASE, 8);
    if (c->started && serial != c->serial + 1)
        return fail(r, "block %" PRIu64 " at offset %" PRIu64 ": %s block serial %" PRIu64 " follows %" PRIu64
                    " (blocks missing or reordered)",
                    b, block_off(r, b), c->kind == CUA_TRACE_BLOCK_META ? "META" : "EVENT", serial, c->serial);
    if (!c->started && !r->info.ring && serial != 0)
        return fail(r, "block %" PRIu64 " at offset %" PRIu64 ": the first %s block has serial %" PRIu64, b,
                    block_off(r, b), c->kind == CUA_TRACE_BLOCK_META ? "META" : "EVENT", serial);
    if (c->started && seq_base < c->last_seq)
        return fail(r, "block %" PRIu64 " at offset %" PRIu64 ": sequence base %" PRIu64 " goes back (last %" PRIu64 ")",
                    b, block_off(r, b), seq_base, c->last_seq);
    c->avail = read_at(r, block_off(r, b), c->buf, r->info.block_size);
    c->started = true;
    c->serial = serial;
    c->have = true;
    c->block = b;
    c->pos = CUA_TRACE_BLOCK_HEADER;
    c->last_seq = seq_base;
    c->time = cua_trace_get_le(h + CUA_TRACE_BOFF_BASE_TIME, 8);
    c->dev = c->thread = c->stream = c->stack = 0;
    memset(c->addr, 0, sizeof c->addr);
    if (c->avail < r->info.block_size)
        warn(r, "the file ends inside block %" PRIu64 " (offset %" PRIu64 "): it was cut short", b, block_off(r, b));
    return 0;
}

/* Moves c to its next block: 1 loaded, 0 none left, -1 corrupt. */
static int cursor_advance(tr_reader_t *r, cursor_t *c)
{
    uint8_t h[CUA_TRACE_BLOCK_HEADER];
    const char *why = "";
    c->have = false;
    if (r->info.ring) {
        const uint64_t *order = c->kind == CUA_TRACE_BLOCK_EVENTS ? r->order : r->morder;
        uint64_t n = c->kind == CUA_TRACE_BLOCK_EVENTS ? r->norder : r->nmorder;
        while (c->scan < n) {
            uint64_t b = order[c->scan++];
            if (block_header(r, b, h, &why) != BH_OK)
                continue; /* checked when indexed */
            return cursor_load(r, c, b, h) < 0 ? -1 : 1;
        }
        c->done = true;
        return 0;
    }
    while (c->scan < r->nblocks) {
        uint64_t b = c->scan++;
        switch (block_header(r, b, h, &why)) {
        case BH_EOF:
            c->done = true;
            return 0;
        case BH_UNWRITTEN:
            continue;
        case BH_BAD:
            return fail(r, "block %" PRIu64 " at offset %" PRIu64 ": %s", b, block_off(r, b), why);
        case BH_OK:
            if (h[CUA_TRACE_BOFF_KIND] != c->kind)
                continue;
            return cursor_load(r, c, b, h) < 0 ? -1 : 1;
        }
    }
    c->done = true;
    return 0;
}

/* ------------------------------------------------------------------------------- records */

static int decode_event(tr_reader_t *r, cursor_t *c, tr_record_t *rec, span_t *s)
{
    uint8_t f = sp_u8(s);
    rec->flags = f;
    if (f & ~CUA_TRACE_F_ALL)
        return fail(r, "record at offset %" PRIu64 ": unknown event flags 0x%02x", rec->offset, f);
    uint64_t dt = sp_varint(s);
    if (UINT64_MAX - c->time < dt)
        return fail(r, "record at offset %" PRIu64 ": time overflows", rec->offset);
    uint64_t time = c->time + dt;
    uint32_t dev = c->dev, thread = c->thread, stream = c->stream, stack = c->stack;
    if (!(f & CUA_TRACE_F_SAME_DEV)) {
        uint64_t d = sp_varint(s);
        if (d >= CUA_TRACE_MAX_DEVICES)
            return fail(r, "record at offset %" PRIu64 ": device %" PRIu64 " out of range", rec->offset, d);
        dev = (uint32_t)d;
    }
    if (!(f & CUA_TRACE_F_SAME_THREAD))
        thread = sp_id(s);
    uint8_t t = rec->type;
    bool has_stream = t == CUA_TRACE_ALLOC || t == CUA_TRACE_FREE || t == CUA_TRACE_FREE_DONE || t == CUA_TRACE_OOM ||
                      t == CUA_TRACE_INIT_BLOCK;
    bool has_addr = t == CUA_TRACE_ALLOC || t == CUA_TRACE_FREE || t == CUA_TRACE_FREE_DONE || t == CUA_TRACE_MAP ||
                    t == CUA_TRACE_UNMAP || t == CUA_TRACE_INIT_BLOCK || t == CUA_TRACE_INIT_MAP;
    bool has_slack = t == CUA_TRACE_ALLOC || t == CUA_TRACE_INIT_BLOCK;
    if (has_stream && !(f & CUA_TRACE_F_SAME_STREAM))
        stream = sp_id(s);
    if (t == CUA_TRACE_OOM && !(f & CUA_TRACE_F_SAME_STACK))
        stack = sp_id(s);
    uint64_t addr = 0, size = 0, requested = 0;
    if (has_addr) {
        uint64_t unit = (f & CUA_TRACE_F_BYTES) ? 1 : CUA_TRACE_UNIT;
        int64_t d = sp_svarint(s);
        uint64_t sz = sp_varint(s);
        if (sz > UINT64_MAX / unit)
            return fail(r, "record at offset %" PRIu64 ": size out of range", rec->offset);
        addr = c->addr[dev] + (uint64_t)d * unit; /* wraps as the writer's difference did */
        size = sz * unit;
        requested = size;
    }
    if (has_slack && !(f & CUA_TRACE_F_EXACT)) {
        uint64_t slack = sp_varint(s);
        if (slack > size)
            return fail(r, "record at offset %" PRIu64 ": requested size below zero (slack %" PRIu64 " > size %" PRIu64 ")",
                        rec->offset, slack, size);
        requested = size - slack;
    }
    if (has_slack && !(f & CUA_TRACE_F_SAME_STACK))
        stack = sp_id(s);
    switch (t) {
    case CUA_TRACE_OOM:
        rec->u.oom.requested = sp_varint(s);
        rec->u.oom.rounded = sp_varint(s);
        rec->u.oom.capacity = sp_varint(s);
        rec->u.oom.allocated = sp_varint(s);
        rec->u.oom.reserved = sp_varint(s);
        rec->u.oom.device_free = sp_varint(s);
        rec->u.oom.largest_free = sp_varint(s);
        /* Format 1.1 added it: a record of 1.0 ends before it. */
        rec->u.oom.vmm_failure = s->p < s->end ? sp_varint(s) : CUA_TRACE_VMM_NONE;
        break;
    case CUA_TRACE_MARK:
        rec->u.text = sp_string(s);
        break;
    case CUA_TRACE_LOST: {
        rec->u.lost.table = sp_varint(s);
        uint64_t ago = sp_varint(s);
        rec->u.lost.since = ago < time ? time - ago : 0;
        break;
    }
    case CUA_TRACE_END: {
        rec->u.end.reason = sp_varint(s);
        rec->u.end.dropped = sp_varint(s);
        uint64_t n = sp_varint(s);
        if (n > CUA_TRACE_MAX_DEVICES)
            return fail(r, "record at offset %" PRIu64 ": END lists %" PRIu64 " devices", rec->offset, n);
        for (uint64_t i = 0; i < n && !s->bad; i++) {
            tr_end_dev_t *e = &c->end_devs[i];
            memset(e, 0, sizeof *e);
            uint64_t dv = sp_varint(s), nf = sp_varint(s);
            if (dv >= CUA_TRACE_MAX_DEVICES || nf > 4096)
                return fail(r, "record at offset %" PRIu64 ": bad END device entry", rec->offset);
            e->dev = (uint32_t)dv;
            e->nfields = (uint32_t)nf;
            for (uint64_t k = 0; k < nf && !s->bad; k++) {
                uint64_t v = sp_varint(s);
                if (k < CUA_TRACE_STAT_COUNT)
                    e->v[k] = v;
            }
        }
        rec->u.end.ndev = (uint32_t)n;
        rec->u.end.devs = c->end_devs;
        break;
    }
    default:
        break;
    }
    if (s->bad)
        return fail(r, "record at offset %" PRIu64 ": %s record's fields overrun its length (%u bytes)", rec->offset,
                    tr_type_name(t), rec->length);
    rec->time_ns = time;
    rec->dev = dev;
    rec->thread = thread;
    rec->stream = has_stream ? stream : 0;
    /* Stack ids count the file's STACK records (1, 2, ...; an event may come before the records of
     * its own stack in sequence order), and a STACK record takes at least 7 bytes: an id past
     * what the file could hold is damage. It reads as 0, unknown, so that no caller sizes a
     * table by it. The delta state keeps the value as written. */
    rec->stack = (has_slack || t == CUA_TRACE_OOM) && stack <= r->size / 7 ? stack : 0;
    rec->addr = addr;
    rec->size = size;
    rec->requested = requested;
    /* The delta state, as the format defines it. A LOST record takes no part in it: a reader of
     * format 1.1 skips the record, and must read the same times after it. */
    if (t == CUA_TRACE_LOST)
        return 0;
    c->time = time;
    c->dev = dev;
    c->thread = thread;
    if (has_stream)
        c->stream = stream;
    if (has_slack || t == CUA_TRACE_OOM)
        c->stack = stack;
    if (has_addr)
        c->addr[dev] = addr;
    return 0;
}

static int decode_meta(tr_reader_t *r, tr_record_t *rec, span_t *s)
{
    switch (rec->type) {
    case CUA_TRACE_PROCESS:
        rec->u.process.pid = sp_varint(s);
        rec->u.process.ppid = sp_varint(s);
        rec->u.process.rank = sp_svarint(s);
        rec->u.process.realtime_ns = sp_varint(s);
        rec->u.process.monotonic_ns = sp_varint(s);
        rec->u.process.clock = sp_u8(s);
        rec->u.process.host = sp_string(s);
        rec->u.process.cmdline = sp_string(s);
        rec->u.process.recorder = sp_string(s);
        break;
    case CUA_TRACE_CONFIG:
        rec->u.text = sp_string(s);
        break;
    case CUA_TRACE_DEVICE:
        rec->u.device.dev = sp_varint(s);
        rec->u.device.total = sp_varint(s);
        rec->u.device.capacity = sp_varint(s);
        rec->u.device.granularity = sp_varint(s);
        rec->u.device.mode = sp_u8(s);
        rec->u.device.name = sp_string(s);
        break;
    case CUA_TRACE_MODULE:
        rec->u.module.base = sp_varint(s);
        rec->u.module.start = sp_varint(s);
        rec->u.module.end = sp_varint(s);
        rec->u.module.path = sp_string(s);
        rec->u.module.build_id = sp_string(s);
        break;
    case CUA_TRACE_THREAD:
        rec->u.thread.id = sp_varint(s);
        rec->u.thread.tid = sp_varint(s);
        rec->u.thread.name = sp_string(s);
        break;
    case CUA_TRACE_STREAM:
        rec->u.stream.id = sp_varint(s);
        rec->u.stream.handle = sp_varint(s);
        break;
    case CUA_TRACE_PYFRAME:
        rec->u.pyframe.id = sp_varint(s);
        rec->u.pyframe.line = sp_varint(s);
        rec->u.pyframe.function = sp_string(s);
        rec->u.pyframe.file = sp_string(s);
        break;
    case CUA_TRACE_STACK:
        rec->u.stack.id = sp_varint(s);
        rec->u.stack.parent = sp_varint(s);
        rec->u.stack.kind = sp_u8(s);
        rec->u.stack.value = sp_varint(s);
        if (!s->bad && rec->u.stack.kind > CUA_TRACE_FRAME_PYTHON)
            return fail(r, "record at offset %" PRIu64 ": unknown frame kind %u", rec->offset, rec->u.stack.kind);
        break;
    default:
        return 0;
    }
    if (s->bad)
        return fail(r, "record at offset %" PRIu64 ": %s record's fields overrun its length (%u bytes)", rec->offset,
                    tr_type_name(rec->type), rec->length);
    return 0;
}

static bool type_known(uint8_t t)
{
    return (t >= CUA_TRACE_PROCESS && t <= CUA_TRACE_STACK) || (t >= CUA_TRACE_ALLOC && t <= CUA_TRACE_LOST);
}

/* Decodes c's next record into c->rec: 1 done, 0 no more, -1 corrupt. */
static int cursor_next(tr_reader_t *r, cursor_t *c)
{
    for (;;) {
        if (c->done)
            return 0;
        if (!c->have) {
            int k = cursor_advance(r, c);
            if (k <= 0)
                return k;
        }
        size_t bs = r->info.block_size;
        uint64_t off = block_off(r, c->block) + c->pos;
        if (c->pos >= c->avail) {
            if (c->avail < bs && c->pos < bs) {
                /* The file ends here: whatever followed is unknown. */
                c->done = true;
                return 0;
            }
            c->have = false;
            continue;
        }
        /* The length. */
        uint64_t len = 0;
        size_t i = 0;
        bool complete = false;
        for (; i < 4 && c->pos + i < c->avail; i++) {
            uint8_t b = c->buf[c->pos + i];
            len |= (uint64_t)(b & 0x7f) << (7 * i);
            if (!(b & 0x80)) {
                complete = true;
                i++;
                break;
            }
        }
        if (!complete) {
            if (c->pos + i >= c->avail && c->avail < bs) {
                warn(r, "the record at offset %" PRIu64 " is cut off by the end of the file", off);
                c->done = true;
                return 0;
            }
            return fail(r, "record at offset %" PRIu64 ": bad length", off);
        }
        if (len == 0) { /* the rest of the block is unused */
            c->have = false;
            continue;
        }
        if (len > bs - c->pos - i)
            return fail(r, "record at offset %" PRIu64 ": length %" PRIu64 " runs past the end of block %" PRIu64, off,
                        len, c->block);
        if (c->pos + i + len > c->avail) {
            warn(r, "the record at offset %" PRIu64 " is cut off by the end of the file", off);
            c->done = true;
            return 0;
        }
        span_t s = {c->buf + c->pos + i, c->buf + c->pos + i + len, false};
        tr_record_t *rec = &c->rec;
        memset(rec, 0, sizeof *rec);
        rec->offset = off;
        rec->length = (uint32_t)(i + len);
        rec->type = sp_u8(&s);
        uint64_t delta = sp_varint(&s);
        if (s.bad)
            return fail(r, "record at offset %" PRIu64 ": truncated type or sequence number", off);
        if (delta == 0 || delta > UINT64_MAX - c->last_seq)
            return fail(r, "record at offset %" PRIu64 ": sequence number does not increase (delta %" PRIu64 ")", off,
                        delta);
        rec->seq = c->last_seq + delta;
        rec->known = type_known(rec->type);
        if (rec->known) {
            if ((rec->type >= CUA_TRACE_FIRST_EVENT) != (c->kind == CUA_TRACE_BLOCK_EVENTS))
                return fail(r, "record at offset %" PRIu64 ": %s record in a %s block", off, tr_type_name(rec->type),
                            c->kind == CUA_TRACE_BLOCK_META ? "META" : "EVENT");
            int k = rec->type >= CUA_TRACE_FIRST_EVENT ? decode_event(r, c, rec, &s) : decode_meta(r, rec, &s);
            if (k < 0)
                return -1;
        }
        c->last_seq = rec->seq;
        c->pos += i + len;
        return 1;
    }
}

/* ---------------------------------------------------------------------------------- open */

typedef struct { uint64_t serial, block; } ser_t;

static int ser_cmp(const void *a, const void *b)
{
    const ser_t *x = a, *y = b;
    return x->serial < y->serial ? -1 : x->serial > y->serial;
}

static tr_reader_t *open_common(tr_reader_t *r, char *err, size_t errlen)
{
    uint8_t h[64];
    size_t n = read_at(r, 0, h, sizeof h);
    if (n < 40 || memcmp(h, CUA_TRACE_MAGIC, CUA_TRACE_MAGIC_LEN) != 0) {
        snprintf(err, errlen, "not a cualloc trace (%s)", n == 0 ? "the file is empty" : "no CUATRACE magic");
        goto bad;
    }
    r->info.major = (unsigned)cua_trace_get_le(h + CUA_TRACE_OFF_MAJOR, 2);
    r->info.minor = (unsigned)cua_trace_get_le(h + CUA_TRACE_OFF_MINOR, 2);
    if (r->info.major > CUA_TRACE_MAJOR || r->info.major == 0) {
        snprintf(err, errlen, "trace format version %u.%u is %s this reader's %d.%d; %s", r->info.major, r->info.minor,
                 r->info.major ? "newer than" : "not supported by", CUA_TRACE_MAJOR, CUA_TRACE_MINOR,
                 r->info.major ? "update allocview" : "the file is corrupt");
        goto bad;
    }
    r->info.header_size = (uint32_t)cua_trace_get_le(h + CUA_TRACE_OFF_HEADER_SIZE, 4);
    r->info.block_size = (uint32_t)cua_trace_get_le(h + CUA_TRACE_OFF_BLOCK_SIZE, 4);
    r->info.flags = (uint32_t)cua_trace_get_le(h + CUA_TRACE_OFF_FLAGS, 4);
    r->info.max_blocks = cua_trace_get_le(h + CUA_TRACE_OFF_MAX_BLOCKS, 8);
    r->info.file_size = r->size;
    uint32_t bs = r->info.block_size;
    if (r->info.header_size < 64 || r->info.header_size > 65536 || bs < MIN_BLOCK_SIZE || bs > MAX_BLOCK_SIZE ||
        (bs & (bs - 1))) {
        snprintf(err, errlen, "bad trace header (header size %u, block size %u)", r->info.header_size, bs);
        goto bad;
    }
    if (r->info.flags & ~CUA_TRACE_FILE_RING) {
        snprintf(err, errlen, "bad trace header (unknown flags 0x%x)", r->info.flags);
        goto bad;
    }
    r->info.ring = (r->info.flags & CUA_TRACE_FILE_RING) != 0;
    r->nblocks = r->size > r->info.header_size ? (r->size - r->info.header_size + bs - 1) / bs : 0;
    r->meta.kind = CUA_TRACE_BLOCK_META;
    r->ev.kind = CUA_TRACE_BLOCK_EVENTS;
    r->meta.buf = lib_malloc(bs);
    r->ev.buf = lib_malloc(bs);
    if (!r->meta.buf || !r->ev.buf) {
        snprintf(err, errlen, "out of memory");
        goto bad;
    }
    if (r->info.ring) {
        /* The ring is bounded by max_blocks: index its EVENT blocks by serial. */
        if (r->info.max_blocks == 0 || r->nblocks > r->info.max_blocks) {
            snprintf(err, errlen, "bad ring trace: %" PRIu64 " blocks, at most %" PRIu64 " allowed", r->nblocks,
                     r->info.max_blocks);
            goto bad;
        }
        size_t cap = (size_t)(r->nblocks ? r->nblocks : 1);
        ser_t *list = lib_malloc(cap * sizeof *list), *mlist = lib_malloc(cap * sizeof *mlist);
        r->order = lib_malloc(cap * sizeof *r->order);
        r->morder = lib_malloc(cap * sizeof *r->morder);
        if (!list || !mlist || !r->order || !r->morder) {
            free(list);
            free(mlist);
            snprintf(err, errlen, "out of memory");
            goto bad;
        }
        size_t k = 0, mk = 0;
        for (uint64_t b = 0; b < r->nblocks; b++) {
            uint8_t bh[CUA_TRACE_BLOCK_HEADER];
            const char *why = "";
            bh_t st = block_header(r, b, bh, &why);
            if (st == BH_BAD) {
                snprintf(err, errlen, "block %" PRIu64 " at offset %" PRIu64 ": %s", b, block_off(r, b), why);
                free(list);
                free(mlist);
                goto bad;
            }
            if (st == BH_OK && bh[CUA_TRACE_BOFF_KIND] == CUA_TRACE_BLOCK_EVENTS)
                list[k++] = (ser_t){cua_trace_get_le(bh + CUA_TRACE_BOFF_SERIAL, 8), b};
            else if (st == BH_OK)
                mlist[mk++] = (ser_t){cua_trace_get_le(bh + CUA_TRACE_BOFF_SERIAL, 8), b};
        }
        qsort(list, k, sizeof *list, ser_cmp);
        qsort(mlist, mk, sizeof *mlist, ser_cmp);
        for (size_t i = 0; i < k; i++)
            r->order[i] = list[i].block;
        for (size_t i = 0; i < mk; i++)
            r->morder[i] = mlist[i].block;
        r->norder = k;
        r->nmorder = mk;
        r->info.first_event_serial = k ? list[0].serial : 0;
        r->info.overwritten = k && list[0].serial > 0;
        free(list);
        free(mlist);
    }
    return r;
bad:
    tr_close(r);
    return NULL;
}

int tr_open_regular(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return -2;
    }
    return fd;
}

tr_reader_t *tr_open(const char *path, char *err, size_t errlen)
{
    struct stat st;
    int fd = tr_open_regular(path, &st);
    if (fd == -1) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fd < 0) {
        snprintf(err, errlen, "%s is not a regular file", path);
        return NULL;
    }
    tr_reader_t *r = lib_calloc(1, sizeof *r);
    if (!r) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->fd = fd;
    r->size = (uint64_t)st.st_size;
    return open_common(r, err, errlen);
}

tr_reader_t *tr_open_mem(const void *data, size_t len, char *err, size_t errlen)
{
    tr_reader_t *r = lib_calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->fd = -1;
    r->mem = data ? data : (const void *)"";
    r->size = data ? len : 0;
    return open_common(r, err, errlen);
}

void tr_close(tr_reader_t *r)
{
    if (!r)
        return;
    if (r->fd >= 0 && !r->mem)
        close(r->fd);
    free(r->meta.buf);
    free(r->ev.buf);
    free(r->order);
    free(r->morder);
    free(r->nodes);
    for (uint32_t i = 1; i <= r->npyfs; i++) {
        free(r->pyfs[i].function);
        free(r->pyfs[i].file);
    }
    free(r->pyfs);
    for (uint32_t i = 1; i <= r->nthrs; i++)
        free(r->thrs[i].name);
    free(r->thrs);
    free(r->streams);
    for (uint32_t i = 0; i < r->nmods; i++)
        free(r->mods[i].path);
    free(r->mods);
    free(r);
}

/* Merges the two kinds by sequence number. When one kind hits a corrupt record, the other's
 * records are still returned while they continue the sequence without a gap (then they certainly
 * precede the corrupt one, whose number the gap would hold); the first that does not ends the
 * read with the error. */
int tr_next(tr_reader_t *r, tr_record_t *rec)
{
    if (r->stopped)
        return -1;
    cursor_t *cs[2] = {&r->meta, &r->ev};
    for (int i = 0; i < 2; i++) {
        if (!cs[i]->pending && !cs[i]->bad) {
            int k = cursor_next(r, cs[i]);
            if (k < 0)
                cs[i]->bad = true;
            else
                cs[i]->pending = k > 0;
        }
    }
    cursor_t *c = NULL;
    if (r->meta.bad || r->ev.bad) {
        cursor_t *other = r->meta.bad ? &r->ev : &r->meta;
        if (other->bad || !other->pending || other->rec.seq != r->last_seq + 1) {
            r->stopped = true;
            return -1;
        }
        c = other;
    } else if (r->meta.pending && r->ev.pending) {
        if (r->meta.rec.seq == r->ev.rec.seq) {
            r->stopped = true;
            return fail(r, "records at offsets %" PRIu64 " and %" PRIu64 " share sequence number %" PRIu64,
                        r->meta.rec.offset, r->ev.rec.offset, r->ev.rec.seq);
        }
        c = r->meta.rec.seq < r->ev.rec.seq ? &r->meta : &r->ev;
    } else if (r->meta.pending) {
        c = &r->meta;
    } else if (r->ev.pending) {
        c = &r->ev;
    } else {
        return 0;
    }
    c->pending = false;
    *rec = c->rec;
    r->last_seq = rec->seq;
    if (rec->known && rec->type < CUA_TRACE_FIRST_EVENT && define(r, rec) < 0) {
        r->stopped = true;
        return -1;
    }
    return 1;
}

const char *tr_error(const tr_reader_t *r) { return r->error; }
const char *tr_warning(const tr_reader_t *r) { return r->warning; }
const tr_info_t *tr_info(const tr_reader_t *r) { return &r->info; }

/* ----------------------------------------------------------------------------- lookups */

size_t tr_module_build_id(const tr_reader_t *r, const char *path, const unsigned char **id)
{
    /* The latest record of that path: a file loaded again (after a rebuild) has its own. */
    for (uint32_t i = r->nmods; path && i-- > 0;)
        if (r->mods[i].path && strcmp(r->mods[i].path, path) == 0) {
            *id = r->mods[i].build_id;
            return r->mods[i].build_id_len;
        }
    *id = NULL;
    return 0;
}

static const mod_t *module_for(const tr_reader_t *r, uint64_t addr)
{
    /* The latest module covering addr wins (a later load at the same place replaces). */
    for (uint32_t i = r->nmods; i-- > 0;)
        if (addr >= r->mods[i].start && addr < r->mods[i].end)
            return &r->mods[i];
    return NULL;
}

size_t tr_stack_frames(const tr_reader_t *r, uint32_t id, tr_frame_t *out, size_t max)
{
    size_t n = 0;
    while (id && id <= r->nnodes && n < max) {
        const node_t *nd = &r->nodes[id];
        tr_frame_t *f = &out[n++];
        memset(f, 0, sizeof *f);
        f->kind = nd->kind;
        if (nd->kind == CUA_TRACE_FRAME_PYTHON) {
            if (nd->value >= 1 && nd->value <= r->npyfs) {
                f->function = r->pyfs[nd->value].function;
                f->file = r->pyfs[nd->value].file;
                f->line = r->pyfs[nd->value].line;
            }
        } else {
            f->addr = nd->value;
            const mod_t *m = module_for(r, nd->value);
            if (m) {
                f->module = m->path;
                f->module_offset = nd->value - m->base;
            }
        }
        id = nd->parent; /* parents are smaller ids: the walk ends */
    }
    return n;
}

uint32_t tr_stack_count(const tr_reader_t *r) { return r->nnodes; }

bool tr_stream_handle(const tr_reader_t *r, uint32_t id, uint64_t *handle)
{
    if (id == 0 || id > r->nstreams)
        return false;
    *handle = r->streams[id];
    return true;
}

bool tr_thread_info(const tr_reader_t *r, uint32_t id, uint64_t *tid, const char **name)
{
    if (id == 0 || id > r->nthrs)
        return false;
    *tid = r->thrs[id].tid;
    *name = r->thrs[id].name;
    return true;
}

/* ------------------------------------------------------------------------------ format */

static const char *const type_names[] = {
    [CUA_TRACE_PROCESS] = "process", [CUA_TRACE_CONFIG] = "config",   [CUA_TRACE_DEVICE] = "device",
    [CUA_TRACE_MODULE] = "module",   [CUA_TRACE_THREAD] = "thread",   [CUA_TRACE_STREAM] = "stream",
    [CUA_TRACE_PYFRAME] = "pyframe", [CUA_TRACE_STACK] = "stack",     [CUA_TRACE_ALLOC] = "alloc",
    [CUA_TRACE_FREE] = "free",       [CUA_TRACE_FREE_DONE] = "free_done", [CUA_TRACE_MAP] = "map",
    [CUA_TRACE_UNMAP] = "unmap",     [CUA_TRACE_TRIM] = "trim",       [CUA_TRACE_OOM] = "oom",
    [CUA_TRACE_MARK] = "mark",       [CUA_TRACE_INIT_BLOCK] = "init_block", [CUA_TRACE_INIT_MAP] = "init_map",
    [CUA_TRACE_END] = "end",         [CUA_TRACE_LOST] = "lost",
};

const char *tr_type_name(uint8_t type)
{
    return type < sizeof type_names / sizeof type_names[0] ? type_names[type] : NULL;
}

const char *tr_lost_table_name(uint64_t table)
{
    switch (table) {
    case CUA_TRACE_LOST_STACKS: return "stacks";
    case CUA_TRACE_LOST_STREAMS: return "streams";
    case CUA_TRACE_LOST_PYFRAMES: return "python_frames";
    case CUA_TRACE_LOST_PYNAMES: return "python_names";
    case CUA_TRACE_LOST_MODULES: return "modules";
    default: return NULL;
    }
}

size_t tr_lost_tables_text(uint64_t tables, char *buf, size_t len)
{
    size_t n = 0;
    if (len)
        buf[0] = '\0';
    for (unsigned t = 0; t < 64; t++) {
        if (!(tables & (1ull << t)))
            continue;
        const char *name = t ? tr_lost_table_name(t) : "another table";
        char other[24];
        if (!name) {
            snprintf(other, sizeof other, "table %u", t);
            name = other;
        }
        int k = n < len ? snprintf(buf + n, len - n, "%s%s", n ? ", " : "", name)
                        : snprintf(NULL, 0, "%s%s", n ? ", " : "", name);
        n += k > 0 ? (size_t)k : 0;
    }
    return n;
}

void tr_lost_add(tr_lost_t *l, const tr_record_t *rec)
{
    if (!rec->known || rec->type != CUA_TRACE_LOST)
        return;
    if (!l->tables || rec->u.lost.since < l->time)
        l->time = rec->u.lost.since;
    l->tables |= rec->u.lost.table < 64 ? 1ull << rec->u.lost.table : 1ull;
}

size_t tr_lost_text(const tr_lost_t *l, const uint64_t *t0, char *buf, size_t len)
{
    if (len)
        buf[0] = '\0';
    if (!l->tables)
        return 0;
    char tables[160], at[48] = "";
    tr_lost_tables_text(l->tables, tables, sizeof tables);
    if (t0 && l->time >= *t0)
        snprintf(at, sizeof at, " at %.6f s", (double)(l->time - *t0) / 1e9); /* a sim trace ticks in us */
    else if (t0) /* a ring's window that begins after the refusal */
        snprintf(at, sizeof at, " before the first event here");
    int n = snprintf(buf, len,
                     "the recorder ran out of host memory for its tables (%s)%s: records after that may lack "
                     "call sites, streams or frame names that the program had",
                     tables, at);
    return n > 0 ? (size_t)n : 0;
}

const char *tr_end_reason_name(uint64_t reason)
{
    switch (reason) {
    case CUA_TRACE_END_STOP: return "stop";
    case CUA_TRACE_END_LIMIT: return "size_limit";
    case CUA_TRACE_END_ERROR: return "write_error";
    default: return "unknown";
    }
}

static const char *const stat_names[CUA_TRACE_STAT_COUNT] = {
    "requested", "requested_peak", "allocated", "allocated_peak", "active", "active_peak", "reserved",
    "reserved_peak", "inactive_split", "inactive_split_peak", "largest_free_block", "capacity", "num_allocs",
    "num_frees", "num_maps", "num_unmaps", "num_alloc_retries", "num_ooms", "num_syncs", "num_trims",
};

typedef struct out { char *buf; size_t len, n; } out_t;

__attribute__((format(printf, 2, 3))) static void put(out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->n < o->len ? o->len - o->n : 0;
    int k = vsnprintf(room ? o->buf + o->n : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0)
        o->n += (size_t)k;
}

/* A quoted string: printable ASCII as is, '"' and '\' escaped, other bytes as \xNN. */
static void put_quoted(out_t *o, const char *p, size_t n)
{
    put(o, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\')
            put(o, "\\%c", ch);
        else if (ch >= 0x20 && ch < 0x7f)
            put(o, "%c", ch);
        else
            put(o, "\\x%02x", ch);
    }
    put(o, "\"");
}

static void put_str(out_t *o, tr_str_t s) { put_quoted(o, s.p, s.len); }

/* The configuration with the trace path's value replaced (it names a temporary file). */
static void put_config_redacted(out_t *o, tr_str_t s)
{
    char *tmp = lib_malloc(s.len + 2);
    if (!tmp)
        return;
    size_t n = 0;
    size_t i = 0;
    while (i < s.len) {
        size_t j = i;
        while (j < s.len && s.p[j] != ',')
            j++;
        if (j - i >= 6 && memcmp(s.p + i, "trace:", 6) == 0) {
            memcpy(tmp + n, "trace:*", 7);
            n += 7;
        } else {
            memcpy(tmp + n, s.p + i, j - i);
            n += j - i;
        }
        if (j < s.len)
            tmp[n++] = ',';
        i = j + 1;
    }
    put_quoted(o, tmp, n);
    free(tmp);
}

size_t tr_format(const tr_reader_t *r, const tr_record_t *rec, unsigned flags, char *buf, size_t len)
{
    out_t o = {buf, len, 0};
    bool red = flags & TR_FMT_REDACT;
    if (len)
        buf[0] = '\0';
    const char *name = rec->known ? tr_type_name(rec->type) : NULL;
    if (flags & TR_FMT_OFFSETS)
        put(&o, "@%" PRIu64 " ", rec->offset);
    put(&o, "#%" PRIu64 " ", rec->seq);
    if (!name) {
        put(&o, "unknown type %u (%u bytes)", rec->type, rec->length);
        return o.n;
    }
    put(&o, "%s", name);
    if (rec->type >= CUA_TRACE_FIRST_EVENT) {
        put(&o, " t=%" PRIu64, rec->time_ns);
        if (rec->type != CUA_TRACE_MARK && rec->type != CUA_TRACE_END)
            put(&o, " dev=%u", rec->dev);
        put(&o, " thread=%u", rec->thread);
    }
    switch (rec->type) {
    case CUA_TRACE_PROCESS:
        if (red)
            put(&o, " pid=* ppid=*");
        else
            put(&o, " pid=%" PRIu64 " ppid=%" PRIu64, rec->u.process.pid, rec->u.process.ppid);
        put(&o, " rank=%" PRId64 " clock=%s", rec->u.process.rank,
            rec->u.process.clock == CUA_TRACE_CLOCK_COUNTER ? "counter" : "monotonic");
        if (red) {
            put(&o, " host=* start_realtime=* start_monotonic=* recorder=* cmd=*");
        } else {
            put(&o, " host=");
            put_str(&o, rec->u.process.host);
            put(&o, " start_realtime=%" PRIu64 " start_monotonic=%" PRIu64 " recorder=", rec->u.process.realtime_ns,
                rec->u.process.monotonic_ns);
            put_str(&o, rec->u.process.recorder);
            put(&o, " cmd=");
            put_str(&o, rec->u.process.cmdline);
        }
        break;
    case CUA_TRACE_CONFIG:
        put(&o, " ");
        if (red)
            put_config_redacted(&o, rec->u.text);
        else
            put_str(&o, rec->u.text);
        break;
    case CUA_TRACE_DEVICE:
        put(&o, " %" PRIu64 " total=%" PRIu64 " capacity=%" PRIu64 " granularity=%" PRIu64 " mode=%s name=",
            rec->u.device.dev, rec->u.device.total, rec->u.device.capacity, rec->u.device.granularity,
            rec->u.device.mode == CUA_TRACE_MODE_VMM ? "vmm" : rec->u.device.mode == CUA_TRACE_MODE_CLASSIC ? "classic" : "?");
        put_str(&o, rec->u.device.name);
        break;
    case CUA_TRACE_MODULE:
        if (red) {
            put(&o, " base=* start=* end=* build_id=* path=*");
            break;
        }
        put(&o, " base=0x%" PRIx64 " start=0x%" PRIx64 " end=0x%" PRIx64 " build_id=", rec->u.module.base,
            rec->u.module.start, rec->u.module.end);
        for (size_t i = 0; i < rec->u.module.build_id.len; i++)
            put(&o, "%02x", (unsigned char)rec->u.module.build_id.p[i]);
        if (!rec->u.module.build_id.len)
            put(&o, "-");
        put(&o, " path=");
        put_str(&o, rec->u.module.path);
        break;
    case CUA_TRACE_THREAD:
        put(&o, " %" PRIu64, rec->u.thread.id);
        if (red)
            put(&o, " tid=*");
        else
            put(&o, " tid=%" PRIu64, rec->u.thread.tid);
        put(&o, " name=");
        put_str(&o, rec->u.thread.name);
        break;
    case CUA_TRACE_STREAM:
        put(&o, " %" PRIu64 " handle=0x%" PRIx64, rec->u.stream.id, rec->u.stream.handle);
        break;
    case CUA_TRACE_PYFRAME:
        put(&o, " %" PRIu64 " line=%" PRIu64 " function=", rec->u.pyframe.id, rec->u.pyframe.line);
        put_str(&o, rec->u.pyframe.function);
        put(&o, " file=");
        put_str(&o, rec->u.pyframe.file);
        break;
    case CUA_TRACE_STACK:
        put(&o, " %" PRIu64 " parent=%" PRIu64, rec->u.stack.id, rec->u.stack.parent);
        if (rec->u.stack.kind == CUA_TRACE_FRAME_PYTHON) {
            put(&o, " python %" PRIu64, rec->u.stack.value);
        } else if (red) {
            put(&o, " native *");
        } else {
            put(&o, " native 0x%" PRIx64, rec->u.stack.value);
            const mod_t *m = module_for(r, rec->u.stack.value);
            if (m) {
                const char *base = strrchr(m->path, '/');
                put(&o, " %s+0x%" PRIx64, base ? base + 1 : m->path, rec->u.stack.value - m->base);
            }
        }
        break;
    case CUA_TRACE_ALLOC:
    case CUA_TRACE_INIT_BLOCK:
        put(&o, " stream=%u addr=0x%" PRIx64 " size=%" PRIu64 " requested=%" PRIu64 " stack=%u", rec->stream, rec->addr,
            rec->size, rec->requested, rec->stack);
        break;
    case CUA_TRACE_FREE:
    case CUA_TRACE_FREE_DONE:
        put(&o, " stream=%u addr=0x%" PRIx64 " size=%" PRIu64 "%s", rec->stream, rec->addr, rec->size,
            (rec->type == CUA_TRACE_FREE && (rec->flags & CUA_TRACE_F_COMPLETED)) ? " completed" : "");
        break;
    case CUA_TRACE_MAP:
    case CUA_TRACE_UNMAP:
    case CUA_TRACE_INIT_MAP:
        put(&o, " addr=0x%" PRIx64 " size=%" PRIu64, rec->addr, rec->size);
        break;
    case CUA_TRACE_OOM:
        put(&o, " stream=%u stack=%u requested=%" PRIu64 " rounded=%" PRIu64 " capacity=%" PRIu64 " allocated=%" PRIu64
            " reserved=%" PRIu64 " device_free=%" PRIu64 " largest_free=%" PRIu64,
            rec->stream, rec->stack, rec->u.oom.requested, rec->u.oom.rounded, rec->u.oom.capacity,
            rec->u.oom.allocated, rec->u.oom.reserved, rec->u.oom.device_free, rec->u.oom.largest_free);
        if (rec->u.oom.vmm_failure) {
            static const char *const why[] = {[CUA_TRACE_VMM_ADDRESS_SPACE] = "address_space",
                                              [CUA_TRACE_VMM_CHUNKS] = "chunks", [CUA_TRACE_VMM_REFUSED] = "refused",
                                              [CUA_TRACE_VMM_WAITING] = "waiting",
                                              [CUA_TRACE_VMM_DRIVER_ERROR] = "driver_error"};
            uint64_t v = rec->u.oom.vmm_failure;
            if (v < sizeof why / sizeof *why && why[v])
                put(&o, " vmm_failure=%s", why[v]);
            else
                put(&o, " vmm_failure=%" PRIu64, v);
        }
        break;
    case CUA_TRACE_MARK:
        put(&o, " ");
        put_str(&o, rec->u.text);
        break;
    case CUA_TRACE_LOST:
        if (tr_lost_table_name(rec->u.lost.table))
            put(&o, " table=%s", tr_lost_table_name(rec->u.lost.table));
        else
            put(&o, " table=%" PRIu64, rec->u.lost.table);
        if (rec->u.lost.since != rec->time_ns) /* a ring's repeat of an earlier refusal */
            put(&o, " since=%" PRIu64, rec->u.lost.since);
        break;
    case CUA_TRACE_END:
        put(&o, " reason=%s dropped=%" PRIu64 " devices=%u", tr_end_reason_name(rec->u.end.reason), rec->u.end.dropped,
            rec->u.end.ndev);
        for (uint32_t d = 0; d < rec->u.end.ndev; d++) {
            const tr_end_dev_t *e = &rec->u.end.devs[d];
            put(&o, " [dev %u", e->dev);
            for (uint32_t k = 0; k < e->nfields && k < CUA_TRACE_STAT_COUNT; k++)
                put(&o, " %s=%" PRIu64, stat_names[k], e->v[k]);
            put(&o, "]");
        }
        break;
    default:
        break;
    }
    return o.n;
}

/* ---------------------------------------------------------------------------- accounting */

struct tr_live {
    devaddr_entry_t key;
    uint64_t size, requested;
};

void tr_acct_init(tr_acct_t *a)
{
    memset(a, 0, sizeof *a);
    devaddr_map_init(&a->live, sizeof(struct tr_live));
}

void tr_acct_free(tr_acct_t *a)
{
    devaddr_map_free(&a->live);
}

static void peak(uint64_t *peakv, uint64_t v)
{
    if (v > *peakv)
        *peakv = v;
}

static void sub(uint64_t *v, uint64_t d) { *v = *v >= d ? *v - d : 0; }

bool tr_acct_clock(tr_acct_t *a, const tr_record_t *rec)
{
    a->num_records++;
    if (!rec->known) {
        a->num_unknown++;
        return false;
    }
    if (rec->type < CUA_TRACE_FIRST_EVENT)
        return false;
    if (!a->any_event)
        a->first_time = rec->time_ns;
    a->any_event = true;
    a->last_time = rec->time_ns;
    return true;
}

void tr_acct_add(tr_acct_t *a, const tr_record_t *rec)
{
    if (!tr_acct_clock(a, rec))
        return;
    tr_acct_dev_t *d = &a->dev[rec->dev < CUA_TRACE_MAX_DEVICES ? rec->dev : 0];
    switch (rec->type) {
    case CUA_TRACE_ALLOC:
    case CUA_TRACE_INIT_BLOCK: {
        if (rec->type == CUA_TRACE_ALLOC) {
            a->num_allocs++;
            d->num_allocs++;
            a->event_bytes += rec->length;
        } else {
            a->num_init_blocks++;
        }
        d->seen = true;
        if (devaddr_map_find(&a->live, rec->dev, rec->addr)) {
            a->double_allocs++;
            break;
        }
        struct tr_live *e = devaddr_map_insert(&a->live, rec->dev, rec->addr);
        if (!e)
            break;
        e->size = rec->size;
        e->requested = rec->requested;
        d->live_blocks++;
        d->requested += rec->requested;
        d->allocated += rec->size;
        a->requested += rec->requested;
        a->allocated += rec->size;
        peak(&d->requested_peak, d->requested);
        peak(&d->allocated_peak, d->allocated);
        peak(&a->requested_peak, a->requested);
        peak(&a->allocated_peak, a->allocated);
        break;
    }
    case CUA_TRACE_FREE: {
        a->num_frees++;
        d->num_frees++;
        a->event_bytes += rec->length;
        struct tr_live *e = devaddr_map_find(&a->live, rec->dev, rec->addr);
        if (!e) {
            a->unmatched_frees++;
            break;
        }
        if (e->size != rec->size)
            a->size_mismatches++;
        sub(&d->requested, e->requested);
        sub(&d->allocated, e->size);
        sub(&a->requested, e->requested);
        sub(&a->allocated, e->size);
        d->live_blocks--;
        devaddr_map_remove(&a->live, e);
        break;
    }
    case CUA_TRACE_FREE_DONE:
        a->num_free_done++;
        break;
    case CUA_TRACE_MAP:
    case CUA_TRACE_INIT_MAP:
        if (rec->type == CUA_TRACE_MAP) {
            a->num_maps++;
            d->num_maps++;
        } else {
            a->num_init_maps++;
        }
        d->seen = true;
        d->reserved += rec->size;
        a->reserved += rec->size;
        peak(&d->reserved_peak, d->reserved);
        peak(&a->reserved_peak, a->reserved);
        break;
    case CUA_TRACE_UNMAP:
        a->num_unmaps++;
        d->num_unmaps++;
        sub(&d->reserved, rec->size);
        sub(&a->reserved, rec->size);
        break;
    case CUA_TRACE_TRIM:
        a->num_trims++;
        d->num_trims++;
        break;
    case CUA_TRACE_OOM:
        a->num_ooms++;
        d->num_ooms++;
        d->seen = true;
        break;
    case CUA_TRACE_MARK:
        a->num_marks++;
        break;
    case CUA_TRACE_LOST:
        tr_lost_add(&a->lost, rec);
        break;
    case CUA_TRACE_END:
        a->end_seen = true;
        a->end_reason = rec->u.end.reason;
        a->end_dropped = rec->u.end.dropped;
        a->end_ndev = rec->u.end.ndev;
        memcpy(a->end_devs, rec->u.end.devs, rec->u.end.ndev * sizeof *rec->u.end.devs);
        break;
    default:
        break;
    }
}
