/* cross_stream.c — memory moving between two streams while one of them keeps freeing, on the sim
 * device: what the stream rule (a block freed on S goes to another stream only after an event on S
 * has completed) costs in reserved memory and synchronizations.
 *
 * The job: a main stream T and a side stream S (both "held": their work completes only at the end
 * of each step, as when a training loop waits for its loss). Every step T allocates ACTS tensors
 * (its forward pass) and frees them in reverse order (backward); beside each of T's allocations S
 * allocates a temporary and frees the one it allocated two operations earlier, so S frees all the
 * time. For the first half of the run S's temporaries are large and T's tensors small; in the
 * second half the roles swap, so T now needs the memory S freed. A heap that can move S's memory to
 * T only once no free came after S's event has to grow, or under the device's limit synchronize.
 *
 *   cross_stream [--steps N] [--seed S] [--device-mb M]
 *
 * Prints the reserved peak, the live peak, the synchronizations, the events recorded and the
 * chunks mapped, over the whole run and over its second half.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "text.h"

#define ACTS 24
#define MIB ((size_t)1 << 20)

static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* A size between lo and hi MiB, in 512 B units (as tensors come). */
static size_t size_mib(size_t lo, size_t hi) { return lo * MIB + (rnd() % ((hi - lo) * 2048)) * 512; }

static heap_t *heap;

static void *must_alloc(size_t size, cua_stream s) {
    void *p = NULL;
    if (heap_alloc(heap, size, s, &p) != CUA_SUCCESS) {
        fprintf(stderr, "cross_stream: allocation of %zu B failed\n", size);
        exit(1);
    }
    return p;
}

static void must_free(void *p, cua_stream s) {
    if (!heap_free(heap, p, s)) {
        fprintf(stderr, "cross_stream: free of %p refused\n", p);
        exit(1);
    }
}

#define CROSS_STREAM_USAGE "usage: cross_stream [--steps N] [--seed S] [--device-mb M]\n"

int main(int argc, char **argv) {
    int steps = 200;
    uint64_t seed = 20261123;
    unsigned device_mb = 8192;
    for (int i = 1; i < argc; i++) {
        unsigned long long v = 0;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf(CROSS_STREAM_USAGE);
            return 0;
        }
        bool known = !strcmp(a, "--steps") || !strcmp(a, "--seed") || !strcmp(a, "--device-mb");
        if (!known || i + 1 >= argc || !txt_parse_count(argv[i + 1], 0, !strcmp(a, "--seed") ? UINT64_MAX : 1u << 30, &v)) {
            if (known && i + 1 >= argc) fprintf(stderr, "cross_stream: %s needs a value\n", a);
            else if (known) fprintf(stderr, "cross_stream: bad %s '%s' (a whole number)\n", a, argv[i + 1]);
            else fprintf(stderr, "cross_stream: unknown argument '%s'\n", a);
            fprintf(stderr, CROSS_STREAM_USAGE);
            return 2;
        }
        i++;
        if (!strcmp(a, "--steps")) steps = (int)v;
        else if (!strcmp(a, "--seed")) seed = v;
        else device_mb = (unsigned)v;
    }
    if (steps < 2 || device_mb < 1024) {
        fprintf(stderr, "cross_stream: --steps must be at least 2 and --device-mb at least 1024\n");
        return 2;
    }
    rng_state = (seed + 1) * 0x9E3779B97F4A7C15ull | 1; /* any seed, 0 included, gives a non-zero state */
    conf_t conf;
    conf_defaults(&conf);
    conf.driver = DRIVER_SIM;
    char text[64];
    snprintf(text, sizeof text, "sim_memory_mb:%u", device_mb);
    if (conf_parse(text, &conf) != 0) return 1;
    sim_configure(&conf);
    if (driver_sim_ops.init() != CUA_SUCCESS) return 1;
    heap = heap_create(0, &conf, &driver_sim_ops, NULL);
    if (!heap) return 1;
    cua_stream t = sim_stream_create(0, true), s = sim_stream_create(0, true);

    cualloc_stats half;
    memset(&half, 0, sizeof half);
    uint64_t records_half = 0;
    for (int step = 0; step < steps; step++) {
        bool side_heavy = step < steps / 2;
        if (step == steps / 2) {
            heap_get_stats(heap, &half);
            records_half = sim_calls(SIM_OP_EVENT_RECORD);
        }
        void *acts[ACTS], *temps[ACTS];
        for (int i = 0; i < ACTS; i++) {
            acts[i] = must_alloc(side_heavy ? size_mib(1, 8) : size_mib(16, 96), t);
            temps[i] = must_alloc(side_heavy ? size_mib(16, 96) : size_mib(1, 8), s);
            if (i >= 2) must_free(temps[i - 2], s);
        }
        must_free(temps[ACTS - 2], s);
        must_free(temps[ACTS - 1], s);
        for (int i = ACTS - 1; i >= 0; i--) must_free(acts[i], t);
        sim_stream_complete(t);
        sim_stream_complete(s);
        if (heap_check(heap, stderr) != 0) {
            fprintf(stderr, "cross_stream: heap_check failed at step %d\n", step);
            return 1;
        }
    }
    cualloc_stats st;
    heap_get_stats(heap, &st);
    printf("steps %d, device %u MiB, seed %" PRIu64 "\n", steps, device_mb, seed);
    printf("whole run:   reserved peak %zu MiB, live peak %zu MiB, syncs %" PRIu64 ", events recorded %" PRIu64
           ", chunks mapped %" PRIu64 "\n",
           st.reserved_peak / MIB, st.allocated_peak / MIB, st.num_syncs, sim_calls(SIM_OP_EVENT_RECORD), st.num_maps);
    printf("second half: reserved grew %zu MiB, syncs %" PRIu64 ", events recorded %" PRIu64 ", chunks mapped %" PRIu64
           "\n",
           (st.reserved_peak - half.reserved_peak) / MIB, st.num_syncs - half.num_syncs,
           sim_calls(SIM_OP_EVENT_RECORD) - records_half, st.num_maps - half.num_maps);
    heap_destroy(heap);
    sim_stream_destroy(t);
    sim_stream_destroy(s);
    return 0;
}
