/* interpose_local_runtime.c — run with libcualloc.so in LD_PRELOAD (suite 'interpose'): loads
 * librt_user.so (tests/runtime_user.c) RTLD_LOCAL, whose CUDA runtime is then visible to no global
 * look-up. cualloc's wrappers found their next definitions with dlsym(RTLD_NEXT) only, which sees
 * the global scope: cudaMemGetInfo and cudaStreamCreate answered "initialization error" (3) and
 * the free of a pointer the runtime made answered 1, leaking it. usage: interpose_local_runtime LIB */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "softcheck.h"


static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    CHECK_MSG(p, "%s not found", name);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: interpose_local_runtime LIB\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(h, "dlopen %s: %s", argv[1], dlerror());
    if (!h) return 1;
    int (*mem_get_info)(size_t *, size_t *);
    int (*stream_round_trip)(void);
    int (*user_free)(void *);
    void *(*runtime_malloc)(size_t); /* the stub runtime's own memory: a pointer cualloc does not own */
    unsigned long (*calls)(const char *);
    void *p;
    p = sym(h, "user_mem_get_info"), memcpy(&mem_get_info, &p, sizeof p);
    p = sym(h, "user_stream_round_trip"), memcpy(&stream_round_trip, &p, sizeof p);
    p = sym(h, "user_free"), memcpy(&user_free, &p, sizeof p);
    p = sym(h, "stub_cudart_malloc_direct"), memcpy(&runtime_malloc, &p, sizeof p);
    p = sym(h, "stub_cudart_calls"), memcpy(&calls, &p, sizeof p);
    if (failures) return 1;

    size_t free_bytes = 0, total = 0;
    int r = mem_get_info(&free_bytes, &total);
    CHECK_MSG(r == 0 && total > 0, "cudaMemGetInfo: %d (free %zu, total %zu)", r, free_bytes, total);
    r = stream_round_trip();
    CHECK_MSG(r == 0, "cudaStreamCreate + cudaStreamDestroy: %d", r);
    unsigned long frees = calls("cudaFree");
    void *foreign = runtime_malloc(4096);
    r = user_free(foreign);
    CHECK_MSG(r == 0 && calls("cudaFree") == frees + 1, "cudaFree of the runtime's pointer: %d, %lu calls reached it", r,
          calls("cudaFree") - frees);
    if (failures) return 1;
    printf("interpose_local_runtime: all checks passed\n");
    return 0;
}
