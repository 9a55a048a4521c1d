/* meminfo_runtime.c — libmeminfo_rt.so, the one thing of the CUDA runtime that
 * interpose_driver_prog needs: a cudaMemGetInfo that, as libcudart's, asks the driver's
 * cuMemGetInfo fetched through cuGetProcAddress (CUDA 13.0's libcudart looks up "cuMemGetInfo" at
 * 3020 while it starts). With libcualloc.so preloaded, both its cudaMemGetInfo and the
 * cuMemGetInfo handed out here are cualloc's. */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*meminfo_fn)(size_t *, size_t *);

__attribute__((visibility("default"))) int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return 3; /* cudaErrorInitializationError */
    void *p = dlsym(lib, "cuGetProcAddress_v2");
    gpa_fn gpa;
    memcpy(&gpa, &p, sizeof p);
    void *q = NULL;
    meminfo_fn meminfo;
    int r = gpa ? gpa("cuMemGetInfo", &q, 3020, 0, NULL) : 3;
    memcpy(&meminfo, &q, sizeof q);
    if (r == 0 && meminfo) r = meminfo(free_bytes, total_bytes);
    dlclose(lib);
    return r == 0 ? 0 : 1;
}
