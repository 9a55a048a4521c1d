/* test_stress.c — 8 threads on two devices and several streams allocate, write, verify and free at
 * random (some frees cross streams and threads through a shared hand-off slot), while another
 * thread trims and runs the checker. Half the threads' own streams are held: their work completes
 * only when the thread says so, every 64 operations, so other threads' misses close those streams'
 * generations and find them in flight. Built under TSan in CI. At the end the counters must add up
 * and every byte must come back. */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "testutil.h"

#define THREADS 8
#define OPS 20000
#define SLOTS 32

static heap_t *heaps[2];
static cua_stream shared_stream[2]; /* one per device: a stream belongs to one device */
static _Atomic(uintptr_t) handoff[2]; /* a block passed to another thread to free */
static _Atomic uint64_t total_allocs, total_frees, handoff_size[2];
static _Atomic int running;

typedef struct { int id; uint64_t seed; } worker_arg_t;

static void fill(void *p, size_t n, unsigned char v) { memset(p, v, n < 4096 ? n : 4096); }
static void verify(const void *p, size_t n, unsigned char v) {
    const unsigned char *c = p;
    for (size_t i = 0; i < (n < 4096 ? n : 4096); i++) EXPECT(c[i] == v, "byte %zu of %p overwritten", i, p);
}

static void *worker(void *argp) {
    worker_arg_t *arg = argp;
    rng_t r = {arg->seed};
    bool held = arg->id % 2;
    cua_stream own_streams[2] = {sim_stream_create(0, held), sim_stream_create(1, held)};
    struct { void *p; size_t n; int dev; } slots[SLOTS] = {{0}};
    for (int op = 0; op < OPS; op++) {
        int i = (int)rng_below(&r, SLOTS);
        if (slots[i].p) {
            verify(slots[i].p, slots[i].n, (unsigned char)(arg->id + 1));
            cua_stream s = rng_below(&r, 8) ? own_streams[slots[i].dev] : shared_stream[slots[i].dev];
            EXPECT(heap_free(heaps[slots[i].dev], slots[i].p, s), "free refused");
            total_frees++;
            slots[i].p = NULL;
        } else {
            int dev = (int)rng_below(&r, 2);
            size_t n = rng_tensor_size(&r, 4 << 20);
            void *p = NULL;
            if (heap_alloc(heaps[dev], n, rng_below(&r, 8) ? own_streams[dev] : shared_stream[dev], &p) == CUA_SUCCESS) {
                total_allocs++;
                fill(p, n, (unsigned char)(arg->id + 1));
                /* Sometimes hand the block to whichever thread comes next. */
                uintptr_t expected = 0;
                if (n && rng_below(&r, 16) == 0 && atomic_compare_exchange_strong(&handoff[dev], &expected, (uintptr_t)p)) {
                    handoff_size[dev] = n;
                } else {
                    slots[i].p = p;
                    slots[i].n = n;
                    slots[i].dev = dev;
                }
            }
        }
        if (held && op % 64 == 63) {
            sim_stream_complete(own_streams[0]);
            sim_stream_complete(own_streams[1]);
        }
        int d = (int)rng_below(&r, 2);
        uintptr_t taken = atomic_exchange(&handoff[d], 0);
        if (taken) {
            EXPECT(heap_free(heaps[d], (void *)taken, own_streams[d]), "hand-off free refused");
            total_frees++;
        }
    }
    for (int i = 0; i < SLOTS; i++) {
        if (!slots[i].p) continue;
        verify(slots[i].p, slots[i].n, (unsigned char)(arg->id + 1));
        EXPECT(heap_free(heaps[slots[i].dev], slots[i].p, own_streams[slots[i].dev]), "final free refused");
        total_frees++;
    }
    return NULL;
}

static void *janitor(void *unused) {
    (void)unused;
    while (running) {
        for (int d = 0; d < 2; d++) {
            heap_trim(heaps[d]);
            EXPECT(heap_check(heaps[d], stderr) == 0, "heap_check during the stress run");
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(void) {
    uint64_t seed = test_seed("test_stress");
    conf_t c;
    conf_defaults(&c);
    c.driver = DRIVER_SIM;
    EXPECT(conf_parse("sim_memory_mb:1024,sim_host_backed:1,sim_devices:2", &c) == 0, "configuration");
    sim_configure(&c);
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    conf_t classic = c;
    classic.expandable_segments = false;
    heaps[0] = heap_create(0, &c, &driver_sim_ops, NULL);
    heaps[1] = heap_create(1, &classic, &driver_sim_ops, NULL);
    EXPECT(heaps[0] && heaps[1], "heaps");
    shared_stream[0] = sim_stream_create(0, false);
    shared_stream[1] = sim_stream_create(1, false);
    pthread_t th[THREADS], jt;
    worker_arg_t args[THREADS];
    running = 1;
    EXPECT(pthread_create(&jt, NULL, janitor, NULL) == 0, "janitor");
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg_t){i, seed + (uint64_t)i * 7919};
        EXPECT(pthread_create(&th[i], NULL, worker, &args[i]) == 0, "thread");
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    running = 0;
    pthread_join(jt, NULL);
    for (int d = 0; d < 2; d++) {
        uintptr_t left = atomic_exchange(&handoff[d], 0);
        if (left) {
            EXPECT(heap_free(heaps[d], (void *)left, NULL), "leftover hand-off");
            total_frees++;
        }
    }
    uint64_t allocs = 0, frees = 0;
    for (int d = 0; d < 2; d++) {
        EXPECT(heap_check(heaps[d], stderr) == 0, "final heap_check");
        heap_trim(heaps[d]);
        cualloc_stats s;
        heap_get_stats(heaps[d], &s);
        if (s.allocated_bytes || s.reserved_bytes) { stats_write_text(&s, d, stderr); heap_dump(heaps[d], stderr); }
        EXPECT(s.allocated_bytes == 0 && s.requested_bytes == 0 && s.reserved_bytes == 0, "device %d not empty", d);
        allocs += s.num_allocs;
        frees += s.num_frees;
        heap_destroy(heaps[d]);
        EXPECT(sim_used_bytes(d) == 0, "device %d memory leaked", d);
    }
    EXPECT(allocs == total_allocs && frees == total_frees && allocs == frees, "counts: %llu allocs %llu frees, threads saw %llu/%llu",
           (unsigned long long)allocs, (unsigned long long)frees, (unsigned long long)total_allocs,
           (unsigned long long)total_frees);
    printf("test_stress: ok (%llu allocations over %d threads, 2 devices; %llu events recorded, %llu queried)\n",
           (unsigned long long)allocs, THREADS, (unsigned long long)sim_calls(SIM_OP_EVENT_RECORD),
           (unsigned long long)sim_calls(SIM_OP_EVENT_QUERY));
    return 0;
}
