/* test_stream_safety.c — the stream-safety property against a reference model, on random
 * sequences: memory freed on stream S is never handed to another stream (or device-wide) before
 * the device has finished S's work queued before the free; a device-wide free waits for every
 * stream; nothing is unmapped (or, in classic mode, cuMemFree'd) while work in flight may touch it;
 * and graph capture, stream destruction and the reuse of a stream handle do not break this.
 *
 * The sim's held streams complete their work only when the test says (sim_stream_complete, a
 * synchronize, or an event wait that completes a stream up to that event), so the device runs as
 * far behind the host as the sequence makes it. Streams 1..W.nslot-1 are held, registered as
 * non-blocking or (the variants with cudaMalloc's allocations) some as blocking; slot 0 is the
 * legacy stream, whose work the sim completes once every held blocking stream's work before it has
 * completed (with none, at once).
 *
 * cudaMalloc's allocations (heap_alloc_device_wide, the variants that have them) may serve any
 * stream: a block handed out so must have no unfinished work at all, except the legacy stream's
 * while no non-blocking stream is alive (every blocking stream's later work waits for it). Such a
 * block is owed: the first non-blocking stream created after it must find that work finished (the
 * heap synchronizes the legacy stream), unless a capture forbids the synchronize. In those
 * variants a free on the legacy stream is the front door's (heap_free_on_legacy), and a destroyed
 * stream comes back blocking or non-blocking. Some of them also have a thread's cudaStreamPerThread
 * (the last slot): a held blocking stream the heap is never told of, whose allocations the front
 * door makes under a key of the thread's (stream_key_make) and whose frees it makes device-wide.
 *
 * Model: for every freed byte range not handed out again, the work that may still touch it, as
 * (stream incarnation, event) pairs: the test records its own event on the freeing stream just
 * before a stream-ordered free, and on every live held stream before a device-wide free (on a
 * capturing stream, the event recorded when its capture began: the captured work does not run). A
 * pair is finished when the sim says its event has completed. An incarnation is one life of a
 * stream handle: a destroyed stream's handle given again to a new stream (handle reuse) is a new
 * incarnation, whose work is not ordered after the old one's. A destroyed stream's unfinished work
 * runs on after the destroy, as CUDA's does. Checked:
 *   - every allocation for incarnation I overlaps no range with an unfinished pair of another
 *     incarnation (its own earlier work is ordered before its new work);
 *   - every unmap / cuMemFree the heap makes overlaps no live block and no range with an
 *     unfinished pair (the driver ops are wrapped);
 *   - the heap never invalidates a capture (sim_captures_broken), and heap_check finds nothing.
 *
 * A failing sequence is shrunk (chunks of operations removed while it still fails) and printed with
 * the seed. CUALLOC_SEED=N repeats a run. */
#include <stdarg.h>

#include "internal.h"
#include "testutil.h"

/* Slot 0: the legacy stream; 1..W.nslot-1: held, non-blocking streams (4 slots; 64 in the variant
 * with more streams than the heap's 61 stream tags; 96 in the one with more than the 64 non-blocking
 * streams its table once held, past which it could not see a capture on a stream it had lost, and
 * a device synchronize invalidated it). */
#define NSLOT_MAX 96
#define MAX_LIVE 256
#define MAX_RECS 4096
#define MAX_ALLOCS 1024 /* classic mode: mem_alloc'd ranges, for the wrapped mem_free */
#define MAX_OPS 1500
#define MAX_ZOMBIES 64

typedef enum {
    OP_ALLOC, OP_FREE, OP_FREE_OTHER, OP_FREE_DEVICE_WIDE, OP_COMPLETE, OP_EVENT_SYNC, OP_STREAM_SYNC,
    OP_DEVICE_SYNC, OP_TRIM, OP_DESTROY, OP_REUSE_HANDLE, OP_CAPTURE, OP_FAULT, OP_ALLOC_DEVICE_WIDE, OP_LAUNCH,
    OP_KINDS
} op_kind_t;

static const char *const op_names[OP_KINDS] = {
    "alloc", "free", "free-on-other-stream", "free-device-wide", "complete-stream", "event-sync",
    "stream-sync", "device-sync", "trim", "destroy-stream", "reuse-handle", "capture-begin-or-end",
    "fault", "alloc-device-wide", "launch"};

/* The driver's stream and event operations the heap's calls may be made to fail (OP_FAULT). */
typedef enum { F_EVENT_CREATE, F_EVENT_RECORD, F_EVENT_QUERY, F_EVENT_SYNC, F_STREAM_SYNC, F_DEVICE_SYNC, F_KINDS } fault_t;
static const char *const fault_names[F_KINDS] = {"event_create", "event_record", "event_query", "event_synchronize",
                                                 "stream_synchronize", "device_synchronize"};

/* One operation: its kind and two random words, read against the state the sequence has reached
 * (which live block, which stream, what size), so that any subsequence is still a valid sequence. */
typedef struct {
    uint8_t kind;
    uint64_t a, b;
} op_t;

typedef struct {
    uintptr_t ptr;
    size_t size, block;
    int slot;
} live_t;

/* A freed range and the work that may still touch it. */
typedef struct {
    uintptr_t lo, hi;
    int n;
    int id[NSLOT_MAX + MAX_ZOMBIES];
    cua_event ev[NSLOT_MAX + MAX_ZOMBIES];
} rec_t;

typedef struct {
    cua_stream handle;
    int id;             /* incarnation; slot 0 (legacy) is always 0 */
    bool blocking;      /* registered as a blocking stream */
    bool per_thread;    /* a thread's cudaStreamPerThread: allocations under a key, frees device-wide */
    bool capturing;     /* slot 0: while a blocking stream captures (the legacy stream's work would join it) */
    cua_event capture_ev; /* recorded when the capture began */
} slot_t;

typedef struct {
    const char *name;
    const char *conf;
    size_t max_request;
    bool untracked; /* the heap is told some non-blocking streams escaped it (heap_streams_untracked) */
    int nslot;      /* 0: 4 */
    int blocking;   /* slots 1..blocking start as blocking streams, the rest non-blocking */
    bool device_wide; /* cudaMalloc's allocations, the front door's legacy frees, streams changing kind */
    bool per_thread;  /* the last slot is a thread's cudaStreamPerThread */
} variant_t;

static struct {
    heap_t *h;
    conf_t conf;
    slot_t slot[NSLOT_MAX];
    int nslot;
    int next_id;
    live_t live[MAX_LIVE];
    int nlive;
    rec_t rec[MAX_RECS];
    int nrec;
    struct { uintptr_t ptr; size_t size; } allocs[MAX_ALLOCS];
    int nallocs;
    size_t requested, allocated;
    cua_stream zombie[MAX_ZOMBIES]; /* destroyed streams whose work had not finished */
    int zombie_id[MAX_ZOMBIES];     /* their incarnations */
    cua_event zombie_ev[MAX_ZOMBIES]; /* and their last work, recorded before the destroy */
    int nzombie, nzombie_blocking;
    cua_event owed[MAX_RECS]; /* the legacy stream's unfinished work under device-wide allocations */
    int nowed;
    uint64_t captures_broken; /* sim_captures_broken() when the run began (it counts across runs) */
    unsigned fault_left[F_KINDS]; /* the heap's next calls of each op that fail, doing nothing */
    unsigned faults_fired[F_KINDS]; /* the heap's calls failed so far, by op */
    bool checking; /* the wrapped driver ops check (off while the heap is made and torn down) */
    bool failed;
    char why[1024];
    int failed_at;
    int op_index;
} W;

static driver_ops_t wrapped;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    if (W.failed) return;
    W.failed = true;
    W.failed_at = W.op_index;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W.why, sizeof W.why, fmt, ap);
    va_end(ap);
}

static bool event_done(cua_event ev) { return driver_sim_ops.event_query(0, ev) == CUA_SUCCESS; }

static cua_event event_on(cua_stream s) {
    cua_event ev = NULL;
    if (driver_sim_ops.event_create(0, &ev) != CUA_SUCCESS || driver_sim_ops.event_record(0, ev, s) != CUA_SUCCESS)
        fail("the test could not record an event");
    return ev;
}

/* Drops finished pairs, and records with none left. */
static void recs_prune(void) {
    for (int i = 0; i < W.nrec;) {
        rec_t *r = &W.rec[i];
        for (int k = 0; k < r->n;) {
            if (event_done(r->ev[k])) {
                r->id[k] = r->id[r->n - 1];
                r->ev[k] = r->ev[--r->n];
            } else {
                k++;
            }
        }
        if (r->n == 0) W.rec[i] = W.rec[--W.nrec];
        else i++;
    }
}

/* The first unfinished pair over [lo, hi) that `id` may not ignore (id -1: none may be ignored). */
static const rec_t *recs_blocking(uintptr_t lo, uintptr_t hi, int id, int *which) {
    for (int i = 0; i < W.nrec; i++) {
        const rec_t *r = &W.rec[i];
        if (hi <= r->lo || r->hi <= lo) continue;
        for (int k = 0; k < r->n; k++) {
            if (r->id[k] != id && !event_done(r->ev[k])) {
                *which = k;
                return r;
            }
        }
    }
    return NULL;
}

/* [lo, hi) went to a stream allowed to have it: the records no longer speak for it (its next free
 * carries its own ordering). */
static void recs_carve(uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < W.nrec;) {
        rec_t o = W.rec[i];
        if (hi <= o.lo || o.hi <= lo) {
            i++;
            continue;
        }
        W.rec[i] = W.rec[--W.nrec];
        if (o.lo < lo && W.nrec < MAX_RECS) {
            W.rec[W.nrec] = o;
            W.rec[W.nrec++].hi = lo;
        }
        if (hi < o.hi && W.nrec < MAX_RECS) {
            W.rec[W.nrec] = o;
            W.rec[W.nrec++].lo = hi;
        }
    }
}

/* ------------------------------------------------------------------ the wrapped driver */

static void check_release(const char *what, uintptr_t lo, size_t size) {
    if (!W.checking) return;
    uintptr_t hi = lo + size;
    for (int i = 0; i < W.nlive; i++) {
        const live_t *l = &W.live[i];
        if (l->ptr < hi && lo < l->ptr + l->block)
            fail("%s of %#lx+%zu under live block %#lx+%zu", what, (unsigned long)lo, size, (unsigned long)l->ptr,
                 l->block);
    }
    int k;
    const rec_t *r = recs_blocking(lo, hi, -1, &k);
    if (r)
        fail("%s of %#lx+%zu while work of stream incarnation %d that may touch %#lx+%zu has not finished", what,
             (unsigned long)lo, size, r->id[k], (unsigned long)r->lo, (size_t)(r->hi - r->lo));
}

static cua_result wrapped_unmap(int dev, cua_devptr va, size_t size) {
    check_release("unmap", (uintptr_t)va, size);
    return driver_sim_ops.unmap(dev, va, size);
}

static cua_result wrapped_mem_alloc(int dev, size_t size, cua_devptr *out) {
    cua_result r = driver_sim_ops.mem_alloc(dev, size, out);
    if (r == CUA_SUCCESS && W.nallocs < MAX_ALLOCS) W.allocs[W.nallocs++] = (typeof(W.allocs[0])){(uintptr_t)*out, size};
    return r;
}

/* cuMemFree waits for the device's work (cudaFree's implicit synchronization, which classic mode's
 * releases rely on); the sim's mem_free does not model it, so the wrapper completes every held
 * stream's work first. The check then finds only a segment freed under a live block. */
static cua_result wrapped_mem_free(int dev, cua_devptr ptr) {
    for (int s = 1; s < W.nslot; s++) sim_stream_complete(W.slot[s].handle);
    for (int z = 0; z < W.nzombie; z++) sim_stream_complete(W.zombie[z]);
    for (int i = 0; i < W.nallocs; i++) {
        if (W.allocs[i].ptr != (uintptr_t)ptr) continue;
        check_release("cuMemFree", W.allocs[i].ptr, W.allocs[i].size);
        W.allocs[i] = W.allocs[--W.nallocs];
        break;
    }
    return driver_sim_ops.mem_free(dev, ptr);
}

/* The heap's stream and event calls, failing (with no effect) while a fault is armed. The test's own
 * calls go to driver_sim_ops directly and never fail. */
static bool faulted(fault_t f) {
    if (!W.fault_left[f]) return false;
    W.fault_left[f]--;
    W.faults_fired[f]++;
    return true;
}

static cua_result wrapped_event_create(int dev, cua_event *out) {
    return faulted(F_EVENT_CREATE) ? CUA_ERROR_OUT_OF_MEMORY : driver_sim_ops.event_create(dev, out);
}
static cua_result wrapped_event_record(int dev, cua_event e, cua_stream s) {
    return faulted(F_EVENT_RECORD) ? CUA_ERROR_UNKNOWN : driver_sim_ops.event_record(dev, e, s);
}
static cua_result wrapped_event_query(int dev, cua_event e) {
    return faulted(F_EVENT_QUERY) ? CUA_ERROR_UNKNOWN : driver_sim_ops.event_query(dev, e);
}
static cua_result wrapped_event_synchronize(int dev, cua_event e) {
    return faulted(F_EVENT_SYNC) ? CUA_ERROR_UNKNOWN : driver_sim_ops.event_synchronize(dev, e);
}
static cua_result wrapped_stream_synchronize(int dev, cua_stream s) {
    return faulted(F_STREAM_SYNC) ? CUA_ERROR_INVALID_HANDLE : driver_sim_ops.stream_synchronize(dev, s);
}
static cua_result wrapped_device_synchronize(int dev) {
    if (faulted(F_DEVICE_SYNC)) return CUA_ERROR_UNKNOWN;
    return driver_sim_ops.device_synchronize(dev);
}

/* ------------------------------------------------------------------ the world */

static bool any_capturing(void) {
    for (int s = 1; s < W.nslot; s++)
        if (W.slot[s].capturing) return true;
    return false;
}

static void world_open(const variant_t *v) {
    memset(&W, 0, sizeof W);
    W.nslot = v->nslot ? v->nslot : 4;
    wrapped = driver_sim_ops;
    wrapped.unmap = wrapped_unmap;
    wrapped.mem_alloc = wrapped_mem_alloc;
    wrapped.mem_free = wrapped_mem_free;
    wrapped.event_create = wrapped_event_create;
    wrapped.event_record = wrapped_event_record;
    wrapped.event_query = wrapped_event_query;
    wrapped.event_synchronize = wrapped_event_synchronize;
    wrapped.stream_synchronize = wrapped_stream_synchronize;
    wrapped.device_synchronize = wrapped_device_synchronize;
    conf_defaults(&W.conf);
    W.conf.driver = DRIVER_SIM;
    EXPECT(conf_parse(v->conf, &W.conf) == 0, "bad configuration %s", v->conf);
    sim_configure(&W.conf); /* drops every stream, event and mapping of the previous run */
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    cua_result err;
    W.h = heap_create(0, &W.conf, &wrapped, &err);
    EXPECT(W.h, "heap_create (%s): %d", v->conf, err);
    for (int s = 1; s < W.nslot; s++) {
        W.slot[s].handle = sim_stream_create(0, true);
        W.slot[s].id = ++W.next_id;
        W.slot[s].per_thread = v->per_thread && s == W.nslot - 1;
        W.slot[s].blocking = s <= v->blocking || W.slot[s].per_thread;
        sim_stream_set_blocking(W.slot[s].handle, W.slot[s].blocking);
        if (!W.slot[s].per_thread) heap_stream_created(W.h, W.slot[s].handle, !W.slot[s].blocking);
    }
    if (v->untracked) heap_streams_untracked(W.h);
    W.captures_broken = sim_captures_broken();
    W.checking = true;
}

/* Ends the run: captures end, the device finishes everything, every block is freed and the cache
 * trimmed. The heap is left to leak when the run failed (its state may be what failed). */
static void world_close(void) {
    for (int s = 1; s < W.nslot; s++) sim_stream_set_capturing(W.slot[s].handle, false);
    memset(W.fault_left, 0, sizeof W.fault_left);
    if (!W.failed) {
        driver_sim_ops.device_synchronize(0);
        while (W.nlive) {
            live_t *l = &W.live[--W.nlive];
            if (W.slot[l->slot].per_thread) heap_free_device_wide(W.h, (void *)l->ptr);
            else heap_free(W.h, (void *)l->ptr, W.slot[l->slot].handle);
        }
        heap_trim(W.h);
        EXPECT(heap_check(W.h, stderr) == 0, "heap_check after the final trim");
        W.checking = false;
        heap_destroy(W.h);
    }
    W.h = NULL;
}

static void verify(void) {
    if (W.failed) return;
    int bad = heap_check(W.h, stderr);
    if (bad) fail("heap_check found %d violations", bad);
    if (sim_captures_broken() != W.captures_broken) fail("the heap invalidated a capture (recorded, synchronized or waited on a capturing stream)");
    cualloc_stats s;
    heap_get_stats(W.h, &s);
    if (s.requested_bytes != W.requested || s.allocated_bytes != W.allocated)
        fail("requested/allocated %zu/%zu, model %zu/%zu", s.requested_bytes, s.allocated_bytes, W.requested,
             W.allocated);
}

/* A block just handed out (its checks against the records made): no live block may overlap it; the
 * records no longer speak for it; the model counts it. */
static void add_live(uintptr_t lo, size_t block, size_t size, int slot) {
    for (int i = 0; i < W.nlive; i++)
        if (W.live[i].ptr < lo + block && lo < W.live[i].ptr + W.live[i].block)
            fail("block %#lx+%zu overlaps live block %#lx+%zu", (unsigned long)lo, block, (unsigned long)W.live[i].ptr,
                 W.live[i].block);
    recs_carve(lo, lo + block);
    W.live[W.nlive++] = (live_t){lo, size, block, slot};
    W.requested += size;
    W.allocated += block;
}

static void do_alloc(const variant_t *v, const op_t *o) {
    if (W.nlive == MAX_LIVE) return;
    int slot = (int)(o->a % (uint64_t)W.nslot);
    if (W.slot[slot].capturing) return; /* the front door passes such allocations to CUDA */
    rng_t r = {o->b};
    size_t size = rng_tensor_size(&r, v->max_request);
    void *p = NULL;
    cua_stream name = W.slot[slot].per_thread ? stream_key_make(&W.slot[slot]) : W.slot[slot].handle;
    if (heap_alloc(W.h, size, name, &p) != CUA_SUCCESS) return;
    block_t *b = heap_test_find_block(W.h, p);
    if (!b) {
        fail("no block found at %p", p);
        return;
    }
    uintptr_t lo = (uintptr_t)p, hi = lo + b->size;
    int k;
    const rec_t *rec = recs_blocking(lo, hi, W.slot[slot].id, &k);
    if (rec)
        fail("block %#lx+%zu handed to stream slot %d (incarnation %d) while work of incarnation %d that may touch "
             "%#lx+%zu has not finished",
             (unsigned long)lo, b->size, slot, W.slot[slot].id, rec->id[k], (unsigned long)rec->lo,
             (size_t)(rec->hi - rec->lo));
    add_live(lo, b->size, size, slot);
}

static bool nonblocking_alive(void) {
    for (int s = 1; s < W.nslot; s++)
        if (!W.slot[s].blocking) return true;
    return false;
}

/* The heap's synchronize of the legacy stream and its fallback, the device's, both refused by
 * injected faults since `before` (W.faults_fired then): a device in error, whose later work fails
 * anyway, which the model excuses. */
static bool both_syncs_refused(const unsigned *before) {
    return W.faults_fired[F_STREAM_SYNC] != before[F_STREAM_SYNC] && W.faults_fired[F_DEVICE_SYNC] != before[F_DEVICE_SYNC];
}

/* cudaMalloc: the block may serve any stream at once (see the top). */
static void do_alloc_device_wide(const variant_t *v, const op_t *o) {
    if (W.nlive == MAX_LIVE) return;
    rng_t r = {o->b};
    size_t size = rng_tensor_size(&r, v->max_request);
    void *p = NULL;
    if (heap_alloc_device_wide(W.h, size, &p) != CUA_SUCCESS) return;
    block_t *b = heap_test_find_block(W.h, p);
    if (!b) {
        fail("no block found at %p", p);
        return;
    }
    uintptr_t lo = (uintptr_t)p, hi = lo + b->size;
    bool nb = nonblocking_alive();
    recs_prune();
    for (int i = 0; i < W.nrec && !W.failed; i++) {
        const rec_t *rec = &W.rec[i];
        if (hi <= rec->lo || rec->hi <= lo) continue;
        for (int k = 0; k < rec->n; k++) {
            if (event_done(rec->ev[k])) continue;
            if (rec->id[k] == 0 && !nb && W.nowed < MAX_RECS) {
                W.owed[W.nowed++] = rec->ev[k];
                continue;
            }
            fail("block %#lx+%zu handed out device-wide (%s) while work of stream incarnation %d that may touch "
                 "%#lx+%zu has not finished",
                 (unsigned long)lo, b->size, nb ? "a non-blocking stream alive" : "only blocking streams", rec->id[k],
                 (unsigned long)rec->lo, (size_t)(rec->hi - rec->lo));
            break;
        }
    }
    add_live(lo, b->size, size, 0); /* freed stream-ordered: on the legacy stream */
}

/* A non-blocking stream was just created: the legacy stream's work that device-wide allocations
 * took blocks from must have finished (the heap synchronized it), unless a capture forbade it or
 * both synchronizes were refused (`refused`). Those blocks are out of the heap's hands either way;
 * the freed ones are still checked at every later allocation. */
static void check_owed(bool refused) {
    if (!any_capturing() && !refused)
        for (int i = 0; i < W.nowed; i++)
            if (!event_done(W.owed[i])) {
                fail("a non-blocking stream was created while the legacy stream's work under a device-wide "
                     "allocation's block had not finished");
                break;
            }
    W.nowed = 0;
}

static void forget_live(int i) {
    W.requested -= W.live[i].size;
    W.allocated -= W.live[i].block;
    W.live[i] = W.live[--W.nlive];
}

static void add_rec(const live_t *l, int n, const int *id, const cua_event *ev) {
    recs_prune();
    if (n == 0) return;
    if (W.nrec == MAX_RECS) {
        fail("the model's record table is full");
        return;
    }
    rec_t *r = &W.rec[W.nrec++];
    *r = (rec_t){.lo = l->ptr, .hi = l->ptr + l->block, .n = n};
    memcpy(r->id, id, sizeof(int) * (size_t)n);
    memcpy(r->ev, ev, sizeof(cua_event) * (size_t)n);
}

static void free_device_wide_at(int i);

/* A stream-ordered free on `slot` (the allocating one, or another); on a thread's
 * cudaStreamPerThread, device-wide. */
static void do_free(const variant_t *v, const op_t *o, bool other) {
    if (!W.nlive) return;
    int i = (int)(o->a % (uint64_t)W.nlive);
    int slot = other ? (int)(o->b % (uint64_t)W.nslot) : W.live[i].slot;
    if (W.slot[slot].capturing) return; /* a free during capture is a graph node: the front door keeps the block */
    if (W.slot[slot].per_thread) {
        free_device_wide_at(i); /* the front door's free on cudaStreamPerThread */
        return;
    }
    live_t l = W.live[i];
    cua_event ev = event_on(W.slot[slot].handle); /* the work queued before the free */
    forget_live(i);
    bool ok = slot == 0 && v->device_wide ? heap_free_on_legacy(W.h, (void *)l.ptr)
                                          : heap_free(W.h, (void *)l.ptr, W.slot[slot].handle);
    if (!ok) fail("free of live block %#lx refused", (unsigned long)l.ptr);
    add_rec(&l, 1, &W.slot[slot].id, &ev);
}

/* A device-wide free: the block may still be used by any stream's work, a destroyed stream's
 * that runs on included. */
static void free_device_wide_at(int i) {
    live_t l = W.live[i];
    int id[NSLOT_MAX + MAX_ZOMBIES], n = 0;
    cua_event ev[NSLOT_MAX + MAX_ZOMBIES];
    for (int s = 0; s < W.nslot; s++) {
        id[n] = W.slot[s].id;
        ev[n++] = W.slot[s].capturing ? W.slot[s].capture_ev : event_on(W.slot[s].handle);
    }
    for (int z = 0; z < W.nzombie; z++) {
        id[n] = W.zombie_id[z];
        ev[n++] = W.zombie_ev[z]; /* a destroyed stream gets no new work */
    }
    forget_live(i);
    if (!heap_free_device_wide(W.h, (void *)l.ptr)) fail("device-wide free of live block %#lx refused", (unsigned long)l.ptr);
    add_rec(&l, n, id, ev);
}

static void do_free_device_wide(const op_t *o) {
    if (W.nlive) free_device_wide_at((int)(o->a % (uint64_t)W.nlive));
}

/* An unfinished pair's event, picked by `a` (NULL when none). */
static cua_event pick_event(uint64_t a) {
    recs_prune();
    if (!W.nrec) return NULL;
    const rec_t *r = &W.rec[a % (uint64_t)W.nrec];
    return r->ev[(a >> 32) % (uint64_t)r->n];
}

/* The stream of slot s is destroyed and a new one takes the slot: a fresh sim stream (another
 * handle), or, reuse_handle, the same handle (as CUDA may give a destroyed stream's handle to the
 * next one created). The sim cannot give a destroyed stream's handle again, so the reuse keeps the
 * sim stream: the old incarnation's work stays pending on it until completed, as a destroyed
 * stream's work runs on after cudaStreamDestroy. */
static void do_destroy(const variant_t *v, const op_t *o, bool reuse_handle) {
    int s = 1 + (int)(o->a % (uint64_t)(W.nslot - 1));
    /* a capturing stream is not destroyed, nor a thread's per-thread stream */
    if (W.slot[s].capturing || W.slot[s].per_thread || W.nzombie == MAX_ZOMBIES) return;
    int old = W.slot[s].id;
    /* Work in flight (on live blocks too): its end, recorded before the heap's own event */
    bool unfinished = !sim_stream_idle(W.slot[s].handle);
    cua_event last = unfinished ? event_on(W.slot[s].handle) : NULL;
    heap_stream_destroyed(W.h, W.slot[s].handle);
    if (!reuse_handle) {
        /* Its unfinished work runs on after cudaStreamDestroy, but the sim reads a destroyed
         * stream's events as complete: a stream with such work is kept in the sim (a zombie,
         * whose work completes by OP_COMPLETE or a device synchronize), the others destroyed. */
        /* (an event on the legacy stream can wait for at most SIM_EVENT_WAITS held blocking
         * streams, a bound of the sim: past it a blocking stream's work is finished first) */
        if (unfinished && W.slot[s].blocking && W.nzombie_blocking + W.nslot - 1 >= 8) {
            sim_stream_complete(W.slot[s].handle);
            unfinished = false;
        }
        if (unfinished) {
            W.zombie_id[W.nzombie] = old;
            W.zombie_ev[W.nzombie] = last;
            W.zombie[W.nzombie++] = W.slot[s].handle;
            W.nzombie_blocking += W.slot[s].blocking;
        }
        else sim_stream_destroy(W.slot[s].handle);
        W.slot[s].handle = sim_stream_create(0, true);
    }
    W.slot[s].id = ++W.next_id;
    if (v->device_wide && !reuse_handle) {
        /* (a reused handle keeps its kind: the sim's one stream holds the old incarnation's work
         * too, which the legacy stream waits for only while it is blocking) */
        W.slot[s].blocking = (o->b >> 40) & 1;
        sim_stream_set_blocking(W.slot[s].handle, W.slot[s].blocking);
    }
    unsigned before[F_KINDS];
    memcpy(before, W.faults_fired, sizeof before);
    heap_stream_created(W.h, W.slot[s].handle, !W.slot[s].blocking);
    if (!W.slot[s].blocking) check_owed(both_syncs_refused(before));
}

/* b odd: a capture begins on the slot's stream (if none is under way), even: it ends. */
static void do_capture(const op_t *o) {
    int s = 1 + (int)(o->a % (uint64_t)(W.nslot - 1));
    slot_t *sl = &W.slot[s];
    bool begin = o->b & 1;
    if (begin == sl->capturing || sl->per_thread) return;
    if (begin) sl->capture_ev = event_on(sl->handle); /* the work before the capture */
    /* As CUDA: while a blocking stream captures, the legacy stream takes no work (it would join the
     * capture), so slot 0 is capturing too, its work being what was queued before. */
    if (begin && sl->blocking && !W.slot[0].capturing) W.slot[0].capture_ev = event_on(W.slot[0].handle);
    sl->capturing = begin;
    sim_stream_set_capturing(sl->handle, begin);
    W.slot[0].capturing = false;
    for (int k = 1; k < W.nslot; k++)
        if (W.slot[k].capturing && W.slot[k].blocking) W.slot[0].capturing = true;
}

static void run_op(const variant_t *v, const op_t *o) {
    int s = (int)(o->a % (uint64_t)W.nslot);
    switch ((op_kind_t)o->kind) {
    case OP_ALLOC: do_alloc(v, o); break;
    case OP_FREE: do_free(v, o, false); break;
    case OP_FREE_OTHER: do_free(v, o, true); break;
    case OP_FREE_DEVICE_WIDE: do_free_device_wide(o); break;
    case OP_COMPLETE:
        if (o->b % 4 == 0 && W.nzombie) {
            sim_stream_complete(W.zombie[(o->b >> 8) % (uint64_t)W.nzombie]);
        } else if (o->b % 4 == 1) { /* the live streams' work done, a destroyed stream's long kernel not */
            for (int k = 1; k < W.nslot; k++)
                if (!W.slot[k].capturing) sim_stream_complete(W.slot[k].handle);
        } else {
            sim_stream_complete(W.slot[s].handle);
        }
        break;
    case OP_EVENT_SYNC: {
        cua_event ev = pick_event(o->a);
        if (ev) driver_sim_ops.event_synchronize(0, ev);
        break;
    }
    case OP_STREAM_SYNC:
        if (!W.slot[s].capturing) driver_sim_ops.stream_synchronize(0, W.slot[s].handle);
        break;
    case OP_DEVICE_SYNC:
        if (!any_capturing()) driver_sim_ops.device_synchronize(0);
        break;
    case OP_TRIM: heap_trim(W.h); break;
    case OP_DESTROY: do_destroy(v, o, false); break;
    case OP_REUSE_HANDLE: do_destroy(v, o, true); break;
    case OP_CAPTURE: do_capture(o); break;
    case OP_FAULT: W.fault_left[o->a % F_KINDS] = 1 + (unsigned)(o->b % 3); break;
    case OP_ALLOC_DEVICE_WIDE: do_alloc_device_wide(v, o); break;
    case OP_LAUNCH: /* work on live blocks: the stream is busy, nothing is freed */
        if (s && !W.slot[s].capturing) event_on(W.slot[s].handle);
        break;
    default: break;
    }
    verify();
}

/* Runs ops[0, n) skipping those with skip[i] set, on a fresh world. True when it failed; the failure
 * is in W.why. */
static bool run_sequence(const variant_t *v, const op_t *ops, int n, const bool *skip) {
    world_open(v);
    for (int i = 0; i < n && !W.failed; i++) {
        if (skip && skip[i]) continue;
        W.op_index = i;
        run_op(v, &ops[i]);
    }
    bool failed = W.failed;
    world_close();
    return failed;
}

static op_t random_op(const variant_t *v, rng_t *r) {
    /* Weights: mostly allocations and frees, with enough completions, waits, trims, destructions
     * and captures to reach every settle, flush and release path. */
    uint8_t weights[OP_KINDS] = {36, 20, 5, 9, 6, 6, 3, 2, 3, 2, 2, 6, 4, 0, 4};
    if (v->device_wide) weights[OP_ALLOC_DEVICE_WIDE] = 18, weights[OP_DESTROY] = 5;
    unsigned total = 0, pick;
    for (int k = 0; k < OP_KINDS; k++) total += weights[k];
    pick = (unsigned)rng_below(r, total);
    uint8_t kind = 0;
    while (pick >= weights[kind]) pick -= weights[kind++];
    return (op_t){kind, rng_next(r), rng_next(r)};
}

static void print_op(const op_t *o) {
    fprintf(stderr, "    {%-2d /* %-20s */, %#018llx, %#018llx},", o->kind, op_names[o->kind], (unsigned long long)o->a,
            (unsigned long long)o->b);
    if (o->kind == OP_FAULT) fprintf(stderr, " /* %s x%u */", fault_names[o->a % F_KINDS], 1 + (unsigned)(o->b % 3));
    fputc('\n', stderr);
}

/* Shrinks a failing sequence (ops[0, n) fails): removes chunks of operations, halving the chunk,
 * while the rest still fails; prints what is left and aborts. */
static void shrink_and_report(const variant_t *v, uint64_t seed, op_t *ops, int n) {
    char first_why[1024];
    snprintf(first_why, sizeof first_why, "%s", W.why);
    n = W.failed_at + 1;
    static bool skip[MAX_OPS];
    memset(skip, 0, sizeof skip);
    for (int chunk = n / 2, progress = 1; chunk >= 1; chunk = chunk > 1 ? chunk / 2 : progress ? 1 : 0) {
        progress = 0;
        for (int at = 0; at < n; at += chunk) {
            bool saved[MAX_OPS];
            int end = at + chunk < n ? at + chunk : n, changed = 0;
            for (int i = at; i < end; i++) {
                saved[i] = skip[i];
                if (!skip[i]) changed++;
                skip[i] = true;
            }
            if (!changed) continue;
            if (!run_sequence(v, ops, n, skip))
                for (int i = at; i < end; i++) skip[i] = saved[i];
            else
                progress = 1;
        }
    }
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (!skip[i]) ops[kept++] = ops[i];
    EXPECT(run_sequence(v, ops, kept, NULL), "the shrunk sequence no longer fails");
    fprintf(stderr, "test_stream_safety: variant '%s' (%s), seed %llu: %s\n", v->name, v->conf,
            (unsigned long long)seed, first_why);
    fprintf(stderr, "  shrunk to %d operations, which fail with: %s\n", kept, W.why);
    for (int i = 0; i < kept; i++) print_op(&ops[i]);
    abort();
}

static const variant_t variants[] = {
    {"vmm", "sim_memory_mb:64", 8 << 20, false, 0, 0, false, false},
    {"vmm small requests", "sim_memory_mb:32", 256 << 10, false, 0, 0, false, false},
    {"vmm gc", "sim_memory_mb:64,garbage_collection_threshold:0.5", 8 << 20, false, 0, 0, false, false},
    {"vmm pow2, 8 MiB chunks", "sim_memory_mb:96,chunk_size_mb:8,roundup_power2_divisions:4", 8 << 20, false, 0, 0, false,
     false},
    {"vmm untracked streams", "sim_memory_mb:64", 8 << 20, true, 0, 0, false, false},
    {"vmm more streams than tags", "sim_memory_mb:64", 8 << 20, false, 64, 0, false, false},
    {"classic", "sim_memory_mb:128,expandable_segments:False", 12 << 20, false, 0, 0, false, false},
    {"classic max_split gc", "sim_memory_mb:128,expandable_segments:False,max_split_size_mb:40,"
                             "garbage_collection_threshold:0.6", 48 << 20, false, 0, 0, false, false},
    {"vmm 95 non-blocking streams", "sim_memory_mb:64", 8 << 20, false, NSLOT_MAX, 0, false, false},
    {"vmm cudaMalloc, blocking streams", "sim_memory_mb:64", 8 << 20, false, 4, 2, true, false},
    {"vmm cudaMalloc, only blocking streams at first", "sim_memory_mb:64", 8 << 20, false, 4, 3, true, false},
    {"classic cudaMalloc, blocking streams", "sim_memory_mb:128,expandable_segments:False", 12 << 20, false, 4, 2, true,
     false},
    {"classic cudaMalloc, only blocking streams at first", "sim_memory_mb:128,expandable_segments:False", 12 << 20,
     false, 4, 3, true, false},
    {"vmm cudaMalloc, a per-thread stream", "sim_memory_mb:64", 8 << 20, false, 5, 2, true, true},
    {"classic cudaMalloc, a per-thread stream", "sim_memory_mb:128,expandable_segments:False", 12 << 20, false, 5, 2,
     true, true},
};

/* Regression sequences (each once failed, on the variant named). */
typedef struct {
    int variant;
    const op_t *ops;
    int n;
} regression_t;

/* A stream destroyed while a capture on another stream keeps the device from being synchronized,
 * its own synchronize failing: its empty open tag was dropped while its closed generation still
 * named it as partner (heap_check). */
static const op_t regression_destroy_partner[] = {
    {11 /* capture-begin-or-end */, 0xfc31fccd24bec291, 0xa52160699fc4c1f7},
    {12 /* fault                */, 0x1e8874caaea4bb84, 0xb3fa3e69f62f1d04}, /* stream_synchronize x2 */
    {0  /* alloc                */, 0x8050e959d53a8bb6, 0xf68d72d89c8c0e61},
    {0  /* alloc                */, 0x2cf4e292c392b3ec, 0xe5808d01c0228c99},
    {9  /* destroy-stream       */, 0x661fead5c4e1c94a, 0x487df050758457cf},
};
/* The same with the handle given to a new stream, in classic mode: the new stream reused the old
 * one's block while the old one's work was in flight. */
static const op_t regression_reuse_classic[] = {
    {12 /* fault                */, 0x07aa0da65bcdf012, 0xa652547566a6311e}, /* stream_synchronize x2 */
    {11 /* capture-begin-or-end */, 0x86d06370070feb89, 0xb633f8fd8c577cd3},
    {0  /* alloc                */, 0x7338992c19473e01, 0x0a90a547b1f12797},
    {1  /* free                 */, 0x074556546fb75d4b, 0x8c7c3f54156c5804},
    {10 /* reuse-handle         */, 0x1c2d9c7aefb9ee46, 0xad41bcb6fc72004a},
    {0  /* alloc                */, 0x07cf5ba39acc5105, 0x70cc5ebef35e6d11},
};
/* And in VMM mode (small requests). */
static const op_t regression_reuse_vmm[] = {
    {11 /* capture-begin-or-end */, 0x19a4174a33068840, 0xe4afc37df8146557},
    {0  /* alloc                */, 0x6e8f29a16bc5c196, 0x81d9cbda6d9eb125},
    {12 /* fault                */, 0x7996b598c5f82060, 0x7a8619aca5ac8dcd}, /* stream_synchronize x3 */
    {1  /* free                 */, 0x249b027a8250b35f, 0xe4931533e38a0aab},
    {10 /* reuse-handle         */, 0x872f3d1c9257dd9e, 0xe3bf3c9e0e80ec1b},
    {0  /* alloc                */, 0x89f35d0b14e0a95e, 0xdbd55b31ea09cb96},
};

/* 95 non-blocking streams, a capture on one past the 64 the heap's table held: the heap, not knowing
 * of it, synchronized the device to settle a device-wide free, which invalidated the capture. */
static const op_t regression_capture_past_table[] = {
    {0  /* alloc                */, 0x05b73d34b2237ef8, 0x5dbed0b8e520625e},
    {3  /* free-device-wide     */, 0xcfd72b43f3c56ef4, 0x56bd6703ec6f022e},
    {11 /* capture-begin-or-end */, 0x273d6d45d66e7a56, 0x691ca0f36b1be4ff},
    {0  /* alloc                */, 0x49d59e7262932a0e, 0x7a2eafe18dced594},
};

/* Classic segments, cudaMalloc beside a non-blocking stream: a block cudaMalloc'd, freed on the
 * legacy stream (whose work was behind, waiting for a blocking stream) and cudaMalloc'd again was
 * handed out at once, for a non-blocking stream's work too. */
static const op_t regression_classic_legacy_free[] = {
    {13 /* alloc-device-wide    */, 0x42f70b7d7283e03c, 0x34af9284cd8e232f},
    {1  /* free                 */, 0x0658a09887f4ccc5, 0x7be9429e1e5f3475},
    {13 /* alloc-device-wide    */, 0x38934609ae8e88ff, 0x9cebc0be275dc852},
};

/* A non-blocking stream destroyed while its kernel on a live block runs on; the block cudaFree'd
 * after the destroy was handed out again once the live streams' events completed. */
static const op_t regression_destroyed_stream_cudafree[] = {
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
    {14 /* launch               */, 1, 0},
    {9  /* destroy-stream       */, 0, 0},
    {3  /* free-device-wide     */, 0, 0},
    {3  /* free-device-wide     */, 0, 0},
    {3  /* free-device-wide     */, 0, 0},
    {3  /* free-device-wide     */, 0, 0},
    {4  /* complete-stream      */, 1, 1}, /* every live stream's work */
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
    {0  /* alloc                */, 0, 0x1234567},
};

/* Only blocking streams: cudaMalloc takes back a block freed on the legacy stream, whose work is
 * behind a busy blocking stream; the first non-blocking stream is then created, and the heap's
 * synchronize of the legacy stream for it is refused once: the device's must follow. */
static const op_t regression_legacy_sync_refused[] = {
    {0  /* alloc                */, 0, 0x1234567},
    {14 /* launch               */, 1, 0},
    {1  /* free                 */, 0, 0},
    {13 /* alloc-device-wide    */, 0, 0x1234567},
    {12 /* fault                */, 4, 0}, /* stream_synchronize x1 */
    {9  /* destroy-stream       */, 0, 0}, /* slot 1 comes back non-blocking */
};

#define REGRESSION(v, ops) {v, ops, (int)(sizeof ops / sizeof ops[0])}
static const regression_t regressions[] = {
    REGRESSION(0, regression_destroy_partner),
    REGRESSION(6, regression_reuse_classic),
    REGRESSION(1, regression_reuse_vmm),
    REGRESSION(8, regression_capture_past_table),
    REGRESSION(11, regression_classic_legacy_free),
    REGRESSION(0, regression_destroyed_stream_cudafree),
    REGRESSION(6, regression_destroyed_stream_cudafree),
    REGRESSION(10, regression_legacy_sync_refused),
};

static void quiet(const char *line, void *arg) {
    (void)line;
    (void)arg;
}

int main(void) {
    error_set_callback(quiet, NULL); /* out-of-memory reports: the cap is small on purpose */
    uint64_t seed = test_seed("test_stream_safety");
    for (size_t i = 0; i < sizeof regressions / sizeof regressions[0]; i++) {
        const regression_t *g = &regressions[i];
        if (run_sequence(&variants[g->variant], g->ops, g->n, NULL)) {
            fprintf(stderr, "test_stream_safety: regression sequence %zu fails: %s\n", i, W.why);
            abort();
        }
    }
    rng_t r = {seed};
    static op_t ops[MAX_OPS];
    int runs = 0;
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant_t *v = &variants[vi];
        /* 63 or 95 streams: every device-wide free records as many events; the cudaMalloc variants
         * need a stream created non-blocking at the wrong moment, which few runs reach */
        int nruns = v->device_wide ? 10 : v->nslot > 4 ? 2 : 4;
        for (int run = 0; run < nruns; run++, runs++) {
            uint64_t run_seed = rng_next(&r);
            rng_t rr = {run_seed};
            int n = 300 + (int)rng_below(&rr, 900);
            for (int i = 0; i < n; i++) ops[i] = random_op(v, &rr);
            if (run_sequence(v, ops, n, NULL)) shrink_and_report(v, seed, ops, n);
        }
    }
    printf("test_stream_safety: ok (%d runs)\n", runs);
    return 0;
}
