/* export.c — `allocview export --pytorch OUT.pickle [--max-entries N] TRACE`: a cualloc trace as a
 * PyTorch memory snapshot (the dict torch.cuda.memory._snapshot() returns, pickled), which
 * PyTorch's own viewer (pytorch.org/memory_viz, torch/cuda/_memory_viz.py) opens.
 *
 * What the viewer needs, and so what this file guarantees:
 *  - `segments`: the memory mapped at the end of the trace, each with `blocks` that tile it
 *    exactly (the viewer recomputes block addresses by adding sizes from the segment's start):
 *    live blocks as 'active_allocated' (or 'active_pending_free' while a stream-ordered free
 *    waits), the gaps between them as 'inactive'. VMM devices: adjacent mapped chunks form one
 *    expandable segment (the viewer merges adjacent mapped ranges the same way); classic devices:
 *    each cuMemAlloc'd segment is its own.
 *  - `device_traces`: per device, the events in order. ALLOC -> alloc (size: the requested bytes,
 *    as PyTorch records them; the block's own size as `cualloc_allocated_size` where PyTorch's
 *    rounding would not give it, which `allocview import` reads back); FREE -> free_requested, and free_completed right after it when the
 *    memory was reusable at once (the viewer folds the pair into one "free"), else at FREE_DONE;
 *    MAP/UNMAP -> segment_map/segment_unmap (VMM) or segment_alloc/segment_free (classic); OOM ->
 *    oom with device_free. Frees carry the stack of the allocation (a trace records none for a
 *    free), as PyTorch's do under context='state' (under context='all' they carry their own).
 *    INIT_BLOCK and INIT_MAP are state, not events: they appear only through the final segments.
 *  - the viewer replays events backwards from the final state, so every block alive at any moment
 *    must lie in memory mapped at that moment, and every unmap must meet mapped memory. The export
 *    checks this by simulating the trace forwards before writing. A trace that starts mid-run
 *    without its starting state (a ring buffer whose oldest events were overwritten) gets that
 *    state inferred: a block freed but never seen allocated was live from the start, memory
 *    unmapped but never seen mapped was mapped from the start, and a block allocated in memory
 *    never seen mapped lies in memory mapped from the start; on a classic device, the pieces so
 *    inferred inside a segment that is later freed (whole, as cuMemFree frees) were that one
 *    segment from the start. A trace that contradicts itself even so (memory mapped twice, a
 *    block outside mapped memory at the end) is refused with the reason.
 *  - `external_annotations`: MARK records, {stage, name, device, time_us}: "START x" / "END x"
 *    labels (what `allocview import` makes of PyTorch's) keep their stage; any other label is a
 *    START with `cualloc_mark: True`, so importing the export gives back the same label.
 *  - `allocator_settings`: {expandable_segments, cualloc_conf}.
 *
 * Frames: Python frames as recorded; native frames named through symbolize.c (function, source
 * file and line with libdw and the module files present; "libx.so+0x1a2b" and the module's path
 * otherwise), the allocator's own frames left out. Each distinct frame dict and each stack's frame
 * list is written once and fetched from the pickle memo after that.
 *
 * --max-entries N keeps the last N events of each device (PyTorch's own snapshots are a ring of
 * max_entries events too): the viewer grows slow past about 100k. The final state is the same.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis.h"
#include "pickle_writer.h"
#include "ranges.h"
#include "replay.h"
#include "symbolize.h"
#include "views.h"
#include "xalloc.h"

#define EX_SMALL_SEGMENT ((uint64_t)2 << 20) /* PyTorch's small-pool segment size (kSmallBuffer) */

/* The stream of VMM segments and their map/unmap events: cudaStreamLegacy ((cudaStream_t)1), not
 * 0. When every event of a snapshot is on stream 0 the viewer replaces the events' streams by
 * null but keeps the segments' 0, and then stops merging the ranges it maps back with the final
 * segments — a later unmap of a range spanning both would find no segment and stop the viewer. A
 * nonzero stream keeps the numbering on; cualloc's VMM pools belong to no stream anyway. */
#define EX_VMM_SEGMENT_STREAM 1u

/* The largest number the snapshot may carry: the viewer reads integers into JavaScript numbers,
 * exact up to 2^53 (device addresses are below 2^48; only a damaged trace has more). */
#define EX_MAX_NUMBER ((uint64_t)1 << 53)

/* ------------------------------------------------------------------------------ live blocks */

/* A live block of one device; key.dev is that device. The same struct holds a device's starting
 * blocks (init_blocks) and the sorted copy the final segments are written from. */
typedef struct xblock {
    devaddr_entry_t key;
    uint64_t size, requested, stream;
    uint32_t stack;
    bool pending; /* a stream-ordered free was requested, not completed */
} xblock_t;

/* b under its key, replacing a block already there: init_blocks holds an address twice when a
 * block live from the start was freed and a second free inferred another. NULL when out of
 * memory. */
static xblock_t *blocks_put(devaddr_map_t *t, const xblock_t *b)
{
    bool found;
    xblock_t *e = devaddr_map_get(t, b->key.dev, b->key.addr, &found);
    if (!e)
        return NULL;
    devaddr_entry_t key = e->key;
    *e = *b;
    e->key = key;
    return e;
}

/* ------------------------------------------------------------------------------ mapped ranges */

/* ------------------------------------------------------------------------------ the exporter */

typedef struct xdev {
    bool present, vmm;
    devaddr_map_t live; /* of xblock_t */
    addr_ranges_t mapped;
    /* the starting state: INIT records plus what the first pass inferred */
    xblock_t *init_blocks;
    size_t n_init_blocks, cap_init_blocks;
    addr_ranges_t init_mapped;
    /* In SIM_INFER, the ranges of `mapped` that infer_mapped added and that are still mapped, with
     * the same bounds (a subset of `mapped`'s ranges): on a classic device only these may be
     * merged into the segment an unmap frees (merge_inferred). */
    addr_ranges_t guessed;
    uint64_t entries;   /* device_traces entries the trace gives this device */
    uint64_t inferred;  /* starting-state items inferred (not recorded) */
} xdev_t;

typedef struct xmark { uint64_t time; char *label; } xmark_t;

typedef struct exporter {
    const char *path;
    av_t *a;
    sym_ctx_t *sym;
    pkw_t *w;
    xdev_t *dev;
    uint32_t ndev;
    uint64_t max_entries; /* 0: all */
    uint64_t *stack_memo; /* per stack id: memo index + 1 of its frame list; 0 = not written */
    size_t nstack_memo;
    size_t nframes;       /* distinct frame dicts written */
    xmark_t *marks;
    size_t nmarks, capmarks;
    char error[768];
    int status;           /* 0, or VW_EXIT_CORRUPT: the trace is corrupt after a readable prefix */
    uint64_t events_written;
} exporter_t;

static bool xfail(exporter_t *ex, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool xfail(exporter_t *ex, const char *fmt, ...)
{
    if (!ex->error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ex->error, sizeof ex->error, fmt, ap);
        va_end(ap);
    }
    return false;
}

/* ------------------------------------------------------------------------------ frames */

/* Writes one frame dict {name, filename, line}, memoized by its text. */
static void write_frame(exporter_t *ex, const char *name, const char *file, uint64_t line)
{
    /* The key is the whole text: frames that differ only past some length stay apart. */
    size_t klen = strlen(name) + strlen(file) + 32;
    char *key = xmalloc(klen);
    klen = (size_t)snprintf(key, klen, "%s\x1f%s\x1f%" PRIu64, name, file, line);
    if (pkw_get_keyed(ex->w, key, klen)) {
        free(key);
        return;
    }
    pkw_dict_begin(ex->w);
    pkw_key(ex->w, "name");
    pkw_str_memo(ex->w, name, strlen(name));
    pkw_key(ex->w, "filename");
    pkw_str_memo(ex->w, file, strlen(file));
    pkw_key(ex->w, "line");
    pkw_uint(ex->w, line);
    pkw_dict_end(ex->w);
    pkw_memoize_keyed(ex->w, key, klen);
    free(key);
    ex->nframes++;
}

/* Writes the frame list of stack id (innermost first, the allocator's frames left out); a stack
 * written before is fetched from the memo. */
static void write_frames(exporter_t *ex, uint32_t stack)
{
    if (stack && stack < ex->nstack_memo && ex->stack_memo[stack]) {
        pkw_get(ex->w, ex->stack_memo[stack] - 1);
        return;
    }
    static tr_frame_t fr[VW_MAX_FRAMES];
    size_t n = stack ? tr_stack_frames(ex->a->r, stack, fr, VW_MAX_FRAMES) : 0;
    pkw_list_begin(ex->w);
    for (size_t i = 0; i < n; i++) {
        const tr_frame_t *f = &fr[i];
        if (f->kind == CUA_TRACE_FRAME_PYTHON) {
            pkw_item(ex->w);
            write_frame(ex, f->function ? f->function : "??", f->file ? f->file : "??",
                        f->line <= INT32_MAX ? f->line : 0); /* a line past 2^31 is damage */
            continue;
        }
        sym_native_t nf[SYM_INLINE_MAX];
        uint64_t off = f->module ? f->module_offset : f->addr;
        size_t nn = sym_native_frames(ex->sym, f->module, off, nf, sizeof nf / sizeof nf[0]);
        for (size_t k = 0; k < nn; k++) { /* inlined functions first, as PyTorch writes them */
            if (nf[k].fold)
                continue;
            char addr_name[512];
            const char *name = addr_name;
            if (nf[k].function)
                name = nf[k].function;
            else if (f->module)
                snprintf(addr_name, sizeof addr_name, "%s+0x%" PRIx64, txt_base_name(f->module), off);
            else
                snprintf(addr_name, sizeof addr_name, "0x%" PRIx64, off);
            pkw_item(ex->w);
            write_frame(ex, name, nf[k].file ? nf[k].file : f->module ? f->module : "??", (uint64_t)nf[k].line);
        }
    }
    if (n == VW_MAX_FRAMES) { /* deeper stacks lose their outermost frames: the last one says so */
        pkw_item(ex->w);
        write_frame(ex, "(outer frames cut: at most " VW_MAX_FRAMES_TEXT " frames are exported)", "??", 0);
    }
    pkw_list_end(ex->w);
    if (stack && stack < ex->nstack_memo)
        ex->stack_memo[stack] = pkw_memoize(ex->w) + 1;
}

/* ------------------------------------------------------------------------------ events */

static uint64_t stream_handle(const exporter_t *ex, uint32_t id)
{
    uint64_t h = 0;
    if (id && !tr_stream_handle(ex->a->r, id, &h))
        h = 0;
    return h;
}

/* One device_traces entry. device_free < 0: not an OOM. */
/* `allocated`: the block's size for an alloc whose size PyTorch's 512-byte rounding of the request
 * would not give (cualloc's size classes, a remainder left unsplit), written as
 * `cualloc_allocated_size` for `allocview import` to read back; 0 for none. */
static void write_event(exporter_t *ex, const char *action, uint64_t addr, uint64_t size, uint64_t stream,
                        uint64_t time_ns, uint32_t stack, int64_t device_free, uint64_t allocated)
{
    pkw_t *w = ex->w;
    pkw_item(w);
    pkw_dict_begin(w);
    pkw_key(w, "action");
    pkw_str_memo(w, action, strlen(action));
    if (device_free >= 0) { /* PyTorch's OOM entries carry device_free where others carry addr */
        pkw_key(w, "device_free");
        pkw_uint(w, (uint64_t)device_free);
    } else {
        pkw_key(w, "addr");
        pkw_uint(w, addr);
    }
    pkw_key(w, "size");
    pkw_uint(w, size);
    if (allocated && allocated != (size < 512 ? 512 : (size + 511) / 512 * 512)) {
        pkw_key(w, "cualloc_allocated_size");
        pkw_uint(w, allocated);
    }
    pkw_key(w, "stream");
    pkw_uint(w, stream);
    pkw_key(w, "time_us");
    pkw_uint(w, time_ns / 1000);
    pkw_key(w, "frames");
    write_frames(ex, stack);
    pkw_dict_end(w);
    ex->events_written++;
}

/* ------------------------------------------------------------------------------ simulation */

/* write_event's `allocated` for the record an entry is written for. */
static uint64_t alloc_block_size(const tr_record_t *r) { return r->type == CUA_TRACE_ALLOC ? r->size : 0; }

enum sim_mode { SIM_INFER, SIM_WRITE };

static void add_init_block(xdev_t *d, const xblock_t *b)
{
    if (d->n_init_blocks == d->cap_init_blocks) {
        size_t cap = d->cap_init_blocks ? d->cap_init_blocks * 2 : 256;
        d->init_blocks = xrealloc(d->init_blocks, cap * sizeof *d->init_blocks);
        d->cap_init_blocks = cap;
    }
    d->init_blocks[d->n_init_blocks++] = *b;
}

/* The starting state of a pass: the recorded and inferred initial blocks and mappings. */
static bool sim_reset(xdev_t *d)
{
    devaddr_map_free(&d->live);
    d->mapped.n = 0;
    d->guessed.n = 0;
    for (size_t i = 0; i < d->init_mapped.n; i++)
        ranges_add(&d->mapped, d->init_mapped.v[i].addr, d->init_mapped.v[i].end);
    for (size_t i = 0; i < d->n_init_blocks; i++)
        if (!blocks_put(&d->live, &d->init_blocks[i]))
            return false;
    return true;
}

/* In SIM_INFER, memory [addr, end) that must have been mapped from the start (it is not mapped
 * now and was never seen mapped, or the trace could not be consistent): adds what is missing to
 * the starting state and to the current mapping. */
static bool infer_mapped(exporter_t *ex, xdev_t *d, uint64_t addr, uint64_t end)
{
    uint64_t cur = addr;
    while (cur < end) {
        size_t i = ranges_after(&d->mapped, cur);
        uint64_t gap_end = end;
        if (i < d->mapped.n && d->mapped.v[i].addr <= cur) {
            cur = d->mapped.v[i].end;
            continue;
        }
        if (i < d->mapped.n && d->mapped.v[i].addr < gap_end)
            gap_end = d->mapped.v[i].addr;
        if (ranges_overlap(&d->init_mapped, cur, gap_end))
            return xfail(ex, "device %u: memory at 0x%" PRIx64 " is used after being unmapped", (unsigned)(d - ex->dev),
                         cur);
        ranges_add(&d->mapped, cur, gap_end);
        ranges_add(&d->init_mapped, cur, gap_end);
        ranges_add(&d->guessed, cur, gap_end);
        d->inferred++;
        cur = gap_end;
    }
    return true;
}

/* In SIM_INFER on a classic device, the unmap of segment [addr, end), which `mapped` covers: a
 * classic segment is one cuMemAlloc'd range, mapped and freed whole, so the pieces of it that
 * infer_mapped added one by one (from the blocks seen in it before the unmap, and the gaps between
 * them) were that one segment from the start. They become the single range [addr, end) in
 * `mapped` and in the starting state, so that the unmap (and the same unmap in SIM_WRITE, which
 * starts from init_mapped) meets a segment of its own bounds. Nothing is merged when a range
 * there was recorded (MAP, INIT_MAP: a segment of its own, which the unmap cannot split or join)
 * or crosses addr or end (a block across two segments): the unmap then fails to match.
 * init_mapped holds exactly the inferred pieces inside [addr, end): infer_mapped never infers
 * memory that was mapped from the start and unmapped since. */
static void merge_inferred(xdev_t *d, uint64_t addr, uint64_t end)
{
    size_t i = ranges_after(&d->mapped, addr);
    if (d->mapped.v[i].addr != addr || d->mapped.v[i].end == end || !ranges_cover(&d->guessed, addr, end))
        return;
    size_t j = ranges_after(&d->mapped, end - 1);
    if (d->mapped.v[j].end != end)
        return;
    ranges_remove(&d->mapped, addr, end);
    ranges_add(&d->mapped, addr, end);
    ranges_remove(&d->guessed, addr, end);
    ranges_add(&d->guessed, addr, end);
    ranges_remove(&d->init_mapped, addr, end);
    ranges_add(&d->init_mapped, addr, end);
}

/* One pass over the trace for device `dv`. SIM_INFER builds the starting state (and counts the
 * entries); SIM_WRITE checks the trace against it and writes the device's events, skipping the
 * first `skip` entries. Returns false with ex->error set when the trace contradicts itself. */

/* The records that become PyTorch's trace entries and segments: the block and mapping events and
 * OOMs. The rest (definitions, marks, trims, the end, LOST, a type this reader does not know) are
 * not, and carry no address range to check. */
static bool exported(const tr_record_t *rec)
{
    if (!rec->known)
        return false;
    switch (rec->type) {
    case CUA_TRACE_INIT_BLOCK:
    case CUA_TRACE_ALLOC:
    case CUA_TRACE_FREE:
    case CUA_TRACE_FREE_DONE:
    case CUA_TRACE_INIT_MAP:
    case CUA_TRACE_MAP:
    case CUA_TRACE_UNMAP:
    case CUA_TRACE_OOM:
        return true;
    default:
        return false;
    }
}
static bool simulate(exporter_t *ex, uint32_t dv, enum sim_mode mode, uint64_t skip)
{
    xdev_t *d = &ex->dev[dv];
    if (!sim_reset(d))
        return xfail(ex, "out of memory");
    char err[512];
    tr_reader_t *r = tr_open(ex->path, err, sizeof err);
    if (!r)
        return xfail(ex, "%s", err);
    bool infer = mode == SIM_INFER;
    uint64_t entry = 0;
    tr_record_t rec;
    int k;
/* An entry of device_traces: written in SIM_WRITE past the skipped ones, counted always. */
#define ENTRY(action, addr, size, stream, stack, dfree)                                                   \
    do {                                                                                                  \
        if (!infer && entry >= skip)                                                                      \
            write_event(ex, action, addr, size, stream, rec.time_ns, stack, dfree,                        \
                        alloc_block_size(&rec));                                                          \
        entry++;                                                                                          \
    } while (0)
    bool ok = true;
    while (ok && (k = tr_next(r, &rec)) > 0) {
        if (!exported(&rec) || rec.dev != dv)
            continue;
        uint64_t end = rec.addr + rec.size;
        xblock_t *b;
        if (rec.addr > EX_MAX_NUMBER || rec.size > EX_MAX_NUMBER || rec.requested > EX_MAX_NUMBER ||
            stream_handle(ex, rec.stream) > EX_MAX_NUMBER ||
            (rec.type == CUA_TRACE_OOM && (rec.u.oom.requested > EX_MAX_NUMBER || rec.u.oom.device_free > EX_MAX_NUMBER))) {
            ok = xfail(ex, "device %u: record at offset %" PRIu64 " has a value past 2^53, more than PyTorch's viewer "
                       "holds exactly (a damaged trace)", dv, rec.offset);
            break;
        }
        bool sized = rec.type != CUA_TRACE_OOM && rec.type != CUA_TRACE_FREE && rec.type != CUA_TRACE_FREE_DONE;
        if (sized && (rec.size == 0 || end < rec.addr || end > EX_MAX_NUMBER)) { /* only a damaged trace has these */
            ok = xfail(ex, "device %u: record at offset %" PRIu64 " has %s (0x%" PRIx64 ", %" PRIu64 " bytes)", dv,
                       rec.offset, rec.size ? "a range past the end of the address space" : "an empty range", rec.addr,
                       rec.size);
            break;
        }
        switch (rec.type) {
        case CUA_TRACE_INIT_BLOCK:
        case CUA_TRACE_ALLOC: {
            bool init = rec.type == CUA_TRACE_INIT_BLOCK;
            if (init && !infer)
                break; /* already in the starting state */
            if (devaddr_map_find(&d->live, dv, rec.addr)) {
                ok = xfail(ex, "device %u: 0x%" PRIx64 " allocated again while live (record at offset %" PRIu64 ")", dv,
                           rec.addr, rec.offset);
                break;
            }
            if (!ranges_cover(&d->mapped, rec.addr, end)) {
                if (!infer) {
                    ok = xfail(ex, "device %u: block 0x%" PRIx64 " (%" PRIu64 " bytes) lies outside mapped memory", dv,
                               rec.addr, rec.size);
                    break;
                }
                if (!(ok = infer_mapped(ex, d, rec.addr, end)))
                    break;
            }
            xblock_t nb = {.key = {.addr = rec.addr, .dev = dv}, .size = rec.size, .requested = rec.requested,
                           .stream = stream_handle(ex, rec.stream), .stack = rec.stack};
            if (!blocks_put(&d->live, &nb)) {
                ok = xfail(ex, "out of memory");
                break;
            }
            if (init)
                add_init_block(d, &nb);
            else
                ENTRY("alloc", rec.addr, rec.requested, nb.stream, rec.stack, -1);
            break;
        }
        case CUA_TRACE_FREE:
        case CUA_TRACE_FREE_DONE: {
            b = devaddr_map_find(&d->live, dv, rec.addr);
            if (!b) { /* freed, never seen allocated: live from the start */
                if (rec.size == 0 || end < rec.addr || end > EX_MAX_NUMBER) {
                    ok = xfail(ex, "device %u: free of 0x%" PRIx64 ", never allocated, with no usable size", dv,
                               rec.addr);
                    break;
                }
                if (!infer) {
                    ok = xfail(ex, "device %u: free of 0x%" PRIx64 ", which is not allocated", dv, rec.addr);
                    break;
                }
                xblock_t nb = {.key = {.addr = rec.addr, .dev = dv}, .size = rec.size, .requested = rec.size,
                               .stream = stream_handle(ex, rec.stream), .pending = rec.type == CUA_TRACE_FREE_DONE};
                if (!ranges_cover(&d->mapped, rec.addr, end) && !(ok = infer_mapped(ex, d, rec.addr, end)))
                    break;
                add_init_block(d, &nb);
                if (!(b = blocks_put(&d->live, &nb))) {
                    ok = xfail(ex, "out of memory");
                    break;
                }
                d->inferred++;
            }
            uint64_t stream = stream_handle(ex, rec.stream);
            if (rec.type == CUA_TRACE_FREE) {
                if (b->pending) {
                    ok = xfail(ex, "device %u: 0x%" PRIx64 " freed twice", dv, rec.addr);
                    break;
                }
                ENTRY("free_requested", rec.addr, b->requested, stream, b->stack, -1);
                if (!(rec.flags & CUA_TRACE_F_COMPLETED)) {
                    b->pending = true;
                    break;
                }
            }
            ENTRY("free_completed", rec.addr, b->requested, stream, b->stack, -1);
            devaddr_map_remove(&d->live, b);
            break;
        }
        case CUA_TRACE_INIT_MAP:
        case CUA_TRACE_MAP:
            if (rec.type == CUA_TRACE_INIT_MAP && !infer)
                break;
            if (ranges_overlap(&d->mapped, rec.addr, end)) {
                ok = xfail(ex, "device %u: 0x%" PRIx64 " (%" PRIu64 " bytes) mapped while already mapped", dv, rec.addr,
                           rec.size);
                break;
            }
            ranges_add(&d->mapped, rec.addr, end);
            if (rec.type == CUA_TRACE_INIT_MAP)
                ranges_add(&d->init_mapped, rec.addr, end);
            if (rec.type == CUA_TRACE_MAP)
                ENTRY(d->vmm ? "segment_map" : "segment_alloc", rec.addr, rec.size, d->vmm ? EX_VMM_SEGMENT_STREAM : 0, 0,
                      -1);
            break;
        case CUA_TRACE_UNMAP:
            if (!ranges_cover(&d->mapped, rec.addr, end)) {
                if (!infer) {
                    ok = xfail(ex, "device %u: unmap of 0x%" PRIx64 " (%" PRIu64 " bytes), which is not mapped", dv,
                               rec.addr, rec.size);
                    break;
                }
                if (!(ok = infer_mapped(ex, d, rec.addr, end)))
                    break;
            }
            if (infer && !d->vmm)
                merge_inferred(d, rec.addr, end);
            if (!d->vmm) { /* a classic segment is freed whole */
                size_t i = ranges_after(&d->mapped, rec.addr);
                if (d->mapped.v[i].addr != rec.addr || d->mapped.v[i].end != end) {
                    ok = xfail(ex, "device %u: segment free of 0x%" PRIx64 " does not match a segment", dv, rec.addr);
                    break;
                }
            }
            ranges_remove(&d->mapped, rec.addr, end);
            ranges_remove(&d->guessed, rec.addr, end);
            ENTRY(d->vmm ? "segment_unmap" : "segment_free", rec.addr, rec.size, d->vmm ? EX_VMM_SEGMENT_STREAM : 0, 0,
                  -1);
            break;
        case CUA_TRACE_OOM:
            ENTRY("oom", 0, rec.u.oom.requested, stream_handle(ex, rec.stream), rec.stack,
                  (int64_t)rec.u.oom.device_free);
            break;
        default:
            break;
        }
    }
#undef ENTRY
    if (ok && k < 0)
        ex->status = VW_EXIT_CORRUPT; /* the prefix is exported; main reports it */
    tr_close(r);
    if (infer)
        d->entries = entry;
    return ok;
}

/* ------------------------------------------------------------------------------ final state */

static int block_cmp(const void *x, const void *y)
{
    const xblock_t *a = x, *b = y;
    return a->key.addr < b->key.addr ? -1 : a->key.addr > b->key.addr;
}

static void write_block(exporter_t *ex, uint64_t addr, uint64_t size, uint64_t requested, const char *state,
                        uint32_t stack)
{
    pkw_t *w = ex->w;
    pkw_item(w);
    pkw_dict_begin(w);
    pkw_key(w, "address");
    pkw_uint(w, addr);
    pkw_key(w, "size");
    pkw_uint(w, size);
    pkw_key(w, "requested_size");
    pkw_uint(w, requested);
    pkw_key(w, "state");
    pkw_str_memo(w, state, strlen(state));
    pkw_key(w, "frames");
    write_frames(ex, stack);
    pkw_dict_end(w);
}

/* Writes device dv's segments from the state its SIM_WRITE pass ended in: mapped memory (adjacent
 * ranges merged on VMM devices) tiled by the live blocks and inactive gaps. */
static bool write_segments(exporter_t *ex, uint32_t dv, uint64_t *nsegs, uint64_t *nblocks)
{
    xdev_t *d = &ex->dev[dv];
    size_t nlive = d->live.count, j = 0;
    xblock_t *bl = xmalloc((nlive ? nlive : 1) * sizeof *bl);
    /* The walk follows the hash; the sort on the (distinct) addresses fixes the order. */
    const xblock_t *e;
    for (size_t pos = 0; (e = devaddr_map_next(&d->live, &pos));)
        bl[j++] = *e;
    qsort(bl, nlive, sizeof *bl, block_cmp);
    size_t bi = 0;
    bool ok = true;
    for (size_t s = 0; s < d->mapped.n && ok;) {
        uint64_t saddr = d->mapped.v[s].addr, send = d->mapped.v[s].end;
        s++;
        while (d->vmm && s < d->mapped.n && d->mapped.v[s].addr == send)
            send = d->mapped.v[s++].end;
        if (bi < nlive && bl[bi].key.addr < saddr) {
            ok = xfail(ex, "device %u: block 0x%" PRIx64 " lies outside mapped memory at the end", dv, bl[bi].key.addr);
            break;
        }
        /* The segment's blocks: first their totals, then the list. */
        size_t first = bi;
        uint64_t allocated = 0, active = 0, requested = 0;
        for (uint64_t cur = saddr; bi < nlive && bl[bi].key.addr < send; bi++) {
            if (bl[bi].key.addr < cur || bl[bi].key.addr + bl[bi].size > send) {
                ok = xfail(ex, "device %u: block 0x%" PRIx64 " (%" PRIu64 " bytes) overlaps another or crosses the end "
                           "of segment 0x%" PRIx64, dv, bl[bi].key.addr, bl[bi].size, saddr);
                break;
            }
            cur = bl[bi].key.addr + bl[bi].size;
            /* As CUDACachingAllocator's snapshot sums them: allocated_size over the allocated
             * blocks, active_size and requested_size over the active ones (pending frees too). */
            active += bl[bi].size;
            requested += bl[bi].requested;
            if (!bl[bi].pending)
                allocated += bl[bi].size;
        }
        if (!ok)
            break;
        pkw_t *w = ex->w;
        pkw_item(w);
        pkw_dict_begin(w);
        pkw_key(w, "device");
        pkw_uint(w, dv);
        pkw_key(w, "address");
        pkw_uint(w, saddr);
        pkw_key(w, "total_size");
        pkw_uint(w, send - saddr);
        pkw_key(w, "allocated_size");
        pkw_uint(w, allocated);
        pkw_key(w, "active_size");
        pkw_uint(w, active);
        pkw_key(w, "requested_size");
        pkw_uint(w, requested);
        pkw_key(w, "stream");
        pkw_uint(w, d->vmm ? EX_VMM_SEGMENT_STREAM : 0);
        pkw_key(w, "segment_type");
        pkw_cstr(w, !d->vmm && send - saddr <= EX_SMALL_SEGMENT ? "small" : "large");
        pkw_key(w, "segment_pool_id");
        pkw_uint(w, 0);
        pkw_uint(w, 0);
        pkw_tuple2(w);
        pkw_key(w, "is_expandable");
        pkw_bool(w, d->vmm);
        pkw_key(w, "frames");
        pkw_list_begin(w);
        pkw_list_end(w);
        pkw_key(w, "blocks");
        pkw_list_begin(w);
        uint64_t cur = saddr;
        for (size_t i = first; i < bi; i++) {
            if (bl[i].key.addr > cur)
                write_block(ex, cur, bl[i].key.addr - cur, 0, "inactive", 0);
            write_block(ex, bl[i].key.addr, bl[i].size, bl[i].requested,
                        bl[i].pending ? "active_pending_free" : "active_allocated", bl[i].stack);
            cur = bl[i].key.addr + bl[i].size;
            ++*nblocks;
        }
        if (cur < send)
            write_block(ex, cur, send - cur, 0, "inactive", 0);
        pkw_list_end(w);
        pkw_dict_end(w);
        ++*nsegs;
    }
    if (ok && bi < nlive)
        ok = xfail(ex, "device %u: block 0x%" PRIx64 " lies outside mapped memory at the end", dv, bl[bi].key.addr);
    free(bl);
    return ok;
}

/* ------------------------------------------------------------------------------ the rest */

static bool collect_marks(exporter_t *ex)
{
    char err[512];
    tr_reader_t *r = tr_open(ex->path, err, sizeof err);
    if (!r)
        return xfail(ex, "%s", err);
    tr_record_t rec;
    while (tr_next(r, &rec) > 0) {
        if (!rec.known || rec.type != CUA_TRACE_MARK)
            continue;
        if (ex->nmarks == ex->capmarks) {
            size_t cap = ex->capmarks ? ex->capmarks * 2 : 64;
            ex->marks = xrealloc(ex->marks, cap * sizeof *ex->marks);
            ex->capmarks = cap;
        }
        ex->marks[ex->nmarks].time = rec.time_ns;
        ex->marks[ex->nmarks++].label = xstrndup(rec.u.text.p, rec.u.text.len);
    }
    tr_close(r);
    return true;
}

static void write_annotations(exporter_t *ex)
{
    pkw_t *w = ex->w;
    pkw_list_begin(w);
    for (size_t i = 0; i < ex->nmarks; i++) {
        const char *label = ex->marks[i].label, *name = label, *stage = "START";
        bool plain = true;
        if (strncmp(label, "START ", 6) == 0 || strncmp(label, "END ", 4) == 0) {
            stage = label[0] == 'S' ? "START" : "END";
            name = label + strlen(stage) + 1;
            plain = false;
        }
        pkw_item(w);
        pkw_dict_begin(w);
        pkw_key(w, "stage");
        pkw_str_memo(w, stage, strlen(stage));
        pkw_key(w, "name");
        pkw_cstr(w, name);
        pkw_key(w, "device");
        pkw_uint(w, 0);
        pkw_key(w, "time_us");
        pkw_uint(w, ex->marks[i].time / 1000);
        if (plain) {
            pkw_key(w, "cualloc_mark");
            pkw_bool(w, true);
        }
        pkw_dict_end(w);
    }
    pkw_list_end(w);
}

static void export_usage(FILE *out)
{
    fprintf(out, "usage: allocview export --pytorch OUT.pickle [--max-entries N] TRACE\n"
                 "  writes the trace as a PyTorch memory snapshot (what torch.cuda.memory._dump_snapshot writes),\n"
                 "  which pytorch.org/memory_viz and torch.cuda._memory_viz open: the segments mapped at the end\n"
                 "  with their blocks, and every device's events with their stacks\n"
                 "  --max-entries N  only the last N events of each device (the viewer grows slow past ~100k)\n");
}

static void exporter_free(exporter_t *ex)
{
    for (uint32_t i = 0; i < ex->ndev; i++) {
        devaddr_map_free(&ex->dev[i].live);
        ranges_free(&ex->dev[i].mapped);
        free(ex->dev[i].init_blocks);
        ranges_free(&ex->dev[i].init_mapped);
        ranges_free(&ex->dev[i].guessed);
    }
    free(ex->dev);
    free(ex->stack_memo);
    for (size_t i = 0; i < ex->nmarks; i++)
        free(ex->marks[i].label);
    free(ex->marks);
    if (ex->sym)
        sym_free(ex->sym);
    if (ex->a)
        av_free(ex->a);
}

/* Writes the whole snapshot; false with ex->error set. */
static bool export_all(exporter_t *ex, uint64_t *nsegs, uint64_t *nblocks)
{
    for (uint32_t dv = 0; dv < ex->ndev; dv++)
        if (ex->dev[dv].present && !simulate(ex, dv, SIM_INFER, 0))
            return false;
    if (!collect_marks(ex))
        return false;
    pkw_t *w = ex->w;
    pkw_dict_begin(w);
    pkw_key(w, "device_traces");
    pkw_list_begin(w);
    for (uint32_t dv = 0; dv < ex->ndev; dv++) {
        pkw_item(w);
        pkw_list_begin(w);
        xdev_t *d = &ex->dev[dv];
        uint64_t skip = ex->max_entries && d->entries > ex->max_entries ? d->entries - ex->max_entries : 0;
        if (d->present && !simulate(ex, dv, SIM_WRITE, skip))
            return false;
        pkw_list_end(w);
    }
    pkw_list_end(w);
    pkw_key(w, "segments");
    pkw_list_begin(w);
    for (uint32_t dv = 0; dv < ex->ndev; dv++)
        if (ex->dev[dv].present && !write_segments(ex, dv, nsegs, nblocks))
            return false;
    pkw_list_end(w);
    pkw_key(w, "external_annotations");
    write_annotations(ex);
    pkw_key(w, "allocator_settings");
    pkw_dict_begin(w);
    bool any_vmm = false;
    for (uint32_t dv = 0; dv < ex->ndev; dv++)
        any_vmm |= ex->dev[dv].present && ex->dev[dv].vmm;
    pkw_key(w, "expandable_segments");
    pkw_bool(w, any_vmm);
    pkw_key(w, "cualloc_conf");
    pkw_cstr(w, ex->a->config);
    pkw_dict_end(w);
    pkw_dict_end(w);
    return true;
}

int av_cmd_export(int argc, char **argv)
{
    const char *out = NULL, *in = NULL;
    uint64_t max_entries = 0;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--pytorch") == 0 || strcmp(argv[i], "--max-entries") == 0) && i + 1 >= argc) {
            fprintf(stderr, "allocview export: %s needs a value\n", argv[i]);
            return VW_EXIT_USAGE;
        } else if (strcmp(argv[i], "--pytorch") == 0)
            out = argv[++i];
        else if (strcmp(argv[i], "--max-entries") == 0) {
            unsigned long long v;
            if (!txt_parse_count(argv[++i], 1, UINT64_MAX, &v)) {
                fprintf(stderr, "allocview export: bad --max-entries '%s' (a count of events, 1 or more)\n", argv[i]);
                return VW_EXIT_USAGE;
            }
            max_entries = v;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            export_usage(stdout);
            return VW_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "allocview export: unknown option %s\n", argv[i]);
            export_usage(stderr);
            return VW_EXIT_USAGE;
        } else if (!in)
            in = argv[i];
        else {
            export_usage(stderr);
            return VW_EXIT_USAGE;
        }
    }
    if (!in || !out) {
        if (!out)
            fprintf(stderr, "allocview export: say where the snapshot goes: --pytorch OUT.pickle\n");
        export_usage(stderr);
        return VW_EXIT_USAGE;
    }

    /* Refused before the trace is read: the snapshot is renamed over OUT at the end, which would
     * replace the trace it was made from. */
    if (txt_same_file(out, in)) {
        fprintf(stderr, "allocview export: --pytorch %s is the trace itself; name another file for the snapshot\n", out);
        return VW_EXIT_USAGE;
    }
    exporter_t ex = {.path = in, .max_entries = max_entries};
    char err[512];
    av_opts_t opts = {.at_time_ns = -1};
    ex.a = av_analyze(in, &opts, err, sizeof err);
    if (!ex.a) {
        fprintf(stderr, "allocview export: %s: %s\n", in, err);
        return VW_EXIT_UNREADABLE;
    }
    ex.sym = sym_new(ex.a->r);
    ex.nstack_memo = (size_t)tr_stack_count(ex.a->r) + 1;
    ex.stack_memo = xcalloc(ex.nstack_memo, sizeof *ex.stack_memo);
    /* Devices: every one the trace defines or has events on. */
    uint32_t ndev = 1;
    for (uint32_t dv = 0; dv < CUA_TRACE_MAX_DEVICES; dv++)
        if (ex.a->have_dev[dv] || ex.a->acct.dev[dv].seen)
            ndev = dv + 1;
    ex.dev = xcalloc(ndev, sizeof *ex.dev);
    ex.ndev = ndev;
    for (uint32_t dv = 0; dv < ndev; dv++) {
        devaddr_map_init(&ex.dev[dv].live, sizeof(xblock_t));
        ex.dev[dv].present = ex.a->have_dev[dv] || ex.a->acct.dev[dv].seen;
        ex.dev[dv].vmm = ex.a->have_dev[dv] && ex.a->dev_mode[dv] == CUA_TRACE_MODE_VMM;
    }

    /* Written beside the destination and renamed at the end (txt_output_path): a refused or
     * failed export leaves no half snapshot (and an existing file intact); a FIFO or a device is
     * written as it is. */
    char *tmp = txt_output_path(out);
    bool direct = tmp && strcmp(tmp, out) == 0;
    FILE *f = tmp ? fopen(tmp, direct ? "wb" : "wbx") : NULL;
    if (!f) {
        /* the destination's name: the temporary one beside it fails for the same reason */
        fprintf(stderr, "allocview export: %s: cannot create: %s\n", out, strerror(errno));
        free(tmp);
        exporter_free(&ex);
        return VW_EXIT_UNREADABLE;
    }
    if (!direct)
        xalloc_output(tmp); /* removed should host memory run out before the rename */
    static char buf[1 << 16];
    setvbuf(f, buf, _IOFBF, sizeof buf);
    ex.w = pkw_new(f);
    uint64_t nsegs = 0, nblocks = 0;
    bool ok = export_all(&ex, &nsegs, &nblocks);
    char werr[256] = "";
    if (!pkw_finish(ex.w, werr, sizeof werr) && ok) {
        ok = false;
        xfail(&ex, "%s: %s", out, werr);
    }
    if (fclose(f) != 0 && ok) {
        ok = false;
        xfail(&ex, "%s: %s", out, strerror(errno));
    }
    if (!txt_output_end(out, tmp, ok, werr, sizeof werr) && ok) {
        ok = false;
        xfail(&ex, "%s: %s", out, werr);
    }
    if (!ok) {
        fprintf(stderr, "allocview export: %s: %s; nothing written\n", in, ex.error[0] ? ex.error : "out of memory");
        exporter_free(&ex);
        return VW_EXIT_CORRUPT;
    }
    uint64_t inferred = 0;
    for (uint32_t dv = 0; dv < ndev; dv++)
        inferred += ex.dev[dv].inferred;
    fprintf(stderr,
            "allocview export: %s -> %s: %u device%s, %" PRIu64 " events, %" PRIu64 " segments, %" PRIu64
            " blocks live at the end, %zu marks, %zu distinct frames%s\n",
            in, out, ndev, ndev == 1 ? "" : "s", ex.events_written, nsegs, nblocks, ex.nmarks, ex.nframes,
            inferred ? " (the trace starts mid-run: its starting state was inferred)" : "");
    int status = ex.status ? ex.status : ex.a->status;
    if (status == VW_EXIT_CORRUPT)
        fprintf(stderr, "allocview export: %s: corrupt trace: %s; the snapshot covers the records before it\n", in,
                ex.a->error);
    exporter_free(&ex);
    return status;
}
