// cuda_prog.cu — a real CUDA runtime program (suite 'interpose'), built by nvcc with
// -cudart static and with -cudart shared, run against the fake libcuda.so.1 with libcualloc.so in
// LD_PRELOAD and CUALLOC_LOG_INTERPOSE=1 (tests/run_cuda_prog.sh checks the log). Includes no
// cualloc header. Prints what cudaMalloc/cudaFree returned and how many allocations cualloc served
// (found with dlsym, as any program could); without a GPU the static runtime may stop early (the
// fake driver is older than the runtime), after fetching its driver table.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct stats_mirror {
    size_t gauges[10];
    size_t largest_free_block, capacity_bytes;
    uint64_t num_allocs, rest[7];
};
typedef int (*get_stats_fn)(int, stats_mirror *);

int main() {
    void *p = nullptr;
    cudaError_t r = cudaMalloc(&p, 1 << 20);
    printf("cuda_prog: cudaMalloc = %d (%s)\n", (int)r, cudaGetErrorName(r));
    cudaError_t f = cudaFree(p);
    printf("cuda_prog: cudaFree = %d (%s)\n", (int)f, cudaGetErrorName(f));
    void *gs = dlsym(RTLD_DEFAULT, "cualloc_get_stats");
    get_stats_fn get_stats;
    memcpy(&get_stats, &gs, sizeof gs);
    stats_mirror s;
    memset(&s, 0, sizeof s);
    if (get_stats && get_stats(0, &s) == 0)
        printf("cuda_prog: cualloc num_allocs = %llu\n", (unsigned long long)s.num_allocs);
    return r == cudaSuccess && f == cudaSuccess ? 0 : 1;
}
