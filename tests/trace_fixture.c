/* trace_fixture.c — writes a small, deterministic trace through the public API, for allocview's
 * expected-output tests (tests/check_allocview.sh, tests/expected/). Run it on the sim device with
 * trace_stack_depth:0 (no addresses of code in the output): the sim's addresses come from
 * sim_va_base and its clock from an event counter, so every run writes the same records.
 *
 *   trace_fixture TRACE     blocks allocated before tracing starts (the initial state), two
 *                           devices, two streams, marks, a trim, an OOM, then stop.
 */
#include <stdint.h>
#include <stdio.h>

#include "cualloc.h"

#define MIB ((size_t)1 << 20)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: trace_fixture TRACE\n");
        return 1;
    }
    void *s1 = (void *)(uintptr_t)0x51; /* a stream handle: the sim treats unknown ones as idle */
    /* Live before the trace starts: they appear as init_block / init_map records. */
    void *early_small = cualloc_malloc(1000, 0, NULL);
    void *early_large = cualloc_malloc(3 * MIB, 0, NULL);
    if (cualloc_trace_start(argv[1]) != 0)
        return 2;
    cualloc_mark("step 1");
    void *a = cualloc_malloc(100, 0, NULL);        /* rounded to 512 */
    void *b = cualloc_malloc(4096, 0, s1);         /* another stream */
    void *c = cualloc_malloc(MIB + 1, 0, NULL);    /* large pool */
    void *d = cualloc_malloc(512, 1, NULL);        /* device 1: its heap is created now */
    cualloc_free(a, NULL);
    cualloc_free(b, s1);
    cualloc_free(early_small, NULL);
    cualloc_mark("step 2");
    cualloc_free(c, NULL);
    cualloc_free(early_large, NULL);
    cualloc_trim(0);                                /* unmaps what is cached */
    void *huge = cualloc_malloc(1000 * MIB, 0, NULL); /* more than the device: an OOM */
    if (huge)
        return 3;
    cualloc_free(d, NULL);
    cualloc_mark("done");
    cualloc_trace_stop();
    return 0;
}
