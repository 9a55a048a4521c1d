/* ballast.h — device memory taken past cualloc, as bench/gpu/torch_train.py's capacity probes take
 * their ballast: cuMemCreate from the CUDA driver itself, which cualloc neither interposes nor
 * counts (its dlsym interposer answers cuMemAlloc, not cuMemCreate). In the tests the driver is
 * the fake libcuda.so.1 (tests/fakecuda, on LD_LIBRARY_PATH), whose sim device the heap shares.
 * C and C++; header-only, one function. */
#ifndef CUALLOC_TESTS_BALLAST_H
#define CUALLOC_TESTS_BALLAST_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

/* CUmemAllocationProp, as the CUDA driver API lays it out. */
typedef struct {
    int type;                   /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requested_handle_types; /* none */
    struct { int type, id; } location; /* CU_MEM_LOCATION_TYPE_DEVICE = 1, ordinal */
    void *win32_handle_meta_data;
    struct { unsigned char compression, rdma; unsigned short usage; unsigned char reserved[4]; } flags;
} ballast_prop_t;

/* Takes `bytes` (a multiple of the device's granularity) of device 0's physical memory with
 * cuMemCreate and keeps it until the process ends; *handle (may be NULL) receives the handle.
 * Returns 0, or -1 with the reason on stderr. */
static inline int ballast_take(size_t bytes, unsigned long long *handle) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        fprintf(stderr, "ballast: dlopen(libcuda.so.1): %s\n", dlerror());
        return -1;
    }
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*cu_create)(unsigned long long *, size_t, const ballast_prop_t *, unsigned long long) =
        (int (*)(unsigned long long *, size_t, const ballast_prop_t *, unsigned long long))dlsym(cuda, "cuMemCreate");
    if (!cu_init || !cu_create) {
        fprintf(stderr, "ballast: libcuda.so.1 lacks cuInit or cuMemCreate\n");
        return -1;
    }
    ballast_prop_t prop = {1, 0, {1, 0}, NULL, {0, 0, 0, {0, 0, 0, 0}}};
    unsigned long long h = 0;
    int rc = cu_init(0);
    if (rc == 0) rc = cu_create(&h, bytes, &prop, 0);
    if (rc != 0) {
        fprintf(stderr, "ballast: cuInit / cuMemCreate(%zu bytes) failed with CUDA error %d\n", bytes, rc);
        return -1;
    }
    if (handle) *handle = h;
    return 0;
}

/* Gives a ballast back (cuMemRelease). Returns 0, or -1. */
static inline int ballast_release(unsigned long long handle) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*cu_release)(unsigned long long) = cuda ? (int (*)(unsigned long long))dlsym(cuda, "cuMemRelease") : NULL;
    return cu_release && cu_release(handle) == 0 ? 0 : -1;
}

#endif
