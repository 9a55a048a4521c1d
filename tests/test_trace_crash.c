/* test_trace_crash.c — the trace survives the crash it explains. A child records allocation
 * events through the public API (libcualloc.so, sim device) and reports its progress in a shared
 * page; the parent SIGKILLs it mid-run, then reads the trace with the reader library and checks
 * that the alloc+free events in it are exactly the ones the child had done: at least every call
 * that had returned, at most every call that had begun (the kill may land inside a call; runs
 * where it did not must match exactly), that every record read is intact, and that the trace says
 * it is truncated (no END record). Several runs with random kill times, single- and
 * multi-threaded, started by CUALLOC_CONF and by cualloc_trace_start; runs killed at a block
 * boundary, just before or just after the recorder reserves its next block (posix_fallocate,
 * intercepted below); then a clean exit, whose trace must be complete.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>

#include "cualloc.h"
#include "reader.h"
#include "testutil.h"

#define MAX_THREADS 4

/* The progress page, shared with the child. Per thread: calls begun and calls returned. */
typedef struct progress {
    _Atomic uint64_t begun[MAX_THREADS];
    _Atomic uint64_t done[MAX_THREADS];
    _Atomic int ready;
    uint64_t park_at;   /* thread 0 stops (forever) after this many calls; 0 = never */
    _Atomic int parked;
} progress_t;

static progress_t *prog;
static int nthreads;

/* Block boundaries. The recorder in libcualloc.so reserves each new block of the file with
 * posix_fallocate; this definition, exported by the executable, comes before the C library's, so
 * a child can be killed exactly at the boundary, the kill_at-th time: before the reservation
 * (kill_before) or after it, before the block is mapped and started (!kill_before). It runs with
 * the recorder's lock held, other threads waiting for it. */
static long kill_at;
static bool kill_before;
static long reserve_calls;

typedef int (*fallocate_fn)(int, off_t, off_t);

__attribute__((visibility("default"))) int posix_fallocate64(int fd, off_t offset, off_t len);
__attribute__((visibility("default"))) int posix_fallocate64(int fd, off_t offset, off_t len)
{
    long n = __atomic_add_fetch(&reserve_calls, 1, __ATOMIC_RELAXED);
    if (n == kill_at && kill_before)
        kill(getpid(), SIGKILL);
    void *f = dlsym(RTLD_NEXT, "posix_fallocate64");
    fallocate_fn next;
    memcpy(&next, &f, sizeof next);
    int err = next ? next(fd, offset, len) : ENOSYS;
    if (n == kill_at && !kill_before)
        kill(getpid(), SIGKILL);
    return err;
}

static void *worker(void *arg)
{
    int id = (int)(uintptr_t)arg;
    rng_t r = {0x9e37 + (uint64_t)id};
    void *live[32] = {0};
    void *stream = (void *)(uintptr_t)(id % 2);
    for (uint64_t i = 0;; i++) {
        int k = (int)rng_below(&r, 32);
        /* begun is counted before the call, done after it returns: the recorder writes the
         * event inside the call. */
        atomic_fetch_add_explicit(&prog->begun[id], 1, memory_order_seq_cst);
        if (live[k]) {
            cualloc_free(live[k], stream);
            live[k] = NULL;
        } else {
            live[k] = cualloc_malloc(rng_tensor_size(&r, 4u << 20), 0, stream);
            if (!live[k])
                abort();
        }
        atomic_fetch_add_explicit(&prog->done[id], 1, memory_order_seq_cst);
        if (i == 1000 && id == 0)
            atomic_store(&prog->ready, 1);
        if (id == 0 && i + 1 == prog->park_at) {
            atomic_store(&prog->parked, 1);
            for (;;)
                pause(); /* the kill lands between two calls */
        }
    }
    return NULL;
}

static void child_main(const char *path, bool by_api)
{
    char conf[512];
    snprintf(conf, sizeof conf, "driver:sim,sim_memory_mb:1024%s%s", by_api ? "" : ",trace:", by_api ? "" : path);
    setenv("CUALLOC_CONF", conf, 1);
    if (by_api && cualloc_trace_start(path) != 0)
        _exit(3);
    pthread_t th[MAX_THREADS];
    for (int i = 1; i < nthreads; i++)
        pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
    worker((void *)0);
}

typedef struct counted { uint64_t events, records; int status; bool end; char error[512]; } counted_t;

static counted_t count_events(const char *path)
{
    counted_t c = {0};
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    EXPECT(r, "cannot open %s: %s", path, err);
    tr_acct_t *a = malloc(sizeof *a);
    tr_acct_init(a);
    tr_record_t rec;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        tr_acct_add(a, &rec);
        c.records++;
    }
    c.status = k;
    snprintf(c.error, sizeof c.error, "%s", tr_error(r));
    c.events = a->num_allocs + a->num_frees;
    c.end = a->end_seen;
    EXPECT(a->unmatched_frees == 0 && a->double_allocs == 0 && a->size_mismatches == 0,
           "%s: the events read are inconsistent (unmatched %" PRIu64 ", double %" PRIu64 ")", path,
           a->unmatched_frees, a->double_allocs);
    tr_acct_free(a);
    free(a);
    tr_close(r);
    return c;
}

static int exact_runs;

static void run(const char *dir, int run_no, int threads, bool by_api, unsigned kill_after_us, bool do_kill,
                uint64_t park_at)
{
    char path[512];
    snprintf(path, sizeof path, "%s/crash-%d.trace", dir, run_no);
    memset(prog, 0, sizeof *prog);
    prog->park_at = park_at;
    nthreads = threads;
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (!do_kill) {
            /* The clean variant: a fixed number of calls, then exit (the END record is written
             * at exit). */
            char conf[600];
            snprintf(conf, sizeof conf, "driver:sim,sim_memory_mb:1024,trace:%s", path);
            setenv("CUALLOC_CONF", conf, 1);
            void *p[64] = {0};
            for (int i = 0; i < 20000; i++) {
                int k = i % 64;
                if (p[k]) {
                    cualloc_free(p[k], NULL);
                    p[k] = NULL;
                } else {
                    p[k] = cualloc_malloc((size_t)(i % 977 + 1) * 1000, 0, NULL);
                }
            }
            exit(0);
        }
        child_main(path, by_api);
        _exit(0);
    }
    if (!do_kill) {
        int st;
        waitpid(pid, &st, 0);
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "clean child failed");
        counted_t c = count_events(path);
        EXPECT(c.status == 0 && c.end && c.events == 20000, "clean exit: status %d (%s), end %d, %" PRIu64 " events",
               c.status, c.error, c.end, c.events);
        printf("ok   run %d: clean exit, complete trace of %" PRIu64 " events\n", run_no, c.events);
        return;
    }
    /* Wait until the child is recording, then let it run a random while. */
    for (int i = 0; i < 20000 && !atomic_load(&prog->ready); i++)
        usleep(500);
    EXPECT(atomic_load(&prog->ready), "the child never started recording");
    if (park_at) {
        for (int i = 0; i < 100000 && !atomic_load(&prog->parked); i++)
            usleep(200);
        EXPECT(atomic_load(&prog->parked), "the child never reached call %" PRIu64, park_at);
    } else {
        usleep(kill_after_us);
    }
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child was not killed (status %d)", st);
    uint64_t begun = 0, done = 0;
    for (int i = 0; i < threads; i++) {
        begun += atomic_load(&prog->begun[i]);
        done += atomic_load(&prog->done[i]);
    }
    counted_t c = count_events(path);
    EXPECT(c.status == 0, "run %d: the killed process's trace is not readable: %s", run_no, c.error);
    EXPECT(!c.end, "run %d: a killed process has no END record", run_no);
    EXPECT(c.events >= done && c.events <= begun,
           "run %d: the trace has %" PRIu64 " alloc+free events; the child had completed %" PRIu64 " and begun %" PRIu64,
           run_no, c.events, done, begun);
    if (park_at)
        EXPECT(begun == done && done == park_at, "run %d: parked at %" PRIu64 " of %" PRIu64, run_no, done, park_at);
    if (begun == done) {
        EXPECT(c.events == done, "run %d: exact count %" PRIu64 " vs %" PRIu64, run_no, c.events, done);
        exact_runs++;
    }
    if (park_at)
        printf("ok   run %d: %s, killed between calls after %" PRIu64 " calls: %" PRIu64 " events in the trace\n",
               run_no, by_api ? "cualloc_trace_start" : "trace: in CUALLOC_CONF", done, c.events);
    else
        printf("ok   run %d: %d thread%s, %s, killed after %u us: %" PRIu64 " events in the trace, %" PRIu64
               " calls returned, %" PRIu64 " begun%s\n",
               run_no, threads, threads > 1 ? "s" : "", by_api ? "cualloc_trace_start" : "trace: in CUALLOC_CONF",
               kill_after_us, c.events, done, begun, begun == done ? " (exact)" : "");
}

/* Killed inside the recorder at a block boundary (see posix_fallocate64): the trace reads without
 * error, has no END, and holds every call that returned and at most those begun. The child runs
 * until the kill_at-th reservation kills it. */
static void run_boundary(const char *dir, int run_no, int threads, long at, bool before)
{
    char path[512];
    snprintf(path, sizeof path, "%s/crash-%d.trace", dir, run_no);
    memset(prog, 0, sizeof *prog);
    nthreads = threads;
    kill_at = at;
    kill_before = before;
    reserve_calls = 0;
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        child_main(path, run_no % 2);
        _exit(0);
    }
    kill_at = 0;
    /* A child that outlives a minute never reached the reservation: the recorder no longer calls
     * posix_fallocate64, and this test needs another way in. */
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 60000 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++)
        usleep(1000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        EXPECT(false, "run %d: the child never reached reservation %ld", run_no, at);
    }
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "run %d: the child was not killed at reservation %ld (status %d)",
           run_no, at, st);
    uint64_t begun = 0, done = 0;
    for (int i = 0; i < threads; i++) {
        begun += atomic_load(&prog->begun[i]);
        done += atomic_load(&prog->done[i]);
    }
    counted_t c = count_events(path);
    EXPECT(c.status == 0, "run %d: the trace of a process killed at a block boundary is not readable: %s", run_no,
           c.error);
    EXPECT(!c.end, "run %d: a killed process has no END record", run_no);
    EXPECT(c.events >= done && c.events <= begun,
           "run %d: the trace has %" PRIu64 " alloc+free events; the child had completed %" PRIu64 " and begun %" PRIu64,
           run_no, c.events, done, begun);
    printf("ok   run %d: %d thread%s, killed %s reserving block %ld: %" PRIu64 " events in the trace, %" PRIu64
           " calls returned, %" PRIu64 " begun\n",
           run_no, threads, threads > 1 ? "s" : "", before ? "before" : "after", at, c.events, done, begun);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t seed = test_seed("test_trace_crash");
    rng_t r = {seed};
    prog = mmap(NULL, sizeof *prog, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT(prog != MAP_FAILED, "mmap");
    char dir[] = "/tmp/cualloc-test-crash-XXXXXX";
    EXPECT(mkdtemp(dir), "mkdtemp");
    int n = 0;
    /* Killed at a random time: usually inside a call. */
    for (int i = 0; i < 6; i++)
        run(dir, n++, 1, i % 2, (unsigned)(1000 + rng_below(&r, 200000)), true, 0);
    for (int i = 0; i < 4; i++)
        run(dir, n++, 1 + (int)rng_below(&r, MAX_THREADS), i % 2, (unsigned)(1000 + rng_below(&r, 200000)), true, 0);
    /* Killed at a random call count, between two calls: the count must be exact. */
    for (int i = 0; i < 4; i++)
        run(dir, n++, 1, i % 2, 0, true, 1002 + rng_below(&r, 300000));
    /* Killed at a block boundary: the first two reservations are the file's first META and EVENT
     * blocks, the later ones new blocks as the trace grows. */
    for (int i = 0; i < 4; i++)
        run_boundary(dir, n++, 1 + (int)rng_below(&r, MAX_THREADS), 3 + (long)rng_below(&r, 4), i % 2 == 0);
    run(dir, n++, 1, false, 0, false, 0);
    printf("test_trace_crash: %d runs, %d with the kill between calls (exact counts)\n", n - 1, exact_runs);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("test_trace_crash: all passed\n");
    return 0;
}
