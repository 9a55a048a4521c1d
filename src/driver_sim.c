/* driver_sim.c — the sim device: a host-simulated CUDA device behind driver_sim_ops, plus the
 * control API tests use (internal.h, section "driver_sim.c"). It owns the bookkeeping of address
 * space, physical handles, mappings, classic allocations, streams and events, and, when host-backed,
 * the host memory that stands in for device memory. It owns no allocation policy (heap.c) and no
 * configuration parsing (conf.c).
 *
 * The sim enforces the real driver's rules strictly and answers a violation with the CUDA error:
 * it exists to catch allocator bugs. One mutex guards all state; bookkeeping uses malloc (the sim
 * is not on the allocator's hot path). Addresses come from a bump pointer starting at sim_va_base,
 * so the same sequence of calls always yields the same addresses.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

/* ------------------------------------------------------------------ host memory */

/* The sim's bookkeeping allocations. A refusal fails the sim call as the device running out would
 * (CUA_ERROR_OUT_OF_MEMORY), which a program on the sim cannot tell apart; so each is counted,
 * for the one that must (allocview replay, whose figures would otherwise count it as an OOM). */
static _Atomic uint64_t host_refusals;

static void *refusal_counted(void *p) {
    if (!p) atomic_fetch_add_explicit(&host_refusals, 1, memory_order_relaxed);
    return p;
}
static void *sim_malloc(size_t n) { return refusal_counted(malloc(n)); }
static void *sim_calloc(size_t n, size_t size) { return refusal_counted(calloc(n, size)); }
static void *sim_realloc(void *p, size_t n) { return refusal_counted(realloc(p, n)); }

uint64_t sim_host_refusals(void) { return atomic_load_explicit(&host_refusals, memory_order_relaxed); }

/* ------------------------------------------------------------------ object tables */

/* Handles, events and streams are named by opaque 64-bit values: a kind tag (bits 48..55), the
 * slot's generation (bits 24..47) and the slot + 1 (bits 0..23). A stale or forged value never
 * matches (kind or generation differ), so a bad handle is an error, never a crash. Free slots are
 * reused lowest-first from a stack, which keeps the values deterministic. */
#define OBJ_SLOT_BITS 24
#define OBJ_SLOT_MAX (((size_t)1 << OBJ_SLOT_BITS) - 1)
#define OBJ_GEN_MASK ((1u << 24) - 1)
enum { KIND_HANDLE = 0x51, KIND_EVENT = 0x5e, KIND_STREAM = 0x55 };

typedef struct objtab_s {
    uint64_t kind;
    void **obj;           /* slot -> object; NULL when free */
    uint32_t *gen;        /* slot -> generation of the value naming it */
    uint32_t *free_slots; /* stack of free slots, lowest on top */
    size_t nfree, cap;
} objtab_t;

static bool objtab_grow(objtab_t *t) {
    size_t ncap = t->cap ? t->cap * 2 : 64;
    if (ncap > OBJ_SLOT_MAX) ncap = OBJ_SLOT_MAX;
    if (ncap <= t->cap) return false;
    void **o = sim_realloc(t->obj, ncap * sizeof *o);
    if (!o) return false;
    t->obj = o;
    uint32_t *g = sim_realloc(t->gen, ncap * sizeof *g);
    if (!g) return false;
    t->gen = g;
    uint32_t *f = sim_realloc(t->free_slots, ncap * sizeof *f);
    if (!f) return false;
    t->free_slots = f;
    /* Push new slots highest first so the lowest is popped first. */
    for (size_t i = ncap; i-- > t->cap;) {
        o[i] = NULL;
        g[i] = 1;
        f[t->nfree++] = (uint32_t)i;
    }
    t->cap = ncap;
    return true;
}

/* The value naming the object in slot now. */
static uint64_t objtab_value(const objtab_t *t, size_t slot) {
    return (t->kind << 48) | ((uint64_t)t->gen[slot] << OBJ_SLOT_BITS) | ((uint64_t)slot + 1);
}

/* The value naming obj from now on, or 0 when the table cannot grow. */
static uint64_t objtab_add(objtab_t *t, void *obj) {
    if (t->nfree == 0 && !objtab_grow(t)) return 0;
    uint32_t slot = t->free_slots[--t->nfree];
    t->obj[slot] = obj;
    return objtab_value(t, slot);
}

static void *objtab_get(const objtab_t *t, uint64_t value) {
    if ((value >> 48) != t->kind) return NULL;
    uint64_t low = value & OBJ_SLOT_MAX;
    if (low == 0 || low > t->cap) return NULL;
    size_t slot = (size_t)low - 1;
    if (t->gen[slot] != ((value >> OBJ_SLOT_BITS) & OBJ_GEN_MASK)) return NULL;
    return t->obj[slot];
}

/* value must name a live object (objtab_get returned it). */
static void objtab_remove(objtab_t *t, uint64_t value) {
    size_t slot = (size_t)(value & OBJ_SLOT_MAX) - 1;
    t->obj[slot] = NULL;
    t->gen[slot] = (t->gen[slot] + 1) & OBJ_GEN_MASK;
    if (t->gen[slot] == 0) t->gen[slot] = 1;
    t->free_slots[t->nfree++] = (uint32_t)slot;
}

/* Frees every object with free() and the table itself. */
static void objtab_clear(objtab_t *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->obj[i]);
    free(t->obj);
    free(t->gen);
    free(t->free_slots);
    uint64_t kind = t->kind;
    memset(t, 0, sizeof *t);
    t->kind = kind;
}

/* ------------------------------------------------------------------ sorted range lists */

typedef struct sim_handle_s sim_handle_t;

/* A reservation, a mapping or a classic allocation: [va, va + size). */
typedef struct sim_range_s {
    cua_devptr va;
    size_t size;
    sim_handle_t *handle; /* mappings: the handle mapped here */
    bool access;          /* mappings: set_access granted read-write */
    uint64_t access_mask; /* mappings: the devices granted (bit d), at the last set_access */
} sim_range_t;

/* Ranges sorted by va, pairwise disjoint, in a gap buffer: the k-th range (k counted in va order)
 * is v[k] for k < gap and v[k + cap - n] after it; the cap - n unused slots lie between. An insert
 * or removal moves the gap to its place first, so that a run of them at consecutive places (the
 * heap maps and unmaps chunk after chunk) moves nothing more, where a plain sorted array moved
 * every later range each time. A pointer from ranges_at and the finders below is valid until the
 * next insert or removal. */
typedef struct range_list_s {
    sim_range_t *v;
    size_t n, cap, gap;
} range_list_t;

static inline sim_range_t *ranges_at(const range_list_t *l, size_t k) {
    return &l->v[k < l->gap ? k : k + (l->cap - l->n)];
}

/* Number of ranges starting at or below addr; only the one before that index can contain addr. */
static size_t ranges_upper(const range_list_t *l, cua_devptr addr) {
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges_at(l, mid)->va <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static sim_range_t *ranges_containing(const range_list_t *l, cua_devptr addr) {
    size_t i = ranges_upper(l, addr);
    if (i == 0) return NULL;
    sim_range_t *r = ranges_at(l, i - 1);
    return addr - r->va < r->size ? r : NULL;
}

static sim_range_t *ranges_starting_at(const range_list_t *l, cua_devptr addr) {
    size_t i = ranges_upper(l, addr);
    return i > 0 && ranges_at(l, i - 1)->va == addr ? ranges_at(l, i - 1) : NULL;
}

/* Does any range intersect [va, va + size)? (size > 0, no overflow) */
static bool ranges_overlap(const range_list_t *l, cua_devptr va, size_t size) {
    size_t i = ranges_upper(l, va);
    if (i > 0 && ranges_at(l, i - 1)->va + ranges_at(l, i - 1)->size > va) return true;
    return i < l->n && ranges_at(l, i)->va < va + size;
}

/* Moves the gap to place k (0..n). */
static void ranges_gap_to(range_list_t *l, size_t k) {
    size_t gap_len = l->cap - l->n;
    if (k < l->gap) memmove(&l->v[k + gap_len], &l->v[k], (l->gap - k) * sizeof *l->v);
    else if (k > l->gap) memmove(&l->v[l->gap], &l->v[l->gap + gap_len], (k - l->gap) * sizeof *l->v);
    l->gap = k;
}

/* Makes room for one more range, so the insert that follows cannot fail. */
static bool ranges_reserve(range_list_t *l) {
    if (l->n < l->cap) return true;
    size_t ncap = l->cap ? l->cap * 2 : 16;
    sim_range_t *v = sim_realloc(l->v, ncap * sizeof *v);
    if (!v) return false;
    /* The ranges after the gap move to the end of the larger array (the gap was empty: n == cap). */
    size_t tail = l->n - l->gap;
    memmove(&v[ncap - tail], &v[l->gap], tail * sizeof *v);
    l->v = v;
    l->cap = ncap;
    return true;
}

/* ranges_reserve must have succeeded; r must not overlap any range. */
static void ranges_insert(range_list_t *l, const sim_range_t *r) {
    ranges_gap_to(l, ranges_upper(l, r->va));
    l->v[l->gap++] = *r;
    l->n++;
}

/* r: from ranges_at or a finder. */
static void ranges_remove(range_list_t *l, sim_range_t *r) {
    size_t phys = (size_t)(r - l->v);
    ranges_gap_to(l, phys < l->gap ? phys : phys - (l->cap - l->n));
    l->n--; /* the range just after the gap now lies inside it */
}

static void ranges_free(range_list_t *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------ state */

/* A physical handle. It lives until released by the caller *and* unmapped everywhere (CUDA
 * defers the release of a mapped handle); its bytes count as used until then. */
struct sim_handle_s {
    int dev;
    size_t size;
    unsigned map_count;
    bool released;
    uint64_t value;      /* its name in the handle table */
    uint32_t *granules;  /* host-backed: the memfd granule behind each granularity-sized piece */
};

typedef struct sim_stream_s {
    int dev;
    bool held;           /* work completes only through sim_stream_complete or a synchronize */
    bool capturing;      /* sim_stream_set_capturing: a CUDA graph capture is active */
    bool blocking;       /* sim_stream_set_blocking: synchronizes with the legacy stream */
    uint64_t submitted;  /* events recorded on it so far */
    uint64_t completed;  /* of those, the ones that completed */
} sim_stream_t;

/* An event on the legacy stream waits, as CUDA's does, for the work before it on every blocking
 * stream of its device: on each held blocking stream, up to this many. */
#define SIM_EVENT_WAITS 8

typedef struct sim_event_s {
    int dev;
    unsigned nwait;      /* held streams it waits for, from its last record; 0 = none */
    uint64_t stream[SIM_EVENT_WAITS]; /* each one's value */
    uint64_t target[SIM_EVENT_WAITS]; /* complete when that stream's `completed` reaches this */
} sim_event_t;

typedef struct sim_device_s {
    uint64_t peers;       /* devices set_access grants besides this one (peer_enable); bit d */
    size_t used;          /* bytes of live handles (until released and unmapped) + mem_alloc */
    size_t live_handles;  /* handles not yet released by the caller */
    range_list_t resv;    /* reservations */
    range_list_t maps;    /* mappings, all inside reservations */
    range_list_t allocs;  /* mem_alloc ranges; size rounded up to granularity */
    /* host-backed: physical memory is the memfd; bit i of `bitmap` set = granule i in use */
    int memfd;
    uint64_t *bitmap;
    size_t ngranules;
} sim_device_t;

typedef struct sim_failure_s {
    unsigned skip;        /* calls still to let through before failing */
    unsigned remaining;   /* calls still to fail */
    cua_result err;
} sim_failure_t;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;

/* Everything below is guarded by sim_lock. */
static struct {
    bool configured;
    cua_result config_error;  /* nonzero: the configuration is unusable and init fails */
    int ndev;
    size_t capacity;
    size_t granularity;
    bool host_backed;
    bool vmm;
    unsigned latency_us;
    cua_devptr va_next;       /* bump pointer for reservations and mem_alloc ranges */
    sim_device_t *devs;
    objtab_t handles, events, streams;
    uint64_t calls[SIM_OP_COUNT];
    sim_failure_t fail[SIM_OP_COUNT];
    uint64_t captures_broken; /* see sim_captures_broken */
} sim = {
    .handles = {.kind = KIND_HANDLE},
    .events = {.kind = KIND_EVENT},
    .streams = {.kind = KIND_STREAM},
};

static cua_result fail_default_error(sim_op_t op) {
    switch (op) {
    case SIM_OP_VA_RESERVE:
    case SIM_OP_PHYS_CREATE:
    case SIM_OP_MEM_ALLOC:
    case SIM_OP_EVENT_CREATE:
        return CUA_ERROR_OUT_OF_MEMORY;
    default:
        return CUA_ERROR_UNKNOWN;
    }
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* ------------------------------------------------------------------ host backing */

/* Maps `size` bytes with `prot` at the next bump address (aligned to `align`) when that place is
 * free, otherwise wherever the kernel puts it (aligned by over-reserving and trimming). The bump
 * address is passed as a hint, not MAP_FIXED_NOREPLACE: sanitizers drop hints outside their
 * application ranges, and a fixed-noreplace mapping at address 0 would then succeed (as root). */
static bool host_reserve(size_t size, size_t align, int prot, cua_devptr *out) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    cua_devptr want = align_up(sim.va_next, align);
    if (want >= sim.va_next && want + size > want) {
        void *p = mmap((void *)(uintptr_t)want, size, prot, flags, -1, 0);
        if (p == (void *)(uintptr_t)want) {
            sim.va_next = want + size;
            *out = want;
            return true;
        }
        if (p != MAP_FAILED && (uintptr_t)p % align == 0) {
            *out = (uintptr_t)p; /* the place was taken; aligned anyway */
            return true;
        }
        if (p != MAP_FAILED) munmap(p, size);
    }
    size_t span = size + align;
    if (span < size) return false;
    void *p = mmap(NULL, span, prot, flags, -1, 0);
    if (p == MAP_FAILED) return false;
    uintptr_t start = (uintptr_t)p, a = align_up(start, align);
    if (a > start) munmap(p, a - start);
    if (start + span > a + size) munmap((void *)(a + size), start + span - (a + size));
    *out = a;
    return true;
}

/* Puts inaccessible anonymous memory back over [va, va + size) (still reserved). */
static bool host_unmap(cua_devptr va, size_t size) {
    void *p = mmap((void *)(uintptr_t)va, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p != MAP_FAILED;
}

/* Length of the run of consecutive granules starting at index i of h's list. */
static size_t granule_run(const sim_handle_t *h, size_t i, size_t n) {
    size_t j = i + 1;
    while (j < n && h->granules[j] == h->granules[j - 1] + 1) j++;
    return j - i;
}

/* Maps h's granules at va (inaccessible until set_access). All or nothing. */
static bool host_map(sim_device_t *d, cua_devptr va, const sim_handle_t *h) {
    size_t g = sim.granularity, n = h->size / g;
    for (size_t i = 0; i < n;) {
        size_t run = granule_run(h, i, n);
        void *want = (void *)(uintptr_t)(va + i * g);
        void *p = mmap(want, run * g, PROT_NONE, MAP_SHARED | MAP_FIXED, d->memfd,
                       (off_t)h->granules[i] * (off_t)g);
        if (p != want) {
            host_unmap(va, h->size);
            return false;
        }
        i += run;
    }
    return true;
}

/* Takes n free granules, lowest first, into out[]. */
static bool granules_take(sim_device_t *d, size_t n, uint32_t *out) {
    size_t got = 0, nwords = (d->ngranules + 63) / 64;
    for (size_t w = 0; w < nwords && got < n; w++) {
        uint64_t free_bits = ~d->bitmap[w];
        if (w == nwords - 1 && d->ngranules % 64) free_bits &= ((uint64_t)1 << (d->ngranules % 64)) - 1;
        while (free_bits && got < n) {
            out[got++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(free_bits));
            free_bits &= free_bits - 1;
        }
    }
    if (got < n) return false;
    for (size_t i = 0; i < n; i++) d->bitmap[out[i] / 64] |= (uint64_t)1 << (out[i] % 64);
    return true;
}

/* Returns h's granules and their host memory (holes punched in the memfd). */
static void granules_give_back(sim_device_t *d, const sim_handle_t *h) {
    size_t g = sim.granularity, n = h->size / g;
    for (size_t i = 0; i < n;) {
        size_t run = granule_run(h, i, n);
        (void)fallocate(d->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)h->granules[i] * (off_t)g, (off_t)(run * g));
        i += run;
    }
    for (size_t i = 0; i < n; i++) d->bitmap[h->granules[i] / 64] &= ~((uint64_t)1 << (h->granules[i] % 64));
}

/* ------------------------------------------------------------------ configuration */

/* Host-backed: gives back the host mappings of device d's reservations and mem_alloc ranges
 * (unmapping a reservation also drops the memfd mappings inside it). */
static void host_device_unmap(sim_device_t *d) {
    for (size_t k = 0; k < d->resv.n; k++)
        munmap((void *)(uintptr_t)ranges_at(&d->resv, k)->va, ranges_at(&d->resv, k)->size);
    for (size_t k = 0; k < d->allocs.n; k++)
        munmap((void *)(uintptr_t)ranges_at(&d->allocs, k)->va, ranges_at(&d->allocs, k)->size);
}

/* Drops every device, handle, mapping, stream and event. */
static void sim_teardown(void) {
    for (int i = 0; i < sim.ndev; i++) {
        sim_device_t *d = &sim.devs[i];
        if (sim.host_backed) host_device_unmap(d);
        if (d->memfd >= 0) close(d->memfd);
        free(d->bitmap);
        ranges_free(&d->resv);
        ranges_free(&d->maps);
        ranges_free(&d->allocs);
    }
    free(sim.devs);
    sim.devs = NULL;
    sim.ndev = 0;
    for (size_t i = 0; i < sim.handles.cap; i++) {
        sim_handle_t *h = sim.handles.obj[i];
        if (h) free(h->granules);
    }
    objtab_clear(&sim.handles);
    objtab_clear(&sim.events);
    objtab_clear(&sim.streams);
}

/* Opens device d's memfd and granule bitmap. */
static bool host_device_open(sim_device_t *d, int index) {
    char name[32];
    snprintf(name, sizeof name, "cualloc-sim-dev%d", index);
    d->ngranules = sim.capacity / sim.granularity;
    d->memfd = memfd_create(name, MFD_CLOEXEC);
    if (d->memfd < 0) {
        cua_error("sim: memfd_create failed (%s); host-backed sim device %d unavailable", strerror(errno), index);
        return false;
    }
    if (ftruncate(d->memfd, (off_t)(d->ngranules * sim.granularity)) != 0) {
        cua_error("sim: cannot size device %d's memory file to %zu bytes (%s)", index,
                  d->ngranules * sim.granularity, strerror(errno));
        return false;
    }
    d->bitmap = sim_calloc((d->ngranules + 63) / 64 + 1, sizeof *d->bitmap);
    return d->bitmap != NULL;
}

static void sim_configure_locked(const conf_t *c) {
    sim_teardown();
    memset(sim.calls, 0, sizeof sim.calls);
    memset(sim.fail, 0, sizeof sim.fail);
    sim.configured = true;
    sim.config_error = 0;
    sim.capacity = c->sim_memory;
    sim.granularity = c->sim_granularity;
    sim.host_backed = c->sim_host_backed;
    sim.vmm = c->sim_vmm;
    sim.latency_us = c->sim_latency_us;
    sim.va_next = c->sim_va_base;

    if ((int)c->sim_fail_op >= 0 && c->sim_fail_op < SIM_OP_COUNT && c->sim_fail_count > 0) {
        sim.fail[c->sim_fail_op] = (sim_failure_t){c->sim_fail_after, c->sim_fail_count,
                                                    c->sim_fail_error ? (cua_result)c->sim_fail_error
                                                                      : fail_default_error(c->sim_fail_op)};
    }

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (sim.granularity == 0 || (sim.granularity & (sim.granularity - 1)) != 0) {
        cua_error("sim: sim_granularity %zu is not a power of two", sim.granularity);
        sim.config_error = CUA_ERROR_INVALID_VALUE;
        return;
    }
    if (sim.host_backed && sim.granularity < page) {
        cua_error("sim: sim_granularity %zu is below the host page size %zu, which host backing needs",
                  sim.granularity, page);
        sim.config_error = CUA_ERROR_INVALID_VALUE;
        return;
    }
    if (sim.host_backed && sim.capacity / sim.granularity > UINT32_MAX) {
        cua_error("sim: %zu granules per device are too many for host backing", sim.capacity / sim.granularity);
        sim.config_error = CUA_ERROR_INVALID_VALUE;
        return;
    }
    int ndev = c->sim_devices;
    if (ndev > CUALLOC_MAX_DEVICES) {
        cua_error("sim: sim_devices %d is above the limit %d; using %d", ndev, CUALLOC_MAX_DEVICES,
                  CUALLOC_MAX_DEVICES);
        ndev = CUALLOC_MAX_DEVICES;
    }
    if (ndev <= 0) return; /* init reports CUA_ERROR_NO_DEVICE */
    sim.devs = sim_calloc((size_t)ndev, sizeof *sim.devs);
    if (!sim.devs) {
        sim.config_error = CUA_ERROR_OUT_OF_MEMORY;
        return;
    }
    for (int i = 0; i < ndev; i++) sim.devs[i].memfd = -1;
    sim.ndev = ndev;
    if (sim.host_backed) {
        for (int i = 0; i < ndev; i++) {
            if (!host_device_open(&sim.devs[i], i)) {
                sim_teardown();
                sim.config_error = CUA_ERROR_OUT_OF_MEMORY;
                return;
            }
        }
    }
}

void sim_configure(const conf_t *c) {
    pthread_mutex_lock(&sim_lock);
    sim_configure_locked(c);
    pthread_mutex_unlock(&sim_lock);
}

void sim_fork_prepare(void) { pthread_mutex_lock(&sim_lock); }

void sim_fork_release(void) { pthread_mutex_unlock(&sim_lock); }

/* Configures from the defaults unless sim_configure came first. Lock held. */
static void sim_ensure_configured(void) {
    if (sim.configured) return;
    conf_t c;
    conf_defaults(&c);
    sim_configure_locked(&c);
}

/* ------------------------------------------------------------------ op plumbing */

/* Takes the lock, counts the call and applies an injected failure: returns that failure (lock
 * still held) or 0. */
static cua_result sim_begin(sim_op_t op) {
    pthread_mutex_lock(&sim_lock);
    sim.calls[op]++;
    sim_failure_t *f = &sim.fail[op];
    if (f->remaining > 0) {
        if (f->skip > 0) {
            f->skip--;
        } else {
            f->remaining--;
            return f->err;
        }
    }
    return 0;
}

/* Drops the lock, then waits the injected latency for ops that model slow driver calls. */
static cua_result sim_end(cua_result r, bool slow) {
    unsigned us = sim.latency_us;
    pthread_mutex_unlock(&sim_lock);
    if (slow && us > 0) {
        struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return r;
}

/* The device `dev`, checking that the sim is configured and (vmm) that it supports VMM. */
static cua_result dev_get(int dev, bool vmm, sim_device_t **out) {
    if (!sim.configured || sim.config_error) return CUA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= sim.ndev) return CUA_ERROR_INVALID_DEVICE;
    if (vmm && !sim.vmm) return CUA_ERROR_NOT_SUPPORTED;
    *out = &sim.devs[dev];
    return 0;
}

/* A nonzero, granularity-aligned range that does not wrap around. */
static bool range_aligned(cua_devptr va, size_t size) {
    size_t g = sim.granularity;
    return size > 0 && va % g == 0 && size % g == 0 && va + size > va;
}

static sim_handle_t *handle_get(cua_memhandle value) { return objtab_get(&sim.handles, value); }

/* Frees a handle that is released and no longer mapped. */
static void handle_destroy(sim_device_t *d, sim_handle_t *h) {
    if (sim.host_backed) granules_give_back(d, h);
    d->used -= h->size;
    objtab_remove(&sim.handles, h->value);
    free(h->granules);
    free(h);
}

/* ------------------------------------------------------------------ ops, under the lock */

static cua_result va_reserve_locked(int dev, size_t size, size_t align, cua_devptr *out) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    if (!out || size == 0 || size % sim.granularity != 0) return CUA_ERROR_INVALID_VALUE;
    if (align & (align - 1)) return CUA_ERROR_INVALID_VALUE;
    if (align < sim.granularity) align = sim.granularity;
    if (!ranges_reserve(&d->resv)) return CUA_ERROR_OUT_OF_MEMORY;
    cua_devptr va;
    if (sim.host_backed) {
        if (!host_reserve(size, align, PROT_NONE, &va)) return CUA_ERROR_OUT_OF_MEMORY;
    } else {
        va = align_up(sim.va_next, align);
        if (va < sim.va_next || va + size <= va) return CUA_ERROR_OUT_OF_MEMORY;
        sim.va_next = va + size;
    }
    ranges_insert(&d->resv, &(sim_range_t){.va = va, .size = size});
    *out = va;
    return 0;
}

static cua_result va_free_locked(int dev, cua_devptr va, size_t size) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    sim_range_t *res = ranges_starting_at(&d->resv, va);
    if (!res || res->size != size) return CUA_ERROR_INVALID_VALUE;
    if (ranges_overlap(&d->maps, va, size)) return CUA_ERROR_INVALID_VALUE; /* still mapped inside */
    if (sim.host_backed && munmap((void *)(uintptr_t)va, size) != 0) return CUA_ERROR_UNKNOWN;
    ranges_remove(&d->resv, res);
    return 0;
}

static cua_result phys_create_locked(int dev, size_t size, cua_memhandle *out) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    if (!out || size == 0 || size % sim.granularity != 0) return CUA_ERROR_INVALID_VALUE;
    if (size > sim.capacity - d->used) return CUA_ERROR_OUT_OF_MEMORY;
    sim_handle_t *h = sim_calloc(1, sizeof *h);
    if (!h) return CUA_ERROR_OUT_OF_MEMORY;
    h->dev = dev;
    h->size = size;
    if (sim.host_backed) {
        size_t n = size / sim.granularity;
        h->granules = sim_malloc(n * sizeof *h->granules);
        if (!h->granules || !granules_take(d, n, h->granules)) {
            free(h->granules);
            free(h);
            return CUA_ERROR_OUT_OF_MEMORY;
        }
    }
    h->value = objtab_add(&sim.handles, h);
    if (h->value == 0) {
        if (sim.host_backed) granules_give_back(d, h);
        free(h->granules);
        free(h);
        return CUA_ERROR_OUT_OF_MEMORY;
    }
    d->used += size;
    d->live_handles++;
    *out = h->value;
    return 0;
}

static cua_result phys_release_locked(int dev, cua_memhandle handle) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    sim_handle_t *h = handle_get(handle);
    if (!h || h->released || h->dev != dev) return CUA_ERROR_INVALID_VALUE;
    /* As CUDA: a handle still mapped is released, but its memory stays until the last unmap. */
    h->released = true;
    d->live_handles--;
    if (h->map_count == 0) handle_destroy(d, h);
    return 0;
}

static cua_result map_locked(int dev, cua_devptr va, size_t size, cua_memhandle handle) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    if (!range_aligned(va, size)) return CUA_ERROR_INVALID_VALUE;
    sim_handle_t *h = handle_get(handle);
    if (!h || h->released || h->dev != dev) return CUA_ERROR_INVALID_VALUE;
    if (size != h->size) return CUA_ERROR_INVALID_VALUE; /* the whole handle, offset 0 */
    sim_range_t *res = ranges_containing(&d->resv, va);
    if (!res || va + size > res->va + res->size) return CUA_ERROR_INVALID_VALUE;
    if (ranges_overlap(&d->maps, va, size)) return CUA_ERROR_ALREADY_MAPPED;
    if (!ranges_reserve(&d->maps)) return CUA_ERROR_OUT_OF_MEMORY;
    if (sim.host_backed && !host_map(d, va, h)) return CUA_ERROR_OUT_OF_MEMORY;
    ranges_insert(&d->maps, &(sim_range_t){.va = va, .size = size, .handle = h});
    h->map_count++;
    return 0;
}

static cua_result unmap_locked(int dev, cua_devptr va, size_t size) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    if (!range_aligned(va, size)) return CUA_ERROR_INVALID_VALUE;
    /* Exactly one mapping, whole: part of one, or a range spanning two, is an error. */
    sim_range_t *m = ranges_starting_at(&d->maps, va);
    if (!m || m->size != size) return CUA_ERROR_INVALID_VALUE;
    if (sim.host_backed && !host_unmap(va, size)) return CUA_ERROR_UNKNOWN;
    sim_handle_t *h = m->handle;
    ranges_remove(&d->maps, m);
    h->map_count--;
    if (h->released && h->map_count == 0) handle_destroy(d, h);
    return 0;
}

static cua_result set_access_locked(int dev, cua_devptr va, size_t size) {
    sim_device_t *d;
    cua_result r = dev_get(dev, true, &d);
    if (r) return r;
    if (!range_aligned(va, size)) return CUA_ERROR_INVALID_VALUE;
    sim_range_t *res = ranges_containing(&d->resv, va);
    if (!res || va + size > res->va + res->size) return CUA_ERROR_INVALID_VALUE;
    /* The range must be tiled exactly by whole, adjacent mappings. */
    size_t i = ranges_upper(&d->maps, va);
    if (i == 0 || ranges_at(&d->maps, i - 1)->va != va) return CUA_ERROR_INVALID_VALUE;
    size_t first = i - 1, k = first;
    cua_devptr cur = va, end = va + size;
    while (cur < end) {
        if (k >= d->maps.n || ranges_at(&d->maps, k)->va != cur) return CUA_ERROR_INVALID_VALUE;
        cur += ranges_at(&d->maps, k)->size;
        k++;
    }
    if (cur != end) return CUA_ERROR_INVALID_VALUE;
    if (sim.host_backed && mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE) != 0)
        return CUA_ERROR_UNKNOWN;
    uint64_t mask = d->peers | (dev < 64 ? (uint64_t)1 << dev : 0);
    for (size_t j = first; j < k; j++) {
        ranges_at(&d->maps, j)->access = true;
        ranges_at(&d->maps, j)->access_mask = mask;
    }
    return 0;
}

static cua_result mem_alloc_locked(int dev, size_t size, cua_devptr *out) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    if (!out || size == 0) return CUA_ERROR_INVALID_VALUE;
    size_t rounded = align_up(size, sim.granularity);
    if (rounded < size || rounded > sim.capacity - d->used) return CUA_ERROR_OUT_OF_MEMORY;
    if (!ranges_reserve(&d->allocs)) return CUA_ERROR_OUT_OF_MEMORY;
    cua_devptr va;
    if (sim.host_backed) {
        if (!host_reserve(rounded, sim.granularity, PROT_READ | PROT_WRITE, &va)) return CUA_ERROR_OUT_OF_MEMORY;
    } else {
        va = align_up(sim.va_next, sim.granularity);
        if (va < sim.va_next || va + rounded <= va) return CUA_ERROR_OUT_OF_MEMORY;
        sim.va_next = va + rounded;
    }
    ranges_insert(&d->allocs, &(sim_range_t){.va = va, .size = rounded});
    d->used += rounded;
    *out = va;
    return 0;
}

static cua_result mem_free_locked(int dev, cua_devptr ptr) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    sim_range_t *a = ranges_starting_at(&d->allocs, ptr);
    if (!a) return CUA_ERROR_INVALID_VALUE; /* exactly a pointer mem_alloc returned */
    if (sim.host_backed && munmap((void *)(uintptr_t)ptr, a->size) != 0) return CUA_ERROR_UNKNOWN;
    d->used -= a->size;
    ranges_remove(&d->allocs, a);
    return 0;
}

static sim_event_t *event_get(int dev, cua_event e) {
    sim_event_t *ev = objtab_get(&sim.events, (uint64_t)(uintptr_t)e);
    return ev && ev->dev == dev ? ev : NULL;
}

static sim_stream_t *stream_get(cua_stream s) { return objtab_get(&sim.streams, (uint64_t)(uintptr_t)s); }

static cua_result event_create_locked(int dev, cua_event *out) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    if (!out) return CUA_ERROR_INVALID_VALUE;
    sim_event_t *ev = sim_calloc(1, sizeof *ev);
    if (!ev) return CUA_ERROR_OUT_OF_MEMORY;
    ev->dev = dev;
    uint64_t value = objtab_add(&sim.events, ev);
    if (value == 0) {
        free(ev);
        return CUA_ERROR_OUT_OF_MEMORY;
    }
    *out = (cua_event)(uintptr_t)value;
    return 0;
}

/* What CUDA does to a capture that an operation may not join (global capture mode): the capture is
 * invalidated and the operation fails. The sim counts it (sim_captures_broken), so that tests can
 * assert the heap never does it. */
static cua_result capture_broken_locked(sim_stream_t *st) {
    st->capturing = false;
    sim.captures_broken++;
    return CUA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

/* NULL or CU_STREAM_LEGACY. */
static bool is_legacy(cua_stream s) { return !s || (uintptr_t)s == 1; }

/* Does the legacy stream of dev wait for b's work? Only held streams have work in flight. */
static bool legacy_waits_for(const sim_stream_t *b, int dev) { return b && b->dev == dev && b->held && b->blocking; }

/* As CUDA: work on dev's legacy stream waits for the work of dev's blocking streams, so while one
 * of them captures, the legacy stream's work would join that capture: its capture query answers
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and an event recorded on it or its synchronize is refused
 * with that error and invalidates the capture. Does a blocking stream of dev capture? With
 * `invalidate`, each such capture is invalidated (counted in sim_captures_broken). */
static inline bool legacy_joins_capture_locked(int dev, bool invalidate) {
    bool joins = false;
    for (size_t i = 0; i < sim.streams.cap; i++) {
        sim_stream_t *b = sim.streams.obj[i];
        if (!b || b->dev != dev || !b->blocking || !b->capturing) continue;
        if (invalidate) (void)capture_broken_locked(b);
        joins = true;
    }
    return joins;
}

static cua_result event_record_locked(int dev, cua_event e, cua_stream s) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    sim_stream_t *cs = stream_get(s);
    if (cs && cs->capturing) return capture_broken_locked(cs); /* it would be a graph node, not an event */
    sim_event_t *ev = event_get(dev, e);
    if (!ev) return CUA_ERROR_INVALID_VALUE;
    sim_stream_t *st = stream_get(s);
    if (st && st->dev != dev) return CUA_ERROR_INVALID_VALUE;
    bool legacy = is_legacy(s);
    if (legacy && legacy_joins_capture_locked(dev, true)) return CUA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (legacy) {
        /* More held blocking streams than an event can wait for is refused before anything
         * changes (a simulator's bound). */
        unsigned n = 0;
        for (size_t i = 0; i < sim.streams.cap; i++) n += legacy_waits_for(sim.streams.obj[i], dev);
        if (n > SIM_EVENT_WAITS) return CUA_ERROR_INVALID_VALUE;
    }
    ev->nwait = 0; /* unknown and non-held streams complete everything at once */
    if (st && st->held) {
        ev->stream[0] = (uint64_t)(uintptr_t)s;
        ev->target[0] = ++st->submitted;
        ev->nwait = 1;
    } else if (legacy) {
        /* The legacy stream: after the work submitted so far on each held blocking stream. */
        for (size_t i = 0; i < sim.streams.cap; i++) {
            sim_stream_t *b = sim.streams.obj[i];
            if (!legacy_waits_for(b, dev)) continue;
            ev->stream[ev->nwait] = objtab_value(&sim.streams, i);
            ev->target[ev->nwait++] = ++b->submitted;
        }
    }
    return 0;
}

/* Wait k of event e: the held stream (*st, NULL when recorded on none, or on one since destroyed,
 * which finished its work) and its count of work to complete (*target); false past the last. */
static bool event_wait_locked(const sim_event_t *ev, unsigned k, sim_stream_t **st, uint64_t *target) {
    if (k >= ev->nwait) return false;
    *st = objtab_get(&sim.streams, ev->stream[k]);
    *target = ev->target[k];
    return true;
}

static cua_result event_lookup_locked(int dev, cua_event e, sim_event_t **ev) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    *ev = event_get(dev, e);
    return *ev ? 0 : CUA_ERROR_INVALID_VALUE;
}

static cua_result event_query_locked(int dev, cua_event e) {
    sim_event_t *ev;
    cua_result r = event_lookup_locked(dev, e, &ev);
    sim_stream_t *st;
    uint64_t target;
    for (unsigned k = 0; !r && event_wait_locked(ev, k, &st, &target); k++)
        if (st && st->completed < target) return CUA_ERROR_NOT_READY;
    return r;
}

/* The event's held streams complete their work up to the event (later work stays pending). */
static cua_result event_sync_locked(int dev, cua_event e) {
    sim_event_t *ev;
    cua_result r = event_lookup_locked(dev, e, &ev);
    sim_stream_t *st;
    uint64_t target;
    for (unsigned k = 0; !r && event_wait_locked(ev, k, &st, &target); k++)
        if (st && st->completed < target) st->completed = target;
    return r;
}

static cua_result stream_sync_locked(int dev, cua_stream s) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    sim_stream_t *st = stream_get(s);
    if (st && st->dev != dev) return CUA_ERROR_INVALID_VALUE;
    if (st && st->capturing) return capture_broken_locked(st);
    if (is_legacy(s) && legacy_joins_capture_locked(dev, true)) return CUA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (st) st->completed = st->submitted;
    if (is_legacy(s)) /* its work waited for every blocking stream's */
        for (size_t i = 0; i < sim.streams.cap; i++) {
            sim_stream_t *b = sim.streams.obj[i];
            if (legacy_waits_for(b, dev)) b->completed = b->submitted;
        }
    return 0;
}

static cua_result device_sync_locked(int dev) {
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r) return r;
    for (size_t i = 0; i < sim.streams.cap; i++) { /* a device synchronize may join no capture */
        sim_stream_t *st = sim.streams.obj[i];
        if (st && st->dev == dev && st->capturing) r = capture_broken_locked(st);
    }
    if (r) return r;
    for (size_t i = 0; i < sim.streams.cap; i++) {
        sim_stream_t *st = sim.streams.obj[i];
        if (st && st->dev == dev) st->completed = st->submitted;
    }
    return 0;
}

static cua_result simop_stream_is_capturing(int dev, cua_stream s, bool *capturing) {
    if (!capturing) return CUA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    sim_stream_t *st = r ? NULL : stream_get(s);
    *capturing = st && st->capturing; /* the legacy and unknown streams never capture */
    if (!r && is_legacy(s) && legacy_joins_capture_locked(dev, false)) r = CUA_ERROR_STREAM_CAPTURE_IMPLICIT;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* Sim devices can always access each other. */
static cua_result simop_peer_enable(int dev, int peer) {
    pthread_mutex_lock(&sim_lock);
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (!r && (peer < 0 || peer >= sim.ndev || peer == dev || peer >= 64)) r = CUA_ERROR_INVALID_DEVICE;
    if (!r) d->peers |= (uint64_t)1 << peer;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* ------------------------------------------------------------------ the ops table */

static cua_result simop_init(void) {
    pthread_mutex_lock(&sim_lock);
    sim_ensure_configured();
    cua_result r = sim.config_error ? sim.config_error : sim.ndev == 0 ? CUA_ERROR_NO_DEVICE : 0;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static cua_result simop_device_count(int *count) {
    if (!count) return CUA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    cua_result r = sim.configured && !sim.config_error ? 0 : CUA_ERROR_NOT_INITIALIZED;
    if (r == 0) *count = sim.ndev;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static cua_result simop_device_info(int dev, driver_device_info_t *out) {
    pthread_mutex_lock(&sim_lock);
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r == 0 && !out) r = CUA_ERROR_INVALID_VALUE;
    if (r == 0) {
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "cualloc sim device");
        out->total_bytes = sim.capacity;
        out->granularity = sim.granularity;
        out->vmm_supported = sim.vmm;
        out->rdma_capable = false;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static cua_result simop_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
    pthread_mutex_lock(&sim_lock);
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    if (r == 0 && (!free_bytes || !total_bytes)) r = CUA_ERROR_INVALID_VALUE;
    if (r == 0) {
        *free_bytes = sim.capacity - d->used;
        *total_bytes = sim.capacity;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static cua_result simop_va_reserve(int dev, size_t size, size_t align, cua_devptr *out) {
    cua_result r = sim_begin(SIM_OP_VA_RESERVE);
    if (r == 0) r = va_reserve_locked(dev, size, align, out);
    return sim_end(r, false);
}

static cua_result simop_va_free(int dev, cua_devptr va, size_t size) {
    cua_result r = sim_begin(SIM_OP_VA_FREE);
    if (r == 0) r = va_free_locked(dev, va, size);
    return sim_end(r, false);
}

static cua_result simop_phys_create(int dev, size_t size, cua_memhandle *out) {
    cua_result r = sim_begin(SIM_OP_PHYS_CREATE);
    if (r == 0) r = phys_create_locked(dev, size, out);
    return sim_end(r, true);
}

static cua_result simop_phys_release(int dev, cua_memhandle handle) {
    cua_result r = sim_begin(SIM_OP_PHYS_RELEASE);
    if (r == 0) r = phys_release_locked(dev, handle);
    return sim_end(r, true);
}

static cua_result simop_map(int dev, cua_devptr va, size_t size, cua_memhandle handle) {
    cua_result r = sim_begin(SIM_OP_MAP);
    if (r == 0) r = map_locked(dev, va, size, handle);
    return sim_end(r, true);
}

static cua_result simop_unmap(int dev, cua_devptr va, size_t size) {
    cua_result r = sim_begin(SIM_OP_UNMAP);
    if (r == 0) r = unmap_locked(dev, va, size);
    return sim_end(r, true);
}

static cua_result simop_set_access(int dev, cua_devptr va, size_t size) {
    cua_result r = sim_begin(SIM_OP_SET_ACCESS);
    if (r == 0) r = set_access_locked(dev, va, size);
    return sim_end(r, true);
}

static cua_result simop_mem_alloc(int dev, size_t size, cua_devptr *out) {
    cua_result r = sim_begin(SIM_OP_MEM_ALLOC);
    if (r == 0) r = mem_alloc_locked(dev, size, out);
    return sim_end(r, true);
}

static cua_result simop_mem_free(int dev, cua_devptr ptr) {
    cua_result r = sim_begin(SIM_OP_MEM_FREE);
    if (r == 0) r = mem_free_locked(dev, ptr);
    return sim_end(r, true);
}

static cua_result simop_event_create(int dev, cua_event *out) {
    cua_result r = sim_begin(SIM_OP_EVENT_CREATE);
    if (r == 0) r = event_create_locked(dev, out);
    return sim_end(r, false);
}

static cua_result simop_event_destroy(int dev, cua_event e) {
    pthread_mutex_lock(&sim_lock);
    sim_device_t *d;
    cua_result r = dev_get(dev, false, &d);
    sim_event_t *ev = r == 0 ? event_get(dev, e) : NULL;
    if (r == 0 && !ev) r = CUA_ERROR_INVALID_VALUE;
    if (r == 0) {
        objtab_remove(&sim.events, (uint64_t)(uintptr_t)e);
        free(ev);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static cua_result simop_event_record(int dev, cua_event e, cua_stream s) {
    cua_result r = sim_begin(SIM_OP_EVENT_RECORD);
    if (r == 0) r = event_record_locked(dev, e, s);
    return sim_end(r, false);
}

static cua_result simop_event_query(int dev, cua_event e) {
    cua_result r = sim_begin(SIM_OP_EVENT_QUERY);
    if (r == 0) r = event_query_locked(dev, e);
    return sim_end(r, false);
}

static cua_result simop_event_synchronize(int dev, cua_event e) {
    cua_result r = sim_begin(SIM_OP_EVENT_SYNC);
    if (r == 0) r = event_sync_locked(dev, e);
    return sim_end(r, false);
}

static cua_result simop_stream_synchronize(int dev, cua_stream s) {
    cua_result r = sim_begin(SIM_OP_STREAM_SYNC);
    if (r == 0) r = stream_sync_locked(dev, s);
    return sim_end(r, false);
}

static cua_result simop_device_synchronize(int dev) {
    cua_result r = sim_begin(SIM_OP_DEVICE_SYNC);
    if (r == 0) r = device_sync_locked(dev);
    return sim_end(r, false);
}

/* The sim's "current context": one device per thread, chosen by sim_set_current_device. */
static __thread int sim_current_dev;

void sim_set_current_device(int dev) { sim_current_dev = dev; }

static cua_result simop_stream_device(cua_stream s, int *dev) {
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    int d = sim_stream_device(s);
    if (d < 0) return CUA_ERROR_INVALID_HANDLE;
    *dev = d;
    return CUA_SUCCESS;
}

static cua_result simop_current_device(int *dev) {
    if (!dev) return CUA_ERROR_INVALID_VALUE;
    *dev = sim_current_dev;
    return CUA_SUCCESS;
}

/* Every sim thread has a device current (sim_current_dev), as if its context were. */
static cua_result simop_context_current(void) { return CUA_SUCCESS; }

const driver_ops_t driver_sim_ops = {
    .name = "sim",
    .init = simop_init,
    .device_count = simop_device_count,
    .device_info = simop_device_info,
    .mem_get_info = simop_mem_get_info,
    .va_reserve = simop_va_reserve,
    .va_free = simop_va_free,
    .phys_create = simop_phys_create,
    .phys_release = simop_phys_release,
    .map = simop_map,
    .unmap = simop_unmap,
    .set_access = simop_set_access,
    .mem_alloc = simop_mem_alloc,
    .mem_free = simop_mem_free,
    .event_create = simop_event_create,
    .event_destroy = simop_event_destroy,
    .event_record = simop_event_record,
    .event_query = simop_event_query,
    .event_synchronize = simop_event_synchronize,
    .stream_synchronize = simop_stream_synchronize,
    .device_synchronize = simop_device_synchronize,
    .current_device = simop_current_device,
    .context_current = simop_context_current,
    .stream_device = simop_stream_device,
    .stream_is_capturing = simop_stream_is_capturing,
    .peer_enable = simop_peer_enable,
};

/* ------------------------------------------------------------------ control API */

cua_stream sim_stream_create(int dev, bool held) {
    pthread_mutex_lock(&sim_lock);
    sim_ensure_configured();
    uint64_t value = 0;
    if (dev >= 0 && dev < sim.ndev) {
        sim_stream_t *st = sim_calloc(1, sizeof *st);
        if (st) {
            st->dev = dev;
            st->held = held;
            value = objtab_add(&sim.streams, st);
            if (value == 0) free(st);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    if (value == 0) cua_error("sim: cannot create a stream on device %d", dev);
    return (cua_stream)(uintptr_t)value;
}

void sim_stream_complete(cua_stream s) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    if (st) st->completed = st->submitted;
    pthread_mutex_unlock(&sim_lock);
}

bool sim_stream_idle(cua_stream s) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    bool idle = !st || st->completed == st->submitted;
    pthread_mutex_unlock(&sim_lock);
    return idle;
}

void sim_stream_set_capturing(cua_stream s, bool capturing) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    if (st) st->capturing = capturing;
    pthread_mutex_unlock(&sim_lock);
}

void sim_stream_set_blocking(cua_stream s, bool blocking) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    if (st) st->blocking = blocking;
    pthread_mutex_unlock(&sim_lock);
}

uint64_t sim_break_all_captures(void) {
    pthread_mutex_lock(&sim_lock);
    uint64_t n = 0;
    for (size_t i = 0; i < sim.streams.cap; i++) {
        sim_stream_t *st = sim.streams.obj[i];
        if (st && st->capturing) {
            (void)capture_broken_locked(st);
            n++;
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return n;
}

uint64_t sim_captures_broken(void) {
    pthread_mutex_lock(&sim_lock);
    uint64_t n = sim.captures_broken;
    pthread_mutex_unlock(&sim_lock);
    return n;
}

uint64_t sim_peer_mask(int dev) {
    pthread_mutex_lock(&sim_lock);
    uint64_t m = dev >= 0 && dev < sim.ndev ? sim.devs[dev].peers : 0;
    pthread_mutex_unlock(&sim_lock);
    return m;
}

void sim_stream_destroy(cua_stream s) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    if (st) { /* its events read as complete from now on: the stream finished its work */
        objtab_remove(&sim.streams, (uint64_t)(uintptr_t)s);
        free(st);
    }
    pthread_mutex_unlock(&sim_lock);
}

/* As CUDA's primary-context reset destroys them: every mapping, physical handle, reservation,
 * mem_alloc range, event and stream of dev, whoever still holds their names (which then name
 * nothing). */
void sim_device_reset(int dev) {
    pthread_mutex_lock(&sim_lock);
    if (dev < 0 || dev >= sim.ndev) {
        pthread_mutex_unlock(&sim_lock);
        return;
    }
    sim_device_t *d = &sim.devs[dev];
    if (sim.host_backed) host_device_unmap(d);
    for (size_t k = 0; k < d->allocs.n; k++) d->used -= ranges_at(&d->allocs, k)->size;
    ranges_free(&d->maps);
    ranges_free(&d->resv);
    ranges_free(&d->allocs);
    for (size_t i = 0; i < sim.handles.cap; i++) {
        sim_handle_t *h = sim.handles.obj[i];
        if (!h || h->dev != dev) continue;
        if (!h->released) d->live_handles--;
        handle_destroy(d, h);
    }
    for (size_t i = 0; i < sim.events.cap; i++) {
        sim_event_t *ev = sim.events.obj[i];
        if (!ev || ev->dev != dev) continue;
        objtab_remove(&sim.events, i + 1); /* (reads the slot only) */
        free(ev);
    }
    for (size_t i = 0; i < sim.streams.cap; i++) {
        sim_stream_t *st = sim.streams.obj[i];
        if (!st || st->dev != dev) continue;
        objtab_remove(&sim.streams, i + 1);
        free(st);
    }
    pthread_mutex_unlock(&sim_lock);
}

/* err 0 picks the op's usual failure: CUA_ERROR_OUT_OF_MEMORY for create/alloc ops, else
 * CUA_ERROR_UNKNOWN (as sim_fail_op in the configuration). count 0 cancels. */
void sim_fail(sim_op_t op, unsigned after, unsigned count, cua_result err) {
    if ((int)op < 0 || op >= SIM_OP_COUNT) return;
    pthread_mutex_lock(&sim_lock);
    sim_ensure_configured();
    sim.fail[op] = (sim_failure_t){after, count, err ? err : fail_default_error(op)};
    pthread_mutex_unlock(&sim_lock);
}

uint64_t sim_calls(sim_op_t op) {
    if ((int)op < 0 || op >= SIM_OP_COUNT) return 0;
    pthread_mutex_lock(&sim_lock);
    uint64_t n = sim.calls[op];
    pthread_mutex_unlock(&sim_lock);
    return n;
}

size_t sim_used_bytes(int dev) {
    pthread_mutex_lock(&sim_lock);
    size_t n = dev >= 0 && dev < sim.ndev ? sim.devs[dev].used : 0;
    pthread_mutex_unlock(&sim_lock);
    return n;
}

size_t sim_live_handles(int dev) {
    pthread_mutex_lock(&sim_lock);
    size_t n = dev >= 0 && dev < sim.ndev ? sim.devs[dev].live_handles : 0;
    pthread_mutex_unlock(&sim_lock);
    return n;
}

size_t sim_live_mappings(int dev) {
    pthread_mutex_lock(&sim_lock);
    size_t n = dev >= 0 && dev < sim.ndev ? sim.devs[dev].maps.n : 0;
    pthread_mutex_unlock(&sim_lock);
    return n;
}

int sim_handle_device(cua_memhandle handle) {
    pthread_mutex_lock(&sim_lock);
    sim_handle_t *h = handle_get(handle);
    int dev = h && !h->released ? h->dev : -1;
    pthread_mutex_unlock(&sim_lock);
    return dev;
}

int sim_event_device(cua_event e) {
    pthread_mutex_lock(&sim_lock);
    sim_event_t *ev = objtab_get(&sim.events, (uint64_t)(uintptr_t)e);
    int dev = ev ? ev->dev : -1;
    pthread_mutex_unlock(&sim_lock);
    return dev;
}

int sim_stream_device(cua_stream s) {
    pthread_mutex_lock(&sim_lock);
    sim_stream_t *st = stream_get(s);
    int dev = st ? st->dev : -1;
    pthread_mutex_unlock(&sim_lock);
    return dev;
}

int sim_address_device(cua_devptr va) {
    int dev = -1;
    pthread_mutex_lock(&sim_lock);
    for (int i = 0; i < sim.ndev && dev < 0; i++) {
        if (ranges_containing(&sim.devs[i].resv, va) || ranges_containing(&sim.devs[i].allocs, va)) dev = i;
    }
    pthread_mutex_unlock(&sim_lock);
    return dev;
}

bool sim_address_range(cua_devptr va, cua_devptr *base, size_t *size) {
    const sim_range_t *r = NULL;
    pthread_mutex_lock(&sim_lock);
    for (int i = 0; i < sim.ndev && !r; i++) {
        r = ranges_containing(&sim.devs[i].allocs, va);
        if (!r) r = ranges_containing(&sim.devs[i].maps, va);
    }
    if (r) {
        *base = r->va;
        *size = r->size;
    }
    pthread_mutex_unlock(&sim_lock);
    return r != NULL;
}

/* Lock held: [va, va + size) inside one mem_alloc range, or tiled by adjacent mappings with
 * access granted. */
static bool range_accessible_locked(const sim_device_t *d, cua_devptr va, size_t size) {
    const sim_range_t *a = ranges_containing(&d->allocs, va);
    if (a) return size <= a->size - (va - a->va);
    size_t i = ranges_upper(&d->maps, va);
    if (i == 0) return false;
    cua_devptr cur = va, end = va + size;
    for (size_t k = i - 1; cur < end; k++) {
        if (k >= d->maps.n) return false;
        const sim_range_t *m = ranges_at(&d->maps, k);
        if (!m->access || cur < m->va || cur >= m->va + m->size) return false;
        cur = m->va + m->size;
    }
    return true;
}

bool sim_range_accessible(cua_devptr va, size_t size) {
    bool ok = false;
    pthread_mutex_lock(&sim_lock);
    if (sim.host_backed && size > 0 && va + size > va) {
        for (int i = 0; i < sim.ndev && !ok; i++) ok = range_accessible_locked(&sim.devs[i], va, size);
    }
    pthread_mutex_unlock(&sim_lock);
    return ok;
}

bool sim_range_accessible_from(int dev, cua_devptr va, size_t size) {
    bool ok = false;
    pthread_mutex_lock(&sim_lock);
    if (size > 0 && va + size > va && dev >= 0 && dev < 64) {
        for (int i = 0; i < sim.ndev && !ok; i++) {
            const sim_device_t *d = &sim.devs[i];
            if (ranges_containing(&d->allocs, va)) {
                ok = range_accessible_locked(d, va, size) && (i == dev || ((d->peers >> dev) & 1));
                continue;
            }
            size_t k = ranges_upper(&d->maps, va);
            if (k == 0) continue;
            cua_devptr cur = va, end = va + size;
            bool all = true;
            for (k = k - 1; cur < end; k++) {
                const sim_range_t *m = k < d->maps.n ? ranges_at(&d->maps, k) : NULL;
                if (!m || !m->access || cur < m->va || cur >= m->va + m->size || !((m->access_mask >> dev) & 1)) {
                    all = false;
                    break;
                }
                cur = m->va + m->size;
            }
            ok = all;
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return ok;
}
