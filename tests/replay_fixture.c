/* replay_fixture.c — writes a small deterministic trace whose allocation pattern fragments, for
 * `allocview replay`'s tests (tests/check_replay.sh). Run it on the sim device (the addresses come
 * from sim_va_base and the clock from an event counter, so every run writes the same records)
 * under any configuration: replay under that configuration must reproduce the recorded peaks.
 *
 *   replay_fixture TRACE
 *
 * The pattern: rounds of medium blocks of varying sizes on two streams, most freed soon, one in
 * four kept for a few rounds, so holes of odd sizes appear between long-lived blocks (PyTorch's
 * classic segments keep them reserved; cualloc's chunks release them); a trim midway.
 */
#include <stdint.h>
#include <stdio.h>

#include "cualloc.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define KEEP 24

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: replay_fixture TRACE\n");
        return 1;
    }
    void *s1 = (void *)(uintptr_t)0x51;
    void *kept[KEEP] = {0};
    unsigned seed = 12345;
    if (cualloc_trace_start(argv[1]) != 0)
        return 2;
    for (int round = 0; round < 60; round++) {
        void *tmp[8];
        for (int i = 0; i < 8; i++) {
            seed = seed * 1103515245u + 12345u;
            size_t size = (seed >> 8) % (24 * MIB) + 700 * KIB; /* 0.7 .. 24.7 MiB, odd sizes */
            void *stream = (i & 1) ? s1 : NULL;
            tmp[i] = cualloc_malloc(size, 0, stream);
            if (!tmp[i])
                return 3;
        }
        for (int i = 0; i < 8; i++) {
            if (i % 4 == 1) { /* keep it: it pins the segment it is in */
                int slot = (round * 2 + i / 4) % KEEP;
                if (kept[slot])
                    cualloc_free(kept[slot], NULL);
                kept[slot] = tmp[i];
            } else {
                cualloc_free(tmp[i], (i & 1) ? s1 : NULL);
            }
        }
        void *small = cualloc_malloc(1000 + (size_t)round * 37, 0, NULL); /* the SMALL pool too */
        cualloc_free(small, NULL);
        if (round == 30) {
            cualloc_mark("trim");
            cualloc_trim(0);
        }
    }
    for (int i = 0; i < KEEP; i++)
        if (kept[i])
            cualloc_free(kept[i], NULL);
    cualloc_trace_stop();
    return 0;
}
