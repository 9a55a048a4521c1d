/* test_trace.c — white-box tests of the trace recorder (src/trace.c) against the reader
 * (tools/allocview/reader.c): every record type round-trips with its fields; stacks name the
 * right call site, respect the depth and put Python frames (a fake CPython API exported by this
 * executable, found by the recorder through dlsym) outside the native ones, releasing every
 * reference; a trace started mid-run begins with the live blocks; concurrent threads; a symlink
 * at the path is refused and an existing file never overwritten; trace_max_mb stops or rings; a
 * forked child writes its own file or none; a full file system ends the trace cleanly; signal
 * handlers that allocate inside the recorder neither deadlock nor corrupt; truncation at every
 * offset and random byte flips never crash or hang the reader, which returns a prefix.
 *
 * Most tests run in a forked child with their own CUALLOC_CONF (cualloc re-initializes after
 * fork), so each starts from fresh heaps. `test_trace --corpus DIR` writes the fuzzer's seed
 * traces (tests/fuzz/corpus_trace_reader) instead.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "reader.h"
#include "testutil.h"

#define EXPORT __attribute__((visibility("default")))

static char dir[256]; /* this run's scratch directory */
static uint64_t seed;

/* ------------------------------------------------------------------------- message capture */

static char msgs[8192];
static pthread_mutex_t msg_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture(const char *line, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&msg_lock);
    size_t n = strlen(msgs);
    snprintf(msgs + n, sizeof msgs - n, "%s\n", line);
    pthread_mutex_unlock(&msg_lock);
}

static void msgs_clear(void) { msgs[0] = '\0'; }

/* ------------------------------------------------------------------------------ fake CPython */

/* Objects: frames (code, line, back), code objects (name, file), strings. Every reference the
 * API hands out is counted; the recorder must give each back with Py_DecRef. */
typedef struct fobj { int kind; const char *s; int line; struct fobj *back, *code, *name, *file; } fobj_t;
enum { F_FRAME = 1, F_CODE, F_STR };
static atomic_int fake_refs;  /* references handed out and not returned */
static int fake_gil;          /* PyGILState_Check's answer */
static fobj_t *fake_top;      /* the innermost frame */
static bool fake_no_qualname; /* co_qualname fails (older Python): co_name is used */
static int fake_tstate;

EXPORT int Py_IsInitialized(void);
EXPORT int PyGILState_Check(void);
EXPORT void *PyThreadState_Get(void);
EXPORT void *PyThreadState_GetFrame(void *ts);
EXPORT void *PyFrame_GetCode(void *f);
EXPORT int PyFrame_GetLineNumber(void *f);
EXPORT void *PyFrame_GetBack(void *f);
EXPORT void *PyObject_GetAttrString(void *o, const char *name);
EXPORT const char *PyUnicode_AsUTF8(void *o);
EXPORT void Py_DecRef(void *o);
EXPORT void PyErr_Fetch(void **t, void **v, void **tb);
EXPORT void PyErr_Restore(void *t, void *v, void *tb);

static void *ref(fobj_t *o)
{
    if (o)
        atomic_fetch_add(&fake_refs, 1);
    return o;
}
int Py_IsInitialized(void) { return 1; }
int PyGILState_Check(void) { return fake_gil; }
void *PyThreadState_Get(void) { return &fake_tstate; }
void *PyThreadState_GetFrame(void *ts) { return ts == &fake_tstate ? ref(fake_top) : NULL; }
void *PyFrame_GetCode(void *f) { return ref(((fobj_t *)f)->code); }
int PyFrame_GetLineNumber(void *f) { return ((fobj_t *)f)->line; }
void *PyFrame_GetBack(void *f) { return ref(((fobj_t *)f)->back); }
void *PyObject_GetAttrString(void *o, const char *name)
{
    fobj_t *c = o;
    EXPECT(c->kind == F_CODE, "attribute %s asked of a non-code object", name);
    if (strcmp(name, "co_qualname") == 0)
        return fake_no_qualname ? NULL : ref(c->name);
    if (strcmp(name, "co_name") == 0)
        return ref(c->name);
    if (strcmp(name, "co_filename") == 0)
        return ref(c->file);
    return NULL;
}
const char *PyUnicode_AsUTF8(void *o) { return ((fobj_t *)o)->s; }
void Py_DecRef(void *o)
{
    if (o)
        EXPECT(atomic_fetch_sub(&fake_refs, 1) > 0, "more Py_DecRef than references");
}
void PyErr_Fetch(void **t, void **v, void **tb) { *t = *v = *tb = NULL; }
void PyErr_Restore(void *t, void *v, void *tb) { (void)t, (void)v, (void)tb; }

/* ----------------------------------------------------------------------------------- helpers */

static conf_t base_conf(void)
{
    conf_t c = *api_conf();
    return c;
}

static void path_of(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", dir, name); }

/* Every record of a trace, read back. */
typedef struct rec_s {
    tr_record_t r;
    char s1[1100], s2[1100], s3[600]; /* string fields, copied */
    tr_end_dev_t end[4];
    tr_frame_t frames[80];
    size_t nframes;
} rec_t;

typedef struct trace_s {
    rec_t *recs;
    size_t n, cap;
    int status;      /* tr_next's last result */
    char error[512], warning[512];
    tr_info_t info;
    tr_acct_t acct;
} trace_t;

static void str_copy(char *dst, size_t len, tr_str_t s)
{
    size_t n = s.len < len - 1 ? s.len : len - 1;
    memcpy(dst, s.p, n);
    dst[n] = '\0';
}

/* Every record of the trace at path into t (keep), or only its accounting (t->acct, t->status). */
static void trace_read_(const char *path, trace_t *t, bool keep)
{
    memset(t, 0, sizeof *t);
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    EXPECT(r, "cannot open %s: %s", path, err);
    t->info = *tr_info(r);
    tr_acct_init(&t->acct);
    tr_record_t rec;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        tr_acct_add(&t->acct, &rec);
        if (!keep)
            continue;
        if (t->n == t->cap) {
            t->cap = t->cap ? t->cap * 2 : 1024;
            t->recs = realloc(t->recs, t->cap * sizeof *t->recs);
            EXPECT(t->recs, "out of memory");
        }
        rec_t *x = &t->recs[t->n++];
        x->r = rec;
        x->s1[0] = x->s2[0] = x->s3[0] = '\0';
        x->nframes = 0;
        switch (rec.known ? rec.type : 0) {
        case CUA_TRACE_PROCESS:
            str_copy(x->s1, sizeof x->s1, rec.u.process.host);
            str_copy(x->s2, sizeof x->s2, rec.u.process.cmdline);
            str_copy(x->s3, sizeof x->s3, rec.u.process.recorder);
            break;
        case CUA_TRACE_CONFIG:
        case CUA_TRACE_MARK:
            str_copy(x->s1, sizeof x->s1, rec.u.text);
            break;
        case CUA_TRACE_DEVICE:
            str_copy(x->s1, sizeof x->s1, rec.u.device.name);
            break;
        case CUA_TRACE_MODULE:
            str_copy(x->s1, sizeof x->s1, rec.u.module.path);
            x->r.u.module.build_id.p = NULL;
            break;
        case CUA_TRACE_THREAD:
            str_copy(x->s1, sizeof x->s1, rec.u.thread.name);
            break;
        case CUA_TRACE_PYFRAME:
            str_copy(x->s1, sizeof x->s1, rec.u.pyframe.function);
            str_copy(x->s2, sizeof x->s2, rec.u.pyframe.file);
            break;
        case CUA_TRACE_END:
            for (uint32_t i = 0; i < rec.u.end.ndev && i < 4; i++)
                x->end[i] = rec.u.end.devs[i];
            x->r.u.end.devs = NULL;
            break;
        case CUA_TRACE_ALLOC:
        case CUA_TRACE_OOM:
            x->nframes = tr_stack_frames(r, rec.stack, x->frames, 80);
            /* Python frame strings belong to the reader: copy the first one's. */
            for (size_t i = 0; i < x->nframes; i++)
                if (x->frames[i].kind == CUA_TRACE_FRAME_PYTHON) {
                    snprintf(x->s1, sizeof x->s1, "%s", x->frames[i].function ? x->frames[i].function : "");
                    snprintf(x->s2, sizeof x->s2, "%s", x->frames[i].file ? x->frames[i].file : "");
                    break;
                }
            for (size_t i = 0; i < x->nframes; i++)
                x->frames[i].function = x->frames[i].file = x->frames[i].module = NULL;
            break;
        default:
            break;
        }
    }
    t->status = k;
    snprintf(t->error, sizeof t->error, "%s", tr_error(r));
    snprintf(t->warning, sizeof t->warning, "%s", tr_warning(r));
    tr_close(r);
}

static void trace_read(const char *path, trace_t *t) { trace_read_(path, t, true); }

static void trace_free(trace_t *t)
{
    free(t->recs);
    tr_acct_free(&t->acct);
}

static size_t count_type(const trace_t *t, uint8_t type)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += t->recs[i].r.known && t->recs[i].r.type == type;
    return n;
}

static const rec_t *nth_of(const trace_t *t, uint8_t type, size_t nth)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->recs[i].r.known && t->recs[i].r.type == type && nth-- == 0)
            return &t->recs[i];
    return NULL;
}

/* Runs fn in a forked child with CUALLOC_CONF = conf; the child must exit 0. `test_trace FILTER`
 * runs only the tests whose name contains FILTER; TEST_TRACE_INPROC=1 then runs the first of them
 * in this process (for a debugger). */
static const char *filter;

static void in_child(const char *name, const char *conf, void (*fn)(void))
{
    if (filter && !strstr(name, filter))
        return;
    if (filter && getenv("TEST_TRACE_INPROC")) {
        setenv("CUALLOC_CONF", conf, 1);
        fn();
        printf("ok   %s (in process)\n", name);
        exit(0);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        setenv("CUALLOC_CONF", conf, 1);
        fn();
        exit(0);
    }
    int st = 0;
    EXPECT(waitpid(pid, &st, 0) == pid, "waitpid");
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed (status %d, signal %d)", name,
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    printf("ok   %s\n", name);
    fflush(stdout);
}

/* Checks the accounting a consistent trace has, against the process's own END statistics (the
 * peaks only when the trace saw the whole run). */
static void check_consistent_(const trace_t *t, const char *what, bool whole_run)
{
    const tr_acct_t *a = &t->acct;
    EXPECT(t->status == 0, "%s: reader error: %s", what, t->error);
    EXPECT(a->unmatched_frees == 0 && a->double_allocs == 0 && a->size_mismatches == 0,
           "%s: unmatched frees %llu, double allocs %llu, size mismatches %llu", what,
           (unsigned long long)a->unmatched_frees, (unsigned long long)a->double_allocs,
           (unsigned long long)a->size_mismatches);
    EXPECT(a->end_seen, "%s: no END record", what);
    for (uint32_t i = 0; i < a->end_ndev; i++) {
        const tr_end_dev_t *e = &a->end_devs[i];
        const tr_acct_dev_t *d = &a->dev[e->dev];
        EXPECT(e->nfields == CUA_TRACE_STAT_COUNT, "%s: END has %u fields", what, e->nfields);
        EXPECT(!whole_run || (d->allocated_peak == e->v[CUA_TRACE_STAT_ALLOCATED_PEAK] &&
                              d->requested_peak == e->v[CUA_TRACE_STAT_REQUESTED_PEAK] &&
                              d->reserved_peak == e->v[CUA_TRACE_STAT_RESERVED_PEAK]),
               "%s: dev %u peaks from the trace (req %llu, alloc %llu, resv %llu) differ from the heap's (%llu, %llu, %llu)",
               what, e->dev, (unsigned long long)d->requested_peak, (unsigned long long)d->allocated_peak,
               (unsigned long long)d->reserved_peak, (unsigned long long)e->v[CUA_TRACE_STAT_REQUESTED_PEAK],
               (unsigned long long)e->v[CUA_TRACE_STAT_ALLOCATED_PEAK],
               (unsigned long long)e->v[CUA_TRACE_STAT_RESERVED_PEAK]);
        EXPECT(d->allocated == e->v[CUA_TRACE_STAT_ALLOCATED] && d->reserved == e->v[CUA_TRACE_STAT_RESERVED],
               "%s: dev %u current allocated/reserved %llu/%llu, heap says %llu/%llu", what, e->dev,
               (unsigned long long)d->allocated, (unsigned long long)d->reserved,
               (unsigned long long)e->v[CUA_TRACE_STAT_ALLOCATED], (unsigned long long)e->v[CUA_TRACE_STAT_RESERVED]);
    }
}

static void check_consistent(const trace_t *t, const char *what) { check_consistent_(t, what, true); }

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* ---------------------------------------------------------------------------------- tests */

static void test_expand_path(void)
{
    char out[512], want[512], host[256] = "";
    gethostname(host, sizeof host - 1);
    setenv("RANK", "3", 1);
    EXPECT(trace_expand_path("/t/%p-%r-%h-%%-%x%", out, sizeof out, NULL) > 0, "expand");
    snprintf(want, sizeof want, "/t/%d-3-%s-%%-%%x%%", (int)getpid(), host);
    EXPECT(strcmp(out, want) == 0, "got %s want %s", out, want);
    unsetenv("RANK");
    setenv("LOCAL_RANK", "7", 1);
    trace_expand_path("r%r", out, sizeof out, NULL);
    EXPECT(strcmp(out, "r7") == 0, "got %s", out);
    unsetenv("LOCAL_RANK");
    trace_expand_path("r%r", out, sizeof out, NULL);
    EXPECT(strcmp(out, "r0") == 0, "got %s", out);
    EXPECT(trace_expand_path("%p%p%p", out, 4, NULL) == 0, "overflow must fail");
    printf("ok   path expansion\n");
}

/* Every record type through the hooks, read back field by field. */
static void roundtrip_body(void)
{
    char path[300];
    path_of(path, sizeof path, "roundtrip.trace");
    conf_t c = base_conf();
    c.trace_stack_depth = 8;
    EXPECT(api_trace_start(path, &c) == 0, "start: %s", msgs);
    /* Devices 0 and 5 (5 has no heap: the hooks are driven directly), and 200. */
    trace_on_device(5, "fake device five", 80 * GiB, 79 * GiB, 2 * MiB, false);
    trace_on_device(200, "", 1 * GiB, 1 * GiB, 4096, true);
    cua_stream s1 = (cua_stream)(uintptr_t)0x1234, s2 = (cua_stream)(uintptr_t)0xdeadbeef00ull;
    uintptr_t base = 0x7f1000000000ull;
    trace_on_map(5, base, 20 * MiB);
    trace_capture_stack(0);
    trace_on_alloc(5, s1, base, 4096, 4000);
    trace_on_alloc(5, s2, base + 4096, 512, 512);           /* exact: no slack */
    trace_on_alloc(5, s2, base - 512 * 7, 1536, 1);          /* backwards */
    trace_on_alloc(200, NULL, 0x1001, 3, 3);                 /* unaligned: byte units */
    trace_on_alloc(200, NULL, 0xffffffffffff0000ull, 65536, 65535);
    trace_on_free(5, s1, base, 4096, 4000);
    trace_on_free_requested(5, s2, base + 4096, 512);
    trace_on_free_completed(5, s2, base + 4096, 512);
    trace_on_trim(5);
    trace_on_unmap(5, base, 20 * MiB);
    trace_on_oom(5, s1, 123456789, 123457024, 79 * GiB, 5 * GiB, 6 * GiB, 77 * GiB, 1 * GiB, CUA_TRACE_VMM_CHUNKS);
    trace_mark("step 1");
    char long_label[3000];
    memset(long_label, 'x', sizeof long_label - 1);
    long_label[sizeof long_label - 1] = '\0';
    trace_mark(long_label);
    /* Not UTF-8 (every byte a continuation byte): the cut steps back over at most the three bytes
     * that may end a character, not over the whole label. */
    memset(long_label, 0x80, sizeof long_label - 1);
    trace_mark(long_label);
    trace_on_initial_map(5, base + 64 * MiB, 2 * MiB);
    trace_on_initial_block(5, s1, base + 64 * MiB, 1024, 1000);
    /* Unknown record types, one of each kind: skipped, nothing after them disturbed. */
    const uint8_t junk[] = {1, 2, 3, 4, 5};
    EXPECT(trace_test_raw(false, 31, junk, sizeof junk), "raw meta");
    EXPECT(trace_test_raw(true, 99, junk, sizeof junk), "raw event");
    trace_on_alloc(5, s1, base + 8192, 1024, 1024);
    cualloc_stats st;
    memset(&st, 0, sizeof st);
    st.requested_peak = 42;
    st.num_trims = 7;
    st.capacity_bytes = 79 * GiB;
    const cualloc_stats *per[6] = {NULL, NULL, NULL, NULL, NULL, &st};
    trace_stop(per, 6);
    EXPECT(!trace_active(), "stopped");

    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader error: %s", t.error);
    /* Sequence numbers 1..n, no gap. */
    for (size_t i = 0; i < t.n; i++)
        EXPECT(t.recs[i].r.seq == i + 1, "record %zu has seq %llu", i, (unsigned long long)t.recs[i].r.seq);
    const rec_t *x = nth_of(&t, CUA_TRACE_PROCESS, 0);
    EXPECT(x && x->r.u.process.pid == (uint64_t)getpid() && x->r.u.process.ppid == (uint64_t)getppid(), "process");
    EXPECT(x->r.u.process.clock == CUA_TRACE_CLOCK_COUNTER && x->r.u.process.realtime_ns > 0, "process clock");
    EXPECT(strstr(x->s2, "test_trace") && strncmp(x->s3, "cualloc ", 8) == 0, "cmdline %s recorder %s", x->s2, x->s3);
    x = nth_of(&t, CUA_TRACE_CONFIG, 0);
    char conf_text[4096];
    conf_format(&c, conf_text, sizeof conf_text);
    EXPECT(x && strcmp(x->s1, conf_text) == 0, "config %s", x ? x->s1 : "-");
    x = nth_of(&t, CUA_TRACE_DEVICE, 1); /* 0 may be the api's device 0 */
    const rec_t *d5 = NULL, *d200 = NULL;
    for (size_t i = 0; i < count_type(&t, CUA_TRACE_DEVICE); i++) {
        x = nth_of(&t, CUA_TRACE_DEVICE, i);
        if (x->r.u.device.dev == 5)
            d5 = x;
        if (x->r.u.device.dev == 200)
            d200 = x;
    }
    EXPECT(d5 && strcmp(d5->s1, "fake device five") == 0 && d5->r.u.device.total == 80 * GiB &&
               d5->r.u.device.capacity == 79 * GiB && d5->r.u.device.granularity == 2 * MiB &&
               d5->r.u.device.mode == CUA_TRACE_MODE_CLASSIC,
           "device 5");
    EXPECT(d200 && d200->s1[0] == '\0' && d200->r.u.device.mode == CUA_TRACE_MODE_VMM, "device 200");
    EXPECT(count_type(&t, CUA_TRACE_MODULE) >= 2, "modules");
    bool self_module = false;
    for (size_t i = 0; i < count_type(&t, CUA_TRACE_MODULE); i++) {
        x = nth_of(&t, CUA_TRACE_MODULE, i);
        EXPECT(x->r.u.module.start < x->r.u.module.end, "module range");
        self_module |= strstr(x->s1, "test_trace") != NULL;
    }
    EXPECT(self_module, "the executable's module is recorded");
    x = nth_of(&t, CUA_TRACE_THREAD, 0);
    EXPECT(x && x->r.u.thread.id == 1 && x->r.u.thread.tid == (uint64_t)gettid(), "thread");
    /* Streams: s1, s2, NULL in first-use order. */
    EXPECT(count_type(&t, CUA_TRACE_STREAM) == 3, "3 streams, got %zu", count_type(&t, CUA_TRACE_STREAM));
    EXPECT(nth_of(&t, CUA_TRACE_STREAM, 0)->r.u.stream.handle == 0x1234 &&
               nth_of(&t, CUA_TRACE_STREAM, 1)->r.u.stream.handle == 0xdeadbeef00ull &&
               nth_of(&t, CUA_TRACE_STREAM, 2)->r.u.stream.handle == 0,
           "stream handles");
    /* Events. */
    const rec_t *a0 = nth_of(&t, CUA_TRACE_ALLOC, 0), *a1 = nth_of(&t, CUA_TRACE_ALLOC, 1),
                *a2 = nth_of(&t, CUA_TRACE_ALLOC, 2), *a3 = nth_of(&t, CUA_TRACE_ALLOC, 3),
                *a4 = nth_of(&t, CUA_TRACE_ALLOC, 4), *a5 = nth_of(&t, CUA_TRACE_ALLOC, 5);
    EXPECT(a0 && a0->r.dev == 5 && a0->r.addr == base && a0->r.size == 4096 && a0->r.requested == 4000 &&
               a0->r.stream == 1 && a0->r.thread == 1 && a0->r.stack != 0,
           "alloc 0");
    EXPECT(a1->r.addr == base + 4096 && a1->r.size == 512 && a1->r.requested == 512 && a1->r.stream == 2 &&
               (a1->r.flags & CUA_TRACE_F_EXACT) && a1->r.stack == 0,
           "alloc 1 (exact, no stack captured)");
    EXPECT(a2->r.addr == base - 512 * 7 && a2->r.size == 1536 && a2->r.requested == 1, "alloc 2 (backwards)");
    EXPECT(a3->r.dev == 200 && a3->r.addr == 0x1001 && a3->r.size == 3 && a3->r.requested == 3 &&
               (a3->r.flags & CUA_TRACE_F_BYTES) && a3->r.stream == 3,
           "alloc 3 (bytes)");
    EXPECT(a4->r.addr == 0xffffffffffff0000ull && a4->r.size == 65536 && a4->r.requested == 65535, "alloc 4 (high)");
    EXPECT(a5->r.dev == 5 && a5->r.addr == base + 8192 && a5->r.size == 1024, "alloc after unknown records");
    const rec_t *f0 = nth_of(&t, CUA_TRACE_FREE, 0), *f1 = nth_of(&t, CUA_TRACE_FREE, 1);
    EXPECT(f0 && f0->r.addr == base && f0->r.size == 4096 && f0->r.stream == 1 && (f0->r.flags & CUA_TRACE_F_COMPLETED),
           "free 0 (completed at once)");
    EXPECT(f1 && f1->r.addr == base + 4096 && f1->r.size == 512 && !(f1->r.flags & CUA_TRACE_F_COMPLETED), "free 1 (requested)");
    x = nth_of(&t, CUA_TRACE_FREE_DONE, 0);
    EXPECT(x && x->r.addr == base + 4096 && x->r.size == 512 && x->r.stream == 2, "free done");
    x = nth_of(&t, CUA_TRACE_MAP, 0);
    EXPECT(x && x->r.dev == 5 && x->r.addr == base && x->r.size == 20 * MiB, "map");
    x = nth_of(&t, CUA_TRACE_UNMAP, 0);
    EXPECT(x && x->r.addr == base && x->r.size == 20 * MiB, "unmap");
    x = nth_of(&t, CUA_TRACE_TRIM, 0);
    EXPECT(x && x->r.dev == 5, "trim");
    x = nth_of(&t, CUA_TRACE_OOM, 0);
    EXPECT(x && x->r.dev == 5 && x->r.stream == 1 && x->r.u.oom.requested == 123456789 &&
               x->r.u.oom.rounded == 123457024 && x->r.u.oom.capacity == 79 * GiB && x->r.u.oom.allocated == 5 * GiB &&
               x->r.u.oom.reserved == 6 * GiB && x->r.u.oom.device_free == 77 * GiB && x->r.u.oom.largest_free == 1 * GiB &&
               x->r.u.oom.vmm_failure == CUA_TRACE_VMM_CHUNKS,
           "oom");
    x = nth_of(&t, CUA_TRACE_MARK, 0);
    EXPECT(x && strcmp(x->s1, "step 1") == 0, "mark");
    x = nth_of(&t, CUA_TRACE_MARK, 1);
    EXPECT(x && strlen(x->s1) == 1024, "long mark cut to 1024, got %zu", strlen(x->s1));
    x = nth_of(&t, CUA_TRACE_MARK, 2);
    EXPECT(x && strlen(x->s1) >= 1021 && strlen(x->s1) <= 1024, "long non-UTF-8 mark cut to 1021-1024 bytes, got %zu",
           x ? strlen(x->s1) : 0);
    x = nth_of(&t, CUA_TRACE_INIT_MAP, 0);
    EXPECT(x && x->r.addr == base + 64 * MiB && x->r.size == 2 * MiB, "init map");
    x = nth_of(&t, CUA_TRACE_INIT_BLOCK, 0);
    EXPECT(x && x->r.addr == base + 64 * MiB && x->r.size == 1024 && x->r.requested == 1000 && x->r.stream == 1 &&
               x->r.stack == 0,
           "init block");
    size_t unknown = 0;
    for (size_t i = 0; i < t.n; i++)
        if (!t.recs[i].r.known) {
            unknown++;
            EXPECT(t.recs[i].r.type == 31 || t.recs[i].r.type == 99, "unknown type %u", t.recs[i].r.type);
        }
    EXPECT(unknown == 2, "2 unknown records, got %zu", unknown);
    x = nth_of(&t, CUA_TRACE_END, 0);
    EXPECT(x && x == &t.recs[t.n - 1], "END last");
    EXPECT(x->r.u.end.reason == CUA_TRACE_END_STOP && x->r.u.end.ndev == 1 && x->end[0].dev == 5 &&
               x->end[0].nfields == CUA_TRACE_STAT_COUNT && x->end[0].v[CUA_TRACE_STAT_REQUESTED_PEAK] == 42 &&
               x->end[0].v[CUA_TRACE_STAT_NUM_TRIMS] == 7 && x->end[0].v[CUA_TRACE_STAT_CAPACITY] == 79 * GiB,
           "end");
    /* Times: the counter clock, 1000 ns per event, nondecreasing. */
    uint64_t last = 0;
    for (size_t i = 0; i < t.n; i++)
        if (t.recs[i].r.known && t.recs[i].r.type >= CUA_TRACE_FIRST_EVENT) {
            EXPECT(t.recs[i].r.time_ns >= last && t.recs[i].r.time_ns % 1000 == 0, "time");
            last = t.recs[i].r.time_ns;
        }
    /* Every record type was seen. */
    for (int ty = CUA_TRACE_PROCESS; ty <= CUA_TRACE_END; ty++)
        if (tr_type_name((uint8_t)ty) && ty != CUA_TRACE_PYFRAME)
            EXPECT(count_type(&t, (uint8_t)ty) > 0, "no %s record", tr_type_name((uint8_t)ty));
    trace_free(&t);
}

/* ---- stacks */

EXPORT __attribute__((noinline)) void *site_alpha(size_t n);
EXPORT __attribute__((noinline)) void *site_beta(size_t n);
EXPORT __attribute__((noinline)) void *site_deep(int depth, size_t n);
void *site_alpha(size_t n)
{
    void *p = cualloc_malloc(n, 0, NULL);
    __asm__ volatile("" ::: "memory"); /* no tail call */
    return p;
}
void *site_beta(size_t n)
{
    void *p = cualloc_malloc(n, 0, NULL);
    __asm__ volatile("" ::: "memory");
    return p;
}
void *site_deep(int depth, size_t n)
{
    void *p = depth > 0 ? site_deep(depth - 1, n) : cualloc_malloc(n, 0, NULL);
    __asm__ volatile("" ::: "memory");
    return p;
}

static const char *frame_symbol(uint64_t ret_addr)
{
    Dl_info info;
    if (!dladdr((void *)(uintptr_t)(ret_addr - 1), &info) || !info.dli_sname)
        return "?";
    return info.dli_sname;
}

static void stacks_body(void)
{
    char path[300];
    path_of(path, sizeof path, "stacks.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start: %s", msgs);
    void *p[8];
    volatile int twice = 2; /* a loop the compiler cannot unroll: one call site, twice */
    for (int i = 0; i < twice; i++) {
        p[i * 2] = site_alpha(1000 + (size_t)i * 1000);
        if (i == 0)
            p[1] = site_beta(1000);
    }
    p[3] = site_deep(40, 512);
    /* Python frames: three, innermost first; once with co_qualname, once without. */
    fobj_t n1 = {F_STR, "train_step", 0, 0, 0, 0, 0}, f1 = {F_STR, "/job/train.py", 0, 0, 0, 0, 0};
    fobj_t n2 = {F_STR, "Model.forward", 0, 0, 0, 0, 0}, f2 = {F_STR, "/job/model.py", 0, 0, 0, 0, 0};
    fobj_t c1 = {F_CODE, NULL, 0, 0, 0, &n1, &f1}, c2 = {F_CODE, NULL, 0, 0, 0, &n2, &f2};
    fobj_t outer = {F_FRAME, NULL, 10, NULL, &c1, 0, 0};
    fobj_t mid = {F_FRAME, NULL, 42, &outer, &c2, 0, 0};
    fobj_t inner = {F_FRAME, NULL, 43, &mid, &c2, 0, 0};
    fake_top = &inner;
    fake_gil = 1;
    for (int i = 0; i < twice; i++) {
        fake_no_qualname = i == 1;
        p[4 + i] = site_alpha(3000);
    }
    fake_gil = 0;
    EXPECT(atomic_load(&fake_refs) == 0, "%d Python references not released", atomic_load(&fake_refs));
    for (int i = 0; i < 6; i++)
        cualloc_free(p[i], NULL);
    cualloc_trace_stop();

    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    const rec_t *a[6];
    for (int i = 0; i < 6; i++) {
        a[i] = nth_of(&t, CUA_TRACE_ALLOC, (size_t)i);
        EXPECT(a[i] && a[i]->nframes > 0, "alloc %d has a stack", i);
        EXPECT(a[i]->frames[0].kind == CUA_TRACE_FRAME_NATIVE, "innermost frame is native");
    }
    EXPECT(strcmp(frame_symbol(a[0]->frames[0].addr), "site_alpha") == 0, "innermost frame of alloc 0 is %s",
           frame_symbol(a[0]->frames[0].addr));
    EXPECT(strcmp(frame_symbol(a[1]->frames[0].addr), "site_beta") == 0, "innermost frame of alloc 1 is %s",
           frame_symbol(a[1]->frames[0].addr));
    EXPECT(a[0]->r.stack != a[1]->r.stack, "different call sites, different stacks");
    EXPECT(a[0]->r.stack == a[2]->r.stack, "same call site, same stack id (dedup)");
    EXPECT(a[3]->nframes == 16, "depth limit: %zu native frames, want 16", a[3]->nframes);
    for (size_t i = 0; i < 16; i++)
        EXPECT(strcmp(frame_symbol(a[3]->frames[i].addr), "site_deep") == 0, "deep frame %zu is %s", i,
               frame_symbol(a[3]->frames[i].addr));
    /* With the GIL: the native part first (innermost), then the Python frames, outermost last. */
    EXPECT(a[4]->nframes == a[0]->nframes + 3, "python frames added: %zu vs %zu", a[4]->nframes, a[0]->nframes);
    size_t nn = a[0]->nframes;
    EXPECT(a[4]->frames[nn].kind == CUA_TRACE_FRAME_PYTHON && a[4]->frames[nn].line == 43 &&
               a[4]->frames[nn + 1].line == 42 && a[4]->frames[nn + 2].line == 10 &&
               a[4]->frames[nn + 2].kind == CUA_TRACE_FRAME_PYTHON,
           "python frames in order");
    EXPECT(strcmp(a[4]->s1, "Model.forward") == 0 && strcmp(a[4]->s2, "/job/model.py") == 0, "python names %s %s",
           a[4]->s1, a[4]->s2);
    EXPECT(a[5]->r.stack == a[4]->r.stack, "co_name fallback gives the same frames (names equal here)");
    EXPECT(count_type(&t, CUA_TRACE_PYFRAME) == 3, "3 python frames defined, got %zu", count_type(&t, CUA_TRACE_PYFRAME));
    check_consistent(&t, "stacks");
    trace_free(&t);

    /* trace_stack_depth:0: no stacks, no modules. */
    path_of(path, sizeof path, "nostacks.trace");
    conf_t c = base_conf();
    c.trace_stack_depth = 0;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    cualloc_free(site_alpha(100), NULL);
    cualloc_trace_stop();
    trace_read(path, &t);
    EXPECT(t.status == 0 && count_type(&t, CUA_TRACE_STACK) == 0 && count_type(&t, CUA_TRACE_MODULE) == 0 &&
               nth_of(&t, CUA_TRACE_ALLOC, 0)->r.stack == 0,
           "depth 0");
    trace_free(&t);
}

/* A trace started mid-run: the live blocks and mapped memory first, then events. The allocations
 * before it took the fast path; those after it record their stacks, here and in a second trace
 * after a stop (the fast path served in between). Exported: the stacks are checked to start here. */
EXPORT __attribute__((noinline)) void midrun_body(void);
void midrun_body(void)
{
    void *before[20];
    for (int i = 0; i < 20; i++)
        before[i] = cualloc_malloc((size_t)(i + 1) * 100000, i % 2, (void *)(uintptr_t)(i % 3));
    for (int i = 0; i < 20; i += 3) {
        cualloc_free(before[i], NULL);
        before[i] = NULL;
    }
    char path[300];
    path_of(path, sizeof path, "midrun.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start");
    EXPECT(cualloc_trace_start(path) == -1, "a second start is refused");
    for (int i = 0; i < 20; i++)
        cualloc_free(before[i], NULL);
    void *q = cualloc_malloc(12345, 1, NULL);
    cualloc_free(q, NULL);
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    EXPECT(count_type(&t, CUA_TRACE_INIT_BLOCK) == 13, "13 live blocks, got %zu", count_type(&t, CUA_TRACE_INIT_BLOCK));
    EXPECT(count_type(&t, CUA_TRACE_INIT_MAP) >= 2, "mapped ranges of both devices");
    EXPECT(count_type(&t, CUA_TRACE_FREE) == 14 && count_type(&t, CUA_TRACE_ALLOC) == 1, "events after the start");
    /* INIT records come before any event. */
    bool event_seen = false;
    for (size_t i = 0; i < t.n; i++) {
        uint8_t ty = t.recs[i].r.type;
        if (ty == CUA_TRACE_ALLOC || ty == CUA_TRACE_FREE)
            event_seen = true;
        if (ty == CUA_TRACE_INIT_BLOCK || ty == CUA_TRACE_INIT_MAP)
            EXPECT(!event_seen, "INIT record after an event");
    }
    const rec_t *a = nth_of(&t, CUA_TRACE_ALLOC, 0);
    EXPECT(a && a->nframes > 0 && strcmp(frame_symbol(a->frames[0].addr), "midrun_body") == 0,
           "the first allocation after the start has its stack");
    check_consistent_(&t, "midrun", false);
    trace_free(&t);

    for (int i = 0; i < 100; i++)
        cualloc_free(cualloc_malloc(12345, 1, NULL), NULL);
    path_of(path, sizeof path, "midrun2.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start again");
    cualloc_free(cualloc_malloc(12345, 1, NULL), NULL);
    cualloc_trace_stop();
    trace_read(path, &t);
    a = nth_of(&t, CUA_TRACE_ALLOC, 0);
    EXPECT(count_type(&t, CUA_TRACE_ALLOC) == 1 && a->nframes > 0 &&
               strcmp(frame_symbol(a->frames[0].addr), "midrun_body") == 0,
           "the allocation in the second trace has its stack");
    trace_free(&t);
}

/* Classic segments are recorded as maps and unmaps (trim releases them). Exported: the OOM's
 * stack is checked to start here. */
EXPORT __attribute__((noinline)) void classic_body(void);
void classic_body(void)
{
    char path[300];
    path_of(path, sizeof path, "classic.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start");
    void *p = cualloc_malloc(5 * MiB, 0, NULL), *q = cualloc_malloc(100, 0, NULL);
    cualloc_free(p, NULL);
    cualloc_free(q, NULL);
    cualloc_trim(0);
    void *big = cualloc_malloc(100 * GiB, 0, NULL); /* OOM */
    EXPECT(big == NULL, "OOM");
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    EXPECT(count_type(&t, CUA_TRACE_MAP) == 2 && count_type(&t, CUA_TRACE_UNMAP) == 2, "2 segments mapped and unmapped");
    EXPECT(nth_of(&t, CUA_TRACE_MAP, 0)->r.size == 20 * MiB && nth_of(&t, CUA_TRACE_MAP, 1)->r.size == 2 * MiB,
           "PyTorch's segment sizes");
    const rec_t *o = nth_of(&t, CUA_TRACE_OOM, 0);
    EXPECT(o && o->r.u.oom.requested == 100 * GiB && o->r.u.oom.capacity == 256 * MiB && o->nframes > 0 &&
               strcmp(frame_symbol(o->frames[0].addr), "classic_body") == 0,
           "OOM record with its stack");
    const rec_t *d = nth_of(&t, CUA_TRACE_DEVICE, 0);
    EXPECT(d->r.u.device.mode == CUA_TRACE_MODE_CLASSIC, "classic mode recorded");
    check_consistent(&t, "classic");
    trace_free(&t);
}

/* ---- threads */

#define NTHREADS 6
#define PER_THREAD 4000

/* The threads' first allocations start together: the first stack captures of a process race to
 * resolve CPython's API (a race the TSan build reports). */
static pthread_barrier_t threads_start;

/* One step of a thread's churn: a random slot of live[nlive] is freed, or filled with a new block
 * of up to max_bytes on device dev and stream s. */
static void churn_step(rng_t *r, void **live, int nlive, int dev, cua_stream s, size_t max_bytes)
{
    int k = (int)rng_below(r, (uint64_t)nlive);
    if (live[k]) {
        cualloc_free(live[k], s);
        live[k] = NULL;
    } else {
        live[k] = cualloc_malloc(rng_tensor_size(r, max_bytes), dev, s);
        EXPECT(live[k], "alloc failed");
    }
}

static void *thread_main(void *arg)
{
    rng_t r = {seed ^ (uint64_t)(uintptr_t)arg * 7919};
    void *live[64] = {0};
    cua_stream s = (cua_stream)(uintptr_t)((uintptr_t)arg % 3);
    int dev = (int)((uintptr_t)arg % 2);
    pthread_barrier_wait(&threads_start);
    for (int i = 0; i < PER_THREAD; i++) {
        churn_step(&r, live, 64, dev, s, 8 * MiB);
        if (i % 1000 == 0)
            cualloc_mark("tick");
    }
    for (int k = 0; k < 64; k++)
        cualloc_free(live[k], s);
    return NULL;
}

static void threads_body(void)
{
    char path[300];
    path_of(path, sizeof path, "threads.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start");
    pthread_t th[NTHREADS];
    pthread_barrier_init(&threads_start, NULL, NTHREADS);
    for (uintptr_t i = 0; i < NTHREADS; i++)
        pthread_create(&th[i], NULL, thread_main, (void *)i);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&threads_start);
    cualloc_stats s0, s1;
    cualloc_get_stats(0, &s0);
    cualloc_get_stats(1, &s1);
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    check_consistent(&t, "threads");
    EXPECT(t.acct.num_allocs == s0.num_allocs + s1.num_allocs && t.acct.num_frees == s0.num_frees + s1.num_frees,
           "allocs %llu frees %llu vs heap %llu %llu", (unsigned long long)t.acct.num_allocs,
           (unsigned long long)t.acct.num_frees, (unsigned long long)(s0.num_allocs + s1.num_allocs),
           (unsigned long long)(s0.num_frees + s1.num_frees));
    EXPECT(t.acct.live.count == 0, "nothing live at the end");
    EXPECT(count_type(&t, CUA_TRACE_THREAD) == NTHREADS + 1, "%zu threads", count_type(&t, CUA_TRACE_THREAD));
    EXPECT(count_type(&t, CUA_TRACE_MARK) == NTHREADS * (PER_THREAD / 1000), "marks");
    /* Each thread's events carry its own id; every thread id has events. */
    size_t per[NTHREADS + 2] = {0};
    for (size_t i = 0; i < t.n; i++)
        if (t.recs[i].r.type == CUA_TRACE_ALLOC && t.recs[i].r.thread <= NTHREADS + 1)
            per[t.recs[i].r.thread]++;
    size_t with = 0;
    for (int i = 1; i <= NTHREADS + 1; i++)
        with += per[i] > 0;
    EXPECT(with == NTHREADS, "%zu threads have allocs", with);
    trace_free(&t);
}

/* Starts and stops while other threads allocate and free on both devices without pause: each trace
 * must still be whole (its INIT records and events account for every free, and its END statistics
 * are the heap's at the moment its last event was written), whatever the threads did meanwhile.
 * With trace_max_mb, every other trace is left to end at the size limit, and the next start must
 * still find every heap ready to record. */
#define TOGGLE_ROUNDS 12
static atomic_bool toggle_done;

static void *toggle_thread(void *arg)
{
    rng_t r = {seed ^ (uint64_t)(uintptr_t)arg * 104729};
    void *live[32] = {0};
    cua_stream s = (cua_stream)(uintptr_t)((uintptr_t)arg % 3);
    int dev = (int)((uintptr_t)arg % 2);
    pthread_barrier_wait(&threads_start);
    while (!atomic_load(&toggle_done))
        churn_step(&r, live, 32, dev, s, 2 * MiB);
    for (int k = 0; k < 32; k++)
        cualloc_free(live[k], s);
    return NULL;
}

static void toggle_body(void)
{
    pthread_t th[NTHREADS];
    pthread_barrier_init(&threads_start, NULL, NTHREADS + 1);
    for (uintptr_t i = 0; i < NTHREADS; i++)
        pthread_create(&th[i], NULL, toggle_thread, (void *)i);
    pthread_barrier_wait(&threads_start);
    rng_t r = {seed ^ 0x70991e};
    int limited = 0; /* rounds the size limit ended (trace_max_mb) */
    for (int round = 0; round < TOGGLE_ROUNDS; round++) {
        usleep((useconds_t)(200 + rng_below(&r, 3000)));
        char path[300], what[32];
        snprintf(path, sizeof path, "%s/toggle%d.trace", dir, round);
        EXPECT(cualloc_trace_start(path) == 0, "start %d: %s", round, msgs);
        if (api_conf()->trace_max && round % 2) {
            /* Odd rounds wait for the size limit to end the trace (the threads fill 1 MiB in a
             * few milliseconds); the stop then finds it closed. */
            for (int ms = 0; ms < 20000 && trace_active(); ms++)
                usleep(1000);
        } else {
            usleep((useconds_t)(200 + rng_below(&r, 5000)));
        }
        cualloc_trace_stop();
        trace_t t;
        trace_read_(path, &t, false); /* the accounting only: a round can hold 10^5 events */
        snprintf(what, sizeof what, "round %d", round);
        check_consistent_(&t, what, false);
        limited += t.acct.end_reason == CUA_TRACE_END_LIMIT;
        trace_free(&t);
        unlink(path);
    }
    if (api_conf()->trace_max)
        EXPECT(limited >= TOGGLE_ROUNDS / 2, "%d of %d rounds ended by the size limit", limited, TOGGLE_ROUNDS);
    atomic_store(&toggle_done, true);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&threads_start);
}

/* ---- file safety */

static void test_symlink_refused(void)
{
    char path[300], target[300];
    path_of(path, sizeof path, "planted.trace");
    path_of(target, sizeof target, "victim.txt");
    int fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT(fd >= 0 && write(fd, "precious\n", 9) == 9, "victim");
    close(fd);
    EXPECT(symlink(target, path) == 0, "symlink: %s", strerror(errno));
    msgs_clear();
    EXPECT(cualloc_trace_start(path) == -1, "a symlink at the path must be refused");
    EXPECT(strstr(msgs, "symbolic link"), "message: %s", msgs);
    EXPECT(file_size(target) == 9, "the link's target is untouched");
    char alt[320];
    snprintf(alt, sizeof alt, "%s.1", path);
    EXPECT(access(alt, F_OK) != 0, "no fallback file next to a planted link");
    /* A directory or a FIFO named as the trace: refused, with no PATH.1 beside it. */
    for (int k = 0; k < 2; k++) {
        path_of(path, sizeof path, k == 0 ? "tracedir" : "tracefifo");
        EXPECT((k == 0 ? mkdir(path, 0700) : mkfifo(path, 0600)) == 0, "%s: %s", path, strerror(errno));
        msgs_clear();
        EXPECT(cualloc_trace_start(path) == -1, "%s as the trace must be refused", path);
        EXPECT(strstr(msgs, k == 0 ? "is a directory, not a file" : "is a device, FIFO or socket, not a file"),
               "message: %s", msgs);
        snprintf(alt, sizeof alt, "%s.1", path);
        EXPECT(access(alt, F_OK) != 0, "no %s beside it", alt);
        remove(path);
    }
    /* A dangling link too. */
    path_of(path, sizeof path, "dangling.trace");
    path_of(target, sizeof target, "nonexistent/nowhere");
    EXPECT(symlink(target, path) == 0, "symlink");
    EXPECT(cualloc_trace_start(path) == -1, "a dangling symlink must be refused");
    EXPECT(!trace_active(), "not tracing");
    printf("ok   symlink refused\n");
}

static void test_existing_kept(void)
{
    char path[300], alt[320];
    path_of(path, sizeof path, "existing.trace");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT(fd >= 0 && write(fd, "old trace", 9) == 9, "existing");
    close(fd);
    msgs_clear();
    EXPECT(cualloc_trace_start(path) == 0, "start");
    cualloc_free(cualloc_malloc(100, 0, NULL), NULL);
    char now[320];
    trace_path(now, sizeof now);
    cualloc_trace_stop();
    snprintf(alt, sizeof alt, "%s.1", path);
    EXPECT(strcmp(now, alt) == 0, "wrote %s, want %s", now, alt);
    EXPECT(strstr(msgs, "exists") && strstr(msgs, alt), "message: %s", msgs);
    EXPECT(file_size(path) == 9, "the existing file is untouched");
    struct stat st;
    EXPECT(stat(alt, &st) == 0 && (st.st_mode & 0777) == 0600, "created 0600 (mode %o)", st.st_mode & 0777);
    /* Again: .2 */
    EXPECT(cualloc_trace_start(path) == 0, "start again");
    trace_path(now, sizeof now);
    cualloc_trace_stop();
    snprintf(alt, sizeof alt, "%s.2", path);
    EXPECT(strcmp(now, alt) == 0, "wrote %s, want %s", now, alt);
    printf("ok   existing file kept\n");
}

/* ---- size bounds */

static void limit_body(void)
{
    char path[300];
    path_of(path, sizeof path, "limit.trace");
    conf_t c = base_conf();
    c.trace_max = 1 * MiB;
    msgs_clear();
    EXPECT(api_trace_start(path, &c) == 0, "start");
    rng_t r = {seed};
    uint64_t pairs = 0;
    while (trace_active() && pairs < 10000000) {
        void *p = site_alpha(rng_tensor_size(&r, 4 * MiB));
        cualloc_free(p, NULL);
        pairs++;
    }
    EXPECT(!trace_active(), "the limit stopped tracing");
    EXPECT(strstr(msgs, "trace_max_mb"), "message: %s", msgs);
    for (int i = 0; i < 100; i++) /* allocation goes on */
        cualloc_free(site_alpha(1000), NULL);
    EXPECT(file_size(path) <= (off_t)MiB, "file %lld bytes", (long long)file_size(path));
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0 && t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_LIMIT, "END(limit): %s", t.error);
    EXPECT(t.acct.num_allocs > 20000 && t.acct.num_allocs <= pairs, "%llu allocs recorded of %llu",
           (unsigned long long)t.acct.num_allocs, (unsigned long long)pairs);
    EXPECT(t.acct.unmatched_frees == 0, "consistent prefix");
    trace_free(&t);
}

/* A kernel with 64 KiB pages (many aarch64 systems): the header takes a page, so every block's
 * mapping starts on one (at 4 KiB it would not, and no block could be mapped); in a ring bounded by
 * trace_max_mb too. A page size that does not divide the blocks turns tracing off with a message. */
static void page_64k_body(void)
{
    char path[300];
    for (int ring = 0; ring < 2; ring++) {
        path_of(path, sizeof path, ring ? "page64k-ring.trace" : "page64k.trace");
        conf_t c = base_conf();
        c.trace_ring = ring;
        c.trace_max = ring ? 65536 + 6 * (size_t)CUA_TRACE_BLOCK_SIZE : 0;
        trace_set_page_size(65536);
        msgs_clear();
        EXPECT(api_trace_start(path, &c) == 0, "start with 64 KiB pages: %s", msgs);
        for (int i = 0; i < (ring ? 40000 : 300); i++)
            cualloc_free(site_alpha(4096 + (size_t)(i % 5) * 512), NULL);
        cualloc_mark("last");
        EXPECT(trace_check(stderr) == 0, "the recorder's checker");
        cualloc_trace_stop();
        EXPECT(!ring || file_size(path) <= (off_t)c.trace_max, "file %lld bytes", (long long)file_size(path));
        trace_t t;
        trace_read(path, &t);
        EXPECT(t.status == 0 && t.info.header_size == 65536, "reader: %s; header %u bytes, want 65536", t.error,
               t.info.header_size);
        const rec_t *m = nth_of(&t, CUA_TRACE_MARK, count_type(&t, CUA_TRACE_MARK) - 1);
        EXPECT(m && strcmp(m->s1, "last") == 0 && count_type(&t, CUA_TRACE_ALLOC) > 0, "the last mark read back");
        trace_free(&t);
    }
    path_of(path, sizeof path, "page128k.trace");
    conf_t c = base_conf();
    trace_set_page_size(128 * 1024);
    msgs_clear();
    EXPECT(api_trace_start(path, &c) != 0 && strstr(msgs, "page size") && !trace_active(),
           "a page larger than a block: refused with a message (%s)", msgs);
    trace_set_page_size(0);
}

static uint8_t *slurp(const char *path, size_t *len);

/* A table refused host memory while recording: a LOST record per table, once each, before the
 * next record, and one message per file. The record takes no part in the delta state, so a reader
 * that does not know it (format 1.1) reads every other record the same: checked by reading the file
 * again with the LOST records' type changed to one no reader knows. */
static void lost_body(void)
{
    char path[300];
    path_of(path, sizeof path, "lost.trace");
    conf_t c = base_conf();
    msgs_clear();
    EXPECT(api_trace_start(path, &c) == 0, "start: %s", msgs);
    void *p0 = site_alpha(4000);
    trace_test_table_refused(CUA_TRACE_LOST_STACKS);
    void *p1 = site_alpha(1000);
    trace_test_table_refused(CUA_TRACE_LOST_STACKS); /* said and recorded already */
    trace_test_table_refused(CUA_TRACE_LOST_MODULES);
    cualloc_free(p0, NULL);
    trace_test_table_refused(9); /* a table a later format may add */
    cualloc_free(p1, NULL);
    EXPECT(strstr(msgs, "host memory ran out for the recorder's table under test"), "message: %s", msgs);
    const char *second = strstr(msgs, "host memory ran out");
    EXPECT(second && !strstr(second + 1, "host memory ran out"), "one message per file: %s", msgs);
    cualloc_trace_stop();

    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0 && t.acct.end_seen, "read: %s", t.error);
    EXPECT(count_type(&t, CUA_TRACE_LOST) == 3, "3 LOST records, got %zu", count_type(&t, CUA_TRACE_LOST));
    const rec_t *l0 = nth_of(&t, CUA_TRACE_LOST, 0), *l1 = nth_of(&t, CUA_TRACE_LOST, 1),
                *l2 = nth_of(&t, CUA_TRACE_LOST, 2);
    EXPECT(l0 && l0->r.known && l0->r.u.lost.table == CUA_TRACE_LOST_STACKS && l0->r.u.lost.since == l0->r.time_ns,
           "LOST stacks");
    EXPECT(l1 && l1->r.u.lost.table == CUA_TRACE_LOST_MODULES, "LOST modules");
    EXPECT(l2 && l2->r.u.lost.table == 9 && !tr_lost_table_name(9), "LOST of an unknown table");
    const rec_t *a0 = nth_of(&t, CUA_TRACE_ALLOC, 0), *a1 = nth_of(&t, CUA_TRACE_ALLOC, 1);
    EXPECT(a0 && a1 && a0->r.seq < l0->r.seq && l0->r.seq < a1->r.seq, "the record comes where the refusal was");
    EXPECT(a0->r.time_ns < l0->r.time_ns && l0->r.time_ns < a1->r.time_ns,
           "times in order (the counter clock: distinct)");
    EXPECT(t.acct.lost.tables == ((1ull << CUA_TRACE_LOST_STACKS) | (1ull << CUA_TRACE_LOST_MODULES) | (1ull << 9)),
           "acct tables 0x%llx", (unsigned long long)t.acct.lost.tables);
    EXPECT(t.acct.lost.time == l0->r.time_ns, "acct time");
    char text[160];
    tr_lost_tables_text(t.acct.lost.tables, text, sizeof text);
    EXPECT(strcmp(text, "stacks, modules, table 9") == 0, "text '%s'", text);
    /* The refusal's time, at the precision of the report's times: a sim trace's ticks are 1 us. */
    char warning[400], want[64];
    tr_lost_text(&t.acct.lost, &t.acct.first_time, warning, sizeof warning);
    snprintf(want, sizeof want, ") at %.6f s:", (double)(l0->r.time_ns - t.acct.first_time) / 1e9);
    EXPECT(l0->r.time_ns > t.acct.first_time && strstr(warning, want), "warning '%s', want '%s'", warning, want);
    /* The writer's delta state, read without the reader's handling of LOST: the counter clock
     * gives every event record (LOST too) the next 1000 ns, so each time is the one before it plus
     * 1000 only if the LOST records left the state alone. */
    uint64_t prev_time = 0;
    for (size_t i = 0; i < t.n; i++) {
        if (!t.recs[i].r.known || t.recs[i].r.type < CUA_TRACE_FIRST_EVENT)
            continue;
        EXPECT(t.recs[i].r.time_ns == prev_time + 1000, "record %zu (%s) at %llu ns, after %llu", i,
               tr_type_name(t.recs[i].r.type), (unsigned long long)t.recs[i].r.time_ns, (unsigned long long)prev_time);
        prev_time = t.recs[i].r.time_ns;
    }

    /* As a reader of format 1.1 sees it. */
    size_t len;
    uint8_t *buf = slurp(path, &len);
    EXPECT(buf, "read the file");
    for (size_t i = 0; i < t.n; i++) {
        if (t.recs[i].r.type != CUA_TRACE_LOST)
            continue;
        size_t at = (size_t)t.recs[i].r.offset;
        while (at < len && (buf[at] & 0x80)) /* the length's varint */
            at++;
        EXPECT(at + 1 < len && buf[at + 1] == CUA_TRACE_LOST, "the type byte of LOST at %zu", at + 1);
        buf[at + 1] = 120;
    }
    char old_path[320];
    path_of(old_path, sizeof old_path, "lost-as-unknown.trace");
    FILE *f = fopen(old_path, "wb");
    EXPECT(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0, "write the copy");
    free(buf);
    trace_t u;
    trace_read(old_path, &u);
    EXPECT(u.status == 0 && u.n == t.n && count_type(&u, CUA_TRACE_LOST) == 0 && u.acct.lost.tables == 0,
           "the copy: %s", u.error);
    for (size_t i = 0; i < t.n && i < u.n; i++) {
        if (t.recs[i].r.type == CUA_TRACE_LOST) {
            EXPECT(!u.recs[i].r.known && u.recs[i].r.type == 120, "record %zu unknown in the copy", i);
            continue;
        }
        EXPECT(u.recs[i].r.type == t.recs[i].r.type && u.recs[i].r.time_ns == t.recs[i].r.time_ns &&
                   u.recs[i].r.addr == t.recs[i].r.addr && u.recs[i].r.size == t.recs[i].r.size &&
                   u.recs[i].r.stream == t.recs[i].r.stream && u.recs[i].r.dev == t.recs[i].r.dev,
               "record %zu reads the same without LOST", i);
    }
    trace_free(&u);
    trace_free(&t);
}

/* In a ring, the block holding a LOST record is reused while the records that went without
 * survive: every new event block starts with the file's LOST records again, each saying when its
 * refusal came, so the window that survives still tells it, with the refusal's own time. */
static void lost_ring_body(void)
{
    char path[300];
    path_of(path, sizeof path, "lost-ring.trace");
    conf_t c = base_conf();
    c.trace_max = 1 * MiB;
    c.trace_ring = true;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    cualloc_free(site_alpha(1000), NULL);
    trace_test_table_refused(CUA_TRACE_LOST_STREAMS);
    rng_t r = {seed};
    for (int i = 0; i < 200000; i++)
        cualloc_free(site_alpha(rng_tensor_size(&r, 4 * MiB)), NULL);
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0 && t.info.overwritten, "an overwritten ring: %s", t.error);
    const rec_t *first = NULL;
    for (size_t i = 0; i < t.n && !first; i++)
        if (t.recs[i].r.known && t.recs[i].r.type >= CUA_TRACE_FIRST_EVENT)
            first = &t.recs[i];
    size_t n = count_type(&t, CUA_TRACE_LOST);
    EXPECT(n >= 2, "%zu LOST records in the window, want one per surviving event block", n);
    for (size_t i = 0; i < n; i++) {
        const rec_t *l = nth_of(&t, CUA_TRACE_LOST, i);
        EXPECT(l->r.u.lost.table == CUA_TRACE_LOST_STREAMS && l->r.u.lost.since == t.acct.lost.time &&
                   l->r.u.lost.since < first->r.time_ns && l->r.time_ns > l->r.u.lost.since,
               "LOST %zu: table %llu, since %llu (the window begins at %llu)", i,
               (unsigned long long)l->r.u.lost.table, (unsigned long long)l->r.u.lost.since,
               (unsigned long long)first->r.time_ns);
    }
    EXPECT(t.acct.lost.tables == 1ull << CUA_TRACE_LOST_STREAMS, "acct tables 0x%llx",
           (unsigned long long)t.acct.lost.tables);
    char text[400];
    tr_lost_text(&t.acct.lost, &t.acct.first_time, text, sizeof text);
    EXPECT(strstr(text, "(streams) before the first event here"), "text '%s'", text);
    trace_free(&t);
}

static void ring_body(void)
{
    char path[300];
    path_of(path, sizeof path, "ring.trace");
    conf_t c = base_conf();
    c.trace_max = 1 * MiB;
    c.trace_ring = true;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    rng_t r = {seed};
    void *keep = cualloc_malloc(777, 0, NULL);
    char label[32];
    int marks = 0;
    for (int i = 0; i < 300000; i++) {
        void *p = i % 2 ? site_alpha(rng_tensor_size(&r, 4 * MiB)) : site_beta(rng_tensor_size(&r, 4 * MiB));
        cualloc_free(p, NULL);
        if (i % 5000 == 0) {
            snprintf(label, sizeof label, "mark %d", marks++);
            cualloc_mark(label);
        }
    }
    cualloc_free(keep, NULL);
    EXPECT(trace_active(), "a ring never stops");
    cualloc_trace_stop();
    EXPECT(file_size(path) <= (off_t)MiB, "file %lld bytes", (long long)file_size(path));
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    EXPECT(t.info.ring && t.info.overwritten, "overwritten ring");
    EXPECT(t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_STOP, "END");
    /* Definitions survive: the stacks and thread of the newest events are known. */
    const rec_t *last_alloc = NULL;
    for (size_t i = 0; i < t.n; i++)
        if (t.recs[i].r.type == CUA_TRACE_ALLOC)
            last_alloc = &t.recs[i];
    EXPECT(last_alloc && last_alloc->nframes > 0 && last_alloc->r.thread == 1, "stacks survive the ring");
    EXPECT(count_type(&t, CUA_TRACE_PROCESS) == 1 && count_type(&t, CUA_TRACE_CONFIG) == 1, "process and config kept");
    /* The newest events are there: the last mark, then the free of `keep` (an unmatched free:
     * its alloc was overwritten). */
    const rec_t *m = NULL;
    for (size_t i = 0; i < t.n; i++)
        if (t.recs[i].r.type == CUA_TRACE_MARK)
            m = &t.recs[i];
    snprintf(label, sizeof label, "mark %d", marks - 1);
    EXPECT(m && strcmp(m->s1, label) == 0, "last mark %s", m ? m->s1 : "-");
    EXPECT(t.acct.unmatched_frees >= 1, "the free of a block allocated before the window");
    /* Events are contiguous in sequence from the oldest surviving one. */
    uint64_t prev = 0;
    for (size_t i = 0; i < t.n; i++) {
        EXPECT(t.recs[i].r.seq > prev, "sequence increases");
        prev = t.recs[i].r.seq;
    }
    EXPECT(t.acct.num_allocs < 300000 && t.acct.num_allocs > 10000, "%llu allocs in the window",
           (unsigned long long)t.acct.num_allocs);
    trace_free(&t);
}

/* A distinct call stack for every `bits` (depth frames of site_bits, each returning to one of two
 * call sites): new STACK definitions at will. */
EXPORT __attribute__((noinline)) void *site_bits(unsigned bits, int depth, size_t n);
void *site_bits(unsigned bits, int depth, size_t n)
{
    void *p;
    if (depth == 0) {
        p = cualloc_malloc(n, 0, NULL);
    } else if (bits & 1) {
        p = site_bits(bits >> 1, depth - 1, n);
        __asm__ volatile("nop" ::: "memory"); /* unlike the other branch: two return addresses */
    } else {
        p = site_bits(bits >> 1, depth - 1, n);
        __asm__ volatile("" ::: "memory");
    }
    __asm__ volatile("" ::: "memory");
    return p;
}

/* Starts a ring of 4 blocks (2 may hold definitions) in dir/name and fills it with events of few
 * definitions; the messages cleared first. Its configuration. */
static conf_t start_filled_small_ring(char *path, size_t len, const char *name)
{
    path_of(path, len, name);
    conf_t c = base_conf();
    c.trace_max = CUA_TRACE_HEADER_SIZE + 4 * (size_t)CUA_TRACE_BLOCK_SIZE;
    c.trace_ring = true;
    msgs_clear();
    EXPECT(api_trace_start(path, &c) == 0, "start");
    for (int i = 0; i < 40000; i++)
        cualloc_free(site_alpha(4096 + (size_t)(i % 7) * 512), NULL);
    return c;
}

/* New definitions once a ring has filled: the oldest EVENT block becomes a META block while the
 * definitions use under half the file (it stopped tracing with "reached trace_max_mb", as if the
 * file were linear); past half, new stacks are recorded as unknown (id 0) and tracing goes on. */
static void ring_definitions_body(void)
{
    char path[300];
    conf_t c = start_filled_small_ring(path, sizeof path, "ring-defs.trace");
    unsigned bits = 0;
    for (; bits < 1u << 14 && !strstr(msgs, "fill half"); bits++) {
        EXPECT(trace_active(), "new definitions stopped the ring after %u stacks: %s", bits, msgs);
        cualloc_free(site_bits(bits, 14, 4096), NULL);
    }
    EXPECT(strstr(msgs, "fill half"), "%u new stacks did not fill half the file: %s", bits, msgs);
    cualloc_free(site_bits(bits, 14, 4096), NULL); /* a stack past the limit */
    EXPECT(trace_active(), "a full definitions area stopped the ring");
    cualloc_mark("after the stacks");
    cualloc_trace_stop();
    EXPECT(file_size(path) <= (off_t)c.trace_max, "file %lld bytes", (long long)file_size(path));
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    EXPECT(t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_STOP, "END(stop), not %d", (int)t.acct.end_reason);
    const rec_t *m = nth_of(&t, CUA_TRACE_MARK, count_type(&t, CUA_TRACE_MARK) - 1);
    EXPECT(m && strcmp(m->s1, "after the stacks") == 0, "the last mark: %s", m ? m->s1 : "-");
    /* The last three allocations: the last stack defined (bits - 2: its frames read back, from a
     * META block that was an EVENT block), the one whose definition hit the limit, and the one
     * after it: both unknown. */
    size_t nallocs = count_type(&t, CUA_TRACE_ALLOC);
    for (size_t k = 1; k <= 2; k++) {
        const rec_t *a = nth_of(&t, CUA_TRACE_ALLOC, nallocs - k);
        EXPECT(a && a->r.stack == 0, "allocation %zu from the end: stack id %u, want 0 (unknown)", k, a ? a->r.stack : 0);
    }
    const rec_t *defined = nth_of(&t, CUA_TRACE_ALLOC, nallocs - 3);
    EXPECT(defined && defined->r.stack != 0 && defined->nframes >= 14, "the last defined stack: id %u, %zu frames",
           defined ? defined->r.stack : 0, defined ? defined->nframes : 0);
    EXPECT(count_type(&t, CUA_TRACE_STACK) > 1000, "%zu stacks defined", count_type(&t, CUA_TRACE_STACK));
    trace_free(&t);
}

/* Python frames first seen once a ring's definitions fill half the file: they stay undefined
 * (their allocations' stacks unknown) and the recorder keeps none of their strings. The checker,
 * after each allocation, holds the arena of frame names to exactly the defined frames' strings:
 * before, each undefined frame kept its two copies (about 1 KB per allocation here, without
 * bound). */
static void ring_pyframes_body(void)
{
    char path[300];
    start_filled_small_ring(path, sizeof path, "ring-pyframes.trace");
    char name[420], file[420];
    fobj_t n1 = {F_STR, name, 0, 0, 0, 0, 0}, f1 = {F_STR, file, 0, 0, 0, 0, 0};
    fobj_t c1 = {F_CODE, NULL, 0, 0, 0, &n1, &f1};
    fobj_t fr = {F_FRAME, NULL, 7, NULL, &c1, 0, 0};
    fake_top = &fr;
    fake_gil = 1;
    int after = -1, k = 0;
    for (; k < 4000 && after < 300; k++) {
        snprintf(name, sizeof name, "layer_%d.%0400d", k, 0);
        snprintf(file, sizeof file, "/job/model_%d.%0400d.py", k, 0);
        cualloc_free(site_alpha(4096), NULL);
        EXPECT(trace_check(stderr) == 0, "the recorder's checker after Python frame %d", k);
        if (after >= 0 || strstr(msgs, "fill half"))
            after++;
    }
    fake_gil = 0;
    EXPECT(after >= 300, "%d new Python frames did not fill half the file: %s", k, msgs);
    EXPECT(atomic_load(&fake_refs) == 0, "%d Python references not released", atomic_load(&fake_refs));
    EXPECT(trace_active(), "a full definitions area stopped the ring");
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    size_t nallocs = count_type(&t, CUA_TRACE_ALLOC);
    const rec_t *last = nth_of(&t, CUA_TRACE_ALLOC, nallocs - 1);
    EXPECT(last && last->r.stack == 0, "the last allocation's stack id %u, want 0 (unknown)", last ? last->r.stack : 0);
    trace_free(&t);
}

/* A ring in which several META blocks take EVENT blocks' places, round after round of new stacks
 * and events: each takes the oldest EVENT block, which the rotation has by then moved to a lower
 * file position than the previous META block's, so META blocks are out of file order. The reader
 * reads them by serial: the whole trace, its END and its last mark. */
static void ring_meta_order_body(void)
{
    char path[300];
    path_of(path, sizeof path, "ring-meta-order.trace");
    conf_t c = base_conf();
    c.trace_max = CUA_TRACE_HEADER_SIZE + 16 * (size_t)CUA_TRACE_BLOCK_SIZE;
    c.trace_ring = true;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    for (int i = 0; i < 100000; i++) /* fills the ring */
        cualloc_free(site_alpha(4096 + (size_t)(i % 7) * 512), NULL);
    unsigned bits = 0;
    for (int round = 0; round < 6; round++) {
        for (int k = 0; k < 400; k++, bits++)
            cualloc_free(site_bits(bits, 14, 4096), NULL);
        for (int i = 0; i < 5000; i++)
            cualloc_free(site_alpha(4096 + (size_t)(i % 7) * 512), NULL);
    }
    cualloc_mark("after the rounds");
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    EXPECT(t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_STOP, "END(stop) not read back");
    const rec_t *m = nth_of(&t, CUA_TRACE_MARK, count_type(&t, CUA_TRACE_MARK) - 1);
    EXPECT(m && strcmp(m->s1, "after the rounds") == 0, "the last mark: %s", m ? m->s1 : "-");
    trace_free(&t);
}

/* Random operations (allocations from a few call sites and from ever new stacks, frees, marks,
 * trims) into a small file of 4 KiB blocks, ring and linear, with the recorder's checker after each:
 * the ring wraps, META blocks take the oldest EVENT blocks' places until the definitions fill half
 * the file, the linear file stops at its bound. The model is the marks, numbered: a ring keeps a
 * contiguous run of the newest, ending with the last; a linear file a run from the first. Then, in the
 * ring, the checker against the recorder's state broken one way at a time. */
static void ring_random_run(bool ring, rng_t *r)
{
    char path[300];
    path_of(path, sizeof path, ring ? "random-ring.trace" : "random-linear.trace");
    trace_set_block_size(4096);
    conf_t c = base_conf();
    c.trace_max = CUA_TRACE_HEADER_SIZE + 10 * (size_t)4096;
    c.trace_ring = ring;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    EXPECT(trace_check(stderr) == 0, "a new file");
    void *live[16] = {0};
    int marks = 0, marks_recorded = 0;
    char label[32];
    unsigned bits = 0;
    for (int op = 0; op < 4000; op++) {
        unsigned dice = (unsigned)rng_below(r, 100);
        int k = (int)rng_below(r, 16);
        if (dice < 45 && !live[k]) {
            size_t n = rng_tensor_size(r, 4 * MiB);
            live[k] = dice < 10 ? site_bits(bits++, 10, n) : dice % 2 ? site_alpha(n) : site_beta(n);
        } else if (dice < 90) {
            cualloc_free(live[k], (void *)(uintptr_t)(dice % 2)); /* (NULL: nothing) */
            live[k] = NULL;
        } else if (dice < 98) {
            bool active = trace_active();
            snprintf(label, sizeof label, "m%d", marks++);
            cualloc_mark(label);
            marks_recorded += active;
        } else {
            cualloc_trim(0);
        }
        EXPECT(trace_check(stderr) == 0, "the recorder's checker after operation %d", op);
    }
    EXPECT(!ring || trace_active(), "a ring never stops");
    EXPECT(ring || !trace_active(), "the linear file did not reach its bound");
    if (ring) {
        trace_test_fields_t f;
        trace_test_fields(&f);
        EXPECT(f.ring && *f.ring_count >= 3, "a ring of %llu blocks", (unsigned long long)*f.ring_count);
        uint64_t *oldest = &f.ring[*f.ring_start], *second = &f.ring[(*f.ring_start + 1) % f.max_blocks];
        uint64_t *newest = &f.ring[(*f.ring_start + *f.ring_count - 1) % f.max_blocks];
#define TRACE_CORRUPT(lvalue, bad_value, what)                                                   \
    do {                                                                                         \
        __typeof__(lvalue) saved_ = (lvalue);                                                    \
        (lvalue) = (bad_value);                                                                  \
        EXPECT(trace_check(NULL) > 0, "corruption not caught: %s", (what));                      \
        (lvalue) = saved_;                                                                       \
        EXPECT(trace_check(stderr) == 0, "restored recorder not clean after: %s", (what));       \
    } while (0)
        TRACE_CORRUPT(*f.ring_count, *f.ring_count - 1, "the ring missing its newest block");
        TRACE_CORRUPT(*f.ring_start, f.max_blocks, "the ring starting past its list");
        TRACE_CORRUPT(*f.meta_blocks, *f.meta_blocks + 1, "one META block too many counted");
        TRACE_CORRUPT(*f.nblocks, *f.nblocks - 1, "one block too few counted");
        TRACE_CORRUPT(*oldest, *second, "a block twice in the ring");
        TRACE_CORRUPT(*newest, *oldest, "the newest entry not the block being written");
        {
            uint64_t a = *oldest;
            *oldest = *second;
            *second = a;
            EXPECT(trace_check(NULL) > 0, "corruption not caught: the two oldest blocks out of order");
            *second = *oldest;
            *oldest = a;
            EXPECT(trace_check(stderr) == 0, "restored recorder not clean after: two blocks out of order");
        }
        TRACE_CORRUPT(*f.ev_pos, (size_t)4096, "the EVENT block's position leaving no room for END");
        TRACE_CORRUPT(*f.ev_pos, (size_t)8, "the EVENT block's position inside its header");
        TRACE_CORRUPT(*f.ev_serial, *f.ev_serial + 1, "the EVENT cursor's serial ahead of its block's");
        TRACE_CORRUPT(*f.ev_last_seq, UINT64_MAX, "the EVENT cursor's last record newer than any");
#undef TRACE_CORRUPT
    }
    for (int i = 0; i < 16; i++)
        cualloc_free(live[i], NULL);
    cualloc_trace_stop();
    trace_set_block_size(0);
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0, "reader: %s", t.error);
    size_t n = count_type(&t, CUA_TRACE_MARK);
    EXPECT(n > 0, "no mark read back");
    int first = atoi(nth_of(&t, CUA_TRACE_MARK, 0)->s1 + 1);
    for (size_t i = 0; i < n; i++) {
        const rec_t *m = nth_of(&t, CUA_TRACE_MARK, i);
        EXPECT(m->s1[0] == 'm' && atoi(m->s1 + 1) == first + (int)i, "mark %zu is %s, want m%d", i, m->s1,
               first + (int)i);
    }
    if (ring) {
        EXPECT(first > 0 && first + (int)n == marks, "the ring kept marks m%d to m%d of %d", first,
               first + (int)n - 1, marks);
    } else {
        /* The mark that found the file full stopped it, unrecorded. */
        EXPECT(first == 0 && (int)n <= marks_recorded && (int)n >= marks_recorded - 1,
               "the linear file kept marks m%d to m%d, %d made while it was open", first, first + (int)n - 1,
               marks_recorded);
    }
    trace_free(&t);
}

static void ring_random_body(void)
{
    rng_t r = {seed};
    ring_random_run(true, &r);
    ring_random_run(false, &r);
}

/* A file size limit below the header, or below the header and the first block: start fails with
 * the reason, the process is not killed by SIGXFSZ, and no file is left behind. */
static void start_limit_body(void)
{
    const struct { rlim_t limit; const char *says; } v[] = {
        {2048, "cannot write the header (File too large)"},
        {10000, "cannot grow the file"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct rlimit rl = {v[i].limit, RLIM_INFINITY};
        EXPECT(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
        char path[300];
        snprintf(path, sizeof path, "%s/start-limit-%zu.trace", dir, i);
        msgs_clear();
        EXPECT(cualloc_trace_start(path) != 0, "start succeeded under a %llu-byte limit", (unsigned long long)v[i].limit);
        EXPECT(strstr(msgs, v[i].says), "limit %llu: message: %s", (unsigned long long)v[i].limit, msgs);
        EXPECT(!trace_active(), "not tracing");
        EXPECT(access(path, F_OK) != 0, "limit %llu left a file with no record", (unsigned long long)v[i].limit);
        cualloc_free(site_alpha(1000), NULL); /* allocation goes on */
    }
}

/* ---- exit() from a signal handler that interrupts an allocation or the recorder: the exit-time
 * END (and the summary) must not wait for a lock this very thread holds. Each grandchild traces,
 * allocates without end, and exits from a SIGALRM handler at some point in the loop; most land
 * inside the heap lock (the recorder runs under it). They all hung before. */
/* ThreadSanitizer reports exit() from a handler as a signal-unsafe call (rightly: the test does
 * it on purpose) and then exits with status 66. */
#if defined(__SANITIZE_THREAD__)
#define TSAN_EXIT_STATUS 66
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_EXIT_STATUS 66
#endif
#endif
#ifndef TSAN_EXIT_STATUS
#define TSAN_EXIT_STATUS 0
#endif

/* LeakSanitizer's check at exit locks ASan's allocator, which the signal may have interrupted
 * (malloc is as signal-unsafe as exit): the grandchildren turn it off, it is not what they test. */
static volatile int lsan_off;
int __lsan_is_turned_off(void);
__attribute__((visibility("default"), used)) int __lsan_is_turned_off(void) { return lsan_off; }

static void exit_now(int sig)
{
    (void)sig;
    exit(0);
}

static void exit_from_signal_body(void)
{
    enum { KIDS = 12 };
    pid_t kid[KIDS];
    char path[KIDS][300];
    for (int k = 0; k < KIDS; k++) {
        snprintf(path[k], sizeof path[k], "%s/exit-signal-%d.trace", dir, k);
        fflush(stdout);
        kid[k] = fork();
        EXPECT(kid[k] >= 0, "fork");
        if (kid[k] == 0) {
            char conf[400]; /* the fixed part and a path of up to 300 bytes */
            snprintf(conf, sizeof conf, "driver:sim,sim_memory_mb:256,trace_stack_depth:16,summary:1,trace:%.300s",
                     path[k]);
            setenv("CUALLOC_CONF", conf, 1);
            lsan_off = 1;
            if (!freopen("/dev/null", "w", stderr)) /* the summaries */
                _exit(3);
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = exit_now;
            sigaction(SIGALRM, &sa, NULL);
            rng_t r = {seed + (uint64_t)k};
            for (int i = 0; i < 2000; i++)
                cualloc_free(site_alpha(rng_tensor_size(&r, MiB)), NULL);
            struct itimerval it = {{0, 0}, {0, 1000 + k * 137}};
            setitimer(ITIMER_REAL, &it, NULL);
            for (;;)
                cualloc_free(site_alpha(rng_tensor_size(&r, MiB)), NULL);
        }
    }
    int hung = 0;
    for (int k = 0; k < KIDS; k++) {
        int st = 0;
        pid_t w = 0;
        for (int waited_ms = 0; (w = waitpid(kid[k], &st, WNOHANG)) == 0 && waited_ms < 10000; waited_ms += 10) {
            struct timespec ms10 = {0, 10000000};
            nanosleep(&ms10, NULL);
        }
        if (w == 0) {
            hung++;
            kill(kid[k], SIGKILL);
            waitpid(kid[k], &st, 0);
            continue;
        }
        EXPECT(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == TSAN_EXIT_STATUS), "grandchild %d: status %d",
               k, st);
        trace_t t;
        trace_read_(path[k], &t, false);
        EXPECT(t.status == 0 && t.acct.num_allocs >= 2000, "grandchild %d's trace: %s, %llu allocations", k, t.error,
               (unsigned long long)t.acct.num_allocs);
        trace_free(&t);
    }
    EXPECT(hung == 0, "%d of %d processes hung in exit() called from a signal handler", hung, KIDS);
}

/* ---- fork */

/* Files in directory d (its own entries only). */
static int files_in(const char *d)
{
    DIR *dp = opendir(d);
    EXPECT(dp, "opendir %s: %s", d, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        n += e->d_type == DT_REG;
    closedir(dp);
    return n;
}

/* The parent traces to sub/name (sub, under the scratch directory, made here) and forks; the
 * child writes sub/<name with %p as its pid> when with_pid, else nothing, and the parent's file
 * holds the parent's events only. */
static void fork_case(const char *sub, const char *name, bool with_pid)
{
    char subdir[1024], tmpl[1400], path[1400];
    path_of(subdir, sizeof subdir, sub);
    EXPECT(mkdir(subdir, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", subdir, strerror(errno));
    EXPECT(files_in(subdir) == 0, "%s is not empty", subdir);
    snprintf(tmpl, sizeof tmpl, "%s/%s", subdir, name);
    EXPECT(cualloc_trace_start(tmpl) == 0, "start %s", tmpl);
    trace_path(path, sizeof path);
    cualloc_free(cualloc_malloc(100, 0, NULL), NULL);
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork");
    if (pid == 0) {
        for (int i = 0; i < 50; i++)
            cualloc_free(cualloc_malloc(1000, 0, NULL), NULL);
        exit(0); /* atexit writes the child's END */
    }
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
    for (int i = 0; i < 5; i++)
        cualloc_free(cualloc_malloc(2000, 0, NULL), NULL);
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    check_consistent(&t, "parent after fork");
    EXPECT(t.acct.num_allocs == 6, "the parent's file has the parent's 6 allocs, got %llu",
           (unsigned long long)t.acct.num_allocs);
    trace_free(&t);
    if (with_pid) {
        /* The name with its one %p replaced by the child's pid. */
        char child[1400], pidstr[32];
        const char *at = strstr(tmpl, "%p");
        snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
        snprintf(child, sizeof child, "%.*s%s%s", (int)(at - tmpl), tmpl, pidstr, at + 2);
        EXPECT(access(child, F_OK) == 0, "the child wrote no %s", child);
        trace_read(child, &t);
        check_consistent(&t, "child");
        EXPECT(t.acct.num_allocs == 50, "the child's own file has its 50 allocs, got %llu",
               (unsigned long long)t.acct.num_allocs);
        EXPECT(nth_of(&t, CUA_TRACE_PROCESS, 0)->r.u.process.pid == (uint64_t)pid, "child pid");
        /* The child's heap is its own, described once, not also by the parent's DEVICE record. */
        EXPECT(count_type(&t, CUA_TRACE_DEVICE) == 1, "the child's file describes device 0 %zu times",
               count_type(&t, CUA_TRACE_DEVICE));
        trace_free(&t);
    }
    /* The parent's file and, with %p, the child's: nothing else (no PATH.1 beside the parent's). */
    EXPECT(files_in(subdir) == 1 + with_pid, "%s holds %d files, not %d", subdir, files_in(subdir), 1 + with_pid);
}

/* A fork while another thread moves one of the recorder's tables to a larger one: the old
 * table is returned (munmap, intercepted below) before the recorder holds the new one. Thread B
 * records ever new Python frames, whose stack nodes fill the table of stacks until it grows; at
 * the growth's munmap it lets the main thread fork and waits for the fork (at most a second: a
 * fork that waits for B's recorder lock cannot happen meanwhile). The child, whose template has
 * %p, starts its own trace at its first allocation, on tables that must be whole. */
static _Atomic(pthread_t) grow_thread;
static atomic_int grow_stage; /* 1: B is inside the growth, 2: the main thread has forked */
static atomic_bool grow_done;
/* Set: the growing thread forks itself at the munmap, as a signal handler that forks (a crash
 * reporter starting a debugger) does on a thread interrupted inside the recorder; the child exits
 * at once with 7 and the hook keeps its status here. */
static atomic_bool fork_inside;
static atomic_int fork_inside_status = -1;

EXPORT int munmap(void *addr, size_t len);
int munmap(void *addr, size_t len)
{
    static int (*next)(void *, size_t);
    if (!next) {
        void *f = dlsym(RTLD_NEXT, "munmap");
        memcpy(&next, &f, sizeof next);
    }
    /* A table of the recorder: 64 KiB of anonymous memory, not a block (which starts "CUAB"). */
    bool table = atomic_load(&grow_stage) == 0 && pthread_equal(pthread_self(), atomic_load(&grow_thread)) &&
                 len == 65536 && memcmp(addr, "CUAB", 4) != 0;
    int r = next(addr, len);
    if (table && atomic_load(&fork_inside)) {
        atomic_store(&grow_stage, 1);
        pid_t pid = fork();
        if (pid == 0)
            _exit(7);
        int st = 0;
        if (pid > 0 && waitpid(pid, &st, 0) == pid)
            atomic_store(&fork_inside_status, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else if (table) {
        atomic_store(&grow_stage, 1);
        for (int i = 0; i < 1000 && atomic_load(&grow_stage) != 2; i++)
            usleep(1000);
    }
    return r;
}

static fobj_t grow_name = {F_STR, "layer", 0, 0, 0, 0, 0}, grow_file = {F_STR, "/job/model.py", 0, 0, 0, 0, 0};
static fobj_t grow_code = {F_CODE, NULL, 0, 0, 0, &grow_name, &grow_file};
static fobj_t grow_frame = {F_FRAME, NULL, 1, NULL, &grow_code, 0, 0};

static void *grow_main(void *arg)
{
    (void)arg;
    atomic_store(&grow_thread, pthread_self());
    for (int line = 1; line < 4000 && atomic_load(&grow_stage) == 0; line++) {
        grow_frame.line = line;
        cualloc_free(site_alpha(4096), NULL);
    }
    atomic_store(&grow_done, true);
    return NULL;
}

/* Starts tracing to `name` (under the test folder, in path) with grow_frame as every allocation's
 * Python frame, its line changed by grow_main. */
static void grow_trace_start(char *path, size_t len, const char *name)
{
    path_of(path, len, name);
    EXPECT(cualloc_trace_start(path) == 0, "start %s", path);
    fake_top = &grow_frame;
    fake_gil = 1;
}

static void fork_table_growth_body(void)
{
    char tmpl[400];
    grow_trace_start(tmpl, sizeof tmpl, "fork-growth-%p.trace");
    /* Detached: the child's copy of it is never joined, which ThreadSanitizer's exit would report
     * as a leak; the parent waits for grow_done instead. */
    pthread_t b;
    EXPECT(pthread_create(&b, NULL, grow_main, NULL) == 0 && pthread_detach(b) == 0, "pthread_create");
    while (atomic_load(&grow_stage) == 0 && !atomic_load(&grow_done))
        usleep(100);
    EXPECT(atomic_load(&grow_stage) == 1, "no table grew");
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork");
    if (pid == 0) {
        fake_gil = 0;
        for (int i = 0; i < 50; i++)
            cualloc_free(cualloc_malloc(1000, 0, NULL), NULL);
        EXPECT(trace_active(), "the child traces");
        exit(0); /* atexit writes the child's END */
    }
    atomic_store(&grow_stage, 2);
    while (!atomic_load(&grow_done))
        usleep(100);
    fake_gil = 0;
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %d, signal %d)",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    cualloc_trace_stop();
    char child[400];
    snprintf(child, sizeof child, "%s/fork-growth-%d.trace", dir, (int)pid);
    trace_t t;
    trace_read(child, &t);
    check_consistent(&t, "child");
    EXPECT(t.acct.num_allocs == 50, "the child's file has its 50 allocs, got %llu", (unsigned long long)t.acct.num_allocs);
    trace_free(&t);
}

/* A thread inside the recorder (here: moving a table) forks, as from a signal handler: the fork
 * must not wait for the recorder lock its own thread holds. (alarm: a wait would never end.) */
static void fork_inside_recorder_body(void)
{
    char path[400];
    grow_trace_start(path, sizeof path, "fork-inside.trace");
    atomic_store(&fork_inside, true);
    alarm(20);
    grow_main(NULL);
    alarm(0);
    fake_gil = 0;
    EXPECT(atomic_load(&grow_stage) == 1, "no table grew");
    EXPECT(atomic_load(&fork_inside_status) == 7, "the child forked inside the recorder exited with %d, not 7",
           atomic_load(&fork_inside_status));
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    check_consistent(&t, "parent");
    trace_free(&t);
}

static void fork_pid_body(void) { fork_case("fork-pid", "fork-%p.trace", true); }
static void fork_nopid_body(void) { fork_case("fork-nopid", "fork-nopid.trace", false); }
/* "%%p" is a literal "%p" in the name, not the pid: the child stops. */
static void fork_escaped_body(void) { fork_case("fork-escaped", "fork-%%p.trace", false); }
/* A template longer than a CUALLOC_CONF path (cualloc_trace_start takes any that fits PATH_MAX):
 * the child expands all of it. */
static void fork_long_body(void)
{
    char sub[600];
    int n = snprintf(sub, sizeof sub, "fork-long-");
    memset(sub + n, 'd', 200);
    sub[n + 200] = '\0';
    fork_case(sub, "run-%p-with-a-long-name.trace", true);
}

/* ---- a file system that fills up: the file size limit, without SIGXFSZ or SIGBUS */

static void full_body(void)
{
    struct rlimit rl = {400 * 1024, 400 * 1024};
    EXPECT(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    char path[300];
    path_of(path, sizeof path, "full.trace");
    msgs_clear();
    EXPECT(cualloc_trace_start(path) == 0, "start");
    rng_t r = {seed};
    int pairs = 0;
    while (trace_active() && pairs < 5000000) {
        cualloc_free(site_beta(rng_tensor_size(&r, MiB)), NULL);
        pairs++;
    }
    EXPECT(!trace_active() && strstr(msgs, "cannot grow"), "tracing stopped with a message: %s", msgs);
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.status == 0 && t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_ERROR, "END(write_error): %s",
           t.error);
    EXPECT(t.acct.unmatched_frees == 0 && t.acct.num_allocs > 1000, "a consistent prefix");
    trace_free(&t);
}

/* The recorder's block mappings (shared mappings of the trace file) refused, as the kernel refuses
 * them past vm.max_map_count or RLIMIT_AS, while map_refuse is set: this definition, exported by
 * the executable, comes before the C library's. Anonymous mappings are left alone. */
static atomic_int map_refuse;
static atomic_int map_refused;

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fd >= 0 && (flags & MAP_SHARED) && atomic_load(&map_refuse)) {
        atomic_fetch_add(&map_refused, 1);
        errno = ENOMEM;
        return MAP_FAILED;
    }
    static void *(*next)(void *, size_t, int, int, int, off_t);
    if (!next) {
        void *f = dlsym(RTLD_NEXT, "mmap64");
        memcpy(&next, &f, sizeof next);
    }
    return next(addr, len, prot, flags, fd, off);
}

/* A block that cannot be mapped stops tracing as a full disk does: the trace ends with an END
 * record (write_error), not as a process that died, since the process goes on. Both cursors: the
 * events' next block (in a linear file and in a full ring), and the definitions'. */
static void map_refused_body(void)
{
    for (int k = 0; k < 3; k++) {
        bool meta = k == 1, ring = k == 2;
        char path[300];
        path_of(path, sizeof path,
                meta ? "map-refused-meta.trace" : ring ? "map-refused-ring.trace" : "map-refused.trace");
        conf_t c = base_conf();
        c.trace_ring = ring;
        c.trace_max = ring ? 4096 + 6 * (size_t)CUA_TRACE_BLOCK_SIZE : 0;
        msgs_clear();
        EXPECT(api_trace_start(path, &c) == 0, "start");
        for (int i = 0; i < (ring ? 200000 : 20000); i++) /* a few event blocks (a full ring), one stack */
            cualloc_free(site_alpha(512 + (size_t)(i % 64) * 512), NULL);
        atomic_store(&map_refuse, 1);
        if (meta) {
            /* Definitions a reader skips (a type it does not know) until the META block is full. */
            uint8_t payload[1000] = {0};
            for (int i = 0; i < 200 && trace_active(); i++)
                trace_test_raw(false, 30, payload, sizeof payload);
        } else {
            for (int i = 0; i < 100000 && trace_active(); i++)
                cualloc_free(site_alpha(512 + (size_t)(i % 64) * 512), NULL);
        }
        atomic_store(&map_refuse, 0);
        EXPECT(!trace_active() && atomic_load(&map_refused) > 0 && strstr(msgs, "cannot map block"),
               "tracing stopped with a message: %s", msgs);
        atomic_store(&map_refused, 0);
        trace_t t;
        trace_read(path, &t);
        EXPECT(t.status == 0 && t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_ERROR,
               "%s: END(write_error) (status %d, END %s): %s", path, t.status, t.acct.end_seen ? "seen" : "missing",
               t.error);
        EXPECT(ring ? t.info.overwritten : t.acct.unmatched_frees == 0 && t.acct.num_allocs >= 20000,
               "a consistent prefix");
        trace_free(&t);
    }
}

/* ---- signal handlers that record while their thread is inside the recorder: a mark from a
 * handler that interrupted the recorder is dropped and counted, never deadlocked. (A handler may
 * not allocate: the heap lock is not signal-safe; the recorder's writing is.) */

static volatile sig_atomic_t handled;
static void on_alarm(int sig)
{
    (void)sig;
    cualloc_mark("signal");
    handled++;
}

static void signal_body(void)
{
    char path[300];
    path_of(path, sizeof path, "signal.trace");
    EXPECT(cualloc_trace_start(path) == 0, "start");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (int i = 0; i < 400000 && handled < 3000; i++)
        cualloc_free(site_alpha(512 + (size_t)(i % 64) * 512), NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_IGN);
    cualloc_trace_stop();
    trace_t t;
    trace_read(path, &t);
    check_consistent(&t, "signal");
    EXPECT(count_type(&t, CUA_TRACE_MARK) + t.acct.end_dropped == (uint64_t)handled,
           "%zu marks recorded + %llu dropped != %d handled", count_type(&t, CUA_TRACE_MARK),
           (unsigned long long)t.acct.end_dropped, (int)handled);
    printf("     (%d signals: %zu marks recorded, %llu dropped inside the recorder)\n", (int)handled,
           count_type(&t, CUA_TRACE_MARK), (unsigned long long)t.acct.end_dropped);
    trace_free(&t);
}

/* ---- robustness of the reader */

static uint8_t *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    EXPECT(fd >= 0, "open %s", path);
    off_t n = lseek(fd, 0, SEEK_END);
    uint8_t *buf = malloc((size_t)n + 1);
    EXPECT(buf && pread(fd, buf, (size_t)n, 0) == n, "read %s", path);
    close(fd);
    *len = (size_t)n;
    return buf;
}

typedef struct mini { uint64_t seq, offset; uint8_t type; uint32_t length; } mini_t;

/* Reads bytes in memory to the end; returns the record count and fills out (up to max). */
static size_t read_mem(const uint8_t *buf, size_t len, mini_t *out, size_t max, int *status)
{
    char err[256];
    tr_reader_t *r = tr_open_mem(buf, len, err, sizeof err);
    *status = r ? 0 : -2;
    if (!r)
        return 0;
    tr_acct_t *a = malloc(sizeof *a);
    tr_acct_init(a);
    tr_record_t rec;
    size_t n = 0;
    int k;
    char line[4096];
    uint64_t prev = 0;
    while ((k = tr_next(r, &rec)) > 0) {
        EXPECT(rec.seq > prev, "sequence numbers increase");
        prev = rec.seq;
        tr_acct_add(a, &rec);
        tr_format(r, &rec, 0, line, sizeof line);
        if (rec.known && (rec.type == CUA_TRACE_ALLOC || rec.type == CUA_TRACE_OOM)) {
            tr_frame_t fr[70];
            tr_stack_frames(r, rec.stack, fr, 70);
        }
        if (n < max)
            out[n] = (mini_t){rec.seq, rec.offset, rec.type, rec.length};
        n++;
    }
    *status = k;
    tr_acct_free(a);
    free(a);
    tr_close(r);
    return n;
}

static void robustness_body(void)
{
    char path[300];
    path_of(path, sizeof path, "small.trace");
    trace_set_block_size(4096);
    conf_t c = base_conf();
    c.trace_stack_depth = 6;
    EXPECT(api_trace_start(path, &c) == 0, "start");
    trace_set_block_size(0);
    rng_t r = {seed};
    void *live[16] = {0};
    for (int i = 0; i < 600; i++) {
        int k = (int)rng_below(&r, 16);
        if (live[k]) {
            cualloc_free(live[k], NULL);
            live[k] = NULL;
        } else {
            live[k] = i % 3 ? site_alpha(rng_tensor_size(&r, 2 * MiB)) : site_beta(rng_tensor_size(&r, 2 * MiB));
        }
        if (i % 100 == 0)
            cualloc_mark("phase");
    }
    for (int k = 0; k < 16; k++)
        cualloc_free(live[k], NULL);
    cualloc_trim(0);
    cualloc_trace_stop();
    size_t len;
    uint8_t *buf = slurp(path, &len);
    static mini_t full[20000], part[20000];
    int st;
    size_t nfull = read_mem(buf, len, full, 20000, &st);
    EXPECT(st == 0 && nfull > 600 && nfull < 20000, "full read: %zu records, status %d", nfull, st);
    printf("     small trace: %zu bytes, %zu records\n", len, nfull);

    /* Truncation at every offset: a prefix of each kind's records, never a crash. The reader is
     * single-threaded here, so the ThreadSanitizer build, where each read costs some 30 times more,
     * takes every 7th offset and a tenth of the flips below: the other builds take them all. */
#ifdef __SANITIZE_THREAD__
    const size_t cut_stride = 7, nflips = 2000;
#else
    const size_t cut_stride = 1, nflips = 20000;
#endif
    uint8_t *copy = malloc(len);
    for (size_t cut = 0; cut <= len; cut += cut_stride) {
        memcpy(copy, buf, cut);
        size_t n = read_mem(copy, cut, part, 20000, &st);
        EXPECT(st >= 0 || st == -2, "cut %zu: a truncated file is not corrupt (status %d)", cut, st);
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            while (j < nfull && full[j].seq < part[i].seq)
                j++;
            EXPECT(j < nfull && full[j].seq == part[i].seq && full[j].offset == part[i].offset &&
                       full[j].type == part[i].type && full[j].length == part[i].length,
                   "cut %zu: record %zu (seq %llu) is not in the full trace", cut, i, (unsigned long long)part[i].seq);
            EXPECT(part[i].offset + part[i].length <= cut, "cut %zu: a record past the cut", cut);
        }
    }
    printf("     truncated at %zu of the %zu offsets (every %zu)\n", len / cut_stride + 1, len + 1, cut_stride);

    /* Random byte flips (1 to 4 per try), in the used parts: errors or prefixes, never crashes. */
    int errors = 0, clean = 0;
    for (size_t iter = 0; iter < nflips; iter++) {
        memcpy(copy, buf, len);
        int flips = 1 + (int)rng_below(&r, 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)rng_below(&r, len);
            copy[at] ^= (uint8_t)(1 + rng_below(&r, 255));
        }
        read_mem(copy, len, part, 20000, &st);
        if (st < 0)
            errors++;
        else
            clean++;
    }
    printf("     %zu flipped copies: %d rejected with an error, %d read to the end\n", nflips, errors, clean);
    /* A newer major version is refused, naming both versions. */
    memcpy(copy, buf, len);
    copy[CUA_TRACE_OFF_MAJOR] = 2;
    char err[256];
    char want_file[16], want_reader[16];
    snprintf(want_file, sizeof want_file, "2.%d", CUA_TRACE_MINOR);
    snprintf(want_reader, sizeof want_reader, "1.%d", CUA_TRACE_MINOR);
    EXPECT(!tr_open_mem(copy, len, err, sizeof err) && strstr(err, want_file) && strstr(err, want_reader), "newer: %s",
           err);
    /* Not a trace. */
    EXPECT(!tr_open_mem("hello world, this is not a trace at all....", 44, err, sizeof err) && strstr(err, "not a cualloc trace"),
           "%s", err);
    free(copy);
    free(buf);
}

/* ------------------------------------------------------------------------------ the corpus */

/* Writes small real traces (4 KiB blocks) for the fuzzer's seed corpus. */
static void write_corpus(const char *out)
{
    trace_set_block_size(4096);
    conf_t c = base_conf();
    char path[512];
    struct { const char *name; unsigned depth; size_t max; bool ring; int events; bool py; } v[] = {
        {"tiny", 0, 0, false, 10, false},
        {"stacks", 6, 0, false, 200, false},
        {"python", 4, 0, false, 60, true},
        {"ring", 2, 24 * 1024, true, 3000, false},
        {"limit", 2, 24 * 1024, false, 3000, false},
        {"lost", 4, 0, false, 200, false}, /* LOST records mid-run */
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out, v[i].name);
        unlink(path);
        c.trace_stack_depth = v[i].depth;
        c.trace_max = v[i].max;
        c.trace_ring = v[i].ring;
        EXPECT(api_trace_start(path, &c) == 0, "start %s", path);
        fobj_t n1 = {F_STR, "step", 0, 0, 0, 0, 0}, f1 = {F_STR, "t.py", 0, 0, 0, 0, 0};
        fobj_t c1 = {F_CODE, NULL, 0, 0, 0, &n1, &f1};
        fobj_t fr = {F_FRAME, NULL, 7, NULL, &c1, 0, 0};
        fake_top = &fr;
        fake_gil = v[i].py;
        rng_t r = {1234 + i};
        void *live[8] = {0};
        for (int e = 0; e < v[i].events; e++) {
            int k = (int)rng_below(&r, 8);
            if (live[k]) {
                cualloc_free(live[k], (void *)(uintptr_t)(k % 2));
                live[k] = NULL;
            } else {
                live[k] = site_alpha(rng_tensor_size(&r, 2 * MiB));
            }
            if (e % 50 == 0)
                cualloc_mark("m");
            if (strcmp(v[i].name, "lost") == 0 && (e == 60 || e == 120))
                trace_test_table_refused(e == 60 ? CUA_TRACE_LOST_STACKS : CUA_TRACE_LOST_MODULES);
        }
        fake_gil = 0;
        if (i == 1) {
            const uint8_t junk[] = {9, 9};
            trace_test_raw(true, 77, junk, 2);
            cualloc_trim(0);
            cualloc_malloc(1000 * GiB, 0, NULL);
        }
        for (int k = 0; k < 8; k++)
            cualloc_free(live[k], NULL);
        cualloc_trace_stop();
        printf("wrote %s (%lld bytes)\n", path, (long long)file_size(path));
    }
    trace_set_block_size(0);
}

/* ------------------------------------------------------------------------------------ main */

static void rm_tree(const char *d)
{
    DIR *dp = opendir(d);
    if (!dp)
        return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        unlink(p);
    }
    closedir(dp);
    rmdir(d);
}

static void roundtrip_child(void) { roundtrip_body(); }

/* trace:PATH in CUALLOC_CONF starts at the first call into cualloc, whichever it is. A mark as the
 * first call is recorded (it was dropped: cualloc_mark did not initialize, so the trace started
 * only at the allocation after it); a stop as the first call stops that trace (it was a no-op,
 * and the trace then started at the next allocation and recorded the rest of the run). */
static char first_call_conf[PATH_MAX];

static void mark_first_body(void)
{
    cualloc_mark("before any allocation");
    cualloc_free(cualloc_malloc(4096, 0, NULL), NULL);
    cualloc_trace_stop();
    char path[300];
    snprintf(path, sizeof path, "%s/mark-first.trace", dir);
    trace_t t;
    trace_read(path, &t);
    const rec_t *m = nth_of(&t, CUA_TRACE_MARK, 0);
    EXPECT(m && strcmp(m->s1, "before any allocation") == 0, "the first call's mark: %s", m ? m->s1 : "(none)");
    EXPECT(count_type(&t, CUA_TRACE_ALLOC) == 1, "%zu allocations recorded, want 1", count_type(&t, CUA_TRACE_ALLOC));
    trace_free(&t);
}

static void stop_first_body(void)
{
    cualloc_trace_stop();
    EXPECT(!trace_active(), "tracing after cualloc_trace_stop");
    cualloc_free(cualloc_malloc(4096, 0, NULL), NULL);
    EXPECT(!trace_active(), "tracing started after cualloc_trace_stop, at the first allocation");
    char path[300];
    snprintf(path, sizeof path, "%s/stop-first.trace", dir);
    trace_t t;
    trace_read(path, &t);
    EXPECT(t.acct.end_seen && t.acct.end_reason == CUA_TRACE_END_STOP, "no END(stop) record");
    EXPECT(count_type(&t, CUA_TRACE_ALLOC) == 0, "%zu allocations recorded after the stop",
           count_type(&t, CUA_TRACE_ALLOC));
    trace_free(&t);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "--corpus") == 0) {
        setenv("CUALLOC_CONF", "driver:sim,sim_memory_mb:256,trace_stack_depth:4", 1);
        write_corpus(argv[2]);
        return 0;
    }
    if (argc == 2)
        filter = argv[1];
    seed = test_seed("test_trace");
    snprintf(dir, sizeof dir, "/tmp/cualloc-test-trace-XXXXXX");
    EXPECT(mkdtemp(dir), "mkdtemp");
    error_set_callback(capture, NULL);
    const char *sim = "driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:16";
    setenv("CUALLOC_CONF", sim, 1);

    if (!filter)
        test_expand_path();
    in_child("round trip of every record type", sim, roundtrip_child);
    in_child("stacks: call sites, depth, Python frames", sim, stacks_body);
    in_child("trace started mid-run", sim, midrun_body);
    in_child("classic segments, trim, OOM", "driver:sim,sim_memory_mb:256,expandable_segments:False", classic_body);
    in_child("concurrent threads", sim, threads_body);
    in_child("starts and stops while threads allocate", sim, toggle_body);
    in_child("starts, stops and size-limit stops while threads allocate",
             "driver:sim,sim_devices:2,sim_memory_mb:256,trace_stack_depth:16,trace_max_mb:1", toggle_body);
    in_child("trace_max_mb stops", sim, limit_body);
    in_child("64 KiB pages: the header takes a page", sim, page_64k_body);
    in_child("a table refused host memory while recording: LOST records", sim, lost_body);
    in_child("LOST records in a ring: repeated in each new event block", sim, lost_ring_body);
    in_child("trace_max_mb with trace_ring keeps the newest", sim, ring_body);
    in_child("fork: the child writes its own file (%p)", sim, fork_pid_body);
    in_child("fork: the child stops (no %p)", sim, fork_nopid_body);
    in_child("fork: the child stops (%%p is not the pid)", sim, fork_escaped_body);
    in_child("fork: the child expands a template longer than 255 bytes", sim, fork_long_body);
    in_child("fork while another thread grows a recorder table", sim, fork_table_growth_body);
    in_child("fork from inside the recorder (a signal handler's)", sim, fork_inside_recorder_body);
    in_child("full file system (RLIMIT_FSIZE)", sim, full_body);
    in_child("a block the kernel will not map", sim, map_refused_body);
    in_child("trace_ring: new definitions once the ring is full", sim, ring_definitions_body);
    in_child("trace_ring: new Python frames once the definitions fill half the file", sim, ring_pyframes_body);
    in_child("trace_ring: META blocks out of file order", sim, ring_meta_order_body);
    in_child("random operations in a small ring and a small linear file, checked after each", sim, ring_random_body);
    in_child("a file size limit below the first block (RLIMIT_FSIZE)", sim, start_limit_body);
    in_child("signal handlers recording inside the recorder", sim, signal_body);
    in_child("exit() from a signal handler inside an allocation", sim, exit_from_signal_body);
    in_child("reader robustness: truncation and byte flips", sim, robustness_body);
    snprintf(first_call_conf, sizeof first_call_conf, "%s,trace:%s/mark-first.trace", sim, dir);
    in_child("trace:PATH: a mark as the first call is recorded", first_call_conf, mark_first_body);
    snprintf(first_call_conf, sizeof first_call_conf, "%s,trace:%s/stop-first.trace", sim, dir);
    in_child("trace:PATH: a stop as the first call stops it", first_call_conf, stop_first_body);
    /* In this process: file safety (no fork needed). */
    if (!filter) {
        test_symlink_refused();
        test_existing_kept();
    }
    rm_tree(dir);
    printf("test_trace: all passed\n");
    return 0;
}
