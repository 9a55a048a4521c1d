/* fake_libcuda.c — a fake libcuda.so.1 over the sim device, so driver_cuda.c (and, later, the
 * interposition front doors) run in CI without a GPU. It exports, with default visibility, the
 * CUDA driver entry points cualloc uses, plus a few fakecuda_* helpers for tests. It owns only the
 * translation (contexts, the device an entry point means, argument checks CUDA makes); every rule
 * about memory is the sim's (src/driver_sim.c). Configuration: CUALLOC_CONF's sim_* keys, read at
 * cuInit. Thread-safe as the sim is; the context stack is per thread, as CUDA's.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_DRIVER_VERSION 12080
#define FAKE_CTX_DEPTH 64
/* CUdriverProcAddressQueryResult */
#define FAKE_PROC_SUCCESS 0
#define FAKE_PROC_SYMBOL_NOT_FOUND 1
#define FAKE_MEM_ALLOC_GRANULARITY_RECOMMENDED 1

/* The entry points cuda_decls.h has a pointer type for are declared from that type, so the
 * compiler checks this file against cuda_decls.h (which cuda_decls_check.c checks against cuda.h). */
#define FAKE_DECLARE(sym) FAKE_API __typeof__(*(cua_pfn_##sym)0) sym;
FAKE_DECLARE(cuInit)
FAKE_DECLARE(cuDriverGetVersion)
FAKE_DECLARE(cuGetProcAddress_v2)
FAKE_DECLARE(cuDeviceGet)
FAKE_DECLARE(cuDeviceGetCount)
FAKE_DECLARE(cuDeviceGetName)
FAKE_DECLARE(cuDeviceTotalMem_v2)
FAKE_DECLARE(cuDeviceGetAttribute)
FAKE_DECLARE(cuDevicePrimaryCtxRetain)
FAKE_DECLARE(cuCtxPushCurrent_v2)
FAKE_DECLARE(cuCtxPopCurrent_v2)
FAKE_DECLARE(cuCtxSynchronize)
FAKE_DECLARE(cuMemGetInfo_v2)
FAKE_DECLARE(cuMemAlloc_v2)
FAKE_DECLARE(cuMemFree_v2)
FAKE_DECLARE(cuMemGetAllocationGranularity)
FAKE_DECLARE(cuMemAddressReserve)
FAKE_DECLARE(cuMemAddressFree)
FAKE_DECLARE(cuMemCreate)
FAKE_DECLARE(cuMemRelease)
FAKE_DECLARE(cuMemMap)
FAKE_DECLARE(cuMemUnmap)
FAKE_DECLARE(cuMemSetAccess)
FAKE_DECLARE(cuEventCreate)
FAKE_DECLARE(cuEventDestroy_v2)
FAKE_DECLARE(cuEventRecord)
FAKE_DECLARE(cuEventQuery)
FAKE_DECLARE(cuEventSynchronize)
FAKE_DECLARE(cuStreamSynchronize)
FAKE_API cua_result cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags);
FAKE_API cua_result cuDevicePrimaryCtxRelease_v2(cua_device dev);
FAKE_DECLARE(cuDevicePrimaryCtxReset_v2)
FAKE_API cua_result cuDevicePrimaryCtxReset(cua_device dev);
FAKE_API cua_result cuCtxGetCurrent(cua_ctx *ctx);
FAKE_API cua_result cuCtxSetCurrent(cua_ctx ctx);
FAKE_API cua_result cuCtxGetDevice(cua_device *dev);
/* Stream-ordered allocation: the sim has no memory pools; served like cuMemAlloc/cuMemFree (the
 * stream is only checked). The _ptsz variants are what flags PER_THREAD_DEFAULT_STREAM returns. */
FAKE_API cua_result cuMemAllocAsync(cua_devptr *dptr, size_t bytes, cua_stream stream);
FAKE_API cua_result cuMemFreeAsync(cua_devptr dptr, cua_stream stream);
FAKE_API cua_result cuMemAllocAsync_ptsz(cua_devptr *dptr, size_t bytes, cua_stream stream);
FAKE_API cua_result cuMemFreeAsync_ptsz(cua_devptr dptr, cua_stream stream);
/* A device's current memory pool: its default one (a fixed stand-in per device) until set; the
 * sim serves stream-ordered allocations alike from any. */
FAKE_API cua_result cuDeviceGetDefaultMemPool(void **pool, cua_device dev);
FAKE_API cua_result cuDeviceSetMemPool(cua_device dev, void *pool);
FAKE_API cua_result cuDeviceGetMemPool(void **pool, cua_device dev);
FAKE_API cua_result cuGetErrorName(cua_result r, const char **str);
FAKE_API cua_result cuGetErrorString(cua_result r, const char **str);
FAKE_DECLARE(cuMemGetAddressRange_v2)
FAKE_API cua_result cuMemsetD8_v2(cua_devptr dptr, unsigned char value, size_t n);
FAKE_API cua_result cuMemcpyDtoH_v2(void *dst, cua_devptr src, size_t n);
FAKE_API cua_result cuStreamCreate(cua_stream *stream, unsigned int flags);
FAKE_API cua_result cuGreenCtxStreamCreate(cua_stream *stream, void *green_ctx, unsigned int flags, int priority);
FAKE_API cua_result cuStreamDestroy_v2(cua_stream stream);
FAKE_API cua_result cuStreamGetCtx(cua_stream stream, cua_ctx *ctx);
FAKE_DECLARE(cuStreamIsCapturing)
FAKE_DECLARE(cuThreadExchangeStreamCaptureMode)
FAKE_DECLARE(cuDeviceCanAccessPeer)
FAKE_API void fakecuda_stream_set_capturing(cua_stream s, int capturing);

/* Test helpers (not CUDA): the sim's counters and controls, reached with dlsym. */
FAKE_API uint64_t fakecuda_calls(int op);
FAKE_API size_t fakecuda_used_bytes(int dev);
FAKE_API size_t fakecuda_live_handles(int dev);
FAKE_API size_t fakecuda_live_mappings(int dev);
FAKE_API void fakecuda_fail(int op, unsigned after, unsigned count, int err);
FAKE_API cua_stream fakecuda_stream_create(int dev, int held);
FAKE_API void fakecuda_stream_complete(cua_stream s);
FAKE_API int fakecuda_ctx_depth(void);
FAKE_API unsigned fakecuda_ctx_retains(int dev);
/* Device memory straight from the sim (cuMemAlloc without any interposer on the way), for tests of
 * foreign-pointer pass-through. Returns a CUresult. */
FAKE_API int fakecuda_mem_alloc_direct(int dev, size_t size, cua_devptr *out);
/* How many calls named a stream that is not one (neither NULL, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD nor a live stream): the real driver would read it as a CUstream_st. */
FAKE_API uint64_t fakecuda_bad_stream_handles(void);
/* Captures invalidated so far (the sim's count): an event recorded on a capturing stream, a
 * synchronize of one, a device synchronize while one of the device's streams captures. */
FAKE_API uint64_t fakecuda_captures_broken(void);
/* Calls so far of the driver entry point `name` (its exported name: "cuCtxGetCurrent",
 * "cuMemAlloc_v2"); with NULL, of all of them together. */
FAKE_API uint64_t fakecuda_entry_calls(const char *name);

static const driver_ops_t *const sim_ops = &driver_sim_ops;

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static int fake_ready;          /* cuInit succeeded (atomic) */
static cua_result fake_init_result = CUA_ERROR_NOT_INITIALIZED; /* of the first cuInit */
static bool fake_inited;        /* cuInit ran (under fake_lock) */
static bool fake_host_backed;   /* set before fake_ready */
static int fake_ndev;           /* set before fake_ready */

/* The primary context of device i is &fake_ctx[i]; usable while retained and not reset. */
typedef struct fake_ctx_s {
    int dev;
    unsigned retains; /* atomic */
    int reset;        /* atomic: destroyed by cuDevicePrimaryCtxReset, until retained again */
} fake_ctx_t;
static fake_ctx_t fake_ctx[CUALLOC_MAX_DEVICES];

static __thread cua_ctx ctx_stack[FAKE_CTX_DEPTH];
static __thread int ctx_depth;

static uint64_t fake_bad_streams; /* atomic */

/* A stream handle CUDA accepts: NULL, CU_STREAM_LEGACY (0x1), CU_STREAM_PER_THREAD (0x2) or a live
 * stream. Any other value is counted (fakecuda_bad_stream_handles) and refused. */
static bool stream_known(cua_stream s) {
    if ((uintptr_t)s <= 2 || sim_stream_device(s) >= 0) return true;
    __atomic_add_fetch(&fake_bad_streams, 1, __ATOMIC_RELAXED);
    return false;
}

static bool ready(void) { return __atomic_load_n(&fake_ready, __ATOMIC_ACQUIRE) != 0; }

/* Calls of each driver entry point, by the function's own name (its __func__, whose address is
 * the key: one string per function), so that a test can count what the front door asks of the
 * driver (fakecuda_entry_calls). Open addressing, filled lock-free: a slot's name is set once
 * (compare-and-swap from NULL) and never changes. FAKE_ENTRY_SLOTS exceeds the number of entry
 * points, so a search always ends. A call that only forwards to another entry point (the _ptsz
 * variants, cuDevicePrimaryCtxReset, cuGetProcAddress) counts as the one it forwards to;
 * cuGetErrorName and cuGetErrorString, which only name codes, are not counted. */
#define FAKE_ENTRY_SLOTS 128
static struct {
    const char *name;
    uint64_t calls; /* atomic */
} entry_calls[FAKE_ENTRY_SLOTS];

static void entry_count(const char *fn) {
    size_t i = ((uintptr_t)fn >> 3) % FAKE_ENTRY_SLOTS;
    for (;; i = (i + 1) % FAKE_ENTRY_SLOTS) {
        const char *k = __atomic_load_n(&entry_calls[i].name, __ATOMIC_ACQUIRE);
        if (!k && __atomic_compare_exchange_n(&entry_calls[i].name, &k, fn, false, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE))
            k = fn;
        if (k == fn) {
            __atomic_add_fetch(&entry_calls[i].calls, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* The start of an entry point that needs cuInit: counted, then "is the driver initialized?". */
static bool entry_ready(const char *fn) {
    entry_count(fn);
    return ready();
}

static bool device_valid(int dev) { return dev >= 0 && dev < fake_ndev; }

/* The device of a context value, -1 when it is none of ours or not retained. */
static int ctx_device(cua_ctx c) {
    uintptr_t p = (uintptr_t)c, base = (uintptr_t)fake_ctx;
    if (p < base || p >= base + sizeof fake_ctx || (p - base) % sizeof(fake_ctx_t) != 0) return -1;
    int dev = (int)((p - base) / sizeof(fake_ctx_t));
    if (!device_valid(dev) || __atomic_load_n(&fake_ctx[dev].retains, __ATOMIC_RELAXED) == 0) return -1;
    if (__atomic_load_n(&fake_ctx[dev].reset, __ATOMIC_ACQUIRE)) return -1;
    return dev;
}

/* The device of this thread's current context, -1 when none. */
static int current_device(void) { return ctx_depth > 0 ? ctx_device(ctx_stack[ctx_depth - 1]) : -1; }

/* For entry points whose object knows its device: that one, else the current one, else 0 (the
 * sim then rejects the unknown object, and counts the call). */
static int device_or_current(int dev) {
    if (dev >= 0) return dev;
    dev = current_device();
    return dev >= 0 ? dev : 0;
}

/* ------------------------------------------------------------------ init, version, lookup */

cua_result cuInit(unsigned int flags) {
    entry_count(__func__);
    if (flags != 0) return CUA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    if (!fake_inited) {
        fake_inited = true;
        conf_t c;
        conf_load(&c);
        sim_configure(&c);
        fake_init_result = sim_ops->init();
        int n = 0;
        if (fake_init_result == CUA_SUCCESS) fake_init_result = sim_ops->device_count(&n);
        if (fake_init_result == CUA_SUCCESS) {
            fake_host_backed = c.sim_host_backed;
            fake_ndev = n;
            for (int i = 0; i < n; i++) fake_ctx[i].dev = i;
            __atomic_store_n(&fake_ready, 1, __ATOMIC_RELEASE);
        }
    }
    cua_result r = fake_init_result;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

cua_result cuDriverGetVersion(int *version) {
    entry_count(__func__);
    if (!version) return CUA_ERROR_INVALID_VALUE;
    *version = FAKE_DRIVER_VERSION;
    return CUA_SUCCESS;
}

/* Unversioned names, as cuGetProcAddress takes them, and the version each answers with. */
static const struct {
    const char *name;
    void *fn;
} proc_table[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGetName", (void *)cuDeviceGetName},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset_v2},
    {"cuCtxPushCurrent", (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", (void *)cuCtxPopCurrent_v2},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
    {"cuMemAlloc", (void *)cuMemAlloc_v2},
    {"cuMemFree", (void *)cuMemFree_v2},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool},
    {"cuDeviceSetMemPool", (void *)cuDeviceSetMemPool},
    {"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool},
    {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve},
    {"cuMemAddressFree", (void *)cuMemAddressFree},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemMap", (void *)cuMemMap},
    {"cuMemUnmap", (void *)cuMemUnmap},
    {"cuMemSetAccess", (void *)cuMemSetAccess},
    {"cuMemGetAddressRange", (void *)cuMemGetAddressRange_v2},
    {"cuMemsetD8", (void *)cuMemsetD8_v2},
    {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_v2},
    {"cuEventCreate", (void *)cuEventCreate},
    {"cuEventDestroy", (void *)cuEventDestroy_v2},
    {"cuEventRecord", (void *)cuEventRecord},
    {"cuEventQuery", (void *)cuEventQuery},
    {"cuEventSynchronize", (void *)cuEventSynchronize},
    {"cuStreamCreate", (void *)cuStreamCreate},
    {"cuGreenCtxStreamCreate", (void *)cuGreenCtxStreamCreate},
    {"cuStreamDestroy", (void *)cuStreamDestroy_v2},
    {"cuStreamGetCtx", (void *)cuStreamGetCtx},
    {"cuStreamSynchronize", (void *)cuStreamSynchronize},
    {"cuStreamIsCapturing", (void *)cuStreamIsCapturing},
    {"cuThreadExchangeStreamCaptureMode", (void *)cuThreadExchangeStreamCaptureMode},
    {"cuDeviceCanAccessPeer", (void *)cuDeviceCanAccessPeer},
    {"cuGetErrorName", (void *)cuGetErrorName},
    {"cuGetErrorString", (void *)cuGetErrorString},
};

cua_result cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                               int *symbol_status) {
    entry_count(__func__);
    if (!symbol || !pfn) return CUA_ERROR_INVALID_VALUE;
    if (flags > CUA_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return CUA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof proc_table / sizeof proc_table[0]; i++) {
        if (strcmp(symbol, proc_table[i].name) == 0) {
            /* Before CUDA 12.0 the name meant the four-argument cuGetProcAddress. */
            *pfn = strcmp(symbol, "cuGetProcAddress") == 0 && cuda_version < 12000 ? (void *)cuGetProcAddress
                                                                                  : proc_table[i].fn;
            /* Before CUDA 11.0, the first cuDevicePrimaryCtxReset. */
            if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0 && cuda_version < 11000)
                *pfn = (void *)cuDevicePrimaryCtxReset;
            if (flags == CUA_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
                if (proc_table[i].fn == (void *)cuMemAllocAsync) *pfn = (void *)cuMemAllocAsync_ptsz;
                if (proc_table[i].fn == (void *)cuMemFreeAsync) *pfn = (void *)cuMemFreeAsync_ptsz;
            }
            if (symbol_status) *symbol_status = FAKE_PROC_SUCCESS;
            return CUA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (symbol_status) *symbol_status = FAKE_PROC_SYMBOL_NOT_FOUND;
    return CUA_ERROR_NOT_FOUND;
}

cua_result cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}

/* ------------------------------------------------------------------ devices and contexts */

cua_result cuDeviceGet(cua_device *dev, int ordinal) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    if (!device_valid(ordinal)) return CUA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUA_SUCCESS;
}

cua_result cuDeviceGetCount(int *count) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!count) return CUA_ERROR_INVALID_VALUE;
    *count = fake_ndev;
    return CUA_SUCCESS;
}

cua_result cuDeviceGetName(char *name, int len, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!name || len <= 0) return CUA_ERROR_INVALID_VALUE;
    driver_device_info_t info;
    cua_result r = sim_ops->device_info(dev, &info);
    if (r == CUA_SUCCESS) snprintf(name, (size_t)len, "%s", info.name);
    return r;
}

cua_result cuDeviceTotalMem_v2(size_t *bytes, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!bytes) return CUA_ERROR_INVALID_VALUE;
    driver_device_info_t info;
    cua_result r = sim_ops->device_info(dev, &info);
    if (r == CUA_SUCCESS) *bytes = info.total_bytes;
    return r;
}

cua_result cuDeviceGetAttribute(int *value, int attribute, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!value) return CUA_ERROR_INVALID_VALUE;
    driver_device_info_t info;
    cua_result r = sim_ops->device_info(dev, &info);
    if (r != CUA_SUCCESS) return r;
    switch (attribute) {
    case CUA_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = info.vmm_supported; break;
    case CUA_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *value = info.rdma_capable; break;
    default: *value = 0; break; /* every other capability: absent */
    }
    return CUA_SUCCESS;
}

cua_result cuDevicePrimaryCtxRetain(cua_ctx *ctx, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUA_ERROR_INVALID_VALUE;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    __atomic_add_fetch(&fake_ctx[dev].retains, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&fake_ctx[dev].reset, 0, __ATOMIC_RELEASE); /* made anew after a reset */
    *ctx = (cua_ctx)&fake_ctx[dev];
    return CUA_SUCCESS;
}

/* As CUDA: every allocation, event and stream of the device is destroyed; the context stays
 * retained (and current wherever it was) but is unusable until cuDevicePrimaryCtxRetain makes it
 * anew, as the runtime does at its next call. */
cua_result cuDevicePrimaryCtxReset_v2(cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    sim_device_reset(dev);
    __atomic_store_n(&fake_ctx[dev].reset, 1, __ATOMIC_RELEASE);
    return CUA_SUCCESS;
}

cua_result cuDevicePrimaryCtxReset(cua_device dev) { return cuDevicePrimaryCtxReset_v2(dev); }

cua_result cuDevicePrimaryCtxRelease_v2(cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    unsigned n = __atomic_load_n(&fake_ctx[dev].retains, __ATOMIC_RELAXED);
    do {
        if (n == 0) return CUA_ERROR_INVALID_CONTEXT;
    } while (!__atomic_compare_exchange_n(&fake_ctx[dev].retains, &n, n - 1, false, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return CUA_SUCCESS;
}

cua_result cuCtxPushCurrent_v2(cua_ctx ctx) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (ctx_device(ctx) < 0) return CUA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == FAKE_CTX_DEPTH) return CUA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUA_SUCCESS;
}

cua_result cuCtxPopCurrent_v2(cua_ctx *ctx) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0) return CUA_ERROR_INVALID_CONTEXT;
    cua_ctx top = ctx_stack[--ctx_depth];
    if (ctx) *ctx = top;
    return CUA_SUCCESS;
}

cua_result cuCtxGetCurrent(cua_ctx *ctx) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUA_ERROR_INVALID_VALUE;
    *ctx = ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
    return CUA_SUCCESS;
}

/* As CUDA: replaces the top of the stack (pushes onto an empty one); NULL pops. */
cua_result cuCtxSetCurrent(cua_ctx ctx) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!ctx) {
        if (ctx_depth > 0) ctx_depth--;
        return CUA_SUCCESS;
    }
    if (ctx_device(ctx) < 0) return CUA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUA_SUCCESS;
}

cua_result cuCtxGetDevice(cua_device *dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUA_ERROR_INVALID_CONTEXT;
    *dev = d;
    return CUA_SUCCESS;
}

cua_result cuCtxSynchronize(void) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    return sim_ops->device_synchronize(dev);
}

/* ------------------------------------------------------------------ memory */

cua_result cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    return sim_ops->mem_get_info(dev, free_bytes, total_bytes);
}

/* The calling thread's capture mode (cuThreadExchangeStreamCaptureMode): global, every thread's at
 * start, or relaxed (thread-local counts as relaxed here: the fake does not know which thread
 * began a capture). */
static __thread int thread_capture_mode = CUA_STREAM_CAPTURE_MODE_GLOBAL;

cua_result cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!mode || *mode < 0 || *mode > CUA_STREAM_CAPTURE_MODE_RELAXED) return CUA_ERROR_INVALID_VALUE;
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUA_SUCCESS;
}

/* As on an H100 (bench/RESULTS.md): an event query or wait, a stream synchronize, cuMemAlloc or
 * cuMemFree, made by a thread in global mode while a capture is in progress, fails and invalidates
 * the capture, whichever stream it names. The fake takes every capture for a global-mode one. */
static bool unsafe_for_captures(void) {
    return thread_capture_mode == CUA_STREAM_CAPTURE_MODE_GLOBAL && sim_break_all_captures() > 0;
}

cua_result cuMemAlloc_v2(cua_devptr *dptr, size_t bytes) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (unsafe_for_captures()) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    return sim_ops->mem_alloc(dev, bytes, dptr);
}

static cua_result mem_free(cua_devptr dptr) {
    return sim_ops->mem_free(device_or_current(sim_address_device(dptr)), dptr);
}

cua_result cuMemFree_v2(cua_devptr dptr) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (unsafe_for_captures()) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return mem_free(dptr);
}

cua_result cuMemAllocAsync(cua_devptr *dptr, size_t bytes, cua_stream stream) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    if (stream && (uintptr_t)stream > 2 && sim_stream_device(stream) < 0) return CUA_ERROR_INVALID_VALUE;
    return sim_ops->mem_alloc(dev, bytes, dptr);
}

cua_result cuMemFreeAsync(cua_devptr dptr, cua_stream stream) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (stream && (uintptr_t)stream > 2 && sim_stream_device(stream) < 0) return CUA_ERROR_INVALID_VALUE;
    return mem_free(dptr);
}

cua_result cuMemAllocAsync_ptsz(cua_devptr *dptr, size_t bytes, cua_stream stream) {
    return cuMemAllocAsync(dptr, bytes, stream);
}

static char default_pool[CUALLOC_MAX_DEVICES];
static void *current_pool[CUALLOC_MAX_DEVICES];

cua_result cuDeviceGetDefaultMemPool(void **pool, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!pool) return CUA_ERROR_INVALID_VALUE;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    *pool = &default_pool[dev];
    return CUA_SUCCESS;
}

cua_result cuDeviceSetMemPool(cua_device dev, void *pool) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    if (!pool) return CUA_ERROR_INVALID_VALUE;
    current_pool[dev] = pool;
    return CUA_SUCCESS;
}

cua_result cuDeviceGetMemPool(void **pool, cua_device dev) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!pool) return CUA_ERROR_INVALID_VALUE;
    if (!device_valid(dev)) return CUA_ERROR_INVALID_DEVICE;
    *pool = current_pool[dev] ? current_pool[dev] : &default_pool[dev];
    return CUA_SUCCESS;
}

cua_result cuMemFreeAsync_ptsz(cua_devptr dptr, cua_stream stream) { return cuMemFreeAsync(dptr, stream); }

/* The device a cua_mem_alloc_prop names, -1 when the properties are not ones the sim has. */
static int prop_device(const cua_mem_alloc_prop *prop) {
    if (!prop || prop->type != CUA_MEM_ALLOCATION_TYPE_PINNED) return -1;
    if (prop->location.type != CUA_MEM_LOCATION_TYPE_DEVICE || !device_valid(prop->location.id)) return -1;
    return prop->location.id;
}

cua_result cuMemGetAllocationGranularity(size_t *granularity, const cua_mem_alloc_prop *prop, int option) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = prop_device(prop);
    if (!granularity || dev < 0) return CUA_ERROR_INVALID_VALUE;
    if (option != CUA_MEM_ALLOC_GRANULARITY_MINIMUM && option != FAKE_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUA_ERROR_INVALID_VALUE;
    driver_device_info_t info;
    cua_result r = sim_ops->device_info(dev, &info);
    if (r == CUA_SUCCESS && !info.vmm_supported) r = CUA_ERROR_NOT_SUPPORTED;
    if (r == CUA_SUCCESS) *granularity = info.granularity;
    return r;
}

/* Reservations belong to the current context's device in the sim (CUDA's are global). The
 * address hint is ignored, as CUDA may. */
cua_result cuMemAddressReserve(cua_devptr *ptr, size_t size, size_t alignment, cua_devptr addr,
                               unsigned long long flags) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (flags != 0) return CUA_ERROR_INVALID_VALUE;
    return sim_ops->va_reserve(device_or_current(-1), size, alignment, ptr);
}

cua_result cuMemAddressFree(cua_devptr ptr, size_t size) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    return sim_ops->va_free(device_or_current(sim_address_device(ptr)), ptr, size);
}

cua_result cuMemCreate(cua_memhandle *handle, size_t size, const cua_mem_alloc_prop *prop,
                       unsigned long long flags) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = prop_device(prop);
    if (!handle || dev < 0 || flags != 0) return CUA_ERROR_INVALID_VALUE;
    if (prop->requested_handle_types != CUA_MEM_HANDLE_TYPE_NONE) return CUA_ERROR_NOT_SUPPORTED;
    return sim_ops->phys_create(dev, size, handle);
}

cua_result cuMemRelease(cua_memhandle handle) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    return sim_ops->phys_release(device_or_current(sim_handle_device(handle)), handle);
}

cua_result cuMemMap(cua_devptr ptr, size_t size, size_t offset, cua_memhandle handle, unsigned long long flags) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (offset != 0 || flags != 0) return CUA_ERROR_INVALID_VALUE; /* the sim maps whole handles */
    int dev = sim_handle_device(handle);
    if (dev < 0) dev = sim_address_device(ptr);
    return sim_ops->map(device_or_current(dev), ptr, size, handle);
}

cua_result cuMemUnmap(cua_devptr ptr, size_t size) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    return sim_ops->unmap(device_or_current(sim_address_device(ptr)), ptr, size);
}

cua_result cuMemSetAccess(cua_devptr ptr, size_t size, const cua_mem_access_desc *desc, size_t count) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!desc || count == 0) return CUA_ERROR_INVALID_VALUE;
    int dev = device_or_current(sim_address_device(ptr));
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CUA_MEM_LOCATION_TYPE_DEVICE || !device_valid(desc[i].location.id))
            return CUA_ERROR_INVALID_VALUE;
        /* The sim grants read-write to the owning device only: no peers, no read-only. */
        if (desc[i].location.id != dev || desc[i].flags != CUA_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUA_ERROR_NOT_SUPPORTED;
    }
    return sim_ops->set_access(dev, ptr, size);
}

/* The cuMemAlloc'd range or the VMM mapping holding dptr, as CUDA answers (for mapped VMM memory:
 * the one physical allocation mapped there, not the reservation); CUDA_ERROR_NOT_FOUND for any
 * other address, a reserved one with nothing mapped included. */
cua_result cuMemGetAddressRange_v2(cua_devptr *base, size_t *size, cua_devptr dptr) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (current_device() < 0) return CUA_ERROR_INVALID_CONTEXT;
    cua_devptr b;
    size_t n;
    if (!sim_address_range(dptr, &b, &n)) return CUA_ERROR_NOT_FOUND;
    if (base) *base = b;
    if (size) *size = n;
    return CUA_SUCCESS;
}

/* Host-backed: a real memset over memory the host may touch. Otherwise there is no memory, and
 * only the address is checked. */
cua_result cuMemsetD8_v2(cua_devptr dptr, unsigned char value, size_t n) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (n == 0) return CUA_SUCCESS;
    if (!fake_host_backed) return sim_address_device(dptr) >= 0 ? CUA_SUCCESS : CUA_ERROR_INVALID_VALUE;
    if (!sim_range_accessible(dptr, n)) return CUA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dptr, value, n);
    return CUA_SUCCESS;
}

/* Host-backed: a real copy out of memory the host may touch. Otherwise there is no memory: the
 * address is checked and the destination zero-filled. */
cua_result cuMemcpyDtoH_v2(void *dst, cua_devptr src, size_t n) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (n == 0) return CUA_SUCCESS;
    if (!dst) return CUA_ERROR_INVALID_VALUE;
    if (!fake_host_backed) {
        if (sim_address_device(src) < 0) return CUA_ERROR_INVALID_VALUE;
        memset(dst, 0, n);
        return CUA_SUCCESS;
    }
    if (!sim_range_accessible(src, n)) return CUA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUA_SUCCESS;
}

/* ------------------------------------------------------------------ streams and events */

cua_result cuEventCreate(cua_event *event, unsigned int flags) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    return sim_ops->event_create(dev, event);
}

cua_result cuEventDestroy_v2(cua_event event) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    return sim_ops->event_destroy(device_or_current(sim_event_device(event)), event);
}

cua_result cuEventRecord(cua_event event, cua_stream stream) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!stream_known(stream)) return CUA_ERROR_INVALID_HANDLE;
    return sim_ops->event_record(device_or_current(sim_event_device(event)), event, stream);
}

cua_result cuEventQuery(cua_event event) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (unsafe_for_captures()) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sim_ops->event_query(device_or_current(sim_event_device(event)), event);
}

cua_result cuEventSynchronize(cua_event event) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (unsafe_for_captures()) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sim_ops->event_synchronize(device_or_current(sim_event_device(event)), event);
}

cua_result cuStreamSynchronize(cua_stream stream) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!stream_known(stream)) return CUA_ERROR_INVALID_HANDLE;
    if (unsafe_for_captures()) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sim_ops->stream_synchronize(device_or_current(sim_stream_device(stream)), stream);
}

cua_result cuStreamCreate(cua_stream *stream, unsigned int flags) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!stream) return CUA_ERROR_INVALID_VALUE;
    int dev = current_device();
    if (dev < 0) return CUA_ERROR_INVALID_CONTEXT;
    cua_stream s = sim_stream_create(dev, false);
    if (!s) return CUA_ERROR_OUT_OF_MEMORY;
    /* As CUDA: without CU_STREAM_NON_BLOCKING the stream synchronizes with the legacy stream (which
     * then may not be used while it captures). */
    sim_stream_set_blocking(s, !(flags & CUA_STREAM_NON_BLOCKING));
    *stream = s;
    return CUA_SUCCESS;
}

/* A green context's stream: the fake has no green contexts, so any handle names the current
 * device's; CUDA requires CU_STREAM_NON_BLOCKING (1). */
cua_result cuGreenCtxStreamCreate(cua_stream *stream, void *green_ctx, unsigned int flags, int priority) {
    (void)priority;
    if (!green_ctx || !(flags & 1)) return CUA_ERROR_INVALID_VALUE;
    return cuStreamCreate(stream, flags);
}

/* The calling thread's per-thread default stream (CU_STREAM_PER_THREAD) captures: it may, as any
 * stream but the legacy one (fakecuda_stream_set_capturing of 0x2, from that thread). */
static __thread bool per_thread_capturing;

/* Capture status from the sim's per-stream flag (fakecuda_stream_set_capturing). */
cua_result cuStreamIsCapturing(cua_stream stream, int *status) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!status) return CUA_ERROR_INVALID_VALUE;
    if (!stream_known(stream)) return CUA_ERROR_INVALID_HANDLE;
    if ((uintptr_t)stream == 2) {
        *status = per_thread_capturing ? CUA_STREAM_CAPTURE_STATUS_ACTIVE : CUA_STREAM_CAPTURE_STATUS_NONE;
        return CUA_SUCCESS;
    }
    bool cap = false;
    int dev = device_or_current(sim_stream_device(stream));
    cua_result r = sim_ops->stream_is_capturing(dev < 0 ? 0 : dev, stream, &cap);
    if (r == CUA_SUCCESS) *status = cap ? CUA_STREAM_CAPTURE_STATUS_ACTIVE : CUA_STREAM_CAPTURE_STATUS_NONE;
    return r;
}

/* Sim devices can always reach each other. */
cua_result cuDeviceCanAccessPeer(int *can_access, cua_device dev, cua_device peer) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!can_access || !device_valid(dev) || !device_valid(peer)) return CUA_ERROR_INVALID_DEVICE;
    *can_access = dev != peer;
    return CUA_SUCCESS;
}

void fakecuda_stream_set_capturing(cua_stream s, int capturing) {
    if ((uintptr_t)s == 2) per_thread_capturing = capturing != 0;
    else sim_stream_set_capturing(s, capturing != 0);
}

/* The primary context of the stream's device (the only contexts the fake has). */
cua_result cuStreamGetCtx(cua_stream stream, cua_ctx *ctx) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUA_ERROR_INVALID_VALUE;
    int dev = sim_stream_device(stream);
    if (dev < 0) return CUA_ERROR_INVALID_HANDLE;
    *ctx = (cua_ctx)&fake_ctx[dev];
    return CUA_SUCCESS;
}

cua_result cuStreamDestroy_v2(cua_stream stream) {
    if (!entry_ready(__func__)) return CUA_ERROR_NOT_INITIALIZED;
    if (sim_stream_device(stream) < 0) return CUA_ERROR_INVALID_VALUE;
    sim_stream_destroy(stream);
    return CUA_SUCCESS;
}

/* ------------------------------------------------------------------ errors */

cua_result cuGetErrorName(cua_result r, const char **str) {
    if (!str) return CUA_ERROR_INVALID_VALUE;
    const char *name = driver_error_name(r);
    if (strcmp(name, "CUDA_ERROR_UNRECOGNIZED") == 0) {
        *str = NULL;
        return CUA_ERROR_INVALID_VALUE;
    }
    *str = name;
    return CUA_SUCCESS;
}

cua_result cuGetErrorString(cua_result r, const char **str) {
    if (!str) return CUA_ERROR_INVALID_VALUE;
    switch (r) {
    case CUA_SUCCESS: *str = "no error"; return CUA_SUCCESS;
    case CUA_ERROR_INVALID_VALUE: *str = "invalid argument"; return CUA_SUCCESS;
    case CUA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; return CUA_SUCCESS;
    case CUA_ERROR_NOT_INITIALIZED: *str = "initialization error"; return CUA_SUCCESS;
    case CUA_ERROR_NO_DEVICE: *str = "no CUDA-capable device is detected"; return CUA_SUCCESS;
    case CUA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; return CUA_SUCCESS;
    case CUA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; return CUA_SUCCESS;
    case CUA_ERROR_NOT_FOUND: *str = "named symbol not found"; return CUA_SUCCESS;
    case CUA_ERROR_NOT_READY: *str = "device not ready"; return CUA_SUCCESS;
    case CUA_ERROR_NOT_SUPPORTED: *str = "operation not supported"; return CUA_SUCCESS;
    case CUA_ERROR_UNKNOWN: *str = "unknown error"; return CUA_SUCCESS;
    default: return cuGetErrorName(r, str);
    }
}

/* ------------------------------------------------------------------ test helpers */

uint64_t fakecuda_calls(int op) { return sim_calls((sim_op_t)op); }
size_t fakecuda_used_bytes(int dev) { return sim_used_bytes(dev); }
size_t fakecuda_live_handles(int dev) { return sim_live_handles(dev); }
size_t fakecuda_live_mappings(int dev) { return sim_live_mappings(dev); }
void fakecuda_fail(int op, unsigned after, unsigned count, int err) { sim_fail((sim_op_t)op, after, count, err); }
cua_stream fakecuda_stream_create(int dev, int held) { return sim_stream_create(dev, held != 0); }
void fakecuda_stream_complete(cua_stream s) { sim_stream_complete(s); }
int fakecuda_ctx_depth(void) { return ctx_depth; }
unsigned fakecuda_ctx_retains(int dev) {
    return dev >= 0 && dev < CUALLOC_MAX_DEVICES ? __atomic_load_n(&fake_ctx[dev].retains, __ATOMIC_RELAXED) : 0;
}
uint64_t fakecuda_bad_stream_handles(void) { return __atomic_load_n(&fake_bad_streams, __ATOMIC_RELAXED); }
uint64_t fakecuda_captures_broken(void) { return sim_captures_broken(); }
uint64_t fakecuda_entry_calls(const char *name) {
    uint64_t n = 0;
    for (size_t i = 0; i < FAKE_ENTRY_SLOTS; i++) {
        const char *k = __atomic_load_n(&entry_calls[i].name, __ATOMIC_ACQUIRE);
        if (k && (!name || strcmp(k, name) == 0)) n += __atomic_load_n(&entry_calls[i].calls, __ATOMIC_RELAXED);
    }
    return n;
}
int fakecuda_mem_alloc_direct(int dev, size_t size, cua_devptr *out) {
    if (!ready()) return CUA_ERROR_NOT_INITIALIZED;
    return sim_ops->mem_alloc(dev, size, out);
}
