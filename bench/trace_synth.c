/* trace_synth.c — writes a synthetic, training-like trace for the analyzer benchmark
 * (bench/allocview_speed.sh), encoding records directly (tests/trace_writer.h) — the recorder would
 * need 50 M real allocations. The workload: 30 layers x 10 call sites (300 leaf stacks: Python
 * train.py/model.py frames over libtorch_cuda.so frames over libcualloc.so), parameters kept for
 * the whole run, per step the forward pass's activations (kept until backward), temporaries freed
 * at once, gradients during backward, a "step N" mark per step and a few maps. Addresses are
 * reused (LIFO slots), times advance 0.5-4 us per event.
 *
 *   trace_synth TRACE [EVENTS]     EVENTS alloc+free records, 1 to 10^10 (default 50000000)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text.h"
#include "trace_writer.h"

#define LAYERS 30
#define OPS 10
#define SLOTS 65536
#define MIB (1ull << 20)

static tw_t w;
static uint64_t now = 1000000000ull, rng = 0x9E3779B97F4A7C15ull;
static uint32_t free_slots[SLOTS], nfree;
static uint64_t events;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static uint64_t tick(void) { return now += 500 + rnd() % 3500; }

typedef struct blk { uint64_t addr, size; uint32_t slot; } blk_t;

static blk_t alloc(uint64_t size, uint32_t stack)
{
    if (!nfree) {
        fprintf(stderr, "trace_synth: out of address slots\n");
        exit(1);
    }
    uint32_t slot = free_slots[--nfree];
    blk_t b = {0x7e0000000000ull + (uint64_t)slot * (64 * MIB), (size + 511) & ~511ull, slot};
    tw_alloc(&w, tick(), 0, b.addr, b.size, size, stack);
    events++;
    return b;
}

static void release(blk_t b)
{
    tw_free(&w, tick(), 0, b.addr, b.size);
    free_slots[nfree++] = b.slot;
    events++;
}

int main(int argc, char **argv)
{
    /* TRACE is written over; a word that reads as an option ("--help") is refused rather than
     * made a file of 50 M events. EVENTS is all decimal digits: strtoull took "-1" as 2^64 - 1, a
     * trace that grew until the disk was full, and "5x" as 5. */
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: trace_synth TRACE [EVENTS]   (EVENTS alloc+free records, 1 to 10^10; default 50000000)\n");
        return 0;
    }
    if (argc < 2 || argc > 3 || argv[1][0] == '-' || !argv[1][0]) {
        if (argc > 3)
            fprintf(stderr, "trace_synth: one trace and one count at most (got '%s' after them)\n", argv[3]);
        else if (argc > 1)
            fprintf(stderr, "trace_synth: '%s' is not a trace file name\n", argv[1]);
        fprintf(stderr, "usage: trace_synth TRACE [EVENTS]\n");
        return 1;
    }
    unsigned long long target = 50000000ull;
    if (argc > 2 && !txt_parse_count(argv[2], 1, 10000000000ull, &target)) {
        fprintf(stderr, "trace_synth: bad EVENTS '%s' (a number of records from 1 to 10000000000)\n", argv[2]);
        return 1;
    }
    if (tw_open(&w, argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint32_t i = 0; i < SLOTS; i++)
        free_slots[i] = SLOTS - 1 - i;
    nfree = SLOTS;
    tw_device(&w, 0, 80ull << 30, "synthetic 80 GiB");
    const uint64_t cb = 0x7f0000000000ull, tb = 0x7f1000000000ull;
    tw_module(&w, cb, cb, cb + 0x200000, "/opt/cualloc/lib/libcualloc.so");
    tw_module(&w, tb, tb, tb + 0x10000000, "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so");
    uint32_t root = tw_stack(&w, 0, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 88, "main", "train.py"));
    uint32_t stepf = tw_stack(&w, root, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 61, "train_step", "train.py"));
    static const char *const ops[OPS] = {"linear", "attention", "softmax", "layernorm", "gelu",
                                         "dropout", "matmul", "add", "view_copy", "param_init"};
    uint32_t site[LAYERS][OPS];
    uint64_t size_of[LAYERS][OPS];
    for (int l = 0; l < LAYERS; l++) {
        char fn[64];
        snprintf(fn, sizeof fn, "layer%d.forward", l);
        uint32_t lay = tw_stack(&w, stepf, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 100 + l, fn, "model.py"));
        for (int o = 0; o < OPS; o++) {
            uint32_t op = tw_stack(&w, lay, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 200 + o, ops[o], "layers.py"));
            uint32_t n1 = tw_stack(&w, op, CUA_TRACE_FRAME_NATIVE, tb + 0x100000 + (uint64_t)o * 0x1000);
            uint32_t n2 = tw_stack(&w, n1, CUA_TRACE_FRAME_NATIVE, tb + 0x800000 + (uint64_t)o * 0x40);
            uint32_t n3 = tw_stack(&w, n2, CUA_TRACE_FRAME_NATIVE, cb + 0x1234);
            site[l][o] = tw_stack(&w, n3, CUA_TRACE_FRAME_NATIVE, cb + 0x5678);
            size_of[l][o] = (256 << 10) + rnd() % (16 * MIB);
        }
    }
    tw_map(&w, tick(), 0, 0x7d0000000000ull, 20ull << 30, false);
    blk_t params[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        params[l] = alloc(size_of[l][OPS - 1] * 4, site[l][OPS - 1]);
    static blk_t acts[LAYERS][6];
    uint64_t step = 0;
    while (events < target) {
        char label[32];
        snprintf(label, sizeof label, "step %" PRIu64, ++step);
        tw_mark(&w, tick(), label);
        for (int l = 0; l < LAYERS; l++) { /* forward: 6 kept, 4 temporaries */
            for (int k = 0; k < 6; k++)
                acts[l][k] = alloc(size_of[l][k] + rnd() % 4096, site[l][k]);
            for (int k = 6; k < 9; k++) {
                blk_t t = alloc(size_of[l][k] / 2 + rnd() % 65536, site[l][k]);
                if (k == 8) {
                    blk_t u = alloc(size_of[l][k] / 4, site[l][k]);
                    release(u);
                }
                release(t);
            }
        }
        for (int l = LAYERS; l-- > 0;) { /* backward: gradients, activations freed */
            blk_t g = alloc(size_of[l][OPS - 1], site[l][0]);
            blk_t g2 = alloc(size_of[l][1] / 2, site[l][1]);
            for (int k = 6; k-- > 0;)
                release(acts[l][k]);
            release(g2);
            release(g);
        }
        if (step % 1000 == 0) { /* the cache grows and is trimmed now and then */
            tw_map(&w, tick(), 0, 0x7d0000000000ull + (20ull << 30), 2ull << 30, false);
            tw_map(&w, tick(), 0, 0x7d0000000000ull + (20ull << 30), 2ull << 30, true);
        }
    }
    for (int l = 0; l < LAYERS; l++)
        release(params[l]);
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_synth: writing %s failed\n", argv[1]);
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "trace_synth: %s: %" PRIu64 " alloc/free events, %" PRIu64 " steps, %u stack nodes, %.1f s\n",
            argv[1], events, step, w.nstacks, s);
    return 0;
}
