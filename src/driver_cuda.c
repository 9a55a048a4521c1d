/* driver_cuda.c — driver_cuda_ops: the real CUDA driver, dlopened from libcuda.so.1 at init and
 * called through entry points resolved with cuGetProcAddress (dlsym of the versioned names where
 * the driver has none). It owns the loaded library, the primary contexts it retains (one per
 * device, lazily, released only when a reset destroyed one, to be retained anew) and the context
 * push/pop around each op; it owns no policy.
 * Also driver_error_name, the names of CUDA error codes for messages.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"

#define CUDA_LIBRARY "libcuda.so.1"
#define CUDA_API_VERSION 12000 /* the ABI version asked of cuGetProcAddress */

/* Context queries for the front doors' current_device and context_current (not in cuda_decls.h;
 * same signatures as cuda.h's cuCtxGetCurrent / cuCtxGetDevice). */
typedef cua_result (*cua_pfn_cuCtxGetCurrent)(cua_ctx *ctx);
typedef cua_result (*cua_pfn_cuCtxGetDevice)(cua_device *dev);

/* Every entry point: X(name cuGetProcAddress knows, versioned symbol for dlsym, required).
 * The pointer type is cua_pfn_<versioned symbol> (cuda_decls.h). The VMM entry points are
 * optional: a driver without them runs in classic mode (vmm_supported false). */
#define CUDA_ENTRY_POINTS(X) \
    X(cuInit, cuInit, true) \
    X(cuDriverGetVersion, cuDriverGetVersion, true) \
    X(cuDeviceGet, cuDeviceGet, true) \
    X(cuDeviceGetCount, cuDeviceGetCount, true) \
    X(cuDeviceGetName, cuDeviceGetName, true) \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, true) \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, true) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, true) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, false) \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2, true) \
    X(cuCtxPopCurrent, cuCtxPopCurrent_v2, true) \
    X(cuCtxSynchronize, cuCtxSynchronize, true) \
    X(cuMemGetInfo, cuMemGetInfo_v2, true) \
    X(cuMemAlloc, cuMemAlloc_v2, true) \
    X(cuMemFree, cuMemFree_v2, true) \
    X(cuEventCreate, cuEventCreate, true) \
    X(cuEventDestroy, cuEventDestroy_v2, true) \
    X(cuEventRecord, cuEventRecord, true) \
    X(cuEventQuery, cuEventQuery, true) \
    X(cuEventSynchronize, cuEventSynchronize, false) \
    X(cuStreamSynchronize, cuStreamSynchronize, true) \
    X(cuCtxGetCurrent, cuCtxGetCurrent, false) \
    X(cuCtxGetDevice, cuCtxGetDevice, false) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, false) \
    X(cuMemAddressReserve, cuMemAddressReserve, false) \
    X(cuMemAddressFree, cuMemAddressFree, false) \
    X(cuMemCreate, cuMemCreate, false) \
    X(cuMemRelease, cuMemRelease, false) \
    X(cuMemMap, cuMemMap, false) \
    X(cuMemUnmap, cuMemUnmap, false) \
    X(cuMemSetAccess, cuMemSetAccess, false) \
    X(cuStreamIsCapturing, cuStreamIsCapturing, false) \
    X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, false) \
    X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, false) \
    X(cuStreamGetCtx, cuStreamGetCtx, false)

typedef struct cuda_fns_s {
#define CUDA_FIELD_(name, sym, required) cua_pfn_##sym name;
    CUDA_ENTRY_POINTS(CUDA_FIELD_)
#undef CUDA_FIELD_
} cuda_fns_t;

typedef struct cuda_device_s {
    cua_device cudev;
    cua_ctx ctx;        /* primary context; NULL until first needed (atomic) */
    bool vmm;           /* VMM entry points present and the device supports them */
    bool rdma;          /* GPUDirect RDMA with VMM */
    uint64_t peers;     /* devices set_access grants besides this one (bit d; atomic) */
} cuda_device_t;

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;

/* Written under cuda_lock before `ready` is set (release); read-only afterwards. */
static struct {
    bool ready;
    void *lib;
    cua_pfn_cuGetProcAddress_v2 get_proc;
    cuda_fns_t fn;
    int ndev;
    cuda_device_t dev[CUALLOC_MAX_DEVICES];
} cu;

/* The one place a symbol is looked up in the driver library by name: through the real dlsym,
 * since libcualloc.so interposes dlsym (interpose.c) and would otherwise hand back its own
 * cuGetProcAddress. The real cuGetProcAddress found so answers with the driver's own functions. */
static void *cuda_sym(const char *name) {
    if (interpose_real_dlsym) return interpose_real_dlsym(cu.lib, name);
    return dlsym(cu.lib, name);
}

/* An entry point: through cuGetProcAddress by its unversioned name, else by its versioned symbol. */
static void *cuda_proc(const char *name, const char *versioned) {
    if (cu.get_proc) {
        void *p = NULL;
        int status = 0;
        if (cu.get_proc(name, &p, CUDA_API_VERSION, CUA_GET_PROC_ADDRESS_DEFAULT, &status) == CUA_SUCCESS && p)
            return p;
    }
    return cuda_sym(versioned);
}

/* Resolves every entry point; false (with a message) when a required one is missing. */
static bool cuda_resolve(void) {
    cu.get_proc = NULL;
    void *gp = cuda_sym("cuGetProcAddress_v2");
    memcpy(&cu.get_proc, &gp, sizeof gp);
    void *p;
#define CUDA_RESOLVE_(name, sym, required) \
    p = cuda_proc(#name, #sym); \
    if (!p && (required)) { \
        cua_error("%s has no entry point %s; the CUDA driver is too old or not a CUDA driver", \
                  CUDA_LIBRARY, #sym); \
        return false; \
    } \
    memcpy(&cu.fn.name, &p, sizeof p);
    CUDA_ENTRY_POINTS(CUDA_RESOLVE_)
#undef CUDA_RESOLVE_
    return true;
}

static bool cuda_has_vmm_entry_points(void) {
    return cu.fn.cuMemGetAllocationGranularity && cu.fn.cuMemAddressReserve && cu.fn.cuMemAddressFree &&
           cu.fn.cuMemCreate && cu.fn.cuMemRelease && cu.fn.cuMemMap && cu.fn.cuMemUnmap && cu.fn.cuMemSetAccess;
}

static void cuda_unload(void) {
    if (cu.lib) dlclose(cu.lib);
    memset(&cu, 0, sizeof cu);
}

/* Lock held. Loads the library, initializes the driver and learns the devices. */
static cua_result cuda_load(void) {
    cu.lib = dlopen(CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) {
        const char *why = dlerror();
        cua_error("cannot load %s (%s): no CUDA driver is installed here; CUALLOC_CONF=driver:sim runs on "
                  "the simulated device instead",
                  CUDA_LIBRARY, why ? why : "not found");
        return CUA_ERROR_NO_DEVICE;
    }
    if (!cuda_resolve()) {
        cuda_unload();
        return CUA_ERROR_NOT_FOUND;
    }
    cua_result r = cu.fn.cuInit(0);
    if (r != CUA_SUCCESS) {
        cua_error("cuInit failed: %s (%d)", driver_error_name(r), r);
        cuda_unload();
        return r;
    }
    int n = 0;
    r = cu.fn.cuDeviceGetCount(&n);
    if (r == CUA_SUCCESS && n <= 0) r = CUA_ERROR_NO_DEVICE;
    if (r != CUA_SUCCESS) {
        cua_error("no usable CUDA device: %s (%d)", driver_error_name(r), r);
        cuda_unload();
        return r;
    }
    if (n > CUALLOC_MAX_DEVICES) {
        cua_error("%d CUDA devices; only the first %d are used", n, CUALLOC_MAX_DEVICES);
        n = CUALLOC_MAX_DEVICES;
    }
    bool vmm_fns = cuda_has_vmm_entry_points();
    for (int i = 0; i < n; i++) {
        cuda_device_t *d = &cu.dev[i];
        r = cu.fn.cuDeviceGet(&d->cudev, i);
        if (r != CUA_SUCCESS) {
            cua_error("cuDeviceGet(%d) failed: %s (%d)", i, driver_error_name(r), r);
            cuda_unload();
            return r;
        }
        int v = 0;
        d->vmm = vmm_fns &&
                 cu.fn.cuDeviceGetAttribute(&v, CUA_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                            d->cudev) == CUA_SUCCESS && v != 0;
        v = 0;
        d->rdma = d->vmm &&
                  cu.fn.cuDeviceGetAttribute(&v, CUA_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                             d->cudev) == CUA_SUCCESS && v != 0;
    }
    cu.ndev = n;
    __atomic_store_n(&cu.ready, true, __ATOMIC_RELEASE);
    return CUA_SUCCESS;
}

static cua_result cudaop_init(void) {
    pthread_mutex_lock(&cuda_lock);
    cua_result r = cu.ready ? CUA_SUCCESS : cuda_load();
    pthread_mutex_unlock(&cuda_lock);
    return r;
}

/* Checks that init succeeded and dev is valid (and, with vmm, that it supports VMM). */
static cua_result cuda_check(int dev, bool vmm) {
    if (!__atomic_load_n(&cu.ready, __ATOMIC_ACQUIRE)) return CUA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= cu.ndev) return CUA_ERROR_INVALID_DEVICE;
    if (vmm && !cu.dev[dev].vmm) return CUA_ERROR_NOT_SUPPORTED;
    return CUA_SUCCESS;
}

/* Makes dev's primary context current (retaining it the first time); ctx_leave undoes it,
 * restoring whatever context the caller had. */
static cua_result ctx_enter(int dev, bool vmm) {
    cua_result r = cuda_check(dev, vmm);
    if (r != CUA_SUCCESS) return r;
    cuda_device_t *d = &cu.dev[dev];
    cua_ctx ctx = __atomic_load_n(&d->ctx, __ATOMIC_ACQUIRE);
    if (!ctx) {
        pthread_mutex_lock(&cuda_lock);
        ctx = d->ctx;
        if (!ctx) {
            r = cu.fn.cuDevicePrimaryCtxRetain(&ctx, d->cudev);
            if (r == CUA_SUCCESS) __atomic_store_n(&d->ctx, ctx, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&cuda_lock);
        if (r != CUA_SUCCESS) {
            cua_error("cannot retain device %d's primary context: %s (%d)", dev, driver_error_name(r), r);
            return r;
        }
    }
    return cu.fn.cuCtxPushCurrent(ctx);
}

static void ctx_leave(void) {
    cua_ctx popped;
    (void)cu.fn.cuCtxPopCurrent(&popped);
}

static cua_result cudaop_device_count(int *count) {
    if (!count) return CUA_ERROR_INVALID_VALUE;
    if (!__atomic_load_n(&cu.ready, __ATOMIC_ACQUIRE)) return CUA_ERROR_NOT_INITIALIZED;
    *count = cu.ndev;
    return CUA_SUCCESS;
}

/* No context is made current here: describing a device must not create a context on it. */
static cua_result cudaop_device_info(int dev, driver_device_info_t *out) {
    cua_result r = cuda_check(dev, false);
    if (r != CUA_SUCCESS) return r;
    if (!out) return CUA_ERROR_INVALID_VALUE;
    const cuda_device_t *d = &cu.dev[dev];
    memset(out, 0, sizeof *out);
    r = cu.fn.cuDeviceGetName(out->name, (int)sizeof out->name, d->cudev);
    if (r != CUA_SUCCESS) return r;
    out->name[sizeof out->name - 1] = '\0';
    r = cu.fn.cuDeviceTotalMem(&out->total_bytes, d->cudev);
    if (r != CUA_SUCCESS) return r;
    out->granularity = 2 * MiB; /* what classic mode assumes; VMM asks the driver */
    out->vmm_supported = d->vmm;
    out->rdma_capable = d->rdma;
    if (d->vmm) {
        cua_mem_alloc_prop prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CUA_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CUA_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = d->cudev;
        size_t g = 0;
        r = cu.fn.cuMemGetAllocationGranularity(&g, &prop, CUA_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != CUA_SUCCESS) return r;
        if (g == 0 || (g & (g - 1)) != 0) return CUA_ERROR_UNKNOWN; /* the heap needs a power of two */
        out->granularity = g;
    }
    return CUA_SUCCESS;
}

static cua_result cudaop_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return CUA_ERROR_INVALID_VALUE;
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemGetInfo(free_bytes, total_bytes);
    ctx_leave();
    return r;
}

static cua_result cudaop_va_reserve(int dev, size_t size, size_t align, cua_devptr *out) {
    if (!out) return CUA_ERROR_INVALID_VALUE;
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemAddressReserve(out, size, align, 0, 0);
    ctx_leave();
    return r;
}

static cua_result cudaop_va_free(int dev, cua_devptr va, size_t size) {
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemAddressFree(va, size);
    ctx_leave();
    return r;
}

static cua_result cudaop_phys_create(int dev, size_t size, cua_memhandle *out) {
    if (!out) return CUA_ERROR_INVALID_VALUE;
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    cua_mem_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CUA_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = CUA_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CUA_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cu.dev[dev].cudev;
    prop.alloc_flags.gpu_direct_rdma_capable = cu.dev[dev].rdma ? 1 : 0;
    r = cu.fn.cuMemCreate(out, size, &prop, 0);
    ctx_leave();
    return r;
}

static cua_result cudaop_phys_release(int dev, cua_memhandle handle) {
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemRelease(handle);
    ctx_leave();
    return r;
}

static cua_result cudaop_map(int dev, cua_devptr va, size_t size, cua_memhandle handle) {
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemMap(va, size, 0, handle, 0);
    ctx_leave();
    return r;
}

static cua_result cudaop_unmap(int dev, cua_devptr va, size_t size) {
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemUnmap(va, size);
    ctx_leave();
    return r;
}

/* One CUmemAccessDesc per device: dev itself, then each enabled peer. */
static cua_result cudaop_set_access(int dev, cua_devptr va, size_t size) {
    cua_result r = ctx_enter(dev, true);
    if (r != CUA_SUCCESS) return r;
    cua_mem_access_desc desc[CUALLOC_MAX_DEVICES];
    size_t n = 0;
    uint64_t peers = __atomic_load_n(&cu.dev[dev].peers, __ATOMIC_ACQUIRE);
    memset(desc, 0, sizeof desc);
    for (int d = -1; d < cu.ndev; d++) {
        if (d >= 0 && (d == dev || !((peers >> d) & 1))) continue;
        desc[n].location.type = CUA_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = cu.dev[d < 0 ? dev : d].cudev;
        desc[n].flags = CUA_MEM_ACCESS_FLAGS_PROT_READWRITE;
        n++;
    }
    r = cu.fn.cuMemSetAccess(va, size, desc, n);
    ctx_leave();
    return r;
}

static cua_result cudaop_stream_is_capturing(int dev, cua_stream s, bool *capturing) {
    if (!capturing) return CUA_ERROR_INVALID_VALUE;
    *capturing = false;
    cua_result r = cuda_check(dev, false);
    if (r != CUA_SUCCESS) return r;
    if (!cu.fn.cuStreamIsCapturing) return CUA_SUCCESS; /* a driver without graphs never captures */
    r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    int status = CUA_STREAM_CAPTURE_STATUS_NONE;
    r = cu.fn.cuStreamIsCapturing(s, &status);
    ctx_leave();
    if (r == CUA_SUCCESS) *capturing = status != CUA_STREAM_CAPTURE_STATUS_NONE;
    return r;
}

/* peer may access dev's memory from now on (set_access grants it). */
static cua_result cudaop_peer_enable(int dev, int peer) {
    cua_result r = cuda_check(dev, false);
    if (r != CUA_SUCCESS) return r;
    if (peer < 0 || peer >= cu.ndev || peer == dev) return CUA_ERROR_INVALID_DEVICE;
    if (!cu.fn.cuDeviceCanAccessPeer) return CUA_ERROR_NOT_SUPPORTED;
    int can = 0;
    r = cu.fn.cuDeviceCanAccessPeer(&can, cu.dev[peer].cudev, cu.dev[dev].cudev);
    if (r != CUA_SUCCESS) return r;
    if (!can) return CUA_ERROR_NOT_SUPPORTED;
    __atomic_fetch_or(&cu.dev[dev].peers, (uint64_t)1 << peer, __ATOMIC_ACQ_REL);
    return CUA_SUCCESS;
}

/* While any thread captures a CUDA graph in global mode (the default), CUDA refuses the calls it
 * deems unsafe for a capture, event queries and waits and stream synchronizes among them, to every
 * thread in global mode, and invalidates that capture, even where the call names an idle stream of
 * its own. The heap never queries, waits for or synchronizes a capturing stream or an event
 * recorded on one (heap.c asks first), so its calls cannot touch a capture: they are made in relaxed
 * mode, the calling thread's own mode put back afterwards, as PyTorch's allocator makes its
 * cudaMalloc during a capture. On an H100, before this, cualloc_trim(0) with frees pending on an
 * idle stream invalidated another thread's capture (bench/RESULTS.md, "What the real driver says
 * about captures, and the fix"). A driver without the mode exchange runs the call as it is. Returns the mode to put back,
 * -1 when none was changed. */
static int capture_mode_relax(void) {
    int mode = CUA_STREAM_CAPTURE_MODE_RELAXED;
    if (!cu.fn.cuThreadExchangeStreamCaptureMode || cu.fn.cuThreadExchangeStreamCaptureMode(&mode) != CUA_SUCCESS)
        return -1;
    return mode;
}

static void capture_mode_restore(int mode) {
    if (mode >= 0) cu.fn.cuThreadExchangeStreamCaptureMode(&mode);
}

/* Classic segments. cuMemAlloc is made in relaxed capture mode (capture_mode_relax), as PyTorch's
 * allocator makes its cudaMalloc during a capture: in global mode, another thread's capture would
 * be invalidated by it (an H100's answer to cuMemAlloc + cuMemFree). cuMemFree waits for the
 * device, so the heap does not call it while a capture it knows of is in progress
 * (classic_release_segment). */
static cua_result cudaop_mem_alloc(int dev, size_t size, cua_devptr *out) {
    if (!out) return CUA_ERROR_INVALID_VALUE;
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    int mode = capture_mode_relax();
    r = cu.fn.cuMemAlloc(out, size);
    capture_mode_restore(mode);
    ctx_leave();
    return r;
}

static cua_result cudaop_mem_free(int dev, cua_devptr ptr) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuMemFree(ptr);
    ctx_leave();
    return r;
}

static cua_result cudaop_event_create(int dev, cua_event *out) {
    if (!out) return CUA_ERROR_INVALID_VALUE;
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuEventCreate(out, CUA_EVENT_DISABLE_TIMING);
    ctx_leave();
    return r;
}

static cua_result cudaop_event_destroy(int dev, cua_event e) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuEventDestroy(e);
    ctx_leave();
    return r;
}

static cua_result cudaop_event_record(int dev, cua_event e, cua_stream s) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuEventRecord(e, s);
    ctx_leave();
    return r;
}

static cua_result cudaop_event_query(int dev, cua_event e) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    int mode = capture_mode_relax();
    r = cu.fn.cuEventQuery(e);
    capture_mode_restore(mode);
    ctx_leave();
    return r;
}

static cua_result cudaop_event_synchronize(int dev, cua_event e) {
    if (!cu.fn.cuEventSynchronize) return CUA_ERROR_NOT_FOUND;
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    int mode = capture_mode_relax();
    r = cu.fn.cuEventSynchronize(e);
    capture_mode_restore(mode);
    ctx_leave();
    return r;
}

static cua_result cudaop_stream_synchronize(int dev, cua_stream s) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    int mode = capture_mode_relax();
    r = cu.fn.cuStreamSynchronize(s);
    capture_mode_restore(mode);
    ctx_leave();
    return r;
}

static cua_result cudaop_device_synchronize(int dev) {
    cua_result r = ctx_enter(dev, false);
    if (r != CUA_SUCCESS) return r;
    r = cu.fn.cuCtxSynchronize();
    ctx_leave();
    return r;
}

/* The calling thread's current context (cuCtxGetCurrent), for current_device and context_current:
 * CUA_ERROR_INVALID_CONTEXT when none is current; never creates or changes a context. */
static cua_result current_ctx(cua_ctx *ctx) {
    if (!__atomic_load_n(&cu.ready, __ATOMIC_ACQUIRE)) return CUA_ERROR_NOT_INITIALIZED;
    if (!cu.fn.cuCtxGetCurrent || !cu.fn.cuCtxGetDevice) return CUA_ERROR_NOT_SUPPORTED;
    *ctx = NULL;
    cua_result r = cu.fn.cuCtxGetCurrent(ctx);
    if (r != CUA_SUCCESS) return r;
    return *ctx ? CUA_SUCCESS : CUA_ERROR_INVALID_CONTEXT;
}

/* The calling thread's current context's device; never creates or changes a context. */
static cua_result cudaop_current_device(int *dev) {
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    cua_ctx ctx;
    cua_result r = current_ctx(&ctx);
    if (r != CUA_SUCCESS) return r;
    cua_device cudev = 0;
    r = cu.fn.cuCtxGetDevice(&cudev);
    if (r != CUA_SUCCESS) return r;
    for (int i = 0; i < cu.ndev; i++) {
        if (cu.dev[i].cudev == cudev) {
            *dev = i;
            return CUA_SUCCESS;
        }
    }
    return CUA_ERROR_INVALID_DEVICE;
}

/* Context usability for context_current. A context stays usable until a reset of its device's
 * primary context (cuDevicePrimaryCtxReset), after which it stays current but every call in it
 * fails until it is made anew; cualloc hears of each reset (context_reset), which bumps the
 * generation. A thread remembers the last context it proved usable (cuCtxGetDevice succeeded in
 * it) and the generation read before the proof: the same context at the same generation needs no
 * proof again. A reset in between leaves the generations unequal, so the next query proves again. */
static uint64_t ctx_reset_generation; /* atomic; only grows */
static __thread struct {
    cua_ctx ctx;         /* NULL: none proved yet */
    uint64_t generation; /* ctx_reset_generation read before the proof */
} ctx_proved;

static cua_result cudaop_context_current(void) {
    cua_ctx ctx;
    cua_result r = current_ctx(&ctx);
    if (r != CUA_SUCCESS) return r;
    uint64_t generation = __atomic_load_n(&ctx_reset_generation, __ATOMIC_ACQUIRE);
    if (ctx == ctx_proved.ctx && generation == ctx_proved.generation) return CUA_SUCCESS;
    cua_device cudev;
    if ((r = cu.fn.cuCtxGetDevice(&cudev)) != CUA_SUCCESS) return r;
    ctx_proved.ctx = ctx;
    ctx_proved.generation = generation;
    return CUA_SUCCESS;
}

/* dev's primary context was reset: the one retained is gone. It is released (a reset does not
 * release it, and CUDA allows the release after it) and retained anew by the next ctx_enter, which
 * makes it again. Every thread's proved context (context_current) must be proved again. */
static void cudaop_context_reset(int dev) {
    __atomic_add_fetch(&ctx_reset_generation, 1, __ATOMIC_ACQ_REL);
    if (cuda_check(dev, false) != CUA_SUCCESS) return;
    cuda_device_t *d = &cu.dev[dev];
    pthread_mutex_lock(&cuda_lock);
    if (d->ctx) {
        if (cu.fn.cuDevicePrimaryCtxRelease) (void)cu.fn.cuDevicePrimaryCtxRelease(d->cudev);
        __atomic_store_n(&d->ctx, NULL, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cuda_lock);
}

/* The device of stream s: its context's (cuStreamGetCtx), entered for cuCtxGetDevice and left. */
static cua_result cudaop_stream_device(cua_stream s, int *dev) {
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    if (!__atomic_load_n(&cu.ready, __ATOMIC_ACQUIRE)) return CUA_ERROR_NOT_INITIALIZED;
    if (!cu.fn.cuStreamGetCtx || !cu.fn.cuCtxGetDevice) return CUA_ERROR_NOT_SUPPORTED;
    cua_ctx ctx = NULL;
    cua_result r = cu.fn.cuStreamGetCtx(s, &ctx);
    if (r != CUA_SUCCESS) return r;
    if ((r = cu.fn.cuCtxPushCurrent(ctx)) != CUA_SUCCESS) return r;
    cua_device cudev = 0;
    r = cu.fn.cuCtxGetDevice(&cudev);
    cua_ctx popped;
    cu.fn.cuCtxPopCurrent(&popped);
    if (r != CUA_SUCCESS) return r;
    for (int i = 0; i < cu.ndev; i++) {
        if (cu.dev[i].cudev == cudev) {
            *dev = i;
            return CUA_SUCCESS;
        }
    }
    return CUA_ERROR_INVALID_DEVICE;
}

const driver_ops_t driver_cuda_ops = {
    .name = "cuda",
    .init = cudaop_init,
    .device_count = cudaop_device_count,
    .device_info = cudaop_device_info,
    .mem_get_info = cudaop_mem_get_info,
    .va_reserve = cudaop_va_reserve,
    .va_free = cudaop_va_free,
    .phys_create = cudaop_phys_create,
    .phys_release = cudaop_phys_release,
    .map = cudaop_map,
    .unmap = cudaop_unmap,
    .set_access = cudaop_set_access,
    .mem_alloc = cudaop_mem_alloc,
    .mem_free = cudaop_mem_free,
    .event_create = cudaop_event_create,
    .event_destroy = cudaop_event_destroy,
    .event_record = cudaop_event_record,
    .event_query = cudaop_event_query,
    .event_synchronize = cudaop_event_synchronize,
    .stream_synchronize = cudaop_stream_synchronize,
    .device_synchronize = cudaop_device_synchronize,
    .current_device = cudaop_current_device,
    .context_current = cudaop_context_current,
    .stream_device = cudaop_stream_device,
    .stream_is_capturing = cudaop_stream_is_capturing,
    .peer_enable = cudaop_peer_enable,
    .context_reset = cudaop_context_reset,
};

const char *driver_error_name(cua_result r) {
    switch (r) {
    case CUA_SUCCESS: return "CUDA_SUCCESS";
    case CUA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case 4: return "CUDA_ERROR_DEINITIALIZED";
    case 34: return "CUDA_ERROR_STUB_LIBRARY";
    case 46: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CUA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUA_ERROR_ALREADY_MAPPED: return "CUDA_ERROR_ALREADY_MAPPED";
    case CUA_ERROR_NOT_MAPPED: return "CUDA_ERROR_NOT_MAPPED";
    case 214: return "CUDA_ERROR_ECC_UNCORRECTABLE";
    case 400: return "CUDA_ERROR_INVALID_HANDLE";
    case CUA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case 700: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case 719: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case CUA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case 803: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case 901: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case CUA_ERROR_STREAM_CAPTURE_IMPLICIT: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case CUA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    case CUA_ERROR_HOST_MEMORY: return "host memory ran out (cualloc's own tables)";
    default: return "CUDA_ERROR_UNRECOGNIZED";
    }
}
