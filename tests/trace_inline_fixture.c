/* trace_inline_fixture.c — allocations whose call sites lie in inlined code, for allocview's
 * naming of inlined frames (tests/check_allocview_reports.sh). Built -O2 -g: model_forward and
 * attention are inlined into main, so one return address stands for four source-level frames
 * (tensor_empty <- attention <- model_forward <- main), which allocview recovers from the debug
 * information; and one (layer_norm <- main) whose return address lies in an allocation helper
 * inlined into layer_norm, of which only the helper folds away.
 *
 *   trace_inline_fixture TRACE
 */
#include <stdio.h>

#include "cualloc.h"

#define MIB ((size_t)1 << 20)

static __attribute__((noinline, noclone)) void *tensor_empty(size_t bytes)
{
    void *p = cualloc_malloc(bytes, 0, NULL);
    __asm__ volatile("" ::: "memory");
    return p;
}

static inline __attribute__((always_inline)) void *attention(size_t tokens)
{
    return tensor_empty(tokens * MIB); /* the scores */
}

static inline __attribute__((always_inline)) void *model_forward(size_t tokens)
{
    return attention(tokens * 2);
}

/* An allocation helper inlined into its caller, named as the CUDA runtime's C++ template wrapper
 * cudaMalloc<T> (cuda_runtime.h) is: the helper's frame folds away with the allocator's, but the
 * function it was inlined into is the user's and stays: layer_norm <- main. */
static inline __attribute__((always_inline)) void *cudaMallocTyped(size_t bytes)
{
    return cualloc_malloc(bytes, 0, NULL);
}

static __attribute__((noinline, noclone)) void *layer_norm(size_t bytes)
{
    void *p = cudaMallocTyped(bytes * 2); /* a body of its own: not merged with tensor_empty */
    __asm__ volatile("" ::: "memory");
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: trace_inline_fixture TRACE\n");
        return 1;
    }
    if (cualloc_trace_start(argv[1]) != 0)
        return 2;
    void *scores = model_forward(4);
    void *norm = layer_norm(MIB);
    cualloc_trace_stop();
    return scores && norm ? 0 : 3;
}
