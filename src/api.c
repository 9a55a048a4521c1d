/* api.c — the public C API (include/cualloc.h) and the process-wide state behind it: the
 * configuration, the driver backend, and one heap per device, created on first use. It owns
 * start-up (lazy: nothing happens before the first call) and the exit summary. It does not
 * allocate anything itself (heap.c does) or interpose CUDA.
 */
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A VMM heap as a free sees it: its pools' address ranges [lo, lo + span), so that a free finds
 * its heap without a call or a lock. A heap retired by a device reset keeps its entry with span 0,
 * which no address matches (span is written atomically for that; lo and heap never change). */
typedef struct api_vmm_s {
    struct { uintptr_t lo; _Atomic uintptr_t span; } pool[POOL_COUNT];
    heap_t *heap;
} api_vmm_t;

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
    /* The fast paths' copies, never written while disabled. fast_heap: each device's heap, for
     * cualloc_malloc, NULL while the recorder is on (api_fast_heap_update), so that its one test
     * also sends allocations to the stack capture. vmm: the VMM heaps in the order they were made; an
     * entry is written whole before nvmm counts it (release) and never changes after, so a free,
     * which scans the first nvmm entries, never reads one being written (heaps of several devices
     * are made in any order, by any thread). A heap made when every entry is taken (after device
     * resets) is not listed; the slow paths find it (api_owner, api_free_slow). */
    _Atomic(heap_t *) fast_heap[CUALLOC_MAX_DEVICES];
    api_vmm_t vmm[CUALLOC_MAX_DEVICES];
    _Atomic int nvmm;
} g = {.once = PTHREAD_ONCE_INIT, .create_lock = PTHREAD_MUTEX_INITIALIZER};

static void api_init(void);

static inline void api_ensure_init(void) {
    if (__builtin_expect(!atomic_load_explicit(&g.ready, memory_order_acquire), 0)) pthread_once(&g.once, api_init);
}

/* The devices that may have a heap: the driver's count, at most CUALLOC_MAX_DEVICES. */
static inline int api_ndevices(void) { return g.device_count < CUALLOC_MAX_DEVICES ? g.device_count : CUALLOC_MAX_DEVICES; }
/* A device ordinal the API answers for: one the driver has, below CUALLOC_MAX_DEVICES. */
static inline bool api_device_valid(int device) { return device >= 0 && device < api_ndevices(); }

/* At exit a lock may never come free: exit() called from a signal handler that interrupted this
 * thread inside the heap (or making one) hangs on it. So exit waits for each lock at most this
 * long (another thread's hold lasts microseconds), and leaves out what it could not lock. */
#define API_EXIT_WAIT_MS 200

static void api_print_summary(void) {
    for (int d = 0; d < g.device_count && d < CUALLOC_MAX_DEVICES; d++) {
        heap_t *h = atomic_load_explicit(&g.heaps[d], memory_order_acquire);
        if (!h) continue;
        cualloc_stats s;
        if (!heap_stats_try_hold(h, &s, API_EXIT_WAIT_MS)) { /* see API_EXIT_WAIT_MS */
            cua_error("device %d: the heap is busy at exit; no summary", d);
            continue;
        }
        heap_stats_release(h);
        stats_write_text(&s, d, stderr);
    }
}

/* fork: the child must not inherit a heap whose locks another parent thread may hold, nor
 * device memory it cannot use. prepare takes the create lock (no heap is being made while the
 * process is copied), then the sim device's lock, which the child takes again when it configures
 * the sim afresh (no parent thread is inside a sim call at the copy; no sim call takes the create
 * lock, so the order cannot deadlock), then the recorder's (trace_fork_prepare: no thread is
 * inside it at the copy; its holders take neither of the others); the parent releases them all;
 * the child releases the sim's (and the recorder forgets its own, trace_after_fork_child),
 * forgets every heap (abandoned, not freed: their memory belongs to the parent's device context)
 * and resets the state, so its next call initializes afresh. A heap lock held by another parent
 * thread at the fork stays held in the child's copy of that abandoned heap, which is never touched
 * again. */
static bool api_atfork_registered; /* survives the child's reset: register once per process */

static void api_atfork_prepare(void) {
    pthread_mutex_lock(&g.create_lock);
    sim_fork_prepare();
    trace_fork_prepare();
}

static void api_atfork_parent(void) {
    trace_fork_parent();
    sim_fork_release();
    pthread_mutex_unlock(&g.create_lock);
}

/* Tracing across fork: the child never writes the parent's file. When the template has %p it
 * opens its own at its next initialization (its heaps start empty, so nothing needs a snapshot);
 * otherwise it does not trace. */
static bool api_forked_child;
static char api_child_trace[PATH_MAX]; /* a template given to cualloc_trace_start may be that long */
/* The parent's heaps, kept reachable in the child (never used again), so that leak checkers do not
 * report their records as lost. */
static heap_t *api_abandoned_heaps[CUALLOC_MAX_DEVICES];

static void api_atfork_child(void) {
    sim_fork_release();
    api_forked_child = true;
    if (!trace_after_fork_child(api_child_trace, sizeof api_child_trace)) api_child_trace[0] = '\0';
    for (int d = 0; d < CUALLOC_MAX_DEVICES; d++) {
        heap_t *old = atomic_load_explicit(&g.heaps[d], memory_order_relaxed);
        if (old) api_abandoned_heaps[d] = old;
        atomic_store_explicit(&g.heaps[d], NULL, memory_order_relaxed);
        g.heap_failed[d] = false;
    }
    for (int d = 0; d < CUALLOC_MAX_DEVICES; d++) atomic_store_explicit(&g.fast_heap[d], NULL, memory_order_relaxed);
    memset(g.vmm, 0, sizeof g.vmm);
    atomic_store_explicit(&g.nvmm, 0, memory_order_relaxed);
    g.device_count = 0;
    g.init_error = CUA_SUCCESS;
    atomic_store_explicit(&g.ready, false, memory_order_relaxed);
    g.once = (pthread_once_t)PTHREAD_ONCE_INIT;
    g.create_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

static bool api_create_trylock(void *unused) {
    (void)unused;
    return pthread_mutex_trylock(&g.create_lock) == 0;
}

/* The END record: every device's statistics, then the file is closed. Every heap is held from its
 * statistics to the close (and no heap is made meanwhile), so that the END states what the trace's
 * own events add up to, however many threads allocate during the stop. At exit, a heap whose lock
 * stays taken is left out of the END (a device without statistics), and without the create lock
 * the file is left unended, as a crash leaves it: readable, its END missing. */
static void api_trace_end(bool at_exit) {
    cualloc_stats stats[CUALLOC_MAX_DEVICES];
    const cualloc_stats *per[CUALLOC_MAX_DEVICES] = {0};
    heap_t *held[CUALLOC_MAX_DEVICES] = {0};
    int n = api_ndevices();
    if (!at_exit) pthread_mutex_lock(&g.create_lock);
    else if (!retry_for_ms(api_create_trylock, NULL, API_EXIT_WAIT_MS)) return;
    for (int d = 0; d < n; d++) {
        heap_t *h = atomic_load_explicit(&g.heaps[d], memory_order_acquire);
        if (!h) continue;
        if (!at_exit) heap_stats_hold(h, &stats[d]);
        else if (!heap_stats_try_hold(h, &stats[d], API_EXIT_WAIT_MS)) continue;
        held[d] = h;
        per[d] = &stats[d];
    }
    trace_stop(per, n);
    for (int d = n - 1; d >= 0; d--)
        if (held[d]) heap_stats_release(held[d]);
    pthread_mutex_unlock(&g.create_lock);
}

static void api_trace_atexit(void) {
    if (trace_active()) api_trace_end(true);
}

static void api_init(void) {
    if (!api_atfork_registered) {
        api_atfork_registered = true;
        pthread_atfork(api_atfork_prepare, api_atfork_parent, api_atfork_child);
    }
    conf_load(&g.conf);
    g.disabled = conf_disabled();
    g.drv = g.conf.driver == DRIVER_SIM ? &driver_sim_ops : &driver_cuda_ops;
    if (g.conf.driver == DRIVER_SIM) sim_configure(&g.conf);
    g.init_error = g.drv->init();
    if (g.init_error == CUA_SUCCESS) g.init_error = g.drv->device_count(&g.device_count);
    if (g.init_error != CUA_SUCCESS) {
        cua_error("the %s driver is not usable (%s); allocations will fail", g.drv->name, driver_error_name(g.init_error));
        g.device_count = 0;
    }
    static bool summary_registered; /* not again in a forked child */
    if (g.conf.summary && !summary_registered) {
        summary_registered = true;
        atexit(api_print_summary);
    }
    static bool trace_registered;
    if (!trace_registered) {
        trace_registered = true;
        atexit(api_trace_atexit);
    }
    const char *trace = api_forked_child ? api_child_trace : g.conf.trace;
    if (trace[0] && !g.disabled) trace_start(trace, &g.conf); /* no heap exists yet: no snapshot */
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
    if (!api_device_valid(device)) return NULL;
    return atomic_load_explicit(&g.heaps[device], memory_order_acquire);
}

heap_t *api_heap(int device) {
    pthread_once(&g.once, api_init);
    if (!api_device_valid(device)) return NULL;
    heap_t *h = atomic_load_explicit(&g.heaps[device], memory_order_acquire);
    if (h) return h;
    pthread_mutex_lock(&g.create_lock);
    h = atomic_load_explicit(&g.heaps[device], memory_order_relaxed);
    if (!h && !g.heap_failed[device]) {
        cua_result err = CUA_SUCCESS;
        h = heap_create(device, &g.conf, g.drv, &err);
        /* A device whose heap cannot be set up says so once (heap_create did), not per call, and is
         * not tried again; but a host shortage may pass, and the next allocation tries again. */
        if (!h && err != CUA_ERROR_HOST_MEMORY) g.heap_failed[device] = true;
        bool publish = h && !g.disabled;
        if (publish && heap_is_vmm(h) && atomic_load_explicit(&g.nvmm, memory_order_relaxed) < CUALLOC_MAX_DEVICES) {
            /* create_lock serializes the writers; each heap is made once. */
            int k = atomic_load_explicit(&g.nvmm, memory_order_relaxed);
            api_vmm_t *v = &g.vmm[k];
            for (int pi = 0; pi < POOL_COUNT; pi++) {
                uintptr_t lo, hi;
                heap_pool_range(h, (pool_id_t)pi, &lo, &hi);
                v->pool[pi].lo = lo;
                atomic_store_explicit(&v->pool[pi].span, hi - lo, memory_order_relaxed);
            }
            v->heap = h;
            atomic_store_explicit(&g.nvmm, k + 1, memory_order_release);
        }
        atomic_store_explicit(&g.heaps[device], h, memory_order_release);
        if (publish && !trace_enabled()) atomic_store_explicit(&g.fast_heap[device], h, memory_order_release);
    }
    pthread_mutex_unlock(&g.create_lock);
    return h;
}

bool api_started(void) { return atomic_load_explicit(&g.ready, memory_order_acquire); }

int api_device_count(void) { return api_started() ? g.device_count : 0; }

heap_t *api_heap_if_created(int device) { return api_started() ? api_existing_heap(device) : NULL; }

/* Does address a lie in v's pool `pool`? */
static inline bool api_in_pool(const api_vmm_t *v, pool_id_t pool, uintptr_t a) {
    return a - v->pool[pool].lo < atomic_load_explicit(&v->pool[pool].span, memory_order_relaxed);
}

/* Does address a lie in one of v's pools? (Two pools: unrolled.) */
static inline bool api_in_vmm_range(const api_vmm_t *v, uintptr_t a) {
    _Static_assert(POOL_COUNT == 2, "api_in_vmm_range checks two pools");
    return api_in_pool(v, POOL_SMALL, a) || api_in_pool(v, POOL_LARGE, a);
}

/* The heap whose VMM ranges hold ptr (the range table, lock-free), else the first heap `claims`
 * says holds it (classic heaps, and a VMM heap the table could not list). */
static heap_t *api_find(const void *ptr, bool (*claims)(heap_t *, const void *)) {
    if (!ptr || !api_started() || g.disabled) return NULL;
    uintptr_t a = (uintptr_t)ptr;
    int nvmm = atomic_load_explicit(&g.nvmm, memory_order_acquire);
    for (int k = 0; k < nvmm; k++)
        if (api_in_vmm_range(&g.vmm[k], a)) return g.vmm[k].heap;
    int n = api_ndevices();
    for (int d = 0; d < n; d++) {
        heap_t *h = api_existing_heap(d);
        if (h && claims(h, ptr)) return h;
    }
    return NULL;
}

heap_t *api_owner(const void *ptr) { return api_find(ptr, heap_owns); }

heap_t *api_holder(const void *ptr) { return api_find(ptr, heap_holds); }

/* The addresses of a heap's allocated blocks (heap_snapshot's callback, which may not call the heap). */
typedef struct api_live_s {
    uintptr_t *addr;
    size_t n, cap;
} api_live_t;

static void api_collect_live(int dev, const block_t *b, void *arg) {
    (void)dev;
    api_live_t *l = arg;
    uintptr_t *a = grow_table_reserve(l->addr, l->n, &l->cap, sizeof *l->addr);
    if (!a) return; /* (the trace then shows those blocks live) */
    l->addr = a;
    l->addr[l->n++] = b->addr;
}

/* Device `device`'s primary context is about to be reset (cudaDeviceReset calls
 * cuDevicePrimaryCtxReset): everything allocated in it dies, cualloc's memory included, and CUDA
 * makes a new context at the next call. Its heap is retired first, while the context still lives:
 * unlisted (the next allocation makes a new heap, in the new context), then destroyed, which gives
 * its mappings, handles, address ranges and events back to the driver. Pointers into it die, as
 * CUDA's own do. As CUDA requires, no other thread may use the device meanwhile. */
void api_device_reset(int device) {
    if (!api_started() || g.disabled || !api_device_valid(device)) return;
    pthread_mutex_lock(&g.create_lock);
    heap_t *h = atomic_load_explicit(&g.heaps[device], memory_order_acquire);
    atomic_store_explicit(&g.fast_heap[device], NULL, memory_order_release);
    atomic_store_explicit(&g.heaps[device], NULL, memory_order_release);
    g.heap_failed[device] = false;
    int nvmm = atomic_load_explicit(&g.nvmm, memory_order_relaxed);
    for (int k = 0; h && k < nvmm; k++)
        if (g.vmm[k].heap == h)
            for (int pi = 0; pi < POOL_COUNT; pi++)
                atomic_store_explicit(&g.vmm[k].pool[pi].span, 0, memory_order_relaxed);
    pthread_mutex_unlock(&g.create_lock);
    if (!h) return;
    if (trace_enabled()) {
        /* The recorder sees the blocks still allocated die with the context, as frees (then
         * heap_destroy's unmaps), so that the trace does not show them live for ever. */
        api_live_t live = {NULL, 0, 0};
        heap_snapshot(h, NULL, api_collect_live, NULL, &live);
        for (size_t i = 0; i < live.n; i++) heap_free_device_wide(h, (void *)live.addr[i]);
        grow_table_free(live.addr, live.cap, sizeof *live.addr);
    }
    heap_destroy(h);
}

/* fast_heap follows the recorder: cleared for every device when it starts, set again by the first
 * allocation that finds it off (it may also stop by itself: a full file, a write error). Under
 * create_lock, which api_trace_start holds across the start and the clearing, so that a heap is
 * never published while the recorder is on. */
static void api_fast_heap_update_locked(void) {
    bool on = trace_enabled();
    for (int d = 0; d < api_ndevices(); d++) {
        heap_t *h = on || g.disabled ? NULL : atomic_load_explicit(&g.heaps[d], memory_order_acquire);
        atomic_store_explicit(&g.fast_heap[d], h, memory_order_release);
    }
}

static void api_fast_heap_update(void) {
    pthread_mutex_lock(&g.create_lock);
    api_fast_heap_update_locked();
    pthread_mutex_unlock(&g.create_lock);
}

/* An invalid device is named by the function `fn` it was given to, disabled or not (a driver that
 * is not usable said so at start). */
static void api_report_invalid_device(const char *fn, int device) {
    if (g.init_error == CUA_SUCCESS && !api_device_valid(device))
        cua_error("%s: device %d is not valid (%d device%s)", fn, device, api_ndevices(),
                  api_ndevices() == 1 ? "" : "s");
}

/* cualloc_malloc's other cases, out of line so that the common one needs no stack frame: no heap
 * yet (or an invalid device), cualloc disabled, or the recorder on (or just off). `caller_ip`:
 * cualloc_malloc's return address, where the recorded stack starts (cualloc_malloc may or may not
 * have tail-called this function, so a frame count would not do). */
static __attribute__((noinline)) void *api_malloc_slow(size_t size, int device, void *stream, const void *caller_ip) {
    api_ensure_init();
    if (g.disabled) {
        cua_devptr p = 0;
        if (device < 0 || device >= g.device_count) {
            api_report_invalid_device("cualloc_malloc", device);
            return NULL;
        }
        return g.drv->mem_alloc(device, size ? size : 1, &p) == CUA_SUCCESS ? (void *)(uintptr_t)p : NULL;
    }
    heap_t *h = api_existing_heap(device);
    if (!h && !(h = api_heap(device))) {
        api_report_invalid_device("cualloc_malloc", device);
        return NULL;
    }
    /* The call stack, before any heap lock is taken (it may define new stack records). */
    if (trace_enabled()) trace_capture_stack_from(caller_ip);
    else if (!atomic_load_explicit(&g.fast_heap[device], memory_order_relaxed)) api_fast_heap_update();
    return heap_malloc(h, size, (cua_stream)stream);
}

/* noinline: __builtin_return_address(0) must be this function's own return address. */
CUALLOC_API __attribute__((noinline)) void *cualloc_malloc(size_t size, int device, void *stream) {
    heap_t *h = NULL;
    if (__builtin_expect((unsigned)device < CUALLOC_MAX_DEVICES, 1))
        h = atomic_load_explicit(&g.fast_heap[device], memory_order_acquire);
    /* Published only after api_init, never while disabled, and not while the recorder is on. */
    if (__builtin_expect(!h, 0)) return api_malloc_slow(size, device, stream, __builtin_return_address(0));
    return heap_malloc(h, size, (cua_stream)stream);
}

/* cualloc_free's other cases, out of line so that the common one needs no frame: NULL, api_init
 * may not have run, cualloc is disabled, the heap is classic, or the pointer is not ours. */
static __attribute__((noinline)) void api_free_slow(void *ptr, void *stream) {
    if (!ptr) return;
    api_ensure_init();
    if (g.disabled) {
        /* Pass-through: the driver knows its pointers; one that no device frees is reported below. */
        for (int d = 0; d < g.device_count; d++)
            if (g.drv->mem_free(d, (cua_devptr)(uintptr_t)ptr) == CUA_SUCCESS) return;
        cua_error("cualloc_free: %p was not allocated by the driver (or was already freed); ignored (cualloc is "
                  "disabled: CUALLOC_DISABLE)", ptr);
        return;
    }
    /* Classic heaps: the block lookup says; a VMM heap the table could not list: its ranges. */
    int n = api_ndevices();
    for (int d = 0; d < n; d++) {
        heap_t *h = api_existing_heap(d);
        if (h && (!heap_is_vmm(h) || heap_owns(h, ptr)) && heap_free(h, ptr, (cua_stream)stream)) return;
    }
    cua_error("cualloc_free: %p was not allocated by cualloc (or was already freed); ignored", ptr);
}

CUALLOC_API void cualloc_free(void *ptr, void *stream) {
    uintptr_t a = (uintptr_t)ptr;
    /* VMM heaps: the address range names the heap. Ranges are published with their heap, after
     * api_init, never while disabled (before it, and in a forked child until its first heap, nvmm
     * is 0). NULL lies in no range (every range starts above 0). */
    const api_vmm_t *end = g.vmm + atomic_load_explicit(&g.nvmm, memory_order_acquire);
    for (const api_vmm_t *v = g.vmm; v < end; v++) {
        /* Tail calls, told the pool (the heap need not find it again): the heap reports a pointer
         * it does not hold, so no result comes back. */
        if (api_in_pool(v, POOL_SMALL, a)) {
            heap_free_in_small_pool(v->heap, ptr, (cua_stream)stream);
            return;
        }
        if (api_in_pool(v, POOL_LARGE, a)) {
            heap_free_in_large_pool(v->heap, ptr, (cua_stream)stream);
            return;
        }
    }
    api_free_slow(ptr, stream);
}

CUALLOC_API int cualloc_get_stats(int device, cualloc_stats *out) {
    if (!out) return -1;
    pthread_once(&g.once, api_init);
    if (!api_device_valid(device)) return -1;
    heap_t *h = api_existing_heap(device);
    memset(out, 0, sizeof *out);
    if (h) heap_get_stats(h, out);
    return 0;
}

/* PyTorch's own size format (c10 format_size), for the figures of cualloc_oom_message, which reads
 * like PyTorch's message: bytes up to 1 KiB included, then KiB up to 1 MiB included, MiB up to
 * 1 GiB included, and GiB for everything larger (1 MiB reads "1024.00 KiB", 1 TiB "1024.00 GiB",
 * as PyTorch prints them). */
static const char *torch_size(size_t bytes, char *buf, size_t len) {
    if (bytes <= ((size_t)1 << 10))
        snprintf(buf, len, "%zu bytes", bytes);
    else if (bytes <= ((size_t)1 << 20))
        snprintf(buf, len, "%.2f KiB", (double)bytes / (double)((size_t)1 << 10));
    else if (bytes <= ((size_t)1 << 30))
        snprintf(buf, len, "%.2f MiB", (double)bytes / (double)((size_t)1 << 20));
    else
        snprintf(buf, len, "%.2f GiB", (double)bytes / (double)((size_t)1 << 30));
    return buf;
}

CUALLOC_API int cualloc_oom_message(size_t size, int device, char *buf, size_t len) {
    if (!buf || !len) return -1;
    pthread_once(&g.once, api_init);
    char req[32];
    torch_size(size, req, sizeof req);
    if (g.init_error != CUA_SUCCESS || !api_device_valid(device)) {
        /* Not out of memory either: as after a driver error (below), the message begins as
         * PyTorch's own CUDA errors do, so that code retrying a smaller batch on an OOM does not. */
        snprintf(buf, len,
                 "CUDA error: device %d is not a device cualloc can use (no such device, or the CUDA driver is "
                 "not usable; see the \"cualloc:\" messages on stderr) while allocating %s (%zu bytes); not out of "
                 "memory.",
                 device, req, size);
        return 0;
    }
    /* Disabled: the request went to the driver itself (api_malloc_slow), past every heap, so a
     * heap's figures would describe memory that was never asked for; none is made here either. */
    if (g.disabled) {
        size_t dfree = 0, dtotal = 0;
        char devfree[32];
        bool dknown = g.drv->mem_get_info(device, &dfree, &dtotal) == CUA_SUCCESS;
        snprintf(buf, len,
                 "CUDA out of memory. Tried to allocate %s (%zu bytes) on device %d. cualloc is disabled "
                 "(CUALLOC_DISABLE), so the request went straight to the driver, which refused it; the device "
                 "reports %s free. No cualloc setting applies while it is disabled.",
                 req, size, device, dknown ? torch_size(dfree, devfree, sizeof devfree) : "(unknown)");
        return 0;
    }
    /* No allocation yet on the device: its heap is made now (as the request itself would make it),
     * so the answer is the diagnosis the request would get, not a set-up failure that never was. */
    heap_t *h = api_heap(device);
    if (!h) {
        snprintf(buf, len,
                 "CUDA out of memory. Tried to allocate %s (%zu bytes) on device %d, but cualloc could not "
                 "set up a heap on this device (see the \"cualloc:\" messages on stderr).",
                 req, size, device);
        return 0;
    }
    cualloc_stats s;
    size_t dfree = 0;
    bool dknown = false;
    char diagnosis[1024], cap[32], alloc[32], resv[32], cached[32], largest[32], devfree[32];
    cua_result driver_error = heap_oom_facts(h, size, &s, &dfree, &dknown, diagnosis, sizeof diagnosis);
    if (driver_error != CUA_SUCCESS) {
        /* Not out of memory: a message that began as PyTorch's OutOfMemoryError does would send code
         * that retries a smaller batch on it (Accelerate's find_executable_batch_size) into a context
         * that fails every call. It begins as PyTorch's own CUDA errors do. */
        snprintf(buf, len,
                 "CUDA error: %s (%d) while cualloc allocated %s (%zu bytes) on device %d; not out of memory. "
                 "Diagnosis: %s",
                 driver_error_name(driver_error), (int)driver_error, req, size, device, diagnosis);
        return 0;
    }
    snprintf(buf, len,
             "CUDA out of memory. Tried to allocate %s (%zu bytes) on device %d. cualloc's heap on device "
             "%d has a capacity of %s; %s is allocated, %s reserved, of which %s is reserved but unallocated; the "
             "largest free block is %s; the device reports %s free. Diagnosis: %s (%" PRIu64
             " out-of-memory failure%s on this device so far.)",
             req, size, device, device, torch_size(s.capacity_bytes, cap, sizeof cap),
             torch_size(s.allocated_bytes, alloc, sizeof alloc), torch_size(s.reserved_bytes, resv, sizeof resv),
             torch_size(s.reserved_bytes - s.allocated_bytes, cached, sizeof cached),
             torch_size(s.largest_free_block, largest, sizeof largest),
             dknown ? torch_size(dfree, devfree, sizeof devfree) : "(unknown)", diagnosis, s.num_ooms,
             s.num_ooms == 1 ? "" : "s");
    return 0;
}

CUALLOC_API int cualloc_reset_peaks(int device) {
    pthread_once(&g.once, api_init);
    if (!api_device_valid(device)) return -1;
    heap_t *h = api_existing_heap(device);
    if (h) heap_reset_peaks(h);
    return 0;
}

CUALLOC_API void cualloc_trim(int device) {
    pthread_once(&g.once, api_init);
    heap_t *h = api_existing_heap(device);
    if (h) heap_trim(h);
    else api_report_invalid_device("cualloc_trim", device); /* a valid one without a heap: nothing cached */
}

CUALLOC_API int cualloc_check(int device) {
    pthread_once(&g.once, api_init);
    heap_t *h = api_existing_heap(device);
    if (h) return heap_check(h, stderr);
    if (!api_device_valid(device)) {
        api_report_invalid_device("cualloc_check", device);
        return -1;
    }
    return 0; /* no heap yet: nothing to be inconsistent */
}

CUALLOC_API int cualloc_enable_peer_access_all(void) {
    api_ensure_init();
    if (g.init_error != CUA_SUCCESS || !g.drv->peer_enable) return -1;
    if (g.disabled) return 0;
    int n = api_ndevices(), pairs = 0;
    for (int owner = 0; owner < n; owner++) {
        int here = 0;
        for (int acc = 0; acc < n; acc++)
            if (acc != owner && g.drv->peer_enable(owner, acc) == CUA_SUCCESS) here++;
        heap_t *h = api_existing_heap(owner);
        if (here && h) heap_peer_enabled(h);
        pairs += here;
    }
    return pairs;
}

/* ------------------------------------------------------------------ tracing */

static void api_snap_map(int dev, uintptr_t addr, size_t size, void *arg) {
    (void)arg;
    trace_on_initial_map(dev, addr, size);
}

static void api_snap_block(int dev, const block_t *b, void *arg) {
    (void)arg;
    trace_on_initial_block(dev, b->stream, b->addr, b->size, b->requested);
}

static void api_snap_done(int dev, void *arg) {
    (void)arg;
    trace_device_begin(dev);
}

CUALLOC_API int cualloc_trace_start(const char *path) {
    api_ensure_init();
    return api_trace_start(path, &g.conf);
}

int api_trace_start(const char *path, const conf_t *conf) {
    api_ensure_init();
    if (!path || !path[0]) {
        cua_error("cualloc_trace_start: no path given");
        return -1;
    }
    if (g.disabled) {
        cua_error("cualloc_trace_start: cualloc is disabled (CUALLOC_DISABLE); nothing to trace");
        return -1;
    }
    /* Under the create lock no heap appears meanwhile: each existing one is snapshotted (its
     * live blocks and mapped memory become INIT records), each later one records itself. */
    pthread_mutex_lock(&g.create_lock);
    int r = trace_start(path, conf);
    if (r == 0) {
        api_fast_heap_update_locked();
        int n = api_ndevices();
        for (int d = 0; d < n; d++) {
            heap_t *h = atomic_load_explicit(&g.heaps[d], memory_order_acquire);
            if (!h) continue;
            if (trace_device_begun(d)) heap_snapshot(h, NULL, NULL, NULL, NULL); /* only to start recording */
            else heap_snapshot(h, api_snap_map, api_snap_block, api_snap_done, NULL);
        }
    }
    pthread_mutex_unlock(&g.create_lock);
    return r;
}

/* Both initialize first, as every entry point does: trace:PATH in CUALLOC_CONF starts at the first
 * call into cualloc, and a stop or a mark may be that call (a stop then ends the trace it started;
 * a mark is recorded in it). After the first call, api_ensure_init is one load. */
CUALLOC_API void cualloc_trace_stop(void) {
    api_ensure_init();
    if (!trace_active()) return;
    api_trace_end(false);
    api_fast_heap_update();
}

CUALLOC_API void cualloc_mark(const char *label) {
    api_ensure_init();
    if (trace_enabled()) trace_mark(label ? label : "");
}
