/* test_streams.c — the stream rule (DESIGN.md decision 5) with events whose completion the test
 * controls: a block freed on stream S is reused at once by S, by another stream only after S's
 * work up to the free has completed, and memory pressure synchronizes instead of failing. Also the
 * fragmentation trap of the heap issue, in both modes. */
#include <pthread.h>

#include "internal.h"
#include "testutil.h"

static void *must_alloc(heap_t *h, size_t size, cua_stream s) {
    void *p = NULL;
    EXPECT(heap_alloc(h, size, s, &p) == CUA_SUCCESS && p, "allocation of %zu failed", size);
    EXPECT(heap_check(h, stderr) == 0, "heap_check after alloc");
    return p;
}

static void must_free(heap_t *h, void *p, cua_stream s) {
    EXPECT(heap_free(h, p, s), "free refused");
    EXPECT(heap_check(h, stderr) == 0, "heap_check after free");
}

static cualloc_stats stats(heap_t *h) {
    cualloc_stats s;
    heap_get_stats(h, &s);
    return s;
}

static void test_same_stream_reuse(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    must_free(h, a, s);
    uint64_t syncs = stats(h).num_syncs, queries = sim_calls(SIM_OP_EVENT_QUERY), records = sim_calls(SIM_OP_EVENT_RECORD);
    void *b = must_alloc(h, 4 << 20, s);
    EXPECT(a == b, "the same stream reuses its freed block at once");
    EXPECT(stats(h).num_syncs == syncs && sim_calls(SIM_OP_EVENT_QUERY) == queries &&
               sim_calls(SIM_OP_EVENT_RECORD) == records,
           "same-stream reuse touches no event and no synchronization");
    must_free(h, b, s);
    heap_destroy(h);
    sim_stream_destroy(s);
}

/* Training steps on one stream: the same large sizes allocated in order and freed in reverse, step
 * after step. The large pool's free remainder is then its index's only block, carved and merged back
 * across bins (the fast paths' sizeclass_resize_only). Every step places the blocks where the first
 * did, the heap checks after every call, and the statistics are exact at each step's peak and end. */
static void test_training_steps(void) {
    enum { SIZES = 24, STEPS = 30 };
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    cua_stream s = sim_stream_create(0, true);
    size_t size[SIZES], rounded = 0, requested = 0;
    void *first[SIZES], *p[SIZES];
    for (int i = 0; i < SIZES; i++) {
        size[i] = ((size_t)1 << 20) + 1 + (size_t)i * 467 * 1024; /* 1 MiB + 1 B .. about 11.5 MiB */
        requested += size[i];
        rounded += (size[i] + 511) & ~(size_t)511;
    }
    cualloc_stats before = stats(h);
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < SIZES; i++) {
            p[i] = must_alloc(h, size[i], s);
            if (step == 0) first[i] = p[i];
            EXPECT(p[i] == first[i], "step %d: block %d moved from %p to %p", step, i, first[i], p[i]);
        }
        cualloc_stats peak = stats(h);
        EXPECT(peak.allocated_bytes == before.allocated_bytes + rounded &&
                   peak.requested_bytes == before.requested_bytes + requested,
               "step %d: allocated %zu, requested %zu at the peak", step, peak.allocated_bytes, peak.requested_bytes);
        for (int i = SIZES; i-- > 0;) must_free(h, p[i], s);
        cualloc_stats end = stats(h);
        EXPECT(end.allocated_bytes == before.allocated_bytes && end.requested_bytes == before.requested_bytes &&
                   end.num_allocs == before.num_allocs + (uint64_t)(step + 1) * SIZES &&
                   end.num_frees == before.num_frees + (uint64_t)(step + 1) * SIZES &&
                   end.allocated_peak == before.allocated_bytes + rounded &&
                   end.requested_peak == before.requested_bytes + requested,
               "step %d: the statistics after the frees", step);
    }
    heap_destroy(h);
    sim_stream_destroy(s);
}

static void test_cross_stream_waits_for_event(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    must_free(h, a, s); /* S's work on `a` is still in flight: S is held */
    void *b = must_alloc(h, 4 << 20, t);
    EXPECT(b != a, "another stream must not get a block whose stream has not finished");
    EXPECT(sim_calls(SIM_OP_EVENT_RECORD) >= 1, "an event was recorded on S to find out when it finishes");
    EXPECT(stats(h).num_syncs == 0, "no synchronization without memory pressure");
    sim_stream_complete(s); /* S's work completes: the event fires */
    void *d = must_alloc(h, 4 << 20, t);
    EXPECT(d == a, "after S completed, T reuses S's block (got %p, expected %p)", d, a);
    EXPECT(stats(h).num_syncs == 0, "reuse after completion needs no synchronization");
    must_free(h, b, t);
    must_free(h, d, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* A free on S after the event was recorded is not covered by it: the block stays S's. */
static void test_event_covers_only_earlier_frees(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s), *a2 = must_alloc(h, 4 << 20, s);
    must_free(h, a, s);
    void *b = must_alloc(h, 4 << 20, t); /* records the event on S covering a's free */
    EXPECT(b != a, "a not yet reusable");
    must_free(h, a2, s);                 /* a later free on S, not covered by that event */
    sim_stream_complete(s);              /* ...completes everything, but the heap only knows the event */
    void *d = must_alloc(h, 8 << 20, t);
    EXPECT(d != a && d != a2, "a merged block with an uncovered free must not move to T");
    must_free(h, b, t);
    must_free(h, d, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* A stream that keeps freeing (a side stream that allocates and frees every step): the blocks it
 * freed before its event was recorded move to another stream once that event has completed,
 * although newer frees came after it; the newer ones wait for the next event. The stream itself
 * reuses both at once. No synchronize anywhere. */
static void test_stream_generations(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    /* Separators keep the freed blocks apart: a settled block beside one of S's newer free ones
     * would merge with it and be S's again. */
    void *old = must_alloc(h, 4 << 20, s), *sep1 = must_alloc(h, 2 << 20, s);
    void *newer = must_alloc(h, 8 << 20, s), *sep2 = must_alloc(h, 2 << 20, s);
    void *own = must_alloc(h, 6 << 20, s), *sep3 = must_alloc(h, 2 << 20, s);
    must_free(h, old, s);
    must_free(h, own, s);
    uint64_t records = sim_calls(SIM_OP_EVENT_RECORD);
    void *b1 = must_alloc(h, 4 << 20, t); /* T misses: an event on S now covers `old` and `own` */
    EXPECT(b1 != old, "`old` is not T's before S has passed its free");
    EXPECT(sim_calls(SIM_OP_EVENT_RECORD) == records + 1, "one event recorded on S");
    void *own2 = must_alloc(h, 6 << 20, s);
    EXPECT(own2 == own, "S reuses its block freed before the event at once (got %p, want %p)", own2, own);
    must_free(h, newer, s); /* after the event: not covered by it */
    sim_stream_complete(s); /* the event completes; `newer` has none yet */
    void *b2 = must_alloc(h, 4 << 20, t);
    EXPECT(b2 == old, "the block freed before the event moved to T, although S freed again since (got %p, want %p)",
           b2, old);
    void *b3 = must_alloc(h, 8 << 20, t);
    EXPECT(b3 != newer, "the block freed after the event waits for the next one");
    EXPECT(stats(h).num_syncs == 0 && sim_calls(SIM_OP_STREAM_SYNC) == 0 && sim_calls(SIM_OP_DEVICE_SYNC) == 0,
           "no synchronize");
    sim_stream_complete(s); /* the event recorded at b3's miss covers `newer` */
    void *b4 = must_alloc(h, 8 << 20, t);
    EXPECT(b4 == newer, "and moves at the next miss once that event has completed (got %p, want %p)", b4, newer);
    EXPECT(stats(h).num_syncs == 0, "still no synchronize");
    void *s_all[] = {sep1, sep2, own2, sep3};
    for (size_t i = 0; i < sizeof s_all / sizeof s_all[0]; i++) must_free(h, s_all[i], s);
    void *t_all[] = {b1, b2, b3, b4};
    for (size_t i = 0; i < sizeof t_all / sizeof t_all[0]; i++) must_free(h, t_all[i], t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* bench/gpu/preload_kernels.cu's hand-over rounds, on the sim: S allocates its buffers (each
 * followed by a separator) up front and then only frees, one per round; each round the host has
 * seen S past the previous round, and T allocates the same size and keeps it. T must get the
 * previous round's buffer, never the one just freed (its reader still runs), without a
 * synchronize: what the GPU run expects of cualloc in every round but the first. */
static void test_handover_rounds(void) {
    enum { R = 40 };
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a[R], *sep[R], *y[R];
    for (int r = 0; r < R; r++) {
        a[r] = must_alloc(h, 4 << 20, s);
        sep[r] = must_alloc(h, 2 << 20, s);
    }
    for (int r = 0; r < R; r++) {
        must_free(h, a[r], s);
        if (r > 0) sim_stream_complete(s); /* S has passed round r-1, not round r's reader */
        y[r] = must_alloc(h, 4 << 20, t);
        EXPECT(y[r] != a[r], "round %d: T was given the buffer whose reader still runs", r);
        if (r > 0) EXPECT(y[r] == a[r - 1], "round %d: T got %p, not the previous round's buffer %p", r, y[r], a[r - 1]);
    }
    EXPECT(stats(h).num_syncs == 0 && sim_calls(SIM_OP_STREAM_SYNC) == 0 && sim_calls(SIM_OP_DEVICE_SYNC) == 0,
           "hand-over without a synchronize");
    for (int r = 0; r < R; r++) {
        must_free(h, y[r], t);
        must_free(h, sep[r], s);
    }
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* Streams taking turns with the same shapes: S's step ends with its small blocks parked on its
 * quick lists. When T misses and S is seen idle, those lists become T's, unmerged, and T's step
 * takes S's very blocks from them; while S still runs (its events' queries say not ready), or
 * captures, T gets none of them. After a hand-over, a block S frees is S's again, and stays from T
 * while S has not been seen past it. */
static void test_quick_lists_handed_over(void) {
    enum { K = 8 };
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream s = sim_stream_create(0, false), t = sim_stream_create(0, false); /* both complete at once */
    void *small[K], *big;
    size_t size[K];
    for (int k = 0; k < K; k++) size[k] = (size_t)(64 + 96 * k) << 10; /* 64 KiB .. 736 KiB: small pool */
    const char *what[] = {"S still runs", "S is idle", "S captures"};
    for (int round = 0; round < 3; round++) {
        /* S's step: the small blocks and a large one, all freed on S. */
        for (int k = 0; k < K; k++) small[k] = must_alloc(h, size[k], s);
        big = must_alloc(h, 8 << 20, s);
        must_free(h, big, s);
        for (int k = 0; k < K; k++) must_free(h, small[k], s);
        bool idle = round == 1;
        if (round == 0) sim_fail(SIM_OP_EVENT_QUERY, 0, 1000, CUA_ERROR_NOT_READY);
        if (round == 2) sim_stream_set_capturing(s, true);
        uint64_t handed = heap_test_quick_handed_over(h);
        /* T's step: the large request misses (T has nothing of its own), then the small ones in
         * another order than S's. */
        void *tbig = must_alloc(h, 8 << 20, t), *tsmall[K];
        for (int k = K; k-- > 0;) tsmall[k] = must_alloc(h, size[k], t);
        EXPECT((heap_test_quick_handed_over(h) > handed) == idle, "round %d (%s): lists handed over: %llu", round,
               what[round], (unsigned long long)(heap_test_quick_handed_over(h) - handed));
        for (int k = 0; k < K; k++) {
            char *x = tsmall[k];
            bool overlap = false;
            for (int j = 0; j < K; j++)
                if (x < (char *)small[j] + size[j] && (char *)small[j] < x + size[k]) overlap = true;
            if (idle)
                EXPECT(x == small[k], "round %d: T's %zu KiB block is %p, not S's parked one %p", round, size[k] >> 10,
                       (void *)x, small[k]);
            else
                EXPECT(!overlap, "round %d (%s): T's %zu KiB block %p is S's memory", round, what[round], size[k] >> 10,
                       (void *)x);
        }
        EXPECT(idle ? tbig == big : tbig != big, "round %d (%s): the large block follows the stream rule", round, what[round]);
        if (idle) {
            /* S frees a block of a handed-over size, then runs on: the block is S's alone. */
            void *again = must_alloc(h, size[0], s);
            must_free(h, again, s);
            sim_fail(SIM_OP_EVENT_QUERY, 0, 1000, CUA_ERROR_NOT_READY);
            must_free(h, tsmall[0], t);
            void *t2 = must_alloc(h, size[0], t), *t3 = must_alloc(h, size[0], t);
            EXPECT(t2 == tsmall[0], "T takes its own parked block back");
            EXPECT(t3 != again, "T was given S's newer block %p, which S has not been seen past", again);
            must_free(h, t3, t);
            tsmall[0] = t2;
        }
        sim_fail(SIM_OP_EVENT_QUERY, 0, 0, CUA_SUCCESS);
        for (int k = 0; k < K; k++) must_free(h, tsmall[k], t);
        must_free(h, tbig, t);
        if (round == 2) sim_stream_set_capturing(s, false);
        heap_trim(h); /* each round from an empty heap */
        EXPECT(heap_check(h, stderr) == 0 && stats(h).reserved_bytes == 0, "round %d: trimmed", round);
    }
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* A stream destroyed while its closed generation's event is in flight: both of its generations
 * settle (after synchronizing it) and its tags are freed, so the handle can come back. */
static void test_stream_destroyed_with_closed_generation(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *old = must_alloc(h, 4 << 20, s), *sep = must_alloc(h, 2 << 20, s), *newer = must_alloc(h, 8 << 20, s);
    void *sep2 = must_alloc(h, 2 << 20, s);
    must_free(h, old, s);
    void *b1 = must_alloc(h, 4 << 20, t); /* closes S's tag: `old` in its closed generation */
    must_free(h, newer, s);               /* in S's open one */
    uint64_t syncs = sim_calls(SIM_OP_STREAM_SYNC);
    heap_stream_destroyed(h, s);
    EXPECT(sim_calls(SIM_OP_STREAM_SYNC) == syncs + 1, "one synchronize of the destroyed stream");
    EXPECT(heap_check(h, stderr) == 0, "heap_check after destroying a stream with a closed generation");
    void *b2 = must_alloc(h, 4 << 20, t), *b3 = must_alloc(h, 8 << 20, t);
    EXPECT(b2 == old && b3 == newer, "both generations are free for everyone (got %p %p, want %p %p)", b2, b3, old,
           newer);
    void *all[] = {b1, b2, b3, sep, sep2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) must_free(h, all[i], t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* Under memory pressure the heap synchronizes the stream holding free memory instead of failing. */
static void test_pressure_synchronizes(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:16", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 12 << 20, s);
    must_free(h, a, s);
    void *b = must_alloc(h, 12 << 20, t); /* only 4 MiB left unmapped: S's 12 MiB must be reused */
    EXPECT(b == a, "pressure makes the heap wait for S and reuse its memory");
    EXPECT(stats(h).num_syncs >= 1 && sim_calls(SIM_OP_STREAM_SYNC) >= 1, "and that cost one synchronization");
    EXPECT(stats(h).num_ooms == 0, "no OOM");
    must_free(h, b, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* Under pressure, a stream the driver refuses to synchronize (destroyed behind the heap's back, or
 * another device's) is waited for with a device synchronize instead; its memory is reused only
 * then, and with that synchronize refused too, not at all. */
static void test_pressure_stream_sync_refused(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:16", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 12 << 20, s);
    must_free(h, a, s);
    uint64_t ds = sim_calls(SIM_OP_DEVICE_SYNC);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1000, CUA_ERROR_INVALID_VALUE);
    void *b = must_alloc(h, 12 << 20, t);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 0, CUA_SUCCESS);
    EXPECT(b == a && sim_calls(SIM_OP_DEVICE_SYNC) == ds + 1, "the device was synchronized instead, and S's memory reused");
    must_free(h, b, t);

    /* Both refused: nothing proves S idle, so its block is not handed to T. */
    void *d = must_alloc(h, 12 << 20, s);
    must_free(h, d, s);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1000, CUA_ERROR_INVALID_VALUE);
    sim_fail(SIM_OP_DEVICE_SYNC, 0, 1000, CUA_ERROR_INVALID_VALUE);
    void *e = NULL;
    cua_result r = heap_alloc(h, 12 << 20, t, &e);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 0, CUA_SUCCESS);
    sim_fail(SIM_OP_DEVICE_SYNC, 0, 0, CUA_SUCCESS);
    EXPECT(heap_check(h, stderr) == 0, "heap_check after the refusals");
    EXPECT(r != CUA_SUCCESS && !e, "S's block went to T though neither S nor the device could be synchronized");
    e = must_alloc(h, 12 << 20, t); /* synchronizing works again */
    EXPECT(e == d, "once S can be synchronized, T gets its memory");
    must_free(h, e, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* Chunks freed on a held stream are not unmapped until that stream is synchronized. */
static void test_trim_synchronizes_first(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true);
    void *a = must_alloc(h, 8 << 20, s);
    must_free(h, a, s);
    uint64_t before = sim_calls(SIM_OP_STREAM_SYNC);
    heap_trim(h);
    EXPECT(sim_calls(SIM_OP_STREAM_SYNC) == before + 1, "trim synchronized the stream whose memory it unmapped");
    EXPECT(stats(h).reserved_bytes == 0, "and then released everything");
    EXPECT(heap_check(h, stderr) == 0, "heap_check after trim");
    heap_destroy(h);
    sim_stream_destroy(s);
}

/* A destroyed stream's handle can come back for a new stream: its free blocks are settled. */
static void test_stream_destroyed(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    must_free(h, a, s);
    heap_stream_destroyed(h, s);
    EXPECT(heap_check(h, stderr) == 0, "heap_check after stream destruction");
    void *b = must_alloc(h, 4 << 20, t);
    EXPECT(b == a, "the destroyed stream's memory is free for everyone");
    must_free(h, b, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* More streams than tag slots: records are recycled, nothing breaks. */
static void test_many_streams(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    void *ptrs[200];
    for (int i = 0; i < 200; i++) ptrs[i] = must_alloc(h, 1 << 20, (cua_stream)(uintptr_t)(0x1000 + 16 * i));
    for (int i = 0; i < 200; i++) must_free(h, ptrs[i], (cua_stream)(uintptr_t)(0x1000 + 16 * i));
    for (int i = 0; i < 200; i++) ptrs[i] = must_alloc(h, 1 << 20, (cua_stream)(uintptr_t)(0x9000 + 16 * i));
    for (int i = 0; i < 200; i++) must_free(h, ptrs[i], (cua_stream)(uintptr_t)(0x9000 + 16 * i));
    heap_trim(h);
    EXPECT(stats(h).reserved_bytes == 0, "all released");
    heap_destroy(h);
}

/* Classic mode moves no free block between streams (a segment serves one), so a stream that
 * cached a free block keeps its tag: 200 streams come and go, each allocating and freeing, and a
 * full table is freed by releasing the streams' wholly free segments, as PyTorch releases its
 * cache before giving up. */
static void test_many_streams_classic(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024,expandable_segments:False", &c);
    for (int i = 0; i < 200; i++) {
        cua_stream s = (cua_stream)(uintptr_t)(0x1000 + 16 * i);
        must_free(h, must_alloc(h, (size_t)(i % 3 + 1) << 20, s), s);
        EXPECT(heap_check(h, stderr) == 0, "heap_check after stream %d", i);
    }
    EXPECT(stats(h).num_ooms == 0, "no allocation failed");
    /* Streams whose live blocks share a segment with their cached free memory keep their slots: the
     * stream past them gets none, and is told why and what to do, not that the device is full. */
    test_captured_t said = {0};
    error_set_callback(test_capture, &said);
    void *live[TAG_STREAMS_END];
    for (int i = 0; i < TAG_STREAMS_END - 1; i++) live[i] = must_alloc(h, 1 << 20, (cua_stream)(uintptr_t)(0x9000 + 16 * i));
    void *p = NULL;
    EXPECT(heap_alloc(h, 1 << 20, (cua_stream)(uintptr_t)0x8000, &p) != CUA_SUCCESS && !p, "a stream with no slot was served");
    EXPECT(strstr(said.text, "classic mode keeps each segment to one stream") && strstr(said.text, "expandable") &&
               !strstr(said.text, "capturing"),
           "the refusal did not say why:\n%s", said.text);
    error_set_callback(NULL, NULL);
    for (int i = 0; i < TAG_STREAMS_END - 1; i++) must_free(h, live[i], (cua_stream)(uintptr_t)(0x9000 + 16 * i));
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    heap_trim(h);
    EXPECT(stats(h).reserved_bytes == 0, "all released");
    heap_destroy(h);
}

/* Classic mode: a block freed twice is still the heap's when it starts a segment (the driver
 * would free the whole segment if the second free were passed on); an address past every segment
 * is not. */
static void test_classic_owns_segment_base(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64,expandable_segments:False", &c);
    void *a = must_alloc(h, 1 << 20, NULL), *b = must_alloc(h, 1 << 20, NULL);
    EXPECT(heap_owns(h, a) && heap_owns(h, b), "live blocks");
    EXPECT(heap_starts_segment(h, a) && !heap_starts_segment(h, b), "a starts the 2 MiB segment, b lies inside it");
    must_free(h, a, NULL);
    must_free(h, b, NULL);
    EXPECT(heap_owns(h, a), "a freed segment base (a double free must not reach the driver)");
    EXPECT(!heap_owns(h, (char *)a + (64 << 20)), "an address past the segments");
    heap_destroy(h);
}

/* The fragmentation trap: 4 GiB device, 3 GiB held; one 1000 MiB block allocated and freed, then
 * carved into 9 x 100 MiB blocks interleaved with 9 x 2 MiB pins; the 100 MiB blocks freed; a
 * 900 MiB request. Expandable segments unmap the holes and remap them; classic mode, like
 * PyTorch's default allocator, is stuck with one pinned 1000 MiB segment and must fail cleanly. */
static bool fragmentation_trap(const char *text, bool *usable_after) {
    conf_t c;
    heap_t *h = test_sim_heap(text, &c);
    cua_stream s = NULL;
    void *held[3], *big, *pieces[9], *pins[9];
    for (int i = 0; i < 3; i++) held[i] = must_alloc(h, (size_t)1 << 30, s);
    big = must_alloc(h, (size_t)1000 << 20, s);
    must_free(h, big, s);
    for (int i = 0; i < 9; i++) {
        pieces[i] = must_alloc(h, (size_t)100 << 20, s);
        pins[i] = must_alloc(h, (size_t)2 << 20, s);
    }
    for (int i = 0; i < 9; i++) must_free(h, pieces[i], s);
    cualloc_stats before = stats(h);
    void *p = NULL;
    cua_result r = heap_alloc(h, (size_t)900 << 20, s, &p);
    EXPECT(heap_check(h, stderr) == 0, "heap_check after the 900 MiB request");
    cualloc_stats after = stats(h);
    if (r == CUA_SUCCESS) {
        EXPECT(p, "success with a pointer");
        EXPECT(after.num_ooms == before.num_ooms, "no OOM counted");
        EXPECT(after.reserved_bytes <= (size_t)4 << 30, "within the device");
        must_free(h, p, s);
    } else {
        EXPECT(!p, "failure returns NULL");
        EXPECT(after.num_ooms == before.num_ooms + 1, "the OOM is counted");
        EXPECT(after.allocated_bytes == before.allocated_bytes, "nothing changed hands");
    }
    /* Still usable: a small and a medium allocation succeed and free. */
    void *q = NULL;
    *usable_after = heap_alloc(h, 1 << 20, s, &q) == CUA_SUCCESS;
    if (q) must_free(h, q, s);
    for (int i = 0; i < 9; i++) must_free(h, pins[i], s);
    for (int i = 0; i < 3; i++) must_free(h, held[i], s);
    heap_trim(h);
    EXPECT(stats(h).reserved_bytes == 0, "everything released");
    heap_destroy(h);
    return r == CUA_SUCCESS;
}

/* Split and coalesce, block by block, in both modes: three neighbours carved from one free range,
 * freed in every order, always merge back into one free range. */
static void test_split_coalesce(const char *text) {
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int o = 0; o < 6; o++) {
        conf_t c;
        heap_t *h = test_sim_heap(text, &c);
        void *big = must_alloc(h, 12 << 20, NULL);
        must_free(h, big, NULL);
        heap_trim(h); /* start from nothing cached, then one 12 MiB free range */
        big = must_alloc(h, 12 << 20, NULL);
        must_free(h, big, NULL);
        void *p[3];
        for (int i = 0; i < 3; i++) p[i] = must_alloc(h, 3 << 20, NULL);
        EXPECT(p[1] == (char *)p[0] + (3 << 20) && p[2] == (char *)p[1] + (3 << 20), "split carves neighbours in order");
        block_t *b = heap_test_find_block(h, p[2]);
        EXPECT(b->next && b->next->state != BLOCK_ALLOCATED && b->next->size == (3 << 20), "the 3 MiB rest is free");
        for (int i = 0; i < 3; i++) must_free(h, p[orders[o][i]], NULL);
        heap_trim(h);
        cualloc_stats s = stats(h);
        EXPECT(s.reserved_bytes == 0, "order %d: everything merged and released (%zu B left)", o, s.reserved_bytes);
        heap_destroy(h);
    }
}

/* PyTorch's expandable segments with max_split_size_mb can grow reserved memory without bound. Here a
 * long pattern of mixed large requests under that configuration keeps its reserved peak within a
 * quarter above the live peak: the cache is reused, not grown. (Reserved does rise after the first
 * quarter of the rounds, but with the live peak, which rises too.) */
static void test_max_split_bounded(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:8192,max_split_size_mb:64", &c);
    rng_t r = {12345};
    void *live[8] = {0};
    size_t live_bytes = 0, peak_live = 0, sizes[8] = {0};
    const int rounds = 40000;
    for (int i = 0; i < rounds; i++) {
        int k = (int)rng_below(&r, 8);
        if (live[k]) {
            must_free(h, live[k], NULL);
            live_bytes -= sizes[k];
            live[k] = NULL;
        } else {
            sizes[k] = heap_round_size(&c, (size_t)(rng_below(&r, 200) + 1) << 20);
            live[k] = must_alloc(h, sizes[k], NULL);
            live_bytes += sizes[k];
            if (live_bytes > peak_live) peak_live = live_bytes;
        }
    }
    cualloc_stats s = stats(h);
    printf("  max_split_size_mb with expandable segments: live peak %zu MiB, reserved peak %zu MiB after %d rounds\n",
           peak_live >> 20, s.reserved_peak >> 20, rounds);
    EXPECT(s.reserved_peak * 4 <= peak_live * 5, "reserved peaked at %zu B for a live peak of %zu B (more than 1.25x)",
           s.reserved_peak, peak_live);
    EXPECT(s.num_ooms == 0, "no OOM");
    for (int k = 0; k < 8; k++) if (live[k]) must_free(h, live[k], NULL);
    heap_destroy(h);
}

static bool event_complete(cua_event e) { return driver_sim_ops.event_query(0, e) == CUA_SUCCESS; }

static cua_event event_now(cua_stream s) {
    cua_event e = NULL;
    EXPECT(driver_sim_ops.event_create(0, &e) == CUA_SUCCESS && driver_sim_ops.event_record(0, e, s) == CUA_SUCCESS,
           "the test's event");
    return e;
}

/* A stream made on the sim (held: its work waits for the test), registered with the heap. */
static cua_stream stream_made(heap_t *h, bool held, bool blocking) {
    cua_stream s = sim_stream_create(0, held);
    sim_stream_set_blocking(s, blocking);
    heap_stream_created(h, s, !blocking);
    return s;
}

/* cudaFree's guarantee with no non-blocking stream. The legacy stream orders the blocking streams
 * before it, not the blocking streams among themselves (nor two threads' per-thread streams): a
 * block freed device-wide while a blocking stream's work may use it goes to no stream until an
 * event on the legacy stream, recorded after the free, completes (or a synchronize), although the
 * next cudaMalloc might serve a kernel on another blocking stream. A free with nothing in flight
 * is reused at the next request, without a synchronize. */
static void test_device_wide_without_nonblocking(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream blocking = sim_stream_create(0, true); /* its work is in flight */
    sim_stream_set_blocking(blocking, true);
    heap_stream_created(h, blocking, false);
    void *a = must_alloc(h, 4 << 20, NULL);
    uint64_t syncs = stats(h).num_syncs;
    EXPECT(heap_free_device_wide(h, a), "device-wide free");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    void *b = must_alloc(h, 4 << 20, NULL);
    EXPECT(b != a || stats(h).num_syncs > syncs,
           "a device-wide freed block was handed out again at once while a blocking stream's work may use it");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, b, NULL);
    heap_stream_destroyed(h, blocking);
    sim_stream_destroy(blocking);
    /* A blocking stream with nothing in flight: the legacy stream's event completes at the next
     * request, which reuses the block without a synchronize. */
    cua_stream idle = sim_stream_create(0, false);
    sim_stream_set_blocking(idle, true);
    heap_stream_created(h, idle, false);
    void *d = must_alloc(h, 4 << 20, NULL);
    syncs = stats(h).num_syncs;
    EXPECT(heap_free_device_wide(h, d), "device-wide free");
    void *e = must_alloc(h, 4 << 20, NULL);
    EXPECT(e == d && stats(h).num_syncs == syncs, "an idle device: reused at the next request without a synchronize");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, e, NULL);
    heap_stream_destroyed(h, idle);
    sim_stream_destroy(idle);
    heap_destroy(h);
}

/* cudaMalloc's meaning: the block may serve any stream at once. A block freed on the legacy stream
 * while its work may still use it is taken back at once when every stream is a blocking one (their
 * later work waits for the legacy stream's earlier work), and the first non-blocking stream created
 * after that synchronizes the legacy stream once (the new stream would not wait for it). While a
 * non-blocking stream exists, such a block serves a device-wide request only once the legacy
 * stream's event says the device is past the free, and memory mapped for one is everyone's. (The
 * legacy stream's work is kept in flight here by a busy blocking stream, which its events wait for.) */
static void test_device_wide_alloc(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream busy = stream_made(h, true, true);
    void *a = must_alloc(h, 4 << 20, NULL), *b = NULL;
    must_free(h, a, NULL);
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &b) == CUA_SUCCESS && b == a,
           "no non-blocking stream: the legacy stream's freed block is taken back at once");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    uint64_t syncs = stats(h).num_syncs;
    cua_stream nb = sim_stream_create(0, false);
    heap_stream_created(h, nb, true);
    EXPECT(stats(h).num_syncs == syncs + 1,
           "a non-blocking stream created after a device-wide allocation took a legacy block: %llu synchronizes, want 1",
           (unsigned long long)(stats(h).num_syncs - syncs));
    cua_stream nb2 = sim_stream_create(0, false);
    heap_stream_created(h, nb2, true);
    EXPECT(stats(h).num_syncs == syncs + 1, "the next non-blocking stream: no synchronize");
    must_free(h, b, NULL);
    syncs = stats(h).num_syncs;
    void *d = NULL;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &d) == CUA_SUCCESS && d, "device-wide allocation");
    EXPECT(d != a || stats(h).num_syncs > syncs,
           "with a non-blocking stream, a block freed on the legacy stream was handed out for any stream at once, "
           "while the legacy stream's work may still use it");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    /* Memory mapped for a device-wide request is everyone's: a small one maps a chunk, and a small
     * request on the non-blocking stream takes the chunk's rest rather than map another. */
    size_t reserved = stats(h).reserved_bytes;
    void *s1 = NULL, *s2 = NULL;
    EXPECT(heap_alloc_device_wide(h, 512 << 10, &s1) == CUA_SUCCESS && s1, "small device-wide allocation");
    size_t after_one = stats(h).reserved_bytes;
    EXPECT(heap_alloc(h, 512 << 10, nb, &s2) == CUA_SUCCESS && s2 && stats(h).reserved_bytes == after_one,
           "a small request on the non-blocking stream mapped more (%zu -> %zu -> %zu bytes reserved) instead of taking "
           "the rest of the device-wide allocation's chunk", reserved, after_one, stats(h).reserved_bytes);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, s1, NULL);
    must_free(h, s2, nb);
    /* The legacy stream's work done: its event completes, and device-wide requests are served from
     * the blocks it freed, without a synchronize and without mapping more. */
    must_free(h, d, NULL);
    sim_stream_complete(busy);
    heap_stream_destroyed(h, busy);
    sim_stream_destroy(busy);
    void *e = must_alloc(h, 4 << 20, NULL), *f = NULL, *g = NULL;
    must_free(h, e, NULL);
    syncs = stats(h).num_syncs;
    reserved = stats(h).reserved_bytes;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &f) == CUA_SUCCESS && heap_alloc_device_wide(h, 4 << 20, &g) == CUA_SUCCESS &&
               f && g && stats(h).num_syncs == syncs && stats(h).reserved_bytes == reserved,
           "an idle legacy stream: its freed blocks serve device-wide requests (%llu synchronizes, %zu -> %zu bytes "
           "reserved)", (unsigned long long)(stats(h).num_syncs - syncs), reserved, stats(h).reserved_bytes);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, g, NULL);
    must_free(h, f, NULL);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    heap_stream_destroyed(h, nb2);
    sim_stream_destroy(nb2);
    heap_destroy(h);
}

/* Classic mode keeps cudaMalloc on the legacy stream (its segments serve one stream), so a block
 * cudaFreeAsync'd on the legacy stream is what the next cudaMalloc takes, and that memory may then
 * serve a non-blocking stream, whose work does not wait for the legacy stream's, alive then or
 * created later (even during a capture, when nothing can be synchronized). The legacy free waits
 * for the legacy stream's event, as a device-wide one does. (The legacy stream is kept busy by a
 * busy blocking stream.) */
static void test_classic_legacy_free(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64,expandable_segments:0", &c);
    cua_stream busy = stream_made(h, true, true);
    for (int alive = 0; alive < 2; alive++) {
        /* alive 0: the non-blocking stream is created after the free; 1: it exists before */
        void *a = must_alloc(h, 4 << 20, NULL), *b = NULL;
        cua_stream nb = NULL;
        if (alive) nb = stream_made(h, true, false);
        uint64_t syncs = stats(h).num_syncs;
        EXPECT(heap_free_on_legacy(h, a), "legacy free");
        EXPECT(heap_check(h, stderr) == 0, "heap_check");
        if (!alive) nb = stream_made(h, true, false);
        EXPECT(heap_alloc_device_wide(h, 4 << 20, &b) == CUA_SUCCESS && b, "device-wide allocation");
        EXPECT(b != a || stats(h).num_syncs > syncs,
               "classic: a block freed on the legacy stream was handed to cudaMalloc at once while the legacy stream's "
               "work may still use it, with a non-blocking stream created %s the free", alive ? "before" : "after");
        EXPECT(heap_check(h, stderr) == 0, "heap_check");
        must_free(h, b, NULL);
        sim_stream_complete(nb);
        heap_stream_destroyed(h, nb);
        sim_stream_destroy(nb);
    }
    void *d = must_alloc(h, 4 << 20, NULL);
    EXPECT(!heap_free_on_legacy(h, (char *)d + 512), "an interior pointer is refused");
    must_free(h, d, NULL);
    sim_stream_complete(busy);
    heap_stream_destroyed(h, busy);
    sim_stream_destroy(busy);
    heap_trim(h);
    EXPECT(stats(h).reserved_bytes == 0, "everything released (%zu B left)", stats(h).reserved_bytes);
    heap_destroy(h);
}

/* Classic mode: a cudaMalloc'd block (the legacy stream's segment) that a legacy-stream kernel
 * still reads, freed with cudaFreeAsync on an idle blocking stream (legal: that stream's work
 * follows the legacy stream's earlier work). Synchronizing the idle stream says nothing of the
 * legacy stream's work, and the next cudaMalloc may serve a non-blocking stream. */
static void test_classic_free_on_blocking_stream(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256,expandable_segments:False", &c);
    cua_stream b1 = stream_made(h, true, true), b2 = stream_made(h, true, true), nb = stream_made(h, true, false);
    (void)event_now(b1); /* b1 busy: the legacy stream's work waits behind it */
    void *x = NULL, *y = NULL;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &x) == CUA_SUCCESS, "cudaMalloc");
    cua_event reader = event_now(NULL); /* a legacy-stream kernel reading x */
    EXPECT(heap_free(h, x, b2), "cudaFreeAsync(x, b2)");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &y) == CUA_SUCCESS, "cudaMalloc");
    EXPECT(y != x || event_complete(reader),
           "classic: a block freed on a blocking stream went to cudaMalloc while the legacy stream's kernel reads it");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, y, NULL);
    sim_stream_complete(b1);
    cua_stream all[3] = {b1, b2, nb};
    for (int i = 0; i < 3; i++) {
        heap_stream_destroyed(h, all[i]);
        sim_stream_destroy(all[i]);
    }
    heap_destroy(h);
}

/* cudaStreamDestroy returns at once and the stream's work runs on; cudaFree waits for it (CUDA's
 * cudaFree synchronizes). A block a destroyed non-blocking stream's kernel still uses, cudaFree'd
 * after the destroy, must not be handed out again before that kernel is done: the events of the
 * streams still alive do not cover it. */
static void test_destroyed_stream_then_cudafree(const char *conf) {
    conf_t c;
    heap_t *h = test_sim_heap(conf, &c);
    cua_stream n = stream_made(h, true, false), idle = stream_made(h, false, false);
    void *x = NULL, *a[3], *y = NULL;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &x) == CUA_SUCCESS, "cudaMalloc");
    for (int i = 0; i < 3; i++) EXPECT(heap_alloc_device_wide(h, 4 << 20, &a[i]) == CUA_SUCCESS, "cudaMalloc");
    cua_event kernel = event_now(n); /* n's kernel using x */
    heap_stream_destroyed(h, n);     /* its kernel runs on */
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(heap_free_device_wide(h, x), "cudaFree");
    for (int i = 0; i < 3; i++) EXPECT(heap_free_device_wide(h, a[i]), "cudaFree");
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &y) == CUA_SUCCESS, "cudaMalloc");
    EXPECT(y != x || event_complete(kernel),
           "%s: cudaFree'd %p handed out again while a destroyed stream's kernel using it runs", conf, x);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    /* Its work done, the block is reused without a synchronize. */
    sim_stream_complete(n);
    must_free(h, y, NULL);
    uint64_t syncs = stats(h).num_syncs;
    void *z[4];
    for (int i = 0; i < 4; i++) EXPECT(heap_alloc_device_wide(h, 4 << 20, &z[i]) == CUA_SUCCESS, "cudaMalloc");
    EXPECT(stats(h).num_syncs == syncs, "%s: a synchronize after the destroyed stream's work completed", conf);
    for (int i = 0; i < 4; i++) must_free(h, z[i], NULL);
    heap_stream_destroyed(h, idle);
    sim_stream_destroy(idle);
    sim_stream_destroy(n);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    heap_destroy(h);
}

/* A program that creates and destroys a stream every step while the device runs behind: each
 * destroyed stream's last event is kept only while its work runs, so the events kept stay as many
 * as the streams whose work has not finished, not one per stream ever destroyed. */
static void test_destroyed_streams_bounded(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    void *x = NULL;
    EXPECT(heap_alloc_device_wide(h, 1 << 20, &x) == CUA_SUCCESS, "cudaMalloc"); /* the heap exists */
    cua_stream prev = NULL;
    for (int step = 0; step < 200; step++) {
        cua_stream s = stream_made(h, true, false);
        (void)event_now(s); /* its kernel */
        heap_stream_destroyed(h, s);
        if (prev) {
            sim_stream_complete(prev); /* the step before's work ends */
            sim_stream_destroy(prev);
        }
        prev = s;
        EXPECT(*f.n_retired <= 17, "step %d: %u destroyed streams' events kept, 2 of them still running", step,
               *f.n_retired);
        EXPECT(heap_check(h, stderr) == 0, "heap_check");
    }
    sim_stream_complete(prev);
    sim_stream_destroy(prev);
    must_free(h, x, NULL);
    heap_destroy(h);
}

/* A destroyed stream's last work concerns only the blocks cudaFree'd after it was destroyed: a
 * generation closed before (whose frees its events do not cover) settles without it. And a stream
 * destroyed while it captures (no event can be recorded on it) makes device-wide blocks wait for
 * one device synchronize, not for every later free. */
static void test_destroyed_stream_later_generations(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    cua_stream a = stream_made(h, true, false);
    void *x[5], *y = NULL, *big = NULL;
    /* (live memory that keeps the four frees below from being waited for as too many pending) */
    EXPECT(heap_alloc_device_wide(h, 512 << 20, &big) == CUA_SUCCESS, "cudaMalloc");
    for (int i = 0; i < 5; i++) EXPECT(heap_alloc_device_wide(h, 4 << 20, &x[i]) == CUA_SUCCESS, "cudaMalloc");
    (void)event_now(a);
    for (int i = 0; i < 4; i++) EXPECT(heap_free_device_wide(h, x[i]), "cudaFree"); /* the 4th closes it */
    cua_stream s = stream_made(h, true, false);
    cua_event late = event_now(s);
    heap_stream_destroyed(h, s);
    sim_stream_complete(a);
    uint64_t syncs = stats(h).num_syncs;
    size_t reserved = stats(h).reserved_bytes;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &y) == CUA_SUCCESS, "cudaMalloc");
    EXPECT(!event_complete(late) && stats(h).num_syncs == syncs && stats(h).reserved_bytes == reserved,
           "a generation closed before a stream was made and destroyed waited for its work: %llu synchronizes, "
           "%zu -> %zu bytes reserved", (unsigned long long)(stats(h).num_syncs - syncs), reserved,
           stats(h).reserved_bytes);
    EXPECT(y == x[0] || y == x[1] || y == x[2] || y == x[3], "a freed block is reused");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    sim_stream_complete(s);
    sim_stream_destroy(s);
    sim_stream_complete(a);
    heap_stream_destroyed(h, a);
    sim_stream_destroy(a);
    a = stream_made(h, false, false); /* idle from now on: events settle without a wait */
    /* A capturing stream destroyed: one device synchronize settles, then events again. */
    cua_stream cap = stream_made(h, true, false);
    sim_stream_set_capturing(cap, true);
    heap_stream_destroyed(h, cap);
    sim_stream_set_capturing(cap, false);
    sim_stream_destroy(cap);
    for (int round = 0; round < 3; round++) {
        void *p = NULL, *q = NULL;
        EXPECT(heap_alloc_device_wide(h, 8 << 20, &p) == CUA_SUCCESS, "cudaMalloc");
        EXPECT(heap_free_device_wide(h, p), "cudaFree");
        syncs = stats(h).num_syncs;
        for (int i = 0; i < 4; i++) {
            EXPECT(heap_alloc_device_wide(h, 8 << 20, &q) == CUA_SUCCESS, "cudaMalloc");
            EXPECT(heap_free_device_wide(h, q), "cudaFree");
        }
        EXPECT(round == 0 || stats(h).num_syncs == syncs,
               "round %d: %llu device synchronizes after a capturing stream's destroy was settled once", round,
               (unsigned long long)(stats(h).num_syncs - syncs));
    }
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    heap_stream_destroyed(h, a);
    sim_stream_destroy(a);
    heap_destroy(h);
}

/* Classic mode: the first non-blocking stream created while a capture is in progress cannot have
 * the legacy stream synchronized for it, and a block freed on the legacy stream before, which its
 * work still reads, is in the cache. The next cudaMalloc after the capture makes that synchronize
 * before taking the legacy stream's blocks. */
static void test_classic_capture_at_nonblocking_creation(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64,expandable_segments:0", &c);
    cua_stream busy = stream_made(h, true, true);
    void *x = NULL, *y = NULL;
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &x) == CUA_SUCCESS, "cudaMalloc");
    cua_event reader = event_now(NULL); /* a legacy-stream kernel reading x, behind busy's work */
    EXPECT(heap_free_on_legacy(h, x), "cudaFreeAsync(x, 0)");
    sim_stream_set_capturing(busy, true);
    cua_stream nb = stream_made(h, true, false);
    void *during = NULL; /* (a capture in relaxed mode allows it) */
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &during) == CUA_SUCCESS && during != x,
           "classic: cudaMalloc during the capture gave %p, which the legacy stream's work still reads", during);
    sim_stream_set_capturing(busy, false);
    EXPECT(heap_alloc_device_wide(h, 4 << 20, &y) == CUA_SUCCESS, "cudaMalloc");
    EXPECT(y != x || event_complete(reader),
           "classic: cudaMalloc gave %p, which the legacy stream's work still reads, with a non-blocking stream alive", y);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, y, NULL);
    must_free(h, during, NULL);
    sim_stream_complete(busy);
    heap_stream_destroyed(h, busy);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(busy);
    sim_stream_destroy(nb);
    heap_destroy(h);
}

/* cudaMalloc decides under the heap's lock whether a non-blocking stream exists. Thread A creates
 * the first one (the heap synchronizes the legacy stream for it); while it does, thread C frees x
 * on the legacy stream behind a new legacy kernel reading it, and thread B's cudaMalloc waits for
 * the lock. B must not take x as the legacy stream's (the heap's choice made before A's stream). */
static struct {
    heap_t *h;
    void *x, *y;
    cua_event reader;
    int armed;
    pthread_t b, c;
} race;

static void *race_free_x(void *unused) {
    heap_free_on_legacy(race.h, race.x);
    return unused;
}

static void *race_malloc(void *unused) {
    heap_alloc_device_wide(race.h, 4 << 20, &race.y);
    return unused;
}

static cua_result race_paused_sync(int dev, cua_stream s) {
    cua_result r = driver_sim_ops.stream_synchronize(dev, s);
    if (race.armed && !s) {
        race.armed = 0;
        race.reader = event_now(NULL);
        EXPECT(pthread_create(&race.c, NULL, race_free_x, NULL) == 0, "thread C");
        usleep(50000);
        EXPECT(pthread_create(&race.b, NULL, race_malloc, NULL) == 0, "thread B");
        usleep(50000);
    }
    return r;
}

static void test_device_wide_decided_under_lock(void) {
    static driver_ops_t ops;
    for (int attempt = 0; attempt < 3; attempt++) {
        conf_t c;
        ops = driver_sim_ops;
        ops.stream_synchronize = race_paused_sync;
        race.h = test_sim_heap_ops("sim_memory_mb:64", &c, &ops);
        cua_stream busy = stream_made(race.h, true, true);
        void *d0 = NULL;
        race.x = heap_malloc(race.h, 4 << 20, NULL);
        EXPECT(race.x && heap_alloc_device_wide(race.h, 1 << 20, &d0) == CUA_SUCCESS, "allocations");
        race.y = NULL;
        race.armed = 1;
        cua_stream a = stream_made(race.h, true, false); /* thread A */
        EXPECT(pthread_join(race.c, NULL) == 0 && pthread_join(race.b, NULL) == 0, "joins");
        EXPECT(race.y != race.x || event_complete(race.reader),
               "attempt %d: cudaMalloc took %p, which a legacy-stream kernel still reads, with a non-blocking stream "
               "alive", attempt, race.x);
        EXPECT(heap_check(race.h, stderr) == 0, "heap_check");
        sim_stream_complete(busy);
        heap_stream_destroyed(race.h, a);
        heap_stream_destroyed(race.h, busy);
        sim_stream_destroy(a);
        sim_stream_destroy(busy);
        heap_destroy(race.h);
    }
}

/* With a non-blocking stream whose work is in flight, a device-wide freed block goes to nobody
 * without a wait: a request that misses waits for it (one synchronize, as cudaFree itself) instead
 * of mapping new memory, and reuses it. When the stream's work is done at once, the events show it
 * and no synchronize is needed. */
static void test_device_wide_waits_for_nonblocking(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream nb = sim_stream_create(0, true);
    heap_stream_created(h, nb, true);
    void *a = must_alloc(h, 4 << 20, NULL);
    uint64_t syncs = stats(h).num_syncs;
    EXPECT(heap_free_device_wide(h, a), "device-wide free");
    EXPECT(heap_check(h, stderr) == 0, "heap_check after device-wide free");
    EXPECT(stats(h).num_syncs == syncs, "the free itself waits for nothing");
    void *b = must_alloc(h, 4 << 20, nb);
    EXPECT(b == a && stats(h).num_syncs == syncs + 1,
           "a request that misses waits for the pending frees (one synchronize) and reuses the block");
    /* A destroyed non-blocking stream no longer gates device-wide frees. */
    must_free(h, b, nb);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    void *e = must_alloc(h, 4 << 20, NULL);
    uint64_t records = sim_calls(SIM_OP_EVENT_RECORD);
    syncs = stats(h).num_syncs;
    EXPECT(heap_free_device_wide(h, e), "device-wide free");
    void *f = must_alloc(h, 4 << 20, NULL);
    EXPECT(f == e && sim_calls(SIM_OP_EVENT_RECORD) == records + 1 && stats(h).num_syncs == syncs,
           "no non-blocking stream left: reused after one event, on the legacy stream, without a synchronize "
           "(%p vs %p, %llu events, %llu syncs)",
           f, e, (unsigned long long)(sim_calls(SIM_OP_EVENT_RECORD) - records),
           (unsigned long long)(stats(h).num_syncs - syncs));
    must_free(h, f, NULL);
    /* A non-blocking stream whose work is done: the events complete, no synchronize. */
    cua_stream idle = sim_stream_create(0, false);
    heap_stream_created(h, idle, true);
    void *g = must_alloc(h, 4 << 20, NULL);
    EXPECT(heap_free_device_wide(h, g), "device-wide free");
    syncs = stats(h).num_syncs;
    void *g2 = must_alloc(h, 4 << 20, idle);
    EXPECT(g2 == g && stats(h).num_syncs == syncs, "settled by its completed events, without a synchronize");
    must_free(h, g2, idle);
    heap_stream_destroyed(h, idle);
    sim_stream_destroy(idle);
    heap_destroy(h);
}

/* A program that frees device-wide all the time (PyTorch without its cache frees every tensor
 * with cudaFree): blocks freed before the group's events were recorded settle once those complete,
 * although newer frees keep coming; the newer ones wait for the next events (or a synchronize). */
static void test_device_wide_generations(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream nb = sim_stream_create(0, true);
    heap_stream_created(h, nb, true);
    void *old = must_alloc(h, 4 << 20, NULL), *newer = must_alloc(h, 8 << 20, NULL);
    void *keep = must_alloc(h, 2 << 20, NULL); /* keeps the two from merging */
    EXPECT(heap_free_device_wide(h, old), "device-wide free");
    uint64_t syncs = stats(h).num_syncs;
    /* A miss in the small pool (which holds no device-wide block, so nothing to wait for there)
     * records the events that cover `old`. */
    void *m1 = must_alloc(h, 512 << 10, NULL);
    EXPECT(stats(h).num_syncs == syncs, "nothing pending in the small pool: no synchronize");
    EXPECT(heap_free_device_wide(h, newer), "device-wide free after the events");
    EXPECT(heap_check(h, stderr) == 0, "heap_check: two generations");
    sim_stream_complete(nb); /* the events covering `old` complete; `newer` has none yet */
    void *r_old = must_alloc(h, 4 << 20, NULL); /* a miss: settles `old`, covers `newer` */
    EXPECT(r_old == old && stats(h).num_syncs == syncs,
           "the block freed before the events settled without a synchronize (got %p, want %p)", r_old, old);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    void *r_newer = must_alloc(h, 8 << 20, NULL); /* its events are in flight: one synchronize */
    EXPECT(r_newer == newer && stats(h).num_syncs == syncs + 1, "the later block waited for");
    void *all[] = {keep, m1, r_old, r_newer};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) must_free(h, all[i], NULL);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    heap_destroy(h);
}

/* A device-wide block never absorbs a TAG_ANY neighbour: that memory stays usable by every stream
 * while the device-wide block waits. */
static void test_device_wide_keeps_neighbours(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream nb = sim_stream_create(0, true), s = sim_stream_create(0, false);
    heap_stream_created(h, nb, true);
    void *a = must_alloc(h, 4 << 20, s), *b = must_alloc(h, 4 << 20, s);
    /* `a` freed on s and settled to TAG_ANY: s's work completes at once. */
    must_free(h, a, s);
    void *t = must_alloc(h, 16 << 20, NULL); /* a miss: settles s's blocks */
    EXPECT(heap_free_device_wide(h, b), "device-wide free of a's neighbour");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    uint64_t syncs = stats(h).num_syncs;
    void *again = must_alloc(h, 4 << 20, NULL);
    EXPECT(again == a && stats(h).num_syncs == syncs, "the settled neighbour is still free for anyone (got %p, want %p)",
           again, a);
    must_free(h, again, NULL);
    must_free(h, t, NULL);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    sim_stream_destroy(s);
    heap_destroy(h);
}

/* Before mapping, the device-wide blocks are settled with one synchronization, not one per free.
 * (A live 4 GiB block keeps the 200 MiB freed under the bound on waiting device-wide bytes.) */
static void test_device_wide_pressure(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:8192", &c);
    cua_stream nb = sim_stream_create(0, true);
    heap_stream_created(h, nb, true);
    void *ballast = must_alloc(h, (size_t)4 << 30, NULL);
    void *p[100];
    for (int i = 0; i < 100; i++) p[i] = must_alloc(h, 2 << 20, NULL);
    uint64_t syncs = stats(h).num_syncs, records = sim_calls(SIM_OP_EVENT_RECORD);
    for (int i = 0; i < 100; i++) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free %d", i);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(stats(h).num_syncs == syncs && sim_calls(SIM_OP_EVENT_RECORD) - records <= 2,
           "the frees synchronize nothing and record one set of events (the legacy and the non-blocking stream)");
    void *big = must_alloc(h, (size_t)200 << 20, NULL); /* fits in the freed memory: no mapping */
    EXPECT(stats(h).num_syncs - syncs == 1, "pressure synchronized %llu times, want 1",
           (unsigned long long)(stats(h).num_syncs - syncs));
    EXPECT(sim_calls(SIM_OP_EVENT_RECORD) - records <= 2, "events recorded once on the legacy and the non-blocking stream, "
           "while the first set was in flight");
    EXPECT(heap_free_device_wide(h, big) && heap_free_device_wide(h, ballast), "device-wide frees");
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    heap_destroy(h);
}

/* A program that frees device-wide while the device runs far behind: once a pool's waiting bytes
 * pass a sixteenth of its mapped bytes, the host waits for the older generation's events (not for
 * the whole device), so waiting memory stays bounded and is reused without mapping more. With
 * `nstreams` non-blocking streams, each of whose work completes only when waited for: 1, and 70,
 * more than the heap's table of them once held (past it, the group waited for a device
 * synchronize, which also invalidates any capture on a stream the heap had not listed). */
static void device_wide_bounded(int nstreams) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    cua_stream nbs[70];
    for (int i = 0; i < nstreams; i++) {
        nbs[i] = sim_stream_create(0, true);
        heap_stream_created(h, nbs[i], true);
    }
    void *p[64];
    for (int i = 0; i < 64; i++) p[i] = must_alloc(h, 2 << 20, NULL);
    uint64_t waits = sim_calls(SIM_OP_EVENT_SYNC), device_syncs = sim_calls(SIM_OP_DEVICE_SYNC),
             stream_syncs = sim_calls(SIM_OP_STREAM_SYNC);
    cualloc_stats before = stats(h);
    for (int i = 0; i < 64; i++) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free %d", i);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(sim_calls(SIM_OP_EVENT_SYNC) > waits, "%d streams: the frees waited for events", nstreams);
    EXPECT(sim_calls(SIM_OP_DEVICE_SYNC) == device_syncs && sim_calls(SIM_OP_STREAM_SYNC) == stream_syncs,
           "%d streams: but synchronized no stream and not the device", nstreams);
    /* What the waits settled serves new requests without mapping or synchronizing. */
    for (int i = 0; i < 32; i++) p[i] = must_alloc(h, 2 << 20, NULL);
    EXPECT(stats(h).reserved_bytes == before.reserved_bytes, "no new memory mapped (%zu B reserved, was %zu)",
           stats(h).reserved_bytes, before.reserved_bytes);
    EXPECT(sim_calls(SIM_OP_DEVICE_SYNC) == device_syncs, "no device synchronize");
    for (int i = 0; i < 32; i++) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free %d", i);
    for (int i = 0; i < nstreams; i++) {
        heap_stream_destroyed(h, nbs[i]);
        sim_stream_destroy(nbs[i]);
    }
    heap_destroy(h);
}

static void test_device_wide_bounded(void) {
    device_wide_bounded(1);
    device_wide_bounded(70);
}

/* Non-blocking streams the heap was not told of (the front door lost them: heap_streams_untracked):
 * events cannot cover the group, so the bound waits with a device synchronize instead, and the
 * memory is still reused without mapping. */
static void test_device_wide_bounded_overflow(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    cua_stream nb = sim_stream_create(0, true);
    heap_stream_created(h, nb, true);
    heap_streams_untracked(h);
    void *p[64];
    for (int i = 0; i < 64; i++) p[i] = must_alloc(h, 2 << 20, NULL);
    uint64_t device_syncs = sim_calls(SIM_OP_DEVICE_SYNC);
    cualloc_stats before = stats(h);
    for (int i = 0; i < 64; i++) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free %d", i);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    uint64_t waited = sim_calls(SIM_OP_DEVICE_SYNC) - device_syncs;
    EXPECT(waited >= 1 && waited <= 64 / 4, "the bound synchronized the device %llu times (at most once per 4 frees)",
           (unsigned long long)waited);
    for (int i = 0; i < 32; i++) p[i] = must_alloc(h, 2 << 20, NULL);
    EXPECT(stats(h).reserved_bytes == before.reserved_bytes, "no new memory mapped");
    for (int i = 0; i < 32; i++) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free %d", i);
    heap_stream_destroyed(h, nb);
    sim_stream_destroy(nb);
    heap_destroy(h);
}

/* Every stream slot taken by a stream whose free blocks cannot settle (each captures a graph,
 * holding a free block): a stream seen after that gets no tag. Its allocation fails, said as what
 * it is and not as the device running out. A free on a stream with no tag synchronizes the stream
 * first, so that the block is settled, anyone's at once; when the stream cannot be synchronized (the
 * driver refuses, or it captures, when nothing may synchronize it) the block waits for the device
 * instead and is never handed out before the device is known past it. */
static void test_tag_table_full(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    test_captured_t said = {0};
    error_set_callback(test_capture, &said);
    /* u blocking, v and w non-blocking (the device-wide group waits for them); each holds a 6 MiB
     * block and a 2 MiB pin above it, so that the 6 MiB blocks have no free neighbour to merge with. */
    cua_stream u = sim_stream_create(0, true), v = sim_stream_create(0, true), w = sim_stream_create(0, true);
    heap_stream_created(h, v, true);
    heap_stream_created(h, w, true);
    void *a = must_alloc(h, 6 << 20, u), *pin_u = must_alloc(h, 2 << 20, u);
    void *b = must_alloc(h, 6 << 20, v), *pin_v = must_alloc(h, 2 << 20, v);
    void *e = must_alloc(h, 6 << 20, w), *pin_w = must_alloc(h, 2 << 20, w);
    enum { FULL = TAG_STREAMS_END - 1 };
    cua_stream held[FULL];
    for (int i = 0; i < FULL; i++) {
        held[i] = sim_stream_create(0, true);
        void *p = must_alloc(h, 4 << 20, held[i]);
        sim_stream_set_capturing(held[i], true); /* before the free: nothing may settle the block */
        must_free(h, p, held[i]);
    }

    cua_stream x = sim_stream_create(0, true);
    uint64_t ooms = stats(h).num_ooms;
    void *p = NULL;
    EXPECT(heap_alloc(h, 4 << 20, x, &p) != CUA_SUCCESS && !p, "a stream with no tag was served");
    EXPECT(heap_check(h, stderr) == 0, "heap_check after the refusal");
    EXPECT(stats(h).num_ooms == ooms + 1, "the refusal is counted in num_ooms");
    EXPECT(strstr(said.text, "stream slots") && !strstr(said.text, "out of memory"),
           "the refusal was not said as the stream slots running out:\n%s", said.text);

    /* u has no tag now: its free synchronizes u, and the block is settled. */
    uint64_t ss = sim_calls(SIM_OP_STREAM_SYNC), ds = sim_calls(SIM_OP_DEVICE_SYNC);
    must_free(h, a, u);
    EXPECT(sim_calls(SIM_OP_STREAM_SYNC) == ss + 1, "the free on a stream with no tag synchronized it");
    void *a2 = must_alloc(h, 6 << 20, held[0]);
    EXPECT(a2 == a, "the settled block goes to another stream (got %p, expected %p)", a2, a);
    EXPECT(sim_calls(SIM_OP_DEVICE_SYNC) == ds, "and needed no device synchronize");

    /* v's synchronize refused: its block waits for the device. */
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1, CUA_ERROR_INVALID_VALUE);
    must_free(h, b, v);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 0, CUA_SUCCESS);
    ds = sim_calls(SIM_OP_DEVICE_SYNC);
    uint64_t es = sim_calls(SIM_OP_EVENT_SYNC);
    void *b2 = must_alloc(h, 6 << 20, held[1]);
    EXPECT(b2 != b || sim_calls(SIM_OP_DEVICE_SYNC) > ds || sim_calls(SIM_OP_EVENT_SYNC) > es,
           "a block whose stream could not be synchronized was handed out before the device was");

    /* w captures: its free synchronizes nothing, and its block is not handed out. */
    sim_stream_set_capturing(w, true);
    ss = sim_calls(SIM_OP_STREAM_SYNC);
    ds = sim_calls(SIM_OP_DEVICE_SYNC);
    must_free(h, e, w);
    void *e2 = must_alloc(h, 6 << 20, held[2]);
    EXPECT(sim_calls(SIM_OP_STREAM_SYNC) == ss && sim_calls(SIM_OP_DEVICE_SYNC) == ds,
           "a capturing stream was synchronized");
    EXPECT(e2 != e, "a capturing stream's block was handed out");

    for (int i = 0; i < FULL; i++) sim_stream_set_capturing(held[i], false);
    sim_stream_set_capturing(w, false);
    must_free(h, a2, held[0]);
    must_free(h, b2, held[1]);
    must_free(h, e2, held[2]);
    must_free(h, pin_u, u);
    must_free(h, pin_v, v);
    must_free(h, pin_w, w);
    heap_trim(h);
    EXPECT(stats(h).allocated_bytes == 0 && stats(h).reserved_bytes == 0, "everything released at the end");
    error_set_callback(NULL, NULL);
    heap_destroy(h);
    for (int i = 0; i < FULL; i++) sim_stream_destroy(held[i]);
    sim_stream_destroy(u);
    sim_stream_destroy(v);
    sim_stream_destroy(w);
    sim_stream_destroy(x);
}

/* During capture the heap records, queries and synchronizes nothing on the capturing stream. */
static void test_capture_untouched(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    must_free(h, a, s);
    sim_stream_set_capturing(s, true);
    uint64_t rec = sim_calls(SIM_OP_EVENT_RECORD), q = sim_calls(SIM_OP_EVENT_QUERY),
             ss = sim_calls(SIM_OP_STREAM_SYNC), ds = sim_calls(SIM_OP_DEVICE_SYNC);
    void *b = must_alloc(h, 4 << 20, t);
    EXPECT(b != a, "the capturing stream's block stays unsettled");
    heap_trim(h); /* synchronizes the streams whose blocks it would release: not a capturing one */
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(sim_calls(SIM_OP_EVENT_RECORD) == rec && sim_calls(SIM_OP_EVENT_QUERY) == q &&
               sim_calls(SIM_OP_STREAM_SYNC) == ss && sim_calls(SIM_OP_DEVICE_SYNC) == ds,
           "nothing recorded, queried or synchronized during capture");
    void *a2 = must_alloc(h, 4 << 20, s);
    EXPECT(a2 == a, "the capturing stream itself reuses its block");
    must_free(h, a2, s);
    sim_stream_set_capturing(s, false);
    heap_trim(h);
    EXPECT(sim_calls(SIM_OP_STREAM_SYNC) > ss, "after the capture the stream is synchronized as usual");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, b, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* A device synchronize joins any capture in progress on the device, which CUDA then invalidates.
 * Device-wide frees are waiting and the heap is trimmed while a stream captures: a blocking stream
 * the heap knows only as created (the legacy stream's capture query then fails), and a
 * non-blocking one it knows only by the blocks it allocated. No capture may be broken. */
static void test_capture_no_device_sync(bool blocking) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream n = sim_stream_create(0, true), cap = sim_stream_create(0, true);
    heap_stream_created(h, n, true); /* a non-blocking stream: cudaFree is device-wide */
    if (blocking) {
        sim_stream_set_blocking(cap, true);
        heap_stream_created(h, cap, false);
    } else {
        must_free(h, must_alloc(h, 2 << 20, cap), cap); /* known by its tag, not registered */
    }
    void *x = must_alloc(h, 8 << 20, NULL);
    uint64_t broken = sim_captures_broken();
    sim_stream_set_capturing(cap, true);
    EXPECT(heap_free_device_wide(h, x), "device-wide free");
    heap_trim(h);
    void *y = must_alloc(h, 64 << 20, NULL);
    EXPECT(sim_captures_broken() == broken, "%s stream's capture was broken by a device synchronize",
           blocking ? "a blocking" : "a non-blocking");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    sim_stream_set_capturing(cap, false);
    must_free(h, y, NULL);
    heap_trim(h);
    EXPECT(heap_check(h, stderr) == 0 && stats(h).allocated_bytes == 0, "after the capture");
    heap_destroy(h);
    sim_stream_destroy(n);
    sim_stream_destroy(cap);
}

/* The same with the streams untracked (device-wide frees bounded by synchronizing the device) and
 * the capturing stream's only free memory parked on its quick lists: no free bytes in its index,
 * yet a stream the heap knows. `parked` false is the control, a 4 MiB block in the index. */
static void test_capture_parked_no_device_sync(bool parked) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    heap_streams_untracked(h);
    cua_stream s = sim_stream_create(0, true), u = sim_stream_create(0, false);
    void *x[8];
    for (int i = 0; i < 8; i++) x[i] = must_alloc(h, 8 << 20, NULL);
    /* u's memory, settled when u goes, leaves device-wide frees something to wait for. */
    void *ua = must_alloc(h, 64 << 10, u), *ub = must_alloc(h, 8 << 20, u);
    must_free(h, ua, u);
    must_free(h, ub, u);
    heap_stream_destroyed(h, u);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, must_alloc(h, parked ? 64 << 10 : 4 << 20, s), s);
    sim_stream_set_capturing(s, true);
    uint64_t broken = sim_captures_broken();
    for (int i = 0; i < 8; i++) {
        EXPECT(heap_free_device_wide(h, x[i]), "device-wide free");
        EXPECT(heap_check(h, stderr) == 0, "heap_check");
    }
    EXPECT(sim_captures_broken() == broken, "a device synchronize broke the capture of a stream whose free memory is %s",
           parked ? "parked" : "in its index");
    sim_stream_set_capturing(s, false);
    heap_trim(h);
    EXPECT(heap_check(h, stderr) == 0 && stats(h).allocated_bytes == 0, "after the capture");
    heap_destroy(h);
    sim_stream_destroy(s);
}

/* A stream destroyed while its freed blocks wait for its work, and its synchronize refused: the
 * blocks settle only once the device is seen idle, never by the destroy alone. */
static void test_stream_destroyed_sync_refused(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    must_free(h, a, s); /* s's work on it is still in flight (held) */
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1, CUA_ERROR_INVALID_VALUE);
    uint64_t ds = sim_calls(SIM_OP_DEVICE_SYNC);
    heap_stream_destroyed(h, s);
    void *b = must_alloc(h, 4 << 20, t);
    EXPECT(b != a || sim_calls(SIM_OP_DEVICE_SYNC) > ds, "another stream got the block before s's work was seen done");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, b, t);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* A stream destroyed while its freed blocks wait for its work, with its synchronize refused and a
 * capture in progress on another stream (so no device synchronize either): its work runs on after
 * the destroy. Its handle, given again to a new stream, must not find the old blocks (the new
 * stream's work is not ordered after the old one's), and its generations stay consistent: the
 * closed one keeps its open partner, even with no blocks of its own (!open_blocks). They settle
 * once the device is seen idle. */
static void stream_destroyed_unprovable(const char *conf_text, bool open_blocks) {
    conf_t c;
    heap_t *h = test_sim_heap(conf_text, &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true), cap = sim_stream_create(0, true);
    heap_stream_created(h, cap, true);
    void *a = must_alloc(h, 4 << 20, s), *keep = must_alloc(h, 2 << 20, s), *newer = must_alloc(h, 8 << 20, s);
    must_free(h, a, s);
    void *b1 = must_alloc(h, 16 << 20, t); /* VMM: closes s's tag, `a` in its closed generation */
    if (open_blocks) must_free(h, newer, s); /* in s's open one; s's work on both is in flight (held) */
    sim_stream_set_capturing(cap, true);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1, CUA_ERROR_INVALID_VALUE);
    heap_stream_destroyed(h, s);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 0, CUA_SUCCESS);
    EXPECT(heap_check(h, stderr) == 0, "heap_check after destroying a stream that could not be synchronized");
    heap_stream_created(h, s, true); /* the handle comes back for a new stream */
    void *b2 = must_alloc(h, 4 << 20, s), *b3 = must_alloc(h, 8 << 20, s);
    /* [a, a + 4 MiB) and, when freed, [newer, newer + 8 MiB) are the old stream's */
    for (int i = 0; i < 2; i++) {
        uintptr_t lo = (uintptr_t)(i ? b3 : b2), hi = lo + ((size_t)(i ? 8 : 4) << 20);
        bool on_a = lo < (uintptr_t)a + (4 << 20) && (uintptr_t)a < hi;
        bool on_newer = open_blocks && lo < (uintptr_t)newer + (8 << 20) && (uintptr_t)newer < hi;
        EXPECT(!on_a && !on_newer, "the new stream with the old handle got %#lx, on the old stream's blocks (%p, %p), "
               "while that stream's work was in flight", (unsigned long)lo, a, newer);
    }
    EXPECT(sim_captures_broken() == 0, "the capture was left alone");
    sim_stream_set_capturing(cap, false);
    must_free(h, b2, s);
    must_free(h, b3, s);
    if (!open_blocks) must_free(h, newer, s);
    must_free(h, keep, s);
    must_free(h, b1, t);
    heap_trim(h); /* synchronizes the device: every block settles and is released */
    EXPECT(heap_check(h, stderr) == 0, "heap_check after the trim");
    EXPECT(stats(h).reserved_bytes == 0 || !heap_is_vmm(h), "%zu B still reserved after the trim",
           stats(h).reserved_bytes);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
    sim_stream_destroy(cap);
}

/* Classic mode: a block allocated on s and freed on t goes back to s once t is synchronized; when
 * t's synchronize is refused, s may not reuse it before t's work is seen done. */
static void test_classic_cross_free_sync_refused(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64,expandable_segments:False", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = must_alloc(h, 4 << 20, s);
    sim_fail(SIM_OP_STREAM_SYNC, 0, 1, CUA_ERROR_INVALID_VALUE);
    must_free(h, a, t); /* t's work on it is in flight */
    uint64_t ds = sim_calls(SIM_OP_DEVICE_SYNC), es = sim_calls(SIM_OP_EVENT_SYNC);
    void *b = must_alloc(h, 4 << 20, s);
    EXPECT(b != a || sim_calls(SIM_OP_DEVICE_SYNC) > ds || sim_calls(SIM_OP_EVENT_SYNC) > es,
           "s reused the block before t's work was seen done");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, b, s);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

/* Peer access: the heap re-grants its mapped ranges once a peer is enabled. */
static void test_peer_enabled(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64,sim_devices:2", &c);
    void *a = must_alloc(h, 4 << 20, NULL);
    EXPECT(sim_range_accessible_from(0, (cua_devptr)(uintptr_t)a, 4 << 20), "the owner has access");
    EXPECT(!sim_range_accessible_from(1, (cua_devptr)(uintptr_t)a, 4 << 20), "device 1 has none yet");
    uint64_t grants = sim_calls(SIM_OP_SET_ACCESS);
    EXPECT(driver_sim_ops.peer_enable(0, 1) == CUA_SUCCESS && sim_peer_mask(0) == 2, "peer_enable");
    heap_peer_enabled(h);
    EXPECT(sim_calls(SIM_OP_SET_ACCESS) > grants, "set_access called again");
    EXPECT(sim_range_accessible_from(1, (cua_devptr)(uintptr_t)a, 4 << 20), "device 1 reaches existing memory");
    void *b = must_alloc(h, 64 << 20 >> 2, NULL);
    EXPECT(sim_range_accessible_from(1, (cua_devptr)(uintptr_t)b, 16 << 20), "and new mappings");
    EXPECT(driver_sim_ops.peer_enable(0, 0) != CUA_SUCCESS && driver_sim_ops.peer_enable(0, 2) != CUA_SUCCESS,
           "a device is not its own peer; device 2 does not exist");
    must_free(h, a, NULL);
    must_free(h, b, NULL);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    heap_destroy(h);
}

/* A freed block parked on a quick list is free: freeing it again is refused, it has no size, and
 * the statistics count it as free (heap_check compares them with the blocks after every step). */
static void test_parked_block_is_free(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, true);
    void *p = must_alloc(h, 300 << 10, s);
    must_free(h, p, s);
    cualloc_stats st = stats(h);
    EXPECT(!heap_free(h, p, s), "a second free of a parked block is refused");
    EXPECT(!heap_free_device_wide(h, p), "and a device-wide one too");
    EXPECT(heap_block_size(h, p) == SIZE_MAX, "a parked block has no requested size");
    uintptr_t base;
    size_t size;
    EXPECT(!heap_block_range(h, p, &base, &size), "nor an allocated range");
    EXPECT(heap_holds(h, p) && heap_holds(h, (char *)p + 1000), "though the heap still holds its memory");
    EXPECT(heap_test_find_block(h, p) == NULL, "nor an allocated block");
    cualloc_stats st2 = stats(h);
    EXPECT(st2.num_frees == st.num_frees && st2.allocated_bytes == 0 && st2.requested_bytes == 0 &&
               st2.active_bytes == 0 && st2.active_peak == st2.allocated_peak && st2.allocated_peak == (300u << 10),
           "the refused frees changed nothing; active equals allocated");
    /* Parked, the block keeps its chunk from being releasable (a flush would merge it first). */
    EXPECT(st2.inactive_split_bytes == st2.reserved_bytes && st2.reserved_bytes > 0,
           "the parked block's chunk counts as inactive split: %zu of %zu", st2.inactive_split_bytes, st2.reserved_bytes);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    void *q = must_alloc(h, 300 << 10, s);
    EXPECT(q == p, "the same stream takes the parked block again");
    st2 = stats(h);
    EXPECT(st2.allocated_bytes == (300u << 10) && st2.inactive_split_bytes == st2.reserved_bytes - st2.allocated_bytes &&
               st2.num_allocs == 2,
           "and it is allocated again");
    must_free(h, q, s);
    heap_trim(h);
    EXPECT(heap_check(h, stderr) == 0 && stats(h).reserved_bytes == 0, "trim releases parked blocks too");
    heap_destroy(h);
    sim_stream_destroy(s);
}

typedef struct {
    heap_t *h;
    cua_stream stream;
    size_t size;
    void *p;
} big_alloc_t;

static void *big_alloc_thread(void *arg) {
    big_alloc_t *a = arg;
    if (heap_alloc(a->h, a->size, a->stream, &a->p) != CUA_SUCCESS) a->p = NULL;
    return NULL;
}

/* Memory parked on quick lists, by many sizes and two streams, is reclaimed by another thread's
 * allocation that needs nearly all of the device: the lists are merged back, the streams' blocks
 * settled, nothing new is mapped beyond the cap, and no OOM is reported. */
static void test_parked_memory_reclaimed(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:64", &c);
    cua_stream s = sim_stream_create(0, false), t = sim_stream_create(0, false), u = sim_stream_create(0, false);
    void *ptrs[96];
    size_t n = 0, total = 0;
    for (size_t i = 0; n < 96 && total < (56u << 20); i++) {
        size_t size = ((i % 24) + 1) * (48u << 10) + (i % 3) * 4096; /* small-pool sizes */
        if (i % 5 == 4) size = ((i % 4) + 2) << 20;                  /* and large-pool ones */
        ptrs[n++] = must_alloc(h, size, i % 2 ? s : t);
        total += size;
    }
    for (size_t i = 0; i < n; i++) must_free(h, ptrs[i], i % 2 ? s : t);
    EXPECT(stats(h).allocated_bytes == 0, "everything freed");
    big_alloc_t a = {h, u, 60u << 20, NULL};
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, big_alloc_thread, &a) == 0, "pthread_create");
    pthread_join(th, NULL);
    EXPECT(a.p != NULL, "a 60 MiB request on a third stream reclaims the parked memory");
    cualloc_stats st = stats(h);
    EXPECT(st.num_ooms == 0 && st.reserved_bytes <= (64u << 20), "no OOM, reserved %zu within the device", st.reserved_bytes);
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    must_free(h, a.p, u);
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
    sim_stream_destroy(u);
}

int main(void) {
    test_parked_block_is_free();
    test_parked_memory_reclaimed();
    test_split_coalesce("sim_memory_mb:64");
    test_split_coalesce("sim_memory_mb:64,expandable_segments:0");
    test_max_split_bounded();
    test_same_stream_reuse();
    test_training_steps();
    test_cross_stream_waits_for_event();
    test_event_covers_only_earlier_frees();
    test_stream_generations();
    test_handover_rounds();
    test_quick_lists_handed_over();
    test_stream_destroyed_with_closed_generation();
    test_pressure_synchronizes();
    test_pressure_stream_sync_refused();
    test_trim_synchronizes_first();
    test_stream_destroyed();
    test_many_streams();
    test_many_streams_classic();
    test_classic_owns_segment_base();
    test_device_wide_without_nonblocking();
    test_device_wide_alloc();
    test_classic_legacy_free();
    test_destroyed_stream_then_cudafree("sim_memory_mb:64");
    test_destroyed_stream_then_cudafree("sim_memory_mb:64,expandable_segments:0");
    test_classic_capture_at_nonblocking_creation();
    test_destroyed_streams_bounded();
    test_classic_free_on_blocking_stream();
    test_destroyed_stream_later_generations();
    test_device_wide_decided_under_lock();
    test_device_wide_waits_for_nonblocking();
    test_device_wide_generations();
    test_device_wide_keeps_neighbours();
    test_device_wide_pressure();
    test_device_wide_bounded();
    test_device_wide_bounded_overflow();
    test_capture_untouched();
    test_capture_no_device_sync(true);
    test_capture_no_device_sync(false);
    test_capture_parked_no_device_sync(false);
    test_capture_parked_no_device_sync(true);
    test_stream_destroyed_sync_refused();
    stream_destroyed_unprovable("sim_memory_mb:64", true);
    stream_destroyed_unprovable("sim_memory_mb:64", false);
    stream_destroyed_unprovable("sim_memory_mb:64,expandable_segments:False", true);
    test_classic_cross_free_sync_refused();
    test_tag_table_full();
    test_peer_enabled();
    bool usable;
    EXPECT(fragmentation_trap("sim_memory_mb:4096", &usable), "expandable segments serve the 900 MiB request");
    EXPECT(usable, "and the heap goes on");
    EXPECT(!fragmentation_trap("sim_memory_mb:4096,expandable_segments:False", &usable),
           "classic mode fails the 900 MiB request, as PyTorch's default allocator would");
    EXPECT(usable, "and the heap is still usable after its OOM");
    /* The second fix its report gives (a segment of 1000 MiB carved by the 100 MiB blocks):
     * max_split_size_mb:512 keeps that segment whole, and the 900 MiB request is served. */
    EXPECT(fragmentation_trap("sim_memory_mb:4096,expandable_segments:False,max_split_size_mb:512", &usable),
           "classic mode with the max_split_size_mb the report advises serves the 900 MiB request");
    EXPECT(usable, "and the heap goes on");
    printf("test_streams: ok\n");
    return 0;
}
