/* driver_runtime.c — libdriver_rt.so, the few things of the CUDA runtime that interpose_driver_prog
 * needs, each done over the driver as libcudart does it: the driver's functions come from
 * cuGetProcAddress_v2 (dlsym of libcuda.so.1, so, with libcualloc.so preloaded, cualloc's wrapper and
 * what it hands out). Includes no cualloc header.
 *   cudaMemGetInfo   asks cuMemGetInfo, fetched at 3020 (CUDA 13.0's libcudart looks it up so while
 *                    it starts); with cualloc preloaded both are cualloc's.
 *   cudaFree(NULL)   initializes the runtime as a call that needs an active context does: cuInit,
 *                    then, when no context is current on the thread, device 0's primary context is
 *                    retained and made current. cudaFree(p) frees p with cuMemFree (3020).
 *   cudaMalloc, cudaMallocAsync, cudaFreeAsync  initialize so too, then cuMemAlloc (3020),
 *                    cuMemAllocAsync, cuMemFreeAsync (11020).
 *   cudaGetLastError the thread's last error (set by a failing call, taken by this one).
 *   cudaDeviceReset  resets the current device's primary context with cuDevicePrimaryCtxReset (looked
 *                    up at 7000, as libcudart does); the next call retains it again and makes it
 *                    current (the reset context stays current but is unusable until then).
 *   driver_rt_fail_init(e)  from now on the runtime cannot initialize: cudaFree(NULL) answers e
 *                    (e.g. cudaErrorInsufficientDriver, 35), as a runtime newer than the driver.
 *   driver_rt_inits()  how many cudaFree(NULL) calls reached the runtime. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#define RT_API __attribute__((visibility("default")))

RT_API int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
RT_API int cudaFree(void *p);
RT_API int cudaMalloc(void **p, size_t n);
RT_API int cudaMallocAsync(void **p, size_t n, void *stream);
RT_API int cudaFreeAsync(void *p, void *stream);
RT_API int cudaGetLastError(void);
RT_API int cudaDeviceReset(void);
RT_API void driver_rt_fail_init(int e);
RT_API unsigned long driver_rt_inits(void);

typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

static __thread int last_error;
static atomic_int fail_init;
static atomic_ulong inits;
static atomic_int was_reset; /* cudaDeviceReset ran: the next call makes the context anew */

static int failed(int e) {
    last_error = e;
    return e;
}

/* The driver's function `name` at `version`, through cuGetProcAddress_v2; NULL when none. */
static void *driver_fn(const char *name, int version) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return NULL;
    void *p = dlsym(lib, "cuGetProcAddress_v2");
    gpa_fn gpa;
    memcpy(&gpa, &p, sizeof p);
    void *q = NULL;
    if (!gpa || gpa(name, &q, version, 0, NULL) != 0) q = NULL;
    dlclose(lib);
    return q;
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    int (*meminfo)(size_t *, size_t *);
    void *q = driver_fn("cuMemGetInfo", 3020);
    memcpy(&meminfo, &q, sizeof q);
    if (!meminfo) return failed(3); /* cudaErrorInitializationError */
    return meminfo(free_bytes, total_bytes) == 0 ? 0 : failed(1);
}

/* What a runtime call that needs an active context does first (see the header). */
static int rt_init(void) {
    int e = atomic_load(&fail_init);
    if (e) return failed(e);
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*get_current)(void **);
    int (*set_current)(void *);
    void *q = driver_fn("cuInit", 2000);
    memcpy(&init, &q, sizeof q);
    q = driver_fn("cuDevicePrimaryCtxRetain", 7000);
    memcpy(&retain, &q, sizeof q);
    q = driver_fn("cuCtxGetCurrent", 4000);
    memcpy(&get_current, &q, sizeof q);
    q = driver_fn("cuCtxSetCurrent", 4000);
    memcpy(&set_current, &q, sizeof q);
    if (!init || !retain || !get_current || !set_current || init(0) != 0) return failed(3);
    void *cur = NULL, *ctx = NULL;
    if (get_current(&cur) != 0) return failed(3);
    if (cur && !atomic_exchange(&was_reset, 0)) return 0;
    return retain(&ctx, 0) == 0 && set_current(ctx) == 0 ? 0 : failed(3);
}

int cudaDeviceReset(void) {
    int e = rt_init();
    if (e) return e;
    int (*reset)(int);
    void *q = driver_fn("cuDevicePrimaryCtxReset", 7000);
    memcpy(&reset, &q, sizeof q);
    if (!reset || reset(0) != 0) return failed(1);
    atomic_store(&was_reset, 1);
    return 0;
}

int cudaFree(void *p) {
    if (!p) {
        atomic_fetch_add(&inits, 1);
        return rt_init();
    }
    int e = rt_init();
    if (e) return e;
    int (*mem_free)(unsigned long long);
    void *q = driver_fn("cuMemFree", 3020);
    memcpy(&mem_free, &q, sizeof q);
    return mem_free && mem_free((unsigned long long)(size_t)p) == 0 ? 0 : failed(1);
}

int cudaMalloc(void **p, size_t n) {
    int e = rt_init();
    if (e) return e;
    int (*mem_alloc)(unsigned long long *, size_t);
    void *q = driver_fn("cuMemAlloc", 3020);
    memcpy(&mem_alloc, &q, sizeof q);
    unsigned long long d = 0;
    if (!p || !mem_alloc || mem_alloc(&d, n) != 0) return failed(2);
    *p = (void *)(size_t)d;
    return 0;
}

int cudaMallocAsync(void **p, size_t n, void *stream) {
    int e = rt_init();
    if (e) return e;
    int (*alloc_async)(unsigned long long *, size_t, void *);
    void *q = driver_fn("cuMemAllocAsync", 11020);
    memcpy(&alloc_async, &q, sizeof q);
    unsigned long long d = 0;
    if (!p || !alloc_async || alloc_async(&d, n, stream) != 0) return failed(2);
    *p = (void *)(size_t)d;
    return 0;
}

int cudaFreeAsync(void *p, void *stream) {
    int e = rt_init();
    if (e) return e;
    int (*free_async)(unsigned long long, void *);
    void *q = driver_fn("cuMemFreeAsync", 11020);
    memcpy(&free_async, &q, sizeof q);
    return free_async && free_async((unsigned long long)(size_t)p, stream) == 0 ? 0 : failed(1);
}

int cudaGetLastError(void) {
    int e = last_error;
    last_error = 0;
    return e;
}

void driver_rt_fail_init(int e) { atomic_store(&fail_init, e); }
unsigned long driver_rt_inits(void) { return atomic_load(&inits); }
