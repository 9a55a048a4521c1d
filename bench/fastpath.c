/* fastpath.c — the fast-path benchmark: nanoseconds (and, where the CPU's counters are readable,
 * instructions) per cached alloc+free pair, for cualloc through its public API on the sim device and
 * for jemalloc's mallocx/sdallocx, on one fixed, seeded tensor-size mix (512 B .. 12 MiB). It is a
 * benchmark, not a test: it prints numbers and checks only that cualloc's timed loop made no driver
 * map (every request served from cache). Repeatable instruction counts come from running it under
 * callgrind (bench/fastpath.sh), which collects only inside the bench_loop_* functions.
 *
 * Patterns (K live slots, K = 64):
 *   random  steady state: each pair frees a random live slot and allocates the next size into it.
 *   stack   a training step: allocate K sizes ("activations"), free them in reverse; K pairs/step.
 *   repeat  the same K sizes every step, allocated in order and freed in reverse.
 *   trace   a recorded job's own requests (--trace FILE, a cualloc trace; a PyTorch snapshot after
 *           `allocview import`), replayed pass after pass: see "the trace program" below.
 * The size sequence (period 16384) and the slot choices are generated once from the seed, so every
 * allocator sees the same requests in the same order. Threads each run their own slots from their
 * own offset in the sequence; for cualloc each thread uses its own stream handle, 0x100 * (t + 1)
 * (clear of CUDA's special handles: 0x1, the legacy stream, and 0x2, cudaStreamPerThread, whose
 * frees the heap makes device-wide).
 *
 * Usage: fastpath [--pairs N] [--threads T] [--allocator cualloc|jemalloc|all]
 *                 [--pattern random|stack|repeat|trace|all] [--trace FILE] [--seed S] [--turns]
 *                 [--json] [--quiet]
 *   --pairs   timed pairs per thread (default 200000); --threads T runs only T (default: 1 and 8).
 *   --turns   the threads run one at a time, a step each (random: SLOTS pairs; trace: a pass) in
 *             thread order, the first fill of their slots and the warm-up included. Free-running
 *             threads interleave wherever the scheduler (or callgrind, which runs one thread at a
 *             time) switches them, and the large pool's layout, so an 8-thread count, follows the
 *             switches from run to run; in turns the interleaving is fixed and the count repeats. Times then measure no concurrency,
 *             and a thread's time includes the others' turns and the wake-ups that pass the turn on
 *             (microseconds each): read instructions, not ns, in turns.
 * Warm-up runs whole periods until cualloc has mapped nothing for WARM_QUIET_ROUNDS periods in a row
 * (FASTPATH_DEBUG=1 prints each round). Exit status 3: a cualloc timed loop still mapped memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/perf_event.h>
#include <sys/syscall.h>
#endif

#include "cualloc.h"
#include "reader.h"

#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#ifdef HAVE_CALLGRIND_H
/* Run under callgrind with --instr-atstart=no, only the timed loops are instrumented, so the call
 * counts in its profile are those of the timed pairs alone (warm-up and drain excluded). */
#include <valgrind/callgrind.h>
#define INSTRUMENT_START() CALLGRIND_START_INSTRUMENTATION
#define INSTRUMENT_STOP() CALLGRIND_STOP_INSTRUMENTATION
#else
#define INSTRUMENT_START() ((void)0)
#define INSTRUMENT_STOP() ((void)0)
#endif

#ifdef HAVE_JEMALLOC
#define HAVE_JEMALLOC_ 1
#else
#define HAVE_JEMALLOC_ 0
#endif
#ifdef HAVE_CALLGRIND_H
#define HAVE_CALLGRIND_H_ 1
#else
#define HAVE_CALLGRIND_H_ 0
#endif

#define NOINLINE __attribute__((noinline, noclone))
#define ALWAYS_INLINE inline __attribute__((always_inline))

#define SLOTS 64                     /* live slots (random) = activations per step (stack) */
#define SEQ_LOG2 14
#define SEQ_LEN ((size_t)1 << SEQ_LOG2) /* period of the size sequence */
#define SEQ_MASK (SEQ_LEN - 1)
#define MIX_MIN ((size_t)512)
#define MIX_MAX ((size_t)12 << 20)
#define MIX_COMMON 48                /* distinct "common" tensor sizes */
#define MIX_FRESH_PCT 15             /* % of requests drawn fresh (log-uniform) instead */
#define WARM_ROUNDS_MIN 2            /* warm-up rounds (a period or a trace pass each) at least... */
#define WARM_QUIET_ROUNDS 4          /* ...and for cualloc until this many in a row mapped nothing */
#define WARM_ROUNDS_MAX 64
#define MAX_THREADS 64

typedef enum { A_CUALLOC, A_JEMALLOC, A_NULL, A_COUNT } alloc_kind_t;
typedef enum { P_RANDOM, P_STACK, P_REPEAT, P_TRACE, P_COUNT } pattern_t;

static const char *const alloc_names[A_COUNT] = {"cualloc", "jemalloc", "null"};
static const char *const pattern_names[P_COUNT] = {"random", "stack", "repeat", "trace"};

/* ------------------------------------------------------------------ the request sequence */

static size_t seq_sizes[SEQ_LEN];
static uint8_t seq_victims[SEQ_LEN]; /* random pattern: the slot freed and refilled by pair i */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Log-uniform in [MIX_MIN, MIX_MAX], a multiple of 4 bytes (fp32 / bf16 pairs of elements). */
static size_t mix_draw(uint64_t *s) {
    double lo = log2((double)MIX_MIN), hi = log2((double)MIX_MAX);
    size_t v = (size_t)exp2(lo + (hi - lo) * rng_unit(s)) & ~(size_t)3;
    return v < MIX_MIN ? MIX_MIN : v > MIX_MAX ? MIX_MAX : v;
}

/* A model's handful of tensor shapes recur constantly: 85% of requests come from MIX_COMMON sizes
 * with skewed popularity (index = floor(n * u^2), so the most popular few dominate), 15% are fresh
 * log-uniform sizes (odd shapes, last batches). Popularity is independent of size. */
static void seq_build(uint64_t seed) {
    uint64_t s = seed;
    size_t common[MIX_COMMON];
    for (int i = 0; i < MIX_COMMON; i++) common[i] = mix_draw(&s);
    for (size_t i = 0; i < SEQ_LEN; i++) {
        if (rng_next(&s) % 100 < MIX_FRESH_PCT) {
            seq_sizes[i] = mix_draw(&s);
        } else {
            double u = rng_unit(&s);
            seq_sizes[i] = common[(size_t)(u * u * MIX_COMMON)];
        }
        seq_victims[i] = (uint8_t)(rng_next(&s) % SLOTS);
    }
}

static int size_cmp(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ the trace program */

/* The trace pattern replays a recorded job's requests on device 0. Its blocks live when recording
 * started (INIT_BLOCK) are allocated before warm-up and held; every pass then runs the recorded
 * ALLOC and FREE events in order (requested sizes, on one stream: the thread's). A pass must leave
 * the live set as it found it, so that passes repeat: it ends by freeing the blocks the recording
 * left live and allocating again the initial blocks it freed. A pass thus makes as many frees as
 * allocations; its pairs are its allocations. Each block gets a slot; a freed slot is reused by
 * the next allocation (last freed, first reused), so the slot table stays as large as the most
 * blocks live at once. Left out (counted in `skipped`): a free of an address not live (a ring
 * trace lost its allocation), an allocation of an address already live, zero-byte requests. */
#define OP_FREE 0x80000000u          /* an op: a slot in the low bits; set: free it, clear: allocate */

typedef struct trace_prog_s {
    uint32_t *op;
    size_t *size;                    /* per op: the allocation's bytes (0 for a free) */
    size_t nops, pairs;              /* ops per pass; allocations (= frees) per pass */
    size_t ninit;                    /* initial blocks: slots 0 .. ninit-1, live between passes */
    size_t *init_size;
    size_t nslots;
    uint64_t init_bytes, peak_bytes; /* held between passes; the most live at once */
    size_t distinct, median;         /* of the allocations' sizes */
    uint64_t skipped;
} trace_prog_t;

static trace_prog_t prog;

/* Loading state: per slot, its block's size and whether it still holds its initial block. */
typedef struct trace_build_s {
    size_t op_cap, slot_cap, init_cap;
    size_t *slot_size;
    bool *untouched;
    uint32_t *free_slots;
    size_t nfree;
    uint64_t live;
} trace_build_t;

typedef struct slot_entry_s { devaddr_entry_t key; uint32_t slot; } slot_entry_t;

static __attribute__((noreturn)) void load_oom(void) {
    fprintf(stderr, "fastpath: out of memory loading the trace\n");
    exit(1);
}

static void *xrealloc(void *p, size_t n, size_t elem) {
    void *q = realloc(p, n * elem);
    if (!q) load_oom();
    return q;
}

static void prog_push(trace_build_t *b, uint32_t op, size_t size) {
    if (prog.nops == b->op_cap) {
        b->op_cap = b->op_cap ? 2 * b->op_cap : 4096;
        prog.op = xrealloc(prog.op, b->op_cap, sizeof *prog.op);
        prog.size = xrealloc(prog.size, b->op_cap, sizeof *prog.size);
    }
    prog.op[prog.nops] = op;
    prog.size[prog.nops++] = size;
    uint32_t slot = op & ~OP_FREE;
    if (op & OP_FREE) {
        b->live -= b->slot_size[slot];
        b->untouched[slot] = false;
        b->free_slots[b->nfree++] = slot;
    } else {
        prog.pairs++;
        b->slot_size[slot] = size;
        b->live += size;
        if (b->live > prog.peak_bytes) prog.peak_bytes = b->live;
    }
}

/* A slot for a new block: the last one freed, else a new one. */
static uint32_t slot_take(trace_build_t *b) {
    if (b->nfree) return b->free_slots[--b->nfree];
    if (prog.nslots == b->slot_cap) {
        if (b->slot_cap >= OP_FREE / 2) {
            fprintf(stderr, "fastpath: the trace has too many live blocks\n");
            exit(2);
        }
        b->slot_cap = b->slot_cap ? 2 * b->slot_cap : 1024;
        b->slot_size = xrealloc(b->slot_size, b->slot_cap, sizeof *b->slot_size);
        b->untouched = xrealloc(b->untouched, b->slot_cap, sizeof *b->untouched);
        b->free_slots = xrealloc(b->free_slots, b->slot_cap, sizeof *b->free_slots);
    }
    b->untouched[prog.nslots] = false;
    return (uint32_t)prog.nslots++;
}

/* Builds `prog` from the trace at path; exits with a message naming what was wrong. */
static void prog_load(const char *path) {
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "fastpath: %s\n", err);
        exit(2);
    }
    trace_build_t b = {0};
    devaddr_map_t live;
    devaddr_map_init(&live, sizeof(slot_entry_t));
    tr_record_t rec;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        if (!rec.known || rec.dev != 0) continue;
        if (rec.type == CUA_TRACE_INIT_BLOCK || rec.type == CUA_TRACE_ALLOC) {
            bool init = rec.type == CUA_TRACE_INIT_BLOCK, found;
            if (rec.requested == 0 || (init && prog.nops)) { /* initial blocks come before events */
                prog.skipped++;
                continue;
            }
            slot_entry_t *e = devaddr_map_get(&live, 0, rec.addr, &found);
            if (!e) load_oom();
            if (found) {
                prog.skipped++;
                continue;
            }
            e->slot = slot_take(&b);
            if (init) {
                if (prog.ninit == b.init_cap) {
                    b.init_cap = b.init_cap ? 2 * b.init_cap : 1024;
                    prog.init_size = xrealloc(prog.init_size, b.init_cap, sizeof *prog.init_size);
                }
                prog.init_size[prog.ninit++] = rec.requested;
                b.slot_size[e->slot] = rec.requested;
                b.untouched[e->slot] = true;
                b.live += rec.requested;
                prog.init_bytes = prog.peak_bytes = b.live;
            } else {
                prog_push(&b, e->slot, rec.requested);
            }
        } else if (rec.type == CUA_TRACE_FREE) {
            slot_entry_t *e = devaddr_map_find(&live, 0, rec.addr);
            if (!e) {
                prog.skipped++;
                continue;
            }
            uint32_t slot = e->slot;
            devaddr_map_remove(&live, e);
            prog_push(&b, slot | OP_FREE, 0);
        }
    }
    if (k < 0) {
        fprintf(stderr, "fastpath: %s: corrupt trace: %s\n", path, tr_error(r));
        exit(2);
    }
    tr_close(r);
    /* Close the pass: free what the recording left live (initial blocks it never touched stay),
     * then allocate the initial blocks it freed again, each into its own slot (slots 0..ninit-1:
     * the initial blocks took the first slots, and after these frees every other slot is free). */
    size_t pos = 0;
    slot_entry_t *e;
    while ((e = devaddr_map_next(&live, &pos)) != NULL)
        if (!b.untouched[e->slot]) prog_push(&b, e->slot | OP_FREE, 0);
    devaddr_map_free(&live);
    for (uint32_t i = 0; i < prog.ninit; i++)
        if (!b.untouched[i]) prog_push(&b, i, prog.init_size[i]);
    if (prog.pairs == 0) {
        fprintf(stderr, "fastpath: %s: no allocation on device 0 to replay\n", path);
        exit(2);
    }
    size_t *sizes = xrealloc(NULL, prog.pairs, sizeof *sizes), n = 0;
    for (size_t i = 0; i < prog.nops; i++)
        if (!(prog.op[i] & OP_FREE)) sizes[n++] = prog.size[i];
    qsort(sizes, n, sizeof *sizes, size_cmp);
    for (size_t i = 0; i < n; i++) prog.distinct += i == 0 || sizes[i] != sizes[i - 1];
    prog.median = sizes[n / 2];
    free(sizes);
    free(b.slot_size);
    free(b.untouched);
    free(b.free_slots);
}

/* ------------------------------------------------------------------ allocators */

typedef void *(*alloc_fn)(size_t size, void *stream);
typedef void (*free_fn)(void *p, size_t size, void *stream);

static ALWAYS_INLINE void *cua_alloc(size_t size, void *stream) { return cualloc_malloc(size, 0, stream); }
static ALWAYS_INLINE void cua_free(void *p, size_t size, void *stream) { (void)size; cualloc_free(p, stream); }

#ifdef HAVE_JEMALLOC
static ALWAYS_INLINE void *je_alloc(size_t size, void *stream) { (void)stream; return mallocx(size, 0); }
static ALWAYS_INLINE void je_free(void *p, size_t size, void *stream) { (void)stream; sdallocx(p, size, 0); }
#endif

/* The baseline: calls that do nothing, so callgrind can measure the loop's own instructions. noipa:
 * the loop must call them as it calls an allocator it knows nothing of. Merely not inlined, the
 * compiler saw that they clobber no register and kept the loop's values in caller-saved registers
 * across the calls: the null loop took 4-8 fewer instructions a pair than the same loop around
 * cualloc or jemalloc, and the difference went into both allocators' net counts. What still
 * differs is the two PLT jumps a pair (calls into a shared library), counted to the allocators. */
static char null_block[16];
static __attribute__((noipa)) void *null_alloc(size_t size, void *stream) {
    __asm__ volatile("" ::"r"(size), "r"(stream) : "memory");
    return null_block;
}
static __attribute__((noipa)) void null_free(void *p, size_t size, void *stream) { __asm__ volatile("" ::"r"(p), "r"(size), "r"(stream) : "memory"); }

/* ------------------------------------------------------------------ workers and loops */

typedef struct worker_s {
    int id;
    void *stream;            /* cualloc: the thread's stream handle */
    pattern_t pattern;
    size_t pos;              /* next index into the sequence (masked) */
    void *ptr[SLOTS];
    size_t size[SLOTS];
    void **tptr;             /* trace pattern: prog.nslots slots */
    size_t *tsize;
    size_t live;             /* slots holding an allocation between calls (random: SLOTS, trace: prog.ninit) */
    double ns;               /* timed loop */
    int64_t instructions;    /* timed loop, from the CPU counter; -1 when not readable */
    struct timespec t0, t1;
} worker_t;

static NOINLINE __attribute__((cold, noreturn)) void alloc_failed(size_t size) {
    fprintf(stderr, "fastpath: allocation of %zu B failed\n", size);
    exit(1);
}

static ALWAYS_INLINE void run_random(worker_t *w, size_t pairs, alloc_fn A, free_fn F) {
    void *stream = w->stream;
    size_t pos = w->pos;
    for (size_t i = 0; i < pairs; i++, pos++) {
        unsigned k = seq_victims[pos & SEQ_MASK];
        F(w->ptr[k], w->size[k], stream);
        size_t s = seq_sizes[pos & SEQ_MASK];
        void *p = A(s, stream);
        if (__builtin_expect(p == NULL, 0)) alloc_failed(s);
        w->ptr[k] = p;
        w->size[k] = s;
    }
    w->pos = pos;
}

/* Whole steps of SLOTS allocations then SLOTS frees in reverse; pairs is rounded up to steps. */
static ALWAYS_INLINE void run_stack(worker_t *w, size_t pairs, alloc_fn A, free_fn F) {
    void *stream = w->stream;
    size_t pos = w->pos;
    for (size_t done = 0; done < pairs; done += SLOTS) {
        for (unsigned k = 0; k < SLOTS; k++, pos++) {
            size_t s = seq_sizes[pos & SEQ_MASK];
            void *p = A(s, stream);
            if (__builtin_expect(p == NULL, 0)) alloc_failed(s);
            w->ptr[k] = p;
            w->size[k] = s;
        }
        for (unsigned k = SLOTS; k-- > 0;) F(w->ptr[k], w->size[k], stream);
    }
    w->pos = pos;
}

/* Fixed-shape training steps: the same SLOTS sizes every step (the first SLOTS of the sequence),
 * allocated in order and freed in reverse — what a model with static shapes does step after step. */
static ALWAYS_INLINE void run_repeat(worker_t *w, size_t pairs, alloc_fn A, free_fn F) {
    void *stream = w->stream;
    for (size_t done = 0; done < pairs; done += SLOTS) {
        for (unsigned k = 0; k < SLOTS; k++) {
            size_t s = seq_sizes[k];
            void *p = A(s, stream);
            if (__builtin_expect(p == NULL, 0)) alloc_failed(s);
            w->ptr[k] = p;
            w->size[k] = s;
        }
        for (unsigned k = SLOTS; k-- > 0;) F(w->ptr[k], w->size[k], stream);
    }
}

/* Whole passes of the trace program; pairs is rounded up to passes. */
static ALWAYS_INLINE void run_trace(worker_t *w, size_t pairs, alloc_fn A, free_fn F) {
    void *stream = w->stream;
    void **ptr = w->tptr;
    size_t *size = w->tsize;
    const uint32_t *op = prog.op;
    const size_t *op_size = prog.size, nops = prog.nops;
    for (size_t done = 0; done < pairs; done += prog.pairs) {
        for (size_t i = 0; i < nops; i++) {
            uint32_t k = op[i];
            if (k & OP_FREE) {
                k &= ~OP_FREE;
                F(ptr[k], size[k], stream);
            } else {
                size_t s = op_size[i];
                void *p = A(s, stream);
                if (__builtin_expect(p == NULL, 0)) alloc_failed(s);
                ptr[k] = p;
                size[k] = s;
            }
        }
    }
}

static ALWAYS_INLINE void run_pattern(worker_t *w, size_t pairs, alloc_fn A, free_fn F) {
    if (w->pattern == P_RANDOM) run_random(w, pairs, A, F);
    else if (w->pattern == P_STACK) run_stack(w, pairs, A, F);
    else if (w->pattern == P_REPEAT) run_repeat(w, pairs, A, F);
    else run_trace(w, pairs, A, F);
}

/* The timed loops (bench_loop_*: what callgrind's --toggle-collect=bench_loop_* counts) and the
 * identical warm-up loops under other names, so warm-up is never counted. Non-static so that their
 * symbols keep these names. */
void bench_loop_cualloc(worker_t *w, size_t pairs);
void warm_loop_cualloc(worker_t *w, size_t pairs);
void bench_loop_jemalloc(worker_t *w, size_t pairs);
void warm_loop_jemalloc(worker_t *w, size_t pairs);
void bench_loop_null(worker_t *w, size_t pairs);
void warm_loop_null(worker_t *w, size_t pairs);

NOINLINE void bench_loop_cualloc(worker_t *w, size_t pairs) { run_pattern(w, pairs, cua_alloc, cua_free); }
NOINLINE void warm_loop_cualloc(worker_t *w, size_t pairs) { run_pattern(w, pairs, cua_alloc, cua_free); }
#ifdef HAVE_JEMALLOC
NOINLINE void bench_loop_jemalloc(worker_t *w, size_t pairs) { run_pattern(w, pairs, je_alloc, je_free); }
NOINLINE void warm_loop_jemalloc(worker_t *w, size_t pairs) { run_pattern(w, pairs, je_alloc, je_free); }
#else
NOINLINE void bench_loop_jemalloc(worker_t *w, size_t pairs) { (void)w; (void)pairs; abort(); }
NOINLINE void warm_loop_jemalloc(worker_t *w, size_t pairs) { (void)w; (void)pairs; abort(); }
#endif
NOINLINE void bench_loop_null(worker_t *w, size_t pairs) { run_pattern(w, pairs, null_alloc, null_free); }
NOINLINE void warm_loop_null(worker_t *w, size_t pairs) { run_pattern(w, pairs, null_alloc, null_free); }

typedef struct {
    void (*bench)(worker_t *, size_t);
    void (*warm)(worker_t *, size_t);
    alloc_fn alloc;   /* untimed fill and drain */
    free_fn free;
} alloc_ops_t;

static void *cua_alloc_call(size_t size, void *stream) { return cua_alloc(size, stream); }
static void cua_free_call(void *p, size_t size, void *stream) { cua_free(p, size, stream); }
#ifdef HAVE_JEMALLOC
static void *je_alloc_call(size_t size, void *stream) { return je_alloc(size, stream); }
static void je_free_call(void *p, size_t size, void *stream) { je_free(p, size, stream); }
#endif

static const alloc_ops_t ops[A_COUNT] = {
    [A_CUALLOC] = {bench_loop_cualloc, warm_loop_cualloc, cua_alloc_call, cua_free_call},
#ifdef HAVE_JEMALLOC
    [A_JEMALLOC] = {bench_loop_jemalloc, warm_loop_jemalloc, je_alloc_call, je_free_call},
#endif
    [A_NULL] = {bench_loop_null, warm_loop_null, null_alloc, null_free},
};

/* Random pattern: every slot holds an allocation between calls; trace: the initial blocks do. */
static void worker_fill(worker_t *w, const alloc_ops_t *o) {
    if (w->pattern == P_TRACE) {
        for (size_t k = 0; k < prog.ninit; k++) {
            w->tptr[k] = o->alloc(prog.init_size[k], w->stream);
            if (!w->tptr[k]) alloc_failed(prog.init_size[k]);
            w->tsize[k] = prog.init_size[k];
        }
        w->live = prog.ninit;
        return;
    }
    if (w->pattern != P_RANDOM) return;
    for (unsigned k = 0; k < SLOTS; k++, w->pos++) {
        size_t s = seq_sizes[w->pos & SEQ_MASK];
        w->ptr[k] = o->alloc(s, w->stream);
        if (!w->ptr[k]) alloc_failed(s);
        w->size[k] = s;
    }
    w->live = SLOTS;
}

static void worker_drain(worker_t *w, const alloc_ops_t *o) {
    for (size_t k = 0; k < w->live; k++) {
        if (w->pattern == P_TRACE) o->free(w->tptr[k], w->tsize[k], w->stream);
        else o->free(w->ptr[k], w->size[k], w->stream);
    }
    w->live = 0;
}

/* ------------------------------------------------------------------ CPU instruction counter */

/* User-space instructions of the calling thread, or -1 where perf events are not available. */
static int perf_open(void) {
#ifdef __linux__
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_HARDWARE;
    attr.config = PERF_COUNT_HW_INSTRUCTIONS;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
#else
    return -1;
#endif
}

static int64_t perf_read(int fd) {
    uint64_t v = 0;
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) return -1;
    return (int64_t)v;
}

/* ------------------------------------------------------------------ one run */

typedef struct run_s {
    alloc_kind_t alloc;
    pattern_t pattern;
    int threads;
    size_t pairs;              /* per thread, after rounding (stack, repeat: whole steps; trace: passes) */
    bool turns;                /* --turns: one thread at a time, turn_pairs each, in thread order */
    size_t turn_pairs;
    pthread_mutex_t turn_lock;
    pthread_cond_t turn_changed;
    int turn;                  /* under turn_lock: the thread whose turn it is */
    size_t round_pairs;        /* per warm-up round: one period of the sequence, or one pass */
    const alloc_ops_t *o;
    worker_t *workers;
    pthread_barrier_t barrier;
    volatile int warm_done;    /* written by the main thread between barriers */
    int warm_rounds;
    /* results */
    double ns_per_pair;        /* mean over threads of the thread's own ns per pair */
    double pairs_per_s;        /* all threads' pairs over the wall time from first start to last end */
    double instr_per_pair;     /* CPU counter; < 0 when not available */
    bool have_stats;
    cualloc_stats before, after;
    uint64_t warm_maps;        /* cualloc: maps during the last warm-up round */
} run_t;

/* Runs pairs through loop, in turns when the run takes turns: the hand-over is outside loop, so
 * that callgrind, collecting inside bench_loop_*, counts none of it. Every thread runs the same
 * number of turns, so the last turn of each leaves no thread waiting. */
static void turn_wait(run_t *r, const worker_t *w) {
    pthread_mutex_lock(&r->turn_lock);
    while (r->turn != w->id) pthread_cond_wait(&r->turn_changed, &r->turn_lock);
    pthread_mutex_unlock(&r->turn_lock);
}

static void turn_pass(run_t *r, const worker_t *w) {
    pthread_mutex_lock(&r->turn_lock);
    r->turn = (w->id + 1) % r->threads;
    pthread_cond_broadcast(&r->turn_changed);
    pthread_mutex_unlock(&r->turn_lock);
}

static void worker_run(run_t *r, worker_t *w, void (*loop)(worker_t *, size_t), size_t pairs) {
    if (!r->turns) {
        loop(w, pairs);
        return;
    }
    for (size_t done = 0; done < pairs; done += r->turn_pairs) {
        turn_wait(r, w);
        loop(w, r->turn_pairs);
        turn_pass(r, w);
    }
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    run_t *r = (run_t *)(void *)w->ptr[0]; /* smuggled in; replaced by worker_fill */
    w->ptr[0] = NULL;
    /* In turns the threads fill their live slots in turn too: the random pattern keeps its slots
     * live throughout, so where they were carved, which free-running threads decide, would move
     * the count from run to run. */
    if (r->turns) turn_wait(r, w);
    worker_fill(w, r->o);
    if (r->turns) turn_pass(r, w);
    /* Warm-up rounds of one full period (trace: one pass) each, until the main thread sees a round without maps. */
    for (;;) {
        pthread_barrier_wait(&r->barrier);
        if (r->warm_done) break;
        worker_run(r, w, r->o->warm, r->round_pairs);
        pthread_barrier_wait(&r->barrier);
    }
    int fd = perf_open();
    pthread_barrier_wait(&r->barrier); /* the main thread has taken the "before" stats */
    int64_t i0 = perf_read(fd);
    clock_gettime(CLOCK_MONOTONIC, &w->t0);
    worker_run(r, w, r->o->bench, r->pairs);
    clock_gettime(CLOCK_MONOTONIC, &w->t1);
    int64_t i1 = perf_read(fd);
    if (fd >= 0) close(fd);
    w->instructions = (i0 >= 0 && i1 >= 0) ? i1 - i0 : -1;
    w->ns = (double)(w->t1.tv_sec - w->t0.tv_sec) * 1e9 + (double)(w->t1.tv_nsec - w->t0.tv_nsec);
    pthread_barrier_wait(&r->barrier); /* the main thread takes the "after" stats */
    pthread_barrier_wait(&r->barrier);
    worker_drain(w, r->o);
    return NULL;
}

static double ts_ns(struct timespec t) { return (double)t.tv_sec * 1e9 + (double)t.tv_nsec; }

static void run_one(run_t *r) {
    r->o = &ops[r->alloc];
    size_t step = r->pattern == P_TRACE ? prog.pairs : r->pattern == P_RANDOM ? 1 : SLOTS;
    /* A turn is a step (random: SLOTS pairs, not one); pairs and rounds are whole turns. */
    r->turn_pairs = r->pattern == P_RANDOM ? SLOTS : step;
    if (r->turns) step = r->turn_pairs;
    r->pairs = (r->pairs + step - 1) / step * step;
    r->round_pairs = r->pattern == P_TRACE ? prog.pairs : SEQ_LEN;
    r->turn = 0;
    pthread_mutex_init(&r->turn_lock, NULL);
    pthread_cond_init(&r->turn_changed, NULL);
    r->workers = calloc((size_t)r->threads, sizeof(worker_t));
    pthread_t *tids = calloc((size_t)r->threads, sizeof(pthread_t));
    if (!r->workers || !tids) alloc_failed(sizeof(worker_t));
    pthread_barrier_init(&r->barrier, NULL, (unsigned)r->threads + 1);
    r->warm_done = 0;
    for (int t = 0; t < r->threads; t++) {
        worker_t *w = &r->workers[t];
        w->id = t;
        w->stream = (void *)(0x100 * (uintptr_t)(t + 1));
        w->pattern = r->pattern;
        w->pos = (size_t)t * (SEQ_LEN / (size_t)r->threads); /* threads start apart in the sequence */
        if (r->pattern == P_TRACE) {
            w->tptr = calloc(prog.nslots, sizeof *w->tptr);
            w->tsize = calloc(prog.nslots, sizeof *w->tsize);
            if (!w->tptr || !w->tsize) alloc_failed(prog.nslots * sizeof *w->tptr);
        }
        w->ptr[0] = r;
        if (pthread_create(&tids[t], NULL, worker_main, w) != 0) {
            fprintf(stderr, "fastpath: cannot create thread %d\n", t);
            exit(1);
        }
    }
    /* Warm-up: at least WARM_ROUNDS_MIN rounds; for cualloc, until a round maps nothing. */
    bool is_cua = r->alloc == A_CUALLOC;
    cualloc_stats s0, s1;
    r->warm_rounds = 0;
    int quiet_rounds = 0;
    for (;;) {
        if (is_cua) cualloc_get_stats(0, &s0);
        pthread_barrier_wait(&r->barrier); /* round starts */
        pthread_barrier_wait(&r->barrier); /* round done */
        r->warm_rounds++;
        quiet_rounds++;
        if (is_cua) {
            cualloc_get_stats(0, &s1);
            r->warm_maps = s1.num_maps - s0.num_maps;
            if (r->warm_maps) quiet_rounds = 0;
            if (getenv("FASTPATH_DEBUG"))
                fprintf(stderr, "warm-up round %d: %" PRIu64 " maps, %zu MiB reserved\n", r->warm_rounds, r->warm_maps,
                        s1.reserved_bytes >> 20);
        }
        if (r->warm_rounds >= WARM_ROUNDS_MAX ||
            (r->warm_rounds >= WARM_ROUNDS_MIN && (!is_cua || quiet_rounds >= WARM_QUIET_ROUNDS)))
            break;
    }
    r->warm_done = 1;
    pthread_barrier_wait(&r->barrier); /* workers leave the warm-up loop */
    r->have_stats = is_cua;
    if (is_cua) cualloc_get_stats(0, &r->before);
    INSTRUMENT_START();
    pthread_barrier_wait(&r->barrier); /* timed loops start */
    pthread_barrier_wait(&r->barrier); /* timed loops done */
    INSTRUMENT_STOP();
    if (is_cua) cualloc_get_stats(0, &r->after);
    pthread_barrier_wait(&r->barrier);
    for (int t = 0; t < r->threads; t++) pthread_join(tids[t], NULL);
    pthread_barrier_destroy(&r->barrier);
    pthread_mutex_destroy(&r->turn_lock);
    pthread_cond_destroy(&r->turn_changed);

    double sum_ns_pp = 0, first = 0, last = 0;
    int64_t instr = 0;
    bool instr_ok = true;
    for (int t = 0; t < r->threads; t++) {
        worker_t *w = &r->workers[t];
        sum_ns_pp += w->ns / (double)r->pairs;
        double a = ts_ns(w->t0), b = ts_ns(w->t1);
        if (t == 0 || a < first) first = a;
        if (t == 0 || b > last) last = b;
        if (w->instructions < 0) instr_ok = false;
        else instr += w->instructions;
    }
    r->ns_per_pair = sum_ns_pp / r->threads;
    r->pairs_per_s = (double)r->pairs * r->threads / ((last - first) * 1e-9);
    r->instr_per_pair = instr_ok ? (double)instr / ((double)r->pairs * r->threads) : -1;
    for (int t = 0; t < r->threads; t++) {
        free(r->workers[t].tptr);
        free(r->workers[t].tsize);
    }
    free(tids);
    free(r->workers);
    r->workers = NULL;
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *out) {
    fprintf(out,
            "usage: fastpath [--pairs N] [--threads T] [--allocator cualloc|jemalloc|all]\n"
            "                [--pattern random|stack|repeat|trace|all] [--trace FILE] [--seed S] [--turns]\n"
            "                [--json] [--quiet]\n"
            "  --pairs N      timed alloc+free pairs per thread, 1 to 2^40 (default 200000; stack and repeat round\n"
            "                 up to %d, trace to whole passes)\n"
            "  --threads T    run with T threads only (default: 1 and 8)\n"
            "  --allocator    which allocator(s) (default all; 'null' is the loop-overhead baseline)\n"
            "  --pattern      random: free a random live slot of %d and refill it; stack: allocate %d, free in\n"
            "                 reverse; repeat: the same %d sizes every step, like a fixed-shape training step;\n"
            "                 trace: the requests of --trace FILE, pass after pass (default all: every pattern,\n"
            "                 trace only with --trace)\n"
            "  --trace FILE   a cualloc trace (a PyTorch snapshot: `allocview import` it first); its device 0's\n"
            "                 allocations and frees, initial blocks held (sets --pattern trace unless --pattern is given)\n"
            "  --turns        threads run one at a time, a step each (random: %d pairs; trace: a pass), in thread\n"
            "                 order: an interleaving that repeats from run to run (callgrind's thread switches do\n"
            "                 not), so an N-thread instruction count does too; times then show no concurrency\n"
            "                 and include the wake-ups that pass each turn on (read instructions, not ns)\n"
            "  --json         one JSON array of results instead of the table\n"
            "  --quiet        no description of the mix\n"
            "  --features     print what this build measures (cualloc null [jemalloc] [callgrind-markers])\n",
            SLOTS, SLOTS, SLOTS, SLOTS, SLOTS);
}

/* A count of 1 or more, all decimal digits: strtoull alone takes a sign and blanks ("-1" read as
 * 2^64 - 1). */
static bool parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > SIZE_MAX) return false;
    *out = (size_t)v;
    return true;
}

static void describe_trace(FILE *out, const char *path) {
    fprintf(out,
            "trace: %s: %zu pairs per pass (%zu distinct sizes, median %.1f KiB), %zu initial blocks held (%.2f GiB), "
            "at most %zu blocks and %.2f GiB live; %" PRIu64 " records left out\n",
            path, prog.pairs, prog.distinct, (double)prog.median / 1024, prog.ninit, (double)prog.init_bytes / (1 << 30),
            prog.nslots, (double)prog.peak_bytes / (1 << 30), prog.skipped);
}

static void describe_mix(FILE *out, uint64_t seed) {
    size_t small = 0, tiny = 0, distinct = 0;
    double total = 0;
    size_t *copy = malloc(sizeof seq_sizes);
    if (!copy) return;
    memcpy(copy, seq_sizes, sizeof seq_sizes);
    qsort(copy, SEQ_LEN, sizeof *copy, size_cmp);
    for (size_t i = 0; i < SEQ_LEN; i++) {
        if (i == 0 || copy[i] != copy[i - 1]) distinct++;
        if (seq_sizes[i] <= ((size_t)1 << 20)) small++;
        if (seq_sizes[i] <= ((size_t)32 << 10)) tiny++;
        total += (double)seq_sizes[i];
    }
    fprintf(out,
            "size mix: seed %" PRIu64 ", period %zu requests, %zu distinct sizes in [%zu B, %zu MiB], %d common sizes "
            "(%d%% of requests), %.0f%% <= 1 MiB (cualloc's small pool), %.0f%% <= 32 KiB (jemalloc's thread cache), mean %.2f MiB, "
            "median %.1f KiB; %d slots\n",
            seed, SEQ_LEN, distinct, copy[0], copy[SEQ_LEN - 1] >> 20, MIX_COMMON, 100 - MIX_FRESH_PCT,
            100.0 * (double)small / SEQ_LEN, 100.0 * (double)tiny / SEQ_LEN, total / SEQ_LEN / (1 << 20),
            (double)copy[SEQ_LEN / 2] / 1024, SLOTS);
    free(copy);
}

int main(int argc, char **argv) {
    size_t pairs = 200000;
    int thread_list[2] = {1, 8}, nthread_list = 2;
    bool want_alloc[A_COUNT] = {true, true, false}, want_pat[P_COUNT] = {true, true, true, false}, json = false,
         quiet = false, pattern_given = false, pattern_all = false, turns = false;
    const char *trace_path = NULL;
    uint64_t seed = 20240611;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--turns")) turns = true;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--features")) { /* for bench/fastpath.sh */
            printf("cualloc null%s%s\n", HAVE_JEMALLOC_ ? " jemalloc" : "", HAVE_CALLGRIND_H_ ? " callgrind-markers" : "");
            return 0;
        }
        /* --pairs at most 2^40: the patterns round it up to whole steps or passes, which must
         * not wrap to 0 (a table of no pairs, "inf" ns each). */
        else if (v && !strcmp(a, "--pairs")) { if (!parse_size(v, &pairs) || pairs > ((size_t)1 << 40)) goto bad; i++; }
        else if (v && !strcmp(a, "--trace")) { trace_path = v; i++; }
        else if (v && !strcmp(a, "--seed")) { size_t s; if (!parse_size(v, &s)) goto bad; seed = s; i++; }
        else if (v && !strcmp(a, "--threads")) {
            size_t t;
            if (!parse_size(v, &t) || t > MAX_THREADS) goto bad;
            thread_list[0] = (int)t;
            nthread_list = 1;
            i++;
        } else if (v && !strcmp(a, "--allocator")) {
            memset(want_alloc, 0, sizeof want_alloc);
            if (!strcmp(v, "all")) want_alloc[A_CUALLOC] = want_alloc[A_JEMALLOC] = true;
            else {
                int k = -1;
                for (int j = 0; j < A_COUNT; j++) if (!strcmp(v, alloc_names[j])) k = j;
                if (k < 0) goto bad;
                want_alloc[k] = true;
            }
            i++;
        } else if (v && !strcmp(a, "--pattern")) {
            memset(want_pat, 0, sizeof want_pat);
            pattern_given = true;
            pattern_all = !strcmp(v, "all");
            if (pattern_all) want_pat[P_RANDOM] = want_pat[P_STACK] = want_pat[P_REPEAT] = want_pat[P_TRACE] = true;
            else {
                int k = -1;
                for (int j = 0; j < P_COUNT; j++) if (!strcmp(v, pattern_names[j])) k = j;
                if (k < 0) goto bad;
                want_pat[k] = true;
            }
            i++;
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "fastpath: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
        usage(stderr);
        return 2;
    }
#ifndef HAVE_JEMALLOC
    if (want_alloc[A_JEMALLOC]) {
        if (!quiet && !json) fprintf(stderr, "fastpath: built without jemalloc; its column is skipped\n");
        want_alloc[A_JEMALLOC] = false;
    }
#endif
    if (trace_path) {
        if (!pattern_given) memset(want_pat, 0, sizeof want_pat), want_pat[P_TRACE] = true;
        prog_load(trace_path);
    } else if (want_pat[P_TRACE]) {
        if (!pattern_all) {
            fprintf(stderr, "fastpath: --pattern trace needs --trace FILE\n");
            return 2;
        }
        want_pat[P_TRACE] = false; /* "all" without a trace */
    }
    /* The sim device, large enough that nothing is ever released under pressure: 64 GiB, or twice
     * what the trace keeps live at once on every thread. */
    if (!getenv("CUALLOC_CONF")) {
        int most_threads = thread_list[nthread_list - 1];
        uint64_t mb = trace_path ? (prog.peak_bytes >> 20) * 2 * (uint64_t)most_threads + 1024 : 0;
        char conf[64];
        snprintf(conf, sizeof conf, "driver:sim,sim_memory_mb:%" PRIu64, mb > 65536 ? mb : 65536);
        setenv("CUALLOC_CONF", conf, 1);
    }
    seq_build(seed);
    if (!quiet && !json) {
        if (want_pat[P_RANDOM] || want_pat[P_STACK] || want_pat[P_REPEAT]) describe_mix(stdout, seed);
        if (want_pat[P_TRACE]) describe_trace(stdout, trace_path);
        printf("CUALLOC_CONF=%s\n\n", getenv("CUALLOC_CONF"));
    }
    if (want_alloc[A_CUALLOC]) {
        void *p = cualloc_malloc(1, 0, NULL); /* start-up outside every measurement */
        if (!p) {
            fprintf(stderr, "fastpath: cualloc cannot allocate on device 0 (CUALLOC_CONF=%s)\n", getenv("CUALLOC_CONF"));
            return 1;
        }
        cualloc_free(p, NULL);
    }

    if (!json) {
        printf("%-9s %-7s %7s %10s %10s %13s %11s %s\n", "allocator", "pattern", "threads", "pairs", "ns/pair",
               "pairs/s", "instr/pair", "cualloc maps in timed loop (warm-up rounds)");
    } else {
        printf("[");
    }
    int nres = 0, unclean = 0;
    for (int ti = 0; ti < nthread_list; ti++) {
        for (int pi = 0; pi < P_COUNT; pi++) {
            if (!want_pat[pi]) continue;
            for (int ai = 0; ai < A_COUNT; ai++) {
                if (!want_alloc[ai]) continue;
                run_t r;
                memset(&r, 0, sizeof r);
                r.alloc = (alloc_kind_t)ai;
                r.pattern = (pattern_t)pi;
                r.threads = thread_list[ti];
                r.pairs = pairs;
                r.turns = turns;
                run_one(&r);
                uint64_t maps = r.have_stats ? r.after.num_maps - r.before.num_maps : 0;
                uint64_t retries = r.have_stats ? r.after.num_alloc_retries - r.before.num_alloc_retries : 0;
                uint64_t syncs = r.have_stats ? r.after.num_syncs - r.before.num_syncs : 0;
                uint64_t allocs = r.have_stats ? r.after.num_allocs - r.before.num_allocs : 0;
                if (r.have_stats && (maps || allocs != (uint64_t)r.pairs * (uint64_t)r.threads)) unclean++;
                if (json) {
                    printf("%s\n  {\"allocator\": \"%s\", \"pattern\": \"%s\", \"threads\": %d, \"pairs_per_thread\": %zu, "
                           "\"ns_per_pair\": %.2f, \"pairs_per_s\": %.0f, ",
                           nres ? "," : "", alloc_names[ai], pattern_names[pi], r.threads, r.pairs, r.ns_per_pair,
                           r.pairs_per_s);
                    if (r.instr_per_pair >= 0) printf("\"instructions_per_pair\": %.1f, ", r.instr_per_pair);
                    else printf("\"instructions_per_pair\": null, ");
                    printf("\"turns\": %s, \"warmup_rounds\": %d", turns ? "true" : "false", r.warm_rounds);
                    if (r.have_stats)
                        printf(", \"timed_num_maps\": %" PRIu64 ", \"timed_num_alloc_retries\": %" PRIu64
                               ", \"timed_num_syncs\": %" PRIu64 ", \"timed_num_allocs\": %" PRIu64 ", \"reserved_bytes\": %zu",
                               maps, retries, syncs, allocs, r.after.reserved_bytes);
                    printf("}");
                } else {
                    char instr[32] = "-", extra[96] = "";
                    if (r.instr_per_pair >= 0) snprintf(instr, sizeof instr, "%.0f", r.instr_per_pair);
                    if (r.have_stats)
                        snprintf(extra, sizeof extra, "%" PRIu64 " maps, %" PRIu64 " syncs (%d rounds, %zu MiB reserved)%s", maps,
                                 syncs, r.warm_rounds, r.after.reserved_bytes >> 20, maps ? "  NOT ALL CACHED" : "");
                    printf("%-9s %-7s %7d %10zu %10.1f %13.0f %11s %s\n", alloc_names[ai], pattern_names[pi], r.threads,
                           r.pairs * (size_t)r.threads, r.ns_per_pair, r.pairs_per_s, instr, extra);
                }
                fflush(stdout);
                nres++;
            }
        }
    }
    if (json) printf("\n]\n");
    else if (nthread_list == 1 ? thread_list[0] > 1 : true)
        printf("\nns/pair is per thread (each thread's own time over its pairs); pairs/s counts every thread.%s\n",
               turns ? "\nThe threads took turns (--turns): one ran at a time, a step each." : "");
    if (unclean) {
        fprintf(stderr, "fastpath: %d cualloc run(s) mapped memory during the timed loop: not all requests were cached\n", unclean);
        return 3;
    }
    return 0;
}
