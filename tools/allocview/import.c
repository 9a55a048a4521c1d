/* import.c — `allocview import SNAPSHOT.pickle -o TRACE [--device-memory SIZE]`: a PyTorch memory
 * snapshot (torch.cuda.memory._dump_snapshot; read with pickle.c, data only) as a cualloc trace
 * (trace_writer.c).
 *
 * The snapshot's event list is a ring buffer that starts mid-run, so the state at its start is
 * reconstructed and written as INIT_BLOCK / INIT_MAP records:
 *   blocks: blocks freed (free_completed) in the trace that it never saw allocated, plus blocks of
 *           the final segments (active_allocated / active_pending_free) it never saw allocated.
 *           A free already waiting for its streams at the start is no allocated block, as PyTorch
 *           counts it (its allocated bytes dropped at the free_requested): one the trace completes
 *           without its request is only a FREE_DONE, one still waiting at the end that no event
 *           names is a starting block freed at once (FREE, no FREE_DONE: active_pending_free);
 *   memory: the final segments' ranges with the trace's segment events undone from the last back
 *           (minus what the trace mapped, plus what it unmapped): an expandable segment that grew
 *           or was remapped in the window starts with only what was mapped before it.
 * Then the events of every device and the annotations, merged by time (each device's own order
 * kept), per event: alloc -> ALLOC, free_requested -> FREE and free_completed -> FREE_DONE (a block
 * whose free waits for its streams is pending in between; a free_requested that the next event
 * completes is one completed FREE, and so is a free_completed of a block the trace never saw
 * allocated in a trace recorded without free_requested events), segment_alloc / segment_map -> MAP,
 * segment_free / segment_unmap -> UNMAP with a TRIM before each run of segment_free (PyTorch
 * frees segments when releasing its cache), oom -> OOM, user_defined (an annotation entry) -> MARK
 * (its innermost frame's name), external_annotations -> MARK ("STAGE name" whole up to
 * TW_LABEL_MAX bytes, cut there with a warning; the name alone for marks `allocview export`
 * wrote), frames -> stacks of PYFRAME nodes (C++ frames too: the snapshot has their names only);
 * a block freed in the trace that it never saw allocated has its free's frames as its call site
 * only where the snapshot's frees carry their allocation's stack (frees_carry_alloc_stacks).
 * Sizes: an event's size is the caller's requested size; ALLOC records it as `requested`, with
 * the allocated size of the block when the snapshot has it (the last alloc at an address whose
 * block is live in the final segments: that block's `size`), else the size PyTorch's round_size
 * gives (512-byte multiples, or steps of the settings' roundup_power2_divisions), which a block of
 * a split segment can exceed; an alloc that `allocview export` wrote carries its block's size as
 * `cualloc_allocated_size`, and that is the size then. The device's capacity is not in a snapshot: --device-memory (default
 * 80 GiB). The CONFIG record is "expandable_segments:0" or ":1" as the snapshot's settings say,
 * followed by ",max_split_size_mb:N" where they set max_split_size,
 * so `allocview replay --conf recorded` replays under the allocator mode PyTorch used (a snapshot
 * without settings or expandable segments at its end is expandable when its events map or unmap
 * segments: classic segments are only allocated and freed).
 * Malformed input: a bad segment or block refuses the file, a bad event or annotation is skipped
 * with a warning (see "input checks").
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cualloc_trace.h"
#include "pickle.h"
#include "ranges.h"
#include "reader.h"
#include "replay.h"
#include "text.h"
#include "trace_writer.h"
#include "u64map.h"
#include "xalloc.h"

enum { IM_EXIT_USAGE = 1, IM_EXIT_UNREADABLE = 2 };
enum { IM_DIVISION_INTERVALS = 16 }; /* PyTorch's kRoundUpPowerOfTwoIntervals: 1 MiB to 64 GiB */

/* ------------------------------------------------------------------------------ importer */

typedef struct imp {
    tw_t *w;
    u64map_t frames;   /* py_t* of a frame dict -> PYFRAME id */
    u64map_t lists;    /* py_t* of a frames list -> stack id: a list shared through the pickle memo is
                      * walked once, so hostile sharing cannot make the import quadratic */
    u64map_t nodes;    /* (parent << 32 | pyframe) -> STACK id */
    u64map_t streams;  /* handle -> STREAM id */
    uint32_t next_frame, next_node, next_stream;
    /* allocator_settings' roundup_power2_divisions: divisions[i] for requests of [2^i, 2^(i+1))
     * MiB, those under 1 MiB with the first and those of 32 GiB or more with the last (0 or 1:
     * none, the snapshot's default) */
    uint64_t divisions[IM_DIVISION_INTERVALS];
    bool ok;
} imp_t;

/* PyTorch's round_size: 512-byte multiples, or with roundup_power2_divisions set for the request's
 * interval to n, the next of the n equal steps between the powers of two around it (a power of
 * two stays as it is). */
static uint64_t round_size(const imp_t *im, uint64_t req)
{
    if (req < 512)
        return 512;
    unsigned log2 = 63u - (unsigned)__builtin_clzll(req), index = log2 > 20 ? log2 - 20 : 0;
    if (index >= IM_DIVISION_INTERVALS)
        index = IM_DIVISION_INTERVALS - 1;
    uint64_t n = im->divisions[index];
    if (n > 1 && req > 512 * n && (req & (req - 1)) != 0) {
        uint64_t step = (1ull << log2) / n; /* n is a power of two at most 2^20 (read_divisions), req > 512n */
        uint64_t floor = req & ~(step - 1);
        return floor == req ? req : floor + step;
    }
    return (req + 511) / 512 * 512;
}

static bool divisions_set(const imp_t *im)
{
    for (unsigned i = 0; i < IM_DIVISION_INTERVALS; i++)
        if (im->divisions[i] > 1)
            return true;
    return false;
}

/* allocator_settings' roundup_power2_divisions into im->divisions: a dict of interval starts in MiB
 * ("1", "2", "4", ... "32768") as PyTorch writes it, or one number for every interval. A value that
 * is no power of two (PyTorch refuses those) or is absurdly large is ignored, with a warning. */
static void read_divisions(imp_t *im, const py_t *settings, const char *in)
{
    const py_t *div = py_dict_get(settings, "roundup_power2_divisions");
    if (!div)
        return;
    for (unsigned i = 0; i < IM_DIVISION_INTERVALS; i++) {
        char key[16];
        snprintf(key, sizeof key, "%u", 1u << i);
        const py_t *v = div->kind == PY_DICT ? py_dict_get(div, key) : div;
        int64_t n = 0;
        if (!v || !py_as_int(v, &n) || n == 0)
            continue;
        if (n < 0 || n > (1 << 20) || (n & (n - 1)) != 0) {
            fprintf(stderr, "allocview import: %s: allocator_settings' roundup_power2_divisions for %u MiB is %" PRId64
                    ", not a power of two up to 2^20; ignored (sizes there rounded to 512 bytes)\n",
                    in, 1u << i, n);
            continue;
        }
        im->divisions[i] = (uint64_t)n;
    }
}

/* Adds key to the set m; true when it was there already. Out of memory fails the import. */
static bool set_add(imp_t *im, u64map_t *m, uint64_t key)
{
    bool found;
    if (!u64map_slot(m, key, &found))
        im->ok = false;
    return found;
}

/* m[key] = value; out of memory clears im->ok. */
static void map_put(imp_t *im, u64map_t *m, uint64_t key, uint64_t value)
{
    bool found;
    uint64_t *v = u64map_slot(m, key, &found);
    if (v)
        *v = value;
    else
        im->ok = false;
}

static uint32_t stream_id(imp_t *im, uint64_t handle)
{
    bool f;
    uint64_t *v = u64map_slot(&im->streams, handle, &f);
    if (!v) {
        im->ok = false;
        return 0;
    }
    if (!f) {
        *v = ++im->next_stream;
        if (!tw_stream(im->w, (uint32_t)*v, handle))
            im->ok = false;
    }
    return (uint32_t)*v;
}

static uint32_t stack_of_list(imp_t *im, const py_t *frames);

/* A STR's bytes as a new C string ("" for anything else). */
static char *py_strdup(const py_t *v)
{
    if (!v || (v->kind != PY_STR && v->kind != PY_BYTES))
        return xstrdup("");
    return xstrndup(v->u.s.p, v->u.s.len);
}

static uint32_t stack_of(imp_t *im, const py_t *frames)
{
    if (!frames)
        return 0;
    bool found;
    uint64_t *sid = u64map_slot(&im->lists, (uint64_t)(uintptr_t)frames, &found);
    if (!sid) {
        im->ok = false;
        return 0;
    }
    if (!found)
        *sid = stack_of_list(im, frames);
    return (uint32_t)*sid;
}

static uint32_t stack_of_list(imp_t *im, const py_t *frames)
{
    size_t n = py_len(frames);
    uint32_t parent = 0;
    for (size_t i = n; i-- > 0;) { /* outermost (last) first: it is the root */
        const py_t *fr = py_item(frames, i);
        if (!fr || fr->kind != PY_DICT)
            continue;
        bool f;
        uint64_t *fid = u64map_slot(&im->frames, (uint64_t)(uintptr_t)fr, &f);
        if (!fid) {
            im->ok = false;
            return 0;
        }
        if (!f) {
            *fid = ++im->next_frame;
            int64_t line = 0;
            py_as_int(py_dict_get(fr, "line"), &line);
            /* Whole names: C++ template names run to kilobytes, and a cut would merge frames. */
            char *name = py_strdup(py_dict_get(fr, "name")), *file = py_strdup(py_dict_get(fr, "filename"));
            if (!tw_pyframe(im->w, (uint32_t)*fid, line > 0 ? (uint64_t)line : 0, name, file))
                im->ok = false;
            free(name);
            free(file);
        }
        uint64_t key = (uint64_t)parent << 32 | *fid;
        uint64_t *nid = u64map_slot(&im->nodes, key, &f);
        if (!nid) {
            im->ok = false;
            return 0;
        }
        if (!f) {
            *nid = ++im->next_node;
            if (!tw_stack(im->w, (uint32_t)*nid, parent, CUA_TRACE_FRAME_PYTHON, *fid))
                im->ok = false;
        }
        parent = (uint32_t)*nid;
    }
    return parent;
}

static int64_t geti(const py_t *d, const char *k)
{
    int64_t v = 0;
    py_as_int(py_dict_get(d, k), &v);
    return v;
}

/* ------------------------------------------------------------------------------ mapped ranges */

/* ------------------------------------------------------------------------------ input checks */

/* Malformed input never crashes the import and never passes silently. What the starting state is
 * built from (the segments and their blocks, the shape of device_traces) must be whole: a segment
 * without a usable address or size, a block without a usable size or state (its address may be
 * absent: see the final segments' blocks in av_cmd_import), a device out of range, device_traces
 * not a list of lists refuses the file, naming the entry and key, and nothing is written. A malformed
 * event or annotation (not a dict, no action, an unknown action, a missing or negative addr, size,
 * stream or time_us) is skipped with a warning naming its index and key — the first
 * IM_MAX_WARNINGS of them; a last line counts them all — and the rest imports. */
enum { IM_MAX_WARNINGS = 20 };

typedef struct chk {
    const char *in;
    uint64_t skipped;  /* events and annotations skipped */
    uint64_t untimed;  /* events without time_us (written at the time of the record before them) */
} chk_t;

static const char *kind_name(const py_t *v)
{
    if (!v)
        return "absent";
    switch (v->kind) {
    case PY_NONE: return "None";
    case PY_BOOL: return "a bool";
    case PY_INT: return "an int";
    case PY_FLOAT: return "a float";
    case PY_STR: return "a str";
    case PY_BYTES: return "bytes";
    case PY_LIST: return "a list";
    case PY_TUPLE: return "a tuple";
    case PY_DICT: return "a dict";
    default: return "an unknown value";
    }
}

static bool is_seq(const py_t *v)
{
    return v && (v->kind == PY_LIST || v->kind == PY_TUPLE);
}

/* d[key] as an integer in [0, limit]: true with *out. Absent: *out = 0, true unless required.
 * Otherwise false with the reason in why. */
static bool field_uint(const py_t *d, const char *key, bool required, uint64_t limit, uint64_t *out, char *why,
                       size_t n)
{
    const py_t *v = py_dict_get(d, key);
    *out = 0;
    if (!v) {
        if (required)
            snprintf(why, n, "no '%s'", key);
        return !required;
    }
    if (v->kind != PY_INT) {
        snprintf(why, n, "'%s' is %s, not an integer", key, kind_name(v));
        return false;
    }
    if (v->u.i < 0 || (uint64_t)v->u.i > limit) {
        snprintf(why, n, "'%s' is %" PRId64 ", %s", key, v->u.i, v->u.i < 0 ? "below 0" : "out of range");
        return false;
    }
    *out = (uint64_t)v->u.i;
    return true;
}

/* time_us in ns must fit 64 bits. */
#define IM_MAX_TIME_US (UINT64_MAX / 1000)

/* Whether event e can be imported; the reason in why when not. */
static bool check_event(chk_t *c, const py_t *e, char *why, size_t n)
{
    if (!e || e->kind != PY_DICT) {
        snprintf(why, n, "is %s, not a dict", kind_name(e));
        return false;
    }
    const py_t *a = py_dict_get(e, "action");
    if (!a || a->kind != PY_STR) {
        snprintf(why, n, a ? "'action' is %s, not a str" : "no 'action'", kind_name(a));
        return false;
    }
    uint64_t v;
    if (!field_uint(e, "time_us", false, IM_MAX_TIME_US, &v, why, n) ||
        !field_uint(e, "stream", false, INT64_MAX, &v, why, n))
        return false;
    bool block = py_str_eq(a, "alloc") || py_str_eq(a, "free_requested") || py_str_eq(a, "free_completed");
    bool seg = py_str_eq(a, "segment_alloc") || py_str_eq(a, "segment_free") || py_str_eq(a, "segment_map") ||
               py_str_eq(a, "segment_unmap");
    if (block || seg) {
        /* addr and size both below 2^63: addr + size cannot wrap */
        if (!field_uint(e, "addr", true, INT64_MAX, &v, why, n) || !field_uint(e, "size", true, INT64_MAX, &v, why, n))
            return false;
        if (seg && v == 0) {
            snprintf(why, n, "'size' is 0: a segment event with no memory");
            return false;
        }
        uint64_t allocated;
        if (py_str_eq(a, "alloc") && !field_uint(e, "cualloc_allocated_size", false, INT64_MAX, &allocated, why, n))
            return false;
        if (py_str_eq(a, "alloc") && allocated && allocated < v) {
            snprintf(why, n, "'cualloc_allocated_size' is %" PRIu64 ", below its 'size' %" PRIu64, allocated, v);
            return false;
        }
    } else if (py_str_eq(a, "oom")) {
        if (!field_uint(e, "size", true, INT64_MAX, &v, why, n) ||
            !field_uint(e, "device_free", false, INT64_MAX, &v, why, n))
            return false;
    } else if (!py_str_eq(a, "snapshot") && !py_str_eq(a, "user_defined")) {
        /* snapshot: PyTorch marks a snapshot taken, nothing to import; user_defined: an annotation
         * (recordAnnotation), a MARK */
        snprintf(why, n, "unknown action '%.*s'", a->u.s.len > 40 ? 40 : (int)a->u.s.len, a->u.s.p);
        return false;
    }
    if (!py_dict_get(e, "time_us"))
        c->untimed++;
    return true;
}

/* Whether segment g can build the starting state; the reason in why when not. */
static bool check_segment(const py_t *g, char *why, size_t n)
{
    if (!g || g->kind != PY_DICT) {
        snprintf(why, n, "is %s, not a dict", kind_name(g));
        return false;
    }
    uint64_t v, total, cur;
    if (!field_uint(g, "device", true, CUA_TRACE_MAX_DEVICES - 1, &v, why, n) ||
        !field_uint(g, "address", true, INT64_MAX, &cur, why, n) ||
        !field_uint(g, "stream", false, INT64_MAX, &v, why, n) ||
        !field_uint(g, "total_size", true, INT64_MAX, &total, why, n))
        return false;
    if (total == 0) {
        snprintf(why, n, "'total_size' is 0");
        return false;
    }
    const py_t *blocks = py_dict_get(g, "blocks");
    if (blocks && !is_seq(blocks)) {
        snprintf(why, n, "'blocks' is %s, not a list", kind_name(blocks));
        return false;
    }
    for (size_t b = 0; b < py_len(blocks); b++) {
        const py_t *k = py_item(blocks, b);
        char bwhy[160];
        const py_t *state = py_dict_get(k, "state");
        bool ok = k && k->kind == PY_DICT;
        if (!ok)
            snprintf(bwhy, sizeof bwhy, "is %s, not a dict", kind_name(k));
        else if (!state || state->kind != PY_STR) {
            snprintf(bwhy, sizeof bwhy, state ? "'state' is %s, not a str" : "no 'state'", kind_name(state));
            ok = false;
        } else {
            uint64_t size;
            ok = field_uint(k, "address", false, INT64_MAX, &v, bwhy, sizeof bwhy) &&
                 field_uint(k, "size", true, INT64_MAX, &size, bwhy, sizeof bwhy) &&
                 field_uint(k, "requested_size", false, INT64_MAX, &v, bwhy, sizeof bwhy);
            /* the address a block without 'address' is given (segment + the sizes before it)
             * stays below 2^63 */
            if (ok && size > INT64_MAX - cur) {
                snprintf(bwhy, sizeof bwhy, "the blocks' sizes run past the end of the address space");
                ok = false;
            }
            cur += size;
        }
        if (!ok) {
            snprintf(why, n, "blocks[%zu]: %s", b, bwhy);
            return false;
        }
    }
    return true;
}

/* The frames of a final block's allocation: PyTorch 2.0's blocks have no 'frames' but a 'history'
 * of allocations, whose first entry is the one PyTorch's viewer shows for the block. */
static const py_t *block_frames(const py_t *blk)
{
    const py_t *f = py_dict_get(blk, "frames");
    return f ? f : py_dict_get(py_item(py_dict_get(blk, "history"), 0), "frames");
}

/* The final segments' blocks of one device, in order. A segment's blocks tile it: a block
 * without 'address' (PyTorch 2.0 writes none) lies at the segment's address plus the sizes before
 * it, where PyTorch's viewer puts every block. check_segment keeps that sum below 2^63. */
typedef struct final_blocks {
    const py_t *segments;
    int64_t dev;
    size_t s, b;   /* the next segment, the next block of segment s - 1 */
    uint64_t next; /* where a block without 'address' lies */
} final_blocks_t;

/* The next block: true with *seg, *blk and its address. */
static bool final_block_next(final_blocks_t *it, const py_t **seg, const py_t **blk, uint64_t *addr)
{
    for (;;) {
        const py_t *g = it->s ? py_item(it->segments, it->s - 1) : NULL;
        const py_t *blocks = py_dict_get(g, "blocks");
        if (g && it->b < py_len(blocks)) {
            const py_t *b = py_item(blocks, it->b++);
            *seg = g;
            *blk = b;
            *addr = py_dict_get(b, "address") ? (uint64_t)geti(b, "address") : it->next;
            it->next += (uint64_t)geti(b, "size");
            return true;
        }
        do {
            if (it->s == py_len(it->segments))
                return false;
            g = py_item(it->segments, it->s++);
        } while (geti(g, "device") != it->dev);
        it->b = 0;
        it->next = (uint64_t)geti(g, "address");
    }
}

static void import_usage(FILE *out)
{
    fprintf(out, "usage: allocview import SNAPSHOT.pickle -o TRACE [--device-memory SIZE]\n"
                 "  converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) into a cualloc trace;\n"
                 "  SIZE is the device capacity to record (the snapshot has none; default 80GiB)\n");
}

typedef struct ann { uint64_t time; const py_t *d; size_t index; /* in external_annotations */ } ann_t;

static int ann_cmp(const void *a, const void *b)
{
    const ann_t *x = a, *y = b;
    return x->time < y->time ? -1 : x->time > y->time;
}

/* Cuts a label past what a trace record holds at a UTF-8 character boundary; its new length. */
static size_t label_cut(char *label)
{
    size_t len = strlen(label);
    if (len <= TW_LABEL_MAX)
        return len;
    size_t cut = TW_LABEL_MAX;
    while (cut > 0 && ((unsigned char)label[cut] & 0xC0) == 0x80)
        cut--;
    label[cut] = 0;
    return cut;
}

/* An annotation as a MARK: "STAGE name" (PyTorch's record_function phases), or the name alone for
 * a cualloc mark that `allocview export` wrote (cualloc_mark: True). */
static void write_annotation(imp_t *im, const char *in, const ann_t *a)
{
    /* The stage and name whole: a cut name would no longer pair a START with its END. */
    char *stage = py_strdup(py_dict_get(a->d, "stage")), *name = py_strdup(py_dict_get(a->d, "name")), *label = NULL;
    int64_t plain = 0;
    bool ok = stage && name &&
              (py_as_int(py_dict_get(a->d, "cualloc_mark"), &plain) && plain ? asprintf(&label, "%s", name)
                                                                             : asprintf(&label, "%s %s", stage, name)) >= 0;
    if (!ok) {
        label = NULL;
        im->ok = false;
    } else {
        size_t len = strlen(label), cut = label_cut(label);
        if (cut < len)
            fprintf(stderr, "allocview import: %s: external_annotations[%zu]: its label (%zu bytes) is cut to %zu bytes, "
                    "the most a trace record holds\n", in, a->index, len, cut);
        im->ok &= tw_mark(im->w, a->time, label);
    }
    free(stage);
    free(name);
    free(label);
}

/* One device's place and state in pass 2. */
typedef struct devpass {
    const py_t **ev;   /* its device_traces events that passed check_event, in order */
    size_t i, n;       /* the next event, the number of events */
    u64map_t sizes;    /* addr -> allocated size of blocks allocated in the trace */
    u64map_t last_alloc; /* addr -> 1 + index of the last alloc event at addr */
    u64map_t final_size; /* addr -> size of the block live there in the final segments */
    u64map_t pending;  /* addr -> 1 while its free is requested (FREE written), not completed */
    uint64_t alloc_now, resv_now; /* its allocated and reserved bytes so far, for OOM records */
    bool in_free_run;  /* the previous event was a segment_free (one TRIM heads a run of them) */
} devpass_t;

static bool py_same_str(const py_t *a, const py_t *b)
{
    bool sa = a && (a->kind == PY_STR || a->kind == PY_BYTES), sb = b && (b->kind == PY_STR || b->kind == PY_BYTES);
    if (!sa || !sb)
        return sa == sb;
    return a->u.s.len == b->u.s.len && memcmp(a->u.s.p, b->u.s.p, a->u.s.len) == 0;
}

/* Whether two frame lists name the same frames (name, filename, line), whatever dicts hold them. */
static bool same_frames(const py_t *a, const py_t *b)
{
    if (a == b)
        return true;
    if (py_len(a) != py_len(b))
        return false;
    for (size_t i = 0; i < py_len(a); i++) {
        const py_t *x = py_item(a, i), *y = py_item(b, i);
        int64_t lx = 0, ly = 0;
        py_as_int(py_dict_get(x, "line"), &lx);
        py_as_int(py_dict_get(y, "line"), &ly);
        if (lx != ly || !py_same_str(py_dict_get(x, "name"), py_dict_get(y, "name")) ||
            !py_same_str(py_dict_get(x, "filename"), py_dict_get(y, "filename")))
            return false;
    }
    return true;
}

/* Whether the snapshot's frees carry the stack of their allocation, which is what a block freed in
 * the window but allocated before it can be given as its call site. PyTorch's frees carry the
 * allocation's stack when history was recorded with context='state' or 'alloc', and their own —
 * the line that freed, no allocation site — with context='all', its default. Told apart on the
 * blocks the window sees allocated and then freed: one free whose frames differ from its
 * allocation's is proof of the free's own; no such block at all, no proof of either (false). The
 * look stops at the first difference or after enough agreement, so a hostile snapshot's long
 * shared frame lists cost little. */
static bool frees_carry_alloc_stacks(imp_t *im, const devpass_t *dp, int ndev)
{
    enum { ENOUGH = 256 };
    size_t agree = 0;
    for (int d = 0; d < ndev; d++) {
        u64map_t last; /* addr -> the frames (py_t *) of its last alloc */
        u64map_init(&last);
        bool f;
        const uint64_t *lv;
        for (size_t i = 0; i < dp[d].n && agree < ENOUGH; i++) {
            const py_t *e = dp[d].ev[i], *a = py_dict_get(e, "action");
            uint64_t addr = (uint64_t)geti(e, "addr");
            if (py_str_eq(a, "alloc")) {
                uint64_t *v = u64map_slot(&last, addr, &f);
                if (!v) {
                    im->ok = false;
                    break;
                }
                *v = (uint64_t)(uintptr_t)py_dict_get(e, "frames");
            } else if ((py_str_eq(a, "free_requested") || py_str_eq(a, "free_completed")) &&
                       (lv = u64map_find(&last, addr))) {
                const py_t *af = (const py_t *)(uintptr_t)*lv;
                if (!same_frames(af, py_dict_get(e, "frames"))) {
                    u64map_free(&last);
                    return false;
                }
                agree++;
            }
        }
        u64map_free(&last);
    }
    return agree > 0;
}

/* true when event i of p is a free_requested that the next event completes (free_completed at
 * the same address): PyTorch writes that pair for every free whose memory is reusable at once. */
static bool free_pair_at(const devpass_t *p, size_t i)
{
    if (i + 1 >= p->n)
        return false;
    const py_t *e = p->ev[i], *n = p->ev[i + 1];
    return py_str_eq(py_dict_get(e, "action"), "free_requested") &&
           py_str_eq(py_dict_get(n, "action"), "free_completed") && geti(e, "addr") == geti(n, "addr");
}

/* Writes event i of device d; false when it writes nothing (the free_completed of a pair written
 * as one completed FREE, snapshot and unknown actions). */
static bool import_event(imp_t *im, devpass_t *p, uint32_t d, size_t i, uint64_t devmem)
{
    const py_t *e = p->ev[i];
    const py_t *a = py_dict_get(e, "action");
    uint64_t t = (uint64_t)geti(e, "time_us") * 1000;
    uint64_t addr = (uint64_t)geti(e, "addr"), size = (uint64_t)geti(e, "size");
    uint32_t sid = stream_id(im, (uint64_t)geti(e, "stream"));
    bool segfree = py_str_eq(a, "segment_free") || py_str_eq(a, "segment_unmap");
    if (py_str_eq(a, "segment_free") && !p->in_free_run)
        tw_trim(im->w, t, d);
    p->in_free_run = py_str_eq(a, "segment_free") ? true : (segfree ? p->in_free_run : false);
    bool seen_it;
    if (py_str_eq(a, "alloc")) {
        /* The allocated size: PyTorch's rounding of the request, unless this is the last alloc at
         * the address and a block is live there at the end: then that block is this allocation,
         * and its size is the real one (a block of a split segment can be larger than the rounded
         * request: PyTorch leaves a remainder too small to split inside it). */
        uint64_t allocated = (uint64_t)geti(e, "cualloc_allocated_size"); /* what `allocview export` wrote */
        uint64_t r = allocated ? allocated : round_size(im, size);
        const uint64_t *last = u64map_find(&p->last_alloc, addr), *final = u64map_find(&p->final_size, addr);
        if (last && *last == i + 1 && final && *final >= size)
            r = *final;
        map_put(im, &p->sizes, addr, r);
        im->ok &= tw_alloc(im->w, t, d, sid, addr, r, size, stack_of(im, py_dict_get(e, "frames")), false);
        p->alloc_now += r;
    } else if (py_str_eq(a, "free_requested") || py_str_eq(a, "free_completed")) {
        /* free_requested -> FREE, free_completed -> FREE_DONE, as the trace format defines them: a
         * block whose free waits for its streams (record_stream) stays pending in between, and
         * one pending at the end exports as active_pending_free. The pair PyTorch writes for a
         * free that completes at once is one completed FREE (what `allocview export` writes as
         * that pair). A free_completed whose request came before the window began is a FREE_DONE
         * (pass 1 marked it pending: the block was no allocated one at the start), unless the
         * trace was recorded without requests: then a completed FREE. The allocated bytes for OOM records drop at the request,
         * as PyTorch counts them (its free() takes the block's size off allocated_bytes before it
         * waits for the streams; a pending block is active, not allocated) and as the trace's
         * reader does at FREE. */
        bool requested = py_str_eq(a, "free_requested");
        if (!requested && i > 0 && free_pair_at(p, i - 1))
            return false; /* written with its request */
        uint64_t *r = u64map_slot(&p->sizes, addr, &seen_it);
        uint64_t freed = r && *r ? *r : round_size(im, size);
        uint64_t *pend = r ? u64map_slot(&p->pending, addr, &seen_it) : NULL;
        if (!pend) {
            im->ok = false;
            return false;
        }
        if (!requested && *pend) { /* its bytes left the allocated count at the request */
            *pend = 0;
            /* A block whose free was requested before the window has no known size: the event's
             * own, PyTorch's requested size, is all there is (a rounding of it would be a guess,
             * and what an export gives back). Nothing counts FREE_DONE's bytes. */
            im->ok &= tw_free_done(im->w, t, d, sid, addr, *r ? freed : size);
            return true;
        }
        p->alloc_now = p->alloc_now > freed ? p->alloc_now - freed : 0;
        if (requested && !free_pair_at(p, i)) {
            *pend = 1;
            im->ok &= tw_free(im->w, t, d, sid, addr, freed, false);
        } else {
            im->ok &= tw_free(im->w, t, d, sid, addr, freed, true);
        }
    } else if (py_str_eq(a, "segment_alloc") || py_str_eq(a, "segment_map")) {
        im->ok &= tw_map(im->w, t, d, addr, size, false, false);
        p->resv_now += size;
    } else if (segfree) {
        im->ok &= tw_map(im->w, t, d, addr, size, true, false);
        p->resv_now = p->resv_now > size ? p->resv_now - size : 0;
    } else if (py_str_eq(a, "user_defined")) {
        /* PyTorch's annotation entry carries its name as the context, which the snapshot gives as
         * its frames: the innermost frame's name is the label. */
        char *label = py_strdup(py_dict_get(py_item(py_dict_get(e, "frames"), 0), "name"));
        if (!*label) {
            free(label);
            label = xstrdup("user_defined");
        }
        label_cut(label);
        im->ok &= tw_mark(im->w, t, label);
        free(label);
    } else if (py_str_eq(a, "oom")) {
        uint64_t dfree = (uint64_t)geti(e, "device_free");
        im->ok &= tw_oom(im->w, t, d, sid, stack_of(im, py_dict_get(e, "frames")), size, round_size(im, size), devmem,
                         p->alloc_now, p->resv_now, dfree, 0);
    } else {
        return false; /* snapshot, unknown actions */
    }
    return true;
}

int av_cmd_import(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    uint64_t devmem = (uint64_t)80 << 30;
    for (int i = 1; i < argc; i++) {
        bool takes_value = strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0 ||
                           strcmp(argv[i], "--device-memory") == 0;
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, "allocview import: %s needs a value\n", argv[i]);
            return IM_EXIT_USAGE;
        } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0)
            out = argv[++i];
        else if (strcmp(argv[i], "--device-memory") == 0) {
            if (!txt_parse_size(argv[++i], &devmem) || !devmem) {
                fprintf(stderr, "allocview import: bad --device-memory '%s'\n", argv[i]);
                return IM_EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            import_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "allocview import: unknown option %s\n", argv[i]);
            import_usage(stderr);
            return IM_EXIT_USAGE;
        } else if (!in)
            in = argv[i];
        else {
            import_usage(stderr);
            return IM_EXIT_USAGE;
        }
    }
    if (!in || !out) {
        import_usage(stderr);
        return IM_EXIT_USAGE;
    }
    /* Refused before the snapshot is read: the trace's fopen would truncate the snapshot. */
    if (txt_same_file(out, in)) {
        fprintf(stderr, "allocview import: -o %s is the snapshot itself; name another file for the trace\n", out);
        return IM_EXIT_USAGE;
    }
    struct stat st;
    int fd = tr_open_regular(in, &st);
    if (fd == -2) {
        fprintf(stderr, "allocview import: %s: not a regular file\n", in);
        return IM_EXIT_UNREADABLE;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        fprintf(stderr, "allocview import: %s: cannot open: %s\n", in, strerror(errno));
        if (fd >= 0)
            close(fd);
        return IM_EXIT_UNREADABLE;
    }
    if (st.st_size <= 0 || st.st_size > ((off_t)1 << 34)) {
        fprintf(stderr, "allocview import: %s: empty or too large\n", in);
        fclose(f);
        return IM_EXIT_UNREADABLE;
    }
    size_t len = (size_t)st.st_size;
    uint8_t *data = xmalloc(len);
    if (fread(data, 1, len, f) != len) {
        fprintf(stderr, "allocview import: %s: cannot read\n", in);
        free(data);
        fclose(f);
        return IM_EXIT_UNREADABLE;
    }
    fclose(f);
    char err[4608]; /* room for a PATH_MAX-long name in a message */
    pk_limits_t lim = {.max_bytes = len * 64 + ((size_t)256 << 20)};
    pk_doc_t *doc = pk_load(data, len, &lim, err, sizeof err);
    free(data);
    if (!doc) {
        fprintf(stderr, "allocview import: %s: not a snapshot this reader accepts: %s\n", in, err);
        return IM_EXIT_UNREADABLE;
    }
    const py_t *root = pk_root(doc);
    const py_t *segments = py_dict_get(root, "segments");
    const py_t *traces = py_dict_get(root, "device_traces");
    if (!root || root->kind != PY_DICT || (!segments && !traces)) {
        fprintf(stderr, "allocview import: %s: not a PyTorch memory snapshot (no segments / device_traces)\n", in);
        pk_free(doc);
        return IM_EXIT_UNREADABLE;
    }
    /* The snapshot's shape, checked before anything is written (see "input checks" above). */
    chk_t chk = {.in = in};
    char why[256];
#define REFUSE(...)                                                                                       \
    do {                                                                                                  \
        fprintf(stderr, "allocview import: %s: ", in);                                                    \
        fprintf(stderr, __VA_ARGS__);                                                                     \
        fprintf(stderr, "; the snapshot is refused, nothing written\n");                                 \
        pk_free(doc);                                                                                     \
        return IM_EXIT_UNREADABLE;                                                                        \
    } while (0)
    if (segments && !is_seq(segments))
        REFUSE("'segments' is %s, not a list", kind_name(segments));
    if (traces && !is_seq(traces))
        REFUSE("'device_traces' is %s, not a list", kind_name(traces));
    if (py_len(traces) > CUA_TRACE_MAX_DEVICES)
        REFUSE("'device_traces' has %zu devices, more than a trace holds (%d)", py_len(traces), CUA_TRACE_MAX_DEVICES);
    int ndev = (int)py_len(traces);
    for (size_t i = 0; i < py_len(segments); i++) {
        const py_t *g = py_item(segments, i);
        if (!check_segment(g, why, sizeof why))
            REFUSE("segments[%zu]: %s", i, why);
        int64_t d = geti(g, "device");
        if (d + 1 > ndev)
            ndev = (int)d + 1;
    }
    for (int d = 0; d < (int)py_len(traces); d++)
        if (!is_seq(py_item(traces, (size_t)d)))
            REFUSE("device_traces[%d] is %s, not a list", d, kind_name(py_item(traces, (size_t)d)));
#undef REFUSE
    /* Per device: the events that pass check_event (the others skipped, with a warning), its place
     * and state in pass 2, and what pass 1 learns for it. */
    devpass_t *dp = xcalloc((size_t)ndev + 1, sizeof *dp);
    for (int d = 0; d < (int)py_len(traces); d++) {
        const py_t *list = py_item(traces, (size_t)d);
        dp[d].ev = xmalloc((py_len(list) + 1) * sizeof *dp[d].ev);
        for (size_t i = 0; i < py_len(list); i++) {
            const py_t *e = py_item(list, i);
            if (check_event(&chk, e, why, sizeof why))
                dp[d].ev[dp[d].n++] = e;
            else if (chk.skipped++ < IM_MAX_WARNINGS)
                fprintf(stderr, "allocview import: %s: device_traces[%d][%zu] %s; event skipped\n", in, d, i, why);
        }
    }

    bool expandable = false;
    const py_t *settings = py_dict_get(root, "allocator_settings");
    int64_t ex = 0;
    if (py_as_int(py_dict_get(settings, "expandable_segments"), &ex))
        expandable = ex != 0;
    for (size_t i = 0; i < py_len(segments); i++)
        if (geti(py_item(segments, i), "is_expandable"))
            expandable = true;
    /* A snapshot with neither (no settings, every segment freed by its end) still says it by its
     * events: only expandable segments are mapped and unmapped piecewise. */
    for (int d = 0; d < (int)py_len(traces) && !expandable; d++)
        for (size_t i = 0; i < dp[d].n && !expandable; i++) {
            const py_t *a = py_dict_get(dp[d].ev[i], "action");
            expandable = py_str_eq(a, "segment_map") || py_str_eq(a, "segment_unmap");
        }

    imp_t im = {0};
    im.ok = true;
    read_divisions(&im, settings, in);
    u64map_init(&im.frames);
    u64map_init(&im.nodes);
    u64map_init(&im.streams);
    u64map_init(&im.lists);
    /* Written beside the destination and renamed at the end (txt_output_path): a failed import
     * leaves no half trace, and an existing file intact (it truncated it); a FIFO or a device is
     * written as it is. */
    char *tmp = txt_output_path(out);
    bool direct = tmp && strcmp(tmp, out) == 0;
    if (!tmp)
        snprintf(err, sizeof err, "cannot create %s: %s", out, strerror(errno));
    /* messages name the destination: the temporary file beside it fails for the same reason */
    im.w = tmp ? tw_open(tmp, out, err, sizeof err) : NULL;
    if (!im.w) {
        fprintf(stderr, "allocview import: %s\n", err);
        free(tmp);
        for (int d = 0; d < ndev; d++)
            free(dp[d].ev);
        free(dp);
        pk_free(doc);
        return IM_EXIT_UNREADABLE;
    }
    if (!direct)
        xalloc_output(tmp); /* removed should host memory run out before the rename */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "allocview import %s", in);
    tw_process(im.w, cmd, "allocview import (PyTorch memory snapshot)", 0);
    /* The settings' max_split_size, in bytes (PyTorch's max_split_size_mb; SIZE_MAX, pickled as -1,
     * when unlimited), is the configuration's too: allocview's fixes for a fragmentation OOM depend on
     * the value in force (never "lower" it to a larger one), and a replay of the recorded
     * configuration runs under it. */
    int64_t max_split = -1;
    char conf[96];
    int cl = snprintf(conf, sizeof conf, "expandable_segments:%d", expandable ? 1 : 0);
    if (py_as_int(py_dict_get(settings, "max_split_size"), &max_split) && max_split >= ((int64_t)1 << 20))
        snprintf(conf + cl, sizeof conf - (size_t)cl, ",max_split_size_mb:%" PRId64, max_split >> 20);
    tw_config(im.w, conf);

    for (int d = 0; d < ndev; d++) {
        char name[96];
        snprintf(name, sizeof name, "PyTorch snapshot device %d (capacity assumed)", d);
        tw_device(im.w, (uint32_t)d, devmem, devmem, 2u << 20, expandable, name);
    }

    /* A block freed in the window that it never saw allocated has the free's stack as its call
     * site only where that stack is its allocation's (frees_carry_alloc_stacks); else none. */
    bool free_stacks = frees_carry_alloc_stacks(&im, dp, ndev);
    /* The first event's or annotation's time: initial records get it. Annotations count: PyTorch
     * keeps them in a ring of their own, which outlasts the events' ring by far, so a window that
     * starts mid-run often has annotations older than its first event, and a trace's times never
     * go backwards (a record before the initial ones would be moved to their time). */
    uint64_t t0 = UINT64_MAX;
    for (int d = 0; d < ndev; d++) {
        for (size_t i = 0; i < dp[d].n; i++) {
            uint64_t t = (uint64_t)geti(dp[d].ev[i], "time_us") * 1000;
            if (t && t < t0)
                t0 = t;
        }
    }
    const py_t *early = py_dict_get(root, "external_annotations");
    for (size_t i = 0; i < py_len(early); i++) {
        const py_t *tv = py_dict_get(py_item(early, i), "time_us");
        /* as the annotation check below takes them: an integer in [0, IM_MAX_TIME_US] */
        if (tv && tv->kind == PY_INT && tv->u.i > 0 && (uint64_t)tv->u.i <= IM_MAX_TIME_US &&
            (uint64_t)tv->u.i * 1000 < t0)
            t0 = (uint64_t)tv->u.i * 1000;
    }
    if (t0 == UINT64_MAX)
        t0 = 0;

    uint64_t nblocks = 0, nmaps = 0, nev = 0;
    for (int d = 0; d < ndev; d++) {
        u64map_init(&dp[d].sizes);
        u64map_init(&dp[d].last_alloc);
        u64map_init(&dp[d].final_size);
        u64map_init(&dp[d].pending);
    }
    /* Each device's allocated and reserved bytes before its first event (the blocks and segments
     * written as already there), from which pass 2 keeps them current for the OOM records: the
     * diagnosis of an OOM weighs them against the capacity and the device's free memory. */
    uint64_t base_alloc[CUA_TRACE_MAX_DEVICES] = {0}, base_resv[CUA_TRACE_MAX_DEVICES] = {0};
    for (int d = 0; d < ndev && im.ok; d++) {
        const devpass_t *p = &dp[d];
        /* The memory mapped at the start, written before the starting blocks that lie in it: the
         * final segments' ranges with the window's segment events undone, last first (a map undone
         * removes its range, an unmap undone adds it back). So a segment mapped before the window
         * stays whole, an expandable segment that grew in the window starts at its size before,
         * and a range unmapped and mapped again is there from the start. A map whose range is not
         * mapped at the end contradicts the snapshot; undoing it removes what there is, and the
         * forward replay of `allocview export` names the contradiction. */
        addr_ranges_t mapped = {0};
        for (size_t s = 0; s < py_len(segments); s++) {
            const py_t *seg = py_item(segments, s);
            uint64_t saddr = (uint64_t)geti(seg, "address"), ssize = (uint64_t)geti(seg, "total_size");
            if (geti(seg, "device") == d && ssize)
                ranges_add_missing(&mapped, saddr, saddr + ssize);
        }
        for (size_t i = p->n; i-- > 0 && im.ok;) {
            const py_t *e = p->ev[i];
            const py_t *a = py_dict_get(e, "action");
            uint64_t addr = (uint64_t)geti(e, "addr"), size = (uint64_t)geti(e, "size");
            if (!size)
                continue;
            if (py_str_eq(a, "segment_alloc") || py_str_eq(a, "segment_map"))
                ranges_remove(&mapped, addr, addr + size);
            else if (py_str_eq(a, "segment_free") || py_str_eq(a, "segment_unmap"))
                ranges_add_missing(&mapped, addr, addr + size);
        }
        for (size_t r = 0; r < mapped.n; r++) {
            tw_map(im.w, t0, (uint32_t)d, mapped.v[r].addr, mapped.v[r].end - mapped.v[r].addr, false, true);
            base_resv[d] += mapped.v[r].end - mapped.v[r].addr;
            nmaps++;
        }
        ranges_free(&mapped);
        /* Frees waiting for their streams (record_stream) when the window starts: PyTorch's
         * allocated bytes dropped at their free_requested, before the window, so they are not
         * allocated then, only active. A block still waiting at the end that the window names
         * nowhere (active_pending_free, no event at its address) is written as a starting block
         * freed at once (FREE without FREE_DONE): the trace has no other way to hold it, and the
         * export gives it back as active_pending_free. Written first, so that the allocated
         * bytes at the start never count two of them at once. */
        u64map_t seen_alloc, init_blocks, touched, requested;
        u64map_init(&seen_alloc);
        u64map_init(&init_blocks);
        u64map_init(&touched);
        u64map_init(&requested);
        bool records_requests = false;
        for (size_t i = 0; i < p->n; i++) {
            const py_t *a = py_dict_get(p->ev[i], "action");
            if (py_str_eq(a, "alloc") || py_str_eq(a, "free_requested") || py_str_eq(a, "free_completed"))
                set_add(&im, &touched, (uint64_t)geti(p->ev[i], "addr"));
            records_requests |= py_str_eq(a, "free_requested");
        }
        final_blocks_t fb = {.segments = segments, .dev = d};
        const py_t *seg, *blk;
        uint64_t baddr;
        while (final_block_next(&fb, &seg, &blk, &baddr)) {
            if (!py_str_eq(py_dict_get(blk, "state"), "active_pending_free") || u64map_has(&touched, baddr))
                continue;
            uint64_t size = (uint64_t)geti(blk, "size"), req = (uint64_t)geti(blk, "requested_size");
            uint32_t sid = stream_id(&im, (uint64_t)geti(seg, "stream"));
            im.ok &= tw_alloc(im.w, t0, (uint32_t)d, sid, baddr, size, req ? req : size,
                              stack_of(&im, block_frames(blk)), true);
            im.ok &= tw_free(im.w, t0, (uint32_t)d, sid, baddr, size, false);
            set_add(&im, &seen_alloc, baddr); /* written: the final blocks below leave it */
            nblocks++;
        }
        /* Pass 1: what the trace saw allocated first, and what it freed without seeing it. */
        for (size_t i = 0; i < p->n; i++) {
            const py_t *e = p->ev[i];
            const py_t *a = py_dict_get(e, "action");
            uint64_t addr = (uint64_t)geti(e, "addr"), size = (uint64_t)geti(e, "size");
            if (py_str_eq(a, "alloc")) {
                set_add(&im, &seen_alloc, addr);
                map_put(&im, &dp[d].last_alloc, addr, i + 1);
            } else if (py_str_eq(a, "free_requested") && !u64map_has(&seen_alloc, addr)) {
                set_add(&im, &requested, addr);
            } else if (py_str_eq(a, "free_completed") && !u64map_has(&seen_alloc, addr)) {
                if (records_requests && !u64map_has(&requested, addr)) {
                    /* Its free was requested before the window: waiting at the start, not
                     * allocated; its completion is a FREE_DONE, as cualloc's recorder writes one
                     * whose request came before recording started. (A window without any
                     * free_requested was recorded without them: the free is all there is.) */
                    map_put(&im, &dp[d].pending, addr, 1);
                } else if (!set_add(&im, &init_blocks, addr)) {
                    tw_alloc(im.w, t0, (uint32_t)d, stream_id(&im, (uint64_t)geti(e, "stream")), addr,
                             round_size(&im, size), size, free_stacks ? stack_of(&im, py_dict_get(e, "frames")) : 0,
                             true);
                    base_alloc[d] += round_size(&im, size);
                    nblocks++;
                }
                set_add(&im, &seen_alloc, addr); /* a later alloc at that address is a new block */
            }
        }
        /* The final segments' live blocks the trace never saw allocated. Their size is the one to
         * free them with: a block still waiting at the end whose free_requested is in the window. */
        fb = (final_blocks_t){.segments = segments, .dev = d};
        while (final_block_next(&fb, &seg, &blk, &baddr)) {
            const py_t *state = py_dict_get(blk, "state");
            uint64_t size = (uint64_t)geti(blk, "size"), req = (uint64_t)geti(blk, "requested_size");
            if (!py_str_eq(state, "active_allocated") && !py_str_eq(state, "active_pending_free"))
                continue;
            map_put(&im, &dp[d].final_size, baddr, size);
            if (u64map_has(&seen_alloc, baddr))
                continue;
            map_put(&im, &dp[d].sizes, baddr, size);
            tw_alloc(im.w, t0, (uint32_t)d, stream_id(&im, (uint64_t)geti(seg, "stream")), baddr, size,
                     req ? req : size, stack_of(&im, block_frames(blk)), true);
            base_alloc[d] += size;
            nblocks++;
        }
        u64map_free(&touched);
        u64map_free(&requested);
        u64map_free(&seen_alloc);
        u64map_free(&init_blocks);
    }

    /* Annotations, merged with the events by time. */
    const py_t *anns = py_dict_get(root, "external_annotations");
    if (anns && !is_seq(anns)) {
        if (chk.skipped++ < IM_MAX_WARNINGS)
            fprintf(stderr, "allocview import: %s: 'external_annotations' is %s, not a list; skipped\n", in,
                    kind_name(anns));
        anns = NULL;
    }
    size_t nann = 0, ai = 0;
    ann_t *av = xcalloc(py_len(anns) + 1, sizeof *av);
    for (size_t i = 0; i < py_len(anns); i++) {
        const py_t *an = py_item(anns, i), *stage = py_dict_get(an, "stage"), *name = py_dict_get(an, "name");
        uint64_t t = 0;
        bool good = an && an->kind == PY_DICT;
        if (!good)
            snprintf(why, sizeof why, "is %s, not a dict", kind_name(an));
        else if (!(good = field_uint(an, "time_us", true, IM_MAX_TIME_US, &t, why, sizeof why)))
            ;
        else if (stage && stage->kind != PY_STR)
            snprintf(why, sizeof why, "'stage' is %s, not a str", kind_name(stage)), good = false;
        else if (name && name->kind != PY_STR)
            snprintf(why, sizeof why, "'name' is %s, not a str", kind_name(name)), good = false;
        if (!good) {
            if (chk.skipped++ < IM_MAX_WARNINGS)
                fprintf(stderr, "allocview import: %s: external_annotations[%zu] %s; annotation skipped\n", in, i, why);
            continue;
        }
        av[nann].d = an;
        av[nann].index = i;
        av[nann++].time = t * 1000;
    }
    if (av)
        qsort(av, nann, sizeof *av, ann_cmp);
    else
        nann = 0;

    /* Pass 2: the events of every device and the annotations, merged by time. The trace's times
     * never go backwards (the writer holds a smaller time at the previous one), so writing the
     * devices one after the other would move every later device's events to the first one's last
     * time. Each device's own order is kept as the snapshot gives it: the merge takes the device
     * whose next event is earliest (the lowest device on a tie), and annotations go before the
     * events of their time. */
    for (int d = 0; d < ndev && dp; d++) {
        dp[d].alloc_now = base_alloc[d];
        dp[d].resv_now = base_resv[d];
    }
    while (im.ok) {
        int best = -1;
        uint64_t bt = 0;
        for (int d = 0; d < ndev; d++) {
            if (dp[d].i == dp[d].n)
                continue;
            uint64_t t = (uint64_t)geti(dp[d].ev[dp[d].i], "time_us") * 1000;
            if (best < 0 || t < bt) {
                best = d;
                bt = t;
            }
        }
        if (best < 0)
            break;
        while (ai < nann && av[ai].time <= bt) {
            write_annotation(&im, in, &av[ai]);
            ai++;
        }
        devpass_t *p = &dp[best];
        if (import_event(&im, p, (uint32_t)best, p->i++, devmem))
            nev++;
    }
    for (int d = 0; d < ndev && dp; d++) {
        u64map_free(&dp[d].sizes);
        u64map_free(&dp[d].last_alloc);
        u64map_free(&dp[d].final_size);
        u64map_free(&dp[d].pending);
        free(dp[d].ev);
    }
    free(dp);
    while (ai < nann) {
        write_annotation(&im, in, &av[ai]);
        ai++;
    }
    free(av);
    bool ok = im.ok;
    if (!tw_close(im.w, true, err, sizeof err)) {
        fprintf(stderr, "allocview import: %s: %s\n", out, err);
        ok = false;
    }
    if (!txt_output_end(out, tmp, ok, err, sizeof err) && ok) {
        fprintf(stderr, "allocview import: %s: %s\n", out, err);
        ok = false;
    }
    u64map_free(&im.frames);
    u64map_free(&im.lists);
    u64map_free(&im.nodes);
    u64map_free(&im.streams);
    pk_free(doc);
    if (!ok) {
        fprintf(stderr, "allocview import: writing %s failed; nothing written\n", out);
        return IM_EXIT_UNREADABLE;
    }
    fprintf(stderr,
            "allocview import: %s -> %s: %d device%s, %" PRIu64 " initial blocks, %" PRIu64 " initial segments, %" PRIu64
            " events, %zu marks, %u stack nodes, %s segments (sizes: requested exact, allocated = the block's size when "
            "it is live at the end, else PyTorch's rounding%s)\n",
            in, out, ndev, ndev == 1 ? "" : "s", nblocks, nmaps, nev, nann, im.next_node,
            expandable ? "expandable" : "classic", divisions_set(&im) ? " with the snapshot's roundup_power2_divisions" : "");
    if (chk.skipped)
        fprintf(stderr, "allocview import: %s: %" PRIu64 " malformed event%s or annotation%s skipped%s\n", in, chk.skipped,
                chk.skipped == 1 ? "" : "s", chk.skipped == 1 ? "" : "s",
                chk.skipped > IM_MAX_WARNINGS ? " (the first of them named above)" : " (named above)");
    if (chk.untimed)
        fprintf(stderr, "allocview import: %s: %" PRIu64 " event%s without time_us, written at the time of the record "
                "before\n", in, chk.untimed, chk.untimed == 1 ? "" : "s");
    return 0;
}
