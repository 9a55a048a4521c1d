/* cudafree_loop [SIZE [PAIRS]]: cudaMalloc + cudaFree of one size (default 1 MiB), PAIRS times
 * (default 10000) after 100 warm-up pairs, in a program with no stream of its own: the host cost
 * of a cudaFree'd block's reuse by the next cudaMalloc under LD_PRELOAD. Run under callgrind with
 * --toggle-collect=timed_loop (bench/RESULTS.md, "cudaFree's blocks and the blocking streams"). */
#include <stdio.h>
#include <stdlib.h>

int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);

static __attribute__((noinline)) void timed_loop(long pairs, size_t size) {
    for (long i = 0; i < pairs; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, size) != 0 || cudaFree(p) != 0) {
            fprintf(stderr, "cudafree_loop: cudaMalloc/cudaFree of %zu bytes failed at pair %ld\n", size, i);
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    char *end = NULL;
    size_t size = argc > 1 ? strtoull(argv[1], &end, 0) : (size_t)1 << 20;
    if (argc > 1 && (*end || size == 0)) {
        fprintf(stderr, "usage: cudafree_loop [SIZE [PAIRS]]: SIZE '%s' is not a positive number of bytes\n", argv[1]);
        return 2;
    }
    long pairs = argc > 2 ? strtol(argv[2], &end, 10) : 10000;
    if (argc > 2 && (*end || pairs <= 0)) {
        fprintf(stderr, "usage: cudafree_loop [SIZE [PAIRS]]: PAIRS '%s' is not a positive count\n", argv[2]);
        return 2;
    }
    timed_loop(100, size);
    timed_loop(pairs, size);
    printf("cudafree_loop: %ld pairs of %zu bytes\n", pairs + 100, size);
    return 0;
}
