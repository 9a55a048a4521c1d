/* runtime_user.c — a library linked to the CUDA runtime (here the stub, libstubcudart.so), loaded
 * RTLD_LOCAL by interpose_local_runtime.c, as a Python extension module brings in libcudart: the
 * runtime is then in no global scope, and cualloc's wrappers (which the library's calls reach
 * first under LD_PRELOAD) must still find it as their next definition. */
#include <stddef.h>

#define USER_API __attribute__((visibility("default")))
int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
int cudaStreamCreate(void **stream);
int cudaStreamDestroy(void *stream);
int cudaFree(void *p);
USER_API int user_mem_get_info(size_t *free_bytes, size_t *total_bytes);
USER_API int user_stream_round_trip(void);
USER_API int user_free(void *p);

int user_mem_get_info(size_t *free_bytes, size_t *total_bytes) { return cudaMemGetInfo(free_bytes, total_bytes); }

int user_stream_round_trip(void)
{
    void *s = NULL;
    int r = cudaStreamCreate(&s);
    return r ? r : cudaStreamDestroy(s);
}

int user_free(void *p) { return cudaFree(p); }
