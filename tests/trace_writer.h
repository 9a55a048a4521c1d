/* trace_writer.h — a second, minimal writer of cualloc trace files (include/cualloc_trace.h),
 * independent of the recorder (src/trace.c): it encodes records directly, single-threaded, into a
 * linear file. For fixtures whose stacks must be chosen exactly (Python frames, module maps) and
 * for the synthetic traces of the analyzer benchmark (bench/trace_synth.c). Header-only.
 *
 *   tw_t w; tw_open(&w, path);
 *   tw_module(&w, base, start, end, "libx.so");   uint32_t py = tw_pyframe(&w, line, fn, file);
 *   uint32_t s = tw_stack(&w, parent, CUA_TRACE_FRAME_NATIVE, value);
 *   tw_alloc(&w, time, dev, addr, size, requested, stack);  tw_free(&w, time, dev, addr, size);
 *   tw_map / tw_unmap / tw_mark / tw_oom;  tw_close(&w);   (returns 0, or -1 on a write error)
 */
#ifndef CUALLOC_TRACE_WRITER_H
#define CUALLOC_TRACE_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cualloc_trace.h"

typedef struct tw_blk {
    uint8_t kind;
    uint8_t *buf;
    size_t pos;           /* 0: no block open */
    uint64_t fileblock, serial, last_seq, seq_base, base_time;
    /* event delta state */
    uint64_t time;
    uint32_t dev, thread, stream, stack;
    uint64_t addr[CUA_TRACE_MAX_DEVICES];
} tw_blk_t;

typedef struct tw {
    FILE *f;
    bool err;
    uint64_t seq, nextblock;
    uint32_t nstacks, npyframes;
    tw_blk_t meta, ev;
    uint8_t body[1024];
} tw_t;

static inline size_t tw_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}
static inline size_t tw_svarint(uint8_t *p, int64_t v) { return tw_varint(p, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63)); }
static inline size_t tw_str(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    if (n > 512)
        n = 512;
    size_t k = tw_varint(p, n);
    memcpy(p + k, s, n);
    return k + n;
}

static inline void tw_put_le(uint8_t *p, uint64_t v, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tw_flush(tw_t *w, tw_blk_t *b)
{
    if (!b->pos)
        return;
    memset(b->buf + b->pos, 0, CUA_TRACE_BLOCK_SIZE - b->pos);
    uint8_t *h = b->buf;
    memset(h, 0, CUA_TRACE_BLOCK_HEADER);
    h[CUA_TRACE_BOFF_KIND] = b->kind;
    tw_put_le(h + CUA_TRACE_BOFF_SERIAL, b->serial, 8);
    tw_put_le(h + CUA_TRACE_BOFF_SEQ_BASE, b->seq_base, 8);
    tw_put_le(h + CUA_TRACE_BOFF_BASE_TIME, b->base_time, 8);
    tw_put_le(h + CUA_TRACE_BOFF_CHECK, cua_trace_block_check(h), 2);
    tw_put_le(h, CUA_TRACE_BLOCK_MAGIC, 4);
    if (fseeko(w->f, (off_t)(CUA_TRACE_HEADER_SIZE + b->fileblock * (uint64_t)CUA_TRACE_BLOCK_SIZE), SEEK_SET) != 0 ||
        fwrite(b->buf, 1, CUA_TRACE_BLOCK_SIZE, w->f) != CUA_TRACE_BLOCK_SIZE)
        w->err = true;
    b->serial++;
    b->pos = 0;
}

static inline int tw_open(tw_t *w, const char *path)
{
    memset(w, 0, sizeof *w);
    w->f = fopen(path, "wb");
    w->meta.kind = CUA_TRACE_BLOCK_META;
    w->ev.kind = CUA_TRACE_BLOCK_EVENTS;
    w->meta.buf = malloc(CUA_TRACE_BLOCK_SIZE);
    w->ev.buf = malloc(CUA_TRACE_BLOCK_SIZE);
    if (!w->f || !w->meta.buf || !w->ev.buf)
        return -1;
    uint8_t h[CUA_TRACE_HEADER_SIZE] = {0};
    memcpy(h, CUA_TRACE_MAGIC, CUA_TRACE_MAGIC_LEN);
    tw_put_le(h + CUA_TRACE_OFF_MAJOR, CUA_TRACE_MAJOR, 2);
    tw_put_le(h + CUA_TRACE_OFF_MINOR, CUA_TRACE_MINOR, 2);
    tw_put_le(h + CUA_TRACE_OFF_HEADER_SIZE, CUA_TRACE_HEADER_SIZE, 4);
    tw_put_le(h + CUA_TRACE_OFF_BLOCK_SIZE, CUA_TRACE_BLOCK_SIZE, 4);
    return fwrite(h, 1, sizeof h, w->f) == sizeof h ? 0 : -1;
}

/* Appends one record (type, payload built by the caller in w->body[0..n)) to block kind b. For
 * events the payload depends on the delta state, so the caller encodes through tw_event below. */
static inline void tw_append(tw_t *w, tw_blk_t *b, uint8_t type, const uint8_t *payload, size_t n)
{
    uint8_t hdr[16];
    size_t hn = 0;
    hdr[hn++] = type;
    hn += tw_varint(hdr + hn, w->seq + 1 - b->last_seq);
    uint8_t len[10];
    size_t ln = tw_varint(len, hn + n);
    memcpy(b->buf + b->pos, len, ln);
    memcpy(b->buf + b->pos + ln, hdr, hn);
    memcpy(b->buf + b->pos + ln + hn, payload, n);
    b->pos += ln + hn + n;
    w->seq++;
    b->last_seq = w->seq;
}

/* Opens a new block of b's kind when a record of up to `need` bytes does not fit. */
static inline bool tw_room(tw_t *w, tw_blk_t *b, size_t need, uint64_t time)
{
    if (b->pos && b->pos + need + 32 <= CUA_TRACE_BLOCK_SIZE)
        return false;
    /* The block's seq_base is the last sequence number so far; the delta state restarts. */
    tw_flush(w, b);
    b->fileblock = w->nextblock++;
    b->pos = CUA_TRACE_BLOCK_HEADER;
    b->time = time;
    b->dev = b->thread = b->stream = b->stack = 0;
    memset(b->addr, 0, sizeof b->addr);
    b->seq_base = b->last_seq = w->seq;
    b->base_time = time;
    return true;
}

static inline void tw_meta(tw_t *w, uint8_t type, const uint8_t *p, size_t n)
{
    tw_room(w, &w->meta, n + 16, 0);
    tw_append(w, &w->meta, type, p, n);
}

static inline void tw_module(tw_t *w, uint64_t base, uint64_t start, uint64_t end, const char *path)
{
    uint8_t *p = w->body;
    size_t n = tw_varint(p, base);
    n += tw_varint(p + n, start);
    n += tw_varint(p + n, end);
    n += tw_str(p + n, path);
    n += tw_str(p + n, "");
    tw_meta(w, CUA_TRACE_MODULE, p, n);
}

static inline uint32_t tw_pyframe(tw_t *w, uint64_t line, const char *function, const char *file)
{
    uint8_t *p = w->body;
    size_t n = tw_varint(p, ++w->npyframes);
    n += tw_varint(p + n, line);
    n += tw_str(p + n, function);
    n += tw_str(p + n, file);
    tw_meta(w, CUA_TRACE_PYFRAME, p, n);
    return w->npyframes;
}

static inline uint32_t tw_stack(tw_t *w, uint32_t parent, uint8_t kind, uint64_t value)
{
    uint8_t *p = w->body;
    size_t n = tw_varint(p, ++w->nstacks);
    n += tw_varint(p + n, parent);
    p[n++] = kind;
    n += tw_varint(p + n, value);
    tw_meta(w, CUA_TRACE_STACK, p, n);
    return w->nstacks;
}

/* Device `dev` of `total` bytes (its capacity too), VMM, with the given granularity. */
static inline void tw_device_gran(tw_t *w, uint32_t dev, uint64_t total, uint64_t granularity, const char *name)
{
    uint8_t *p = w->body;
    size_t n = tw_varint(p, dev);
    n += tw_varint(p + n, total);
    n += tw_varint(p + n, total);
    n += tw_varint(p + n, granularity);
    p[n++] = CUA_TRACE_MODE_VMM;
    n += tw_str(p + n, name);
    tw_meta(w, CUA_TRACE_DEVICE, p, n);
}

static inline void tw_device(tw_t *w, uint32_t dev, uint64_t total, const char *name)
{
    tw_device_gran(w, dev, total, 2u << 20, name);
}

/* Event prefix; returns the payload length so far. The block must already have room. */
static inline size_t tw_prefix(tw_blk_t *b, uint8_t *p, uint8_t *flags, uint64_t time, uint32_t dev)
{
    size_t n = 1; /* flags, filled by the caller */
    n += tw_varint(p + n, time - b->time);
    b->time = time;
    if (dev == b->dev)
        *flags |= CUA_TRACE_F_SAME_DEV;
    else
        n += tw_varint(p + n, dev);
    b->dev = dev;
    *flags |= CUA_TRACE_F_SAME_THREAD; /* thread 0 (unknown) throughout */
    return n;
}

/* ALLOC (init = false) or INIT_BLOCK; FREE; MAP/UNMAP. Sizes and addresses in bytes; multiples of
 * CUA_TRACE_UNIT are written in units. Stream 0 throughout. */
static inline void tw_alloc_ex(tw_t *w, uint8_t type, uint64_t time, uint32_t dev, uint64_t addr, uint64_t size,
                               uint64_t requested, uint32_t stack)
{
    tw_blk_t *b = &w->ev;
    tw_room(w, b, 64, time);
    bool has_stream = type == CUA_TRACE_ALLOC || type == CUA_TRACE_INIT_BLOCK || type == CUA_TRACE_FREE;
    uint8_t *p = w->body, flags = has_stream ? CUA_TRACE_F_SAME_STREAM : 0;
    size_t n = tw_prefix(b, p, &flags, time, dev);
    uint64_t unit = (addr - b->addr[dev]) % CUA_TRACE_UNIT == 0 && size % CUA_TRACE_UNIT == 0 ? CUA_TRACE_UNIT : 1;
    if (unit == 1)
        flags |= CUA_TRACE_F_BYTES;
    if (type == CUA_TRACE_FREE)
        flags |= CUA_TRACE_F_COMPLETED;
    n += tw_svarint(p + n, (int64_t)(addr - b->addr[dev]) / (int64_t)unit); /* exact: checked above */
    b->addr[dev] = addr;
    n += tw_varint(p + n, size / unit);
    if (type == CUA_TRACE_ALLOC || type == CUA_TRACE_INIT_BLOCK) {
        if (requested == size)
            flags |= CUA_TRACE_F_EXACT;
        else
            n += tw_varint(p + n, size - requested);
        if (stack == b->stack)
            flags |= CUA_TRACE_F_SAME_STACK;
        else
            n += tw_varint(p + n, stack);
        b->stack = stack;
    }
    p[0] = flags;
    tw_append(w, b, type, p, n);
}

static inline void tw_alloc(tw_t *w, uint64_t time, uint32_t dev, uint64_t addr, uint64_t size, uint64_t requested,
                            uint32_t stack)
{
    tw_alloc_ex(w, CUA_TRACE_ALLOC, time, dev, addr, size, requested, stack);
}
static inline void tw_free(tw_t *w, uint64_t time, uint32_t dev, uint64_t addr, uint64_t size)
{
    tw_alloc_ex(w, CUA_TRACE_FREE, time, dev, addr, size, size, 0); /* no FREE_DONE follows */
}
static inline void tw_map(tw_t *w, uint64_t time, uint32_t dev, uint64_t addr, uint64_t size, bool unmap)
{
    tw_alloc_ex(w, unmap ? CUA_TRACE_UNMAP : CUA_TRACE_MAP, time, dev, addr, size, size, 0);
}

static inline void tw_mark(tw_t *w, uint64_t time, const char *label)
{
    tw_blk_t *b = &w->ev;
    tw_room(w, b, 600, time);
    uint8_t *p = w->body, flags = 0;
    size_t n = tw_prefix(b, p, &flags, time, b->dev);
    n += tw_str(p + n, label);
    p[0] = flags;
    tw_append(w, b, CUA_TRACE_MARK, p, n);
}

static inline void tw_oom(tw_t *w, uint64_t time, uint32_t dev, uint64_t requested, uint64_t allocated,
                          uint64_t reserved, uint32_t stack)
{
    tw_blk_t *b = &w->ev;
    tw_room(w, b, 128, time);
    uint8_t *p = w->body, flags = CUA_TRACE_F_SAME_STREAM;
    size_t n = tw_prefix(b, p, &flags, time, dev);
    if (stack == b->stack)
        flags |= CUA_TRACE_F_SAME_STACK;
    else
        n += tw_varint(p + n, stack);
    b->stack = stack;
    uint64_t v[7] = {requested, requested, reserved, allocated, reserved, 0, 0};
    for (int i = 0; i < 7; i++)
        n += tw_varint(p + n, v[i]);
    p[0] = flags;
    tw_append(w, b, CUA_TRACE_OOM, p, n);
}

static inline int tw_close(tw_t *w, uint64_t time)
{
    tw_blk_t *b = &w->ev;
    tw_room(w, b, 64, time);
    uint8_t *p = w->body, flags = 0;
    size_t n = tw_prefix(b, p, &flags, time, b->dev);
    n += tw_varint(p + n, CUA_TRACE_END_STOP);
    n += tw_varint(p + n, 0);
    n += tw_varint(p + n, 0);
    p[0] = flags;
    tw_append(w, b, CUA_TRACE_END, p, n);
    tw_flush(w, &w->meta);
    tw_flush(w, &w->ev);
    bool ok = !w->err && fclose(w->f) == 0;
    free(w->meta.buf);
    free(w->ev.buf);
    return ok ? 0 : -1;
}

#endif
