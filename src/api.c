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
} g = {.once = PTHREAD_ONCE_INIT, .create_lock = PTHREAD_MUTEX_INITIALIZER};

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
    if (!h) {
        h = heap_create(device, &g.conf, g.drv, NULL);
        atomic_store_explicit(&g.heaps[device], h, memory_order_release);
    }
    pthread_mutex_unlock(&g.create_lock);
    return h;
}

CUALLOC_API void *cualloc_malloc(size_t size, int device, void *stream) {
    pthread_once(&g.once, api_init);
    if (g.disabled) {
        cua_devptr p = 0;
        if (device < 0 || device >= g.device_count) return NULL;
        return g.drv->mem_alloc(device, size ? size : 1, &p) == CUA_SUCCESS ? (void *)(uintptr_t)p : NULL;
    }
    heap_t *h = api_heap(device);
    if (!h) {
        if (g.init_error == CUA_SUCCESS)
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
    pthread_once(&g.once, api_init);
    if (g.disabled) {
        for (int d = 0; d < g.device_count; d++)
            if (g.drv->mem_free(d, (cua_devptr)(uintptr_t)ptr) == CUA_SUCCESS) return;
        return;
    }
    /* VMM heaps answer ownership from their address range without locking; classic heaps by
     * looking the block up, which heap_free does anyway. */
    for (int d = 0; d < g.device_count && d < CUALLOC_MAX_DEVICES; d++) {
        heap_t *h = api_existing_heap(d);
        if (!h || (heap_is_vmm(h) && !heap_owns(h, ptr))) continue;
        if (heap_free(h, ptr, (cua_stream)stream)) return;
    }
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
