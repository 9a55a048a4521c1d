/* interpose_prog.c — an ordinary CUDA runtime user (suite 'interpose'): includes no cualloc header,
 * links the stub runtime libstubcudart.so, and is run with libcualloc.so in LD_PRELOAD on a
 * host-backed sim device. Checks that cudaMalloc/cudaFree/cudaMallocAsync/cudaFreeAsync are served
 * by cualloc (its statistics move, the stub sees no allocation), that foreign pointers and
 * cudaFree(NULL) reach the stub, that cudaStreamDestroy and cudaMemGetInfo pass through (the latter
 * with cualloc's cached bytes added), that cualloc's own errors are the thread's last error (as
 * the runtime's would be), and that a forked child and its parent both keep working.
 *   interpose_prog            cualloc serves
 *   interpose_prog --disable  run under CUALLOC_DISABLE=1: everything reaches the stub
 *   interpose_prog --disable-late  CUALLOC_DISABLE set while it runs: one answer for the process
 *   interpose_prog --ipc-classic  classic mode: IPC only of a block at its segment's start
 *   interpose_prog --driver-error  chunks refused with a driver error: cudaMalloc returns it
 *   interpose_prog --driver-error-not-found  chunks refused with CUDA_ERROR_NOT_FOUND: still a failure
 *   interpose_prog --streams-first  100 non-blocking streams created before the first allocation
 *   interpose_prog --threads  eight threads allocate, free and make and destroy streams at once
 *   interpose_prog --fork-race  forks while another thread makes and destroys streams */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "softcheck.h"

int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMallocAsync(void **p, size_t n, void *stream);
int cudaFreeAsync(void *p, void *stream);
int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
int cudaStreamDestroy(void *stream);
unsigned long stub_cudart_calls(const char *name);
int cudaStreamCreateWithFlags(void **stream, unsigned int flags);
int cudaSetDevice(int dev);
int cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
int cudaIpcGetMemHandle(void *handle, void *dev_ptr);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
void stub_cudart_set_legacy_capture_error(int e);
typedef int (*get_range_fn)(unsigned long long *, size_t *, unsigned long long);
void *stub_cudart_malloc_direct(size_t n);

/* The layout of cualloc_stats (include/cualloc.h), mirrored: 12 size_t, then the counters. */
typedef struct {
    size_t gauges[10];
    size_t largest_free_block, capacity_bytes;
    uint64_t num_allocs, num_frees, num_maps, num_unmaps, num_alloc_retries, num_ooms, num_syncs, num_trims;
} stats_mirror;
typedef int (*get_stats_fn)(int, stats_mirror *);


static get_stats_fn get_stats;

static uint64_t allocs_now(void) {
    stats_mirror s;
    memset(&s, 0, sizeof s);
    if (!get_stats || get_stats(0, &s) != 0) return 0;
    return s.num_allocs;
}

static stats_mirror stats_of(int dev) {
    stats_mirror s;
    memset(&s, 0, sizeof s);
    if (get_stats) get_stats(dev, &s);
    return s;
}

/* n allocations of varied sizes, each written with a pattern and checked before its free. */
static void alloc_round(int n, unsigned seed, void *stream) {
    void *ptrs[64];
    size_t sizes[64];
    if (n > 64) n = 64;
    for (int i = 0; i < n; i++) {
        sizes[i] = 1 + ((size_t)(seed * 2654435761u + (unsigned)i * 40503u) % (3u << 20));
        ptrs[i] = NULL;
        int r = stream ? cudaMallocAsync(&ptrs[i], sizes[i], stream) : cudaMalloc(&ptrs[i], sizes[i]);
        CHECK_MSG(r == 0 && ptrs[i], "cudaMalloc(%zu) = %d, %p", sizes[i], r, ptrs[i]);
        if (r != 0 || !ptrs[i]) return;
        memset(ptrs[i], (int)((seed + (unsigned)i) & 0xff), sizes[i]);
    }
    for (int i = 0; i < n; i++) {
        unsigned char *p = ptrs[i], want = (unsigned char)((seed + (unsigned)i) & 0xff);
        size_t bad = 0;
        for (size_t k = 0; k < sizes[i]; k++) bad += p[k] != want;
        CHECK_MSG(bad == 0, "block %d (%zu bytes at %p): %zu bytes overwritten", i, sizes[i], ptrs[i], bad);
        int r = stream ? cudaFreeAsync(ptrs[i], stream) : cudaFree(ptrs[i]);
        CHECK_MSG(r == 0, "cudaFree(%p) = %d", ptrs[i], r);
    }
}

static void *exit_blocks[2];
static void free_at_exit(void) {
    if (cudaFree(exit_blocks[0]) != 0) _exit(3);
    exit_blocks[0] = NULL;
}
__attribute__((destructor)) static void free_in_destructor(void) {
    if (exit_blocks[1] && cudaFree(exit_blocks[1]) != 0) _exit(4);
}

/* --threads: what a training process does from several threads at once (forward and backward run
 * on different threads under PyTorch), through the front door only. Each thread works on its own
 * device (id % 2) with its own slots; blocks come from cudaMalloc or cudaMallocAsync on one of the
 * thread's streams (blocking or non-blocking, destroyed and made again every few hundred calls), go
 * back through cudaFree or cudaFreeAsync on either, and hold a pattern checked before each free. */
enum { TH_THREADS = 8, TH_SLOTS = 24, TH_OPS = 4000 };

static uint64_t th_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void th_fill(void *p, size_t n, unsigned char v) { memset(p, v, n < 256 ? n : 256); }

static size_t th_bad(const void *p, size_t n, unsigned char v) {
    const unsigned char *c = p;
    size_t bad = 0;
    for (size_t i = 0; i < (n < 256 ? n : 256); i++) bad += c[i] != v;
    return bad;
}

static void *th_main(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
    CHECK_MSG(cudaSetDevice(id % 2) == 0, "cudaSetDevice");
    void *streams[2];
    CHECK_MSG(cudaStreamCreateWithFlags(&streams[0], 0) == 0, "stream");
    CHECK_MSG(cudaStreamCreateWithFlags(&streams[1], 1) == 0, "non-blocking stream");
    struct { void *p; size_t n; unsigned char v; } slot[TH_SLOTS] = {{0}};
    for (int op = 0; op < TH_OPS; op++) {
        int i = (int)(th_next(&x) % TH_SLOTS);
        uint64_t r = th_next(&x);
        void *stream = (r & 4) ? streams[(r >> 3) & 1] : NULL;
        if (slot[i].p) {
            size_t bad = th_bad(slot[i].p, slot[i].n, slot[i].v);
            CHECK_MSG(bad == 0, "thread %d: %zu bytes of %p overwritten", id, bad, slot[i].p);
            int rc = stream ? cudaFreeAsync(slot[i].p, stream) : cudaFree(slot[i].p);
            CHECK_MSG(rc == 0, "thread %d: free = %d", id, rc);
            slot[i].p = NULL;
        } else {
            size_t n = 1 + (size_t)((r >> 8) % ((r & 1) ? (6u << 20) : (64u << 10)));
            int rc = stream ? cudaMallocAsync(&slot[i].p, n, stream) : cudaMalloc(&slot[i].p, n);
            CHECK_MSG(rc == 0 && slot[i].p, "thread %d: alloc of %zu = %d", id, n, rc);
            if (rc != 0) slot[i].p = NULL;
            if (!slot[i].p) continue;
            slot[i].n = n;
            slot[i].v = (unsigned char)(id * 31 + op);
            th_fill(slot[i].p, n, slot[i].v);
        }
        if (op % 500 == 499) {
            /* A stream goes while blocks freed on it may still wait for it. */
            int k = (int)(r >> 40) & 1;
            CHECK_MSG(cudaStreamDestroy(streams[k]) == 0, "cudaStreamDestroy");
            CHECK_MSG(cudaStreamCreateWithFlags(&streams[k], (unsigned)k) == 0, "stream again");
        }
        if (op % 97 == 0) {
            size_t fr = 0, tot = 0;
            CHECK_MSG(cudaMemGetInfo(&fr, &tot) == 0 && fr <= tot, "cudaMemGetInfo");
        }
    }
    for (int i = 0; i < TH_SLOTS; i++) {
        if (!slot[i].p) continue;
        CHECK_MSG(th_bad(slot[i].p, slot[i].n, slot[i].v) == 0, "thread %d: block %p overwritten", id, slot[i].p);
        CHECK_MSG(cudaFree(slot[i].p) == 0, "final free");
    }
    for (int k = 0; k < 2; k++) CHECK_MSG(cudaStreamDestroy(streams[k]) == 0, "cudaStreamDestroy");
    return NULL;
}

static int threads_main(void) {
    unsigned long m0 = stub_cudart_calls("cudaMalloc"), ma0 = stub_cudart_calls("cudaMallocAsync");
    stats_mirror before[2] = {stats_of(0), stats_of(1)};
    pthread_t th[TH_THREADS];
    for (int i = 0; i < TH_THREADS; i++)
        CHECK_MSG(pthread_create(&th[i], NULL, th_main, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < TH_THREADS; i++) pthread_join(th[i], NULL);
    CHECK_MSG(stub_cudart_calls("cudaMalloc") == m0 && stub_cudart_calls("cudaMallocAsync") == ma0,
          "the stub served %lu allocations", stub_cudart_calls("cudaMalloc") - m0 + stub_cudart_calls("cudaMallocAsync") - ma0);
    uint64_t served = 0;
    for (int d = 0; d < 2; d++) {
        stats_mirror s = stats_of(d);
        served += s.num_allocs - before[d].num_allocs;
        CHECK_MSG(s.num_allocs - before[d].num_allocs == s.num_frees - before[d].num_frees,
              "device %d: %llu allocations, %llu frees", d, (unsigned long long)(s.num_allocs - before[d].num_allocs),
              (unsigned long long)(s.num_frees - before[d].num_frees));
        CHECK_MSG(s.gauges[0] == before[d].gauges[0] && s.gauges[2] == before[d].gauges[2],
              "device %d: %zu bytes requested and %zu allocated at the end", d, s.gauges[0], s.gauges[2]);
    }
    CHECK_MSG(served >= TH_THREADS * TH_OPS / 3, "cualloc served %llu allocations", (unsigned long long)served);
    if (failures) return 1;
    printf("interpose_prog --threads: all checks passed (%llu allocations on 2 devices from %d threads)\n",
           (unsigned long long)served, TH_THREADS);
    return 0;
}

/* --exclude-race EXCLUDED_LIB INCLUDED_LIB (CUALLOC_CONF exclude: matches the first only): two
 * threads allocate at once, one through each library. Every excluded allocation must reach the
 * stub and every other one cualloc. The exclusion cache once paired one caller's address with the
 * other's answer (a key and a value stored apart), misrouting 10-200 of 10^6 calls, or all. */
typedef int (*site_malloc_fn)(void **, size_t);
typedef int (*site_free_fn)(void *);
#define RACE_CALLS 300000
static pthread_barrier_t race_start;
typedef struct { site_malloc_fn m; site_free_fn f; int failed; } race_arg_t;

static void *race_thread(void *arg) {
    race_arg_t *a = arg;
    pthread_barrier_wait(&race_start);
    for (int i = 0; i < RACE_CALLS; i++) {
        void *p = NULL;
        if (a->m(&p, 4096) != 0 || !p || a->f(p) != 0) a->failed++;
    }
    return NULL;
}

static int exclude_race_main(const char *excluded, const char *included) {
    race_arg_t arg[2];
    const char *lib[2] = {excluded, included};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(lib[i], RTLD_NOW | RTLD_LOCAL);
        CHECK_MSG(h, "dlopen %s: %s", lib[i], dlerror());
        if (!h) return 1;
        void *m = dlsym(h, "site_malloc"), *f = dlsym(h, "site_free");
        memcpy(&arg[i].m, &m, sizeof m);
        memcpy(&arg[i].f, &f, sizeof f);
        arg[i].failed = 0;
    }
    unsigned long m0 = stub_cudart_calls("cudaMalloc");
    uint64_t a0 = allocs_now();
    pthread_barrier_init(&race_start, NULL, 2);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, race_thread, &arg[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK_MSG(arg[0].failed == 0 && arg[1].failed == 0, "failed calls: %d excluded, %d included", arg[0].failed,
          arg[1].failed);
    unsigned long to_stub = stub_cudart_calls("cudaMalloc") - m0;
    uint64_t to_cualloc = allocs_now() - a0;
    CHECK_MSG(to_stub == RACE_CALLS && to_cualloc == RACE_CALLS,
          "of %d calls from each library, %lu reached the stub and %llu cualloc (want %d each)", RACE_CALLS, to_stub,
          (unsigned long long)to_cualloc, RACE_CALLS);
    if (failures) return 1;
    printf("interpose_prog --exclude-race: all checks passed\n");
    return 0;
}

/* --dlsym-scope PLUGIN: PLUGIN (tests/dlsym_plugin.c), loaded RTLD_LOCAL, looks symbols up with
 * RTLD_DEFAULT and RTLD_NEXT. cualloc's dlsym called glibc's from inside itself, so glibc took
 * libcualloc.so for the caller: the plugin's own dependency was not found, nor libc's malloc. */
static int dlsym_scope_main(const char *plugin) {
    void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(h, "dlopen %s: %s", plugin, dlerror());
    if (!h) return 1;
    void *f = dlsym(h, "plugin_lookups");
    int (*lookups)(int *);
    memcpy(&lookups, &f, sizeof f);
    CHECK_MSG(lookups, "plugin_lookups not found");
    if (!lookups) return 1;
    int found[3] = {0, 0, 0};
    CHECK_MSG(lookups(found) == 42, "the plugin's call");
    CHECK_MSG(found[0], "dlsym(RTLD_DEFAULT, a symbol of the plugin's own dependency) from the plugin: not found");
    CHECK_MSG(found[1], "dlsym(RTLD_NEXT, a symbol of the plugin's own dependency) from the plugin: not found");
    CHECK_MSG(found[2], "dlsym(RTLD_NEXT, \"malloc\") from the plugin: not found");
    if (failures) return 1;
    printf("interpose_prog --dlsym-scope: all checks passed\n");
    return 0;
}

/* --fork-race: forks while another thread creates and destroys non-blocking streams before cualloc
 * starts (each takes the front door's lock on the streams it must remember), in batches larger
 * than the first page of that table, which therefore grows (and may be moving at the fork). A child
 * that inherited that lock held would hang at its own first stream, one that used the parent's
 * table could crash; every child must create one and exit within 10 s. */
static atomic_int fork_race_stop, churn_started;

static void *stream_churn(void *arg) {
    (void)arg;
    enum { BATCH = 300 };
    static void *batch[BATCH];
    atomic_store(&churn_started, 1);
    while (!atomic_load(&fork_race_stop)) {
        int n = 0;
        while (n < BATCH && cudaStreamCreateWithFlags(&batch[n], 1) == 0) n++;
        while (n > 0) cudaStreamDestroy(batch[--n]);
    }
    return NULL;
}

static int fork_race_main(void) {
    pthread_t t;
    CHECK_MSG(pthread_create(&t, NULL, stream_churn, NULL) == 0, "pthread_create");
    /* The first fork comes as the thread makes its first stream; under the test
     * interpose_runtime_fork_register, once cualloc has begun registering its fork handler (which
     * that test makes slow), so that a registration made at the first stream has the fork inside. */
    while (!atomic_load(&churn_started)) sched_yield();
    const int *registering = (const int *)dlsym(RTLD_DEFAULT, "slow_fork_register_started");
    while (registering && !__atomic_load_n(registering, __ATOMIC_ACQUIRE)) sched_yield();
    int hung = 0, forks = 300;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            void *s = NULL;
            _exit(cudaStreamCreateWithFlags(&s, 1) == 0 && cudaStreamDestroy(s) == 0 ? 0 : 3);
        }
        int st = 0;
        CHECK_MSG(pid > 0 && waitpid(pid, &st, 0) == pid, "fork %d", i);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) hung++;
        else CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", i, st);
        if (hung) break;
    }
    atomic_store(&fork_race_stop, 1);
    pthread_join(t, NULL);
    CHECK_MSG(hung == 0, "a forked child hung at its first stream creation");
    if (failures) return 1;
    printf("interpose_prog --fork-race: %d forks, all checks passed\n", forks);
    return 0;
}

static void *other_thread_last_error(void *arg) {
    (void)arg;
    return (void *)(intptr_t)cudaGetLastError();
}

/* Right after cudaMalloc answered an OOM: as with CUDA's runtime, the error is the calling
 * thread's last error (peeked, then taken once), a double free's too, and an error the runtime
 * holds itself comes first and is cleared with it. */
static void last_error_checks(void) {
    pthread_t t;
    void *other = (void *)1;
    CHECK_MSG(pthread_create(&t, NULL, other_thread_last_error, NULL) == 0 && pthread_join(t, &other) == 0 &&
                  other == NULL,
              "another thread's last error is %d, want 0", (int)(intptr_t)other);
    int peek = cudaPeekAtLastError(), peek2 = cudaPeekAtLastError(), got = cudaGetLastError(), after = cudaGetLastError();
    CHECK_MSG(peek == 2 && peek2 == 2 && got == 2 && after == 0,
              "after the OOM: peek %d, peek %d, get %d, get %d; want 2, 2, 2, 0", peek, peek2, got, after);
    void *q = NULL;
    CHECK_MSG(cudaMalloc(&q, 4096) == 0 && q && cudaGetLastError() == 0, "cudaMalloc(4096) leaves no error");
    CHECK_MSG(cudaFree(q) == 0 && cudaFree(q) == 1, "a double free is refused with cudaErrorInvalidValue (1)");
    got = cudaGetLastError();
    CHECK_MSG(got == 1 && cudaGetLastError() == 0, "after the double free: get %d, want 1 then 0", got);
    void *big = NULL;
    CHECK_MSG(cudaSetDevice(99) == 101 && cudaMalloc(&big, (size_t)1 << 30) == 2, "a runtime error, then an OOM");
    got = cudaGetLastError();
    CHECK_MSG(got == 101 && cudaGetLastError() == 0, "the runtime's own error must come first: got %d, want 101, then 0",
              got);
}

/* --driver-error: run with every chunk after the first refused with CUDA_ERROR_ILLEGAL_ADDRESS
 * (sim_fail ...=700), as in a context a kernel's fault left failing: cudaMalloc returns that error,
 * the same value in the runtime's API, and it is the thread's last error; not
 * cudaErrorMemoryAllocation, which would send the user after memory.
 * --driver-error-not-found: refused with CUDA_ERROR_NOT_FOUND (500), the value the front door's own
 * code uses for "pass the request through": the heap failed (and reported) the request, so
 * cudaMalloc fails too, as out of memory (500 has no context-fatal meaning).
 * Either way CUDA's allocator is not asked for the failed request. */
static int driver_error_main(const char *mode) {
    bool not_found = strcmp(mode, "--driver-error-not-found") == 0;
    int want = not_found ? 2 : 700;
    void *warm = NULL, *p = NULL;
    CHECK_MSG(cudaMalloc(&warm, 4096) == 0 && warm, "the first chunk is mapped");
    unsigned long before = stub_cudart_calls("cudaMalloc");
    int r = cudaMalloc(&p, 64 << 20);
    CHECK_MSG(r == want && !p, "cudaMalloc(64 MiB) = %d, want %d (%s)", r, want,
              not_found ? "cudaErrorMemoryAllocation" : "cudaErrorIllegalAddress");
    CHECK_MSG(stub_cudart_calls("cudaMalloc") == before, "the failed request went to CUDA's allocator");
    if (p) cudaFree(p);
    CHECK_MSG(cudaGetLastError() == want && cudaGetLastError() == 0, "the last error is %d, then cleared", want);
    CHECK_MSG(cudaFree(warm) == 0, "free");
    if (failures) return 1;
    printf("interpose_prog %s: all checks passed\n", mode);
    return 0;
}

int main(int argc, char **argv) {
    int disable = argc > 1 && strcmp(argv[1], "--disable") == 0;
    void *gs = dlsym(RTLD_DEFAULT, "cualloc_get_stats"); /* (a look-up starts nothing) */
    memcpy(&get_stats, &gs, sizeof gs);
    if (argc > 1 && strcmp(argv[1], "--threads") == 0) return threads_main();
    if (argc == 4 && strcmp(argv[1], "--exclude-race") == 0) return exclude_race_main(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "--dlsym-scope") == 0) return dlsym_scope_main(argv[2]);
    if (argc > 1 && strcmp(argv[1], "--fork-race") == 0) return fork_race_main();
    if (argc > 1 && strcmp(argv[1], "--exclude") == 0) {
        /* Run with CUALLOC_CONF=...,exclude:interpose_prog*: this program's allocations go to the
         * stub unchanged, and their frees follow as foreign pointers. */
        unsigned long m0 = stub_cudart_calls("cudaMalloc"), f0 = stub_cudart_calls("cudaFree");
        void *p = NULL;
        CHECK_MSG(cudaMalloc(&p, 4096) == 0 && p, "cudaMalloc");
        CHECK_MSG(stub_cudart_calls("cudaMalloc") == m0 + 1, "an excluded caller's cudaMalloc did not reach the stub");
        CHECK_MSG(cudaFree(p) == 0 && stub_cudart_calls("cudaFree") == f0 + 1, "its free did not reach the stub");
        CHECK_MSG(stats_of(0).num_allocs == 0, "cualloc served an excluded caller");
        if (failures) return 1;
        printf("interpose_prog --exclude: all checks passed\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--meminfo-cap") == 0) {
        /* Run with max_memory_mb:16 (the stub reports 100 MiB free): cudaMemGetInfo's free bytes
         * are what cualloc would still hand out, at most the cap less what is allocated, so that a
         * program sizing its buffers from them is not refused. */
        void *warm = NULL, *live = NULL;
        CHECK_MSG(cudaMalloc(&warm, 1 << 20) == 0 && cudaFree(warm) == 0, "start cualloc");
        size_t fr = 0, tot = 0;
        CHECK_MSG(cudaMemGetInfo(&fr, &tot) == 0 && fr == ((size_t)16 << 20),
                  "free %zu with nothing allocated, want the cap of 16 MiB", fr);
        CHECK_MSG(cudaMalloc(&live, 6 << 20) == 0 && live, "cudaMalloc(6 MiB)");
        CHECK_MSG(cudaMemGetInfo(&fr, &tot) == 0 && fr == ((size_t)10 << 20),
                  "free %zu with 6 MiB allocated, want 10 MiB", fr);
        void *rest = NULL;
        CHECK_MSG(cudaMalloc(&rest, fr) == 0 && rest, "cudaMalloc of the %zu bytes cudaMemGetInfo reports free", fr);
        CHECK_MSG(cudaMemGetInfo(&fr, &tot) == 0 && fr == 0, "free %zu with the cap allocated, want 0", fr);
        CHECK_MSG(cudaFree(live) == 0 && cudaFree(rest) == 0, "frees");
        /* A device without a heap yet: the cap it will have. */
        CHECK_MSG(cudaSetDevice(1) == 0 && cudaMemGetInfo(&fr, &tot) == 0 && fr == ((size_t)16 << 20),
                  "device 1 (no heap yet): free %zu, want the cap of 16 MiB", fr);
        CHECK_MSG(cudaSetDevice(0) == 0, "back to device 0");
        if (failures) return 1;
        printf("interpose_prog --meminfo-cap: all checks passed\n");
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "--driver-error") == 0 || strcmp(argv[1], "--driver-error-not-found") == 0))
        return driver_error_main(argv[1]);
    if (argc > 1 && strcmp(argv[1], "--ipc-classic") == 0) {
        /* Classic mode (expandable_segments:False): an IPC handle covers a whole segment and opens
         * at its start, so only a block at a segment's start may be shared; one inside is refused
         * before it reaches the runtime. */
        void *a = NULL, *b = NULL;
        unsigned char handle[64];
        CHECK_MSG(cudaMalloc(&a, 5000) == 0 && cudaMalloc(&b, 5000) == 0 && a && b, "two blocks of one segment");
        unsigned long ipc0 = stub_cudart_calls("cudaIpcGetMemHandle");
        CHECK_MSG(cudaIpcGetMemHandle(handle, a) == 0 && stub_cudart_calls("cudaIpcGetMemHandle") == ipc0 + 1,
                  "the block at the segment's start reaches the runtime");
        CHECK_MSG(cudaIpcGetMemHandle(handle, b) == 1 && stub_cudart_calls("cudaIpcGetMemHandle") == ipc0 + 1,
                  "the block inside the segment must be refused (1) before the runtime");
        CHECK_MSG(cudaFree(a) == 0 && cudaFree(b) == 0, "frees");
        if (failures) return 1;
        printf("interpose_prog --ipc-classic: all checks passed\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--disable-late") == 0) {
        /* CUALLOC_DISABLE set after an entry point was called but before the first allocation:
         * the process keeps the answer it read first, in every part of cualloc, so the block
         * cualloc serves is also the one it frees (not the stub's). */
        size_t fr = 0, total = 0;
        CHECK_MSG(cudaMemGetInfo(&fr, &total) == 0, "cudaMemGetInfo");
        setenv("CUALLOC_DISABLE", "1", 1);
        unsigned long m0 = stub_cudart_calls("cudaMalloc"), f0 = stub_cudart_calls("cudaFree");
        void *p = NULL;
        CHECK_MSG(cudaMalloc(&p, 1 << 20) == 0 && p, "cudaMalloc");
        int served = stub_cudart_calls("cudaMalloc") == m0;
        CHECK_MSG(cudaFree(p) == 0, "cudaFree");
        CHECK_MSG(served == (stub_cudart_calls("cudaFree") == f0),
                  "the allocation and its free went different ways (served by cualloc: %d)", served);
        if (failures) return 1;
        printf("interpose_prog --disable-late: all checks passed\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--streams-first") == 0) {
        /* More non-blocking streams created before the first allocation than a fixed table of 64
         * held (PyTorch's stream pools make that many): the front door remembers every one and
         * hands them to the heap, whose events then cover them all, so a cudaFree'd block is
         * reused after those events, without a device synchronize (which would invalidate a
         * capture on any of them). */
        enum { NB = 100 };
        void *nbs[NB];
        for (int i = 0; i < NB; i++) CHECK_MSG(cudaStreamCreateWithFlags(&nbs[i], 1) == 0 && nbs[i], "stream %d", i);
        void *first = NULL, *again = NULL;
        for (int i = 0; i < 2; i++) {
            void *q = NULL;
            CHECK_MSG(cudaMalloc(&q, 3 << 20) == 0 && q, "cudaMalloc");
            *(i ? &again : &first) = q;
            CHECK_MSG(cudaFree(q) == 0, "cudaFree");
        }
        CHECK_MSG(stats_of(0).num_allocs == 2, "cualloc served %llu of 2 allocations", (unsigned long long)stats_of(0).num_allocs);
        CHECK_MSG(again == first, "the freed block was not reused");
        CHECK_MSG(stats_of(0).num_syncs == 0,
              "%llu device synchronizes for a cudaFree'd block: the heap was not told of all %d non-blocking "
              "streams created before cualloc started", (unsigned long long)stats_of(0).num_syncs, NB);
        for (int i = 0; i < NB; i++) CHECK_MSG(cudaStreamDestroy(nbs[i]) == 0, "cudaStreamDestroy %d", i);
        if (failures) return 1;
        printf("interpose_prog --streams-first: all checks passed\n");
        return 0;
    }
    CHECK_MSG(get_stats != NULL, "libcualloc.so is not preloaded (no cualloc_get_stats)");
    if (!get_stats) return 1;

    /* 0. dlsym(RTLD_NEXT) keeps its meaning under cualloc's dlsym: from the program, the next
     * cudaMalloc is the preloaded cualloc's, the next stub_cudart_calls the stub's. */
    Dl_info di;
    void *nm = dlsym(RTLD_NEXT, "cudaMalloc");
    CHECK_MSG(nm && dladdr(nm, &di) && di.dli_fname && strstr(di.dli_fname, "libcualloc"),
          "dlsym(RTLD_NEXT, cudaMalloc) from the program = %p (%s)", nm, nm && dladdr(nm, &di) ? di.dli_fname : "?");
    void *ns = dlsym(RTLD_NEXT, "stub_cudart_calls");
    CHECK_MSG(ns && dladdr(ns, &di) && di.dli_fname && strstr(di.dli_fname, "libstubcudart"),
          "dlsym(RTLD_NEXT, stub_cudart_calls) from the program = %p", ns);
    CHECK_MSG(dlsym(RTLD_NEXT, "no_such_symbol_anywhere") == NULL, "dlsym(RTLD_NEXT) of a missing name");

    /* 1. Allocations: cualloc serves them (or, disabled, the stub). */
    uint64_t a0 = allocs_now();
    unsigned long m0 = stub_cudart_calls("cudaMalloc"), f0 = stub_cudart_calls("cudaFree");
    for (unsigned round = 0; round < 4; round++) alloc_round(40, round, NULL);
    uint64_t a1 = allocs_now();
    if (!disable) {
        CHECK_MSG(a1 - a0 == 160, "cualloc served %llu of 160 allocations", (unsigned long long)(a1 - a0));
        CHECK_MSG(stub_cudart_calls("cudaMalloc") == m0, "the stub saw %lu cudaMalloc calls",
              stub_cudart_calls("cudaMalloc") - m0);
        CHECK_MSG(stub_cudart_calls("cudaFree") == f0, "the stub saw %lu cudaFree calls", stub_cudart_calls("cudaFree") - f0);
    } else {
        CHECK_MSG(a1 == a0, "disabled, yet cualloc served %llu allocations", (unsigned long long)(a1 - a0));
        CHECK_MSG(stub_cudart_calls("cudaMalloc") - m0 == 160, "the stub saw %lu of 160 cudaMalloc calls",
              stub_cudart_calls("cudaMalloc") - m0);
        CHECK_MSG(stub_cudart_calls("cudaFree") - f0 == 160, "the stub saw %lu of 160 cudaFree calls",
              stub_cudart_calls("cudaFree") - f0);
    }

    /* 2. Stream-ordered allocation on a stream handle, then its destruction. */
    void *stream = (void *)(uintptr_t)0x5000;
    unsigned long ma0 = stub_cudart_calls("cudaMallocAsync"), sd0 = stub_cudart_calls("cudaStreamDestroy");
    alloc_round(20, 99, stream);
    CHECK_MSG(stub_cudart_calls("cudaMallocAsync") - ma0 == (disable ? 20u : 0u), "the stub saw %lu cudaMallocAsync",
          stub_cudart_calls("cudaMallocAsync") - ma0);
    CHECK_MSG(cudaStreamDestroy(stream) == 0, "cudaStreamDestroy");
    CHECK_MSG(stub_cudart_calls("cudaStreamDestroy") - sd0 == 1, "cudaStreamDestroy did not reach the stub");
    if (!disable) CHECK_MSG(allocs_now() - a1 == 20, "cualloc served %llu of 20 async", (unsigned long long)(allocs_now() - a1));

    /* 2b. While a blocking stream captures, the legacy stream's capture query fails
     *     (cudaErrorStreamCaptureImplicit): an allocation on it goes to the runtime, which refuses
     *     or captures it as CUDA decides; cualloc must not serve it. */
    if (!disable) {
        stub_cudart_set_legacy_capture_error(906);
        unsigned long mac = stub_cudart_calls("cudaMallocAsync"), fac = stub_cudart_calls("cudaFreeAsync");
        uint64_t served = allocs_now();
        void *cap = NULL;
        CHECK_MSG(cudaMallocAsync(&cap, 4096, NULL) == 0 && cap, "cudaMallocAsync on the legacy stream");
        CHECK_MSG(stub_cudart_calls("cudaMallocAsync") == mac + 1 && allocs_now() == served,
                  "an allocation whose capture query failed was served by cualloc, not passed to the runtime");
        CHECK_MSG(cudaFreeAsync(cap, NULL) == 0 && stub_cudart_calls("cudaFreeAsync") == fac + 1, "its free");
        stub_cudart_set_legacy_capture_error(0);
        CHECK_MSG(cudaGetLastError() == 906 && cudaGetLastError() == 0, "the query's error is the runtime's");
    }

    /* 3. A pointer cualloc does not own, and NULL, reach the stub. */
    void *foreign = stub_cudart_malloc_direct(4096);
    unsigned long f1 = stub_cudart_calls("cudaFree");
    CHECK_MSG(cudaFree(foreign) == 0, "cudaFree(foreign)");
    CHECK_MSG(stub_cudart_calls("cudaFree") == f1 + 1, "cudaFree(foreign pointer) did not reach the stub");
    CHECK_MSG(cudaFree(NULL) == 0, "cudaFree(NULL)");
    CHECK_MSG(stub_cudart_calls("cudaFree") == f1 + 2, "cudaFree(NULL) did not reach the stub");
    foreign = stub_cudart_malloc_direct(512);
    unsigned long fa = stub_cudart_calls("cudaFreeAsync");
    CHECK_MSG(cudaFreeAsync(foreign, stream) == 0, "cudaFreeAsync(foreign)");
    CHECK_MSG(stub_cudart_calls("cudaFreeAsync") == fa + 1, "cudaFreeAsync(foreign pointer) did not reach the stub");

    /* 4. cudaMemGetInfo: the stub's answer plus cualloc's cached bytes (all freed above). */
    size_t fr = 0, tot = 0;
    CHECK_MSG(cudaMemGetInfo(&fr, &tot) == 0, "cudaMemGetInfo");
    CHECK_MSG(tot == ((size_t)1 << 30), "total %zu", tot);
    if (disable) CHECK_MSG(fr == ((size_t)100 << 20), "disabled: free %zu is not the stub's", fr);
    else CHECK_MSG(fr > ((size_t)100 << 20) && fr <= tot, "free %zu does not include cualloc's cached bytes", fr);

    /* 5. OOM is a value: more than the 512 MiB sim device. */
    if (!disable) {
        void *big = (void *)1;
        int r = cudaMalloc(&big, (size_t)1 << 30);
        CHECK_MSG(r == 2, "cudaMalloc(1 GiB) on a 512 MiB device = %d, want cudaErrorMemoryAllocation (2)", r);
        last_error_checks();
    }

    if (!disable) {
        /* 7. cudaFree's guarantee with a non-blocking stream known: freed blocks wait for events on
         *    the legacy and the non-blocking stream (which the stub completes at once), never for a
         *    synchronization, and are then reused. */
        void *nb = NULL;
        CHECK_MSG(cudaStreamCreateWithFlags(&nb, 1) == 0 && nb, "cudaStreamCreateWithFlags(non-blocking)");
        uint64_t syncs0 = stats_of(0).num_syncs;
        void *first = NULL, *again = NULL;
        for (int i = 0; i < 50; i++) {
            void *q = NULL;
            CHECK_MSG(cudaMalloc(&q, 3 << 20) == 0 && q, "cudaMalloc with a non-blocking stream");
            if (i == 0) first = q;
            if (i == 1) again = q;
            CHECK_MSG(cudaFree(q) == 0, "cudaFree");
        }
        CHECK_MSG(again == first, "a device-wide freed block is reused once the streams passed the free");
        CHECK_MSG(stats_of(0).num_syncs == syncs0, "%llu synchronizations for 50 cudaFree calls",
              (unsigned long long)(stats_of(0).num_syncs - syncs0));
        CHECK_MSG(cudaStreamDestroy(nb) == 0, "cudaStreamDestroy(non-blocking)");

        /* 8. VMM memory vs cudaMalloc memory: IPC fails with a message; cuMemGetAddressRange gives the
         *    allocated block (interior pointers too); foreign pointers pass through. */
        void *v = NULL;
        CHECK_MSG(cudaMalloc(&v, 5000) == 0 && v, "cudaMalloc(5000)");
        unsigned char handle[64];
        unsigned long ipc0 = stub_cudart_calls("cudaIpcGetMemHandle");
        CHECK_MSG(cudaIpcGetMemHandle(handle, v) == 1, "cudaIpcGetMemHandle of VMM memory must fail (1)");
        CHECK_MSG(stub_cudart_calls("cudaIpcGetMemHandle") == ipc0, "it reached the runtime");
        void *foreign2 = stub_cudart_malloc_direct(256);
        CHECK_MSG(cudaIpcGetMemHandle(handle, foreign2) == 0 && stub_cudart_calls("cudaIpcGetMemHandle") == ipc0 + 1,
              "cudaIpcGetMemHandle of a foreign pointer passes through");
        CHECK_MSG(cudaFree(foreign2) == 0, "free foreign");
        void *gr = dlsym(RTLD_DEFAULT, "cuMemGetAddressRange_v2");
        get_range_fn get_range;
        memcpy(&get_range, &gr, sizeof gr);
        CHECK_MSG(get_range != NULL, "cuMemGetAddressRange_v2 not exported");
        if (get_range) {
            unsigned long long base = 0;
            size_t size = 0;
            CHECK_MSG(get_range(&base, &size, (unsigned long long)(uintptr_t)v + 1234) == 0, "cuMemGetAddressRange");
            CHECK_MSG(base == (uintptr_t)v && size == 5120, "range %#llx + %zu, want %p + 5120", base, size, v);
        }
        CHECK_MSG(cudaFree(v) == 0, "cudaFree");

        /* 9. Two devices: cudaSetDevice decides the heap; peer access passes through. */
        uint64_t d1 = stats_of(1).num_allocs;
        CHECK_MSG(cudaSetDevice(1) == 0, "cudaSetDevice(1)");
        void *on1 = NULL;
        CHECK_MSG(cudaMalloc(&on1, 1 << 20) == 0 && on1, "cudaMalloc on device 1");
        CHECK_MSG(stats_of(1).num_allocs == d1 + 1, "device 1's heap did not serve it");
        CHECK_MSG(cudaSetDevice(0) == 0, "cudaSetDevice(0)");
        CHECK_MSG(cudaDeviceEnablePeerAccess(1, 0) == 0, "cudaDeviceEnablePeerAccess");
        CHECK_MSG(cudaFree(on1) == 0, "cudaFree on device 1 from device 0");
        CHECK_MSG(stats_of(1).num_frees >= 1, "device 1's heap did not take the free");

        /* 10. Async ordering on two streams: each reuses its own frees at once. */
        void *s1 = NULL, *s2 = NULL, *x = NULL, *y = NULL;
        CHECK_MSG(cudaStreamCreateWithFlags(&s1, 0) == 0 && cudaStreamCreateWithFlags(&s2, 0) == 0, "streams");
        CHECK_MSG(cudaMallocAsync(&x, 2 << 20, s1) == 0 && cudaFreeAsync(x, s1) == 0, "async on s1");
        CHECK_MSG(cudaMallocAsync(&y, 2 << 20, s1) == 0 && y == x, "s1 reuses its own free at once");
        CHECK_MSG(cudaFreeAsync(y, s1) == 0, "free");
        CHECK_MSG(cudaMallocAsync(&x, 2 << 20, s2) == 0 && cudaFreeAsync(x, s2) == 0, "async on s2");
        CHECK_MSG(cudaStreamDestroy(s1) == 0 && cudaStreamDestroy(s2) == 0, "destroy");
    }

    /* 6. fork: the child starts over and works; so does the parent afterwards. */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t c0 = allocs_now();
        alloc_round(30, 7, NULL);
        uint64_t c1 = allocs_now();
        if (!disable && c1 - c0 != 30) {
            fprintf(stderr, "interpose_prog: FAIL: child: cualloc served %llu of 30\n", (unsigned long long)(c1 - c0));
            _exit(1);
        }
        _exit(failures ? 1 : 0);
    }
    CHECK_MSG(pid > 0, "fork failed");
    int status = 0;
    if (pid > 0) {
        CHECK_MSG(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    }
    uint64_t p0 = allocs_now();
    alloc_round(30, 8, NULL);
    if (!disable) CHECK_MSG(allocs_now() - p0 == 30, "parent after fork: cualloc served %llu of 30",
                        (unsigned long long)(allocs_now() - p0));

    /* Frees during exit: an atexit handler and a destructor free memory after main returns (and
     * after cualloc's own exit handlers may have run); the process must still exit 0. */
    exit_blocks[0] = NULL;
    exit_blocks[1] = NULL;
    CHECK_MSG(cudaMalloc(&exit_blocks[0], 1 << 20) == 0 && cudaMalloc(&exit_blocks[1], 3 << 20) == 0, "exit blocks");
    atexit(free_at_exit);

    if (failures) {
        fprintf(stderr, "interpose_prog: %d failure(s)\n", failures);
        return 1;
    }
    printf("interpose_prog%s: all checks passed\n", disable ? " --disable" : "");
    return 0;
}
