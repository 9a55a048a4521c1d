/* interpose_driver_prog.c — the driver API front door (suite 'interpose'): like the CUDA runtime,
 * dlopens libcuda.so.1 (the fake, tests/fakecuda), takes cuGetProcAddress_v2 from it with dlsym and
 * fetches cuMemAlloc (at 3020), cuMemFree, cuMemAllocAsync and cuMemFreeAsync (flags 0 and 2, the
 * per-thread default stream) through it. Run with libcualloc.so in LD_PRELOAD and
 * CUALLOC_CONF=driver:cuda,sim_host_backed:1 (cualloc's own backend then runs on the fake too).
 * Checks that the functions handed out are cualloc's, that they serve memory from cualloc (its
 * statistics move, the fake's cuMemAlloc counter does not), that a pointer from the driver itself
 * is passed to the real cuMemFree, that two threads' per-thread default streams are kept apart, and that
 * without a current context cuMemAlloc answers as CUDA.
 *   --stream-device    (two devices) an allocation on a stream comes from the stream's device
 *   --runtime-context  a thread's first runtime allocation leaves the primary context current
 *   --device-reset     allocations after a reset of the primary context are usable memory
 *   --runtime-calls    the driver calls a runtime allocation cualloc serves makes, counted
 *   --address-range    cuMemGetAddressRange of live, freed and foreign memory
 *   --streams-first    100 non-blocking streams created before cualloc starts, one capturing
 *   --streams-lost before|after
 *                      the same, with the first stream's table entry refused (tests/failing_mmap.c
 *                      preloaded): before cualloc starts (the front door's table) or after (the heap's)
 *   --capture-elsewhere  one stream captures (in global mode, as the fake takes every capture) while
 *                      the program frees on two other streams, trims and misses the cache: cualloc's
 *                      event queries and synchronizes must not invalidate the capture
 *   --host-oom         a training-shaped mix whose every allocation is usable memory or an out-of-
 *                      memory error (tests/check_library_host_oom.sh refuses cualloc's host memory)
 *   --mem-pool         stream-ordered allocations pass through to CUDA while the program has made
 *                      another pool than the default the device's current one (cuDeviceSetMemPool,
 *                      cudaMallocAsync alike), and cualloc serves them again once the default is back */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "softcheck.h"

/* libdriver_rt.so's (tests/driver_runtime.c), unless cualloc interposes them. */
int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
int cudaMalloc(void **p, size_t n);
int cudaMallocAsync(void **p, size_t n, void *stream);
int cudaFree(void *p);
int cudaFreeAsync(void *p, void *stream);
int cudaGetLastError(void);
int cudaDeviceReset(void);
void driver_rt_fail_init(int e);
unsigned long driver_rt_inits(void);

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUcontext;
typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext *, int);
typedef CUresult (*setcur_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*direct_fn)(int, size_t, CUdeviceptr *);
typedef uint64_t (*calls_fn)(int);
/* The fake driver's call counter by operation (fakecuda_calls); NULL, a failure counted, without it. */
#define FAKE_CALLS(lib) fake_calls_of(lib, __FILE__, __LINE__)
typedef struct {
    size_t gauges[10];
    size_t largest_free_block, capacity_bytes;
    uint64_t num_allocs, num_frees, rest[6];
} stats_mirror;
typedef int (*get_stats_fn)(int, stats_mirror *);

/* sim_op_t (src/internal.h): the fake's counters by operation. */
#define OP_MEM_ALLOC 7
#define OP_MEM_FREE 8
#define OP_EVENT_RECORD 10
#define OP_STREAM_SYNC 12
#define OP_DEVICE_SYNC 13


#define AS(fnptr, p) memcpy(&(fnptr), &(p), sizeof(p))

static calls_fn fake_calls_of(void *lib, const char *file, int line) {
    calls_fn f;
    void *p = dlsym(lib, "fakecuda_calls");
    AS(f, p);
    if (!f) {
        fprintf(stderr, "%s:%d: the fake driver has no fakecuda_calls\n", file, line);
        failures++;
    }
    return f;
}
/* fnptr = the entry point cuGetProcAddress (gpa) gives for name at CUDA version `version` */
#define LOOKUP(fnptr, name, version)                                                      \
    do {                                                                                  \
        CHECK_MSG(gpa(name, &q, version, 0, NULL) == 0, name);                            \
        AS(fnptr, q);                                                                     \
    } while (0)

/* Threads A and B, each on its per-thread default stream (the _ptsz entry points, stream NULL). */
static CUcontext pt_ctx;
static alloc_async_fn pt_alloc;
static free_async_fn pt_free;
static setcur_fn pt_setcur;
static CUdeviceptr pt_a, pt_b;
static void *pt_thread_a(void *unused) {
    (void)unused;
    pt_setcur(pt_ctx);
    if (pt_alloc(&pt_a, 1 << 20, NULL) == 0) pt_free(pt_a, NULL);
    return NULL;
}
static void *pt_thread_b(void *unused) {
    (void)unused;
    pt_setcur(pt_ctx);
    pt_alloc(&pt_b, 1 << 20, NULL);
    return NULL;
}

/* --runtime-context: what a thread's first runtime allocation leaves current. */
typedef struct {
    int (*get_current)(CUcontext *);
    CUcontext primary;     /* device 0's primary context */
    int malloc_rc, async_rc;
    CUcontext after_malloc, after_async;
} rt_ctx_t;
static void *rt_ctx_thread(void *arg) {
    rt_ctx_t *t = arg;
    void *p = NULL;
    CUcontext before = (CUcontext)1;
    CHECK_MSG(t->get_current(&before) == 0 && before == NULL, "a new thread has no current context");
    t->malloc_rc = cudaMalloc(&p, 1 << 20);
    t->get_current(&t->after_malloc);
    if (t->malloc_rc == 0) CHECK_MSG(cudaFree(p) == 0, "cudaFree");
    return NULL;
}
static void *rt_ctx_async_thread(void *arg) {
    rt_ctx_t *t = arg;
    void *p = NULL;
    t->async_rc = cudaMallocAsync(&p, 1 << 20, NULL);
    t->get_current(&t->after_async);
    if (t->async_rc == 0) CHECK_MSG(cudaFreeAsync(p, NULL) == 0, "cudaFreeAsync");
    return NULL;
}

static int from_cualloc(void *fn) {
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libcualloc");
}

static get_stats_fn get_stats;
static uint64_t allocs_on(int dev) {
    stats_mirror s;
    memset(&s, 0, sizeof s);
    return get_stats && get_stats(dev, &s) == 0 ? s.num_allocs : 0;
}
static uint64_t allocs_now(void) { return allocs_on(0); }

/* --stream-device (two devices): an allocation on a stream of device 1 while device 0's context is
 * current comes from device 1, as CUDA serves it from the stream's device. */
static int stream_device_main(gpa_fn gpa, void *lib) {
    void *q;
    init_fn cu_init;
    retain_fn retain;
    setcur_fn setcur;
    alloc_async_fn alloc_async;
    free_async_fn free_async;
    CUresult (*stream_create)(CUstream *, unsigned);
    LOOKUP(cu_init, "cuInit", 12000);
    LOOKUP(retain, "cuDevicePrimaryCtxRetain", 12000);
    LOOKUP(setcur, "cuCtxSetCurrent", 12000);
    LOOKUP(stream_create, "cuStreamCreate", 12000);
    CHECK_MSG(gpa("cuMemAllocAsync", &q, 11020, 0, NULL) == 0 && from_cualloc(q), "cuMemAllocAsync");
    AS(alloc_async, q);
    CHECK_MSG(gpa("cuMemFreeAsync", &q, 11020, 0, NULL) == 0 && from_cualloc(q), "cuMemFreeAsync");
    AS(free_async, q);
    if (failures) return 1;
    CUcontext c0 = NULL, c1 = NULL;
    CUstream s1 = NULL;
    CHECK_MSG(cu_init(0) == 0 && retain(&c0, 0) == 0 && retain(&c1, 1) == 0, "two primary contexts");
    CHECK_MSG(setcur(c1) == 0 && stream_create(&s1, 0) == 0 && setcur(c0) == 0, "a stream of device 1");
    CUdeviceptr d = 0;
    uint64_t on0 = allocs_on(0), on1 = allocs_on(1);
    CHECK_MSG(alloc_async(&d, 1 << 20, s1) == 0 && d, "cuMemAllocAsync on device 1's stream");
    CHECK_MSG(allocs_on(1) == on1 + 1 && allocs_on(0) == on0, "served by device %s, not by the stream's device 1",
              allocs_on(0) != on0 ? "0 (the current one)" : "none");
    CHECK_MSG(free_async(d, s1) == 0, "free");
    /* A block of device 0 freed on device 1's stream (CUDA allows it): device 0's heap cannot record
     * its events on that stream, so the free waits for the stream first and the block is device
     * 0's again at once, not stranded behind a stream it can never look at. */
    CUdeviceptr x = 0, y = 0;
    CHECK_MSG(alloc_async(&x, 3 << 20, NULL) == 0 && x && allocs_on(0) == on0 + 1, "cuMemAllocAsync on device 0");
    CHECK_MSG(free_async(x, s1) == 0, "cuMemFreeAsync of device 0's block on device 1's stream");
    CHECK_MSG(alloc_async(&y, 3 << 20, NULL) == 0 && y == x, "device 0's next request got %#llx, not the block %#llx "
              "freed on device 1's stream", (unsigned long long)y, (unsigned long long)x);
    if (y) CHECK_MSG(free_async(y, NULL) == 0, "free");
    /* A block of device 1 freed on the legacy stream while device 0's context is current: the
     * handle names the current device's legacy stream, whose work device 1's heap cannot see, so
     * device 1's next allocation may take the block only after that stream was waited for. */
    calls_fn fake_calls = FAKE_CALLS(lib);
    if (failures) return 1;
    CUdeviceptr a = 0, b = 0;
    CHECK_MSG(setcur(c1) == 0 && alloc_async(&a, 3 << 20, NULL) == 0 && a && setcur(c0) == 0,
              "cuMemAllocAsync on device 1's legacy stream");
    uint64_t syncs = fake_calls(OP_STREAM_SYNC) + fake_calls(OP_DEVICE_SYNC);
    CHECK_MSG(free_async(a, NULL) == 0, "cuMemFreeAsync of device 1's block on the legacy stream, device 0 current");
    CHECK_MSG(setcur(c1) == 0 && alloc_async(&b, 3 << 20, NULL) == 0 && b, "device 1's next allocation");
    CHECK_MSG(b != a || fake_calls(OP_STREAM_SYNC) + fake_calls(OP_DEVICE_SYNC) > syncs,
              "device 1's next allocation took the block freed on device 0's legacy stream without waiting for it");
    if (b) CHECK_MSG(free_async(b, NULL) == 0, "free");
    CHECK_MSG(setcur(c0) == 0, "device 0 current again");
    if (failures) return 1;
    printf("interpose_driver_prog --stream-device: all checks passed\n");
    return 0;
}

/* --runtime-context: a runtime allocation cualloc serves leaves the calling thread as CUDA's
 * runtime leaves it. cudaMalloc needs an active context, so the runtime makes the current device's
 * primary context current on a thread that has none (CUDA Runtime API, "Interactions with the CUDA
 * Driver API"): a program that allocates first and then uses the driver API (cuModuleLoadData,
 * cuLaunchKernel, cuMemsetD8 ...) relies on it. A runtime that cannot initialize (a driver older
 * than the runtime) fails the allocation with its error, which is also the thread's last error. */
static int runtime_context_main(gpa_fn gpa) {
    void *q;
    rt_ctx_t t;
    memset(&t, 0, sizeof t);
    CHECK_MSG(gpa("cuCtxGetCurrent", &q, 4000, 0, NULL) == 0, "cuCtxGetCurrent");
    AS(t.get_current, q);
    if (failures) return 1;
    pthread_t th;
    uint64_t a0 = allocs_now();
    CHECK_MSG(pthread_create(&th, NULL, rt_ctx_thread, &t) == 0 && pthread_join(th, NULL) == 0, "thread");
    CHECK_MSG(t.malloc_rc == 0 && allocs_now() == a0 + 1, "cudaMalloc = %d, served by cualloc: %llu", t.malloc_rc,
              (unsigned long long)(allocs_now() - a0));
    retain_fn retain;
    LOOKUP(retain, "cuDevicePrimaryCtxRetain", 7000);
    CHECK_MSG(retain(&t.primary, 0) == 0 && t.primary, "device 0's primary context");
    CHECK_MSG(t.after_malloc == t.primary, "after a thread's first cudaMalloc its current context is %p, want device "
              "0's primary context %p (the runtime makes it current)", t.after_malloc, t.primary);
    CHECK_MSG(pthread_create(&th, NULL, rt_ctx_async_thread, &t) == 0 && pthread_join(th, NULL) == 0, "thread");
    CHECK_MSG(t.async_rc == 0 && t.after_async == t.primary, "after a thread's first cudaMallocAsync: %d, context %p, "
              "want 0 and %p", t.async_rc, t.after_async, t.primary);

    /* A thread with a current context: the runtime is not asked again. */
    unsigned long inits = driver_rt_inits();
    void *p = NULL;
    setcur_fn setcur;
    LOOKUP(setcur, "cuCtxSetCurrent", 4000);
    CHECK_MSG(setcur(t.primary) == 0 && cudaMalloc(&p, 4096) == 0 && p && cudaFree(p) == 0, "cudaMalloc with a context");
    CHECK_MSG(driver_rt_inits() == inits, "the runtime was initialized again with a context current");

    /* The runtime cannot initialize: the allocation fails with the runtime's error, serves nothing. */
    driver_rt_fail_init(35);
    CHECK_MSG(setcur(NULL) == 0, "no current context");
    uint64_t a1 = allocs_now();
    int rc = cudaMalloc(&p, 4096);
    CHECK_MSG(rc == 35 && allocs_now() == a1, "cudaMalloc when the runtime cannot start = %d (want 35), served %llu",
              rc, (unsigned long long)(allocs_now() - a1));
    rc = cudaGetLastError();
    CHECK_MSG(rc == 35 && cudaGetLastError() == 0, "the last error after it is %d, want 35 once", rc);
    rc = cudaMallocAsync(&p, 4096, NULL);
    CHECK_MSG(rc == 35 && allocs_now() == a1, "cudaMallocAsync when the runtime cannot start = %d (want 35)", rc);
    cudaGetLastError();
    driver_rt_fail_init(0);
    if (failures) return 1;
    printf("interpose_driver_prog --runtime-context: all checks passed\n");
    return 0;
}

/* --runtime-calls: what a runtime allocation cualloc serves from its cache asks of the driver, on a
 * thread whose context is current (every allocation of a program after its first): the fake counts
 * every entry point called. The front door asks whether a context is current (cuCtxGetCurrent; the
 * device need not be known for that) and, with this runtime, which has no cudaGetDevice, the
 * current context's device (cuCtxGetCurrent + cuCtxGetDevice); the heap asks nothing of a block it
 * hands back from its cache on the legacy stream. More is a cost on every allocation. */
#define RUNTIME_CALLS_MAX 3
#define DEVICE_WIDE_EVENT_CALLS 3 /* cuStreamIsCapturing, cuEventRecord, cuEventQuery */
/* The entry points the single-device checks start from, as cuGetProcAddress gives them. */
typedef struct {
    init_fn cu_init;
    retain_fn retain;
    setcur_fn setcur;
    alloc_fn mem_alloc;
    free_fn mem_free;
    alloc_async_fn alloc_async; /* cuMemAllocAsync and cuMemFreeAsync (flags 0) */
    free_async_fn free_async;
} basics_t;

/* Looks the basics up, then cuInit and device 0's primary context made current: *ctx. False when a
 * check failed. */
static bool basics_on_device0(gpa_fn gpa, basics_t *b, CUcontext *ctx) {
    void *q;
    LOOKUP(b->cu_init, "cuInit", 2000);
    LOOKUP(b->retain, "cuDevicePrimaryCtxRetain", 7000);
    LOOKUP(b->setcur, "cuCtxSetCurrent", 4000);
    LOOKUP(b->mem_alloc, "cuMemAlloc", 3020);
    LOOKUP(b->mem_free, "cuMemFree", 3020);
    LOOKUP(b->alloc_async, "cuMemAllocAsync", 11020);
    LOOKUP(b->free_async, "cuMemFreeAsync", 11020);
    if (failures) return false;
    *ctx = NULL;
    CHECK_MSG(b->cu_init(0) == 0 && b->retain(ctx, 0) == 0 && b->setcur(*ctx) == 0, "device 0's primary context");
    return !failures;
}

static int runtime_calls_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    uint64_t (*entry_calls)(const char *);
    void *p = dlsym(lib, "fakecuda_entry_calls");
    AS(entry_calls, p);
    CHECK_MSG(entry_calls != NULL, "fakecuda_entry_calls");
    if (failures) return 1;
    /* The first allocations start cualloc and map memory; the ones counted come from its cache. */
    for (int i = 0; i < 4; i++) {
        void *w = NULL;
        CHECK_MSG(cudaMalloc(&w, 1 << 20) == 0 && w && cudaFree(w) == 0, "warm-up cudaMalloc %d", i);
        CHECK_MSG(cudaMallocAsync(&w, 1 << 20, NULL) == 0 && w && cudaFreeAsync(w, NULL) == 0,
                  "warm-up cudaMallocAsync %d", i);
    }
    if (failures) return 1;
    enum { ROUNDS = 100 };
    static const char *const kinds[2] = {"cudaMalloc", "cudaMallocAsync"};
    for (int k = 0; k < 2; k++) {
        uint64_t total = 0, get_current = 0, get_device = 0, a0 = allocs_now();
        for (int i = 0; i < ROUNDS; i++) {
            void *m = NULL;
            uint64_t c0 = entry_calls(NULL), g0 = entry_calls("cuCtxGetCurrent"), d0 = entry_calls("cuCtxGetDevice");
            int rc = k == 0 ? cudaMalloc(&m, 1 << 20) : cudaMallocAsync(&m, 1 << 20, NULL);
            total += entry_calls(NULL) - c0;
            get_current += entry_calls("cuCtxGetCurrent") - g0;
            get_device += entry_calls("cuCtxGetDevice") - d0;
            CHECK_MSG(rc == 0 && m, "%s %d", kinds[k], i);
            if (m) CHECK_MSG((k == 0 ? cudaFree(m) : cudaFreeAsync(m, NULL)) == 0, "free %d", i);
        }
        CHECK_MSG(allocs_now() == a0 + ROUNDS, "cualloc served %llu of %d", (unsigned long long)(allocs_now() - a0),
                  ROUNDS);
        printf("%s served from the cache: %.2f driver calls each (cuCtxGetCurrent %.2f, cuCtxGetDevice %.2f)\n",
               kinds[k], (double)total / ROUNDS, (double)get_current / ROUNDS, (double)get_device / ROUNDS);
        /* cudaFree is device-wide: the block it freed is reused once an event on the legacy
         * stream, which the next cudaMalloc records (after asking whether a capture is on) and
         * queries, says the device is past it. */
        int most = RUNTIME_CALLS_MAX + (k == 0 ? DEVICE_WIDE_EVENT_CALLS : 0);
        CHECK_MSG(total <= (uint64_t)most * ROUNDS, "%s: %llu driver calls in %d allocations, want at most %d each",
                  kinds[k], (unsigned long long)total, ROUNDS, most);
    }
    if (failures) return 1;
    printf("interpose_driver_prog --runtime-calls: all checks passed\n");
    return 0;
}

/* --address-range (VMM and classic mode): cuMemGetAddressRange of cualloc's memory answers as CUDA
 * does for cudaMalloc memory. An address inside a live block, at its start or not: the block's own
 * base and size. An address no live block holds: CUDA_ERROR_NOT_FOUND (500), as for memory CUDA
 * freed, though cualloc keeps it mapped (a block the program freed, cached; the free space beside
 * and after the blocks), never the range of the chunk or segment around it. A pointer from the
 * driver itself: the driver's answer. */
#define CUDA_ERROR_NOT_FOUND 500
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
static void expect_range(range_fn get_range, const char *what, CUdeviceptr at, CUdeviceptr base, size_t size) {
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = get_range(&b, &n, at);
    CHECK_MSG(r == 0 && b == base && n == size, "%s: cuMemGetAddressRange(%#llx) = %d, %#llx + %zu; want 0, %#llx + %zu",
              what, at, r, b, n, base, size);
}
static void expect_not_found(range_fn get_range, const char *what, CUdeviceptr at) {
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = get_range(&b, &n, at);
    CHECK_MSG(r == CUDA_ERROR_NOT_FOUND, "%s: cuMemGetAddressRange(%#llx) = %d, %#llx + %zu; want %d (not found)", what,
              at, r, b, n, CUDA_ERROR_NOT_FOUND);
}
static int address_range_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    void *q;
    range_fn get_range;
    LOOKUP(get_range, "cuMemGetAddressRange", 3020);
    CHECK_MSG(from_cualloc((void *)api.mem_alloc) && from_cualloc((void *)get_range), "cualloc's entry points");
    direct_fn direct;
    void *p = dlsym(lib, "fakecuda_mem_alloc_direct");
    AS(direct, p);
    CHECK_MSG(direct != NULL, "fakecuda_mem_alloc_direct");
    if (failures) return 1;

    const size_t small = 5000, small_block = 5120, big = (size_t)8 << 20;
    CUdeviceptr a = 0, b = 0, c = 0, live_big = 0, freed_big = 0;
    CHECK_MSG(api.mem_alloc(&a, small) == 0 && api.mem_alloc(&b, small) == 0 && api.mem_alloc(&c, small) == 0, "three small blocks");
    CHECK_MSG(api.mem_alloc(&live_big, big) == 0 && api.mem_alloc(&freed_big, big) == 0, "two large blocks");
    CHECK_MSG(api.mem_free(b) == 0 && api.mem_free(freed_big) == 0, "free the middle small block and a large one");
    if (failures) return 1;

    expect_range(get_range, "a live block's start", a, a, small_block);
    expect_range(get_range, "inside a live block", a + 1234, a, small_block);
    expect_range(get_range, "a live block's last byte", c + small_block - 1, c, small_block);
    expect_range(get_range, "inside a live large block", live_big + (3 << 20), live_big, big);
    expect_not_found(get_range, "a freed block's start", b);
    expect_not_found(get_range, "inside a freed block", b + 100);
    expect_not_found(get_range, "inside a freed large block", freed_big + 4096);
    CUdeviceptr last = a > c ? a : c;
    if (b > last) last = b;
    expect_not_found(get_range, "the free space after the small blocks", last + small_block);
    CUdeviceptr base_only = 0;
    size_t size_only = 0;
    CHECK_MSG(get_range(&base_only, NULL, c + 1) == 0 && base_only == c && get_range(NULL, &size_only, c + 1) == 0 &&
                  size_only == small_block,
              "either output may be NULL");

    /* The freed block handed out again is live again. */
    CUdeviceptr again = 0;
    CHECK_MSG(api.mem_alloc(&again, small) == 0 && again, "a small block again");
    expect_range(get_range, "a block reallocated", again + 10, again, small_block);

    /* Memory cualloc does not own: the driver answers. */
    CUdeviceptr foreign = 0;
    CHECK_MSG(direct(0, 1 << 20, &foreign) == 0 && foreign, "direct allocation");
    CUdeviceptr fb = 0;
    size_t fn = 0;
    CHECK_MSG(get_range(&fb, &fn, foreign + 10) == 0 && fb == foreign && fn >= (1 << 20),
              "a foreign pointer: %#llx + %zu, want %#llx + at least 1 MiB", fb, fn, foreign);
    CHECK_MSG(api.mem_free(foreign) == 0 && api.mem_free(again) == 0 && api.mem_free(a) == 0 && api.mem_free(c) == 0 &&
                  api.mem_free(live_big) == 0,
              "frees");
    expect_not_found(get_range, "a block freed last", live_big);
    if (failures) return 1;
    printf("interpose_driver_prog --address-range: all checks passed\n");
    return 0;
}

/* cuStreamCreate and cuStreamDestroy as cuGetProcAddress gives them (cualloc's). False when a
 * look-up failed. */
typedef struct {
    CUresult (*create)(CUstream *, unsigned);
    CUresult (*destroy)(CUstream);
} stream_fns_t;

static bool stream_fns(gpa_fn gpa, stream_fns_t *sf) {
    void *q;
    LOOKUP(sf->create, "cuStreamCreate", 12000);
    LOOKUP(sf->destroy, "cuStreamDestroy", 12000);
    return !failures;
}

/* The fake driver's calls by which cualloc waits for work: events recorded, stream and device
 * synchronizes. */
static uint64_t waits_made(calls_fn fake_calls) {
    return fake_calls(OP_EVENT_RECORD) + fake_calls(OP_STREAM_SYNC) + fake_calls(OP_DEVICE_SYNC);
}

/* --classic-legacy-free (classic segments): cuMemAlloc takes the legacy stream's blocks at once, so a
 * block cuMemFreeAsync'd on the legacy stream must not reach it while a non-blocking stream, which
 * does not wait for the legacy stream's work, might use it: created before the free or after it,
 * an event on the legacy stream or a synchronize comes between the free and cuMemAlloc's reuse. */
static int classic_legacy_free_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    stream_fns_t sf;
    if (!basics_on_device0(gpa, &api, &ctx) || !stream_fns(gpa, &sf)) return 1;
    free_async_fn free_async = api.free_async;
    alloc_async_fn alloc_async = api.alloc_async;
    calls_fn fake_calls = FAKE_CALLS(lib);
    CHECK_MSG(fake_calls && from_cualloc((void *)free_async) && from_cualloc((void *)alloc_async) &&
                  from_cualloc((void *)api.mem_alloc), "cualloc's entry points");
    if (failures) return 1;
    CUstream legacy = (CUstream)(uintptr_t)1;
    for (int before = 0; before < 2; before++) {
        CUdeviceptr x = 0, y = 0;
        CUstream nb = NULL;
        if (before) CHECK_MSG(sf.create(&nb, 1 /* CU_STREAM_NON_BLOCKING */) == 0 && nb, "a non-blocking stream");
        /* (allocated stream-ordered: a cuMemAlloc served on the legacy stream would itself ask for a
         * synchronize at the non-blocking stream's creation) */
        CHECK_MSG(alloc_async(&x, 4 << 20, legacy) == 0 && x, "cuMemAllocAsync on CU_STREAM_LEGACY");
        uint64_t waits = waits_made(fake_calls);
        CHECK_MSG(free_async(x, legacy) == 0, "cuMemFreeAsync on CU_STREAM_LEGACY");
        /* (created after the free, the stream's creation synchronizes the legacy stream) */
        if (!before) CHECK_MSG(sf.create(&nb, 1 /* CU_STREAM_NON_BLOCKING */) == 0 && nb, "a non-blocking stream");
        CHECK_MSG(api.mem_alloc(&y, 4 << 20) == 0 && y, "cuMemAlloc");
        CHECK_MSG(y != x || waits_made(fake_calls) > waits,
                  "a block freed on the legacy stream went to cuMemAlloc without an event or a synchronize, with a "
                  "non-blocking stream created %s the free", before ? "before" : "after");
        CHECK_MSG(api.mem_free(y) == 0 && sf.destroy(nb) == 0, "cuMemFree, cuStreamDestroy");
    }
    return failures != 0;
}

/* --green-ctx: a stream made in a green context (cuGreenCtxStreamCreate, CUDA 12.4) is a
 * non-blocking stream like any other: once it exists, a block cuMemFreeAsync'd on the legacy stream
 * reaches cuMemAlloc (whose memory may serve that stream) only after an event on the legacy stream. */
static int green_ctx_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    void *q;
    free_async_fn free_async = api.free_async;
    alloc_async_fn alloc_async = api.alloc_async;
    CUresult (*green_create)(CUstream *, void *, unsigned, int);
    LOOKUP(green_create, "cuGreenCtxStreamCreate", 12040);
    calls_fn fake_calls = FAKE_CALLS(lib);
    CHECK_MSG(green_create != NULL, "cuGreenCtxStreamCreate");
    if (failures) return 1;
    CHECK_MSG(from_cualloc((void *)green_create), "cuGreenCtxStreamCreate is not cualloc's");
    CUstream legacy = (CUstream)(uintptr_t)1, green = NULL;
    CUdeviceptr first = 0;
    CHECK_MSG(api.mem_alloc(&first, 4096) == 0 && api.mem_free(first) == 0, "cualloc starts");
    static char green_ctx_stand_in;
    CHECK_MSG(green_create(&green, &green_ctx_stand_in, 1 /* CU_STREAM_NON_BLOCKING */, 0) == 0 && green,
              "cuGreenCtxStreamCreate");
    CUdeviceptr x = 0, y = 0;
    CHECK_MSG(alloc_async(&x, 4 << 20, legacy) == 0 && x, "cuMemAllocAsync on CU_STREAM_LEGACY");
    uint64_t waits = waits_made(fake_calls);
    CHECK_MSG(free_async(x, legacy) == 0 && api.mem_alloc(&y, 4 << 20) == 0 && y, "cuMemFreeAsync, cuMemAlloc");
    CHECK_MSG(y != x || waits_made(fake_calls) > waits,
              "with a green context's stream alive, a block freed on the legacy stream went to cuMemAlloc without an "
              "event or a synchronize: the stream was not seen");
    return failures != 0;
}

/* --mem-pool: which allocator served a stream-ordered allocation, told by the fake's cuMemAlloc
 * count (the sim's mem_alloc op, which CUDA's pools reach here; cualloc maps chunks instead). */
static int mem_pool_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    void *q;
    free_async_fn free_async = api.free_async;
    alloc_async_fn alloc_async = api.alloc_async;
    CUresult (*set_pool)(int, void *), (*default_pool)(void **, int);
    LOOKUP(set_pool, "cuDeviceSetMemPool", 11020);
    LOOKUP(default_pool, "cuDeviceGetDefaultMemPool", 11020);
    calls_fn fake_calls = FAKE_CALLS(lib);
    if (failures) return 1;
    CHECK_MSG(from_cualloc((void *)set_pool), "cuDeviceSetMemPool is not cualloc's");
    void *def = NULL;
    CHECK_MSG(default_pool(&def, 0) == 0 && def, "cuDeviceGetDefaultMemPool");
    static char pool_stand_in;
    struct { const char *what; void *pool; bool cuda; } steps[] = {
        {"the default pool", NULL, false},
        {"a pool set with cuDeviceSetMemPool", &pool_stand_in, true},
        {"the default pool set back", def, false},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (steps[i].pool) CHECK_MSG(set_pool(0, steps[i].pool) == 0, "cuDeviceSetMemPool: %s", steps[i].what);
        uint64_t allocs = fake_calls(OP_MEM_ALLOC), frees = fake_calls(OP_MEM_FREE), ours = allocs_now();
        CUdeviceptr d = 0;
        void *r = NULL;
        CHECK_MSG(alloc_async(&d, 1 << 20, NULL) == 0 && d && free_async(d, NULL) == 0, "cuMemAllocAsync: %s",
                  steps[i].what);
        CHECK_MSG(cudaMallocAsync(&r, 1 << 20, NULL) == 0 && r && cudaFreeAsync(r, NULL) == 0, "cudaMallocAsync: %s",
                  steps[i].what);
        bool by_cuda = fake_calls(OP_MEM_ALLOC) == allocs + 2 && fake_calls(OP_MEM_FREE) == frees + 2 &&
                       allocs_now() == ours;
        bool by_cualloc = fake_calls(OP_MEM_ALLOC) == allocs && allocs_now() == ours + 2;
        CHECK_MSG(steps[i].cuda ? by_cuda : by_cualloc, "with %s, the two allocations went to %s, not %s", steps[i].what,
                  steps[i].cuda ? "cualloc" : "CUDA", steps[i].cuda ? "CUDA's pool" : "cualloc");
        void *w = NULL;
        CHECK_MSG(cudaMalloc(&w, 1 << 20) == 0 && w && cudaFree(w) == 0 && fake_calls(OP_MEM_ALLOC) == allocs + 2 * steps[i].cuda,
                  "cudaMalloc, which no pool serves, passed through with %s", steps[i].what);
    }
    if (failures) return 1;
    printf("interpose_driver_prog --mem-pool: all checks passed\n");
    return 0;
}

/* The fake driver's capture controls (tests/fakecuda): a stream's capture flag, and the captures
 * invalidated so far. False when lib lacks them. */
typedef struct {
    void (*set_capturing)(CUstream, int);
    uint64_t (*captures_broken)(void);
} capture_fns_t;

static bool capture_fns(void *lib, capture_fns_t *c) {
    void *p = dlsym(lib, "fakecuda_stream_set_capturing");
    AS(c->set_capturing, p);
    p = dlsym(lib, "fakecuda_captures_broken");
    AS(c->captures_broken, p);
    return c->set_capturing && c->captures_broken;
}

/* --streams-first: 100 non-blocking streams created with cuStreamCreate before cualloc starts (its
 * first allocation), as PyTorch's stream pools make 64 and more per device: the front door must
 * hand every one to the heap. A heap told of only some settles device-wide frees with a device
 * synchronize, which invalidates a graph capture on a stream it was not told of; told of all, it
 * sees the capture and synchronizes nothing. The stream created last captures while cuMemFree'd
 * blocks are asked for again.
 * --streams-lost WHEN: the first stream's creation finds no memory for the table that remembers it
 * (every anonymous mmap refused meanwhile), the front door's before cualloc starts, the heap's
 * after. The heap must then know that a stream escaped it: a cuMemFree'd block is reused only after
 * a device synchronize (events on the streams it knows do not order the lost one), and never by a
 * synchronize while a stream it knows captures (which the synchronize would invalidate). */
static int streams_first_main(gpa_fn gpa, void *lib, const char *lost) {
    basics_t api;
    CUcontext ctx;
    stream_fns_t sf;
    if (!basics_on_device0(gpa, &api, &ctx) || !stream_fns(gpa, &sf)) return 1;
    CHECK_MSG(from_cualloc((void *)sf.create) && from_cualloc((void *)api.mem_alloc), "cualloc's entry points");
    capture_fns_t cap;
    calls_fn fake_calls;
    void *p = dlsym(lib, "fakecuda_calls");
    AS(fake_calls, p);
    CHECK_MSG(capture_fns(lib, &cap) && fake_calls, "fake helpers");
    void (*set_capturing)(CUstream, int) = cap.set_capturing;
    uint64_t (*captures_broken)(void) = cap.captures_broken;
    int *mmap_armed = lost ? dlsym(RTLD_DEFAULT, "failing_mmap_armed") : NULL;
    unsigned long *mmap_refused = lost ? dlsym(RTLD_DEFAULT, "failing_mmap_refused") : NULL;
    CHECK_MSG(!lost || (mmap_armed && mmap_refused), "tests/failing_mmap.c is not preloaded");
    if (failures) return 1;

    enum { NB = 100 };
    CUstream nbs[NB];
    if (lost && strcmp(lost, "after") == 0) {
        CUdeviceptr x = 0; /* cualloc starts */
        CHECK_MSG(api.mem_alloc(&x, 4 << 20) == 0 && x && api.mem_free(x) == 0, "first cuMemAlloc and cuMemFree");
    }
    for (int i = 0; i < NB; i++) {
        if (lost && i == 0) __atomic_store_n(mmap_armed, 1, __ATOMIC_RELEASE);
        CHECK_MSG(sf.create(&nbs[i], 1 /* CU_STREAM_NON_BLOCKING */) == 0 && nbs[i], "stream %d", i);
        if (lost && i == 0) {
            __atomic_store_n(mmap_armed, 0, __ATOMIC_RELEASE);
            CHECK_MSG(*mmap_refused > 0, "creating stream 0 asked for no mapping: the test cannot lose it");
        }
    }
    if (failures) return 1;
    uint64_t broken0 = captures_broken(), syncs0 = fake_calls(OP_DEVICE_SYNC);
    if (lost) {
        /* With no stream capturing, the freed blocks are reused after device synchronizes. */
        for (int i = 0; i < 8; i++) {
            CUdeviceptr x = 0;
            CHECK_MSG(api.mem_alloc(&x, 4 << 20) == 0 && x && api.mem_free(x) == 0, "cuMemAlloc and cuMemFree %d", i);
        }
        CHECK_MSG(fake_calls(OP_DEVICE_SYNC) > syncs0,
                  "no device synchronize while a stream the heap was not told of ran: its frees were settled by "
                  "the known streams' events alone");
        syncs0 = fake_calls(OP_DEVICE_SYNC);
    }
    set_capturing(nbs[NB - 1], 1);
    uint64_t a0 = allocs_now();
    for (int i = 0; i < 8; i++) {
        CUdeviceptr x = 0;
        CHECK_MSG(api.mem_alloc(&x, 4 << 20) == 0 && x && api.mem_free(x) == 0, "cuMemAlloc and cuMemFree %d", i);
    }
    CHECK_MSG(allocs_now() - a0 == 8, "cualloc served %llu of 8", (unsigned long long)(allocs_now() - a0));
    CHECK_MSG(captures_broken() == broken0 && fake_calls(OP_DEVICE_SYNC) == syncs0,
              "%llu captures invalidated, %llu device synchronizes while stream %d of %d captured: the heap was not "
              "told of every stream created before cualloc started",
              (unsigned long long)(captures_broken() - broken0), (unsigned long long)(fake_calls(OP_DEVICE_SYNC) - syncs0),
              NB - 1, NB);
    set_capturing(nbs[NB - 1], 0);
    for (int i = 0; i < NB; i++) CHECK_MSG(sf.destroy(nbs[i]) == 0, "cuStreamDestroy %d", i);
    if (failures) return 1;
    printf("interpose_driver_prog --streams-%s: all checks passed\n", lost ? "lost" : "first");
    return 0;
}

/* --capture-elsewhere: what the driver-questions run found on an H100 (bench/RESULTS.md): while one
 * stream captures in global mode, CUDA refuses an event query or a stream synchronize made by any
 * thread in global mode and invalidates the capture, even where the call names an idle stream of
 * its own, and so it does on cuMemAlloc and cuMemFree. cualloc's heap queries and synchronizes only
 * streams that do not capture, so it makes those calls in relaxed mode, as its cuMemAlloc (classic
 * segments), and defers cuMemFree until the capture ends: the capture survives frees pending on
 * other streams, a trim that settles them and an allocation that misses the cache, with either kind
 * of segments. The fake models the rule: the program's own synchronize of an idle stream, in global
 * mode, must invalidate the capture (the control). */
static int capture_elsewhere_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    stream_fns_t sf;
    if (!basics_on_device0(gpa, &api, &ctx) || !stream_fns(gpa, &sf)) return 1;
    void *q;
    CUresult (*stream_sync)(CUstream);
    alloc_async_fn alloc_async = api.alloc_async;
    free_async_fn free_async = api.free_async;
    LOOKUP(stream_sync, "cuStreamSynchronize", 12000);
    capture_fns_t cap;
    void (*trim)(size_t);
    void *p = dlsym(RTLD_DEFAULT, "cualloc_trim");
    AS(trim, p);
    CHECK_MSG(capture_fns(lib, &cap) && trim, "fake helpers and cualloc_trim");
    void (*set_capturing)(CUstream, int) = cap.set_capturing;
    uint64_t (*captures_broken)(void) = cap.captures_broken;
    if (failures) return 1;
    CUstream capturing = NULL, b1 = NULL, b2 = NULL;
    CHECK_MSG(sf.create(&capturing, 1) == 0 && sf.create(&b1, 1) == 0 && sf.create(&b2, 1) == 0,
              "three non-blocking streams");
    CUdeviceptr warm = 0; /* cualloc starts and maps its first chunk before the capture */
    CHECK_MSG(api.mem_alloc(&warm, 4 << 20) == 0 && api.mem_free(warm) == 0, "warm-up cuMemAlloc");
    if (failures) return 1;

    uint64_t broken0 = captures_broken();
    set_capturing(capturing, 1);
    for (int round = 0; round < 3; round++) {
        CUstream s = round % 2 ? b2 : b1;
        CUdeviceptr x = 0, y = 0;
        CHECK_MSG(alloc_async(&x, 8 << 20, s) == 0 && free_async(x, s) == 0, "round %d: cuMemAllocAsync+cuMemFreeAsync 8 MiB", round);
        /* A miss: the heap looks at the other streams' events before mapping more. (Device-wide
         * frees, cuMemFree's, settle only by a device synchronize, which waits for the capture to
         * end: they stay cached meanwhile, so the misses are stream-ordered, within the sim's
         * 256 MiB.) */
        CUstream other = s == b1 ? b2 : b1;
        CHECK_MSG(alloc_async(&y, (size_t)(32 + 16 * round) << 20, other) == 0 && free_async(y, other) == 0,
                  "round %d: cuMemAllocAsync+cuMemFreeAsync of a new size", round);
        CHECK_MSG(api.mem_alloc(&y, 2 << 20) == 0 && api.mem_free(y) == 0, "round %d: cuMemAlloc+cuMemFree 2 MiB", round);
        trim(0); /* settles the frees pending on b1 and b2: their streams are synchronized */
        CHECK_MSG(captures_broken() == broken0, "round %d: cualloc invalidated the capture on another stream "
                  "(%llu invalidations): an event query, synchronize, cuMemAlloc or cuMemFree made in global mode", round,
                  (unsigned long long)(captures_broken() - broken0));
    }
    /* The control: the same synchronize made by the program, in global mode. */
    CHECK_MSG(stream_sync(b1) != 0 && captures_broken() == broken0 + 1,
              "the fake let a global-mode synchronize of an idle stream pass during a capture: this test "
              "cannot tell a relaxed call from a global one");
    set_capturing(capturing, 0);
    CHECK_MSG(sf.destroy(capturing) == 0 && sf.destroy(b1) == 0 && sf.destroy(b2) == 0, "cuStreamDestroy");
    if (failures) return 1;
    printf("interpose_driver_prog --capture-elsewhere: all checks passed\n");
    return 0;
}

/* Allocates n bytes with alloc and writes and reads them back through the driver (the fake checks
 * that the memory is mapped and accessible, so stale memory fails instead of crashing); frees them
 * unless keep. 0 when all of that succeeded, else a short reason. */
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
static memset_fn rs_memset;
static dtoh_fn rs_dtoh;
/* Fills [d, d + n) with v and reads its last 4 KiB back: NULL, or why it is not usable memory. */
static const char *write_and_read_back(CUdeviceptr d, size_t n, unsigned char v) {
    if (rs_memset(d, v, n) != 0) return "the memory is not accessible (cuMemsetD8 failed)";
    unsigned char probe[4096];
    size_t m = n < sizeof probe ? n : sizeof probe;
    if (rs_dtoh(probe, d + n - m, m) != 0) return "the memory is not accessible (cuMemcpyDtoH failed)";
    for (size_t i = 0; i < m; i++)
        if (probe[i] != v) return "the memory does not hold what was written";
    return NULL;
}

static const char *use_memory(alloc_fn alloc, free_fn release, size_t n, unsigned char v, CUdeviceptr *keep) {
    CUdeviceptr d = 0;
    if (alloc(&d, n) != 0 || !d) return "allocation failed";
    const char *why = write_and_read_back(d, n, v);
    if (why) return why;
    if (keep) *keep = d;
    else if (release(d) != 0) return "the free failed";
    return NULL;
}

/* --device-reset: cudaDeviceReset (the runtime resets the primary context with
 * cuDevicePrimaryCtxReset) and cuDevicePrimaryCtxReset itself destroy every allocation of the
 * device, cached ones included; CUDA's next call on the device makes a new context. cualloc's heap
 * held memory of the old context: blocks from its cache, or new memory mapped into its old address
 * range, were no memory at all. Allocations after a reset must be memory the device has. */
static int device_reset_main(gpa_fn gpa, void *lib) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    void *q;
    CUresult (*reset)(int);
    LOOKUP(reset, "cuDevicePrimaryCtxReset", 11000);
    LOOKUP(rs_memset, "cuMemsetD8", 3020);
    LOOKUP(rs_dtoh, "cuMemcpyDtoH", 3020);
    typedef size_t (*count_fn)(int);
    count_fn live_handles;
    void *p = dlsym(lib, "fakecuda_live_handles");
    AS(live_handles, p);
    CHECK_MSG(live_handles, "fakecuda_live_handles");
    if (failures) return 1;

    const size_t MiB = (size_t)1 << 20;
    for (int round = 0; round < 2; round++) {
        /* Memory live and cached at the reset: one block still held, a larger one freed. */
        CUdeviceptr held = 0;
        const char *why = use_memory(api.mem_alloc, api.mem_free, MiB, 1, &held);
        CHECK_MSG(!why, "round %d, before the reset: %s", round, why);
        why = use_memory(api.mem_alloc, api.mem_free, 8 * MiB, 2, NULL);
        CHECK_MSG(!why, "round %d, before the reset: %s", round, why);
        uint64_t a0 = allocs_now();
        if (round == 0) {
            /* The driver API: the program makes the context anew itself. */
            CHECK_MSG(reset(0) == 0, "cuDevicePrimaryCtxReset");
            CHECK_MSG(api.retain(&ctx, 0) == 0 && api.setcur(ctx) == 0, "device 0's primary context after the reset");
        } else {
            /* The runtime: it makes the context anew at its next call (cualloc asks it to when the
             * context it finds current is unusable). */
            CHECK_MSG(cudaDeviceReset() == 0, "cudaDeviceReset");
        }
        CHECK_MSG(live_handles(0) == 0, "round %d: %zu physical handles of the reset context are still live", round,
                  live_handles(0));
        /* The size cached before the reset, the one held, and a size never mapped before. */
        static const size_t sizes[] = {(size_t)8 << 20, (size_t)1 << 20, (size_t)96 << 20};
        for (int i = 0; i < 3; i++) {
            if (round == 0) why = use_memory(api.mem_alloc, api.mem_free, sizes[i], (unsigned char)(10 + i), NULL);
            else {
                void *r = NULL;
                int rc = cudaMalloc(&r, sizes[i]);
                why = rc != 0 ? "cudaMalloc failed"
                              : use_memory(api.mem_alloc, api.mem_free, 4096, (unsigned char)(20 + i), NULL);
                if (!why && rs_memset((CUdeviceptr)(uintptr_t)r, 7, sizes[i]) != 0)
                    why = "cudaMalloc's memory is not accessible (cuMemsetD8 failed)";
                if (rc == 0 && cudaFree(r) != 0) why = "cudaFree failed";
            }
            CHECK_MSG(!why, "round %d, after the reset, %zu MiB: %s", round, sizes[i] >> 20, why);
        }
        CHECK_MSG(allocs_now() > a0, "cualloc served nothing after the reset");
    }
    /* More resets than cualloc has devices (each makes a new heap): every allocation is still
     * usable memory served by cualloc, and its free is cualloc's too (the fake's cuMemFree never
     * sees one). */
    p = dlsym(lib, "fakecuda_calls");
    calls_fn fake_calls;
    AS(fake_calls, p);
    uint64_t frees0 = fake_calls ? fake_calls(OP_MEM_FREE) : 0;
    for (int i = 0; i < 70 && !failures; i++) {
        CUdeviceptr held = 0;
        uint64_t a0 = allocs_now();
        const char *why = use_memory(api.mem_alloc, api.mem_free, MiB, (unsigned char)i, &held);
        if (!why) why = use_memory(api.mem_alloc, api.mem_free, 3 * MiB, (unsigned char)(i + 1), NULL);
        if (!why && api.mem_free(held) != 0) why = "the free of the block held failed";
        if (!why && allocs_now() != a0 + 2) why = "cualloc did not serve both allocations";
        CHECK_MSG(!why, "reset %d: %s", i, why);
        CHECK_MSG(reset(0) == 0 && api.retain(&ctx, 0) == 0 && api.setcur(ctx) == 0, "reset %d", i);
    }
    CHECK_MSG(fake_calls && fake_calls(OP_MEM_FREE) == frees0, "%llu frees of cualloc's memory reached the driver",
              fake_calls ? (unsigned long long)(fake_calls(OP_MEM_FREE) - frees0) : 0ull);
    if (failures) return 1;
    printf("interpose_driver_prog --device-reset: all checks passed\n");
    return 0;
}

/* --host-oom (tests/check_library_host_oom.sh, with tests/failing_mmap.c refusing cualloc's host
 * memory): six steps of a training-shaped mix through cuMemAlloc and cuMemAllocAsync on two
 * streams. Every allocation must either give usable memory (written and read back) whose free then
 * succeeds, or fail with CUDA_ERROR_OUT_OF_MEMORY (2), as CUDA's own allocator may; the sweep checks
 * that cualloc said why. Prints how many failed, and how many cualloc served (the rest went to the
 * driver: before cualloc's heap could be set up). */
static int host_oom_main(gpa_fn gpa) {
    basics_t api;
    CUcontext ctx;
    if (!basics_on_device0(gpa, &api, &ctx)) return 1;
    void *q;
    alloc_async_fn alloc_async = api.alloc_async;
    free_async_fn free_async = api.free_async;
    stream_fns_t sf;
    LOOKUP(rs_memset, "cuMemsetD8", 3020);
    LOOKUP(rs_dtoh, "cuMemcpyDtoH", 3020);
    if (!stream_fns(gpa, &sf)) return 1;
    CUstream streams[2] = {NULL, NULL};
    CHECK_MSG(sf.create(&streams[0], 1) == 0 && sf.create(&streams[1], 1) == 0, "cuStreamCreate");
    if (failures) return 1;
    enum { PER_STEP = 24 };
    static const size_t sizes[PER_STEP] = {512,     4096,    20000,   1 << 20, 3 << 20, 9 << 20, 24 << 20, 2 << 20,
                                           768,     65536,   6 << 20, 1 << 21, 5000,    40 << 20, 300000, 1 << 22,
                                           12 << 20, 1 << 10, 7 << 20, 100,    1 << 24, 33333,   1 << 19, 17 << 20};
    CUdeviceptr held[PER_STEP];
    unsigned failed = 0, served = 0;
    uint64_t a0 = allocs_now();
    for (int step = 0; step < 6 && !failures; step++) {
        for (int i = 0; i < PER_STEP; i++) {
            size_t n = sizes[(i + step) % PER_STEP];
            CUstream s = i % 3 == 2 ? NULL : streams[i % 3];
            held[i] = 0;
            CUresult rc = i % 3 == 2 ? api.mem_alloc(&held[i], n) : alloc_async(&held[i], n, s);
            if (rc == 2) {
                failed++;
                held[i] = 0;
                continue;
            }
            CHECK_MSG(rc == 0 && held[i], "step %d: allocation %d (%zu bytes) answered %d", step, i, n, rc);
            if (rc != 0) continue;
            served++;
            const char *why = write_and_read_back(held[i], n, (unsigned char)(step * PER_STEP + i + 1));
            CHECK_MSG(!why, "step %d: allocation %d (%zu bytes): %s", step, i, n, why);
        }
        for (int i = PER_STEP; i-- > 0;) {
            if (!held[i]) continue;
            CUresult rc = i % 3 == 2 ? api.mem_free(held[i]) : free_async(held[i], streams[i % 3]);
            CHECK_MSG(rc == 0, "step %d: the free of allocation %d answered %d", step, i, rc);
        }
    }
    CHECK_MSG(sf.destroy(streams[0]) == 0 && sf.destroy(streams[1]) == 0, "cuStreamDestroy");
    printf("host-oom: %u allocations served, %u failed for want of memory; cualloc served %llu\n", served, failed,
           (unsigned long long)(allocs_now() - a0));
    if (failures) return 1;
    printf("interpose_driver_prog --host-oom: all checks passed\n");
    return 0;
}

int main(int argc, char **argv) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(lib != NULL, "dlopen libcuda.so.1: %s", dlerror());
    if (!lib) return 1;
    void *p = dlsym(RTLD_DEFAULT, "cualloc_get_stats");
    AS(get_stats, p);
    CHECK_MSG(get_stats != NULL, "libcualloc.so is not preloaded");
    p = dlsym(lib, "cuGetProcAddress_v2");
    gpa_fn gpa;
    AS(gpa, p);
    /* (cudaMalloc reaches cualloc through the preload alone: this check needs no dlsym interposition,
     * which the sanitizer builds leave out.) */
    if (gpa && get_stats && argc > 1 && strcmp(argv[1], "--runtime-context") == 0) return runtime_context_main(gpa);
    if (gpa && get_stats && argc > 1 && strcmp(argv[1], "--runtime-calls") == 0) return runtime_calls_main(gpa, lib);
    CHECK_MSG(gpa && from_cualloc(p), "dlsym(libcuda, cuGetProcAddress_v2) did not give cualloc's wrapper");
    if (!gpa || !get_stats) return 1;
    if (argc > 1 && strcmp(argv[1], "--stream-device") == 0) return stream_device_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--device-reset") == 0) return device_reset_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--address-range") == 0) return address_range_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--streams-first") == 0) return streams_first_main(gpa, lib, NULL);
    if (argc > 2 && strcmp(argv[1], "--streams-lost") == 0) return streams_first_main(gpa, lib, argv[2]);
    if (argc > 1 && strcmp(argv[1], "--capture-elsewhere") == 0) return capture_elsewhere_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--host-oom") == 0) return host_oom_main(gpa);
    if (argc > 1 && strcmp(argv[1], "--classic-legacy-free") == 0) return classic_legacy_free_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--green-ctx") == 0) return green_ctx_main(gpa, lib);
    if (argc > 1 && strcmp(argv[1], "--mem-pool") == 0) return mem_pool_main(gpa, lib);

    void *q;
    init_fn cuInit;
    retain_fn retain;
    setcur_fn setcur;
    CHECK_MSG(gpa("cuInit", &q, 12000, 0, NULL) == 0 && !from_cualloc(q), "cuInit passes through");
    AS(cuInit, q);
    LOOKUP(retain, "cuDevicePrimaryCtxRetain", 12000);
    LOOKUP(setcur, "cuCtxSetCurrent", 12000);
    p = dlsym(lib, "fakecuda_calls");
    calls_fn fake_calls;
    AS(fake_calls, p);
    p = dlsym(lib, "fakecuda_mem_alloc_direct");
    direct_fn direct;
    AS(direct, p);
    CHECK_MSG(fake_calls && direct, "fake helpers");
    if (failures) return 1;

    alloc_fn mem_alloc;
    free_fn mem_free;
    alloc_async_fn alloc_async[2];
    free_async_fn free_async[2];
    CHECK_MSG(gpa("cuMemAlloc", &q, 3020, 0, NULL) == 0 && from_cualloc(q), "cuMemAlloc@3020 is not cualloc's");
    AS(mem_alloc, q);
    CHECK_MSG(gpa("cuMemFree", &q, 3020, 0, NULL) == 0 && from_cualloc(q), "cuMemFree@3020 is not cualloc's");
    AS(mem_free, q);
    for (int f = 0; f < 2; f++) {
        CHECK_MSG(gpa("cuMemAllocAsync", &q, 11020, f ? 2 : 0, NULL) == 0 && from_cualloc(q), "cuMemAllocAsync flags %d", f * 2);
        AS(alloc_async[f], q);
        CHECK_MSG(gpa("cuMemFreeAsync", &q, 11020, f ? 2 : 0, NULL) == 0 && from_cualloc(q), "cuMemFreeAsync flags %d", f * 2);
        AS(free_async[f], q);
    }
    CHECK_MSG(alloc_async[0] != alloc_async[1], "flags 2 must give the _ptsz variant");

    /* Before the program's own cuInit: the driver's answer, and the driver left uninitialized. */
    CUdeviceptr early = 0;
    CHECK_MSG(mem_alloc(&early, 4096) == 3, "cuMemAlloc before cuInit must answer CUDA_ERROR_NOT_INITIALIZED (3)");
    CHECK_MSG(alloc_async[1](&early, 4096, NULL) == 3, "cuMemAllocAsync_ptsz before cuInit must answer 3");
    CHECK_MSG(cuInit(0) == 0, "cuInit");
    if (failures) return 1;

    CUcontext ctx = NULL;
    CHECK_MSG(retain(&ctx, 0) == 0 && setcur(ctx) == 0, "make device 0's primary context current");

    /* A non-blocking stream created and destroyed before cualloc starts (its first allocation) is
     * forgotten: frees need not wait for it, and no event is ever recorded on its handle. */
    typedef CUresult (*stream_create_fn)(CUstream *, unsigned);
    typedef CUresult (*stream_destroy_fn)(CUstream);
    stream_create_fn stream_create;
    stream_destroy_fn stream_destroy;
    LOOKUP(stream_create, "cuStreamCreate", 12000);
    LOOKUP(stream_destroy, "cuStreamDestroy", 12000);
    CUstream dead = NULL;
    CHECK_MSG(stream_create(&dead, 1 /* CU_STREAM_NON_BLOCKING */) == 0 && stream_destroy(dead) == 0,
              "create and destroy a non-blocking stream");
    /* cuMemFree is device-wide: with no live non-blocking stream its block waits for one event, on
     * the legacy stream, recorded by the next allocation; none is recorded on the dead handle. */
    uint64_t (*bad_handles)(void);
    void *bh = dlsym(lib, "fakecuda_bad_stream_handles");
    AS(bad_handles, bh);
    CHECK_MSG(bad_handles != NULL, "fakecuda_bad_stream_handles");
    if (failures) return 1;
    uint64_t records0 = fake_calls(OP_EVENT_RECORD), bad0 = bad_handles();
    for (int i = 0; i < 16; i++) {
        CUdeviceptr x = 0;
        CHECK_MSG(mem_alloc(&x, 4 << 20) == 0 && mem_free(x) == 0, "cuMemAlloc and cuMemFree %d", i);
    }
    CHECK_MSG(fake_calls(OP_EVENT_RECORD) - records0 <= 16 && bad_handles() == bad0,
              "%llu events recorded for 16 frees, %llu on no stream: the destroyed stream was still waited for",
              (unsigned long long)(fake_calls(OP_EVENT_RECORD) - records0), (unsigned long long)(bad_handles() - bad0));

    /* CU_STREAM_LEGACY (0x1) and NULL name one stream, the legacy one: a block freed on either is
     * reused at once on the other, with no event between them. */
    for (int way = 0; way < 2; way++) {
        CUstream on_free = way ? NULL : (CUstream)(uintptr_t)1, on_alloc = way ? (CUstream)(uintptr_t)1 : NULL;
        CUdeviceptr x = 0, y = 0;
        CHECK_MSG(alloc_async[0](&x, 3 << 20, on_alloc) == 0 && x, "cuMemAllocAsync");
        uint64_t rec0 = fake_calls(OP_EVENT_RECORD);
        CHECK_MSG(free_async[0](x, on_free) == 0 && alloc_async[0](&y, 3 << 20, on_alloc) == 0, "free, allocate again");
        CHECK_MSG(y == x && fake_calls(OP_EVENT_RECORD) == rec0,
                  "freed on %s, asked on %s: got %#llx for %#llx, %llu events recorded", way ? "NULL" : "CU_STREAM_LEGACY",
                  way ? "CU_STREAM_LEGACY" : "NULL", (unsigned long long)y, (unsigned long long)x,
                  (unsigned long long)(fake_calls(OP_EVENT_RECORD) - rec0));
        if (y) CHECK_MSG(free_async[0](y, on_alloc) == 0, "free");
    }

    /* No current context: as CUDA, CUDA_ERROR_INVALID_CONTEXT (201) from the real driver. */
    CUdeviceptr d = 0;
    CHECK_MSG(setcur(NULL) == 0 && mem_alloc(&d, 4096) == 201, "cuMemAlloc without a context");
    CHECK_MSG(setcur(ctx) == 0, "device 0's primary context current again");


    uint64_t a0 = allocs_now(), fake0 = fake_calls(OP_MEM_ALLOC);
    CUdeviceptr ptrs[30];
    size_t sizes[30];
    for (int i = 0; i < 30; i++) {
        sizes[i] = 512 + (size_t)i * 37000;
        ptrs[i] = 0;
        CUresult r;
        if (i % 3 == 0) r = mem_alloc(&ptrs[i], sizes[i]);
        else r = alloc_async[i % 3 - 1](&ptrs[i], sizes[i], NULL);
        CHECK_MSG(r == 0 && ptrs[i], "alloc %d = %d", i, r);
        if (ptrs[i]) memset((void *)(uintptr_t)ptrs[i], i, sizes[i]);
    }
    CHECK_MSG(allocs_now() - a0 == 30, "cualloc served %llu of 30", (unsigned long long)(allocs_now() - a0));
    CHECK_MSG(fake_calls(OP_MEM_ALLOC) == fake0, "the fake's cuMemAlloc ran %llu times",
          (unsigned long long)(fake_calls(OP_MEM_ALLOC) - fake0));
    for (int i = 0; i < 30; i++) {
        if (!ptrs[i]) continue;
        const unsigned char *b = (const unsigned char *)(uintptr_t)ptrs[i];
        size_t bad = 0;
        for (size_t k = 0; k < sizes[i]; k++) bad += b[k] != (unsigned char)i;
        CHECK_MSG(bad == 0, "block %d overwritten", i);
        CUresult r = i % 3 == 0 ? mem_free(ptrs[i]) : free_async[i % 3 - 1](ptrs[i], NULL);
        CHECK_MSG(r == 0, "free %d = %d", i, r);
    }
    stats_mirror s;
    get_stats(0, &s);
    CHECK_MSG(s.gauges[2] == 0, "allocated bytes %zu after freeing everything", s.gauges[2]);

    /* Stream capture: cuMemAllocAsync on a capturing stream goes to the driver (a graph node). */
    typedef void *(*screate_fn)(int, int);
    typedef void (*scap_fn)(void *, int);
    screate_fn screate;
    scap_fn scap;
    p = dlsym(lib, "fakecuda_stream_create");
    AS(screate, p);
    p = dlsym(lib, "fakecuda_stream_set_capturing");
    AS(scap, p);
    CHECK_MSG(screate && scap, "fake stream helpers");
    if (screate && scap) {
        void *cs = screate(0, 0);
        CUdeviceptr held = 0, other = 0;
        CHECK_MSG(alloc_async[0](&held, 1 << 20, cs) == 0 && held, "an allocation before the capture");
        scap(cs, 1);
        /* Freed inside the capture, the block belongs to the graph, which frees it when it runs:
         * it must stay allocated and never be handed out again. */
        stats_mirror before, after;
        get_stats(0, &before);
        CHECK_MSG(free_async[0](held, cs) == 0, "cuMemFreeAsync of cualloc memory during capture");
        get_stats(0, &after);
        CHECK_MSG(after.gauges[2] == before.gauges[2], "a block freed during capture was freed at once");
        scap(cs, 0);
        CHECK_MSG(alloc_async[0](&other, 1 << 20, cs) == 0 && other != held, "the captured free's block was reused");
        CHECK_MSG(free_async[0](other, cs) == 0, "free");
        scap(cs, 1);
        uint64_t ma0 = fake_calls(OP_MEM_ALLOC), al0 = allocs_now();
        CUdeviceptr g = 0;
        CHECK_MSG(alloc_async[0](&g, 1 << 20, cs) == 0 && g, "cuMemAllocAsync during capture");
        CHECK_MSG(fake_calls(OP_MEM_ALLOC) == ma0 + 1 && allocs_now() == al0, "a capturing stream's allocation must pass through");
        CHECK_MSG(free_async[0](g, cs) == 0, "cuMemFreeAsync during capture (foreign: to the driver)");
        scap(cs, 0);
        CHECK_MSG(alloc_async[0](&g, 1 << 20, cs) == 0 && allocs_now() == al0 + 1, "after the capture cualloc serves again");
        CHECK_MSG(free_async[0](g, cs) == 0, "free");

        /* The per-thread default stream may capture too (only the legacy stream may not): a free
         * on it during its capture, through either spelling, keeps the block as well. */
        void *const per_thread = (void *)(uintptr_t)0x2; /* CU_STREAM_PER_THREAD */
        CUdeviceptr h1 = 0, h2 = 0;
        CHECK_MSG(alloc_async[1](&h1, 1 << 20, NULL) == 0 && h1, "a per-thread allocation before its capture");
        CHECK_MSG(alloc_async[0](&h2, 1 << 20, per_thread) == 0 && h2, "another one");
        scap(per_thread, 1);
        get_stats(0, &before);
        CHECK_MSG(free_async[1](h1, NULL) == 0 && free_async[0](h2, per_thread) == 0,
                  "cuMemFreeAsync of cualloc memory during the per-thread stream's capture");
        get_stats(0, &after);
        CHECK_MSG(after.gauges[2] == before.gauges[2], "blocks freed during the per-thread stream's capture were freed at once "
                  "(%zu bytes)", before.gauges[2] - after.gauges[2]);
        scap(per_thread, 0);
    }

    /* Two threads' per-thread default streams are two streams: a block one thread freed on its
     * own may not go at once to the other's (nothing orders the two), as it would between two
     * explicit streams; only after an event on the legacy stream (which waits for every blocking
     * stream's earlier work) or a synchronize. The sim completes such events at once, so B may get
     * A's block, but not without one. No call may name the per-thread streams' keys as streams. */
    pt_ctx = ctx;
    pt_setcur = setcur;
    pt_alloc = alloc_async[1];
    pt_free = free_async[1];
    pthread_t th;
    CHECK_MSG(pthread_create(&th, NULL, pt_thread_a, NULL) == 0 && pthread_join(th, NULL) == 0, "thread A");
    uint64_t ordered0 = waits_made(fake_calls);
    CHECK_MSG(pthread_create(&th, NULL, pt_thread_b, NULL) == 0 && pthread_join(th, NULL) == 0, "thread B");
    uint64_t ordered = waits_made(fake_calls) - ordered0;
    CHECK_MSG(pt_a && pt_b && (pt_a != pt_b || ordered > 0), "thread B's per-thread stream got thread A's block %#llx at once",
              pt_a);
    if (pt_b) CHECK_MSG(free_async[1](pt_b, NULL) == 0, "free B's block");
    typedef uint64_t (*bad_fn)(void);
    bad_fn bad_streams;
    p = dlsym(lib, "fakecuda_bad_stream_handles");
    AS(bad_streams, p);
    CHECK_MSG(bad_streams && bad_streams() == 0, "%llu driver calls named a stream that is none (a per-thread key?)",
              bad_streams ? (unsigned long long)bad_streams() : 0ull);

    /* cuMemGetInfo (as the static runtime fetches it) counts what cualloc holds cached as free. */
    typedef CUresult (*meminfo_fn)(size_t *, size_t *);
    meminfo_fn meminfo;
    CHECK_MSG(gpa("cuMemGetInfo", &q, 3020, 0, NULL) == 0 && from_cualloc(q), "cuMemGetInfo@3020 is not cualloc's");
    AS(meminfo, q);
    size_t free0 = 0, free1 = 0, total = 0;
    CUdeviceptr big = 0;
    CHECK_MSG(meminfo(&free0, &total) == 0 && mem_alloc(&big, 64 << 20) == 0 && mem_free(big) == 0 &&
                  meminfo(&free1, &total) == 0,
              "cuMemGetInfo around 64 MiB allocated and freed");
    CHECK_MSG(free1 == free0, "free memory %zu before, %zu after 64 MiB were allocated and freed (cached)", free0, free1);
    /* cudaMemGetInfo of a runtime that asks that same cuMemGetInfo (libdriver_rt.so, as libcudart)
     * counts the cached bytes once, not once in each. */
    size_t rt_free = 0, rt_total = 0;
    CHECK_MSG(cudaMemGetInfo(&rt_free, &rt_total) == 0 && rt_total == total, "cudaMemGetInfo");
    CHECK_MSG(rt_free == free1, "cudaMemGetInfo says %zu free, cuMemGetInfo %zu", rt_free, free1);

    /* A double free is refused as CUDA refuses it, and not passed to the driver. */
    CUdeviceptr twice = 0;
    CHECK_MSG(mem_alloc(&twice, 1 << 20) == 0 && twice && mem_free(twice) == 0, "alloc and free");
    uint64_t frees0 = fake_calls(OP_MEM_FREE);
    CHECK_MSG(mem_free(twice) == 1, "a second cuMemFree must answer CUDA_ERROR_INVALID_VALUE (1)");
    CHECK_MSG(fake_calls(OP_MEM_FREE) == frees0, "a second cuMemFree reached the driver");

    /* A pointer from the driver itself goes to the real cuMemFree. */
    CUdeviceptr foreign = 0;
    CHECK_MSG(direct(0, 1 << 20, &foreign) == 0 && foreign, "direct allocation");
    uint64_t fr0 = fake_calls(OP_MEM_FREE);
    CHECK_MSG(mem_free(foreign) == 0, "cuMemFree(foreign)");
    CHECK_MSG(fake_calls(OP_MEM_FREE) == fr0 + 1, "cuMemFree(foreign) did not reach the driver");

    if (failures) {
        fprintf(stderr, "interpose_driver_prog: %d failure(s)\n", failures);
        return 1;
    }
    printf("interpose_driver_prog: all checks passed\n");
    return 0;
}
