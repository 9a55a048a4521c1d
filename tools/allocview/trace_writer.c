/* trace_writer.c — the offline trace writer (trace_writer.h), following include/cualloc_trace.h. */
#include "trace_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cualloc_trace.h"
#include "xalloc.h"

typedef struct wblock {
    uint8_t buf[CUA_TRACE_BLOCK_SIZE];
    size_t used;          /* 0: not started */
    uint64_t serial;      /* of the block being filled */
    uint64_t last_seq;    /* sequence number of its last record (seq_base before the first) */
    uint64_t time;        /* event state */
    uint64_t addr[CUA_TRACE_MAX_DEVICES];
} wblock_t;

struct tw {
    FILE *f;
    uint64_t next_index;  /* file block index of the next block written */
    uint64_t seq;         /* the last sequence number used */
    uint64_t last_time;
    wblock_t meta, ev;
    uint8_t payload[CUA_TRACE_BLOCK_SIZE]; /* a record's payload while it is built */
    bool failed;
    char msg[256];
};

static size_t varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v);
    return n;
}

static size_t svarint(uint8_t *p, int64_t v)
{
    return varint(p, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static size_t string(uint8_t *p, const char *s, size_t max)
{
    size_t len = s ? strlen(s) : 0;
    if (len > max)
        len = max;
    size_t n = varint(p, len);
    memcpy(p + n, s, len);
    return n + len;
}

static bool flush_block(tw_t *w, wblock_t *b, uint8_t kind)
{
    if (!b->used)
        return true;
    uint8_t *h = b->buf;
    cua_trace_put_le(h + CUA_TRACE_BOFF_KIND, kind, 1);
    cua_trace_put_le(h + CUA_TRACE_BOFF_SERIAL, b->serial, 8);
    cua_trace_put_le(h + CUA_TRACE_BOFF_CHECK, cua_trace_block_check(h), 2);
    cua_trace_put_le(h, CUA_TRACE_BLOCK_MAGIC, 4);
    memset(b->buf + b->used, 0, CUA_TRACE_BLOCK_SIZE - b->used);
    long off = (long)(CUA_TRACE_HEADER_SIZE + w->next_index * (uint64_t)CUA_TRACE_BLOCK_SIZE);
    if (fseek(w->f, off, SEEK_SET) != 0 || fwrite(b->buf, CUA_TRACE_BLOCK_SIZE, 1, w->f) != 1) {
        snprintf(w->msg, sizeof w->msg, "write failed: %s", strerror(errno));
        w->failed = true;
        return false;
    }
    w->next_index++;
    b->serial++;
    b->used = 0;
    return true;
}

static void start_block(wblock_t *b, uint64_t seq_base, uint64_t base_time)
{
    memset(b->buf, 0, CUA_TRACE_BLOCK_HEADER);
    cua_trace_put_le(b->buf + CUA_TRACE_BOFF_SEQ_BASE, seq_base, 8);
    cua_trace_put_le(b->buf + CUA_TRACE_BOFF_BASE_TIME, base_time, 8);
    b->used = CUA_TRACE_BLOCK_HEADER;
    b->last_seq = seq_base;
    b->time = base_time;
    memset(b->addr, 0, sizeof b->addr);
}

/* Appends a record whose payload is built by `build` into tmp; event payloads depend on the block
 * state, so they are built after the block is known. */
typedef size_t (*build_fn)(wblock_t *b, uint8_t *out, const void *arg);

static bool put_record(tw_t *w, bool event, uint8_t type, build_fn build, const void *arg, uint64_t time)
{
    if (w->failed)
        return false;
    wblock_t *b = event ? &w->ev : &w->meta;
    uint8_t *payload = w->payload, seqbuf[CUA_TRACE_VARINT_MAX];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!b->used)
            start_block(b, w->seq, event ? time : 0);
        size_t plen = build(b, payload, arg);
        size_t body = 1 + varint(seqbuf, w->seq + 1 - b->last_seq) + plen;
        uint8_t lenbuf[CUA_TRACE_VARINT_MAX];
        size_t ln = varint(lenbuf, body);
        if (b->used + ln + body <= CUA_TRACE_BLOCK_SIZE) {
            uint8_t *p = b->buf + b->used;
            memcpy(p, lenbuf, ln);
            p += ln;
            *p++ = type;
            p += varint(p, w->seq + 1 - b->last_seq);
            memcpy(p, payload, plen);
            b->used += ln + body;
            w->seq++;
            b->last_seq = w->seq;
            return true;
        }
        if (b->used == CUA_TRACE_BLOCK_HEADER) {
            snprintf(w->msg, sizeof w->msg, "a record of %zu bytes does not fit in a block", body);
            w->failed = true;
            return false;
        }
        if (!flush_block(w, b, event ? CUA_TRACE_BLOCK_EVENTS : CUA_TRACE_BLOCK_META))
            return false;
    }
    return false;
}

/* ------------------------------------------------------------------------------ open/close */

tw_t *tw_open(const char *path, const char *shown, char *err, size_t errlen)
{
    tw_t *w = xcalloc(1, sizeof *w);
    w->f = fopen(path, "wb");
    if (!w->f) {
        snprintf(err, errlen, "cannot create %s: %s", shown, strerror(errno));
        free(w);
        return NULL;
    }
    uint8_t hdr[CUA_TRACE_HEADER_SIZE] = {0};
    memcpy(hdr, CUA_TRACE_MAGIC, CUA_TRACE_MAGIC_LEN);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_MAJOR, CUA_TRACE_MAJOR, 2);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_MINOR, CUA_TRACE_MINOR, 2);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_HEADER_SIZE, CUA_TRACE_HEADER_SIZE, 4);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_BLOCK_SIZE, CUA_TRACE_BLOCK_SIZE, 4);
    if (fwrite(hdr, sizeof hdr, 1, w->f) != 1) {
        snprintf(err, errlen, "cannot write %s: %s", shown, strerror(errno));
        fclose(w->f);
        free(w);
        return NULL;
    }
    return w;
}

static size_t b_end(wblock_t *b, uint8_t *out, const void *arg)
{
    (void)arg;
    size_t n = 0;
    n += varint(out + n, 1); /* flags: none but SAME_DEV/THREAD would change layout; write explicitly */
    out[0] = 0;
    n = 1;
    n += varint(out + n, 0);              /* dt */
    n += varint(out + n, 0);              /* dev */
    n += varint(out + n, 0);              /* thread */
    n += varint(out + n, CUA_TRACE_END_STOP);
    n += varint(out + n, 0);              /* dropped */
    n += varint(out + n, 0);              /* ndev: no statistics */
    (void)b;
    return n;
}

bool tw_close(tw_t *w, bool end, char *err, size_t errlen)
{
    if (!w)
        return false;
    if (end)
        put_record(w, true, CUA_TRACE_END, b_end, NULL, w->last_time);
    flush_block(w, &w->meta, CUA_TRACE_BLOCK_META);
    flush_block(w, &w->ev, CUA_TRACE_BLOCK_EVENTS);
    bool ok = !w->failed;
    if (fclose(w->f) != 0 && ok) {
        snprintf(w->msg, sizeof w->msg, "close failed: %s", strerror(errno));
        ok = false;
    }
    if (!ok && err)
        snprintf(err, errlen, "%s", w->msg);
    free(w);
    return ok;
}

/* ------------------------------------------------------------------------------ META */

typedef struct { const uint8_t *p; size_t n; } raw_t;

static size_t b_raw(wblock_t *b, uint8_t *out, const void *arg)
{
    (void)b;
    const raw_t *r = arg;
    memcpy(out, r->p, r->n);
    return r->n;
}

static bool meta(tw_t *w, uint8_t type, const uint8_t *p, size_t n)
{
    raw_t r = {p, n};
    return put_record(w, false, type, b_raw, &r, 0);
}

bool tw_process(tw_t *w, const char *cmdline, const char *recorder, uint64_t realtime_ns)
{
    uint8_t p[4096];
    size_t n = 0;
    n += varint(p + n, 0);
    n += varint(p + n, 0);
    n += svarint(p + n, -1);
    n += varint(p + n, realtime_ns);
    n += varint(p + n, 0);
    p[n++] = CUA_TRACE_CLOCK_MONOTONIC;
    n += string(p + n, "", 0);
    n += string(p + n, cmdline, 2000);
    n += string(p + n, recorder, 200);
    return meta(w, CUA_TRACE_PROCESS, p, n);
}

bool tw_config(tw_t *w, const char *conf)
{
    uint8_t p[4096];
    size_t n = string(p, conf, 4000);
    return meta(w, CUA_TRACE_CONFIG, p, n);
}

bool tw_device(tw_t *w, uint32_t dev, uint64_t total, uint64_t capacity, uint64_t granularity, bool vmm,
               const char *name)
{
    uint8_t p[512];
    size_t n = 0;
    n += varint(p + n, dev);
    n += varint(p + n, total);
    n += varint(p + n, capacity);
    n += varint(p + n, granularity);
    p[n++] = vmm ? CUA_TRACE_MODE_VMM : CUA_TRACE_MODE_CLASSIC;
    n += string(p + n, name, 400);
    return meta(w, CUA_TRACE_DEVICE, p, n);
}

bool tw_stream(tw_t *w, uint32_t id, uint64_t handle)
{
    uint8_t p[32];
    size_t n = varint(p, id);
    n += varint(p + n, handle);
    return meta(w, CUA_TRACE_STREAM, p, n);
}

bool tw_pyframe(tw_t *w, uint32_t id, uint64_t line, const char *function, const char *file)
{
    uint8_t p[8000];
    size_t n = varint(p, id);
    n += varint(p + n, line);
    n += string(p + n, function, 3900);
    n += string(p + n, file, 3900);
    return meta(w, CUA_TRACE_PYFRAME, p, n);
}

bool tw_stack(tw_t *w, uint32_t id, uint32_t parent, uint8_t kind, uint64_t value)
{
    uint8_t p[48];
    size_t n = varint(p, id);
    n += varint(p + n, parent);
    p[n++] = kind;
    n += varint(p + n, value);
    return meta(w, CUA_TRACE_STACK, p, n);
}

/* ------------------------------------------------------------------------------ events */

typedef struct evargs {
    uint8_t type;
    uint64_t time;
    uint32_t dev, stream, stack;
    uint64_t addr, size, requested;
    bool completed;
    const uint64_t *oom;   /* 7 fields */
    const char *label;
} evargs_t;

static size_t b_event(wblock_t *b, uint8_t *out, const void *arg)
{
    const evargs_t *e = arg;
    uint8_t t = e->type;
    uint8_t flags = CUA_TRACE_F_BYTES;
    if (t == CUA_TRACE_FREE && e->completed)
        flags |= CUA_TRACE_F_COMPLETED;
    size_t n = 0;
    out[n++] = flags;
    uint64_t time = e->time > b->time ? e->time : b->time;
    n += varint(out + n, time - b->time);
    n += varint(out + n, e->dev);
    n += varint(out + n, 0); /* thread: unknown */
    bool has_stream = t == CUA_TRACE_ALLOC || t == CUA_TRACE_FREE || t == CUA_TRACE_FREE_DONE || t == CUA_TRACE_OOM ||
                      t == CUA_TRACE_INIT_BLOCK;
    bool has_addr = t == CUA_TRACE_ALLOC || t == CUA_TRACE_FREE || t == CUA_TRACE_FREE_DONE || t == CUA_TRACE_MAP ||
                    t == CUA_TRACE_UNMAP || t == CUA_TRACE_INIT_BLOCK || t == CUA_TRACE_INIT_MAP;
    bool has_slack = t == CUA_TRACE_ALLOC || t == CUA_TRACE_INIT_BLOCK;
    if (has_stream)
        n += varint(out + n, e->stream);
    if (t == CUA_TRACE_OOM)
        n += varint(out + n, e->stack);
    if (has_addr) {
        n += svarint(out + n, (int64_t)(e->addr - b->addr[e->dev]));
        n += varint(out + n, e->size);
    }
    if (has_slack) {
        n += varint(out + n, e->size - e->requested);
        n += varint(out + n, e->stack);
    }
    if (t == CUA_TRACE_OOM)
        for (int i = 0; i < 7; i++)
            n += varint(out + n, e->oom[i]);
    if (t == CUA_TRACE_MARK)
        n += string(out + n, e->label, TW_LABEL_MAX);
    /* the state this record leaves (the writer keeps it only once the record is committed, but a
     * record that does not fit is rebuilt in a fresh block, whose state is reset anyway) */
    b->time = time;
    if (has_addr)
        b->addr[e->dev] = e->addr;
    return n;
}

static bool event(tw_t *w, evargs_t *e)
{
    if (e->dev >= CUA_TRACE_MAX_DEVICES) {
        snprintf(w->msg, sizeof w->msg, "device %u out of range", e->dev);
        w->failed = true;
        return false;
    }
    if (e->time < w->last_time)
        e->time = w->last_time;
    w->last_time = e->time;
    return put_record(w, true, e->type, b_event, e, e->time);
}

bool tw_alloc(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size,
              uint64_t requested, uint32_t stack, bool initial)
{
    evargs_t e = {.type = initial ? CUA_TRACE_INIT_BLOCK : CUA_TRACE_ALLOC, .time = time_ns, .dev = dev,
                  .stream = stream, .stack = stack, .addr = addr, .size = size,
                  .requested = requested <= size ? requested : size};
    return event(w, &e);
}

bool tw_free(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size, bool completed)
{
    evargs_t e = {.type = CUA_TRACE_FREE, .time = time_ns, .dev = dev, .stream = stream, .addr = addr, .size = size,
                  .completed = completed};
    return event(w, &e);
}

bool tw_free_done(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint64_t addr, uint64_t size)
{
    evargs_t e = {.type = CUA_TRACE_FREE_DONE, .time = time_ns, .dev = dev, .stream = stream, .addr = addr,
                  .size = size};
    return event(w, &e);
}

bool tw_map(tw_t *w, uint64_t time_ns, uint32_t dev, uint64_t addr, uint64_t size, bool unmap, bool initial)
{
    evargs_t e = {.type = initial ? CUA_TRACE_INIT_MAP : unmap ? CUA_TRACE_UNMAP : CUA_TRACE_MAP, .time = time_ns,
                  .dev = dev, .addr = addr, .size = size};
    return event(w, &e);
}

bool tw_trim(tw_t *w, uint64_t time_ns, uint32_t dev)
{
    evargs_t e = {.type = CUA_TRACE_TRIM, .time = time_ns, .dev = dev};
    return event(w, &e);
}

bool tw_oom(tw_t *w, uint64_t time_ns, uint32_t dev, uint32_t stream, uint32_t stack, uint64_t requested,
            uint64_t rounded, uint64_t capacity, uint64_t allocated, uint64_t reserved, uint64_t device_free,
            uint64_t largest_free)
{
    uint64_t f[7] = {requested, rounded, capacity, allocated, reserved, device_free, largest_free};
    evargs_t e = {.type = CUA_TRACE_OOM, .time = time_ns, .dev = dev, .stream = stream, .stack = stack, .oom = f};
    return event(w, &e);
}

bool tw_mark(tw_t *w, uint64_t time_ns, const char *label)
{
    evargs_t e = {.type = CUA_TRACE_MARK, .time = time_ns, .label = label};
    return event(w, &e);
}
