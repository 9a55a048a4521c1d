/* test_api.c — black-box test of the public C API (include/cualloc.h) through libcualloc.so, on
 * the sim device with host backing (CUALLOC_CONF=driver:sim,sim_host_backed:1,sim_memory_mb:512),
 * so patterns can be written and read back through the returned pointers.
 *
 *   test_api            the caching allocator: round trips, alignment, size 0, cudaStreamPerThread,
 *                       stats, trim, check, OOM and recovery, free(NULL), foreign pointers, invalid
 *                       devices, and a fork while other threads map and unmap.
 *   test_api --disable  run with CUALLOC_DISABLE=1: allocations pass straight to the driver, so
 *                       they still work but no statistics move; a foreign pointer, a double
 *                       free and an invalid device are still reported.
 *   test_api --peers    two sim devices (sim_devices:2): cualloc_enable_peer_access_all.
 *
 * Only cualloc.h and libc are used; cualloc_check runs after every step.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cualloc.h"

#define MIB ((size_t)1 << 20)
#define DEV 0

static int failures;

#define EXPECT(cond, ...)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: expectation failed: %s\n  ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
            fflush(stderr);                                                                       \
            failures++;                                                                           \
            if (failures > 20) abort();                                                           \
        }                                                                                         \
    } while (0)

#define CHECK_HEAP(step)                                                                          \
    do {                                                                                          \
        int v_ = cualloc_check(DEV);                                                              \
        EXPECT(v_ == 0, "cualloc_check reported %d violation(s) after %s", v_, step);             \
    } while (0)

static cualloc_stats stats(void) {
    cualloc_stats s;
    memset(&s, 0xa5, sizeof s);
    int rc = cualloc_get_stats(DEV, &s);
    EXPECT(rc == 0, "cualloc_get_stats(%d) returned %d", DEV, rc);
    return s;
}

/* The invariants the header promises between the gauges. */
static void check_gauges(const char *when) {
    cualloc_stats s = stats();
    EXPECT(s.requested_bytes <= s.allocated_bytes, "%s: requested %zu > allocated %zu", when, s.requested_bytes,
           s.allocated_bytes);
    EXPECT(s.allocated_bytes <= s.active_bytes, "%s: allocated %zu > active %zu", when, s.allocated_bytes,
           s.active_bytes);
    EXPECT(s.allocated_bytes <= s.reserved_bytes, "%s: allocated %zu > reserved %zu", when, s.allocated_bytes,
           s.reserved_bytes);
    EXPECT(s.inactive_split_bytes <= s.reserved_bytes - s.allocated_bytes,
           "%s: inactive_split %zu > cached free %zu", when, s.inactive_split_bytes,
           s.reserved_bytes - s.allocated_bytes);
    EXPECT(s.requested_bytes <= s.requested_peak && s.allocated_bytes <= s.allocated_peak &&
               s.active_bytes <= s.active_peak && s.reserved_bytes <= s.reserved_peak &&
               s.inactive_split_bytes <= s.inactive_split_peak,
           "%s: a gauge exceeds its peak", when);
    EXPECT(s.reserved_bytes <= s.capacity_bytes, "%s: reserved %zu > capacity %zu", when, s.reserved_bytes,
           s.capacity_bytes);
    EXPECT(s.num_frees <= s.num_allocs, "%s: %llu frees > %llu allocs", when, (unsigned long long)s.num_frees,
           (unsigned long long)s.num_allocs);
    CHECK_HEAP(when);
}

static uint64_t rng_state = 12345;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static unsigned char pattern_byte(uint64_t seed, size_t i) {
    return (unsigned char)((seed * 131u) ^ (i * 7u) ^ (i >> 9));
}

static void fill(void *p, size_t n, uint64_t seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++) c[i] = pattern_byte(seed, i);
}

static bool verify(const void *p, size_t n, uint64_t seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != pattern_byte(seed, i)) {
            fprintf(stderr, "  byte %zu of %p (size %zu) is 0x%02x, expected 0x%02x\n", i, p, n, c[i],
                    pattern_byte(seed, i));
            return false;
        }
    return true;
}

/* Runs fn with stderr redirected to a temporary file; returns what was written (malloc'd). */
static char *capture_stderr(void (*fn)(void *), void *arg) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    if (!tmp) {
        perror("tmpfile");
        fn(arg);
        return NULL;
    }
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long len = ftell(tmp);
    if (len < 0) len = 0;
    rewind(tmp);
    char *buf = calloc((size_t)len + 1, 1);
    if (buf && len > 0 && fread(buf, 1, (size_t)len, tmp) != (size_t)len) buf[0] = '\0';
    fclose(tmp);
    return buf;
}

/* ------------------------------------------------------------------ caching mode */

/* Asked before any allocation (so before the device has a heap): the diagnosis the request would
 * get, not "could not set up a heap" (which it said, with nothing on stderr to explain it). */
static void test_oom_message_first(void) {
    char buf[2048];
    /* Before the device's heap exists its statistics are all zero, capacity included (cualloc.h). */
    cualloc_stats s, zero;
    memset(&zero, 0, sizeof zero);
    EXPECT(cualloc_get_stats(0, &s) == 0 && memcmp(&s, &zero, sizeof s) == 0 && s.capacity_bytes == 0,
           "stats before any allocation: capacity %zu, reserved %zu", s.capacity_bytes, s.reserved_bytes);
    EXPECT(cualloc_oom_message(SIZE_MAX, 0, buf, sizeof buf) == 0, "cualloc_oom_message");
    EXPECT(strncmp(buf, "CUDA out of memory", 18) == 0 && strstr(buf, "genuine shortage") &&
               !strstr(buf, "could not set up"),
           "before any allocation: %s", buf);
    /* A request the heap would serve now, asked of before anything failed: no failure is made up. */
    EXPECT(cualloc_oom_message(64 << 20, 0, buf, sizeof buf) == 0 && strstr(buf, "Diagnosis: none yet") &&
               !strstr(buf, "failed and the device"),
           "a request that would be served: %s", buf);
    /* The message made the heap, as the request would have: the capacity is known now. */
    EXPECT(cualloc_get_stats(0, &s) == 0 && s.capacity_bytes > 0, "stats after the heap is made: capacity 0");
}

static void test_round_trip(void) {
    enum { N = 200 };
    void *ptrs[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        /* 1 B .. 4 MiB, log-spread, with a few exact powers of two */
        size_t s = (size_t)1 << (rng_next() % 23);
        s += rng_next() % s;
        if (i % 7 == 0) s = (size_t)1 << (i % 22);
        sizes[i] = s;
        ptrs[i] = cualloc_malloc(s, DEV, NULL);
        EXPECT(ptrs[i] != NULL, "cualloc_malloc(%zu) returned NULL", s);
        if (!ptrs[i]) continue;
        EXPECT(((uintptr_t)ptrs[i] & 255) == 0, "pointer %p for %zu B is not 256-byte aligned", ptrs[i], s);
        fill(ptrs[i], s, (uint64_t)i);
    }
    CHECK_HEAP("200 allocations");
    /* every block still holds its own pattern: nothing overlaps */
    for (int i = 0; i < N; i++)
        if (ptrs[i]) EXPECT(verify(ptrs[i], sizes[i], (uint64_t)i), "pattern of allocation %d (%zu B) damaged", i, sizes[i]);
    /* free every other one, reallocate, and check again */
    for (int i = 0; i < N; i += 2) {
        cualloc_free(ptrs[i], NULL);
        ptrs[i] = cualloc_malloc(sizes[i], DEV, NULL);
        EXPECT(ptrs[i] != NULL, "re-allocation of %zu B failed", sizes[i]);
        if (ptrs[i]) fill(ptrs[i], sizes[i], (uint64_t)i + 1000);
    }
    CHECK_HEAP("reallocating half");
    for (int i = 0; i < N; i++)
        if (ptrs[i])
            EXPECT(verify(ptrs[i], sizes[i], (uint64_t)(i % 2 == 0 ? i + 1000 : i)),
                   "pattern of allocation %d (%zu B) damaged after reallocation", i, sizes[i]);
    for (int i = 0; i < N; i++) cualloc_free(ptrs[i], NULL);
    check_gauges("round trip");
}

static void test_alignment(void) {
    static const size_t sizes[] = {1, 3, 255, 256, 257, 511, 512, 513, 1000, 4095, 65537, 1048575, 1048576,
                                   1048577, 2097151, 3 * MIB + 7, 20 * MIB + 1};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        p[i] = cualloc_malloc(sizes[i], DEV, NULL);
        EXPECT(p[i] && ((uintptr_t)p[i] % 256) == 0, "cualloc_malloc(%zu) = %p: not 256-byte aligned", sizes[i], p[i]);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) cualloc_free(p[i], NULL);
    CHECK_HEAP("alignment");
}

static void test_size_zero(void) {
    enum { N = 16 };
    void *p[N];
    cualloc_stats before = stats();
    for (int i = 0; i < N; i++) {
        p[i] = cualloc_malloc(0, DEV, NULL);
        EXPECT(p[i] != NULL, "cualloc_malloc(0) returned NULL");
        for (int j = 0; j < i; j++) EXPECT(p[i] != p[j], "cualloc_malloc(0) returned %p twice", p[i]);
    }
    cualloc_stats mid = stats();
    EXPECT(mid.num_allocs == before.num_allocs + N, "num_allocs moved by %llu for %d size-0 allocations",
           (unsigned long long)(mid.num_allocs - before.num_allocs), N);
    EXPECT(mid.requested_bytes == before.requested_bytes, "size 0 changed requested_bytes by %zu",
           mid.requested_bytes - before.requested_bytes);
    CHECK_HEAP("size-0 allocations");
    for (int i = 0; i < N; i++) cualloc_free(p[i], NULL);
    cualloc_stats after = stats();
    EXPECT(after.num_frees == before.num_frees + N, "num_frees moved by %llu for %d frees",
           (unsigned long long)(after.num_frees - before.num_frees), N);
    EXPECT(after.allocated_bytes == before.allocated_bytes, "allocated %zu after freeing size-0 blocks, was %zu",
           after.allocated_bytes, before.allocated_bytes);
    check_gauges("size 0");
}

/* cudaStreamPerThread (0x2) names the calling thread's own default stream, a different stream in
 * every thread: a block one thread freed on it must not go at once to another thread's, whose work
 * is not ordered after the first thread's (nothing short of memory here, so no event has shown the
 * device past the free). */
#define STREAM_PER_THREAD ((void *)(uintptr_t)0x2)

static void *per_thread_alloc_free(void *arg) {
    (void)arg;
    void *p = cualloc_malloc(MIB, DEV, STREAM_PER_THREAD);
    if (p) memset(p, 0x5a, MIB);
    cualloc_free(p, STREAM_PER_THREAD);
    return p;
}

static void test_per_thread_stream(void) {
    pthread_t t;
    void *freed = NULL;
    EXPECT(pthread_create(&t, NULL, per_thread_alloc_free, NULL) == 0 && pthread_join(t, &freed) == 0 && freed,
           "another thread's allocation on cudaStreamPerThread");
    void *mine = cualloc_malloc(MIB, DEV, STREAM_PER_THREAD);
    EXPECT(mine && mine != freed,
           "cualloc_malloc(cudaStreamPerThread) = %p: the block another thread freed on its own per-thread stream "
           "(%p), handed out at once", mine, freed);
    cualloc_free(mine, STREAM_PER_THREAD);
    CHECK_HEAP("per-thread stream");
    check_gauges("per-thread stream");
}

static void test_stats(void) {
    cualloc_stats s0 = stats();
    EXPECT(s0.requested_bytes == 0 && s0.allocated_bytes == 0, "live bytes at start: requested %zu allocated %zu",
           s0.requested_bytes, s0.allocated_bytes);

    const size_t a_size = 3 * MIB + 100, b_size = 1000, c_size = 40 * MIB;
    void *a = cualloc_malloc(a_size, DEV, NULL);
    cualloc_stats s1 = stats();
    EXPECT(a != NULL, "malloc a");
    EXPECT(s1.requested_bytes == s0.requested_bytes + a_size, "requested %zu after +%zu (was %zu)",
           s1.requested_bytes, a_size, s0.requested_bytes);
    EXPECT(s1.allocated_bytes >= s0.allocated_bytes + a_size && s1.allocated_bytes % 512 == 0 &&
               s1.allocated_bytes - s0.allocated_bytes < a_size + 512,
           "allocated %zu after a %zu B request (512 B rounding expected)", s1.allocated_bytes, a_size);
    EXPECT(s1.capacity_bytes > 0 && s1.capacity_bytes <= 512 * MIB, "capacity %zu for a 512 MiB sim device",
           s1.capacity_bytes);
    EXPECT(s1.reserved_bytes >= s1.allocated_bytes, "reserved %zu < allocated %zu", s1.reserved_bytes,
           s1.allocated_bytes);
    EXPECT(s1.num_allocs == s0.num_allocs + 1, "num_allocs %llu -> %llu", (unsigned long long)s0.num_allocs,
           (unsigned long long)s1.num_allocs);
    EXPECT(s1.num_maps > s0.num_maps, "no map counted for the first allocation (maps %llu)",
           (unsigned long long)s1.num_maps);
    EXPECT(s1.requested_peak >= s1.requested_bytes && s1.allocated_peak >= s1.allocated_bytes &&
               s1.reserved_peak >= s1.reserved_bytes,
           "peaks below current");
    check_gauges("one allocation");

    void *b = cualloc_malloc(b_size, DEV, NULL);
    void *c = cualloc_malloc(c_size, DEV, NULL);
    EXPECT(b && c, "malloc b, c");
    cualloc_stats s2 = stats();
    size_t live_req = a_size + b_size + c_size;
    EXPECT(s2.requested_bytes == s0.requested_bytes + live_req, "requested %zu, expected %zu", s2.requested_bytes,
           s0.requested_bytes + live_req);
    EXPECT(s2.allocated_bytes == s0.allocated_bytes + ((a_size + 511) / 512 + (b_size + 511) / 512 + (c_size + 511) / 512) * 512,
           "allocated %zu: not the 512 B-rounded sum", s2.allocated_bytes);
    EXPECT(s2.num_allocs == s0.num_allocs + 3, "num_allocs");
    check_gauges("three allocations");

    cualloc_free(c, NULL);
    cualloc_stats s3 = stats();
    EXPECT(s3.requested_bytes == s2.requested_bytes - c_size, "requested %zu after freeing %zu (was %zu)",
           s3.requested_bytes, c_size, s2.requested_bytes);
    EXPECT(s3.allocated_bytes == s2.allocated_bytes - c_size, "allocated %zu after freeing c (was %zu)",
           s3.allocated_bytes, s2.allocated_bytes);
    EXPECT(s3.reserved_bytes == s2.reserved_bytes, "a free changed reserved %zu -> %zu (should be cached)",
           s2.reserved_bytes, s3.reserved_bytes);
    EXPECT(s3.requested_peak == s2.requested_peak && s3.allocated_peak == s2.allocated_peak &&
               s3.reserved_peak == s2.reserved_peak,
           "a free moved a peak");
    EXPECT(s3.requested_peak >= s0.requested_bytes + live_req, "requested_peak %zu < %zu", s3.requested_peak,
           s0.requested_bytes + live_req);
    EXPECT(s3.num_frees == s2.num_frees + 1, "num_frees");
    check_gauges("a free");

    cualloc_free(a, NULL);
    cualloc_free(b, NULL);
    cualloc_stats s4 = stats();
    EXPECT(s4.requested_bytes == s0.requested_bytes && s4.allocated_bytes == s0.allocated_bytes,
           "live bytes after freeing everything: requested %zu allocated %zu", s4.requested_bytes, s4.allocated_bytes);
    EXPECT(s4.num_frees == s0.num_frees + 3, "num_frees %llu -> %llu", (unsigned long long)s0.num_frees,
           (unsigned long long)s4.num_frees);
    EXPECT(s4.active_bytes == 0, "active %zu with nothing live on the legacy stream", s4.active_bytes);
    check_gauges("freeing everything");
}

/* cualloc_reset_peaks: every peak comes down to its gauge, and later peaks count from there. */
static void test_reset_peaks(void) {
    void *big = cualloc_malloc(64 * MIB, DEV, NULL), *small = cualloc_malloc(MIB, DEV, NULL);
    EXPECT(big && small, "two allocations");
    cualloc_free(big, NULL);
    cualloc_stats s0 = stats();
    EXPECT(s0.allocated_peak >= 65 * MIB && s0.allocated_bytes < s0.allocated_peak, "peak %zu before the reset",
           s0.allocated_peak);
    EXPECT(cualloc_reset_peaks(DEV) == 0, "cualloc_reset_peaks");
    cualloc_stats s1 = stats();
    EXPECT(s1.requested_peak == s1.requested_bytes && s1.allocated_peak == s1.allocated_bytes &&
               s1.active_peak == s1.active_bytes && s1.reserved_peak == s1.reserved_bytes &&
               s1.inactive_split_peak == s1.inactive_split_bytes,
           "after the reset: allocated %zu / peak %zu, reserved %zu / peak %zu", s1.allocated_bytes, s1.allocated_peak,
           s1.reserved_bytes, s1.reserved_peak);
    EXPECT(s1.num_allocs == s0.num_allocs && s1.num_frees == s0.num_frees, "the counters moved");
    void *again = cualloc_malloc(4 * MIB, DEV, NULL);
    cualloc_free(again, NULL);
    cualloc_stats s2 = stats();
    EXPECT(s2.allocated_peak == s1.allocated_bytes + 4 * MIB, "peak %zu after a 4 MiB allocation, want %zu",
           s2.allocated_peak, s1.allocated_bytes + 4 * MIB);
    cualloc_free(small, NULL);
    EXPECT(cualloc_reset_peaks(-1) == -1 && cualloc_reset_peaks(1) == -1, "reset on an invalid device");
    check_gauges("reset peaks");
}

static void test_trim(void) {
    void *p[8];
    for (int i = 0; i < 8; i++) p[i] = cualloc_malloc((size_t)(i + 1) * 3 * MIB + (size_t)i * 1000, DEV, NULL);
    void *small[32];
    for (int i = 0; i < 32; i++) small[i] = cualloc_malloc(4096 + (size_t)i * 512, DEV, NULL);
    for (int i = 0; i < 8; i++) cualloc_free(p[i], NULL);
    for (int i = 0; i < 32; i++) cualloc_free(small[i], NULL);
    cualloc_stats s0 = stats();
    EXPECT(s0.allocated_bytes == 0, "allocated %zu with nothing live", s0.allocated_bytes);
    EXPECT(s0.reserved_bytes > 0, "nothing cached before the trim (reserved 0)");
    cualloc_trim(DEV);
    cualloc_stats s1 = stats();
    EXPECT(s1.reserved_bytes == 0, "reserved %zu after cualloc_trim with nothing live", s1.reserved_bytes);
    EXPECT(s1.inactive_split_bytes == 0, "inactive_split %zu after trim", s1.inactive_split_bytes);
    EXPECT(s1.num_trims == s0.num_trims + 1, "num_trims %llu -> %llu", (unsigned long long)s0.num_trims,
           (unsigned long long)s1.num_trims);
    EXPECT(s1.num_unmaps > s0.num_unmaps, "trim unmapped nothing (%llu unmaps)", (unsigned long long)s1.num_unmaps);
    EXPECT(s1.reserved_peak == s0.reserved_peak, "trim moved reserved_peak");
    check_gauges("trim");
    /* the heap grows again after a trim */
    void *q = cualloc_malloc(5 * MIB, DEV, NULL);
    EXPECT(q != NULL, "allocation after trim failed");
    if (q) {
        fill(q, 5 * MIB, 77);
        EXPECT(verify(q, 5 * MIB, 77), "pattern after trim");
    }
    cualloc_free(q, NULL);
    cualloc_trim(DEV);
    EXPECT(stats().reserved_bytes == 0, "reserved after second trim");
    check_gauges("allocation after trim");
}

static void test_oom(void) {
    cualloc_stats s0 = stats();
    void *p = cualloc_malloc((size_t)1 << 40, DEV, NULL); /* 1 TiB on a 512 MiB device */
    EXPECT(p == NULL, "a 1 TiB allocation on a 512 MiB device returned %p", p);
    cualloc_stats s1 = stats();
    EXPECT(s1.num_ooms == s0.num_ooms + 1, "num_ooms %llu -> %llu", (unsigned long long)s0.num_ooms,
           (unsigned long long)s1.num_ooms);
    EXPECT(s1.num_allocs == s0.num_allocs, "a failed allocation counted in num_allocs");
    EXPECT(s1.requested_bytes == s0.requested_bytes && s1.allocated_bytes == s0.allocated_bytes,
           "a failed allocation moved the live gauges");
    check_gauges("1 TiB OOM");
    p = cualloc_malloc(SIZE_MAX - 4096, DEV, NULL);
    EXPECT(p == NULL, "a SIZE_MAX-ish allocation returned %p", p);
    EXPECT(stats().num_ooms == s0.num_ooms + 2, "num_ooms after the SIZE_MAX request");
    check_gauges("SIZE_MAX OOM");

    /* the heap still works afterwards */
    void *q = cualloc_malloc(8 * MIB, DEV, NULL);
    EXPECT(q != NULL, "allocation after OOM failed");
    if (q) {
        fill(q, 8 * MIB, 5);
        EXPECT(verify(q, 8 * MIB, 5), "pattern after OOM");
    }
    /* a request that only fits once q is gone, then after */
    void *big = cualloc_malloc(508 * MIB, DEV, NULL);
    EXPECT(big == NULL, "508 MiB fit beside 8 MiB on a 512 MiB device");
    cualloc_free(q, NULL);
    big = cualloc_malloc(400 * MIB, DEV, NULL);
    EXPECT(big != NULL, "400 MiB did not fit on an empty 512 MiB device");
    if (big) {
        fill(big, 400 * MIB, 9);
        EXPECT(verify(big, 400 * MIB, 9), "pattern of the 400 MiB block");
    }
    cualloc_free(big, NULL);
    check_gauges("allocations after OOM");
}

/* Memory cached by one pool must be released for another when the device is full. */
static void test_cache_release_under_pressure(void) {
    enum { N = 400 };
    static void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = cualloc_malloc(MIB - 512, DEV, NULL); /* small-pool requests */
        EXPECT(p[i] != NULL, "small allocation %d failed", i);
    }
    CHECK_HEAP("400 small blocks");
    for (int i = 0; i < N; i++) cualloc_free(p[i], NULL);
    cualloc_stats s0 = stats();
    void *big = cualloc_malloc(450 * MIB, DEV, NULL);
    EXPECT(big != NULL, "450 MiB failed with %zu B cached free on a 512 MiB device", s0.reserved_bytes);
    if (big) {
        fill(big, 450 * MIB, 11);
        EXPECT(verify(big, 450 * MIB, 11), "pattern of the 450 MiB block");
    }
    cualloc_free(big, NULL);
    cualloc_trim(DEV);
    check_gauges("cache release under pressure");
}

static void free_null(void *arg) {
    (void)arg;
    cualloc_free(NULL, NULL);
}

static void free_foreign(void *arg) { cualloc_free(arg, NULL); }

/* cualloc_trim on the device arg holds (an int in the pointer). */
static void trim_device(void *arg) { cualloc_trim((int)(intptr_t)arg); }

/* cualloc_malloc(100) on the device arg holds (an int in the pointer); must return NULL. */
static void malloc_device(void *arg) {
    int device = (int)(intptr_t)arg;
    void *p = cualloc_malloc(100, device, NULL);
    EXPECT(p == NULL, "cualloc_malloc on device %d returned %p", device, p);
}

static void test_free_null_and_foreign(void) {
    cualloc_stats s0 = stats();
    char *out = capture_stderr(free_null, NULL);
    EXPECT(out && out[0] == '\0', "cualloc_free(NULL) printed: %s", out ? out : "(capture failed)");
    free(out);
    cualloc_stats s1 = stats();
    EXPECT(s1.num_frees == s0.num_frees, "cualloc_free(NULL) counted as a free");

    int local = 0;
    static char global_buf[4096];
    void *heap_ptr = malloc(1000);
    void *foreign[] = {&local, global_buf + 512, heap_ptr, (void *)(uintptr_t)0x1000, (void *)(uintptr_t)-4096};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        out = capture_stderr(free_foreign, foreign[i]);
        EXPECT(out && strstr(out, "cualloc") != NULL, "freeing foreign pointer %p printed no cualloc message: '%s'",
               foreign[i], out ? out : "(capture failed)");
        free(out);
    }
    free(heap_ptr);
    /* a pointer inside a live block, and a double free */
    char *p = cualloc_malloc(4096, DEV, NULL);
    EXPECT(p != NULL, "malloc");
    if (p) {
        out = capture_stderr(free_foreign, p + 512);
        EXPECT(out && strstr(out, "cualloc") != NULL, "freeing an interior pointer printed nothing");
        free(out);
        fill(p, 4096, 3);
        EXPECT(verify(p, 4096, 3), "block usable after a bad free of its interior");
        cualloc_free(p, NULL);
        out = capture_stderr(free_foreign, p);
        EXPECT(out && strstr(out, "cualloc") != NULL, "a double free printed nothing");
        free(out);
    }
    cualloc_stats s2 = stats();
    EXPECT(s2.num_frees == s1.num_frees + 1, "bad frees counted: num_frees %llu -> %llu",
           (unsigned long long)s1.num_frees, (unsigned long long)s2.num_frees);
    check_gauges("foreign frees");
}

static void test_invalid_device(void) {
    cualloc_stats s;
    EXPECT(cualloc_get_stats(-1, &s) == -1, "cualloc_get_stats(-1) did not return -1");
    EXPECT(cualloc_get_stats(1, &s) == -1, "cualloc_get_stats(1) on a one-device sim did not return -1");
    EXPECT(cualloc_get_stats(64, &s) == -1, "cualloc_get_stats(64) did not return -1");
    EXPECT(cualloc_get_stats(1 << 30, &s) == -1, "cualloc_get_stats(2^30) did not return -1");
    EXPECT(cualloc_get_stats(DEV, NULL) == -1, "cualloc_get_stats(0, NULL) did not return -1");
    fflush(stderr);
    EXPECT(cualloc_malloc(100, 1, NULL) == NULL, "cualloc_malloc on device 1 of a one-device sim succeeded");
    EXPECT(cualloc_malloc(100, -1, NULL) == NULL, "cualloc_malloc on device -1 succeeded");
    /* No-ops, each named on stderr (they were silent), as for cualloc_malloc. */
    for (int d = -1; d <= 7; d += 8) {
        char *out = capture_stderr(trim_device, (void *)(intptr_t)d);
        char want[64];
        snprintf(want, sizeof want, "cualloc_trim: device %d is not valid", d);
        EXPECT(out && strstr(out, want), "cualloc_trim(%d) printed '%s'", d, out ? out : "(capture failed)");
        free(out);
    }
    EXPECT(cualloc_check(5) == -1, "cualloc_check on an invalid device did not return -1");
    check_gauges("invalid devices");
}

/* One device: no pair to enable. */
/* fork while other threads allocate: the child starts cualloc afresh (new heaps, a new device
 * configuration), so no lock a parent thread held at the fork may stay held in its copy. Two
 * threads map and unmap without pause (a 64 MiB allocation after a trim maps 32 chunks), so the
 * device's own lock (the sim's) is held most of the time; each child allocates once and exits.
 * A child that has not exited 10 s after the fork is taken as hung on an inherited lock. */
static int churn_stop; /* atomic */

static void *churn(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&churn_stop, __ATOMIC_RELAXED)) {
        void *p = cualloc_malloc(64 * MIB, DEV, NULL);
        if (p) cualloc_free(p, NULL);
        cualloc_trim(DEV);
    }
    return NULL;
}

static void test_fork_while_mapping(void) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) EXPECT(pthread_create(&t[i], NULL, churn, NULL) == 0, "pthread_create");
    int hung = 0, failed = 0;
    for (int k = 0; k < 40 && hung == 0; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *p = cualloc_malloc(MIB, DEV, NULL);
            if (p) cualloc_free(p, NULL);
            _exit(p ? 0 : 1);
        }
        EXPECT(pid > 0, "fork");
        if (pid <= 0) break;
        int status = 0;
        pid_t got = 0;
        for (int ms = 0; ms < 10000 && (got = waitpid(pid, &status, WNOHANG)) == 0; ms++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (got == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            hung++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    EXPECT(hung == 0, "a child forked while other threads mapped memory did not exit within 10 s (a lock held "
           "at the fork stayed held in it)");
    EXPECT(failed == 0, "%d forked children could not allocate", failed);
    CHECK_HEAP("after the forks");
}

static void test_peer_access_one_device(void) {
    EXPECT(cualloc_enable_peer_access_all() == 0, "cualloc_enable_peer_access_all with one device");
    CHECK_HEAP("peer access, one device");
}

/* ------------------------------------------------------------------ two devices (--peers) */

/* Run with sim_devices:2: both directions are enabled, again on a second call (idempotent), with
 * memory mapped on both devices before and after; the heaps stay consistent and keep serving.
 * Device 1's heap is made first, so the frees' list of heaps is not in device order: every free
 * must still reach its own device's heap (its counters say). */
/* Run with every chunk after the first refused with CUDA_ERROR_ILLEGAL_ADDRESS (sim_fail ...=700):
 * the failed request's message says it is a CUDA error, not out of memory, in the words PyTorch's own
 * CUDA errors begin with, so that code retrying a smaller batch on an OOM does not take it for one. */
static int run_driver_error(void) {
    void *warm = cualloc_malloc(4096, DEV, NULL);
    EXPECT(warm != NULL, "the first chunk is mapped");
    EXPECT(cualloc_malloc(64 << 20, DEV, NULL) == NULL, "64 MiB with chunks refused");
    char buf[2048];
    EXPECT(cualloc_oom_message(64 << 20, DEV, buf, sizeof buf) == 0, "cualloc_oom_message");
    EXPECT(strncmp(buf, "CUDA error: CUDA_ERROR_ILLEGAL_ADDRESS (700) while cualloc allocated 64.00 MiB", 78) == 0 &&
               strstr(buf, "not out of memory") && strstr(buf, "Diagnosis: not a shortage of memory") &&
               !strstr(buf, "CUDA out of memory"),
           "the message: %s", buf);
    cualloc_stats s;
    EXPECT(cualloc_get_stats(DEV, &s) == 0 && s.num_ooms == 1, "num_ooms %llu", (unsigned long long)s.num_ooms);
    cualloc_free(warm, NULL);
    if (failures) return 1;
    printf("test_api --driver-error: all checks passed\n");
    return 0;
}

static int run_peers(void) {
    void *before[2], *after[2];
    for (int d = 1; d >= 0; d--) {
        before[d] = cualloc_malloc(3 * MIB, d, NULL);
        EXPECT(before[d] != NULL, "allocation on device %d", d);
        if (before[d]) fill(before[d], 3 * MIB, (uint64_t)d);
    }
    EXPECT(cualloc_enable_peer_access_all() == 2, "cualloc_enable_peer_access_all with two devices: want 2 pairs");
    EXPECT(cualloc_enable_peer_access_all() == 2, "a second call: want 2 pairs again");
    for (int d = 0; d < 2; d++) {
        after[d] = cualloc_malloc(5 * MIB, d, NULL);
        EXPECT(after[d] != NULL, "allocation on device %d after enabling peers", d);
        if (before[d]) EXPECT(verify(before[d], 3 * MIB, (uint64_t)d), "device %d's block kept its contents", d);
        EXPECT(cualloc_check(d) == 0, "cualloc_check(%d) after enabling peers", d);
        cualloc_free(before[d], NULL);
        cualloc_free(after[d], NULL);
    }
    for (int d = 0; d < 2; d++) {
        cualloc_stats st;
        EXPECT(cualloc_get_stats(d, &st) == 0, "cualloc_get_stats(%d)", d);
        EXPECT(st.num_allocs == 2 && st.num_frees == 2 && st.allocated_bytes == 0,
               "device %d: %llu allocs, %llu frees, %llu bytes allocated; want 2, 2, 0", d,
               (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees,
               (unsigned long long)st.allocated_bytes);
    }
    if (failures) fprintf(stderr, "test_api --peers: %d failure(s)\n", failures);
    else printf("test_api --peers: ok\n");
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ CUALLOC_DISABLE=1 */

static int run_disabled(void) {
    const char *d = getenv("CUALLOC_DISABLE");
    if (!d || strcmp(d, "1") != 0) {
        fprintf(stderr, "test_api --disable must run with CUALLOC_DISABLE=1\n");
        return 1;
    }
    void *p[16];
    for (int i = 0; i < 16; i++) {
        size_t s = (size_t)(i + 1) * 100000;
        p[i] = cualloc_malloc(s, DEV, NULL);
        EXPECT(p[i] != NULL, "pass-through cualloc_malloc(%zu) returned NULL", s);
        if (p[i]) fill(p[i], s, (uint64_t)i);
    }
    for (int i = 0; i < 16; i++)
        if (p[i]) EXPECT(verify(p[i], (size_t)(i + 1) * 100000, (uint64_t)i), "pass-through pattern %d", i);
    void *z = cualloc_malloc(0, DEV, NULL);
    EXPECT(z != NULL, "pass-through cualloc_malloc(0) returned NULL");
    cualloc_stats s;
    EXPECT(cualloc_get_stats(DEV, &s) == 0, "cualloc_get_stats in disabled mode");
    EXPECT(s.num_allocs == 0 && s.requested_bytes == 0 && s.allocated_bytes == 0 && s.reserved_bytes == 0,
           "disabled mode moved statistics: num_allocs %llu requested %zu allocated %zu reserved %zu",
           (unsigned long long)s.num_allocs, s.requested_bytes, s.allocated_bytes, s.reserved_bytes);
    for (int i = 0; i < 16; i++) cualloc_free(p[i], NULL);
    cualloc_free(z, NULL);
    cualloc_free(NULL, NULL);
    EXPECT(cualloc_get_stats(DEV, &s) == 0 && s.num_allocs == 0 && s.num_frees == 0,
           "disabled mode counted allocations or frees");
    /* memory really went back: the whole device can be allocated again, several times */
    for (int round = 0; round < 4; round++) {
        void *big = cualloc_malloc(400 * MIB, DEV, NULL);
        EXPECT(big != NULL, "pass-through 400 MiB failed in round %d (frees not passed through?)", round);
        cualloc_free(big, NULL);
    }
    EXPECT(cualloc_get_stats(1, &s) == -1, "cualloc_get_stats(1) in disabled mode");
    EXPECT(cualloc_check(DEV) == 0, "cualloc_check in disabled mode");
    /* Bad input is reported here too, as cualloc.h says (both were silent): a pointer the driver
     * does not know (foreign, or freed already), and an invalid device. */
    int local = 0;
    char *out = capture_stderr(free_foreign, &local);
    EXPECT(out && strstr(out, "cualloc_free") != NULL, "disabled: freeing a foreign pointer printed: '%s'",
           out ? out : "(capture failed)");
    free(out);
    void *once = cualloc_malloc(4096, DEV, NULL);
    EXPECT(once != NULL, "pass-through cualloc_malloc(4096)");
    cualloc_free(once, NULL);
    out = capture_stderr(free_foreign, once);
    EXPECT(out && strstr(out, "cualloc_free") != NULL, "disabled: a double free printed: '%s'",
           out ? out : "(capture failed)");
    free(out);
    out = capture_stderr(malloc_device, (void *)(intptr_t)1);
    EXPECT(out && strstr(out, "device 1 is not valid") != NULL,
           "disabled: cualloc_malloc on device 1 of a one-device sim printed: '%s'", out ? out : "(capture failed)");
    free(out);
    out = capture_stderr(malloc_device, (void *)(intptr_t)-1);
    EXPECT(out && strstr(out, "device -1 is not valid") != NULL, "disabled: cualloc_malloc on device -1 printed: '%s'",
           out ? out : "(capture failed)");
    free(out);
    if (failures) fprintf(stderr, "test_api --disable: %d failure(s)\n", failures);
    else printf("test_api --disable: ok\n");
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--disable") == 0) return run_disabled();
    if (argc > 1 && strcmp(argv[1], "--peers") == 0) return run_peers();
    if (argc > 1 && strcmp(argv[1], "--driver-error") == 0) return run_driver_error();
    const char *conf = getenv("CUALLOC_CONF");
    if (!conf || !strstr(conf, "sim_host_backed:1")) {
        fprintf(stderr, "test_api needs CUALLOC_CONF=driver:sim,sim_host_backed:1,sim_memory_mb:512 (got %s)\n",
                conf ? conf : "nothing");
        return 1;
    }
    static const struct { const char *name; void (*fn)(void); } tests[] = {
        {"oom message before any allocation", test_oom_message_first}, /* first: no heap yet */
        {"stats", test_stats},
        {"round trip", test_round_trip},
        {"alignment", test_alignment},
        {"size 0", test_size_zero},
        {"per-thread stream", test_per_thread_stream},
        {"reset peaks", test_reset_peaks},
        {"trim", test_trim},
        {"oom", test_oom},
        {"cache release under pressure", test_cache_release_under_pressure},
        {"free NULL and foreign pointers", test_free_null_and_foreign},
        {"invalid device", test_invalid_device},
        {"peer access, one device", test_peer_access_one_device},
        {"fork while other threads map", test_fork_while_mapping},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = failures;
        tests[i].fn();
        printf("%-32s %s\n", tests[i].name, failures == before ? "ok" : "FAILED");
        fflush(stdout);
    }
    if (failures) fprintf(stderr, "test_api: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
