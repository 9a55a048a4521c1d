/* trace_scenarios.c — training-shaped allocation patterns recorded through libcualloc.so on the
 * sim device, for allocview's report tests (tests/check_allocview_reports.sh, expected/report_*.txt).
 * Every allocation goes through one helper, tensor_empty(), as a framework's would, so the reports
 * must show the callers that tell the call sites apart. "step N" marks follow cualloc_torch's
 * convention (after step N's optimizer step). The sim's addresses and clock are deterministic.
 *
 *   trace_scenarios SCENARIO TRACE     (the scenarios after devicefull are described in main())
 *     leak       each step keeps a 2 MiB "loss" tensor alive (accumulating losses)
 *     shortage   step 2's activations do not fit (sim_memory_mb:128): OOM, the process dies
 *     frag       classic segments: live blocks pin split segments; a 56 MiB request fails: OOM
 *     step2      Adam-like state allocated at the first optimizer step raises every later peak
 *     longest    one batch of 8 is three times as long as the others
 *     varlen     12 steps whose activations follow sequence lengths drawn from 128..1024
 *     phase      an evaluation phase peaks above training
 *     optstep    one step whose peak lies in the optimizer's (annotated) step, as its state is made
 *     twodev     one process, two devices (sim_devices:2): the model's first half fills device 0's
 *                peak, and a buffer on device 1 does not fit there: OOM on device 1
 *     devicefull the process takes 48 MiB of 128 past cualloc (cuMemCreate: tests/ballast.h) before
 *                the first step: OOM within the capacity, on a full device. Needs driver:cuda (the
 *                tests run it on the fake libcuda.so.1).
 *     addrspace  blocks that come and go fragment the expandable pool's address space (va_factor:2)
 *     chunks     8 MiB chunks on a 20 MiB device: 10 MiB live holds two, and 9 MiB more needs a third
 *                (it would fit in the device's 2 MiB chunks): OOM at chunk granularity
 *     refused    the device refuses every chunk after the first (sim_fail), with memory free: the
 *                second tensor's OOM is the device's refusal, not the heap's
 *     manysteps  4100 steps: the longest batch is the last, an evaluation before it peaks below it
 *     cache      a cache filled after step 1's backward and in steps 2 and 3, then kept: no state
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "addrspace_sequence.h"
#include "ballast.h"
#include "cualloc.h"

#define MIB ((size_t)1 << 20)
#define NOINLINE __attribute__((noinline))

static void *keep[4096];
static int nkeep;
static int cur_dev; /* torch.cuda.set_device */

/* The framework's allocation helper: every call site passes through it. */
static NOINLINE void *tensor_empty(size_t bytes)
{
    void *p = cualloc_malloc(bytes, cur_dev, NULL);
    __asm__ volatile("" ::: "memory");
    return p;
}

static NOINLINE void tensor_free(void *p) { cualloc_free(p, NULL); } /* finds the device */

static NOINLINE void init_params(size_t bytes)
{
    for (int i = 0; i < 4; i++)
        keep[nkeep++] = tensor_empty(bytes / 4);
}

/* Forward: activations kept for backward; backward frees them. Returns 0 on OOM. */
static NOINLINE int forward_layer(void **acts, int i, size_t bytes)
{
    acts[i] = tensor_empty(bytes);
    return acts[i] != NULL;
}

static NOINLINE void backward(void **acts, int n)
{
    for (int i = n - 1; i >= 0; i--)
        tensor_free(acts[i]);
}

static NOINLINE void adam_init_state(size_t param_bytes)
{
    keep[nkeep++] = tensor_empty(param_bytes); /* exp_avg */
    keep[nkeep++] = tensor_empty(param_bytes); /* exp_avg_sq */
}

static NOINLINE void record_loss(void)
{
    keep[nkeep++] = tensor_empty(2 * MIB); /* losses.append(loss): the graph stays alive */
}

static NOINLINE int train_step(size_t act_bytes, int layers)
{
    void *acts[64];
    for (int i = 0; i < layers; i++)
        if (!forward_layer(acts, i, act_bytes))
            return 0;
    backward(acts, layers);
    return 1;
}

static NOINLINE int eval_pass(size_t act_bytes, int layers)
{
    void *acts[64];
    for (int i = 0; i < layers; i++)
        if (!forward_layer(acts, i, act_bytes))
            return 0;
    backward(acts, layers);
    return 1;
}

static void mark_step(int n)
{
    char label[32];
    snprintf(label, sizeof label, "step %d", n);
    cualloc_mark(label);
}

static NOINLINE void fragment(void)
{
    /* 12 blocks of 6 MiB: three to a 20 MiB segment; then every segment keeps its middle one. */
    void *b[12];
    for (int i = 0; i < 12; i++)
        b[i] = tensor_empty(6 * MIB);
    for (int i = 0; i < 12; i++)
        if (i % 3 != 1)
            tensor_free(b[i]);
}

static NOINLINE void *big_buffer(size_t bytes) { return tensor_empty(bytes); }

static NOINLINE void cache_put(size_t bytes) { keep[nkeep++] = tensor_empty(bytes); /* kept for good */ }

/* Eight 6 MiB activations, every other one kept: the first two fill the parameters' segment, the
 * other six are carved out of whatever cached block fits them best. */
static NOINLINE void carve(void)
{
    void *b[8];
    for (int i = 0; i < 8; i++)
        b[i] = tensor_empty(6 * MIB);
    for (int i = 1; i < 8; i += 2)
        tensor_free(b[i]);
}

/* The same on a side stream (torch.cuda.stream(side)). */
static NOINLINE void *tensor_empty_on(size_t bytes, void *stream)
{
    void *p = cualloc_malloc(bytes, cur_dev, stream);
    __asm__ volatile("" ::: "memory");
    return p;
}

/* Every scenario with the configuration it is recorded under (CUALLOC_CONF, after driver:sim, or
 * in place of it for devicefull). `trace_scenarios --list` prints this table, one
 * "NAME<TAB>CONF" line each, so that the scripts that record the scenarios
 * (tests/check_allocview_reports.sh, bench/fragmentation.sh) record all of them, each as the other
 * does. The capacities are what each scenario's story needs: shortage and frag must fail at 128 MiB,
 * latepeak's oversized buffer must exceed 256 MiB. */
static const struct {
    const char *name, *conf;
} scenarios[] = {
    {"leak", "sim_memory_mb:256"},
    {"shortage", "sim_memory_mb:128"},
    {"frag", "sim_memory_mb:128,expandable_segments:0"},
    {"step2", "sim_memory_mb:256"},
    {"longest", "sim_memory_mb:512"},
    {"varlen", "sim_memory_mb:512"},
    {"phase", "sim_memory_mb:512"},
    {"optstep", "sim_memory_mb:512"},
    {"twodev", "sim_memory_mb:256,sim_devices:2"},
    {"latepeak", "sim_memory_mb:256"},
    {"twoleaks", "sim_memory_mb:256"},
    {"evalstep", "sim_memory_mb:512"},
    {"startmarks", "sim_memory_mb:512"},
    {"devicefull", "driver:cuda,sim_memory_mb:128"},
    {"addrspace", "sim_memory_mb:64,va_factor:2"},
    {"chunks", "sim_memory_mb:20,chunk_size_mb:8"},
    {"refused", "sim_memory_mb:64,sim_fail:phys_create@1*1000"},
    {"split", "sim_memory_mb:128,expandable_segments:0"},
    {"waiting", "driver:cuda,sim_memory_mb:256"},
    {"manysteps", "sim_memory_mb:512"},
    {"cache", "sim_memory_mb:256"},
};
enum { NUM_SCENARIOS = sizeof scenarios / sizeof scenarios[0] };

static void usage(void)
{
    fprintf(stderr, "usage: trace_scenarios SCENARIO TRACE | --list\n  scenarios:");
    for (int i = 0; i < NUM_SCENARIOS; i++)
        fprintf(stderr, " %s", scenarios[i].name);
    fputc('\n', stderr);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < NUM_SCENARIOS; i++)
            printf("%s\t%s\n", scenarios[i].name, scenarios[i].conf);
        return 0;
    }
    if (argc != 3) {
        usage();
        return 1;
    }
    const char *s = argv[1];
    int known = 0;
    for (int i = 0; i < NUM_SCENARIOS; i++)
        known |= strcmp(s, scenarios[i].name) == 0;
    if (!known) {
        fprintf(stderr, "trace_scenarios: unknown scenario %s\n", s);
        usage();
        return 1;
    }
    if (cualloc_trace_start(argv[2]) != 0)
        return 2;
    if (strcmp(s, "leak") == 0) {
        init_params(32 * MIB);
        for (int step = 1; step <= 6; step++) {
            train_step(8 * MIB, 4);
            record_loss();
            mark_step(step);
        }
    } else if (strcmp(s, "shortage") == 0) {
        init_params(40 * MIB);
        train_step(16 * MIB, 4);
        mark_step(1);
        if (!train_step(16 * MIB, 6))
            _exit(1); /* the job dies with its OOM: no end record */
        mark_step(2);
    } else if (strcmp(s, "frag") == 0) {
        init_params(8 * MIB);
        fragment();
        mark_step(1);
        if (!big_buffer(56 * MIB))
            _exit(1);
    } else if (strcmp(s, "twodev") == 0) {
        init_params(128 * MIB);
        train_step(16 * MIB, 4);
        cur_dev = 1;
        init_params(32 * MIB);
        mark_step(1);
        if (!big_buffer(240 * MIB))
            _exit(1);
    } else if (strcmp(s, "devicefull") == 0) {
        init_params(40 * MIB);
        if (ballast_take(48 * MIB, NULL) != 0)
            return 3;
        if (!train_step(16 * MIB, 4))
            _exit(1);
    } else if (strcmp(s, "step2") == 0) {
        init_params(32 * MIB);
        for (int step = 1; step <= 4; step++) {
            train_step(8 * MIB, 4);
            if (step == 1)
                adam_init_state(32 * MIB);
            mark_step(step);
        }
    } else if (strcmp(s, "longest") == 0) {
        init_params(32 * MIB);
        for (int step = 1; step <= 8; step++) {
            train_step(step == 6 ? 24 * MIB : 8 * MIB, 4);
            mark_step(step);
        }
    } else if (strcmp(s, "varlen") == 0) {
        /* A shuffled draw of sequence lengths, in units of 128 tokens (1 MiB of activation each). */
        static const int len128[12] = {3, 8, 5, 2, 7, 4, 8, 1, 6, 3, 7, 2};
        init_params(32 * MIB);
        for (int step = 1; step <= 12; step++) {
            train_step((size_t)len128[step - 1] * MIB, 4);
            mark_step(step);
        }
    } else if (strcmp(s, "phase") == 0) {
        init_params(32 * MIB);
        for (int step = 1; step <= 3; step++) {
            train_step(8 * MIB, 4);
            mark_step(step);
        }
        cualloc_mark("eval");
        eval_pass(32 * MIB, 4);
        cualloc_mark("train");
        train_step(8 * MIB, 4);
        mark_step(4);
    } else if (strcmp(s, "optstep") == 0) {
        init_params(32 * MIB);
        train_step(8 * MIB, 4);
        cualloc_mark("START Optimizer.step#AdamW.step"); /* as cualloc_torch.watch_optimizer writes */
        adam_init_state(32 * MIB);
        mark_step(1);
    } else if (strcmp(s, "latepeak") == 0) {
        /* 20 steps: step 15's batch is three times the others' (the peak), and step 18 asks for a
         * buffer larger than the device (sim_memory_mb:256): an OOM the job survives. */
        init_params(32 * MIB);
        for (int step = 1; step <= 20; step++) {
            train_step(step == 15 ? 24 * MIB : 8 * MIB, 4);
            if (step == 18 && big_buffer(1024 * MIB))
                return 3;
            mark_step(step);
        }
    } else if (strcmp(s, "twoleaks") == 0) {
        /* Two call sites keep tensors step after step: this line 4 MiB a step, the next one 2 MiB. */
        init_params(32 * MIB);
        for (int step = 1; step <= 6; step++) {
            train_step(8 * MIB, 4);
            for (int i = 0; i < 2; i++)
                record_loss();
            record_loss();
            mark_step(step);
        }
    } else if (strcmp(s, "evalstep") == 0) {
        /* phase, without the mark that ends the evaluation: training resumes and "step 4" is
         * written at its end, so one segment holds the evaluation and step 4. */
        init_params(32 * MIB);
        for (int step = 1; step <= 3; step++) {
            train_step(8 * MIB, 4);
            mark_step(step);
        }
        cualloc_mark("eval");
        eval_pass(32 * MIB, 4);
        train_step(8 * MIB, 4);
        mark_step(4);
    } else if (strcmp(s, "addrspace") == 0) {
        /* Blocks of 3 to 24 MiB come and go until no free range of the address space takes
         * the last request (tests/addrspace_sequence.h). */
        void *blk[ADDRSPACE_BLOCKS] = {0};
        for (size_t i = 0; i < sizeof addrspace_sequence / sizeof *addrspace_sequence; i++) {
            int id = addrspace_sequence[i].id, mib = addrspace_sequence[i].mib;
            if (mib) {
                blk[id] = tensor_empty((size_t)mib * MIB);
                if (!blk[id])
                    return 3;
            } else {
                tensor_free(blk[id]);
            }
        }
        mark_step(1);
        if (!big_buffer(ADDRSPACE_REQUEST_MIB * MIB))
            _exit(1);
    } else if (strcmp(s, "chunks") == 0) {
        init_params(10 * MIB);
        mark_step(1);
        if (!big_buffer(9 * MIB))
            _exit(1);
    } else if (strcmp(s, "refused") == 0) {
        init_params(8 * MIB);
        mark_step(1);
        if (!big_buffer(4 * MIB))
            _exit(1);
    } else if (strcmp(s, "split") == 0) {
        /* Classic segments: 6 MiB activations kept alive carve the cached segment of a 64 MiB
         * buffer, which then cannot be had again: OOM (max_split_size_mb:64 keeps it whole). */
        init_params(8 * MIB);
        tensor_free(big_buffer(64 * MIB));
        carve();
        mark_step(1);
        if (!big_buffer(64 * MIB))
            _exit(1);
    } else if (strcmp(s, "waiting") == 0) {
        /* A side stream frees 144 MiB of activations, then captures a CUDA graph (the fake
         * libcuda.so.1's capture flag: tests/fakecuda, the device the heap runs on); the main
         * stream's 160 MiB buffer finds that memory still the side stream's, which the heap cannot
         * synchronize during the capture: OOM. After the capture the buffer is served. */
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*stream_create)(void **, unsigned) = cuda ? (int (*)(void **, unsigned))dlsym(cuda, "cuStreamCreate") : NULL;
        void (*set_capturing)(void *, int) = cuda ? (void (*)(void *, int))dlsym(cuda, "fakecuda_stream_set_capturing") : NULL;
        int (*cu_init)(unsigned) = cuda ? (int (*)(unsigned))dlsym(cuda, "cuInit") : NULL;
        int (*retain)(void **, int) = cuda ? (int (*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain") : NULL;
        int (*set_current)(void *) = cuda ? (int (*)(void *))dlsym(cuda, "cuCtxSetCurrent") : NULL;
        void *side = NULL, *ctx = NULL;
        if (!set_capturing || !stream_create || !cu_init || !retain || !set_current)
            return 3;
        init_params(16 * MIB);
        mark_step(1);
        if (cu_init(0) != 0 || retain(&ctx, 0) != 0 || set_current(ctx) != 0 || stream_create(&side, 1 /* non-blocking */) != 0)
            return 3;
        void *acts[3];
        for (int i = 0; i < 3; i++)
            acts[i] = tensor_empty_on(48 * MIB, side);
        for (int i = 2; i >= 0; i--)
            cualloc_free(acts[i], side);
        set_capturing(side, 1);
        void *buf = big_buffer(160 * MIB); /* OOM: the side stream's memory waits for its capture */
        set_capturing(side, 0);
        if (buf || !(buf = big_buffer(160 * MIB)))
            return 4;
        tensor_free(buf);
        mark_step(2);
    } else if (strcmp(s, "manysteps") == 0) {
        /* 4100 steps (more than 4096): an evaluation after step 4097 peaks above every step before
         * it but below step 4100, whose batch is three times the others' (the peak). */
        init_params(32 * MIB);
        for (int step = 1; step <= 4100; step++) {
            if (step == 4098) {
                cualloc_mark("eval");
                eval_pass(16 * MIB, 4);
                cualloc_mark("train");
            }
            train_step(step == 4100 ? 24 * MIB : 8 * MIB, 4);
            mark_step(step);
        }
    } else if (strcmp(s, "cache") == 0) {
        /* A cache that fills over the first three steps (4 MiB each, after the backward pass) and is
         * then kept for good: a third of it was made in step 1, not all of it allocated once. */
        init_params(32 * MIB);
        for (int step = 1; step <= 10; step++) {
            train_step(8 * MIB, 4);
            if (step <= 3)
                cache_put(4 * MIB);
            mark_step(step);
        }
    } else if (strcmp(s, "startmarks") == 0) {
        /* "step N" written at the start of each step, before its work (the other convention) */
        for (int step = 1; step <= 3; step++) {
            mark_step(step);
            if (step == 1)
                init_params(32 * MIB);
            train_step(8 * MIB, 4);
        }
    }
    cualloc_trace_stop();
    return 0;
}
