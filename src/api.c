/* api.c — the public C API (include/cualloc.h) and the process-wide state behind it: the
 * configuration, the driver backend, and one heap per device, created on first use. It owns
 * start-up (lazy: nothing happens before the first call) and the exit summary. It does not
 * allocate anything itself (heap.c does) or interpose CUDA.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static struct {
    pthread_once_t once;
    conf_t conf;
    const driver_ops_t *drv;
    cua_result init_error;   /* CUA_SUCCESS when the driver is usable */
    int device_count;
    bool disabled;           /* CUALLOC_DISABLE=1: straight to the driver, no caching */
    pthread_mutex_t create_lock; /* serializes heap creation; ranks above every heap lock */
    _Atomic(heap_t *) heaps[CUALLOC_MAX_DEVICES];
    _Atomic bool ready;      /* api_init has run: the fast paths skip pthread_once */
    bool heap_failed[CUALLOC_MAX_DEVICES]; /* heap_create failed; guarded by create_lock */
    /* VMM address ranges per device, published with the heap, so a free finds its device without
     * a call or a lock. */
    struct { uintptr_t lo, hi; } ranges[CUALLOC_MAX_DEVICES][POOL_COUNT];
} g = {.once = PTHREAD_ONCE_INIT, .create_lock = PTHREAD_MUTEX_INITIALIZER};

static void api_init(void);

static inline void api_ensure_init(void) {
    if (__builtin_expect(!atomic_load_explicit(&g.ready, memory_order_acquire), 0)) pthread_once(&g.once, api_init);
}

static void api_print_summary(void) {
    for (int d = 0; d < g.device_count && d < CUALLOC_MAX_DEVICES; d++) {
        heap_t *h = atomic_load_explicit(&g.heaps[d], memory_order_acquire);
        if (!h) continue;
        cualloc_stats s;
        heap_get_stats(h, &s);
        stats_write_text(&s, d, stderr);
    }
}

static void api_init(void) {
    conf_load(&g.conf);
    const char *disable = getenv("CUALLOC_DISABLE");
    g.disabled = disable && disable[0] && strcmp(disable, "0") != 0;
    g.drv = g.conf.driver == DRIVER_SIM ? &driver_sim_ops : &driver_cuda_ops;
    if (g.conf.driver == DRIVER_SIM) sim_configure(&g.conf);
    g.init_error = g.drv->init();
    if (g.init_error == CUA_SUCCESS) g.init_error = g.drv->device_count(&g.device_count);
    if (g.init_error != CUA_SUCCESS) {
        cua_error("the %s driver is not usable (%s); allocations will fail", g.drv->name, driver_error_name(g.init_error));
        g.device_count = 0;
    }
    if (g.conf.summary) atexit(api_print_summary);
    atomic_store_explicit(&g.ready, true, memory_order_release);
}

const conf_t *api_conf(void) {
    pthread_once(&g.once, api_init);
    return &g.conf;
}

const driver_ops_t *api_driver(void) {
    pthread_once(&g.once, api_init);
    return g.drv;
}

static heap_t *api_existing_heap(int device) {
    if (device < 0 || device >= g.device_count || device >= CUALLOC_MAX_DEVICES) return NULL;
    return atomic_load_explicit(&g.heaps[device], memory_order_acquire);
}

heap_t *api_heap(int device) {
    pthread_once(&g.once, api_init);
    if (device < 0 || device >= g.device_count || device >= CUALLOC_MAX_DEVICES) return NULL;
    heap_t *h = atomic_load_explicit(&g.heaps[device], memory_order_acquire);
    if (h) return h;
    pthread_mutex_lock(&g.create_lock);
    h = atomic_load_explicit(&g.heaps[device], memory_order_relaxed);
    if (!h && !g.heap_failed[device]) {
        h = heap_create(device, &g.conf, g.drv, NULL);
        /* A device whose heap cannot be set up says so once (heap_create did), not per call. */
        if (!h) g.heap_failed[device] = true;
        if (h && heap_is_vmm(h)) {
            for (int pi = 0; pi < POOL_COUNT; pi++) {
                heap_pool_range(h, (pool_id_t)pi, &g.ranges[device][pi].lo, &g.ranges[device][pi].hi);
            }
        }
        atomic_store_explicit(&g.heaps[device], h, memory_order_release);
    }
    pthread_mutex_unlock(&g.create_lock);
    return h;
}

CUALLOC_API void *cualloc_malloc(size_t size, int device, void *stream) {
    api_ensure_init();
    if (__builtin_expect(g.disabled, 0)) {
        cua_devptr p = 0;
        if (device < 0 || device >= g.device_count) return NULL;
        return g.drv->mem_alloc(device, size ? size : 1, &p) == CUA_SUCCESS ? (void *)(uintptr_t)p : NULL;
    }
    heap_t *h = NULL;
    if (__builtin_expect((unsigned)device < CUALLOC_MAX_DEVICES, 1))
        h = atomic_load_explicit(&g.heaps[device], memory_order_acquire);
    if (__builtin_expect(!h, 0) && !(h = api_heap(device))) {
        if (g.init_error == CUA_SUCCESS && (device < 0 || device >= g.device_count))
            cua_error("cualloc_malloc: device %d is not valid (%d device%s)", device, g.device_count,
                      g.device_count == 1 ? "" : "s");
        return NULL;
    }
    void *p = NULL;
    heap_alloc(h, size, (cua_stream)stream, &p);
    return p;
}

CUALLOC_API void cualloc_free(void *ptr, void *stream) {
    if (!ptr) return;
    api_ensure_init();
    if (__builtin_expect(g.disabled, 0)) {
        for (int d = 0; d < g.device_count; d++)
            if (g.drv->mem_free(d, (cua_devptr)(uintptr_t)ptr) == CUA_SUCCESS) return;
        return;
    }
    uintptr_t a = (uintptr_t)ptr;
    int n = g.device_count < CUALLOC_MAX_DEVICES ? g.device_count : CUALLOC_MAX_DEVICES;
    /* VMM heaps: the address range names the device. */
    for (int d = 0; d < n; d++) {
        for (int pi = 0; pi < POOL_COUNT; pi++) {
            if (a - g.ranges[d][pi].lo < g.ranges[d][pi].hi - g.ranges[d][pi].lo) {
                heap_t *h = atomic_load_explicit(&g.heaps[d], memory_order_acquire);
                if (h && heap_free(h, ptr, (cua_stream)stream)) return;
                goto not_owned;
            }
        }
    }
    /* Classic heaps: the block lookup says. */
    for (int d = 0; d < n; d++) {
        heap_t *h = api_existing_heap(d);
        if (h && !heap_is_vmm(h) && heap_free(h, ptr, (cua_stream)stream)) return;
    }
not_owned:
    cua_error("cualloc_free: %p was not allocated by cualloc (or was already freed); ignored", ptr);
}

CUALLOC_API int cualloc_get_stats(int device, cualloc_stats *out) {
    if (!out) return -1;
    pthread_once(&g.once, api_init);
    if (device < 0 || device >= g.device_count || device >= CUALLOC_MAX_DEVICES) return -1;
    heap_t *h = api_existing_heap(device);
    memset(out, 0, sizeof *out);
    if (h) heap_get_stats(h, out);
    return 0;
}

CUALLOC_API void cualloc_trim(int device) {
    pthread_once(&g.once, api_init);
    heap_t *h = api_existing_heap(device);
    if (h) heap_trim(h);
}

CUALLOC_API int cualloc_check(int device) {
    pthread_once(&g.once, api_init);
    heap_t *h = api_existing_heap(device);
    return h ? heap_check(h, stderr) : 0;
}
