/* testutil.h — the few helpers every test shares: failing assertions that say where, a seeded
 * random generator whose seed is printed (CUALLOC_SEED=N repeats a run), and sim-heap set-up. */
#ifndef CUALLOC_TESTUTIL_H
#define CUALLOC_TESTUTIL_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPECT(cond, ...)                                                           \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: expectation failed: %s\n  ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            abort();                                                                \
        }                                                                           \
    } while (0)

/* splitmix64: tiny, fast, good enough to drive property tests. */
typedef struct { uint64_t s; } rng_t;
static inline uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t rng_below(rng_t *r, uint64_t n) { return n ? rng_next(r) % n : 0; }
static inline double rng_unit(rng_t *r) { return (double)(rng_next(r) >> 11) / 9007199254740992.0; }

/* The seed: CUALLOC_SEED if set, else the clock; printed so a failure can be replayed. */
static inline uint64_t test_seed(const char *name) {
    const char *e = getenv("CUALLOC_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    printf("%s: seed %" PRIu64 " (repeat with CUALLOC_SEED=%" PRIu64 ")\n", name, seed, seed);
    fflush(stdout);
    return seed;
}

/* The process's address space in use now, from /proc/self/statm (its first field, in pages). */
static inline size_t test_address_space_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    EXPECT(f, "cannot read /proc/self/statm");
    unsigned long pages = 0;
    EXPECT(fscanf(f, "%lu", &pages) == 1, "cannot parse /proc/self/statm");
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* A request size drawn like a training job's tensors: log-uniform from 1 B to max_bytes, with a
 * bias toward a few recurring sizes (the same layer shapes come back every step). */
static inline size_t rng_tensor_size(rng_t *r, size_t max_bytes) {
    static const size_t common[] = {512, 4096, 3 * 1024 * 1024, 768 * 4 * 1024, 12 * 1024 * 1024, 65536};
    if (rng_below(r, 4) == 0) {
        size_t s = common[rng_below(r, sizeof common / sizeof common[0])];
        return s <= max_bytes ? s : max_bytes;
    }
    double lo = 0, hi = __builtin_log((double)max_bytes);
    size_t s = (size_t)__builtin_exp(lo + (hi - lo) * rng_unit(r));
    return s ? s : 1;
}

#ifdef CUALLOC_INTERNAL_H
/* White-box tests: a heap on device 0 of the sim device, configured by `text` (configuration keys,
 * over the defaults) into *c, which the caller keeps, making its driver calls through `ops` (the
 * sim's, or a copy with some wrapped; the caller keeps it). */
static inline heap_t *test_sim_heap_ops(const char *text, conf_t *c, const driver_ops_t *ops) {
    conf_defaults(c);
    c->driver = DRIVER_SIM;
    EXPECT(conf_parse(text, c) == 0, "bad configuration %s", text);
    sim_configure(c);
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    heap_t *h = heap_create(0, c, ops, NULL);
    EXPECT(h, "heap_create (%s)", text);
    return h;
}

static inline heap_t *test_sim_heap(const char *text, conf_t *c) { return test_sim_heap_ops(text, c, &driver_sim_ops); }

/* cua_error's lines, captured for the test to read: error_set_callback(test_capture, &buf). A line
 * that does not fit is dropped whole. */
typedef struct {
    char text[16384];
    size_t len;
} test_captured_t;
static inline void test_capture(const char *line, void *arg) {
    test_captured_t *c = arg;
    int n = snprintf(c->text + c->len, sizeof c->text - c->len, "%s\n", line);
    if (n > 0 && (size_t)n < sizeof c->text - c->len) c->len += (size_t)n;
    else c->text[c->len] = '\0';
}
#endif

#endif
