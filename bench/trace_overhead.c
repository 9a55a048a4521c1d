/* trace_overhead.c — what the trace recorder costs: nanoseconds added per cached alloc+free pair
 * with tracing on (16-frame stacks, the default) against tracing off, and the bytes each
 * allocation or free event takes in the file. A benchmark, not a test: it prints numbers (and
 * how many chunks the timed loops mapped: ideally 0, every pair served from the cache).
 *
 * Workload: 64 live slots; each pair frees a random slot and allocates a new size into it (a
 * seeded mix, 512 B .. 4 MiB, tensor-like); 8 call sites taken in turn, each reached through a
 * 20-deep recursion so every stack has its full 16 frames; two streams. Runs alternate off / on
 * (each `--runs` times, `--pairs` pairs each, after a warm-up) and the medians are compared.
 *
 * The recorder runs as on a GPU: the sim device normally gives traces a deterministic clock (for
 * reproducible tests); here the trace is started with the monotonic clock a real device gets, so
 * the clock read is in the cost and the time deltas in the bytes. The bytes come from reading the
 * traces back (tools/allocview/reader.c): ALLOC and FREE records only, definitions (stacks,
 * threads, streams, modules) excluded; they are reported separately.
 *
 * Instructions: bench/trace_overhead.sh runs this program under callgrind twice, collecting only
 * inside overhead_timed_off or only inside overhead_timed_on (the timed loops with tracing off and
 * on), and divides by the pairs: instructions per pair with and without the recorder, which repeat
 * where time does not.
 *
 * Usage: trace_overhead [--pairs N] [--runs R] [--depth D] [--dir DIR] [--json]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "reader.h"
#include "text.h"

#define SLOTS 64
#define SITES 8
#define SEQ 16384

static size_t sizes[SEQ];
static uint16_t slot_seq[SEQ];
static void *slots[SLOTS];
static size_t pos;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_state = 20240611;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One pair at call site `site`: free a slot, allocate into it. */
#define SITE(n)                                                                                \
    __attribute__((noinline)) static void site##n(void)                                       \
    {                                                                                          \
        size_t i = pos++ & (SEQ - 1);                                                          \
        unsigned k = slot_seq[i];                                                              \
        void *stream = (void *)(uintptr_t)(k & 1);                                             \
        cualloc_free(slots[k], stream);                                                        \
        slots[k] = cualloc_malloc(sizes[i], 0, stream);                                        \
        __asm__ volatile("" ::: "memory");                                                     \
    }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
static void (*const sites[SITES])(void) = {site0, site1, site2, site3, site4, site5, site6, site7};

__attribute__((noinline)) static void loop(uint64_t pairs)
{
    for (uint64_t p = 0; p < pairs; p++)
        sites[p & (SITES - 1)]();
}

/* Calls loop() from `depth` frames down, so the stacks below the call sites are full. */
__attribute__((noinline)) static void deep(int depth, uint64_t pairs)
{
    if (depth > 0)
        deep(depth - 1, pairs);
    else
        loop(pairs);
    __asm__ volatile("" ::: "memory");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t timed_maps; /* chunks mapped inside timed loops (the cache still growing) */

static double timed(uint64_t pairs)
{
    cualloc_stats before, after;
    cualloc_get_stats(0, &before);
    uint64_t t0 = now_ns();
    deep(20, pairs);
    uint64_t t1 = now_ns();
    cualloc_get_stats(0, &after);
    timed_maps += after.num_maps - before.num_maps;
    return (double)(t1 - t0) / (double)pairs;
}

/* The timed loops by name, tracing off and on: what callgrind's --toggle-collect selects (noipa: kept
 * apart, not folded into one function although their bodies are the same). */
__attribute__((noinline, noipa)) double overhead_timed_off(uint64_t pairs);
__attribute__((noinline, noipa)) double overhead_timed_on(uint64_t pairs);
double overhead_timed_off(uint64_t pairs) { return timed(pairs); }
double overhead_timed_on(uint64_t pairs) { return timed(pairs); }

typedef struct bytes_s {
    uint64_t alloc_bytes, allocs, free_bytes, frees, meta_bytes, other_event_bytes, stacks;
} bytes_t;

static void count_bytes(const char *path, bytes_t *b)
{
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "trace_overhead: %s: %s\n", path, err);
        exit(1);
    }
    tr_record_t rec;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        if (rec.type == CUA_TRACE_ALLOC) {
            b->alloc_bytes += rec.length;
            b->allocs++;
        } else if (rec.type == CUA_TRACE_FREE) {
            b->free_bytes += rec.length;
            b->frees++;
        } else if (rec.type < CUA_TRACE_FIRST_EVENT) {
            b->meta_bytes += rec.length;
        } else {
            b->other_event_bytes += rec.length;
        }
    }
    if (k < 0) {
        fprintf(stderr, "trace_overhead: %s: %s\n", path, tr_error(r));
        exit(1);
    }
    b->stacks += tr_stack_count(r);
    tr_close(r);
}

int main(int argc, char **argv)
{
    uint64_t pairs = 200000;
    int runs = 7;
    unsigned depth = 16;
    const char *dir = "/tmp";
    bool json = false;
    for (int i = 1; i < argc; i++) {
        unsigned long long v = 0;
        bool is_pairs = strcmp(argv[i], "--pairs") == 0, is_runs = strcmp(argv[i], "--runs") == 0,
             is_depth = strcmp(argv[i], "--depth") == 0;
        if ((is_pairs || is_runs || is_depth || strcmp(argv[i], "--dir") == 0) && i + 1 >= argc) {
            fprintf(stderr, "trace_overhead: %s needs a value\n", argv[i]);
            return 1;
        } else if (is_pairs || is_runs || is_depth) {
            /* --depth's bound is trace_stack_depth's: the recorder would cut a deeper one to 64
             * and the table would name the depth asked for. */
            unsigned long long lo = is_pairs ? SEQ : is_runs ? 1 : 0, hi = is_pairs ? 1ull << 40 : is_runs ? 99 : 64;
            if (!txt_parse_count(argv[i + 1], lo, hi, &v)) { /* digits only: atoi took "7x", strtoull "-1" */
                fprintf(stderr, "trace_overhead: bad %s '%s' (a number from %llu to %llu%s)\n", argv[i], argv[i + 1], lo,
                        hi, is_pairs ? ": at least one period of the request sequence" : "");
                return 1;
            }
            if (is_pairs)
                pairs = v;
            else if (is_runs)
                runs = (int)v;
            else
                depth = (unsigned)v;
            i++;
        } else if (strcmp(argv[i], "--dir") == 0)
            dir = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: trace_overhead [--pairs N] [--runs R] [--depth D] [--dir DIR] [--json]\n");
            return 0;
        } else {
            fprintf(stderr, "trace_overhead: unknown argument '%s'\n"
                            "usage: trace_overhead [--pairs N] [--runs R] [--depth D] [--dir DIR] [--json]\n", argv[i]);
            return 1;
        }
    }
    setenv("CUALLOC_CONF", "driver:sim,sim_memory_mb:65536", 1);
    /* A tensor-like mix, 512 B .. 4 MiB, log-uniform, with recurring shapes. */
    static const size_t common[] = {512, 4096, 65536, 768 * 4 * 1024, 1 << 20, 3 << 20, 12288, 196608};
    for (int i = 0; i < SEQ; i++) {
        if (rnd() % 4)
            sizes[i] = common[rnd() % 8];
        else
            sizes[i] = 512 + (size_t)(__builtin_exp((double)(rnd() % 1000) / 1000.0 * __builtin_log(4.0 * 1048576 / 512)) * 512);
        slot_seq[i] = (uint16_t)(rnd() % SLOTS);
    }
    for (int k = 0; k < SLOTS; k++)
        slots[k] = cualloc_malloc(4096, 0, NULL);
    /* Warm-up: the cache reaches its steady state; the trace's stack table too (untimed). */
    for (int quiet = 0, i = 0; quiet < 16 && i < 2000; i++) {
        cualloc_stats a, z;
        cualloc_get_stats(0, &a);
        deep(20, SEQ);
        cualloc_get_stats(0, &z);
        quiet = z.num_maps == a.num_maps ? quiet + 1 : 0;
        if (getenv("TRACE_OVERHEAD_DEBUG"))
            fprintf(stderr, "warm-up %d: maps %llu unmaps %llu reserved %zu\n", i, (unsigned long long)z.num_maps,
                    (unsigned long long)z.num_unmaps, z.reserved_bytes);
    }
    conf_t conf = *api_conf();
    conf.trace_stack_depth = depth;
    conf.driver = DRIVER_CUDA; /* the monotonic clock, as on a GPU (the heap keeps the sim) */

    double off[100], on[100];
    bytes_t b = {0};
    char path[512];
    for (int r = 0; r < runs; r++) {
        off[r] = overhead_timed_off(pairs);
        snprintf(path, sizeof path, "%s/cualloc-trace-overhead-%d-%d.trace", dir, (int)getpid(), r);
        if (api_trace_start(path, &conf) != 0)
            return 1;
        deep(20, SEQ); /* stacks defined, untimed */
        on[r] = overhead_timed_on(pairs);
        cualloc_trace_stop();
        count_bytes(path, &b);
        unlink(path);
    }
    double off_med = median(off, runs), on_med = median(on, runs);
    double alloc_avg = (double)b.alloc_bytes / (double)b.allocs, free_avg = (double)b.free_bytes / (double)b.frees;
    double event_avg = (double)(b.alloc_bytes + b.free_bytes) / (double)(b.allocs + b.frees);
    if (json) {
        printf("{\"pairs\": %" PRIu64 ", \"runs\": %d, \"stack_depth\": %u, \"ns_per_pair_off\": %.1f, "
               "\"ns_per_pair_on\": %.1f, \"ns_added_per_pair\": %.1f, \"bytes_per_alloc\": %.2f, "
               "\"bytes_per_free\": %.2f, \"bytes_per_event\": %.2f, \"definition_bytes_per_trace\": %.0f, "
               "\"stack_nodes_per_trace\": %.0f}\n",
               pairs, runs, depth, off_med, on_med, on_med - off_med, alloc_avg, free_avg, event_avg,
               (double)b.meta_bytes / runs, (double)b.stacks / runs);
        return 0;
    }
    printf("trace_overhead: %" PRIu64 " pairs x %d runs, stacks of %u native frames, 8 call sites, 2 streams\n", pairs,
           runs, depth);
    printf("  ns per alloc+free pair, tracing off : median %.1f  (runs:", off_med);
    for (int r = 0; r < runs; r++)
        printf(" %.1f", off[r]);
    printf(")\n  ns per alloc+free pair, tracing on  : median %.1f  (runs:", on_med);
    for (int r = 0; r < runs; r++)
        printf(" %.1f", on[r]);
    printf(")\n  added by tracing                    : %.1f ns per pair (median on - median off)\n", on_med - off_med);
    printf("  bytes per alloc record %.2f, per free record %.2f: %.2f per alloc/free event\n", alloc_avg, free_avg,
           event_avg);
    printf("  definitions (stacks, modules, threads, streams, process): %.0f bytes per trace, %.0f stack nodes\n",
           (double)b.meta_bytes / runs, (double)b.stacks / runs);
    printf("  chunks mapped inside the timed loops: %" PRIu64 " (0: every pair served from the cache)\n", timed_maps);
    return 0;
}
