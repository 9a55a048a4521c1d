/* trace.c — the trace recorder: the file (created safely, grown block by block through a shared
 * mapping), the encoding of include/cualloc_trace.h, the tables that give threads, streams,
 * Python frames and stack nodes their small ids, stack capture (libunwind, plus CPython's frames
 * resolved at run time), and the module map. It does not decide when tracing starts or stops, nor
 * gather the heap's state (api.c and heap.c do, calling the hooks below); it never calls the heap.
 *
 * Locking: one short recorder lock (a spin lock, `rec_lock`) guards everything in `T`. The heap
 * calls the event hooks with its own lock held, so the recorder lock ranks below every heap lock;
 * the recorder never takes another lock while holding it. Stack capture unwinds and reads Python
 * frames before taking it (and before any heap lock). The module lock (`mod_lock`) ranks above
 * the recorder lock and is taken only while capturing a stack that misses the stack cache.
 *
 * Crash safety: records are written into the mapped block and committed by storing the first
 * byte of their length last, with release order; blocks are reserved with posix_fallocate (after
 * checking RLIMIT_FSIZE, so the kernel never sends SIGXFSZ) before they are mapped. The write path
 * takes no lock but the recorder's and calls nothing but memcpy, clock_gettime and — at a block
 * boundary — munmap, posix_fallocate and mmap: a signal handler that allocates while its thread is
 * inside the recorder is detected (tls.busy) and its event dropped and counted, never deadlocked.
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <execinfo.h>

/* Native stacks come from libunwind's unw_backtrace, loaded with dlopen(RTLD_LOCAL) the first time
 * a stack is captured — not linked: under LD_PRELOAD a linked libunwind.so.8 would put its
 * _Unwind_* symbols ahead of libgcc's for every C++ exception in the host process. Where it is
 * missing, glibc's backtrace (libgcc's unwinder) serves, with the same results. ThreadSanitizer
 * builds always use backtrace: libunwind's per-thread cache destructor runs after TSan has torn the
 * thread down and crashes it. */
typedef int (*unw_backtrace_fn)(void **buf, int n);
static _Atomic(unw_backtrace_fn) unwinder;

static unw_backtrace_fn unwinder_get(void) {
    unw_backtrace_fn f = atomic_load_explicit(&unwinder, memory_order_acquire);
    if (__builtin_expect(f != NULL, 1)) return f;
#if !defined(__SANITIZE_THREAD__)
    void *lib = dlopen("libunwind.so.8", RTLD_LAZY | RTLD_LOCAL);
    void *sym = lib ? dlsym(lib, "unw_backtrace") : NULL;
    if (sym) memcpy(&f, &sym, sizeof sym);
#endif
    if (!f) f = backtrace;
    atomic_store_explicit(&unwinder, f, memory_order_release);
    return f;
}

#include "cualloc_trace.h"
#include "internal.h"
#include "mix64.h"

#ifndef CUALLOC_VERSION_STRING
#define CUALLOC_VERSION_STRING "unknown"
#endif

#define MAX_DEPTH 64                 /* trace_stack_depth's upper bound */
#define END_RESERVE 48               /* bytes every event block keeps for an END without stats */
#define PY_TAG ((uint64_t)1 << 63)   /* trie key of a Python frame: PY_TAG | pyframe id */
#define STACK_CACHE 4096             /* direct-mapped cache of whole stacks, entries */
#define STR_MAX 1024                 /* longest string field written (names, paths, labels) */
#define META_SCRATCH 16384           /* largest META payload */

_Atomic bool trace_enabled_flag;

/* ------------------------------------------------------------------------------------ state */

/* One block being appended to, per kind, with the event delta state of cualloc_trace.h. */
typedef struct tcur_s {
    uint8_t kind;
    uint8_t *map;          /* the block's mapping, NULL when none */
    uint64_t index;        /* block number in the file */
    uint64_t serial;       /* next serial of this kind */
    size_t pos;            /* write offset in the block */
    uint64_t last_seq;     /* sequence number of the block's last record (seq_base at first) */
    uint64_t time;         /* delta state (EVENT blocks) */
    uint32_t dev, thread, stream, stack;
    uint64_t addr[CUA_TRACE_MAX_DEVICES];
} tcur_t;

typedef struct node_s { uint64_t key, pyhash; uint32_t parent, pad; } node_t; /* pyhash: Python frames */
typedef struct nslot_s { uint64_t key; uint32_t parent; uint32_t id; } nslot_t;  /* id 0 = empty */
typedef struct cache_s { uint64_t hash; uint32_t leaf; uint32_t depth; } cache_t;
typedef struct pyent_s { uint64_t hash; uint32_t id, line; uint64_t func, file; } pyent_t; /* arena offsets */
typedef struct sslot_s { uint64_t handle; uint32_t id; uint32_t pad; } sslot_t;   /* id 0 = empty */
typedef struct module_s { uint64_t base, start, end, path_hash; } module_t;

typedef struct devinfo_s {
    bool known;
    bool vmm;
    char name[96];
    size_t total, capacity, granularity;
} devinfo_t;

/* A growable array in its own anonymous mapping (the recorder never uses malloc). */
typedef struct vec_s { void *p; size_t bytes; } vec_t;

static struct {
    bool open;
    int fd;
    char path[PATH_MAX];
    char tmpl[PATH_MAX];   /* as given: a forked child expands it again (cualloc_trace_start takes any length) */
    bool tmpl_has_pid;     /* its expansion holds the pid (a %p, not the "p" of an escaped "%%p") */
    uint32_t block_size;
    uint32_t header_size;
    uint64_t max_blocks;   /* 0 = unbounded */
    bool ring;
    uint64_t nblocks;      /* blocks the file holds */
    uint64_t meta_blocks;
    bool meta_full;        /* ring: no more META blocks; new ids are 0 */
    uint64_t seq;          /* last sequence number written */
    uint64_t clock;        /* deterministic clock: event records so far */
    bool counter_clock;
    unsigned depth;
    uint64_t gen;          /* incremented per file: invalidates threads' cached ids */
    tcur_t meta, ev;
    vec_t ring_list;       /* ring: EVENT block numbers, oldest first (circular) */
    uint64_t ring_start, ring_count;
    /* Invariants (trace_check), while a file is open: it holds nblocks blocks (at most max_blocks,
     * when bounded), each with a sound header of kind META or EVENT, meta_blocks of them META. In
     * a ring the others are exactly the ring's ring_count entries, each once, their serials rising
     * from the oldest to the newest, which is the one `ev` writes to. Each cursor's block is one of
     * the file's, of its kind and with the serial before the cursor's next; its position lies
     * inside the block, an EVENT block's leaving END_RESERVE bytes free; no record is newer than
     * T.seq. */
    /* tables, reset per file */
    vec_t nodes;           /* node_t by stack id */
    uint32_t nnodes;       /* ids in use: 1 .. nnodes */
    vec_t nslots;          /* (parent, key) -> id */
    size_t nslot_cap;
    cache_t cache[STACK_CACHE];
    vec_t pyents;
    size_t pyent_cap, npy;
    vec_t arena;           /* Python frame strings */
    size_t arena_used;
    vec_t sslots;
    size_t sslot_cap, nstreams;
    uint32_t nthreads;
    vec_t modules;
    size_t nmodules;
    bool modules_stale;    /* scan every module at the next stack capture */
    bool modules_short;    /* the last scan was refused host memory: scan again at the next miss */
    unsigned long long dl_adds; /* dl_iterate_phdr's load counter when last scanned */
    bool table_refused_said; /* table_refused_locked has spoken for this file */
    unsigned lost_recorded;   /* bit 1 << CUA_TRACE_LOST_*: that table's LOST record is in this file */
    uint64_t lost_at[32];     /* by the same bit: the time of that LOST record (of the refusal) */
    /* kept across files */
    devinfo_t dev[CUA_TRACE_MAX_DEVICES];
    bool dev_started[CUA_TRACE_MAX_DEVICES];
    char conf_text[4096];
    uint8_t scratch[META_SCRATCH];
} T;

static _Atomic uint64_t dropped; /* events lost to re-entry (signal handlers) */
static _Atomic uint64_t gen_pub; /* T.gen, readable without the lock */
static atomic_flag rec_lock = ATOMIC_FLAG_INIT;
static pthread_mutex_t mod_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t test_block_size; /* trace_set_block_size */
static uint32_t test_page_size;  /* trace_set_page_size */

typedef struct tls_s {
    uint64_t gen;          /* the file the ids below belong to */
    uint32_t thread;
    uint64_t stack_gen;
    uint32_t stack;
    bool has_stack;
    volatile int busy;     /* inside the recorder (a depth): a nested call (signal handler) is dropped */
} tls_t;
static __thread tls_t tls;

/* tls.busy counts the stretches this thread is in that hold the recorder lock or unwind. The
 * signal fences keep the compiler from moving it across the lock: a handler that saw 0 while its
 * thread held the lock would spin forever. */
static inline void busy_enter(void)
{
    tls.busy++;
    atomic_signal_fence(memory_order_seq_cst);
}

static inline void busy_leave(void)
{
    atomic_signal_fence(memory_order_seq_cst);
    tls.busy--;
}

static void lock(void)
{
    busy_enter(); /* every holder of the lock is busy: see busy_enter */
    unsigned spins = 0;
    while (atomic_flag_test_and_set_explicit(&rec_lock, memory_order_acquire)) {
        if (++spins < 100) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

static void unlock(void)
{
    atomic_flag_clear_explicit(&rec_lock, memory_order_release);
    busy_leave();
}

/* --------------------------------------------------------------------------------- encoding */

static inline size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static inline size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* A string field of at most `max` bytes, cut at a UTF-8 character boundary. */
static size_t put_string(uint8_t *p, const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n > max) {
        /* Cut at a character boundary: back over the continuation bytes of the character at the
         * cut, which has at most three (past them the text is not UTF-8, and is cut where it is). */
        n = max;
        for (size_t back = 0; back < 3 && n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80; back++)
            n--;
    }
    size_t k = put_varint(p, n);
    if (n)
        memcpy(p + k, s, n);
    return k + n;
}

static uint64_t hash_bytes(uint64_t h, const char *s)
{
    /* FNV-1a then mixed: strings are short and hashed only under Python. */
    uint64_t f = 0xcbf29ce484222325ull;
    for (; s && *s; s++)
        f = (f ^ (unsigned char)*s) * 0x100000001b3ull;
    return mix64(h ^ f);
}

/* ----------------------------------------------------------------------------------- tables */

static bool vec_reserve(vec_t *v, size_t bytes)
{
    if (bytes <= v->bytes)
        return true;
    size_t want = v->bytes ? v->bytes : 65536;
    while (want < bytes)
        want *= 2;
    void *p;
    if (v->p)
        p = mremap(v->p, v->bytes, want, MREMAP_MAYMOVE);
    else
        p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    v->p = p;
    v->bytes = want;
    return true;
}

/* A fresh zeroed table of `bytes` (the old one, if any, is returned to the system). */
static bool vec_fresh(vec_t *v, size_t bytes)
{
    if (v->p && v->bytes >= bytes) {
        memset(v->p, 0, bytes);
        return true;
    }
    if (v->p)
        munmap(v->p, v->bytes);
    v->p = NULL;
    v->bytes = 0;
    return vec_reserve(v, bytes);
}

/* False when host memory was refused for a table (the recorder cannot start). */
static bool tables_reset(void)
{
    T.nnodes = 0;
    T.nslot_cap = 4096;
    bool ok = vec_fresh(&T.nslots, T.nslot_cap * sizeof(nslot_t));
    for (size_t i = 0; i < STACK_CACHE; i++)
        __atomic_store_n(&T.cache[i].hash, 0, __ATOMIC_RELAXED);
    T.pyent_cap = 1024;
    T.npy = 0;
    ok = vec_fresh(&T.pyents, T.pyent_cap * sizeof(pyent_t)) && ok;
    T.arena_used = 0;
    T.sslot_cap = 256;
    T.nstreams = 0;
    ok = vec_fresh(&T.sslots, T.sslot_cap * sizeof(sslot_t)) && ok;
    T.nthreads = 0;
    T.nmodules = 0;
    __atomic_store_n(&T.modules_stale, true, __ATOMIC_RELAXED);
    T.modules_short = false;
    T.table_refused_said = false;
    T.lost_recorded = 0;
    return ok;
}

/* ---------------------------------------------------------------------------------- clock */

static uint64_t now_ns(void)
{
    if (T.counter_clock)
        return ++T.clock * 1000;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------- blocks */

static void stop_locked(int reason);

static uint64_t block_offset(uint64_t index) { return T.header_size + index * (uint64_t)T.block_size; }

static void cur_unmap(tcur_t *c)
{
    if (c->map)
        munmap(c->map, T.block_size);
    c->map = NULL;
}

/* Whether the process may make a file `end` bytes long: past RLIMIT_FSIZE the kernel sends
 * SIGXFSZ, which kills the process by default, so every write that grows the file asks first. */
static bool fsize_allows(uint64_t end)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || end <= rl.rlim_cur;
}

/* Reserves block `index` on disk (a new one at the end of the file). false with a message when
 * the file cannot grow. */
static bool block_reserve(uint64_t index)
{
    uint64_t off = block_offset(index), end = off + T.block_size;
    int err = EFBIG;
    if (fsize_allows(end)) {
        do /* glibc passes a signal's EINTR through */
            err = posix_fallocate(T.fd, (off_t)off, (off_t)T.block_size);
        while (err == EINTR);
    }
    if (err) {
        cua_error("trace %s: cannot grow the file to %llu bytes (%s); tracing stopped. The records "
                  "written so far are complete and readable.",
                  T.path, (unsigned long long)end, strerror(err));
        return false;
    }
    return true;
}

/* Maps block `index` for cursor c and writes its header (recycled: invalidated and zeroed
 * first). Commits the magic last. c's block stays mapped until the new one is: when the kernel
 * refuses the mapping, the EVENT block still has room for the END that says tracing stopped. */
static bool block_start(tcur_t *c, uint64_t index, bool recycled, uint64_t now)
{
    void *m = mmap(NULL, T.block_size, PROT_READ | PROT_WRITE, MAP_SHARED, T.fd, (off_t)block_offset(index));
    if (m == MAP_FAILED) {
        cua_error("trace %s: cannot map block %llu (%s); tracing stopped. The records written so far are "
                  "complete and readable.",
                  T.path, (unsigned long long)index, strerror(errno));
        return false;
    }
    cur_unmap(c);
    uint8_t *b = m;
    if (recycled) {
        /* The old magic is cleared before any byte of the old block is: a process killed while
         * the block is zeroed leaves an empty block, not an old one the reader finds damaged. A
         * release store keeps the writes before it in place but not those after it; the fence
         * keeps the compiler from starting the memset before the store. (A kill stops the process
         * between instructions, and the stores already made reach the file: only the compiler's
         * order matters.) */
        __atomic_store_n((uint32_t *)(void *)b, 0u, __ATOMIC_RELEASE);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        memset(b + 4, 0, T.block_size - 4);
    }
    b[CUA_TRACE_BOFF_KIND] = c->kind;
    b[5] = 0;
    cua_trace_put_le(b + CUA_TRACE_BOFF_SERIAL, c->serial, 8);
    cua_trace_put_le(b + CUA_TRACE_BOFF_SEQ_BASE, T.seq, 8);
    cua_trace_put_le(b + CUA_TRACE_BOFF_BASE_TIME, now, 8);
    cua_trace_put_le(b + CUA_TRACE_BOFF_CHECK, cua_trace_block_check(b), 2);
    uint32_t magic;
    memcpy(&magic, "CUAB", 4);
    __atomic_store_n((uint32_t *)(void *)b, magic, __ATOMIC_RELEASE);
    c->map = b;
    c->index = index;
    c->serial++;
    c->pos = CUA_TRACE_BLOCK_HEADER;
    c->last_seq = T.seq;
    c->time = now;
    c->dev = c->thread = c->stream = c->stack = 0;
    memset(c->addr, 0, sizeof c->addr);
    return true;
}

/* Takes the oldest EVENT block out of the ring's list and returns its number. */
static uint64_t ring_take_oldest(void)
{
    uint64_t victim = ((uint64_t *)T.ring_list.p)[T.ring_start];
    T.ring_start = (T.ring_start + 1) % T.max_blocks;
    T.ring_count--;
    return victim;
}

/* Enters EVENT block `index` as the ring's newest. */
static void ring_append(uint64_t index)
{
    ((uint64_t *)T.ring_list.p)[(T.ring_start + T.ring_count) % T.max_blocks] = index;
    T.ring_count++;
}

/* Moves cursor c to a fresh block. Returns false when there is none: the limit of a linear file
 * (tracing then stops, with an END record), a full META area in a ring (c == &T.meta only), or a
 * file that cannot grow (tracing stops). */
static bool block_next(tcur_t *c, uint64_t now)
{
    bool is_meta = c == &T.meta;
    if (T.ring && !is_meta && T.max_blocks && T.nblocks >= T.max_blocks) {
        /* Reuse the oldest EVENT block, which becomes the newest. */
        uint64_t victim = ring_take_oldest();
        ring_append(victim);
        if (!block_start(c, victim, true, now)) {
            stop_locked(CUA_TRACE_END_ERROR);
            return false;
        }
        return true;
    }
    if (T.ring && is_meta && (T.meta_blocks >= T.max_blocks / 2 || (T.nblocks >= T.max_blocks && T.ring_count < 2))) {
        if (!T.meta_full)
            cua_error("trace %s: the definitions (stacks, threads, streams) fill half of trace_max_mb; "
                      "new ones are recorded as unknown. Raise trace_max_mb or lower trace_stack_depth.",
                      T.path);
        T.meta_full = true;
        return false;
    }
    if (T.ring && is_meta && T.nblocks >= T.max_blocks) {
        /* A full ring, definitions under half of it: the oldest EVENT block becomes a META block.
         * Its events are the oldest, the ones a ring drops next anyway; the block being written
         * (the newest, ring_count >= 2 above) is never the one taken. */
        uint64_t victim = ring_take_oldest();
        if (!block_start(c, victim, true, now)) {
            stop_locked(CUA_TRACE_END_ERROR);
            return false;
        }
        T.meta_blocks++;
        return true;
    }
    if (T.max_blocks && T.nblocks >= T.max_blocks) {
        cua_error("trace %s: reached trace_max_mb (%llu bytes); tracing stopped. Use trace_ring:1 to keep "
                  "the newest events instead.",
                  T.path, (unsigned long long)block_offset(T.max_blocks));
        stop_locked(CUA_TRACE_END_LIMIT);
        return false;
    }
    uint64_t index = T.nblocks;
    if (!block_reserve(index)) {
        stop_locked(CUA_TRACE_END_ERROR);
        return false;
    }
    T.nblocks++;
    if (!block_start(c, index, false, now)) {
        stop_locked(CUA_TRACE_END_ERROR);
        return false;
    }
    if (is_meta) {
        T.meta_blocks++;
    } else if (T.ring) {
        ring_append(index);
    }
    return true;
}

/* --------------------------------------------------------------------------------- checker */

#define TCHECK(cond, ...)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            bad++;                                                                              \
            if (report) {                                                                       \
                fprintf(report, "trace: ");                                                     \
                fprintf(report, __VA_ARGS__);                                                   \
                fputc('\n', report);                                                            \
            }                                                                                   \
        }                                                                                       \
    } while (0)

/* Lock held. The cursor's fields against the file's blocks. */
static int cursor_check(const tcur_t *c, const char *name, FILE *report)
{
    int bad = 0;
    if (!c->map)
        return 0;
    TCHECK(c->index < T.nblocks, "the %s cursor writes block %llu of %llu", name, (unsigned long long)c->index,
           (unsigned long long)T.nblocks);
    size_t end = T.block_size - (c == &T.ev ? END_RESERVE : 0);
    TCHECK(c->pos >= CUA_TRACE_BLOCK_HEADER && c->pos <= end, "the %s cursor's position %zu is outside [%u, %zu]", name,
           c->pos, CUA_TRACE_BLOCK_HEADER, end);
    TCHECK(c->last_seq <= T.seq, "the %s cursor's last record %llu is newer than the last written, %llu", name,
           (unsigned long long)c->last_seq, (unsigned long long)T.seq);
    TCHECK(memcmp(c->map, "CUAB", 4) == 0 && c->map[CUA_TRACE_BOFF_KIND] == c->kind &&
               cua_trace_get_le(c->map + CUA_TRACE_BOFF_SERIAL, 8) + 1 == c->serial,
           "the %s cursor's block is not of its kind, or has serial %llu where the next is %llu", name,
           (unsigned long long)cua_trace_get_le(c->map + CUA_TRACE_BOFF_SERIAL, 8), (unsigned long long)c->serial);
    return bad;
}

int trace_check(FILE *report)
{
    lock();
    int bad = 0;
    if (!T.open) {
        unlock();
        return 0;
    }
    TCHECK(!T.max_blocks || T.nblocks <= T.max_blocks, "%llu blocks, past the bound of %llu",
           (unsigned long long)T.nblocks, (unsigned long long)T.max_blocks);
    TCHECK(T.meta_blocks <= T.nblocks, "%llu META blocks of %llu", (unsigned long long)T.meta_blocks,
           (unsigned long long)T.nblocks);
    bad += cursor_check(&T.meta, "META", report);
    bad += cursor_check(&T.ev, "EVENT", report);
    /* Every block's header, from the file: kinds and serials. */
    uint64_t meta = 0;
    uint64_t *ring = T.ring_list.p;
    uint8_t h[CUA_TRACE_BLOCK_HEADER];
    for (uint64_t i = 0; i < T.nblocks; i++) {
        if (pread(T.fd, h, sizeof h, (off_t)block_offset(i)) != (ssize_t)sizeof h) {
            TCHECK(false, "block %llu cannot be read back", (unsigned long long)i);
            continue;
        }
        TCHECK(memcmp(h, "CUAB", 4) == 0 && cua_trace_get_le(h + CUA_TRACE_BOFF_CHECK, 2) == cua_trace_block_check(h) &&
                   (h[CUA_TRACE_BOFF_KIND] == CUA_TRACE_BLOCK_META || h[CUA_TRACE_BOFF_KIND] == CUA_TRACE_BLOCK_EVENTS),
               "block %llu has no sound header", (unsigned long long)i);
        meta += h[CUA_TRACE_BOFF_KIND] == CUA_TRACE_BLOCK_META;
        if (!T.ring)
            continue;
        /* In a ring, an EVENT block is in the ring's list, once; a META block is not in it. */
        uint64_t seen = 0;
        for (uint64_t k = 0; k < T.ring_count && k < T.max_blocks; k++)
            seen += ring[(T.ring_start + k) % T.max_blocks] == i;
        TCHECK(seen == (h[CUA_TRACE_BOFF_KIND] == CUA_TRACE_BLOCK_EVENTS), "block %llu, of kind %u, is %llu times in the ring",
               (unsigned long long)i, h[CUA_TRACE_BOFF_KIND], (unsigned long long)seen);
    }
    TCHECK(meta == T.meta_blocks, "%llu META blocks in the file, %llu counted", (unsigned long long)meta,
           (unsigned long long)T.meta_blocks);
    if (T.ring) {
        TCHECK(T.ring_start < T.max_blocks && T.ring_count <= T.max_blocks &&
                   T.ring_count + T.meta_blocks == T.nblocks,
               "the ring lists %llu blocks from %llu, with %llu META blocks of %llu", (unsigned long long)T.ring_count,
               (unsigned long long)T.ring_start, (unsigned long long)T.meta_blocks, (unsigned long long)T.nblocks);
        /* Oldest first: serials rise along the list, and the newest is the one being written. */
        uint64_t prev_serial = 0;
        for (uint64_t k = 0; k < T.ring_count && k < T.max_blocks; k++) {
            uint64_t b = ring[(T.ring_start + k) % T.max_blocks];
            if (b >= T.nblocks || pread(T.fd, h, sizeof h, (off_t)block_offset(b)) != (ssize_t)sizeof h) {
                TCHECK(false, "ring entry %llu names block %llu of %llu", (unsigned long long)k, (unsigned long long)b,
                       (unsigned long long)T.nblocks);
                continue;
            }
            uint64_t serial = cua_trace_get_le(h + CUA_TRACE_BOFF_SERIAL, 8);
            TCHECK(k == 0 || serial > prev_serial, "ring entry %llu (block %llu) has serial %llu, not above %llu",
                   (unsigned long long)k, (unsigned long long)b, (unsigned long long)serial,
                   (unsigned long long)prev_serial);
            prev_serial = serial;
        }
        TCHECK(!T.ev.map || (T.ring_count && ring[(T.ring_start + T.ring_count - 1) % T.max_blocks] == T.ev.index),
               "the EVENT cursor's block %llu is not the ring's newest", (unsigned long long)T.ev.index);
    } else {
        TCHECK(T.ring_count == 0, "a linear file with %llu blocks in a ring", (unsigned long long)T.ring_count);
    }
    /* The Python frames' table: npy entries, ids 1..npy each once, and the arena holds exactly
     * their strings after its leading "" (a frame left undefined gives its copies back). */
    const pyent_t *tab = T.pyents.p;
    const char *arena = T.arena.p;
    size_t ents = 0, strings = T.arena_used ? 1 : 0;
    uint64_t id_sum = 0;
    for (size_t i = 0; i < T.pyent_cap; i++) {
        if (!tab[i].id)
            continue;
        ents++;
        id_sum += tab[i].id;
        bool inside = tab[i].func > 0 && tab[i].func < T.arena_used && tab[i].file > 0 && tab[i].file < T.arena_used;
        TCHECK(inside && tab[i].id <= T.npy, "Python frame %u names arena offsets %llu, %llu of %zu", tab[i].id,
               (unsigned long long)tab[i].func, (unsigned long long)tab[i].file, T.arena_used);
        if (inside)
            strings += strnlen(arena + tab[i].func, T.arena_used - tab[i].func) + 1 +
                       strnlen(arena + tab[i].file, T.arena_used - tab[i].file) + 1;
    }
    TCHECK(ents == T.npy && id_sum == (uint64_t)T.npy * (T.npy + 1) / 2, "%zu Python frames in the table, %zu counted",
           ents, T.npy);
    TCHECK(strings == T.arena_used, "the arena of Python frame names uses %zu bytes, its frames' strings %zu",
           T.arena_used, strings);
    unlock();
    return bad;
}

#undef TCHECK

void trace_test_fields(trace_test_fields_t *out)
{
    out->ring = T.ring_list.p;
    out->ring_start = &T.ring_start;
    out->ring_count = &T.ring_count;
    out->meta_blocks = &T.meta_blocks;
    out->nblocks = &T.nblocks;
    out->ev_pos = &T.ev.pos;
    out->ev_serial = &T.ev.serial;
    out->ev_last_seq = &T.ev.last_seq;
    out->max_blocks = T.max_blocks;
}

/* --------------------------------------------------------------------------------- records */

/* Writes one record (type, payload) at c's position; the caller made sure it fits. The length's
 * first byte is stored last, with release order: the commit. */
static void record_put(tcur_t *c, uint8_t type, const uint8_t *payload, size_t plen)
{
    uint64_t seq = T.seq + 1;
    uint64_t delta = seq - c->last_seq;
    size_t body = 1 + varint_len(delta) + plen;
    uint8_t lenb[4];
    size_t nl = put_varint(lenb, body);
    uint8_t *dst = c->map + c->pos;
    dst[nl] = type;
    size_t k = put_varint(dst + nl + 1, delta);
    if (plen)
        memcpy(dst + nl + 1 + k, payload, plen);
    for (size_t i = 1; i < nl; i++)
        dst[i] = lenb[i];
    __atomic_store_n(dst, lenb[0], __ATOMIC_RELEASE);
    c->pos += nl + body;
    c->last_seq = seq;
    T.seq = seq;
}

static size_t record_size(const tcur_t *c, size_t plen)
{
    size_t body = 1 + varint_len(T.seq + 1 - c->last_seq) + plen;
    return varint_len(body) + body;
}

/* A META record. false when it could not be written (ring with a full META area, or stopped). */
static bool meta_put(uint8_t type, const uint8_t *payload, size_t plen)
{
    if (!T.open)
        return false;
    if (!T.meta.map || T.meta.pos + record_size(&T.meta, plen) > T.block_size) {
        if (T.meta_full || !block_next(&T.meta, T.ev.time))
            return false;
        if (T.meta.pos + record_size(&T.meta, plen) > T.block_size)
            return false; /* cannot happen: META payloads are capped well below a block */
    }
    record_put(&T.meta, type, payload, plen);
    return true;
}

/* An event, in the terms of cualloc_trace.h's delta encoding. */
typedef struct ev_s {
    uint8_t type;
    uint8_t flags;         /* F_COMPLETED */
    bool has_stream, has_addr, has_stack, has_slack;
    uint32_t dev, thread, stream, stack;
    uint64_t addr, size, requested;
    const uint8_t *tail;   /* bytes after the fields above (OOM numbers, MARK label, END) */
    size_t tail_len;
} ev_t;

/* Encodes e's payload against c's delta state into out; returns its length. */
static size_t ev_encode(const tcur_t *c, const ev_t *e, uint64_t now, uint8_t *out)
{
    uint8_t flags = e->flags;
    uint8_t *p = out + 1;
    p += put_varint(p, now - c->time);
    if (e->dev == c->dev)
        flags |= CUA_TRACE_F_SAME_DEV;
    else
        p += put_varint(p, e->dev);
    if (e->thread == c->thread)
        flags |= CUA_TRACE_F_SAME_THREAD;
    else
        p += put_varint(p, e->thread);
    if (e->has_stream) {
        if (e->stream == c->stream)
            flags |= CUA_TRACE_F_SAME_STREAM;
        else
            p += put_varint(p, e->stream);
    }
    if (e->type == CUA_TRACE_OOM) {
        if (e->stack == c->stack)
            flags |= CUA_TRACE_F_SAME_STACK;
        else
            p += put_varint(p, e->stack);
    }
    if (e->has_addr) {
        uint64_t diff = e->addr - c->addr[e->dev];
        bool units = diff % CUA_TRACE_UNIT == 0 && e->size % CUA_TRACE_UNIT == 0;
        int64_t d = (int64_t)diff;
        if (units) {
            p += put_varint(p, zigzag(d / (int64_t)CUA_TRACE_UNIT));
            p += put_varint(p, e->size / CUA_TRACE_UNIT);
        } else {
            flags |= CUA_TRACE_F_BYTES;
            p += put_varint(p, zigzag(d));
            p += put_varint(p, e->size);
        }
    }
    if (e->has_slack) {
        if (e->requested == e->size)
            flags |= CUA_TRACE_F_EXACT;
        else
            p += put_varint(p, e->size - e->requested);
    }
    if (e->has_stack && e->type != CUA_TRACE_OOM) {
        if (e->stack == c->stack)
            flags |= CUA_TRACE_F_SAME_STACK;
        else
            p += put_varint(p, e->stack);
    }
    if (e->tail_len) {
        memcpy(p, e->tail, e->tail_len);
        p += e->tail_len;
    }
    out[0] = flags;
    return (size_t)(p - out);
}

static void ev_apply(tcur_t *c, const ev_t *e, uint64_t now)
{
    c->time = now;
    c->dev = e->dev;
    c->thread = e->thread;
    if (e->has_stream)
        c->stream = e->stream;
    if (e->has_stack)
        c->stack = e->stack;
    if (e->has_addr)
        c->addr[e->dev] = e->addr;
}

static void lost_repeat_locked(uint64_t now);

/* Writes an event (opening the next block when the current one is full); *at receives the clock
 * reading it was written at. false when tracing stopped on the way. */
static bool ev_put_at(const ev_t *e, uint64_t *at)
{
    uint8_t buf[64 + STR_MAX + 16];
    static uint8_t big[META_SCRATCH / 2 + 64]; /* END with statistics; under the lock */
    uint8_t *out = e->tail_len + 64 <= sizeof buf ? buf : big;
    if (e->tail_len + 64 > sizeof big)
        return false;
    uint64_t now = now_ns();
    *at = now;
    for (int attempt = 0; attempt < 2 && T.open; attempt++) {
        size_t reserve = e->type == CUA_TRACE_END ? 0 : END_RESERVE;
        if (T.ev.map) {
            size_t plen = ev_encode(&T.ev, e, now, out);
            if (T.ev.pos + record_size(&T.ev, plen) + reserve <= T.block_size) {
                record_put(&T.ev, e->type, out, plen);
                if (e->type != CUA_TRACE_LOST) /* as the format says: a 1.1 reader skips it */
                    ev_apply(&T.ev, e, now);
                return true;
            }
        }
        if (e->type == CUA_TRACE_END && !T.ring && T.max_blocks && T.nblocks >= T.max_blocks)
            return false; /* no room for the stats: the caller writes the short END */
        if (!block_next(&T.ev, now))
            return false;
        if (T.ring && T.lost_recorded)
            lost_repeat_locked(now);
    }
    return false;
}

static bool ev_put(const ev_t *e)
{
    uint64_t at;
    return ev_put_at(e, &at);
}

/* A LOST record for the table of bit t (CUA_TRACE_LOST_*), its refusal `ago` ns before the record. */
static ev_t lost_event(unsigned t, uint64_t ago, uint8_t tail[2 * CUA_TRACE_VARINT_MAX])
{
    size_t n = put_varint(tail, t);
    n += put_varint(tail + n, ago);
    ev_t e = {.type = CUA_TRACE_LOST, .tail = tail, .tail_len = n};
    e.dev = T.ev.dev; /* meaningless here: keep the state's, so no byte is spent */
    e.thread = T.ev.thread;
    return e;
}

/* A ring reuses its oldest event blocks, and a LOST record goes with its block while the records
 * after it that went without survive: so each new event block of a ring starts with every LOST
 * record of the file again, each saying how long before it the refusal came. A new block has room
 * for them (a few bytes each). */
static void lost_repeat_locked(uint64_t now)
{
    for (unsigned t = 0; t < 32; t++) {
        if (!(T.lost_recorded & (1u << t)))
            continue;
        uint8_t tail[2 * CUA_TRACE_VARINT_MAX], out[64];
        ev_t e = lost_event(t, now > T.lost_at[t] ? now - T.lost_at[t] : 0, tail);
        size_t plen = ev_encode(&T.ev, &e, now, out);
        if (T.ev.map && T.ev.pos + record_size(&T.ev, plen) + END_RESERVE <= T.block_size)
            record_put(&T.ev, CUA_TRACE_LOST, out, plen); /* no part in the delta state */
    }
}

/* Host memory was refused for one of the recorder's tables while it records (under the lock): the
 * record that needed it goes without (an allocation without its stack or stream, a Python frame or
 * module not defined). The trace stays readable, but lacks that, and says so twice: a LOST record
 * per table and file, before the first record that goes without (so that allocview tells a
 * report's unnamed frames or "(stack not recorded)" from the program's, when the message below is
 * long gone), and the message, once per file. */
static void table_refused_locked(const char *what, enum cua_trace_lost_table table)
{
    unsigned t = table < 32 ? (unsigned)table : 0; /* (the tables are 1..5) */
    if (T.open && !(T.lost_recorded & (1u << t))) {
        uint8_t tail[2 * CUA_TRACE_VARINT_MAX];
        ev_t e = lost_event(t, 0, tail);
        uint64_t at;
        if (ev_put_at(&e, &at)) {
            T.lost_recorded |= 1u << t;
            T.lost_at[t] = at;
        }
    }
    if (T.table_refused_said)
        return;
    T.table_refused_said = true;
    cua_error("trace %s: host memory ran out for the recorder's %s; records from now on may lack their stacks, "
              "streams or frame names. " CUA_HOST_MEMORY_FIX,
              T.path, what);
}

/* vec_reserve for a table the recorder grows while it records (under the lock), whose refusal is
 * said (table_refused_locked). */
static bool table_reserve_locked(vec_t *v, size_t bytes, const char *what, enum cua_trace_lost_table table)
{
    if (vec_reserve(v, bytes))
        return true;
    table_refused_locked(what, table);
    return false;
}

/* ------------------------------------------------------------------------------- definitions */

static uint32_t thread_id_locked(void)
{
    if (tls.gen == T.gen && tls.thread)
        return tls.thread;
    uint8_t *p = T.scratch;
    uint32_t id = T.nthreads + 1;
    char name[17] = {0};
    prctl(PR_GET_NAME, name, 0, 0, 0);
    p += put_varint(p, id);
    p += put_varint(p, (uint64_t)gettid());
    p += put_string(p, name, 16);
    if (!meta_put(CUA_TRACE_THREAD, T.scratch, (size_t)(p - T.scratch)))
        return 0;
    T.nthreads = id;
    tls.gen = T.gen;
    tls.thread = id;
    return id;
}

static uint32_t stream_id_locked(cua_stream s)
{
    uint64_t h = (uint64_t)(uintptr_t)s;
    sslot_t *tab = T.sslots.p;
    size_t mask = T.sslot_cap - 1, i = mix64(h) & mask;
    for (; tab[i].id; i = (i + 1) & mask)
        if (tab[i].handle == h)
            return tab[i].id;
    if ((T.nstreams + 1) * 2 > T.sslot_cap) {
        /* Grow: rehash into a table twice the size. */
        size_t ncap = T.sslot_cap * 2;
        vec_t nv = {0};
        if (!table_reserve_locked(&nv, ncap * sizeof(sslot_t), "table of streams", CUA_TRACE_LOST_STREAMS))
            return 0;
        memset(nv.p, 0, ncap * sizeof(sslot_t));
        sslot_t *nt = nv.p;
        for (size_t j = 0; j < T.sslot_cap; j++) {
            if (!tab[j].id)
                continue;
            size_t k = mix64(tab[j].handle) & (ncap - 1);
            while (nt[k].id)
                k = (k + 1) & (ncap - 1);
            nt[k] = tab[j];
        }
        munmap(T.sslots.p, T.sslots.bytes);
        T.sslots = nv;
        T.sslot_cap = ncap;
        return stream_id_locked(s);
    }
    uint8_t pay[32], *p = pay;
    uint32_t id = (uint32_t)T.nstreams + 1;
    p += put_varint(p, id);
    p += put_varint(p, h);
    if (!meta_put(CUA_TRACE_STREAM, pay, (size_t)(p - pay)))
        return 0;
    tab[i].handle = h;
    tab[i].id = id;
    T.nstreams++;
    return id;
}

static void device_put_locked(int dev)
{
    const devinfo_t *d = &T.dev[dev];
    uint8_t *p = T.scratch;
    p += put_varint(p, (uint64_t)dev);
    p += put_varint(p, d->total);
    p += put_varint(p, d->capacity);
    p += put_varint(p, d->granularity);
    *p++ = d->vmm ? CUA_TRACE_MODE_VMM : CUA_TRACE_MODE_CLASSIC;
    p += put_string(p, d->name, 95);
    meta_put(CUA_TRACE_DEVICE, T.scratch, (size_t)(p - T.scratch));
}

/* --------------------------------------------------------------------------------- modules */

typedef struct modscan_s {
    uint64_t base, start, end;
    char path[512];
    uint8_t build_id[64];
    size_t id_len;
} modscan_t;

static vec_t scan_vec;   /* modscan_t[], under mod_lock */
static size_t scan_count;
static bool scan_short;  /* the last scan stopped for want of host memory (under mod_lock) */

static int scan_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    if (!vec_reserve(&scan_vec, (scan_count + 1) * sizeof(modscan_t))) {
        scan_short = true;
        return 1;
    }
    modscan_t *m = (modscan_t *)scan_vec.p + scan_count;
    memset(m, 0, sizeof *m);
    m->base = info->dlpi_addr;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD) {
            uint64_t a = info->dlpi_addr + ph->p_vaddr;
            if (a < lo)
                lo = a;
            if (a + ph->p_memsz > hi)
                hi = a + ph->p_memsz;
        } else if (ph->p_type == PT_NOTE && m->id_len == 0) {
            const uint8_t *n = (const uint8_t *)(uintptr_t)(info->dlpi_addr + ph->p_vaddr);
            size_t left = ph->p_memsz;
            while (left >= sizeof(ElfW(Nhdr))) {
                const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)(const void *)n;
                size_t namesz = (nh->n_namesz + 3u) & ~3u, descsz = (nh->n_descsz + 3u) & ~3u;
                size_t total = sizeof *nh + namesz + descsz;
                if (total > left)
                    break;
                if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                    memcmp(n + sizeof *nh, "GNU", 4) == 0 && nh->n_descsz <= sizeof m->build_id) {
                    memcpy(m->build_id, n + sizeof *nh + namesz, nh->n_descsz);
                    m->id_len = nh->n_descsz;
                    break;
                }
                n += total;
                left -= total;
            }
        }
    }
    if (lo == UINT64_MAX)
        return 0;
    m->start = lo;
    m->end = hi;
    const char *name = info->dlpi_name;
    if ((!name || !name[0]) && scan_count == 0) {
        ssize_t k = readlink("/proc/self/exe", m->path, sizeof m->path - 1);
        if (k > 0)
            m->path[k] = '\0';
    } else if (name) {
        snprintf(m->path, sizeof m->path, "%s", name);
    }
    scan_count++;
    return 0;
}

static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
        *(unsigned long long *)arg = info->dlpi_adds;
    return 1;
}

/* The path of the file mapped at `addr`, from /proc/self/maps, into path (len bytes): for a module
 * the loader found by a relative name ("./libx.so", from dlopen or LD_LIBRARY_PATH=.), which it
 * keeps as given and which allocview, reading the trace later from another folder, could not
 * open. Plain reads into a fixed buffer (under mod_lock): no host memory taken. Returns whether
 * found. */
static char maps_buf[8192];
static char abs_path[512]; /* mapped_file's answer in modules_refresh (under mod_lock) */
static bool mapped_file(uint64_t addr, char *path, size_t len)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool found = false;
    size_t have = 0;
    for (;;) {
        ssize_t k = read(fd, maps_buf + have, sizeof maps_buf - 1 - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        have += (size_t)k;
        maps_buf[have] = '\0';
        char *line = maps_buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            /* "start-end perms offset dev inode   /path": no '/' before the path. */
            char *end;
            uint64_t lo = strtoull(line, &end, 16), hi = *end == '-' ? strtoull(end + 1, NULL, 16) : 0;
            const char *file = strchr(line, '/');
            if (addr >= lo && addr < hi) {
                if (file && strlen(file) < len) {
                    memcpy(path, file, strlen(file) + 1);
                    found = true;
                }
                close(fd);
                return found;
            }
            line = nl + 1;
        }
        /* The unfinished line moves to the front; a line longer than the buffer is dropped. */
        have = (size_t)(maps_buf + have - line);
        if (have == sizeof maps_buf - 1)
            have = 0;
        memmove(maps_buf, line, have);
    }
    close(fd);
    return found;
}

/* Records the modules loaded since the last scan. Called without the recorder lock (it takes
 * the loader's lock), from stack capture on a cache miss. Out of line: inlined into the capture,
 * which runs on every recorded allocation, it cost the capture 7 instructions a call. */
static __attribute__((noinline, cold)) void modules_refresh(void)
{
    pthread_mutex_lock(&mod_lock);
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_cb, &adds);
    lock();
    bool stale = T.open && (T.modules_stale || T.modules_short || adds != T.dl_adds);
    unlock();
    if (stale) {
        scan_count = 0;
        scan_short = false;
        dl_iterate_phdr(scan_cb, NULL);
        lock();
        /* A scan cut short, or a module not kept in the list of those recorded, leaves the
         * modules short: the next stack-cache miss scans again and records what is missing (not
         * every capture, as a stale list makes it, which would scan at each while memory stays
         * short). */
        bool complete = !scan_short;
        if (scan_short && T.open)
            table_refused_locked("table of modules", CUA_TRACE_LOST_MODULES);
        T.dl_adds = adds;
        for (size_t i = 0; i < scan_count && T.open; i++) {
            const modscan_t *m = (const modscan_t *)scan_vec.p + i;
            uint64_t ph = hash_bytes(m->base, m->path);
            module_t *known = T.modules.p;
            bool seen = false;
            for (size_t j = 0; j < T.nmodules && !seen; j++)
                seen = known[j].base == m->base && known[j].start == m->start && known[j].path_hash == ph;
            if (seen)
                continue;
            /* The relative name of a library (the executable's and the vDSO's have no '/')
             * as the absolute path of its file. */
            const char *path = m->path;
            if (path[0] != '/' && strchr(path, '/') && mapped_file(m->start, abs_path, sizeof abs_path))
                path = abs_path;
            uint8_t *p = T.scratch;
            p += put_varint(p, m->base);
            p += put_varint(p, m->start);
            p += put_varint(p, m->end);
            p += put_string(p, path, T.block_size / 8 < 511 ? T.block_size / 8 : 511);
            p += put_varint(p, m->id_len);
            memcpy(p, m->build_id, m->id_len);
            p += m->id_len;
            /* The list's room first: a module recorded but not listed would be recorded again. */
            if (!table_reserve_locked(&T.modules, (T.nmodules + 1) * sizeof(module_t), "table of modules",
                                      CUA_TRACE_LOST_MODULES)) {
                complete = false;
                break;
            }
            if (!meta_put(CUA_TRACE_MODULE, T.scratch, (size_t)(p - T.scratch)))
                break;
            known = T.modules.p;
            known[T.nmodules++] = (module_t){m->base, m->start, m->end, ph};
        }
        T.modules_short = !complete;
        __atomic_store_n(&T.modules_stale, false, __ATOMIC_RELAXED);
        unlock();
    }
    pthread_mutex_unlock(&mod_lock);
}

/* ---------------------------------------------------------------------------------- Python */

/* CPython's C API, resolved at run time (no build-time dependency): present only when the
 * process has an interpreter, used only by a thread that holds the GIL, or takes it (below).
 * Objects are void *. */
enum { PY_UNRESOLVED, PY_USABLE, PY_ABSENT, PY_RESOLVING };
static struct {
    /* PY_*. One thread moves it from PY_UNRESOLVED to PY_RESOLVING and fills the pointers below;
     * the release store of PY_USABLE or PY_ABSENT publishes them, and nothing writes them after. */
    _Atomic int state;
    int (*is_initialized)(void);
    int (*gil_check)(void);
    /* Optional: taking the GIL for a thread that has a Python thread state but let the GIL go. */
    void *(*gil_this_thread)(void);
    int (*gil_ensure)(void);
    void (*gil_release)(int);
    int (*is_finalizing)(void);
    void *(*tstate_unchecked)(void);
    void *(*tstate_get)(void);
    void *(*get_frame)(void *tstate);
    void *(*frame_code)(void *frame);
    int (*frame_line)(void *frame);
    void *(*frame_back)(void *frame);
    void *(*getattr)(void *obj, const char *name);
    const char *(*as_utf8)(void *str);
    void (*decref)(void *obj);
    void (*err_fetch)(void **type, void **value, void **tb);
    void (*err_restore)(void *type, void *value, void *tb);
} py;

/* Fills the table once: the thread that claims the resolution does it while the others wait for
 * its answer (a few dlsym calls), since they would otherwise write the pointers under a reader
 * that already saw them published. Returns the final state. */
static int py_resolve(void)
{
    int st = PY_UNRESOLVED;
    if (!atomic_compare_exchange_strong_explicit(&py.state, &st, PY_RESOLVING, memory_order_acquire,
                                                 memory_order_acquire)) {
        while (st == PY_RESOLVING) {
            sched_yield();
            st = atomic_load_explicit(&py.state, memory_order_acquire);
        }
        return st;
    }
#define PYSYM(field, name) *(void **)(&py.field) = dlsym(RTLD_DEFAULT, name)
    PYSYM(is_initialized, "Py_IsInitialized");
    PYSYM(gil_check, "PyGILState_Check");
    PYSYM(gil_this_thread, "PyGILState_GetThisThreadState");
    PYSYM(gil_ensure, "PyGILState_Ensure");
    PYSYM(gil_release, "PyGILState_Release");
    PYSYM(is_finalizing, "Py_IsFinalizing");
    if (!py.is_finalizing)
        PYSYM(is_finalizing, "_Py_IsFinalizing");
    PYSYM(tstate_unchecked, "PyThreadState_GetUnchecked");
    if (!py.tstate_unchecked)
        PYSYM(tstate_unchecked, "_PyThreadState_UncheckedGet");
    PYSYM(tstate_get, "PyThreadState_Get");
    PYSYM(get_frame, "PyThreadState_GetFrame");
    PYSYM(frame_code, "PyFrame_GetCode");
    PYSYM(frame_line, "PyFrame_GetLineNumber");
    PYSYM(frame_back, "PyFrame_GetBack");
    PYSYM(getattr, "PyObject_GetAttrString");
    PYSYM(as_utf8, "PyUnicode_AsUTF8");
    PYSYM(decref, "Py_DecRef");
    PYSYM(err_fetch, "PyErr_Fetch");
    PYSYM(err_restore, "PyErr_Restore");
#undef PYSYM
    bool ok = py.is_initialized && py.gil_check && (py.tstate_unchecked || py.tstate_get) && py.get_frame &&
              py.frame_code && py.frame_line && py.frame_back && py.getattr && py.as_utf8 && py.decref &&
              py.err_fetch && py.err_restore;
    st = ok ? PY_USABLE : PY_ABSENT;
    atomic_store_explicit(&py.state, st, memory_order_release);
    return st;
}

typedef struct pyframe_s {
    void *name_obj, *file_obj; /* references held until the frame is interned */
    const char *name, *file;
    int line;
    uint64_t hash;
} pyframe_t;

static unsigned py_collect_held(pyframe_t *out, unsigned max);

/* The calling thread's Python frames, innermost first, when it holds the GIL, or, with
 * may_take_gil, when it has a Python thread state and let the GIL go: PyTorch's operators release
 * the GIL before they allocate, so under PyTorch the Python lines behind an allocation are found
 * only by taking the GIL back for the capture, as PyTorch's own memory history does. Only the
 * public API's callers (PyTorch's pluggable allocator calls cualloc_malloc holding no lock of its
 * own) may take it: the LD_PRELOAD entry points are reached from inside PyTorch's caching
 * allocator, which holds its mutex then, and a thread holding the GIL may be waiting for that
 * mutex. *gil: the state to pass to PyGILState_Release once the frames are released (py_release:
 * their names are borrowed from Python objects until then), -1 when the GIL was not taken. Lock
 * order: the GIL before the recorder's locks (nothing takes the GIL holding those). */
static unsigned py_collect(pyframe_t *out, unsigned max, bool may_take_gil, int *gil)
{
    *gil = -1;
    int st = atomic_load_explicit(&py.state, memory_order_acquire);
    if (st == PY_UNRESOLVED || st == PY_RESOLVING)
        st = py_resolve();
    if (st != PY_USABLE || !py.is_initialized())
        return 0;
    if (py.gil_check() == 1)
        return py_collect_held(out, max);
    if (!may_take_gil || !py.gil_this_thread || !py.gil_ensure || !py.gil_release || !py.gil_this_thread() ||
        (py.is_finalizing && py.is_finalizing()))
        return 0;
    *gil = py.gil_ensure();
    return py_collect_held(out, max);
}

static unsigned py_collect_held(pyframe_t *out, unsigned max)
{
    void *ts = py.tstate_unchecked ? py.tstate_unchecked() : py.tstate_get();
    if (!ts)
        return 0;
    void *et = NULL, *ev = NULL, *etb = NULL;
    py.err_fetch(&et, &ev, &etb); /* keep a pending exception out of our attribute lookups */
    unsigned n = 0;
    void *frame = py.get_frame(ts);
    while (frame && n < max) {
        void *code = py.frame_code(frame);
        if (code) {
            pyframe_t *f = &out[n];
            f->name_obj = py.getattr(code, "co_qualname");
            if (!f->name_obj) {
                py.err_restore(NULL, NULL, NULL);
                f->name_obj = py.getattr(code, "co_name");
            }
            f->file_obj = py.getattr(code, "co_filename");
            f->name = f->name_obj ? py.as_utf8(f->name_obj) : NULL;
            f->file = f->file_obj ? py.as_utf8(f->file_obj) : NULL;
            py.err_restore(NULL, NULL, NULL); /* clears whatever a failed lookup left */
            f->line = py.frame_line(frame);
            f->hash = hash_bytes(hash_bytes((uint64_t)(unsigned)f->line, f->name ? f->name : "?"),
                                 f->file ? f->file : "?");
            py.decref(code);
            n++;
        }
        void *back = py.frame_back(frame);
        py.decref(frame);
        frame = back;
    }
    if (frame)
        py.decref(frame);
    py.err_restore(et, ev, etb);
    return n;
}

static void py_release(pyframe_t *f, unsigned n, int gil)
{
    for (unsigned i = 0; i < n; i++) {
        if (f[i].name_obj)
            py.decref(f[i].name_obj);
        if (f[i].file_obj)
            py.decref(f[i].file_obj);
    }
    if (gil >= 0)
        py.gil_release(gil);
}

/* Copies s (cut at 511 bytes) into the arena; returns its offset there, 0 when the arena cannot
 * grow (offset 0 holds "", never a copy). Under the lock. */
static uint64_t arena_copy(const char *s)
{
    size_t n = strnlen(s, 511);
    if (T.arena_used == 0) {
        if (!table_reserve_locked(&T.arena, 1, "Python frame names", CUA_TRACE_LOST_PYNAMES))
            return 0;
        ((char *)T.arena.p)[0] = '\0';
        T.arena_used = 1;
    }
    if (!table_reserve_locked(&T.arena, T.arena_used + n + 1, "Python frame names", CUA_TRACE_LOST_PYNAMES))
        return 0;
    char *dst = (char *)T.arena.p + T.arena_used;
    memcpy(dst, s, n);
    dst[n] = '\0';
    uint64_t off = T.arena_used;
    T.arena_used += n + 1;
    return off;
}

/* The PYFRAME id of a frame, defining it on first sight. 0 when it cannot be defined. */
static uint32_t pyframe_id_locked(const pyframe_t *f)
{
    const char *name = f->name ? f->name : "?", *file = f->file ? f->file : "?";
    pyent_t *tab = T.pyents.p;
    size_t mask = T.pyent_cap - 1, i = f->hash & mask;
    for (; tab[i].id; i = (i + 1) & mask) {
        if (tab[i].hash == f->hash && tab[i].line == (uint32_t)f->line &&
            strncmp((const char *)T.arena.p + tab[i].func, name, 511) == 0 &&
            strncmp((const char *)T.arena.p + tab[i].file, file, 511) == 0)
            return tab[i].id;
    }
    if ((T.npy + 1) * 2 > T.pyent_cap) {
        size_t ncap = T.pyent_cap * 2;
        vec_t nv = {0};
        if (!table_reserve_locked(&nv, ncap * sizeof(pyent_t), "table of Python frames", CUA_TRACE_LOST_PYFRAMES))
            return 0;
        memset(nv.p, 0, ncap * sizeof(pyent_t));
        pyent_t *nt = nv.p;
        for (size_t j = 0; j < T.pyent_cap; j++) {
            if (!tab[j].id)
                continue;
            size_t k = tab[j].hash & (ncap - 1);
            while (nt[k].id)
                k = (k + 1) & (ncap - 1);
            nt[k] = tab[j];
        }
        munmap(T.pyents.p, T.pyents.bytes);
        T.pyents = nv;
        T.pyent_cap = ncap;
        return pyframe_id_locked(f);
    }
    if (T.meta_full)
        return 0; /* a ring's definitions fill half the file: no new frame can be defined */
    /* Strings kept as arena offsets: the arena grows by mremap and may move. Copied before the
     * record is written: a frame whose strings the arena cannot keep is not defined. A frame left
     * undefined gives its copies back (the arena holds only defined frames' strings). */
    size_t arena_mark = T.arena_used;
    uint64_t fo = arena_copy(name), fi = fo ? arena_copy(file) : 0;
    uint32_t id = (uint32_t)T.npy + 1;
    uint8_t *p = T.scratch;
    p += put_varint(p, id);
    p += put_varint(p, (uint64_t)(f->line < 0 ? 0 : f->line));
    p += put_string(p, name, 511);
    p += put_string(p, file, 511);
    if (!fi || !meta_put(CUA_TRACE_PYFRAME, T.scratch, (size_t)(p - T.scratch))) {
        T.arena_used = arena_mark;
        return 0;
    }
    tab[i] = (pyent_t){f->hash, id, (uint32_t)f->line, fo, fi};
    T.npy++;
    return id;
}

/* ---------------------------------------------------------------------------------- stacks */

static uint64_t nslot_hash(uint32_t parent, uint64_t key) { return mix64(key ^ ((uint64_t)parent * 0x9E3779B97F4A7C15ull)); }

/* The id of the node (parent, key), defining it on first sight; 0 when it cannot be. */
static uint32_t node_id_locked(uint32_t parent, uint64_t key, uint64_t pyhash)
{
    nslot_t *tab = T.nslots.p;
    size_t mask = T.nslot_cap - 1, i = nslot_hash(parent, key) & mask;
    for (; tab[i].id; i = (i + 1) & mask)
        if (tab[i].key == key && tab[i].parent == parent)
            return tab[i].id;
    if (((size_t)T.nnodes + 1) * 2 > T.nslot_cap) {
        size_t ncap = T.nslot_cap * 2;
        vec_t nv = {0};
        if (!table_reserve_locked(&nv, ncap * sizeof(nslot_t), "table of stacks", CUA_TRACE_LOST_STACKS))
            return 0;
        memset(nv.p, 0, ncap * sizeof(nslot_t));
        nslot_t *nt = nv.p;
        for (size_t j = 0; j < T.nslot_cap; j++) {
            if (!tab[j].id)
                continue;
            size_t k = nslot_hash(tab[j].parent, tab[j].key) & (ncap - 1);
            while (nt[k].id)
                k = (k + 1) & (ncap - 1);
            nt[k] = tab[j];
        }
        munmap(T.nslots.p, T.nslots.bytes);
        T.nslots = nv;
        T.nslot_cap = ncap;
        return node_id_locked(parent, key, pyhash);
    }
    if (!table_reserve_locked(&T.nodes, ((size_t)T.nnodes + 2) * sizeof(node_t), "table of stacks",
                              CUA_TRACE_LOST_STACKS))
        return 0;
    uint32_t id = T.nnodes + 1;
    uint8_t pay[40], *p = pay;
    p += put_varint(p, id);
    p += put_varint(p, parent);
    *p++ = (key & PY_TAG) ? CUA_TRACE_FRAME_PYTHON : CUA_TRACE_FRAME_NATIVE;
    p += put_varint(p, key & ~PY_TAG);
    if (!meta_put(CUA_TRACE_STACK, pay, (size_t)(p - pay)))
        return 0;
    ((node_t *)T.nodes.p)[id] = (node_t){key, pyhash, parent, 0};
    tab[i] = (nslot_t){key, parent, id};
    T.nnodes = id;
    return id;
}

/* Does leaf's path to the root spell the stack (keys innermost first; Python keys compared by
 * their frame's hash)? */
static bool stack_matches(uint32_t leaf, const uint64_t *keys, unsigned n, const pyframe_t *pyf, unsigned npy)
{
    const node_t *nodes = T.nodes.p;
    uint32_t id = leaf;
    for (unsigned i = 0; i < n; i++) {
        if (id == 0 || id > T.nnodes)
            return false;
        uint64_t k = nodes[id].key;
        if (i < n - npy) {
            if (k != keys[i])
                return false;
        } else if (!(k & PY_TAG) || nodes[id].pyhash != pyf[i - (n - npy)].hash) {
            return false;
        }
        id = nodes[id].parent;
    }
    return id == 0;
}

/* Interns a stack: native return addresses innermost first, then Python frames innermost first
 * (the outer part). Returns the leaf's id (0: none). */
static uint32_t stack_intern_locked(const uint64_t *native, unsigned nnat, const pyframe_t *pyf, unsigned npy,
                                    uint64_t hash)
{
    unsigned n = nnat + npy;
    if (n == 0)
        return 0;
    cache_t *ce = &T.cache[hash & (STACK_CACHE - 1)];
    if (ce->hash == hash && ce->depth == n && ce->leaf && stack_matches(ce->leaf, native, n, pyf, npy))
        return ce->leaf;
    uint32_t parent = 0;
    for (unsigned i = npy; i-- > 0;) {
        uint32_t pid = pyframe_id_locked(&pyf[i]);
        if (!pid || !(parent = node_id_locked(parent, PY_TAG | pid, pyf[i].hash)))
            return 0;
    }
    for (unsigned i = nnat; i-- > 0;)
        if (!(parent = node_id_locked(parent, native[i], 0)))
            return 0;
    /* The hash is also peeked without the lock (trace_capture_stack): stored atomically. */
    __atomic_store_n(&ce->hash, hash, __ATOMIC_RELAXED);
    ce->depth = n;
    ce->leaf = parent;
    return parent;
}

/* The stack starts `skip` frames below the caller of the function that called trace_capture_stack,
 * or, when caller_ip is set, at the frame whose return address it is (then skip is 0). */
static __attribute__((always_inline)) inline void capture_stack(int skip, const void *caller_ip, bool may_take_gil)
{
    if (!trace_enabled() || tls.busy)
        return;
    unsigned depth = __atomic_load_n(&T.depth, __ATOMIC_RELAXED);
    uint64_t gen = atomic_load_explicit(&gen_pub, memory_order_acquire);
    tls.has_stack = false;
    if (depth == 0)
        return;
    busy_enter();
    void *buf[MAX_DEPTH + 32];
    if (skip < 0)
        skip = 0;
    if (skip > 16)
        skip = 16;
    /* unw_backtrace's first entries are inside the unwinder and this function: the front door's
     * frame is the entry equal to our return address. Where that is depends on the build only, so
     * it is found once (self_frames) and reused. */
    static _Atomic int self_frames = -1;
    int self = atomic_load_explicit(&self_frames, memory_order_relaxed);
    /* caller_ip: the front door may have tail-called the function that called us (0 frames
     * between), or not (1). That too depends on the build only: found once (from_extra), then
     * checked by one comparison per capture, and unwinding stops where the stack ends. */
    static _Atomic int from_extra = -1;
    int extra = caller_ip ? atomic_load_explicit(&from_extra, memory_order_relaxed) : 0;
    int want = (int)depth + skip + (self >= 0 ? self + 1 : 9) + (extra >= 0 ? extra : 1);
    int got = unwinder_get()(buf, want);
    if (self < 0) {
        void *ret = __builtin_return_address(0);
        for (int i = 0; i < got && i < 8; i++)
            if (buf[i] == ret) {
                self = i;
                break;
            }
        if (self < 0)
            self = 1; /* not found (unexpected): assume buf[0] is this function */
        else
            atomic_store_explicit(&self_frames, self, memory_order_relaxed);
    }
    unsigned first = (unsigned)(self + 1 + skip); /* buf[self] is the front door itself */
    if (caller_ip) {
        if (extra >= 0 && self + 1 + extra < got && buf[self + 1 + extra] == caller_ip) {
            first = (unsigned)(self + 1 + extra);
        } else {
            for (int i = self + 1; i < got && i <= self + 2; i++)
                if (buf[i] == caller_ip) {
                    first = (unsigned)i;
                    atomic_store_explicit(&from_extra, i - self - 1, memory_order_relaxed);
                    break;
                }
        }
    }
    unsigned nnat = got > (int)first ? (unsigned)got - first : 0;
    if (nnat > depth)
        nnat = depth;
    uint64_t native[MAX_DEPTH];
    uint64_t hash = 0x243F6A8885A308D3ull;
    for (unsigned i = 0; i < nnat; i++) {
        native[i] = (uint64_t)(uintptr_t)buf[first + i];
        hash = mix64(hash ^ native[i]);
    }
    pyframe_t pyf[MAX_DEPTH];
    int gil;
    unsigned npy = py_collect(pyf, depth, may_take_gil, &gil);
    for (unsigned i = 0; i < npy; i++)
        hash = mix64(hash ^ pyf[i].hash ^ PY_TAG);
    /* A stack not in the cache may come from a module loaded since the last scan. The peek is
     * racy by design; the locked lookup below decides. */
    const cache_t *ce = &T.cache[hash & (STACK_CACHE - 1)];
    if (__atomic_load_n(&ce->hash, __ATOMIC_RELAXED) != hash || __atomic_load_n(&T.modules_stale, __ATOMIC_RELAXED))
        modules_refresh();
    lock();
    if (T.open && T.gen == gen) {
        tls.stack = stack_intern_locked(native, nnat, pyf, npy, hash);
        tls.stack_gen = gen;
        tls.has_stack = true;
    }
    unlock();
    py_release(pyf, npy, gil);
    busy_leave();
}

__attribute__((noinline)) void trace_capture_stack(int skip) { capture_stack(skip, NULL, false); }

__attribute__((noinline)) void trace_capture_stack_from(const void *caller_ip) { capture_stack(0, caller_ip, true); }

/* ----------------------------------------------------------------------------------- events */

/* Common path of the event hooks: the calling thread's id, the stream's, then the record. */
static void event_write(ev_t *e, cua_stream stream, bool force)
{
    if (tls.busy) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    bool had_stack = e->has_stack && tls.has_stack;
    if (e->has_stack)
        tls.has_stack = false; /* the captured stack belongs to this event, recorded or not */
    if (e->dev >= CUA_TRACE_MAX_DEVICES)
        return;
    busy_enter();
    lock();
    if (T.open && (force || T.dev_started[e->dev])) {
        e->thread = thread_id_locked();
        if (e->has_stream)
            e->stream = T.open ? stream_id_locked(stream) : 0;
        if (e->has_stack)
            e->stack = (had_stack && tls.stack_gen == T.gen) ? tls.stack : 0;
        if (T.open)
            ev_put(e);
    }
    unlock();
    busy_leave();
}

void trace_on_alloc(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested)
{
    ev_t e = {.type = CUA_TRACE_ALLOC, .has_stream = true, .has_addr = true, .has_slack = true, .has_stack = true,
              .dev = (uint32_t)dev, .addr = addr, .size = size, .requested = requested};
    event_write(&e, s, false);
}

void trace_on_free(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested)
{
    (void)requested;
    ev_t e = {.type = CUA_TRACE_FREE, .flags = CUA_TRACE_F_COMPLETED, .has_stream = true, .has_addr = true,
              .dev = (uint32_t)dev, .addr = addr, .size = size};
    event_write(&e, s, false);
}

void trace_on_free_requested(int dev, cua_stream s, uintptr_t addr, size_t size)
{
    ev_t e = {.type = CUA_TRACE_FREE, .has_stream = true, .has_addr = true, .dev = (uint32_t)dev, .addr = addr,
              .size = size};
    event_write(&e, s, false);
}

void trace_on_free_completed(int dev, cua_stream s, uintptr_t addr, size_t size)
{
    ev_t e = {.type = CUA_TRACE_FREE_DONE, .has_stream = true, .has_addr = true, .dev = (uint32_t)dev,
              .addr = addr, .size = size};
    event_write(&e, s, false);
}

void trace_on_map(int dev, uintptr_t addr, size_t size)
{
    ev_t e = {.type = CUA_TRACE_MAP, .has_addr = true, .dev = (uint32_t)dev, .addr = addr, .size = size};
    event_write(&e, NULL, false);
}

void trace_on_unmap(int dev, uintptr_t addr, size_t size)
{
    ev_t e = {.type = CUA_TRACE_UNMAP, .has_addr = true, .dev = (uint32_t)dev, .addr = addr, .size = size};
    event_write(&e, NULL, false);
}

void trace_on_trim(int dev)
{
    ev_t e = {.type = CUA_TRACE_TRIM, .dev = (uint32_t)dev};
    event_write(&e, NULL, false);
}

void trace_on_oom(int dev, cua_stream s, size_t requested, size_t rounded, size_t capacity, size_t allocated,
                  size_t reserved, size_t device_free, size_t largest_free, unsigned vmm_failure)
{
    uint8_t tail[88], *p = tail;
    p += put_varint(p, requested);
    p += put_varint(p, rounded);
    p += put_varint(p, capacity);
    p += put_varint(p, allocated);
    p += put_varint(p, reserved);
    p += put_varint(p, device_free);
    p += put_varint(p, largest_free);
    p += put_varint(p, vmm_failure);
    ev_t e = {.type = CUA_TRACE_OOM, .has_stream = true, .has_stack = true, .dev = (uint32_t)dev, .tail = tail,
              .tail_len = (size_t)(p - tail)};
    event_write(&e, s, false);
}

void trace_on_initial_block(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested)
{
    ev_t e = {.type = CUA_TRACE_INIT_BLOCK, .has_stream = true, .has_addr = true, .has_slack = true,
              .has_stack = true, .dev = (uint32_t)dev, .addr = addr, .size = size, .requested = requested};
    e.has_stack = true;
    tls.has_stack = false; /* a snapshot has no call sites */
    event_write(&e, s, true);
}

void trace_on_initial_map(int dev, uintptr_t addr, size_t size)
{
    ev_t e = {.type = CUA_TRACE_INIT_MAP, .has_addr = true, .dev = (uint32_t)dev, .addr = addr, .size = size};
    event_write(&e, NULL, true);
}

void trace_mark(const char *label)
{
    if (!label)
        label = "";
    uint8_t tail[STR_MAX + 8];
    size_t n = put_string(tail, label, STR_MAX);
    if (tls.busy) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    busy_enter();
    lock();
    if (T.open) {
        ev_t e = {.type = CUA_TRACE_MARK, .tail = tail, .tail_len = n};
        e.thread = thread_id_locked();
        e.dev = T.ev.dev; /* meaningless for a mark: keep the state's, so no byte is spent */
        if (T.open)
            ev_put(&e);
    }
    unlock();
    busy_leave();
}

void trace_on_device(int dev, const char *name, size_t total, size_t capacity, size_t granularity, bool vmm)
{
    if (dev < 0 || dev >= CUA_TRACE_MAX_DEVICES)
        return;
    lock();
    devinfo_t *d = &T.dev[dev];
    d->known = true;
    d->vmm = vmm;
    snprintf(d->name, sizeof d->name, "%s", name ? name : "");
    d->total = total;
    d->capacity = capacity;
    d->granularity = granularity;
    if (T.open) {
        device_put_locked(dev);
        T.dev_started[dev] = true; /* a new heap: nothing live to snapshot */
    }
    unlock();
}

void trace_device_begin(int dev)
{
    if (dev < 0 || dev >= CUA_TRACE_MAX_DEVICES)
        return;
    lock();
    if (T.open)
        T.dev_started[dev] = true;
    unlock();
}

bool trace_device_begun(int dev)
{
    if (dev < 0 || dev >= CUA_TRACE_MAX_DEVICES)
        return false;
    lock();
    bool b = T.open && T.dev_started[dev];
    unlock();
    return b;
}

/* ------------------------------------------------------------------------------- open, stop */

size_t trace_expand_path(const char *tmpl, char *out, size_t len, bool *has_pid)
{
    size_t n = 0;
    if (has_pid)
        *has_pid = false;
    char tmp[256];
    if (len == 0)
        return 0;
    for (const char *s = tmpl; *s; s++) {
        const char *piece = NULL;
        char one[2] = {*s, 0};
        if (*s == '%' && s[1]) {
            s++;
            switch (*s) {
            case 'p':
                if (has_pid)
                    *has_pid = true;
                snprintf(tmp, sizeof tmp, "%d", (int)getpid());
                piece = tmp;
                break;
            case 'r': {
                const char *r = getenv("RANK");
                if (!r || !*r)
                    r = getenv("LOCAL_RANK");
                snprintf(tmp, sizeof tmp, "%s", r && *r ? r : "0");
                for (char *c = tmp; *c; c++)
                    if (*c == '/')
                        *c = '_';
                piece = tmp;
                break;
            }
            case 'h':
                if (gethostname(tmp, sizeof tmp) != 0)
                    snprintf(tmp, sizeof tmp, "unknown");
                tmp[sizeof tmp - 1] = '\0';
                for (char *c = tmp; *c; c++)
                    if (*c == '/')
                        *c = '_';
                piece = tmp;
                break;
            case '%':
                piece = "%";
                break;
            default:
                one[0] = '%';
                piece = one;
                s--; /* the next character is literal */
                break;
            }
        } else {
            piece = one;
        }
        size_t k = strlen(piece);
        if (n + k >= len)
            return 0;
        memcpy(out + n, piece, k);
        n += k;
    }
    out[n] = '\0';
    return n;
}

/* Writes the file header at offset 0: 0, or the error (a short write that makes no progress is
 * the device's EFBIG or ENOSPC as the next write reports it; EINTR is retried). */
static int header_write(int fd, const uint8_t *hdr, size_t len)
{
    if (!fsize_allows(len))
        return EFBIG;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, hdr + done, len - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : ENOSPC;
        done += (size_t)n;
    }
    return 0;
}

/* Creates the file: 0600, never through a symlink, never over an existing file (PATH.1, PATH.2
 * ... instead, said in a message). Returns the descriptor or -1 (message printed). */
static int file_create(const char *path, char *chosen, size_t chosen_len)
{
    char name[PATH_MAX];
    for (int n = 0; n < 1000; n++) {
        if (n == 0)
            snprintf(name, sizeof name, "%s", path);
        else if ((size_t)snprintf(name, sizeof name, "%s.%d", path, n) >= sizeof name)
            break;
        int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (n > 0)
                cua_error("trace %s exists; writing the trace to %s instead", path, name);
            snprintf(chosen, chosen_len, "%s", name);
            return fd;
        }
        if (errno != EEXIST) {
            cua_error("cannot create trace file %s (%s); tracing is off", name, strerror(errno));
            return -1;
        }
        struct stat st;
        if (lstat(name, &st) != 0)
            continue; /* gone since: the next name */
        if (S_ISLNK(st.st_mode)) {
            cua_error("trace path %s is a symbolic link; refusing to write through it (tracing is off). "
                      "Remove it or choose another path.",
                      name);
            return -1;
        }
        /* A directory or a device named as the trace is a mistake for a file in or beside it, not
         * an existing trace to keep: PATH.1 beside it (/tmp.1, /dev/null.1) is not what was meant. */
        if (n == 0 && !S_ISREG(st.st_mode)) {
            cua_error("trace path %s is %s, not a file; tracing is off. Name a file%s", name,
                      S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket",
                      S_ISDIR(st.st_mode) ? " in it (e.g. trace:DIR/trace_%p.bin)" : "");
            return -1;
        }
    }
    cua_error("cannot create trace file %s: it and %s.1 ... %s.999 all exist; tracing is off", path, path, path);
    return -1;
}

static void process_put_locked(void)
{
    uint8_t *p = T.scratch;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char cmd[4096];
    size_t cl = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, cmd, sizeof cmd - 1);
        cl = k > 0 ? (size_t)k : 0;
        close(fd);
    }
    while (cl > 0 && cmd[cl - 1] == '\0')
        cl--;
    for (size_t i = 0; i < cl; i++)
        if (cmd[i] == '\0')
            cmd[i] = ' ';
    cmd[cl] = '\0';
    const char *rank = getenv("RANK");
    if (!rank || !*rank)
        rank = getenv("LOCAL_RANK");
    int64_t rk = rank && *rank ? strtoll(rank, NULL, 10) : -1;
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    p += put_varint(p, (uint64_t)getpid());
    p += put_varint(p, (uint64_t)getppid());
    p += put_varint(p, zigzag(rk));
    p += put_varint(p, (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec);
    p += put_varint(p, (uint64_t)mt.tv_sec * 1000000000ull + (uint64_t)mt.tv_nsec);
    *p++ = T.counter_clock ? CUA_TRACE_CLOCK_COUNTER : CUA_TRACE_CLOCK_MONOTONIC;
    p += put_string(p, host, 255);
    p += put_string(p, cmd, T.block_size / 4 < 4000 ? T.block_size / 4 : 4000);
    p += put_string(p, "cualloc " CUALLOC_VERSION_STRING, 64);
    meta_put(CUA_TRACE_PROCESS, T.scratch, (size_t)(p - T.scratch));
}

void trace_set_block_size(uint32_t bytes) { test_block_size = bytes; }
void trace_set_page_size(uint32_t bytes) { test_page_size = bytes; }

int trace_start(const char *tmpl, const conf_t *conf)
{
    if (!tmpl || !*tmpl) {
        cua_error("trace: no path given; tracing is off");
        return -1;
    }
    char path[PATH_MAX];
    bool has_pid;
    if (strlen(tmpl) >= sizeof T.tmpl || trace_expand_path(tmpl, path, sizeof path, &has_pid) == 0) {
        cua_error("trace: path '%.200s' is empty or too long once expanded; tracing is off", tmpl);
        return -1;
    }
    lock();
    if (T.open) {
        cua_error("trace: already recording to %s; stop it first (cualloc_trace_stop)", T.path);
        unlock();
        return -1;
    }
    unlock();
    char chosen[PATH_MAX];
    int fd = file_create(path, chosen, sizeof chosen);
    if (fd < 0)
        return -1;
    uint32_t bs = test_block_size ? test_block_size : CUA_TRACE_BLOCK_SIZE;
    /* Blocks are mapped one by one, so each starts on a page: the header is at least a page (a
     * kernel with 16 or 64 KiB pages, as on many aarch64 systems, refuses 4 KiB-aligned offsets). */
    long page = test_page_size ? (long)test_page_size : sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    uint32_t header_size = (uint32_t)(page > CUA_TRACE_HEADER_SIZE ? page : CUA_TRACE_HEADER_SIZE);
    if (header_size > CUA_TRACE_BLOCK_SIZE || bs % (uint32_t)page) {
        cua_error("trace %s: the page size of %ld bytes does not divide the trace's blocks of %u bytes; tracing is off",
                  chosen, page, bs);
        close(fd);
        unlink(chosen);
        return -1;
    }
    uint8_t hdr[CUA_TRACE_HEADER_SIZE];
    memset(hdr, 0, sizeof hdr);
    uint64_t max_blocks = 0;
    if (conf->trace_max) {
        max_blocks = conf->trace_max > header_size ? (conf->trace_max - header_size) / bs : 0;
        if (max_blocks < 4) {
            cua_error("trace: trace_max_mb leaves fewer than 4 blocks of %u bytes; using 4", bs);
            max_blocks = 4;
        }
    }
    memcpy(hdr, CUA_TRACE_MAGIC, CUA_TRACE_MAGIC_LEN);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_MAJOR, CUA_TRACE_MAJOR, 2);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_MINOR, CUA_TRACE_MINOR, 2);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_HEADER_SIZE, header_size, 4);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_BLOCK_SIZE, bs, 4);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_FLAGS, (conf->trace_ring && max_blocks) ? CUA_TRACE_FILE_RING : 0, 4);
    cua_trace_put_le(hdr + CUA_TRACE_OFF_MAX_BLOCKS, max_blocks, 8);
    int werr = header_write(fd, hdr, sizeof hdr);
    if (werr) {
        cua_error("trace %s: cannot write the header (%s); tracing is off", chosen, strerror(werr));
        close(fd);
        unlink(chosen);
        return -1;
    }
    char conf_text[sizeof T.conf_text];
    conf_format(conf, conf_text, sizeof conf_text);

    lock();
    if (T.open) { /* lost a race with another start */
        unlock();
        close(fd);
        unlink(chosen);
        return -1;
    }
    T.fd = fd;
    snprintf(T.path, sizeof T.path, "%s", chosen);
    snprintf(T.tmpl, sizeof T.tmpl, "%s", tmpl);
    T.tmpl_has_pid = has_pid;
    T.block_size = bs;
    T.header_size = header_size;
    T.max_blocks = max_blocks;
    T.ring = conf->trace_ring && max_blocks;
    T.nblocks = T.meta_blocks = 0;
    atomic_store_explicit(&dropped, 0, memory_order_relaxed); /* counted per file */
    T.meta_full = false;
    T.seq = 0;
    T.clock = 0;
    T.counter_clock = conf->driver == DRIVER_SIM;
    __atomic_store_n(&T.depth, conf->trace_stack_depth > MAX_DEPTH ? MAX_DEPTH : conf->trace_stack_depth,
                     __ATOMIC_RELAXED);
    T.gen++;
    atomic_store_explicit(&gen_pub, T.gen, memory_order_release);
    memset(&T.meta, 0, sizeof T.meta);
    memset(&T.ev, 0, sizeof T.ev);
    T.meta.kind = CUA_TRACE_BLOCK_META;
    T.ev.kind = CUA_TRACE_BLOCK_EVENTS;
    memset(T.dev_started, 0, sizeof T.dev_started);
    snprintf(T.conf_text, sizeof T.conf_text, "%s", conf_text);
    T.ring_start = T.ring_count = 0;
    bool ok = tables_reset() && (!T.ring || vec_fresh(&T.ring_list, max_blocks * sizeof(uint64_t)));
    if (!ok)
        cua_error("trace %s: host memory ran out for the recorder's tables; tracing is off. " CUA_HOST_MEMORY_FIX,
                  chosen);
    T.open = true;
    uint64_t t0 = T.counter_clock ? 0 : now_ns();
    if (ok)
        ok = block_next(&T.meta, t0) && block_next(&T.ev, t0);
    if (!ok) {
        /* block_next's failures have stopped tracing already (stop_locked, which closes the file
         * once) and said why; the tables' have not. The file holds no record worth keeping. */
        stop_locked(-1);
        unlock();
        unlink(chosen);
        return -1;
    }
    process_put_locked();
    uint8_t *p = T.scratch;
    p += put_string(p, T.conf_text, T.block_size / 2 < sizeof T.conf_text ? T.block_size / 2 : sizeof T.conf_text);
    meta_put(CUA_TRACE_CONFIG, T.scratch, (size_t)(p - T.scratch));
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        if (T.dev[d].known)
            device_put_locked(d);
    bool opened = T.open;
    if (opened)
        atomic_store_explicit(&trace_enabled_flag, true, memory_order_release);
    unlock();
    return opened ? 0 : -1;
}

/* Closes the file. reason >= 0: write an END with that reason first (no statistics). */
static void stop_locked(int reason)
{
    if (!T.open)
        return;
    if (reason >= 0 && T.ev.map) {
        uint8_t tail[32], *p = tail;
        p += put_varint(p, (uint64_t)reason);
        p += put_varint(p, atomic_load_explicit(&dropped, memory_order_relaxed));
        p += put_varint(p, 0);
        ev_t e = {.type = CUA_TRACE_END, .dev = T.ev.dev, .thread = T.ev.thread, .tail = tail,
                  .tail_len = (size_t)(p - tail)};
        uint64_t now = now_ns();
        size_t plen = ev_encode(&T.ev, &e, now, T.scratch);
        if (T.ev.pos + record_size(&T.ev, plen) <= T.block_size)
            record_put(&T.ev, CUA_TRACE_END, T.scratch, plen);
    }
    atomic_store_explicit(&trace_enabled_flag, false, memory_order_release);
    T.open = false;
    cur_unmap(&T.meta);
    cur_unmap(&T.ev);
    close(T.fd);
    T.fd = -1;
}

bool trace_active(void)
{
    if (tls.busy)
        return false; /* a signal handler inside the recorder (exit() from one): the lock is this thread's */
    lock();
    bool open = T.open;
    unlock();
    return open;
}

size_t trace_path(char *out, size_t len)
{
    if (tls.busy)
        return (size_t)snprintf(out, len, "%s", ""); /* as trace_active */
    lock();
    size_t n = (size_t)snprintf(out, len, "%s", T.open ? T.path : "");
    unlock();
    return n;
}

void trace_stop(const cualloc_stats *const *per_dev, int ndev)
{
    if (tls.busy)
        return;
    busy_enter();
    lock();
    if (T.open) {
        uint8_t *tail = T.scratch + sizeof T.scratch / 2, *p = tail;
        size_t room = sizeof T.scratch / 2 - 64;
        int n = 0;
        for (int d = 0; d < ndev && d < CUA_TRACE_MAX_DEVICES; d++)
            n += per_dev && per_dev[d] != NULL;
        p += put_varint(p, CUA_TRACE_END_STOP);
        p += put_varint(p, atomic_load_explicit(&dropped, memory_order_relaxed));
        uint8_t *count_at = p;
        p += put_varint(p, (uint64_t)n);
        int written = 0;
        for (int d = 0; d < ndev && d < CUA_TRACE_MAX_DEVICES; d++) {
            const cualloc_stats *s = per_dev ? per_dev[d] : NULL;
            if (!s)
                continue;
            if ((size_t)(p - tail) + 24 * 10 > room || (size_t)(p - tail) + 24 * 10 > T.block_size / 2)
                break;
            const uint64_t v[CUA_TRACE_STAT_COUNT] = {
                s->requested_bytes, s->requested_peak, s->allocated_bytes, s->allocated_peak,
                s->active_bytes, s->active_peak, s->reserved_bytes, s->reserved_peak,
                s->inactive_split_bytes, s->inactive_split_peak, s->largest_free_block, s->capacity_bytes,
                s->num_allocs, s->num_frees, s->num_maps, s->num_unmaps, s->num_alloc_retries, s->num_ooms,
                s->num_syncs, s->num_trims,
            };
            p += put_varint(p, (uint64_t)d);
            p += put_varint(p, CUA_TRACE_STAT_COUNT);
            for (int i = 0; i < CUA_TRACE_STAT_COUNT; i++)
                p += put_varint(p, v[i]);
            written++;
        }
        if (written != n) {
            /* Cut short (a tiny block size): rewrite with the count actually written. The count is
             * one byte for up to 127 devices, which is all a cut can leave. */
            *count_at = (uint8_t)written;
        }
        ev_t e = {.type = CUA_TRACE_END, .dev = T.ev.dev, .thread = thread_id_locked(), .tail = tail,
                  .tail_len = (size_t)(p - tail)};
        if (!T.open || !ev_put(&e)) {
            if (T.open)
                stop_locked(CUA_TRACE_END_STOP);
        }
        if (T.open)
            stop_locked(-1);
    }
    unlock();
    busy_leave();
}

/* A fork copies the recorder's tables as they are: one that another thread was moving to a larger
 * mapping leaves the child a pointer to memory already returned, which its next trace_start would
 * clear. So a fork waits for the module scan and the recorder's lock (in their order), and the
 * child starts from tables no thread was changing. */
static __thread bool fork_locked; /* trace_fork_prepare took both locks (the forking thread's) */

void trace_fork_prepare(void)
{
    /* A thread inside the recorder that forks (a signal handler that interrupted it: a crash
     * reporter starting a debugger) holds, or may hold, the locks itself: waiting would never
     * end, so that fork copies the tables as they are. */
    fork_locked = !tls.busy;
    if (!fork_locked)
        return;
    pthread_mutex_lock(&mod_lock);
    lock();
}

void trace_fork_parent(void)
{
    if (!fork_locked)
        return;
    fork_locked = false;
    unlock();
    pthread_mutex_unlock(&mod_lock);
}

bool trace_after_fork_child(char *tmpl_out, size_t len)
{
    /* The child inherits both locks and the parent's mappings. Locks trace_fork_prepare took in
     * this thread are released as the parent releases them; otherwise (a fork from inside the
     * recorder) they are in any state and are made anew. The mappings are forgotten; the parent's
     * file stays the parent's. */
    if (fork_locked) {
        trace_fork_parent();
    } else {
        atomic_flag_clear(&rec_lock);
        pthread_mutex_init(&mod_lock, NULL);
    }
    tls.busy = 0;
    /* A fork while another thread was resolving CPython's API: that thread is gone. */
    int resolving = PY_RESOLVING;
    atomic_compare_exchange_strong(&py.state, &resolving, PY_UNRESOLVED);
    bool was_open = T.open;
    /* The child's heaps are made anew and describe their devices again. */
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        T.dev[d].known = false;
    if (T.meta.map)
        munmap(T.meta.map, T.block_size);
    if (T.ev.map)
        munmap(T.ev.map, T.block_size);
    T.meta.map = T.ev.map = NULL;
    if (was_open)
        close(T.fd);
    T.open = false;
    atomic_store_explicit(&trace_enabled_flag, false, memory_order_release);
    if (!was_open || !T.tmpl_has_pid || strlen(T.tmpl) >= len)
        return false;
    memcpy(tmpl_out, T.tmpl, strlen(T.tmpl) + 1);
    return true;
}

uint64_t trace_test_records(void)
{
    lock();
    uint64_t s = T.seq;
    unlock();
    return s;
}

void trace_test_table_refused(unsigned table)
{
    lock();
    if (T.open)
        table_refused_locked("table under test", (enum cua_trace_lost_table)table);
    unlock();
}

bool trace_test_raw(bool event_block, uint8_t type, const void *payload, size_t len)
{
    lock();
    bool ok = false;
    tcur_t *c = event_block ? &T.ev : &T.meta;
    if (T.open && c->map && len < T.block_size / 2) {
        if (c->pos + record_size(c, len) + END_RESERVE > T.block_size && !block_next(c, c->time))
            goto out;
        record_put(c, type, payload, len); /* an unknown type: the delta state is untouched */
        ok = true;
    }
out:
    unlock();
    return ok;
}
