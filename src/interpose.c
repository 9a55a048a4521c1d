/* interpose.c — the LD_PRELOAD front door: CUDA runtime and driver allocation entry points served
 * from cualloc's heaps, and the dlsym / cuGetProcAddress interposition that routes the CUDA
 * runtime's own driver look-ups (it dlopens libcuda.so.1 and fetches its table through
 * cuGetProcAddress) to cualloc. It owns the "next" definitions of every name it interposes and the
 * decision owned-or-foreign; policy stays in heap.c, start-up in api.c.
 *
 * Exported (default visibility, unversioned, plain C names):
 *   runtime  cudaMalloc cudaFree cudaMallocAsync cudaFreeAsync cudaMemGetInfo cudaStreamDestroy
 *            cudaStreamCreate cudaStreamCreateWithFlags cudaStreamCreateWithPriority
 *            cudaDeviceEnablePeerAccess cudaIpcGetMemHandle cudaGetLastError cudaPeekAtLastError
 *   driver   cuMemAlloc_v2 cuMemFree_v2 cuMemAllocAsync cuMemFreeAsync (+ _ptsz) cuStreamDestroy_v2
 *            cuStreamCreate cuStreamCreateWithPriority cuGreenCtxStreamCreate cuCtxEnablePeerAccess
 *            cuMemGetAddressRange_v2 cuMemGetInfo_v2 cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
 *            cuDeviceSetMemPool
 *   lookup   dlsym cuGetProcAddress cuGetProcAddress_v2
 *
 * Rules:
 *  - Nothing starts at load time (no dlopen, no cuInit, no file; the one constructor registers a
 *    fork handler, pending_fork_register). The heap starts at the first intercepted allocation (a
 *    driver-API one only with a current context: before the program's cuInit it reaches the driver
 *    untouched); frees, cudaMemGetInfo and stream destruction before that pass through without
 *    starting anything.
 *  - CUALLOC_DISABLE=1 (a boolean as CUALLOC_CONF reads one: 1/true/yes/on; unset, empty, 0, false,
 *    no and off leave cualloc on): every entry point is a pure pass-through.
 *  - A pointer cualloc does not own goes to the next definition (runtime names: dlsym(RTLD_NEXT),
 *    else the first definition among all loaded objects, for a runtime loaded RTLD_LOCAL; driver
 *    names: the real libcuda function). cudaFree(NULL) passes through (programs call it to
 *    create the context).
 *  - Device of a request. Runtime entry points: the next cudaGetDevice when there is one, else the
 *    current context's device (driver_ops_t.current_device), else 0. Driver entry points: the
 *    current context's device; with no current context the call passes through (CUDA then returns
 *    CUDA_ERROR_INVALID_CONTEXT, as without cualloc). Neither creates a context. But a runtime
 *    allocation cualloc serves leaves the thread as CUDA's would: with no current context, the
 *    runtime is first asked to make its primary context current (cudaFree(NULL)), and its error, if
 *    it cannot start, is the allocation's (runtime_context).
 *  - cudaFree / cuMemFree_v2 of an owned pointer: heap_free_device_wide. Stream creation is
 *    interposed (flag 0x1 = non-blocking) so each heap knows its device's non-blocking streams.
 *    With none, the free is a free on the legacy stream (reused at once by it, by other streams
 *    after its event). With some, nobody reuses the block until events recorded (lazily, only when
 *    memory is short) on the legacy stream and every non-blocking stream have completed; under
 *    pressure one device synchronize settles them all. Streams created before cualloc started are
 *    remembered and handed over at the first served allocation.
 *  - Capture (CUDA graphs): cudaMallocAsync / cuMemAllocAsync (+_ptsz) on a capturing stream pass
 *    through (graph nodes); the heap never records, queries or synchronizes a capturing stream.
 *  - Peer access: after cudaDeviceEnablePeerAccess(peer) on device d (or cuCtxEnablePeerAccess),
 *    peer's heap grants d access to its existing and future mappings (driver peer_enable +
 *    heap_peer_enabled). Pluggable mode: cualloc_enable_peer_access_all().
 *  - cudaIpcGetMemHandle of VMM memory fails with cudaErrorInvalidValue after one message saying
 *    how to avoid it (exclude:, or expandable_segments:False); in classic mode a block at the start
 *    of its segment passes through, one inside a segment fails the same way.
 *  - cuMemGetAddressRange_v2 of an address in a live block (interior too) answers the block's base
 *    and size, as for cudaMalloc memory; of one in cualloc's memory that no live block holds (freed
 *    and cached, or never handed out), CUDA_ERROR_NOT_FOUND, as for memory CUDA freed; anything
 *    else passes through.
 *  - CUALLOC_CONF exclude:GLOBS: allocations whose caller module (dladdr of the return address,
 *    cached) matches go to CUDA unchanged, including the runtime's own driver calls inside them
 *    (thread-local pass-through flag); their frees pass through as foreign pointers.
 *  - OOM: cudaErrorMemoryAllocation (2) / CUDA_ERROR_OUT_OF_MEMORY; the heap printed the report.
 *  - The runtime's last error: an error a runtime entry point answers itself (an OOM, a double
 *    free, a refused IPC handle) is also the calling thread's last error, as CUDA's own would be:
 *    cudaGetLastError returns and clears it, cudaPeekAtLastError returns it. An error the runtime
 *    itself holds for the thread is returned first (a sticky error must not be hidden); both are
 *    cleared by cudaGetLastError, since CUDA keeps one last error, not two.
 *  - cudaMalloc / cuMemAlloc: heap_alloc_device_wide (the block may serve any stream at once);
 *    a stream-ordered free on the legacy stream, whose blocks it takes: heap_free_on_legacy.
 *  - cudaMemGetInfo is truthful about what the application could allocate: the next definition's
 *    free bytes plus cualloc's cached free bytes on the current device (reserved - allocated),
 *    capped at total and at the heap's cap less its allocated bytes.
 *  - Stream destruction (cudaStreamDestroy, cuStreamDestroy_v2, and the runtime's cuGetProcAddress
 *    look-up of cuStreamDestroy) first settles every heap's blocks tagged with the stream, since
 *    the handle may be reused.
 *  - A reset of a device's primary context (cuDevicePrimaryCtxReset / _v2, which cudaDeviceReset
 *    calls through the runtime's driver table) destroys everything allocated in it: the device's
 *    heap is retired first, while the context lives (api_device_reset: its memory goes back to the
 *    driver, its pointers die as CUDA's do), streams remembered for the device are forgotten, and
 *    after the reset the backend retains the context anew; the next allocation makes a new heap.
 *
 * dlsym. Every dlsym in the process reaches this one. The real one is libc's, found once through
 * dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), else "GLIBC_2.2.5" or "GLIBC_2.17" (glibc before 2.34,
 * x86-64 and AArch64; also tried on libc.so.6 and libdl.so.2 directly when libcualloc.so was loaded
 * after them). On x86-64 and AArch64 the exported dlsym is
 * dlsym_entry.S: it asks cualloc_dlsym_route and jumps, so that for every name cualloc does not
 * interpose the real dlsym answers with the caller's own return address (RTLD_DEFAULT and RTLD_NEXT
 * in the caller's scope, as without cualloc: a module loaded RTLD_LOCAL finds its own
 * dependencies). Answers:
 *  - handle RTLD_NEXT, for a name cualloc interposes (and for every name on other architectures):
 *    the real dlsym would search after *this* file, so the meaning is emulated:
 *    the caller's object is found (dladdr1(__builtin_return_address(0), RTLD_DL_LINKMAP)) and the
 *    objects after it in the link-map chain (load order, as dl_iterate_phdr reports them) are asked
 *    one by one (dlopen(name, RTLD_NOLOAD|RTLD_LAZY) + real dlsym), accepting only a definition
 *    that lies in that object itself (dladdr1 again). Differences from glibc: objects loaded
 *    RTLD_LOCAL are searched too (glibc searches the global scope), and symbol versions are not
 *    considered (the default version is found). A caller that cannot be identified gets
 *    dlsym(RTLD_DEFAULT).
 *  - "cuGetProcAddress_v2" / "cuGetProcAddress" (any handle): the real definition is remembered as
 *    the next one and cualloc's wrapper is returned. The driver names cualloc interposes
 *    ("cuMemAlloc_v2", ...) are treated the same way.
 *  - everything else: the real dlsym's answer, untouched (on x86-64 and AArch64, given to the
 *    caller itself).
 * cuGetProcAddress wrappers call the real cuGetProcAddress and, for "cuMemAlloc" and "cuMemFree"
 * (at version >= 3020, the _v2 ABI), "cuMemAllocAsync", "cuMemFreeAsync" (flags
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the _ptsz variants), "cuStreamDestroy",
 * "cuDevicePrimaryCtxReset" (at version >= 11000, the _v2 one), "cuGetProcAddress" itself and the
 * other names proc_substitute lists, remember the real pointer and return cualloc's function. With
 * env CUALLOC_LOG_INTERPOSE=1 every look-up answered so is logged on stderr:
 *   cualloc: interpose: cuGetProcAddress("cuMemAlloc", 3020, flags 0) -> cualloc cuMemAlloc_v2
 *
 * Thread-safety: the next pointers are atomics written with the same value by any racer.
 */
#include <dlfcn.h>
#include <fnmatch.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CUDART_SUCCESS 0
#define CUDART_ERROR_INVALID_VALUE 1
#define CUDART_ERROR_MEMORY_ALLOCATION 2
#define CUDART_ERROR_INITIALIZATION 3
#define CUA_STREAM_PER_THREAD ((cua_stream)(uintptr_t)0x2)
#define CUA_STREAM_LEGACY ((cua_stream)(uintptr_t)0x1)
/* serve's name for a request of cudaMalloc / cuMemAlloc, which may serve any stream (no CUDA
 * handle has this value: 0x1 and 0x2 are the only special ones). */
#define ALLOC_DEVICE_WIDE ((cua_stream)(uintptr_t)0x3)
/* The heap's name for a stream: CU_STREAM_LEGACY is the legacy stream, as NULL is (where NULL
 * means the per-thread stream, the _ptsz entry points say CUA_STREAM_PER_THREAD first), so blocks
 * freed under one name are found under the other without an event. */
static inline cua_stream heap_stream_name(cua_stream s) { return s == CUA_STREAM_LEGACY ? NULL : s; }

typedef int cudart_error;
typedef void *cudart_stream;

/* ------------------------------------------------------------------ exported prototypes */

CUALLOC_API cudart_error cudaMalloc(void **ptr, size_t size);
CUALLOC_API cudart_error cudaFree(void *ptr);
CUALLOC_API cudart_error cudaMallocAsync(void **ptr, size_t size, cudart_stream stream);
CUALLOC_API cudart_error cudaFreeAsync(void *ptr, cudart_stream stream);
CUALLOC_API cudart_error cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
CUALLOC_API cudart_error cudaStreamDestroy(cudart_stream stream);
CUALLOC_API cudart_error cudaStreamCreate(cudart_stream *stream);
CUALLOC_API cudart_error cudaStreamCreateWithFlags(cudart_stream *stream, unsigned int flags);
CUALLOC_API cudart_error cudaStreamCreateWithPriority(cudart_stream *stream, unsigned int flags, int priority);
CUALLOC_API cudart_error cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
CUALLOC_API cudart_error cudaIpcGetMemHandle(void *handle, void *dev_ptr);
CUALLOC_API cudart_error cudaGetLastError(void);
CUALLOC_API cudart_error cudaPeekAtLastError(void);
CUALLOC_API cua_result cuStreamCreate(cua_stream *stream, unsigned int flags);
CUALLOC_API cua_result cuStreamCreateWithPriority(cua_stream *stream, unsigned int flags, int priority);
CUALLOC_API cua_result cuGreenCtxStreamCreate(cua_stream *stream, cua_green_ctx green_ctx, unsigned int flags,
                                              int priority);
CUALLOC_API cua_result cuCtxEnablePeerAccess(cua_ctx peer_ctx, unsigned int flags);
CUALLOC_API cua_result cuMemGetAddressRange_v2(cua_devptr *base, size_t *size, cua_devptr dptr);
CUALLOC_API cua_result cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUALLOC_API cua_result cuDevicePrimaryCtxReset_v2(cua_device dev);
CUALLOC_API cua_result cuDevicePrimaryCtxReset(cua_device dev);
CUALLOC_API cua_result cuDeviceSetMemPool(cua_device dev, void *pool);
CUALLOC_API cua_result cuMemAlloc_v2(cua_devptr *dptr, size_t size);
CUALLOC_API cua_result cuMemFree_v2(cua_devptr dptr);
CUALLOC_API cua_result cuMemAllocAsync(cua_devptr *dptr, size_t size, cua_stream stream);
CUALLOC_API cua_result cuMemFreeAsync(cua_devptr dptr, cua_stream stream);
CUALLOC_API cua_result cuMemAllocAsync_ptsz(cua_devptr *dptr, size_t size, cua_stream stream);
CUALLOC_API cua_result cuMemFreeAsync_ptsz(cua_devptr dptr, cua_stream stream);
CUALLOC_API cua_result cuStreamDestroy_v2(cua_stream stream);
CUALLOC_API cua_result cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                           unsigned long long flags, int *symbol_status);
CUALLOC_API cua_result cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags);
#ifndef CUALLOC_NO_DLSYM_INTERPOSE
#if defined(__x86_64__) || defined(__aarch64__)
#define DLSYM_ENTRY_ASM 1 /* dlsym is dlsym_entry.S, which jumps to what cualloc_dlsym_route says */
__attribute__((used)) void *cualloc_dlsym_route(const char *symbol);
#else
CUALLOC_API void *dlsym(void *restrict handle, const char *restrict symbol);
#endif
#endif

/* ------------------------------------------------------------------ the real dlsym */

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym_fn;

static dlsym_fn resolve_real_dlsym(void) {
    dlsym_fn f = atomic_load_explicit(&real_dlsym_fn, memory_order_acquire);
    if (__builtin_expect(f != NULL, 1)) return f;
    /* glibc 2.34 and later define dlsym in libc at GLIBC_2.34 on every architecture; before, in
     * libdl at the architecture's first version: GLIBC_2.2.5 on x86-64, GLIBC_2.17 on AArch64 (and
     * ppc64le). Without the latter, every dlsym on an older AArch64 system (Ubuntu 20.04, Jetson's
     * L4T, RHEL 8) would find nothing. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    static const char *const libs[] = {"libc.so.6", "libdl.so.2"};
    void *p = NULL;
    for (size_t i = 0; !p && i < sizeof versions / sizeof versions[0]; i++) p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    for (size_t l = 0; !p && l < sizeof libs / sizeof libs[0]; l++) {
        /* libcualloc.so loaded after the library that defines it: RTLD_NEXT does not see it */
        void *lib = dlopen(libs[l], RTLD_LAZY | RTLD_NOLOAD);
        for (size_t i = 0; lib && !p && i < sizeof versions / sizeof versions[0]; i++)
            p = dlvsym(lib, "dlsym", versions[i]);
        if (lib) dlclose(lib);
    }
#ifndef CUALLOC_NO_DLSYM_INTERPOSE
    if (p == (void *)dlsym) p = NULL; /* never ourselves (the library binds `dlsym` to its own) */
#endif
    memcpy(&f, &p, sizeof p);
    if (f) atomic_store_explicit(&real_dlsym_fn, f, memory_order_release);
    return f;
}

void *interpose_real_dlsym(void *handle, const char *symbol) {
    dlsym_fn f = resolve_real_dlsym();
    return f ? f(handle, symbol) : NULL;
}

/* ------------------------------------------------------------------ settings */

static int log_state = -1; /* -1 unknown, 0, 1 (atomic) */

static bool env_flag(int *state, const char *name) {
    int s = __atomic_load_n(state, __ATOMIC_RELAXED);
    if (__builtin_expect(s < 0, 0)) {
        s = conf_env_flag(name);
        __atomic_store_n(state, s, __ATOMIC_RELAXED);
    }
    return s != 0;
}

static inline bool disabled(void) { return conf_disabled(); } /* read once; the API's answer too */
static inline bool log_on(void) { return env_flag(&log_state, "CUALLOC_LOG_INTERPOSE"); }

/* ------------------------------------------------------------------ next definitions */

/* One interposed name: its next definition (atomic), resolved lazily. Runtime names are found
 * with dlsym(RTLD_NEXT); driver names with the real cuGetProcAddress answer (stored when the
 * runtime asked through us), else the real dlsym on libcuda.so.1 when it is loaded, else RTLD_NEXT. */
typedef struct next_s {
    const char *symbol;  /* the symbol to look up */
    bool driver;
    void *_Atomic fn;
} next_t;

enum {
    N_cudaMalloc, N_cudaFree, N_cudaMallocAsync, N_cudaFreeAsync, N_cudaMemGetInfo, N_cudaStreamDestroy,
    N_cudaGetDevice, N_cudaStreamIsCapturing, N_cudaStreamCreate, N_cudaStreamCreateWithFlags,
    N_cudaStreamCreateWithPriority, N_cudaDeviceEnablePeerAccess, N_cudaIpcGetMemHandle,
    N_cudaGetLastError, N_cudaPeekAtLastError,
    N_cuMemAlloc_v2, N_cuMemFree_v2, N_cuMemAllocAsync, N_cuMemFreeAsync, N_cuMemAllocAsync_ptsz,
    N_cuMemFreeAsync_ptsz, N_cuStreamDestroy_v2, N_cuGetProcAddress_v2, N_cuGetProcAddress,
    N_cuStreamCreate, N_cuStreamCreateWithPriority, N_cuGreenCtxStreamCreate, N_cuCtxEnablePeerAccess,
    N_cuMemGetAddressRange_v2,
    N_cuMemGetInfo_v2, N_cuDevicePrimaryCtxReset_v2, N_cuDevicePrimaryCtxReset, N_cuDeviceSetMemPool,
    /* driver names looked up, never interposed */
    N_cuCtxPushCurrent_v2, N_cuCtxPopCurrent_v2, N_cuCtxGetDevice, N_cuDeviceGetDefaultMemPool, N_COUNT
};

static next_t nexts[N_COUNT] = {
    [N_cudaMalloc] = {"cudaMalloc", false, NULL},
    [N_cudaFree] = {"cudaFree", false, NULL},
    [N_cudaMallocAsync] = {"cudaMallocAsync", false, NULL},
    [N_cudaFreeAsync] = {"cudaFreeAsync", false, NULL},
    [N_cudaMemGetInfo] = {"cudaMemGetInfo", false, NULL},
    [N_cudaStreamDestroy] = {"cudaStreamDestroy", false, NULL},
    [N_cudaGetDevice] = {"cudaGetDevice", false, NULL},
    [N_cudaStreamIsCapturing] = {"cudaStreamIsCapturing", false, NULL},
    [N_cudaStreamCreate] = {"cudaStreamCreate", false, NULL},
    [N_cudaStreamCreateWithFlags] = {"cudaStreamCreateWithFlags", false, NULL},
    [N_cudaStreamCreateWithPriority] = {"cudaStreamCreateWithPriority", false, NULL},
    [N_cudaDeviceEnablePeerAccess] = {"cudaDeviceEnablePeerAccess", false, NULL},
    [N_cudaIpcGetMemHandle] = {"cudaIpcGetMemHandle", false, NULL},
    [N_cudaGetLastError] = {"cudaGetLastError", false, NULL},
    [N_cudaPeekAtLastError] = {"cudaPeekAtLastError", false, NULL},
    [N_cuMemAlloc_v2] = {"cuMemAlloc_v2", true, NULL},
    [N_cuMemFree_v2] = {"cuMemFree_v2", true, NULL},
    [N_cuMemAllocAsync] = {"cuMemAllocAsync", true, NULL},
    [N_cuMemFreeAsync] = {"cuMemFreeAsync", true, NULL},
    [N_cuMemAllocAsync_ptsz] = {"cuMemAllocAsync_ptsz", true, NULL},
    [N_cuMemFreeAsync_ptsz] = {"cuMemFreeAsync_ptsz", true, NULL},
    [N_cuStreamDestroy_v2] = {"cuStreamDestroy_v2", true, NULL},
    [N_cuGetProcAddress_v2] = {"cuGetProcAddress_v2", true, NULL},
    [N_cuGetProcAddress] = {"cuGetProcAddress", true, NULL},
    [N_cuStreamCreate] = {"cuStreamCreate", true, NULL},
    [N_cuStreamCreateWithPriority] = {"cuStreamCreateWithPriority", true, NULL},
    [N_cuGreenCtxStreamCreate] = {"cuGreenCtxStreamCreate", true, NULL},
    [N_cuCtxEnablePeerAccess] = {"cuCtxEnablePeerAccess", true, NULL},
    [N_cuMemGetAddressRange_v2] = {"cuMemGetAddressRange_v2", true, NULL},
    [N_cuMemGetInfo_v2] = {"cuMemGetInfo_v2", true, NULL},
    [N_cuDevicePrimaryCtxReset_v2] = {"cuDevicePrimaryCtxReset_v2", true, NULL},
    [N_cuDevicePrimaryCtxReset] = {"cuDevicePrimaryCtxReset", true, NULL},
    [N_cuDeviceSetMemPool] = {"cuDeviceSetMemPool", true, NULL},
    [N_cuCtxPushCurrent_v2] = {"cuCtxPushCurrent_v2", true, NULL},
    [N_cuCtxPopCurrent_v2] = {"cuCtxPopCurrent_v2", true, NULL},
    [N_cuCtxGetDevice] = {"cuCtxGetDevice", true, NULL},
    [N_cuDeviceGetDefaultMemPool] = {"cuDeviceGetDefaultMemPool", true, NULL},
};

/* cualloc's own definition of each interposed name (for "is this ourselves?"). */
static void *own_fn(int i) {
    switch (i) {
    case N_cudaMalloc: return (void *)cudaMalloc;
    case N_cudaFree: return (void *)cudaFree;
    case N_cudaMallocAsync: return (void *)cudaMallocAsync;
    case N_cudaFreeAsync: return (void *)cudaFreeAsync;
    case N_cudaMemGetInfo: return (void *)cudaMemGetInfo;
    case N_cudaStreamDestroy: return (void *)cudaStreamDestroy;
    case N_cuMemAlloc_v2: return (void *)cuMemAlloc_v2;
    case N_cuMemFree_v2: return (void *)cuMemFree_v2;
    case N_cuMemAllocAsync: return (void *)cuMemAllocAsync;
    case N_cuMemFreeAsync: return (void *)cuMemFreeAsync;
    case N_cuMemAllocAsync_ptsz: return (void *)cuMemAllocAsync_ptsz;
    case N_cuMemFreeAsync_ptsz: return (void *)cuMemFreeAsync_ptsz;
    case N_cuStreamDestroy_v2: return (void *)cuStreamDestroy_v2;
    case N_cuGetProcAddress_v2: return (void *)cuGetProcAddress_v2;
    case N_cuGetProcAddress: return (void *)cuGetProcAddress;
    case N_cudaStreamCreate: return (void *)cudaStreamCreate;
    case N_cudaStreamCreateWithFlags: return (void *)cudaStreamCreateWithFlags;
    case N_cudaStreamCreateWithPriority: return (void *)cudaStreamCreateWithPriority;
    case N_cudaDeviceEnablePeerAccess: return (void *)cudaDeviceEnablePeerAccess;
    case N_cudaIpcGetMemHandle: return (void *)cudaIpcGetMemHandle;
    case N_cudaGetLastError: return (void *)cudaGetLastError;
    case N_cudaPeekAtLastError: return (void *)cudaPeekAtLastError;
    case N_cuStreamCreate: return (void *)cuStreamCreate;
    case N_cuStreamCreateWithPriority: return (void *)cuStreamCreateWithPriority;
    case N_cuGreenCtxStreamCreate: return (void *)cuGreenCtxStreamCreate;
    case N_cuCtxEnablePeerAccess: return (void *)cuCtxEnablePeerAccess;
    case N_cuMemGetAddressRange_v2: return (void *)cuMemGetAddressRange_v2;
    case N_cuMemGetInfo_v2: return (void *)cuMemGetInfo_v2;
    case N_cuDevicePrimaryCtxReset_v2: return (void *)cuDevicePrimaryCtxReset_v2;
    case N_cuDevicePrimaryCtxReset: return (void *)cuDevicePrimaryCtxReset;
    case N_cuDeviceSetMemPool: return (void *)cuDeviceSetMemPool;
    default: return NULL;
    }
}

/* The first definition of `symbol` made by one of the objects from `l` on in the link-map chain
 * (load order) itself, not by its dependencies, other than `exclude`; NULL when none. Asks each
 * object through a handle (dlopen RTLD_NOLOAD: never loads anything) and the real dlsym. */
static void *definition_in_loaded(struct link_map *l, const char *symbol, const void *exclude) {
    for (; l; l = l->l_next) {
        if (!l->l_name || !l->l_name[0]) continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *p = interpose_real_dlsym(h, symbol);
        dlclose(h);
        if (!p || p == exclude) continue;
        Dl_info pi;
        struct link_map *owner = NULL;
        /* (the handle search also covers its dependencies, which come later in the chain, or
         * earlier) */
        if (dladdr1(p, &pi, (void **)&owner, RTLD_DL_LINKMAP) && owner && owner != l) continue;
        return p;
    }
    return NULL;
}

/* The first object of the link-map chain (the program). */
static struct link_map *loaded_objects_head(void) {
    Dl_info info;
    struct link_map *l = NULL;
    if (!dladdr1((void *)(uintptr_t)loaded_objects_head, &info, (void **)&l, RTLD_DL_LINKMAP) || !l) return NULL;
    while (l->l_prev) l = l->l_prev;
    return l;
}

static void set_next(int i, void *fn) {
    if (fn && fn != own_fn(i)) atomic_store_explicit(&nexts[i].fn, fn, memory_order_release);
}

static void *lookup_next(int i) {
    void *f = atomic_load_explicit(&nexts[i].fn, memory_order_acquire);
    if (__builtin_expect(f != NULL, 1)) return f;
    if (nexts[i].driver) {
        /* The driver's own definition, when the driver is loaded (never loads it). */
        void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (lib) {
            f = interpose_real_dlsym(lib, nexts[i].symbol);
            dlclose(lib);
        }
    }
    if (!f || f == own_fn(i)) f = interpose_real_dlsym(RTLD_NEXT, nexts[i].symbol);
    if (f == own_fn(i)) f = NULL;
    /* RTLD_NEXT sees the global scope only: a CUDA runtime that came in RTLD_LOCAL (the dependency
     * of a Python extension module) is found among all loaded objects. */
    if (!f) f = definition_in_loaded(loaded_objects_head(), nexts[i].symbol, own_fn(i));
    if (f) atomic_store_explicit(&nexts[i].fn, f, memory_order_release);
    return f;
}

#define NEXT(i, type) ((type)lookup_next(i))

typedef cudart_error (*cudaMalloc_fn)(void **, size_t);
typedef cudart_error (*cudaFree_fn)(void *);
typedef cudart_error (*cudaMallocAsync_fn)(void **, size_t, cudart_stream);
typedef cudart_error (*cudaFreeAsync_fn)(void *, cudart_stream);
typedef cudart_error (*cudaMemGetInfo_fn)(size_t *, size_t *);
typedef cudart_error (*cudaStreamDestroy_fn)(cudart_stream);
typedef cudart_error (*cudaGetDevice_fn)(int *);
typedef cudart_error (*cudaStreamIsCapturing_fn)(cudart_stream, int *);
typedef cua_result (*cuMemAlloc_fn)(cua_devptr *, size_t);
typedef cua_result (*cuMemFree_fn)(cua_devptr);
typedef cua_result (*cuMemAllocAsync_fn)(cua_devptr *, size_t, cua_stream);
typedef cua_result (*cuMemFreeAsync_fn)(cua_devptr, cua_stream);
typedef cua_result (*cuStreamDestroy_fn)(cua_stream);
typedef cua_result (*cuGetProcAddress_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef cua_result (*cuGetProcAddress_fn)(const char *, void **, int, unsigned long long);
typedef cudart_error (*cudaStreamCreate_fn)(cudart_stream *);
typedef cudart_error (*cudaStreamCreateWithFlags_fn)(cudart_stream *, unsigned int);
typedef cudart_error (*cudaStreamCreateWithPriority_fn)(cudart_stream *, unsigned int, int);
typedef cudart_error (*cudaDeviceEnablePeerAccess_fn)(int, unsigned int);
typedef cudart_error (*cudaIpcGetMemHandle_fn)(void *, void *);
typedef cudart_error (*cudaGetLastError_fn)(void);
typedef cua_result (*cuCtxPushCurrent_fn)(cua_ctx);
typedef cua_result (*cuCtxPopCurrent_fn)(cua_ctx *);
typedef cua_result (*cuCtxGetDevice_fn)(cua_device *);
typedef cua_result (*cuDevicePrimaryCtxReset_fn)(cua_device);

/* ------------------------------------------------------------------ devices */

/* The device of a runtime request: cudaGetDevice, else the current context's, else 0. */
static int runtime_device(void) {
    cudaGetDevice_fn get = NEXT(N_cudaGetDevice, cudaGetDevice_fn);
    int dev = 0;
    if (get && get(&dev) == CUDART_SUCCESS) return dev;
    const driver_ops_t *drv = api_driver();
    dev = 0;
    if (drv && drv->current_device && drv->current_device(&dev) == CUA_SUCCESS) return dev;
    return 0;
}

/* The device of a driver request: the current context's; -1 when there is none. */
static int driver_device(void) {
    const driver_ops_t *drv = api_driver();
    int dev = -1;
    if (!drv || !drv->current_device || drv->current_device(&dev) != CUA_SUCCESS) return -1;
    return dev;
}

/* A stream handle that names one stream: not the legacy stream (NULL, cudaStreamLegacy) or
 * cudaStreamPerThread, whose meaning depends on the calling thread. */
static bool real_stream(cua_stream stream) { return (uintptr_t)stream > (uintptr_t)CUA_STREAM_PER_THREAD; }

/* The device an allocation on `stream` comes from: as CUDA, the stream's device, whichever is
 * current. Asked of the driver only for a real stream handle and in a process that uses more than
 * one device (a single-device process pays nothing); `current` otherwise, or when the driver cannot
 * tell. */
static int stream_alloc_device(cua_stream stream, int current) {
    if (!real_stream(stream)) return current;
    const driver_ops_t *drv = api_driver(); /* (starts cualloc, as the allocation will) */
    if (api_device_count() < 2) return current;
    int dev;
    if (drv && drv->stream_device && drv->stream_device(stream, &dev) == CUA_SUCCESS) return dev;
    return current;
}

/* The current context's device asked of the driver itself, as before cualloc starts: nothing is
 * started or initialized. The ordinal is the CUdevice value; -1 when there is no context (or the
 * program has not called cuInit). */
static int context_device_unstarted(void) {
    cuCtxGetDevice_fn getdev = NEXT(N_cuCtxGetDevice, cuCtxGetDevice_fn);
    cua_device d = -1;
    return getdev && getdev(&d) == CUA_SUCCESS ? d : -1;
}

/* ------------------------------------------------------------------ before the heaps exist */

/* Non-blocking streams created, and peer access enabled, before cualloc started (the front door
 * starts nothing for them): remembered here, handed to the heaps at the first served allocation.
 * The streams' table grows as they come, as the heap's own does (grow_table_reserve): PyTorch
 * alone makes 64 and more per device (its stream pools), and a heap told of only some must settle
 * device-wide frees with a device synchronize, which invalidates a graph capture on a stream it was
 * not told of. Everything here is guarded by pending_lock. */
typedef struct pending_stream_s {
    cua_stream s;
    int dev;
} pending_stream_t;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pending_stream_t *pending_nb; /* pending_nb_cap entries (grow_table_reserve), the first pending_nb_n used */
static size_t pending_nb_n, pending_nb_cap;
static uint64_t pending_peer[CUALLOC_MAX_DEVICES]; /* bit a of [d]: device a may access d's memory */
/* Bit d: a non-blocking stream of device d could not be remembered (no memory for the table). Its
 * heap must then not rely on the streams it knows (their events would not cover the others). */
static uint64_t pending_nb_lost;
static _Atomic int pending_any;

/* fork: the child must not inherit pending_lock held by a parent thread that was creating a
 * stream at that moment (its first stream would wait forever), nor the parent's pending streams,
 * which are not its own. Registered when the library is loaded, so that a fork before cualloc
 * starts is covered too (api.c's handlers come only with the heaps), and so that no thread is ever
 * inside the registration when another forks: registering at first use, under pthread_once, left
 * a child forked meanwhile waiting forever on a once whose initializer it does not run where the
 * once is not fork-aware (ThreadSanitizer's; glibc's starts it again). */
static void pending_after_fork_child(void) {
    pending_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    /* The table is forgotten, not unmapped or reused: a parent thread may have been moving it to a
     * larger one (grow_table_reserve) at the fork, so neither the pointer nor the capacity the child
     * sees need describe one mapping. At most the table's pages stay mapped in the child. */
    pending_nb = NULL;
    pending_nb_cap = 0;
    pending_nb_n = 0;
    pending_nb_lost = 0;
    memset(pending_peer, 0, sizeof pending_peer);
    atomic_store_explicit(&pending_any, 0, memory_order_relaxed);
}

__attribute__((constructor)) static void pending_fork_register(void) {
    pthread_atfork(NULL, NULL, pending_after_fork_child);
}

static void pending_lock_take(void) { pthread_mutex_lock(&pending_lock); }


/* owner's heap grants `accessor` access (driver mask, then existing mappings). */
static void peer_apply(int owner, int accessor) {
    const driver_ops_t *drv = api_driver();
    if (!drv || !drv->peer_enable || owner < 0 || owner >= api_device_count()) return;
    if (drv->peer_enable(owner, accessor) != CUA_SUCCESS) return;
    heap_t *h = api_heap_if_created(owner);
    if (h) heap_peer_enabled(h);
}

static void pending_flush(void) {
    pending_lock_take();
    for (size_t i = 0; i < pending_nb_n; i++) {
        heap_t *h = api_heap(pending_nb[i].dev);
        if (h) heap_stream_created(h, pending_nb[i].s, true);
    }
    pending_nb_n = 0;
    for (int d = 0; pending_nb_lost && d < CUALLOC_MAX_DEVICES; d++) {
        if (!((pending_nb_lost >> d) & 1)) continue;
        pending_nb_lost &= ~((uint64_t)1 << d);
        heap_t *h = api_heap(d);
        if (h) heap_streams_untracked(h);
    }
    for (int d = 0; d < CUALLOC_MAX_DEVICES; d++) {
        for (int a = 0; pending_peer[d] && a < 64; a++) {
            if (!((pending_peer[d] >> a) & 1)) continue;
            pending_peer[d] &= ~((uint64_t)1 << a);
            peer_apply(d, a);
        }
    }
    atomic_store(&pending_any, 0);
    pthread_mutex_unlock(&pending_lock);
}

/* A stream was created on dev: its heap learns whether it is non-blocking. */
static void note_stream(int dev, cua_stream s, bool non_blocking) {
    if (disabled() || dev < 0) return;
    if (api_started()) {
        heap_t *h = api_heap_if_created(dev);
        if (h) {
            heap_stream_created(h, s, non_blocking);
            return;
        }
    }
    pending_lock_take();
    for (size_t i = 0; i < pending_nb_n; i++) {
        if (pending_nb[i].s == s) {
            pending_nb[i] = pending_nb[--pending_nb_n];
            break;
        }
    }
    if (non_blocking) {
        pending_stream_t *table = grow_table_reserve(pending_nb, pending_nb_n, &pending_nb_cap, sizeof *pending_nb);
        if (table) {
            pending_nb = table;
            pending_nb[pending_nb_n++] = (pending_stream_t){.s = s, .dev = dev};
            atomic_store(&pending_any, 1);
        } else if (dev < CUALLOC_MAX_DEVICES) {
            pending_nb_lost |= (uint64_t)1 << dev;
            atomic_store(&pending_any, 1);
        }
    }
    pthread_mutex_unlock(&pending_lock);
}

/* dev's primary context is being reset: its streams are destroyed with it, so those remembered
 * for its heap (and the mark that some could not be) are dropped. */
static void pending_forget_device(int dev) {
    if (!atomic_load_explicit(&pending_any, memory_order_relaxed)) return;
    pending_lock_take();
    for (size_t i = 0; i < pending_nb_n;) {
        if (pending_nb[i].dev == dev) pending_nb[i] = pending_nb[--pending_nb_n];
        else i++;
    }
    if (dev >= 0 && dev < CUALLOC_MAX_DEVICES) pending_nb_lost &= ~((uint64_t)1 << dev);
    pthread_mutex_unlock(&pending_lock);
}

/* After the application enabled peer access so that `accessor` may use `owner`'s memory. */
static void note_peer(int owner, int accessor) {
    if (disabled() || owner < 0 || accessor < 0 || owner == accessor || owner >= CUALLOC_MAX_DEVICES || accessor >= 64)
        return;
    if (api_started()) {
        peer_apply(owner, accessor);
        return;
    }
    pending_lock_take();
    pending_peer[owner] |= (uint64_t)1 << accessor;
    atomic_store(&pending_any, 1);
    pthread_mutex_unlock(&pending_lock);
}

/* ------------------------------------------------------------------ exclude: by caller module */

/* CUALLOC_CONF exclude: globs against the file name of the module that called the front door.
 * Results are cached per return address (a small table, overwritten on collision). */
#define EXCLUDE_CACHE 256
/* One word per entry, (return address << 1) | excluded, so that a reader never pairs one caller's
 * address with another's answer (user-space addresses leave the top bit free); 0: empty. */
static _Atomic uintptr_t exclude_cache[EXCLUDE_CACHE];

static bool exclude_match(const char *patterns, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char pat[CONF_PATH_MAX];
    for (const char *p = patterns; *p;) {
        size_t n = strcspn(p, ";|");
        if (n > 0 && n < sizeof pat) {
            memcpy(pat, p, n);
            pat[n] = '\0';
            if (fnmatch(pat, base, 0) == 0) return true;
        }
        p += n;
        if (*p) p++;
    }
    return false;
}

/* Is the caller at return address `ra` excluded? Never starts cualloc by itself beyond reading the
 * configuration, which the allocation about to be served needs anyway. */
static bool excluded(const void *ra) {
    const conf_t *c = api_conf();
    if (!c->exclude[0] || !ra) return false;
    uintptr_t key = (uintptr_t)ra;
    /* the high bits of a multiplicative hash: call sites of the same code in two libraries at
     * page-aligned bases differ only above bit 11 */
    size_t slot = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 56) % EXCLUDE_CACHE;
    uintptr_t e = atomic_load_explicit(&exclude_cache[slot], memory_order_relaxed);
    if (e >> 1 == key) return e & 1;
    Dl_info info;
    bool ex = dladdr(ra, &info) && info.dli_fname && exclude_match(c->exclude, info.dli_fname);
    atomic_store_explicit(&exclude_cache[slot], key << 1 | (uintptr_t)ex, memory_order_relaxed);
    return ex;
}

#define CALLER() __builtin_extract_return_addr(__builtin_return_address(0))

/* Set while a runtime entry point passes an allocation through (excluded caller, capture): the
 * runtime's own driver calls inside it reach cualloc's driver wrappers and must pass too. */
static __thread int passthrough_depth;

/* ------------------------------------------------------------------ common paths */

/* cudaStreamPerThread names a different stream in every thread, and an event recorded or a
 * synchronize made on it acts on the calling thread's: the heap cannot treat it as one stream. Its
 * allocations use a key of the calling thread's own (stream_key_make of a thread-local's address,
 * never a CUDA handle), on which the heap makes no driver call; the frees wait device-wide
 * (release), for an event on the legacy stream, which every thread's default stream (a blocking
 * stream) precedes. The key's tag can still hold free blocks (fresh memory mapped for its requests;
 * in classic mode its segments' blocks): only a device synchronize settles those for others. */
static __thread char per_thread_stream;
static cua_stream per_thread_stream_key(void) { return stream_key_make(&per_thread_stream); }

/* The devices (a bit each) whose current memory pool the program made one other than the device's
 * default (cuDeviceSetMemPool, which cudaDeviceSetMemPool reaches through the runtime's driver
 * table): CUDA takes their stream-ordered allocations from that pool, with its attributes (IPC
 * export, other devices' access, its release threshold), so cualloc passes them through. */
static _Atomic uint64_t custom_pool_devices;
_Static_assert(CUALLOC_MAX_DEVICES <= 64, "custom_pool_devices has a bit per device");

static inline bool custom_pool_on(int dev) {
    return (unsigned)dev < CUALLOC_MAX_DEVICES &&
           (atomic_load_explicit(&custom_pool_devices, memory_order_relaxed) >> dev & 1);
}

/* Serves a request from dev's heap. CUA_SUCCESS, an error, or CUA_ERROR_NOT_FOUND when the heap
 * cannot serve at all (no such device, the driver is unusable) or must not (a stream-ordered one on a
 * device whose current pool the program set: custom_pool_devices): the caller passes through.
 * noinline: the trace recorder drops this frame and the entry point that called it (skip 1), so
 * the first frame of a recorded stack is the application's. */
__attribute__((noinline)) static cua_result serve(int dev, size_t size, cua_stream stream, void **out) {
    if (stream != ALLOC_DEVICE_WIDE && custom_pool_on(dev)) return CUA_ERROR_NOT_FOUND;
    heap_t *h = api_heap(dev);
    if (!h) return CUA_ERROR_NOT_FOUND;
    if (trace_enabled()) trace_capture_stack(1);
    if (__builtin_expect(atomic_load_explicit(&pending_any, memory_order_relaxed), 0)) pending_flush();
    cua_result r = stream == ALLOC_DEVICE_WIDE
                       ? heap_alloc_device_wide(h, size, out)
                       : heap_alloc(h, size, stream == CUA_STREAM_PER_THREAD ? per_thread_stream_key() : heap_stream_name(stream),
                                    out);
    /* The heap passes the driver's errors on, and the driver's CUDA_ERROR_NOT_FOUND would read as
     * "pass through" here: the request the heap failed (and reported) would go to CUDA's allocator.
     * It fails as out of memory, as every heap failure did before driver errors were passed on. */
    return r == CUA_ERROR_NOT_FOUND ? CUA_ERROR_OUT_OF_MEMORY : r;
}

/* What a free found: the pointer freed; not cualloc's (the caller passes it through); or in
 * cualloc's memory but no live block's start (a double free, an interior pointer): refused as
 * invalid, never passed through, since the driver would take it for the segment or range it is. */
typedef enum { RELEASED, RELEASE_FOREIGN, RELEASE_INVALID } release_t;


/* The driver's answer to "is `stream` capturing?": CUA_SUCCESS with *cap, or its error. A driver
 * that cannot be asked has no captures (success, *cap false). */
static cua_result drv_capture_status(int dev, cua_stream stream, bool *cap) {
    const driver_ops_t *drv = api_driver();
    *cap = false;
    if (!drv || !drv->stream_is_capturing) return CUA_SUCCESS;
    return drv->stream_is_capturing(dev, stream, cap);
}

/* A stream-ordered free made while its stream captures a CUDA graph becomes a node of the graph:
 * the memory is freed when the graph runs, each time it runs, which cualloc never sees. Freeing
 * the block now would let other work reuse memory the graph's kernels still use, so it stays
 * allocated for good (said once). Only a definite capture counts: a failed query frees as usual.
 * Every stream but the legacy one (NULL, CU_STREAM_LEGACY) may capture, the calling thread's
 * cudaStreamPerThread included (cuStreamBeginCapture: "Capture may not be initiated if stream is
 * CU_STREAM_LEGACY"); the query on CU_STREAM_PER_THREAD asks about the calling thread's. */
static bool free_captured(heap_t *h, const void *ptr, cua_stream stream) {
    bool cap;
    if ((!real_stream(stream) && stream != CUA_STREAM_PER_THREAD) ||
        drv_capture_status(heap_device(h), stream, &cap) != CUA_SUCCESS || !cap)
        return false;
    static _Atomic int said;
    if (!atomic_exchange(&said, 1))
        cua_error("cudaFreeAsync(%p) during a CUDA graph capture: the graph would free it each time it runs, which "
                  "cualloc cannot follow, so the block stays allocated (never reused: the graph's kernels may "
                  "still use it); later such frees are not reported. Allocate the graph's memory inside the "
                  "capture (it then comes from CUDA), or free it outside",
                  ptr);
    return true;
}

/* Before a free: streams still pending are handed to the heaps. A stream noted while the first
 * allocation made its heap (note_stream saw no heap yet, serve's check saw nothing pending yet)
 * waits in the list until the next allocation; a block its work uses, freed before that, must
 * already find it known, or device-wide frees would not wait for it. The program orders the free
 * after the stream's creation returned, so the flag is seen. */
static inline void flush_before_free(void) {
    if (__builtin_expect(atomic_load_explicit(&pending_any, memory_order_relaxed), 0)) pending_flush();
}

/* Frees a pointer. A free on cudaStreamPerThread waits device-wide (see per_thread_stream_key). */
static release_t release(const void *ptr, cua_stream stream) {
    heap_t *h = api_owner(ptr);
    if (!h) return RELEASE_FOREIGN;
    flush_before_free();
    if (free_captured(h, ptr, stream)) return RELEASED;
    /* Freed on another device's stream (CUDA allows it; the legacy and per-thread handles name the
     * current device's): the heap could record no event of its own on that stream, so the block
     * would wait for good, or (those handles) be taken at once by its own device's stream of the
     * same name. The stream is waited for here (rare: the host blocks until its work is done), and
     * the block goes back on the legacy stream. */
    int dev = heap_device(h), sdev = stream_alloc_device(stream, dev);
    if (!real_stream(stream) && api_device_count() > 1) {
        int current = driver_device();
        if (current >= 0) sdev = current;
    }
    const driver_ops_t *drv = sdev != dev ? api_driver() : NULL;
    bool cap = true; /* (a synchronize would invalidate a capture: only a stream known not to capture) */
    if (drv && drv->stream_synchronize && drv_capture_status(sdev, stream, &cap) == CUA_SUCCESS && !cap &&
        drv->stream_synchronize(sdev, stream) == CUA_SUCCESS)
        stream = NULL; /* its work is done: no legacy-stream work can still use the block */
    else if (stream == CUA_STREAM_PER_THREAD)
        return heap_free_device_wide(h, (void *)ptr) ? RELEASED : RELEASE_INVALID;
    else if (heap_stream_name(stream) == NULL)
        return heap_free_on_legacy(h, (void *)ptr) ? RELEASED : RELEASE_INVALID; /* cudaMalloc may take it */
    bool ok = heap_free(h, (void *)ptr, heap_stream_name(stream));
    return ok ? RELEASED : RELEASE_INVALID;
}

/* cudaFree / cuMemFree: CUDA's device-wide guarantee (heap_free_device_wide). */
static release_t release_device_wide(const void *ptr) {
    heap_t *h = api_owner(ptr);
    if (!h) return RELEASE_FOREIGN;
    flush_before_free();
    return heap_free_device_wide(h, (void *)ptr) ? RELEASED : RELEASE_INVALID;
}

static void streams_destroyed(cua_stream stream) {
    if (atomic_load_explicit(&pending_any, memory_order_relaxed)) {
        pending_lock_take();
        for (size_t i = 0; i < pending_nb_n;) {
            if (pending_nb[i].s == stream) pending_nb[i] = pending_nb[--pending_nb_n];
            else i++;
        }
        pthread_mutex_unlock(&pending_lock);
    }
    if (!api_started()) return; /* no heap yet: the pending list was all there was to forget */
    int n = api_device_count();
    for (int d = 0; d < n; d++) {
        heap_t *h = api_heap_if_created(d);
        if (h) heap_stream_destroyed(h, stream);
    }
}

/* ------------------------------------------------------------------ runtime entry points */

/* The newest error a runtime entry point of this thread answered itself (0: none), not yet taken
 * by cudaGetLastError: CUDA's runtime sets its last error on every failing call, and cualloc's
 * answers never reach it. */
static __thread cudart_error own_last_error;

/* Every error a runtime entry point answers itself goes through here. */
static cudart_error runtime_failed(cudart_error e) {
    own_last_error = e;
    return e;
}

/* The runtime's error for an allocation the heap failed with r: out of memory, or the driver's
 * error where the heap met one (heap_alloc). The errors that leave a context unusable (a kernel's
 * fault, an uncorrectable ECC or NVLink error, an MPS client ended, an external device's error)
 * have the same values in both APIs and are returned as they are, as cudaMalloc itself returns
 * them; any other reads as out of memory, as before. */
static cudart_error runtime_alloc_failed(cua_result r) {
    switch ((int)r) {
    case 214: case 220: case 700: case 702: case 710: case 714: case 715: case 716: case 717: case 718: case 719:
    case 810: case 911: case 999:
        return runtime_failed((cudart_error)r);
    default:
        return runtime_failed(CUDART_ERROR_MEMORY_ALLOCATION);
    }
}

/* The last error: the runtime's own first (a sticky error it holds must not be hidden behind an
 * allocation's), else cualloc's. `take` clears both, as cudaGetLastError clears CUDA's one. */
static cudart_error last_error(int next_idx, bool take) {
    cudaGetLastError_fn next = NEXT(next_idx, cudaGetLastError_fn);
    cudart_error runtime = next ? next() : CUDART_SUCCESS;
    cudart_error own = own_last_error;
    if (take) own_last_error = CUDART_SUCCESS;
    return runtime != CUDART_SUCCESS ? runtime : own;
}

cudart_error cudaGetLastError(void) { return last_error(N_cudaGetLastError, true); }
cudart_error cudaPeekAtLastError(void) { return last_error(N_cudaPeekAtLastError, false); }

/* The runtime's allocation needs an active context: on a thread with no current context, CUDA's
 * runtime makes the current device's primary context current (and initializes it) before it
 * allocates, and a program may then use the driver API with it (cuCtxGetCurrent, cuModuleLoadData,
 * cuLaunchKernel ...). cualloc's heap works in contexts of its own making, pushed and popped around
 * each call, so a runtime allocation it serves asks the runtime to do that first, with cudaFree(NULL)
 * (documented as doing nothing else). A runtime that cannot start (a driver older than it, no
 * device) fails the allocation with its own error, as it would have failed it. One query of the
 * thread's current context otherwise: whether one is current and usable (context_current, one
 * driver call where current_device makes two), not its device, which runtime_device asks. */
static cudart_error runtime_context(void) {
    const driver_ops_t *drv = api_driver();
    if (drv && drv->context_current && drv->context_current() == CUA_SUCCESS) return CUDART_SUCCESS;
    cudaFree_fn next = NEXT(N_cudaFree, cudaFree_fn);
    return next ? next(NULL) : CUDART_SUCCESS;
}

cudart_error cudaMalloc(void **ptr, size_t size) {
    if (disabled()) {
        cudaMalloc_fn next = NEXT(N_cudaMalloc, cudaMalloc_fn);
        return next ? next(ptr, size) : CUDART_ERROR_INITIALIZATION;
    }
    if (!ptr) return runtime_failed(CUDART_ERROR_INVALID_VALUE);
    cudart_error init = runtime_context();
    if (init != CUDART_SUCCESS) return runtime_failed(init);
    if (size == 0) { /* as CUDA: success and NULL */
        *ptr = NULL;
        return CUDART_SUCCESS;
    }
    void *p = NULL;
    cua_result r = excluded(CALLER()) ? CUA_ERROR_NOT_FOUND : serve(runtime_device(), size, ALLOC_DEVICE_WIDE, &p);
    if (r == CUA_ERROR_NOT_FOUND) {
        cudaMalloc_fn next = NEXT(N_cudaMalloc, cudaMalloc_fn);
        passthrough_depth++; /* the runtime's own cuMemAlloc must not be served either */
        cudart_error e = next ? next(ptr, size) : CUDART_ERROR_MEMORY_ALLOCATION;
        passthrough_depth--;
        return e;
    }
    if (r != CUA_SUCCESS) return runtime_alloc_failed(r);
    *ptr = p;
    return CUDART_SUCCESS;
}

cudart_error cudaFree(void *ptr) {
    release_t r = ptr && !disabled() ? release_device_wide(ptr) : RELEASE_FOREIGN;
    if (r != RELEASE_FOREIGN) return r == RELEASED ? CUDART_SUCCESS : runtime_failed(CUDART_ERROR_INVALID_VALUE);
    cudaFree_fn next = NEXT(N_cudaFree, cudaFree_fn);
    if (next) return next(ptr);
    return ptr ? CUDART_ERROR_INVALID_VALUE : CUDART_SUCCESS;
}

/* During stream capture the allocation must become a graph node: pass it through. So must it when
 * the runtime cannot say: the legacy stream's query fails (cudaErrorStreamCaptureImplicit) while a
 * blocking stream captures, and CUDA then refuses the allocation itself, where cualloc would serve
 * it. As the driver entry points (drv_capturing), an error counts as capturing. */
static bool capturing(cudart_stream stream) {
    cudaStreamIsCapturing_fn is = NEXT(N_cudaStreamIsCapturing, cudaStreamIsCapturing_fn);
    int status = 0;
    return is && (is(stream, &status) != CUDART_SUCCESS || status != 0);
}

cudart_error cudaMallocAsync(void **ptr, size_t size, cudart_stream stream) {
    if (disabled() || capturing(stream)) {
        cudaMallocAsync_fn next = NEXT(N_cudaMallocAsync, cudaMallocAsync_fn);
        passthrough_depth++;
        cudart_error e = next ? next(ptr, size, stream) : CUDART_ERROR_INITIALIZATION;
        passthrough_depth--;
        return e;
    }
    if (!ptr) return runtime_failed(CUDART_ERROR_INVALID_VALUE);
    cudart_error init = runtime_context();
    if (init != CUDART_SUCCESS) return runtime_failed(init);
    if (size == 0) {
        *ptr = NULL;
        return CUDART_SUCCESS;
    }
    void *p = NULL;
    cua_result r = excluded(CALLER()) ? CUA_ERROR_NOT_FOUND
                                      : serve(stream_alloc_device((cua_stream)stream, runtime_device()), size,
                                              (cua_stream)stream, &p);
    if (r == CUA_ERROR_NOT_FOUND) {
        cudaMallocAsync_fn next = NEXT(N_cudaMallocAsync, cudaMallocAsync_fn);
        passthrough_depth++;
        cudart_error e = next ? next(ptr, size, stream) : CUDART_ERROR_MEMORY_ALLOCATION;
        passthrough_depth--;
        return e;
    }
    if (r != CUA_SUCCESS) return runtime_alloc_failed(r);
    *ptr = p;
    return CUDART_SUCCESS;
}

cudart_error cudaFreeAsync(void *ptr, cudart_stream stream) {
    release_t r = ptr && !disabled() ? release(ptr, (cua_stream)stream) : RELEASE_FOREIGN;
    if (r != RELEASE_FOREIGN) return r == RELEASED ? CUDART_SUCCESS : runtime_failed(CUDART_ERROR_INVALID_VALUE);
    cudaFreeAsync_fn next = NEXT(N_cudaFreeAsync, cudaFreeAsync_fn);
    if (next) return next(ptr, stream);
    return ptr ? CUDART_ERROR_INVALID_VALUE : CUDART_SUCCESS;
}

/* After the driver's or the runtime's memory query succeeded: what the device reports free, plus
 * what the heap of device() holds cached (reserved, not allocated), which the application could
 * allocate too; at most what the heap's cap (max_memory_mb, per_process_memory_fraction) leaves
 * beside its allocated bytes, since past that cualloc refuses. Nothing when cualloc is off or not
 * started (device() is then not asked). */
static void add_cached(int (*device)(void), size_t *free_bytes, const size_t *total_bytes) {
    if (disabled() || !api_started() || !free_bytes || !total_bytes) return;
    int dev = device();
    if (dev < 0) return;
    heap_t *h = api_heap_if_created(dev);
    cualloc_stats s = {0};
    if (h) heap_get_stats(h, &s);
    else s.capacity_bytes = conf_capacity(api_conf(), *total_bytes); /* (no heap yet: the cap it will have) */
    size_t cached = s.reserved_bytes > s.allocated_bytes ? s.reserved_bytes - s.allocated_bytes : 0;
    size_t f = *free_bytes + cached;
    if (f < *free_bytes || f > *total_bytes) f = *total_bytes;
    size_t under_cap = s.capacity_bytes > s.allocated_bytes ? s.capacity_bytes - s.allocated_bytes : 0;
    *free_bytes = f < under_cap ? f : under_cap;
}

/* Set while the runtime's cudaMemGetInfo runs: the runtime answers it with the driver's
 * cuMemGetInfo, fetched through cuGetProcAddress and so cualloc's, which must then leave the
 * cached bytes to be added once, here (a runtime that asks the driver another way gets them too). */
static __thread int runtime_meminfo_depth;

cudart_error cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    cudaMemGetInfo_fn next = NEXT(N_cudaMemGetInfo, cudaMemGetInfo_fn);
    if (!next) return CUDART_ERROR_INITIALIZATION;
    runtime_meminfo_depth++;
    cudart_error r = next(free_bytes, total_bytes);
    runtime_meminfo_depth--;
    if (r == CUDART_SUCCESS) add_cached(runtime_device, free_bytes, total_bytes);
    return r;
}

cudart_error cudaStreamDestroy(cudart_stream stream) {
    if (!disabled()) streams_destroyed((cua_stream)stream);
    cudaStreamDestroy_fn next = NEXT(N_cudaStreamDestroy, cudaStreamDestroy_fn);
    return next ? next(stream) : CUDART_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ driver entry points */

/* Is a stream capturing (driver entry points: through the driver op)? Errors count as capturing. */
static bool drv_capturing(int dev, cua_stream stream) {
    bool cap;
    return drv_capture_status(dev, stream, &cap) != CUA_SUCCESS || cap;
}

/* Before cualloc starts, a driver-API allocation starts it only when the program has a current
 * context, asked of the driver itself: a call before the program's own cuInit, or without a
 * context, reaches the driver as it would without cualloc, and nothing initializes the driver
 * behind the program's back (its later calls would answer differently). */
static bool driver_ready_for_us(void) { return api_started() || context_device_unstarted() >= 0; }

static cua_result drv_alloc(int next_idx, cua_devptr *dptr, size_t size, cua_stream stream, bool async,
                            const void *caller) {
    int dev;
    if (!disabled() && !passthrough_depth && dptr && size > 0 && driver_ready_for_us() && (dev = driver_device()) >= 0 &&
        !excluded(caller) &&
        (!async || (dev = stream_alloc_device(stream, dev)) >= 0) && !(async && drv_capturing(dev, stream))) {
        void *p = NULL;
        cua_result r = serve(dev, size, async ? stream : ALLOC_DEVICE_WIDE, &p);
        if (r != CUA_ERROR_NOT_FOUND) {
            if (r == CUA_SUCCESS) *dptr = (cua_devptr)(uintptr_t)p;
            return r;
        }
    }
    if (async) {
        cuMemAllocAsync_fn next = NEXT(next_idx, cuMemAllocAsync_fn);
        return next ? next(dptr, size, stream) : CUA_ERROR_NOT_INITIALIZED;
    }
    cuMemAlloc_fn next = NEXT(next_idx, cuMemAlloc_fn);
    return next ? next(dptr, size) : CUA_ERROR_NOT_INITIALIZED;
}

static cua_result drv_free(int next_idx, cua_devptr dptr, cua_stream stream, bool async) {
    release_t r = RELEASE_FOREIGN;
    if (dptr && !disabled())
        r = async ? release((const void *)(uintptr_t)dptr, stream) : release_device_wide((const void *)(uintptr_t)dptr);
    if (r != RELEASE_FOREIGN) return r == RELEASED ? CUA_SUCCESS : CUA_ERROR_INVALID_VALUE;
    if (async) {
        cuMemFreeAsync_fn next = NEXT(next_idx, cuMemFreeAsync_fn);
        return next ? next(dptr, stream) : CUA_ERROR_NOT_INITIALIZED;
    }
    cuMemFree_fn next = NEXT(next_idx, cuMemFree_fn);
    return next ? next(dptr) : CUA_ERROR_NOT_INITIALIZED;
}

cua_result cuMemAlloc_v2(cua_devptr *dptr, size_t size) {
    return drv_alloc(N_cuMemAlloc_v2, dptr, size, NULL, false, CALLER());
}
cua_result cuMemFree_v2(cua_devptr dptr) { return drv_free(N_cuMemFree_v2, dptr, NULL, false); }
cua_result cuMemAllocAsync(cua_devptr *dptr, size_t size, cua_stream stream) {
    return drv_alloc(N_cuMemAllocAsync, dptr, size, stream, true, CALLER());
}
cua_result cuMemFreeAsync(cua_devptr dptr, cua_stream stream) { return drv_free(N_cuMemFreeAsync, dptr, stream, true); }
/* Per-thread default stream variants: a NULL stream means this thread's default stream. */
cua_result cuMemAllocAsync_ptsz(cua_devptr *dptr, size_t size, cua_stream stream) {
    const void *caller = CALLER();
    if (!stream && !disabled() && !passthrough_depth) {
        int dev;
        if (dptr && size > 0 && driver_ready_for_us() && (dev = driver_device()) >= 0 && !excluded(caller) &&
            !drv_capturing(dev, CUA_STREAM_PER_THREAD)) {
            void *p = NULL;
            cua_result r = serve(dev, size, CUA_STREAM_PER_THREAD, &p);
            if (r != CUA_ERROR_NOT_FOUND) {
                if (r == CUA_SUCCESS) *dptr = (cua_devptr)(uintptr_t)p;
                return r;
            }
        }
    }
    return drv_alloc(N_cuMemAllocAsync_ptsz, dptr, size, stream, true, caller);
}
cua_result cuMemFreeAsync_ptsz(cua_devptr dptr, cua_stream stream) {
    if (dptr && !stream && !disabled()) {
        release_t r = release((const void *)(uintptr_t)dptr, CUA_STREAM_PER_THREAD);
        if (r != RELEASE_FOREIGN) return r == RELEASED ? CUA_SUCCESS : CUA_ERROR_INVALID_VALUE;
    }
    return drv_free(N_cuMemFreeAsync_ptsz, dptr, stream, true);
}

cua_result cuStreamDestroy_v2(cua_stream stream) {
    if (!disabled()) streams_destroyed(stream);
    cuStreamDestroy_fn next = NEXT(N_cuStreamDestroy_v2, cuStreamDestroy_fn);
    return next ? next(stream) : CUA_ERROR_NOT_INITIALIZED;
}

/* ------------------------------------------------------------------ stream creation */

#define STREAM_NON_BLOCKING 0x1u /* cudaStreamNonBlocking == CU_STREAM_NON_BLOCKING */

/* The device a driver-API stream was created on: the current context's. Before cualloc started,
 * asked of the driver directly (context_device_unstarted). */
static int stream_device(void) { return api_started() ? driver_device() : context_device_unstarted(); }

cudart_error cudaStreamCreate(cudart_stream *stream) {
    cudaStreamCreate_fn next = NEXT(N_cudaStreamCreate, cudaStreamCreate_fn);
    cudart_error r = next ? next(stream) : CUDART_ERROR_INITIALIZATION;
    if (r == CUDART_SUCCESS && stream) note_stream(runtime_device(), (cua_stream)*stream, false);
    return r;
}

cudart_error cudaStreamCreateWithFlags(cudart_stream *stream, unsigned int flags) {
    cudaStreamCreateWithFlags_fn next = NEXT(N_cudaStreamCreateWithFlags, cudaStreamCreateWithFlags_fn);
    cudart_error r = next ? next(stream, flags) : CUDART_ERROR_INITIALIZATION;
    if (r == CUDART_SUCCESS && stream)
        note_stream(runtime_device(), (cua_stream)*stream, (flags & STREAM_NON_BLOCKING) != 0);
    return r;
}

cudart_error cudaStreamCreateWithPriority(cudart_stream *stream, unsigned int flags, int priority) {
    cudaStreamCreateWithPriority_fn next = NEXT(N_cudaStreamCreateWithPriority, cudaStreamCreateWithPriority_fn);
    cudart_error r = next ? next(stream, flags, priority) : CUDART_ERROR_INITIALIZATION;
    if (r == CUDART_SUCCESS && stream)
        note_stream(runtime_device(), (cua_stream)*stream, (flags & STREAM_NON_BLOCKING) != 0);
    return r;
}

cua_result cuStreamCreate(cua_stream *stream, unsigned int flags) {
    cua_pfn_cuStreamCreate next = NEXT(N_cuStreamCreate, cua_pfn_cuStreamCreate);
    cua_result r = next ? next(stream, flags) : CUA_ERROR_NOT_INITIALIZED;
    if (r == CUA_SUCCESS && stream && !disabled())
        note_stream(stream_device(), *stream, (flags & STREAM_NON_BLOCKING) != 0);
    return r;
}

cua_result cuStreamCreateWithPriority(cua_stream *stream, unsigned int flags, int priority) {
    cua_pfn_cuStreamCreateWithPriority next = NEXT(N_cuStreamCreateWithPriority, cua_pfn_cuStreamCreateWithPriority);
    cua_result r = next ? next(stream, flags, priority) : CUA_ERROR_NOT_INITIALIZED;
    if (r == CUA_SUCCESS && stream && !disabled())
        note_stream(stream_device(), *stream, (flags & STREAM_NON_BLOCKING) != 0);
    return r;
}

/* A green context's stream is non-blocking (CUDA requires the flag), and device-wide frees must
 * wait for its work like any other's. Its device is the green context's, which need not be current:
 * the driver is asked for the stream's device once cualloc has started. */
cua_result cuGreenCtxStreamCreate(cua_stream *stream, cua_green_ctx green_ctx, unsigned int flags, int priority) {
    cua_pfn_cuGreenCtxStreamCreate next = NEXT(N_cuGreenCtxStreamCreate, cua_pfn_cuGreenCtxStreamCreate);
    cua_result r = next ? next(stream, green_ctx, flags, priority) : CUA_ERROR_NOT_FOUND;
    if (r == CUA_SUCCESS && stream && !disabled()) {
        int dev = stream_device();
        note_stream(api_started() ? stream_alloc_device(*stream, dev) : dev, *stream, true);
    }
    return r;
}

/* ------------------------------------------------------------------ peer access */

/* cudaDeviceEnablePeerAccess(peer): the current device d may access peer's memory from now on, so
 * peer's heap grants d access over its mappings (CUDA does it for cudaMalloc memory; VMM memory
 * needs cuMemSetAccess). "Already enabled" (704) is success for this purpose. */
cudart_error cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
    cudaDeviceEnablePeerAccess_fn next = NEXT(N_cudaDeviceEnablePeerAccess, cudaDeviceEnablePeerAccess_fn);
    cudart_error r = next ? next(peer, flags) : CUDART_ERROR_INITIALIZATION;
    if (r == CUDART_SUCCESS || r == CUA_ERROR_PEER_ACCESS_ALREADY_ENABLED) note_peer(peer, runtime_device());
    return r;
}

/* cuCtxEnablePeerAccess(peer_ctx): the current context's device may access peer_ctx's device. */
cua_result cuCtxEnablePeerAccess(cua_ctx peer_ctx, unsigned int flags) {
    cua_pfn_cuCtxEnablePeerAccess next = NEXT(N_cuCtxEnablePeerAccess, cua_pfn_cuCtxEnablePeerAccess);
    cua_result r = next ? next(peer_ctx, flags) : CUA_ERROR_NOT_INITIALIZED;
    if ((r != CUA_SUCCESS && r != CUA_ERROR_PEER_ACCESS_ALREADY_ENABLED) || disabled()) return r;
    cuCtxPushCurrent_fn push = NEXT(N_cuCtxPushCurrent_v2, cuCtxPushCurrent_fn);
    cuCtxPopCurrent_fn pop = NEXT(N_cuCtxPopCurrent_v2, cuCtxPopCurrent_fn);
    cuCtxGetDevice_fn getdev = NEXT(N_cuCtxGetDevice, cuCtxGetDevice_fn);
    cua_device me = -1, peer = -1;
    if (!push || !pop || !getdev || getdev(&me) != CUA_SUCCESS) return r;
    if (push(peer_ctx) == CUA_SUCCESS) {
        cua_ctx popped;
        if (getdev(&peer) != CUA_SUCCESS) peer = -1;
        pop(&popped);
    }
    /* Device ordinals: CUdevice values are the ordinals cuDeviceGet returns for them. */
    if (peer >= 0) note_peer(peer, me);
    return r;
}

/* ------------------------------------------------------------------ VMM memory vs cudaMalloc memory */

/* IPC: a VMM chunk is not exportable through cudaIpcGetMemHandle (the handles are created without
 * a shareable type, and CUDA rejects VMM addresses), and a classic block inside a segment would be
 * opened at the segment's start. Fail clearly, once each, saying what to do. */
cudart_error cudaIpcGetMemHandle(void *handle, void *dev_ptr) {
    heap_t *h = disabled() ? NULL : api_owner(dev_ptr);
    if (h && heap_is_vmm(h)) {
        static _Atomic int said;
        if (!atomic_exchange(&said, 1))
            cua_error("cudaIpcGetMemHandle(%p): IPC of expandable-segment (VMM) memory is not supported; "
                      "run the process with CUALLOC_CONF=expandable_segments:False, or add the library "
                      "doing IPC to exclude: (e.g. CUALLOC_CONF=exclude:libnccl*) so its allocations come "
                      "from cudaMalloc",
                      dev_ptr);
        return runtime_failed(CUDART_ERROR_INVALID_VALUE);
    }
    if (h && !heap_starts_segment(h, dev_ptr)) {
        /* Classic mode: a handle covers a whole cuMemAlloc'd segment, and the receiving process
         * opens it at the segment's start, not at this block: it would use the wrong memory. */
        static _Atomic int said_inside;
        if (!atomic_exchange(&said_inside, 1))
            cua_error("cudaIpcGetMemHandle(%p): the block lies inside a segment it shares with others, and the "
                      "other process would open the segment's start, not the block; only a block at the start of "
                      "its segment can be shared. Add the library doing IPC to exclude: (e.g. "
                      "CUALLOC_CONF=exclude:libnccl*) so its allocations come from cudaMalloc",
                      dev_ptr);
        return runtime_failed(CUDART_ERROR_INVALID_VALUE);
    }
    cudaIpcGetMemHandle_fn next = NEXT(N_cudaIpcGetMemHandle, cudaIpcGetMemHandle_fn);
    return next ? next(handle, dev_ptr) : CUDART_ERROR_INITIALIZATION;
}

/* cuMemGetAddressRange: for cualloc's memory, the allocated block containing the address (what
 * CUDA reports for cudaMalloc memory), not the chunk, segment or reservation, which the driver
 * would answer. An address in cualloc's memory that no allocated block holds (a block the program
 * freed, cached and still mapped; free space between blocks) is no allocation, as memory CUDA
 * freed: CUDA_ERROR_NOT_FOUND, what the driver answers for an address no allocation holds. */
cua_result cuMemGetAddressRange_v2(cua_devptr *base, size_t *size, cua_devptr dptr) {
    const void *ptr = (const void *)(uintptr_t)dptr;
    heap_t *h = disabled() ? NULL : api_holder(ptr);
    if (h) {
        uintptr_t b = 0;
        size_t n = 0;
        if (!heap_block_range(h, ptr, &b, &n)) return CUA_ERROR_NOT_FOUND;
        if (base) *base = (cua_devptr)b;
        if (size) *size = n;
        return CUA_SUCCESS;
    }
    cua_pfn_cuMemGetAddressRange_v2 next = NEXT(N_cuMemGetAddressRange_v2, cua_pfn_cuMemGetAddressRange_v2);
    return next ? next(base, size, dptr) : CUA_ERROR_NOT_INITIALIZED;
}

/* cuMemGetInfo: as cudaMemGetInfo, for the current context's device (what the static runtime and
 * the driver API ask). */
cua_result cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    cua_pfn_cuMemGetInfo_v2 next = NEXT(N_cuMemGetInfo_v2, cua_pfn_cuMemGetInfo_v2);
    if (!next) return CUA_ERROR_NOT_INITIALIZED;
    cua_result r = next(free_bytes, total_bytes);
    if (r == CUA_SUCCESS && !runtime_meminfo_depth) add_cached(driver_device, free_bytes, total_bytes);
    return r;
}

/* ------------------------------------------------------------------ primary context reset */

/* cuDevicePrimaryCtxReset(dev) (cudaDeviceReset reaches it through the runtime's driver table):
 * CUDA destroys every allocation, event and stream of the context, cached memory of cualloc's
 * included, and makes a new context at the next call. cualloc gives its heap's memory back first,
 * while the context lives, and retains the context anew afterwards. Device ordinals are the
 * CUdevice values. */
static cua_result primary_ctx_reset(int next_idx, cua_device dev) {
    if (!disabled()) {
        api_device_reset(dev);
        pending_forget_device(dev);
    }
    cuDevicePrimaryCtxReset_fn next = NEXT(next_idx, cuDevicePrimaryCtxReset_fn);
    cua_result r = next ? next(dev) : CUA_ERROR_NOT_INITIALIZED;
    if (!disabled() && api_started()) {
        const driver_ops_t *drv = api_driver();
        if (drv && drv->context_reset) drv->context_reset(dev);
    }
    return r;
}

cua_result cuDevicePrimaryCtxReset_v2(cua_device dev) { return primary_ctx_reset(N_cuDevicePrimaryCtxReset_v2, dev); }
cua_result cuDevicePrimaryCtxReset(cua_device dev) { return primary_ctx_reset(N_cuDevicePrimaryCtxReset, dev); }

/* ------------------------------------------------------------------ memory pools */

typedef cua_result (*cuDeviceSetMemPool_fn)(cua_device, void *);
typedef cua_result (*cuDeviceGetDefaultMemPool_fn)(void **, cua_device);

/* After the driver made `pool` device dev's current one: the device's stream-ordered allocations
 * pass through while it is not the default pool (custom_pool_devices). A pool the driver cannot
 * compare with the default counts as set. Only the stream-ordered entry points read the pool, as
 * in CUDA (cudaMalloc never did). */
cua_result cuDeviceSetMemPool(cua_device dev, void *pool) {
    cuDeviceSetMemPool_fn next = NEXT(N_cuDeviceSetMemPool, cuDeviceSetMemPool_fn);
    cua_result r = next ? next(dev, pool) : CUA_ERROR_NOT_INITIALIZED;
    if (r != CUA_SUCCESS || dev < 0 || dev >= CUALLOC_MAX_DEVICES) return r;
    cuDeviceGetDefaultMemPool_fn get_default = NEXT(N_cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool_fn);
    void *def = NULL;
    bool is_default = get_default && get_default(&def, dev) == CUA_SUCCESS && def == pool;
    uint64_t bit = (uint64_t)1 << dev;
    if (is_default) atomic_fetch_and_explicit(&custom_pool_devices, ~bit, memory_order_relaxed);
    else atomic_fetch_or_explicit(&custom_pool_devices, bit, memory_order_relaxed);
    return r;
}

/* ------------------------------------------------------------------ cuGetProcAddress */

/* Which of cualloc's functions answers a cuGetProcAddress look-up (NULL: pass through), and the
 * next slot the real answer goes to. */
static void *proc_substitute(const char *symbol, int version, unsigned long long flags, int *slot, const char **ours) {
    bool ptsz = flags == CUA_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (strcmp(symbol, "cuMemAlloc") == 0 && version >= 3020) {
        *slot = N_cuMemAlloc_v2, *ours = "cuMemAlloc_v2";
        return (void *)cuMemAlloc_v2;
    }
    if (strcmp(symbol, "cuMemFree") == 0 && version >= 3020) {
        *slot = N_cuMemFree_v2, *ours = "cuMemFree_v2";
        return (void *)cuMemFree_v2;
    }
    if (strcmp(symbol, "cuMemAllocAsync") == 0) {
        if (ptsz) {
            *slot = N_cuMemAllocAsync_ptsz, *ours = "cuMemAllocAsync_ptsz";
            return (void *)cuMemAllocAsync_ptsz;
        }
        *slot = N_cuMemAllocAsync, *ours = "cuMemAllocAsync";
        return (void *)cuMemAllocAsync;
    }
    if (strcmp(symbol, "cuMemFreeAsync") == 0) {
        if (ptsz) {
            *slot = N_cuMemFreeAsync_ptsz, *ours = "cuMemFreeAsync_ptsz";
            return (void *)cuMemFreeAsync_ptsz;
        }
        *slot = N_cuMemFreeAsync, *ours = "cuMemFreeAsync";
        return (void *)cuMemFreeAsync;
    }
    if (strcmp(symbol, "cuStreamDestroy") == 0 && version >= 4000) {
        *slot = N_cuStreamDestroy_v2, *ours = "cuStreamDestroy_v2";
        return (void *)cuStreamDestroy_v2;
    }
    if (strcmp(symbol, "cuStreamCreate") == 0) {
        *slot = N_cuStreamCreate, *ours = "cuStreamCreate";
        return (void *)cuStreamCreate;
    }
    if (strcmp(symbol, "cuStreamCreateWithPriority") == 0) {
        *slot = N_cuStreamCreateWithPriority, *ours = "cuStreamCreateWithPriority";
        return (void *)cuStreamCreateWithPriority;
    }
    if (strcmp(symbol, "cuGreenCtxStreamCreate") == 0) {
        *slot = N_cuGreenCtxStreamCreate, *ours = "cuGreenCtxStreamCreate";
        return (void *)cuGreenCtxStreamCreate;
    }
    if (strcmp(symbol, "cuCtxEnablePeerAccess") == 0) {
        *slot = N_cuCtxEnablePeerAccess, *ours = "cuCtxEnablePeerAccess";
        return (void *)cuCtxEnablePeerAccess;
    }
    if (strcmp(symbol, "cuMemGetInfo") == 0 && version >= 3020) {
        *slot = N_cuMemGetInfo_v2, *ours = "cuMemGetInfo_v2";
        return (void *)cuMemGetInfo_v2;
    }
    if (strcmp(symbol, "cuMemGetAddressRange") == 0 && version >= 3020) {
        *slot = N_cuMemGetAddressRange_v2, *ours = "cuMemGetAddressRange_v2";
        return (void *)cuMemGetAddressRange_v2;
    }
    if (strcmp(symbol, "cuDeviceSetMemPool") == 0) {
        *slot = N_cuDeviceSetMemPool, *ours = "cuDeviceSetMemPool";
        return (void *)cuDeviceSetMemPool;
    }
    if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0) {
        if (version >= 11000) {
            *slot = N_cuDevicePrimaryCtxReset_v2, *ours = "cuDevicePrimaryCtxReset_v2";
            return (void *)cuDevicePrimaryCtxReset_v2;
        }
        *slot = N_cuDevicePrimaryCtxReset, *ours = "cuDevicePrimaryCtxReset";
        return (void *)cuDevicePrimaryCtxReset;
    }
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        if (version >= 12000) {
            *slot = N_cuGetProcAddress_v2, *ours = "cuGetProcAddress_v2";
            return (void *)cuGetProcAddress_v2;
        }
        *slot = N_cuGetProcAddress, *ours = "cuGetProcAddress";
        return (void *)cuGetProcAddress;
    }
    return NULL;
}

/* After the real cuGetProcAddress answered `*pfn` successfully: substitute cualloc's function. */
static void proc_answer(const char *symbol, void **pfn, int version, unsigned long long flags) {
    if (!symbol || !pfn || !*pfn || disabled()) return;
    int slot;
    const char *ours;
    void *fn = proc_substitute(symbol, version, flags, &slot, &ours);
    if (!fn || *pfn == fn) return;
    set_next(slot, *pfn);
    *pfn = fn;
    if (log_on())
        cua_error("interpose: cuGetProcAddress(\"%s\", %d, flags %llu) -> cualloc %s", symbol, version, flags, ours);
}

cua_result cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                               int *symbol_status) {
    cuGetProcAddress_v2_fn real = NEXT(N_cuGetProcAddress_v2, cuGetProcAddress_v2_fn);
    if (!real) return CUA_ERROR_NOT_INITIALIZED;
    cua_result r = real(symbol, pfn, cuda_version, flags, symbol_status);
    if (r == CUA_SUCCESS) proc_answer(symbol, pfn, cuda_version, flags);
    return r;
}

cua_result cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags) {
    cuGetProcAddress_fn real = NEXT(N_cuGetProcAddress, cuGetProcAddress_fn);
    if (!real) return CUA_ERROR_NOT_INITIALIZED;
    cua_result r = real(symbol, pfn, cuda_version, flags);
    if (r == CUA_SUCCESS) proc_answer(symbol, pfn, cuda_version, flags);
    return r;
}

/* ------------------------------------------------------------------ dlsym */

#ifndef CUALLOC_NO_DLSYM_INTERPOSE
/* RTLD_NEXT on behalf of the object that contains `caller` (see the header comment). */
static void *dlsym_next_of(const void *caller, const char *symbol) {
    Dl_info info;
    struct link_map *self = NULL;
    if (!caller || !dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) || !self)
        return interpose_real_dlsym(RTLD_DEFAULT, symbol);
    return definition_in_loaded(self->l_next, symbol, NULL);
}

/* The names dlsym hands cualloc's function for (the real one becomes the next definition). */
static int dlsym_interposed(const char *symbol) {
    if (symbol[0] != 'c' || symbol[1] != 'u') return -1;
    for (int i = N_cuMemAlloc_v2; i < N_COUNT; i++)
        if (own_fn(i) && strcmp(symbol, nexts[i].symbol) == 0) return i;
    return -1;
}

/* dlsym for the names cualloc interposes: the real answer (RTLD_NEXT emulated for the caller),
 * then cualloc's function in its place. Always inlined into a function the caller's call (or
 * dlsym_entry.S's jump) entered, so that its return address is the caller's. */
static inline __attribute__((always_inline)) void *dlsym_interposing(void *handle, const char *symbol) {
    void *p;
    if (handle == RTLD_NEXT) p = dlsym_next_of(__builtin_extract_return_addr(__builtin_return_address(0)), symbol);
    else p = interpose_real_dlsym(handle, symbol);
    if (!p) return p;
    int i = dlsym_interposed(symbol);
    if (i < 0 || p == own_fn(i) || disabled()) return p;
    set_next(i, p);
    if (log_on()) cua_error("interpose: dlsym(\"%s\") -> cualloc %s", symbol, symbol);
    return own_fn(i);
}

#ifdef DLSYM_ENTRY_ASM
static __attribute__((noinline)) void *dlsym_own(void *handle, const char *symbol) {
    return dlsym_interposing(handle, symbol);
}

/* Where dlsym_entry.S jumps: glibc's dlsym for every name cualloc does not interpose, so that it
 * answers for the real caller; dlsym_own for the driver names it does. */
void *cualloc_dlsym_route(const char *symbol) {
    dlsym_fn real = resolve_real_dlsym();
    void *to;
    if (symbol && dlsym_interposed(symbol) < 0 && real) memcpy(&to, &real, sizeof to);
    else {
        void *(*own)(void *, const char *) = dlsym_own;
        memcpy(&to, &own, sizeof to);
    }
    return to;
}
#else
void *dlsym(void *restrict handle, const char *restrict symbol) { return dlsym_interposing(handle, symbol); }
#endif
#endif /* CUALLOC_NO_DLSYM_INTERPOSE */
