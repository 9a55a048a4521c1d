/* test_heap_property.c — random allocation sequences against a simple model, under several
 * configurations (VMM and classic, caps, max_split_size, power-of-two rounding, chunk sizes, held
 * streams, host-backed memory with a pattern written into every block), with the heap's checker
 * after every operation. Then the same under injected driver failures: every failing operation
 * leaves a consistent heap and, once everything is freed and trimmed, nothing held on the device.
 *
 * Stream 1 is registered as non-blocking, and some frees are device-wide (cudaFree's meaning). Such
 * a block must not be handed out again before stream 1's work after the free has completed, or the
 * device or a stream was synchronized (the sim completes a held stream's work when it is; the
 * counter does not say which stream). A block freed on held stream S may go back to S at once, to
 * another stream only after S's work after the free has completed, or a synchronize. The model keeps
 * those blocks until then and checks every allocation against them.
 *
 * Model: the live allocations (pointer, requested size, stream). Checked after every operation:
 * blocks do not overlap and are 512-byte aligned; requested/allocated bytes and alloc/free counts
 * equal the model's; reserved equals what the sim device has handed out and never exceeds the cap;
 * an out-of-memory in VMM mode happens only when the live bytes plus the request leave no more
 * than partial chunks of room, and leaves no cached chunk mapped.
 */
#include "internal.h"
#include "testutil.h"

#define MAX_LIVE 512
#define NSTREAMS 3
#define MAX_PENDING 1024

typedef struct {
    uintptr_t ptr;
    size_t size;    /* requested */
    size_t block;   /* the block's actual size */
    int stream;
} live_t;

/* A block freed device-wide (stream -1) or on a held stream, with what had happened when it was
 * freed: the completions of that stream (device-wide: of stream 1, the non-blocking one) and the
 * synchronizations. */
typedef struct {
    uintptr_t ptr;
    size_t block;
    int stream;
    uint64_t completes, syncs;
} pending_t;

typedef struct {
    const char *name;
    const char *conf;      /* CUALLOC_CONF text over the defaults */
    size_t max_request;
    bool held_streams;
    int ops;
} variant_t;

typedef struct {
    heap_t *h;
    conf_t conf;
    cua_stream streams[NSTREAMS];
    live_t live[MAX_LIVE];
    pending_t pending[MAX_PENDING];
    int npending;
    uint64_t completes[NSTREAMS]; /* sim_stream_complete calls per stream (streams[1] is the non-blocking one) */
    bool held;             /* the streams' work waits for sim_stream_complete (else done at once) */
    int nlive;
    size_t requested, allocated;
    uint64_t allocs, frees;
    bool host_backed;
    bool exact_device; /* reserved == the device's usage (false while releases are made to fail) */
} world_t;

static void world_open(world_t *w, const char *conf_text, bool held) {
    memset(w, 0, sizeof *w);
    conf_defaults(&w->conf);
    w->conf.driver = DRIVER_SIM;
    EXPECT(conf_parse(conf_text, &w->conf) == 0, "bad test configuration '%s'", conf_text);
    sim_configure(&w->conf);
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    cua_result err;
    w->h = heap_create(0, &w->conf, &driver_sim_ops, &err);
    EXPECT(w->h, "heap_create failed: %d", err);
    w->host_backed = w->conf.sim_host_backed;
    w->exact_device = true;
    w->held = held;
    w->streams[0] = NULL; /* the legacy stream */
    for (int i = 1; i < NSTREAMS; i++) w->streams[i] = sim_stream_create(0, held);
    heap_stream_created(w->h, w->streams[1], true);
}

static void world_complete(world_t *w, int stream) {
    sim_stream_complete(w->streams[stream]);
    w->completes[stream]++;
}

/* Waits of any kind (an event wait too: the counter does not say which work it waited for). */
static uint64_t sim_syncs(void) {
    return sim_calls(SIM_OP_DEVICE_SYNC) + sim_calls(SIM_OP_STREAM_SYNC) + sim_calls(SIM_OP_EVENT_SYNC);
}

/* Freed blocks that are safe for every stream now leave the model's list. */
static void pending_prune(world_t *w) {
    uint64_t syncs = sim_syncs();
    for (int i = 0; i < w->npending;) {
        const pending_t *o = &w->pending[i];
        if (w->completes[o->stream < 0 ? 1 : o->stream] > o->completes || syncs > o->syncs)
            w->pending[i] = w->pending[--w->npending];
        else
            i++;
    }
}

static unsigned char pattern_of(uintptr_t p) { return (unsigned char)((p >> 9) * 131u + 7u); }

/* Writes (or verifies) the block's pattern at its start, end and a stride between. */
static void pattern(const live_t *l, bool verify) {
    if (!l->size) return;
    unsigned char v = pattern_of(l->ptr);
    unsigned char *base = (unsigned char *)l->ptr;
    size_t step = l->size > 65536 ? l->size / 16 : 1;
    for (size_t off = 0; off < l->size; off += step) {
        if (verify) EXPECT(base[off] == v, "block %#lx byte %zu was overwritten", (unsigned long)l->ptr, off);
        else base[off] = v;
    }
    if (verify) EXPECT(base[l->size - 1] == v, "block %#lx last byte was overwritten", (unsigned long)l->ptr);
    else base[l->size - 1] = v;
}

static void world_verify(world_t *w, const char *what) {
    int bad = heap_check(w->h, stderr);
    EXPECT(bad == 0, "heap_check found %d violations after %s", bad, what);
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    EXPECT(s.requested_bytes == w->requested, "requested %zu, model %zu", s.requested_bytes, w->requested);
    EXPECT(s.allocated_bytes == w->allocated, "allocated %zu, model %zu", s.allocated_bytes, w->allocated);
    EXPECT(s.num_allocs == w->allocs && s.num_frees == w->frees, "counts %llu/%llu, model %llu/%llu",
           (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees, (unsigned long long)w->allocs,
           (unsigned long long)w->frees);
    EXPECT(s.reserved_bytes <= s.capacity_bytes, "reserved %zu over the cap %zu", s.reserved_bytes, s.capacity_bytes);
    EXPECT(s.reserved_bytes >= s.allocated_bytes, "reserved below allocated");
    EXPECT(w->exact_device ? s.reserved_bytes == sim_used_bytes(0) : s.reserved_bytes <= sim_used_bytes(0), "reserved %zu but the device hands out %zu", s.reserved_bytes,
           sim_used_bytes(0));
    EXPECT(s.requested_peak >= s.requested_bytes && s.allocated_peak >= s.allocated_bytes &&
               s.reserved_peak >= s.reserved_bytes,
           "a peak below its current value");
}

/* [ptr, ptr + size) went to a stream allowed to have it: the records it overlaps no longer speak
 * for that range. Its next free carries its own ordering: whoever frees a block on a stream has
 * ordered every earlier use of it before that free (CUDA's rule for stream-ordered frees), so an
 * earlier record of the range would forbid reuse the heap may rightly make. */
static void pending_carve(world_t *w, uintptr_t ptr, size_t size) {
    for (int i = 0; i < w->npending;) {
        pending_t o = w->pending[i];
        if (ptr + size <= o.ptr || o.ptr + o.block <= ptr) {
            i++;
            continue;
        }
        w->pending[i] = w->pending[--w->npending];
        if (o.ptr < ptr && w->npending < MAX_PENDING)
            w->pending[w->npending++] = (pending_t){o.ptr, ptr - o.ptr, o.stream, o.completes, o.syncs};
        if (ptr + size < o.ptr + o.block && w->npending < MAX_PENDING)
            w->pending[w->npending++] =
                (pending_t){ptr + size, o.ptr + o.block - ptr - size, o.stream, o.completes, o.syncs};
    }
}

static bool world_alloc(world_t *w, rng_t *r, size_t size, int stream) {
    void *p = NULL;
    size_t rsize = heap_round_size(&w->conf, size);
    cua_result res = heap_alloc(w->h, size, w->streams[stream], &p);
    if (res != CUA_SUCCESS) {
        EXPECT(p == NULL, "failed allocation returned a pointer");
        return false;
    }
    EXPECT(p && ((uintptr_t)p % 512) == 0, "pointer %p not 512-aligned", p);
    block_t *b = heap_test_find_block(w->h, p);
    EXPECT(b && b->size >= rsize, "block of %zu for a rounded request of %zu", b ? b->size : 0, rsize);
    if (heap_is_vmm(w->h)) EXPECT(b->size == rsize, "VMM blocks are exactly the rounded size");
    for (int i = 0; i < w->nlive; i++) {
        const live_t *o = &w->live[i];
        EXPECT((uintptr_t)p + b->size <= o->ptr || o->ptr + o->block <= (uintptr_t)p,
               "new block %p+%zu overlaps live %#lx+%zu", p, b->size, (unsigned long)o->ptr, o->block);
    }
    pending_prune(w);
    for (int i = 0; i < w->npending; i++) {
        const pending_t *o = &w->pending[i];
        if (o->stream == stream) continue; /* its own stream may reuse it at once */
        EXPECT((uintptr_t)p + b->size <= o->ptr || o->ptr + o->block <= (uintptr_t)p,
               "new block %p+%zu for stream %d overlaps %#lx+%zu, freed %s %d while that stream was busy, "
               "which has not completed since (and no synchronize)",
               p, b->size, stream, (unsigned long)o->ptr, o->block,
               o->stream < 0 ? "device-wide, group of stream" : "on stream",
               o->stream < 0 ? 1 : o->stream);
    }
    pending_carve(w, (uintptr_t)p, b->size);
    live_t *l = &w->live[w->nlive++];
    *l = (live_t){(uintptr_t)p, size, b->size, stream};
    if (w->host_backed) pattern(l, false);
    w->requested += size;
    w->allocated += b->size;
    w->allocs++;
    (void)r;
    return true;
}

/* The model's record of a block just freed (syncs: the count before the free, since a free may
 * itself synchronize, which covers it). Kept only while streams are held and there is room; the
 * legacy stream (0) is never held. */
static void pending_add(world_t *w, const live_t *l, int stream, uint64_t syncs) {
    if (!w->held || stream == 0) return;
    pending_prune(w);
    if (w->npending == MAX_PENDING) return;
    w->pending[w->npending++] = (pending_t){l->ptr, l->block, stream, w->completes[stream < 0 ? 1 : stream], syncs};
}

static void world_free(world_t *w, int i, int stream) {
    live_t l = w->live[i];
    if (w->host_backed) pattern(&l, true);
    uint64_t syncs = sim_syncs();
    EXPECT(heap_free(w->h, (void *)l.ptr, w->streams[stream]), "free of a live block refused");
    pending_add(w, &l, stream, syncs);
    w->live[i] = w->live[--w->nlive];
    w->requested -= l.size;
    w->allocated -= l.block;
    w->frees++;
}

/* cudaFree's meaning: no stream may get the block while earlier work on any stream may use it. */
static bool world_free_device_wide(world_t *w, int i) {
    pending_prune(w);
    if (w->npending == MAX_PENDING) return false;
    live_t l = w->live[i];
    if (w->host_backed) pattern(&l, true);
    uint64_t syncs = sim_syncs();
    EXPECT(heap_free_device_wide(w->h, (void *)l.ptr), "device-wide free of a live block refused");
    pending_add(w, &l, -1, syncs);
    w->live[i] = w->live[--w->nlive];
    w->requested -= l.size;
    w->allocated -= l.block;
    w->frees++;
    return true;
}

static void world_close(world_t *w, bool expect_clean) {
    while (w->nlive) world_free(w, w->nlive - 1, w->live[w->nlive - 1].stream);
    for (int i = 1; i < NSTREAMS; i++) world_complete(w, i);
    heap_trim(w->h);
    world_verify(w, "freeing everything and trimming");
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    if (expect_clean && s.reserved_bytes) heap_dump(w->h, stderr);
    if (expect_clean) EXPECT(s.reserved_bytes == 0, "%zu B still reserved after trim", s.reserved_bytes);
    heap_destroy(w->h);
    if (expect_clean) {
        EXPECT(sim_used_bytes(0) == 0, "device still has %zu B in use", sim_used_bytes(0));
        EXPECT(sim_live_handles(0) == 0 && sim_live_mappings(0) == 0, "handles or mappings leaked");
    }
    for (int i = 1; i < NSTREAMS; i++) sim_stream_destroy(w->streams[i]);
}

/* After an OOM in VMM mode the heap has released every cached chunk it could and the request
 * still did not fit: only partial chunks around live blocks may remain. */
static void check_vmm_oom(world_t *w, size_t size) {
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    size_t chunk = heap_chunk_size(w->h, POOL_LARGE);
    if (heap_chunk_size(w->h, POOL_SMALL) > chunk) chunk = heap_chunk_size(w->h, POOL_SMALL);
    size_t slack = 2 * chunk * (size_t)(w->nlive + 2);
    size_t rsize = heap_round_size(&w->conf, size);
    EXPECT(s.reserved_bytes - s.allocated_bytes <= slack, "OOM with %zu B cached beyond live blocks (slack %zu)",
           s.reserved_bytes - s.allocated_bytes, slack);
    EXPECT(w->allocated + rsize + slack > s.capacity_bytes, "OOM for %zu B with %zu B live of %zu", rsize, w->allocated,
           s.capacity_bytes);
}

static void run_variant(const variant_t *v, rng_t *r) {
    world_t w;
    world_open(&w, v->conf, v->held_streams);
    bool vmm = heap_is_vmm(w.h);
    int ooms = 0;
    for (int op = 0; op < v->ops; op++) {
        uint64_t dice = rng_below(r, 100);
        if (w.nlive < MAX_LIVE && (dice < 55 || w.nlive == 0)) {
            size_t size = rng_below(r, 50) == 0 ? 0 : rng_tensor_size(r, v->max_request);
            int stream = (int)rng_below(r, NSTREAMS);
            if (!world_alloc(&w, r, size, stream)) {
                ooms++;
                if (vmm) check_vmm_oom(&w, size);
            }
        } else if (dice < 97) {
            int i = (int)rng_below(r, (uint64_t)w.nlive);
            /* mostly on the allocating stream, sometimes on another (cross-stream free) */
            int stream = rng_below(r, 10) ? w.live[i].stream : (int)rng_below(r, NSTREAMS);
            if (rng_below(r, 8) || !world_free_device_wide(&w, i)) world_free(&w, i, stream);
        } else if (dice < 98) {
            heap_trim(w.h);
        } else {
            world_complete(&w, 1 + (int)rng_below(r, NSTREAMS - 1));
        }
        world_verify(&w, "an operation");
    }
    printf("  %-28s %d ops, %d OOMs, %s\n", v->name, v->ops, ooms, vmm ? "vmm" : "classic");
    fflush(stdout);
    world_close(&w, true);
}

static const variant_t variants[] = {
    {"vmm", "sim_memory_mb:1024", 64 << 20, false, 6000},
    {"vmm host-backed", "sim_memory_mb:256,sim_host_backed:1", 16 << 20, false, 3000},
    {"vmm tight cap", "sim_memory_mb:1024,max_memory_mb:160", 32 << 20, false, 6000},
    {"vmm held streams", "sim_memory_mb:256", 16 << 20, true, 6000},
    {"vmm 8 MiB chunks, pow2", "sim_memory_mb:1024,chunk_size_mb:8,roundup_power2_divisions:4", 64 << 20, false, 4000},
    {"vmm gc", "sim_memory_mb:512,garbage_collection_threshold:0.5", 32 << 20, false, 4000},
    {"classic", "sim_memory_mb:1024,expandable_segments:False", 64 << 20, false, 6000},
    {"classic tight", "sim_memory_mb:256,expandable_segments:0", 32 << 20, false, 6000},
    {"classic max_split gc", "sim_memory_mb:1024,expandable_segments:0,max_split_size_mb:40,"
                             "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5", 96 << 20, false, 6000},
    {"classic host-backed", "sim_memory_mb:256,expandable_segments:0,sim_host_backed:1", 16 << 20, false, 3000},
    {"no vmm on device", "sim_memory_mb:512,sim_vmm:0", 32 << 20, true, 4000},
};

/* One random sequence of 400 operations from `seed`, with `op` failing `count` times after `after`
 * calls when `inject` (and, when `also` is not SIM_OP_COUNT, the next call of `also` failing): the
 * heap stays consistent. Returns the calls of `op` the sequence made. */
static uint64_t fault_sequence(uint64_t seed, const char *conf, bool held, sim_op_t op, bool inject, unsigned after,
                               unsigned count, sim_op_t also) {
    rng_t seq = {seed}, *r = &seq;
    world_t w;
    world_open(&w, conf, held);
    uint64_t calls = sim_calls(op); /* (counted from sim_configure on) */
    cua_result err = (op == SIM_OP_PHYS_CREATE || op == SIM_OP_MEM_ALLOC) ? CUA_ERROR_OUT_OF_MEMORY : CUA_ERROR_UNKNOWN;
    if (inject) {
        sim_fail(op, after, count, err);
        if (also != SIM_OP_COUNT) sim_fail(also, 0, 1, CUA_ERROR_UNKNOWN); /* the next one: likely the rollback's */
        w.exact_device = op != SIM_OP_PHYS_RELEASE;
    }
    for (int i = 0; i < 400; i++) {
        uint64_t dice = rng_below(r, 100);
        if (w.nlive < MAX_LIVE && (dice < 55 || w.nlive == 0)) {
            world_alloc(&w, r, rng_tensor_size(r, 24 << 20), (int)rng_below(r, NSTREAMS));
        } else if (dice < 58) {
            heap_trim(w.h);
        } else if (dice < 61) {
            world_complete(&w, 1 + (int)rng_below(r, NSTREAMS - 1));
        } else {
            /* Frees on the block's stream, on another, and device-wide: the events, queries and
             * synchronizations that settle them fail too. */
            int k = (int)rng_below(r, (uint64_t)w.nlive);
            int stream = rng_below(r, 8) ? w.live[k].stream : (int)rng_below(r, NSTREAMS);
            if (rng_below(r, 6) || !world_free_device_wide(&w, k)) world_free(&w, k, stream);
        }
        if (inject) world_verify(&w, sim_op_name(op)); /* (the first run is the one without failures) */
    }
    calls = sim_calls(op) - calls;
    sim_fail(op, 0, 0, CUA_SUCCESS);
    if (also != SIM_OP_COUNT) sim_fail(also, 0, 0, CUA_SUCCESS);
    world_close(&w, true);
    return calls;
}

/* fault_sequence with `op` failing where the sequence calls it: a first run without failures
 * counts its calls (the heap and the sim are deterministic), and the failure is placed among
 * them. Returns whether it could be (false: the sequence never calls op). */
static bool fault_run(rng_t *r, const char *conf, bool held, sim_op_t op, sim_op_t also) {
    uint64_t seed = rng_next(r);
    unsigned count = 1 + (unsigned)rng_below(r, 3);
    uint64_t calls = fault_sequence(seed, conf, held, op, false, 0, 0, SIM_OP_COUNT);
    unsigned after = (unsigned)rng_below(r, calls);
    fault_sequence(seed, conf, held, op, true, after, count, also);
    return calls > 0;
}

/* Every driver operation fails at some point of a random sequence; the heap stays consistent. Then
 * a map that fails whose rollback's unmap is refused too (the rollback must still leave nothing
 * mapped under the range it gives back). */
static void run_faults(rng_t *r) {
    static const sim_op_t ops[] = {SIM_OP_PHYS_CREATE, SIM_OP_MAP,        SIM_OP_SET_ACCESS,  SIM_OP_UNMAP,
                                   SIM_OP_PHYS_RELEASE, SIM_OP_MEM_ALLOC, SIM_OP_MEM_FREE,    SIM_OP_EVENT_CREATE,
                                   SIM_OP_EVENT_RECORD, SIM_OP_EVENT_QUERY, SIM_OP_STREAM_SYNC, SIM_OP_EVENT_SYNC,
                                   SIM_OP_DEVICE_SYNC};
    static const char *confs[] = {"sim_memory_mb:128", "sim_memory_mb:128,expandable_segments:0"};
    int runs = 0, failed = 0;
    char never[256] = "";
    for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++) {
        int op_failed = 0;
        for (int ci = 0; ci < 2; ci++)
            for (int trial = 0; trial < 3; trial++, runs++)
                op_failed += fault_run(r, confs[ci], trial == 2, ops[oi], SIM_OP_COUNT);
        failed += op_failed;
        if (!op_failed) snprintf(never + strlen(never), sizeof never - strlen(never), " %s", sim_op_name(ops[oi]));
    }
    static const sim_op_t map_side[] = {SIM_OP_PHYS_CREATE, SIM_OP_MAP, SIM_OP_SET_ACCESS};
    for (size_t oi = 0; oi < sizeof map_side / sizeof map_side[0]; oi++)
        for (int trial = 0; trial < 4; trial++, runs++) failed += fault_run(r, confs[0], trial == 3, map_side[oi], SIM_OP_UNMAP);
    printf("  fault injection: %d runs over %zu operations, %d of them failing one; never called:%s\n", runs,
           sizeof ops / sizeof ops[0], failed, never[0] ? never : " none");
    /* Every operation but the event wait (called only when device-wide frees pile up, which these
     * runs make rare) fails in some run. */
    EXPECT(!never[0] || strcmp(never, " event_sync") == 0, "operations never called, so never failed:%s", never);
}

/* A map that fails, after which the driver also refuses to release the chunk's new handle: the
 * handle is not lost. The heap keeps it for a later release (as an unmapped chunk's), so that once
 * everything is freed, trimmed and the heap destroyed, the device holds nothing. */
static void test_map_refused_release_refused(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    sim_fail(SIM_OP_MAP, 0, 1, CUA_ERROR_UNKNOWN);
    sim_fail(SIM_OP_PHYS_RELEASE, 0, 1, CUA_ERROR_UNKNOWN);
    void *p = heap_malloc(h, 4 << 20, NULL); /* the retry maps it */
    sim_fail(SIM_OP_MAP, 0, 0, CUA_SUCCESS);
    sim_fail(SIM_OP_PHYS_RELEASE, 0, 0, CUA_SUCCESS);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent after a refused map and release");
    if (p) heap_free(h, p, NULL);
    heap_trim(h);
    cualloc_stats s;
    heap_get_stats(h, &s);
    EXPECT(s.reserved_bytes == 0, "%zu B reserved after trim", s.reserved_bytes);
    heap_destroy(h);
    EXPECT(sim_live_handles(0) == 0 && sim_used_bytes(0) == 0, "%zu handles (%zu B) leaked on the device",
           sim_live_handles(0), sim_used_bytes(0));
    printf("  a refused map whose handle's release is refused too: nothing leaked\n");
}

int main(void) {
    rng_t r = {test_seed("test_heap_property")};
    test_map_refused_release_refused();
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) run_variant(&variants[i], &r);
    run_faults(&r);
    printf("test_heap_property: ok\n");
    return 0;
}
