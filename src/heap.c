/* heap.c — one device's caching allocator: blocks, their splitting and coalescing, the free
 * indexes per pool and stream tag, the stream-reuse rule, the growth and release of physical
 * memory in both modes, and exact accounting. It owns the heap lock. It does not own how sizes are
 * binned (sizeclass.c, tree.c), where block records come from (slab.c), or the device (driver.h).
 *
 * Two modes, chosen per device at creation:
 *   VMM (expandable, the default): each pool is one large VA reservation that blocks tile. Chunks
 *     of physical memory are mapped on demand under FREE/ALLOCATED blocks and unmapped from the
 *     chunk-aligned interior of FREE blocks under pressure; address-space fragmentation therefore
 *     costs no physical memory.
 *   classic: PyTorch's native policy — cuMemAlloc'd segments (2 MiB for small requests, 20 MiB
 *     for requests under 10 MiB, else the request rounded to 2 MiB), exact best fit on
 *     (stream, size, address), its splitting rules, max_split_size_mb, garbage collection and its
 *     release-and-retry order — so a replay in this mode predicts PyTorch's reserved memory.
 *
 * Stream rule (DESIGN.md decision 5): a block freed on stream S is tagged S and reusable at once by
 * S. Another stream may take it once an event recorded on S after the free has completed; then the
 * block is "settled" to TAG_ANY. Events are recorded lazily, only when another stream is short of
 * memory, never once per free. Before physical memory is unmapped or released, the streams whose
 * freed blocks lie on it are synchronized. Classic mode keeps PyTorch's rule: blocks never move
 * between streams. A device-wide free (cudaFree) while non-blocking streams exist gets the open
 * device-wide tag: nobody may reuse it until events on the legacy stream and on every non-blocking
 * stream, recorded after the free, have completed, or one device synchronization, which an
 * allocation makes rather than map new memory while such blocks could serve it.
 * Device-wide generations: the two tags TAG_DW_A and TAG_DW_B take turns. Frees go to the open
 * one (h->dw_open). Recording the group's events closes it (they cover exactly its blocks) and
 * opens the other, which is empty then; when they complete, the closed tag settles. With one tag,
 * a program that frees all the time (cudaFree of every tensor) always had frees newer than the
 * last events, so its blocks never settled and the heap mapped new memory instead. A pool's
 * waiting device-wide bytes are bounded (dw_bound_pending): past 1/DW_PENDING_DIV of its mapped
 * bytes, the host waits for the closed generation's events, not for the whole device.
 * Stream generations (VMM), the same for one stream: recording S's event closes S's tag. The tag
 * keeps its blocks, which the event covers exactly, and S's later frees go to a fresh tag, S's open
 * generation. S reuses its closed blocks at once, like its open ones; once the event has completed,
 * the closed tag settles and its slot is free again. With one tag per stream, frees after the event
 * kept every block of the tag waiting, so a stream that freed all the time never let another
 * stream reuse its memory short of a synchronize under memory pressure.
 *
 * Invariants (heap_check), per pool:
 *   blocks tile every segment in address order; no two adjacent FREE blocks have compatible tags
 *   (equal, or one of them ANY); no two adjacent UNMAPPED blocks;
 *   the FREE and CACHED blocks' bytes == mapped - allocated, and summed over pools, mapped ==
 *   stats.reserved_bytes;
 *   VMM: a chunk is mapped iff an ALLOCATED or FREE block touches it; UNMAPPED blocks are
 *   chunk-aligned;
 *   every FREE block is in exactly the index of its (pool, tag); every CACHED block on exactly the
 *   quick list of its (size, tag), never with a device-wide or a closed tag; every ALLOCATED and
 *   every CACHED block is found by its address (live_get: VMM, its pool's by_granule slot; classic,
 *   the `classic_live` map), and nothing else is (a parked block keeps its entry, so that taking it
 *   again and freeing it again cost a load, not an insertion and a removal). Every block record
 *   the slab hands out is a block of a segment (slab_check: and the slab itself is sound).
 *   Accounting: stats.inactive_split_bytes is kept equal to the free bytes that are not releasable
 *   (FREE and CACHED blocks, both pools) at every step; its peak is taken where an operation ends.
 *   stats.active_* equal allocated_* at all times (no block is allocated yet inactive) and are
 *   filled in when the stats are read.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "lock.h"

/* PyTorch's native allocator constants (CUDACachingAllocator.cpp), for classic mode. */
#define PT_SMALL_BUFFER ((size_t)2 << 20)   /* small requests share 2 MiB segments */
#define PT_LARGE_BUFFER ((size_t)20 << 20)  /* requests under 10 MiB share 20 MiB segments */
#define PT_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define PT_ROUND_LARGE ((size_t)2 << 20)

#define HEAP_PENDING_RELEASES 64
#define HEAP_MAX_REQUEST ((size_t)1 << 48) /* larger requests fail (and sizes fit quick_key) */
#define DW_CHECK_EVERY 4 /* device-wide frees between looks at the group's events */
/* A pool's device-wide frees that may wait for the device: at most 1/DW_PENDING_DIV of its mapped
 * bytes (dw_bound_pending). */
#define DW_PENDING_DIV 16
#define HEAP_OOM_KINDS 16
/* The pseudo-stream of device-wide frees: never a real stream's tag (tag_of stops before it). */
#define DW_HANDLE ((cua_stream)(uintptr_t)UINTPTR_MAX)
/* No stream: what the fast paths compare with while they may serve none. Not a CUDA stream handle
 * (those are 0, the small constants cudaStreamLegacy and cudaStreamPerThread, and pointers). */
#define NO_STREAM ((cua_stream)(uintptr_t)(UINTPTR_MAX - 1))

/* A free index: TLSF in VMM mode, a (size, addr) treap in classic mode. */
typedef union findex_u {
    sizeclass_t sc;
    tree_t tree;
} findex_t;

/* A tag's record. Stream tags (1 .. TAG_STREAMS_END - 1) are each a generation of one stream
 * (`handle`): its open one, where its frees go and which tag_of finds, or its closed one, whose
 * blocks the event recorded when it closed covers. Invariants (heap_check): a stream has at most one
 * open tag and at most one closed tag, each naming the other in `partner`; a closed tag has its event
 * in flight (seen complete, it settles and its slot is freed at once) and no parked block; classic
 * mode closes none. */
typedef struct stream_rec_s {
    cua_stream handle;
    bool closed;                /* a stream's closed generation */
    bool event_in_flight;       /* a closed generation: always; the device-wide record
                                 * (tags[TAG_DW_A]): the group's events not yet seen complete */
    uint16_t partner;           /* a stream's other generation (0: it has none) */
    cua_event event;            /* created on first need; stays with the slot */
} stream_rec_t;

/* Quick lists (VMM mode, small pool): freed blocks parked unmerged by exact (size, tag), so the
 * sizes a training step allocates again and again skip search, split and merge. Large-pool blocks
 * are never parked. A parked block hides itself and its free neighbours' merged extent from the
 * search, whose choices then carve larger free ranges: replaying the GPT-2-small variable-length
 * snapshot step after step, large-pool quick lists let reserved memory climb pass by pass to 54.1
 * GiB for a 23.6 GiB peak (25.3 GiB without them), whereas the small pool's pieces are at most
 * 1 MiB and its growth stayed the same with or without lists. A bucket belongs to one
 * (size, tag) while it holds blocks; a free whose bucket is taken by another key, or full, takes
 * the ordinary path. Parked blocks are merged back (flushed) before a search that misses them can
 * grow the heap, before their tag is settled or their memory released, so they never cost
 * physical memory; a search that misses in the small pool merges back only as many lists as it
 * needs, so that the other sizes stay parked. An idle stream's lists can instead be handed over
 * whole to a stream that missed (quick_hand_over_idle), retagged rather than merged. 1024 buckets
 * keep collisions between recurring sizes rare; a bitmap of the non-empty ones keeps flushes from
 * visiting the rest. It is cleared lazily, by the flushes that find a bit stale, so that taking a
 * list's last block does not touch it. A list's key stays when it empties; it is only ever set on
 * the bucket its key hashes to, so a key that matches also names the right bucket (the free path's
 * hint relies on it).
 * Invariant: every CACHED block is on exactly the list of its (size, tag) and lies in the small
 * pool; a bucket that holds blocks has its bit set in quick_nonempty (a set bit may be stale: the
 * list empty); a non-empty list's key hashes to its bucket. */
/* log2 of the bytes of the reservation per by_granule entry (pool_t.by_granule): 1 MiB in the
 * large pool (== CUALLOC_SMALL_MAX, which its blocks exceed), 512 B in the small pool (every
 * block's alignment). */
#define LARGE_GRANULE_SHIFT 20
#define SMALL_GRANULE_SHIFT 9
_Static_assert(((size_t)1 << LARGE_GRANULE_SHIFT) == CUALLOC_SMALL_MAX, "large blocks exceed a granule");
_Static_assert(((size_t)1 << SMALL_GRANULE_SHIFT) == CUALLOC_ALIGN, "small blocks start on a granule");
#define GRANULE_SHIFT(pool) ((pool) == POOL_LARGE ? LARGE_GRANULE_SHIFT : SMALL_GRANULE_SHIFT)
#define QUICK_BUCKETS_LOG2 10
#define QUICK_BUCKETS (1u << QUICK_BUCKETS_LOG2)
/* Blocks per list. A training step allocates more than 64 blocks of some small sizes (GPT-2
 * small's snapshot): with 64, the rest took the index every step, 356 instructions per pair on its
 * requests against 338 with 256 (bench/RESULTS.md); the replays' reserved memory moved by under
 * 0.03% either way, since lists are merged back before the heap grows. */
#define QUICK_DEPTH 256
typedef struct quick_s {
    uint64_t key;                /* quick_key(size, tag) of its blocks; meaningless while empty */
    block_t *head;               /* newest first, linked through link.list.next_free */
    uint32_t count;
    bool ref;                    /* taken from since a partial flush last passed it (second chance) */
} quick_t;

typedef struct pool_s {
    pool_id_t id;
    size_t chunk;                /* VMM: bytes per physical handle; a power-of-two multiple of the granularity */
    size_t chunk_mask;           /* chunk - 1 */
    uintptr_t va_base;           /* VMM: the reservation */
    size_t va_size;
    cua_memhandle *chunks;       /* VMM: handle per chunk, 0 = not mapped (mmap'd array) */
    size_t nchunks;
    block_t *segments;           /* first block of every segment (VMM: the one reservation) */
    sizeclass_t unmapped;        /* VMM: UNMAPPED blocks */
    findex_t *index[HEAP_MAX_TAGS]; /* FREE blocks per tag, created on first use */
    uint32_t free_block_searches; /* classic GC clock (PyTorch's get_free_blocks_call_count) */
    size_t mapped;               /* bytes backed by physical memory (its ALLOCATED, FREE and CACHED
                                  * blocks; the pools' ALLOCATED bytes together are
                                  * stats.allocated_bytes, not kept per pool: the fast paths would
                                  * pay for a figure only heap_check reads) */
    size_t releasable;           /* bytes of FREE and CACHED blocks that could be unmapped/freed
                                  * now (CACHED: once flushed) */
    block_t **by_granule;        /* VMM: the blocks a free may name, each at the granule of the
                                  * reservation its address falls in (GRANULE_SHIFT), NULL elsewhere.
                                  * Large pool: its ALLOCATED blocks (larger than a granule, so no two
                                  * start in one). Small pool: its ALLOCATED and CACHED blocks (each
                                  * starts on a granule of its own). A free finds its block with a
                                  * load and a comparison of its address, an allocation enters it
                                  * with a store. mmap'd, an entry per granule (by_granule_bytes):
                                  * the large pool's is small and writable; the small pool's, 1/64
                                  * of its reservation, is read-only (the zero page) but where
                                  * chunks are mapped (granules_open), so it costs host memory
                                  * only for mapped chunks, 1/64 of them, and no commit charge. */
} pool_t;

/* The host tables an allocation (or the heap's set-up) may need more of (heap_t.host_refused). */
typedef enum { HOST_NONE, HOST_RECORDS, HOST_LIVE_MAP, HOST_INDEX, HOST_CHUNK_TABLES } host_table_t;

/* Destroyed streams' events kept before the completed ones are looked for (nb_retire). */
#define RETIRED_DRAIN_AT 16

/* A non-blocking stream the front door saw created, and its event for device-wide frees. */
typedef struct { cua_stream handle; cua_event event; bool in_flight; } nb_stream_t;
/* A non-blocking stream destroyed with work perhaps in flight: an event recorded as it was
 * destroyed, and heap_t.dw_closes then (the generations closed later are the ones it concerns). */
typedef struct { cua_event event; uint64_t closes; } retired_t;

struct heap_s {
    cua_lock_t lock;             /* guards everything below */
    int dev;
    bool vmm;
    bool plain_rounding;         /* no roundup_power2_divisions: every request rounds up to 512 B */
    bool fast_alloc;             /* plain_rounding && vmm: heap_malloc's fast path may serve */
    bool recording;              /* the recorder may be on: the fast paths stand aside (last_set).
                                  * Set with the recorder's snapshot of the heap (or at creation),
                                  * cleared by the first slow path that finds it off again */
    conf_t conf;
    const driver_ops_t *drv;
    size_t granularity;
    size_t total;                /* device memory */
    size_t cap;                  /* most bytes the heap may have mapped */
    pool_t pools[POOL_COUNT];
    stream_rec_t tags[HEAP_MAX_TAGS]; /* tags[TAG_ANY] is the "settled" pseudo-stream */
    uint64_t tags_used;          /* bit t: tags[t] is in use (TAG_ANY and the device-wide tags
                                  * always); a mask, so that loops over the stream tags visit the
                                  * used ones only (tag_next_used) */
    cua_stream last_stream;      /* one-entry cache of tag_of */
    unsigned last_tag;
    /* The fast paths' view of that cache (last_set keeps them in step): the stream heap_free's fast
     * path serves (last_stream while last_tag is set in VMM mode and not recording, else
     * NO_STREAM), the stream heap_malloc's serves (the same, and only with fast_alloc), and
     * last_tag's parts of the quick lists' key and hash. One comparison then stands for five
     * conditions. */
    cua_stream fast_free_stream;
    cua_stream fast_alloc_stream;
    uint64_t last_tag_key;
    uint32_t last_tag_hash;
    ptrmap_t classic_live;       /* classic mode: the ALLOCATED blocks by address (VMM pools have
                                  * their by_granule tables) */
    slab_t blocks;               /* block records */
    cualloc_stats stats;
    unsigned oom_reports;        /* reports printed, to keep a failing loop from flooding */
    quick_t quick[QUICK_BUCKETS];
    uint64_t quick_nonempty[QUICK_BUCKETS / 64]; /* bit i set if quick[i] holds blocks (may be
                                  * stale; cleared by the flushes) */
    uint64_t quick_handed_over;  /* lists quick_hand_over_idle moved to another stream (tests) */
    unsigned quick_cursor;       /* the word of quick_nonempty where the next partial
                                  * flush starts */
    cua_memhandle pending_release[HEAP_PENDING_RELEASES]; /* unmapped handles the driver would not release yet */
    size_t npending;
    /* Device-wide frees (cudaFree): the non-blocking streams the front door saw created (the
     * legacy stream does not order them), and their events, which with the legacy stream's
     * (tags[TAG_DW_A].event) are recorded together and cover the closed generation. The table
     * (n_nb of cap_nb entries, grow_table_reserve) grows as streams come, so that every non-blocking stream's
     * capture is seen before a device synchronize, which would invalidate it. nb_overflow: streams
     * the heap does not know of (the front door lost them, or the table could not grow); device-wide
     * blocks then settle only through a device synchronize. dw_open: the generation (TAG_DW_A or
     * TAG_DW_B) frees go to. */
    nb_stream_t *nb;
    unsigned n_nb;
    size_t cap_nb;
    bool nb_overflow;
    /* Non-blocking streams destroyed with work perhaps in flight (n_retired of cap_retired,
     * grow_table_reserve): a destroyed stream's work runs on, and blocks cudaFree'd after the
     * destroy must wait for it as for the live streams'. Each event is part of the group's
     * (dw_events_complete) for the generations closed after it, until seen complete.
     * retired_unknown: one was destroyed whose work no event could be recorded for (it was
     * capturing, or the driver or host memory refused): until the next device synchronize, only
     * that settles device-wide blocks. dw_closes: generations closed so far. */
    retired_t *retired;
    unsigned n_retired;
    size_t cap_retired;
    bool retired_unknown;
    uint64_t dw_closes;
    /* Since the legacy stream was last synchronized for a new non-blocking stream, a device-wide
     * allocation was served as the legacy stream (no non-blocking stream then), or, in classic
     * mode, a block was freed on the legacy stream (which a device-wide allocation may take). Set
     * still while a non-blocking stream exists: that synchronize could not be made (a capture, a
     * refusal); classic mode's device-wide allocations try it again, and until it is made take
     * fresh memory (heap_alloc_device_wide). */
    bool legacy_handed_out;
    unsigned dw_open;
    unsigned dw_frees_unchecked; /* device-wide frees since one last looked at the events */
    /* OOM reports printed, by (power-of-two bucket of the request, diagnosis kind, oom_diagnose's
     * reason). */
    struct { uint8_t bucket, kind, vmm; } oom_seen[HEAP_OOM_KINDS];
    unsigned n_oom_seen;
    bool oom_suppressed_said;
    /* The diagnosis of the last request that failed (empty before the first): oom_diagnose's
     * sentence, or why cualloc's own tables failed it. cualloc_oom_message ends with it. */
    char oom_text[768];
    /* What host memory was refused for during the allocation under way (HOST_NONE: nothing):
     * cualloc's own bookkeeping, not the device, then failed it (alloc_fail says so). Set where
     * the mmap or slab record fails, cleared where a general allocation starts. */
    host_table_t host_refused;
    unsigned host_refused_said; /* bit 1 << kind: each kind of host failure is reported once */
    uint64_t host_refusals;     /* allocations failed for want of host memory (heap_host_refusals) */
    bool no_slot_said;          /* alloc_fail_no_slot has reported once */
    /* The driver's last answer, in this allocation, to a call that creates or maps memory, when it
     * was an error other than out of memory (0 otherwise: cleared when an allocation starts and
     * by any answer that is not such an error). An allocation that then fails failed for it, not
     * for want of memory: alloc_fail reports and returns it (a context that a kernel's fault left
     * unusable fails every call so). An attempt that never reached the driver (the cap, host
     * memory for the heap's records) leaves the earlier answer standing. */
    cua_result grow_error;
    cua_result grow_error_said; /* the last such error reported: each is said once, not per call */
    cua_result last_fail_error; /* the error of the last failed allocation when a driver error, else 0 */
};

static const char *const host_table_names[] = {
    [HOST_NONE] = "nothing", [HOST_RECORDS] = "block records", [HOST_LIVE_MAP] = "the map of live blocks",
    [HOST_INDEX] = "a stream's free index", [HOST_CHUNK_TABLES] = "the tables of chunks"};

/* ------------------------------------------------------------------ tags in use */

/* The stream tags' bits in heap_t.tags_used. */
#define STREAM_TAGS_MASK (((UINT64_C(1) << TAG_STREAMS_END) - 1) & ~(UINT64_C(1) << TAG_ANY))
_Static_assert(HEAP_MAX_TAGS <= 64, "heap_t.tags_used holds a bit per tag");

static inline bool tag_used(const heap_t *h, unsigned t) { return h->tags_used >> t & 1; }

static inline void tag_set_used(heap_t *h, unsigned t, bool used) {
    if (used) h->tags_used |= UINT64_C(1) << t;
    else h->tags_used &= ~(UINT64_C(1) << t);
}

/* The first used stream tag at or after t (1 <= t <= TAG_STREAMS_END); TAG_STREAMS_END when none.
 * FOR_USED_STREAM_TAGS visits the used stream tags in increasing order, each one seen used when its
 * turn comes, as a loop over every slot testing tag_used would: a body may take or free slots. */
static inline unsigned tag_next_used(const heap_t *h, unsigned t) {
    uint64_t m = h->tags_used & STREAM_TAGS_MASK & (~UINT64_C(0) << t);
    return m ? (unsigned)__builtin_ctzll(m) : TAG_STREAMS_END;
}
#define FOR_USED_STREAM_TAGS(h, t) for (unsigned t = tag_next_used(h, 1); t < TAG_STREAMS_END; t = tag_next_used(h, t + 1))

static inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
static inline size_t align_down(size_t v, size_t a) { return v / a * a; }

/* ------------------------------------------------------------------ live blocks */

/* The blocks a free may name (ALLOCATED ones, and CACHED ones, which a second free finds and
 * refuses), by address: each VMM pool's by_granule table, `classic_live` in classic mode. */
static inline bool in_pool_va(const heap_t *h, pool_id_t pool, uintptr_t a) {
    const pool_t *p = &h->pools[pool];
    return a - p->va_base < p->va_size; /* va_size is 0 in classic mode */
}
static inline size_t by_granule_bytes(const pool_t *p) {
    return align_up((p->va_size >> GRANULE_SHIFT(p->id)) * sizeof(block_t *), (size_t)sysconf(_SC_PAGESIZE));
}
/* The slot of address a, which lies in pool's reservation (`pool` a constant where the shift
 * matters). */
static inline block_t **granule_slot(const heap_t *h, pool_id_t pool, uintptr_t a) {
    const pool_t *p = &h->pools[pool];
    return &p->by_granule[(a - p->va_base) >> GRANULE_SHIFT(pool)];
}
/* The block that starts at a, from a's slot; NULL when none does (the slot may hold a block that
 * starts elsewhere in the same granule, or none). */
static inline block_t *slot_get(block_t *const *slot, uintptr_t a) {
    block_t *b = *slot;
    return b && b->addr == a ? b : NULL;
}
/* VMM: the slot of address a, in whichever pool's reservation holds it; NULL in neither. */
static block_t **live_slot(const heap_t *h, uintptr_t a) {
    if (in_pool_va(h, POOL_LARGE, a)) return granule_slot(h, POOL_LARGE, a);
    if (in_pool_va(h, POOL_SMALL, a)) return granule_slot(h, POOL_SMALL, a);
    return NULL;
}
static block_t *live_get(const heap_t *h, uintptr_t a) {
    if (!h->vmm) return ptrmap_get(&h->classic_live, a);
    block_t **slot = live_slot(h, a);
    return slot ? slot_get(slot, a) : NULL;
}
/* False when `classic_live` had to grow and could not. (VMM: b's chunk is mapped, so its slot is
 * writable.) */
static inline __attribute__((always_inline)) bool live_insert(heap_t *h, block_t *b) {
    if (!h->vmm) return ptrmap_insert(&h->classic_live, b->addr, b);
    if (b->pool == POOL_LARGE) *granule_slot(h, POOL_LARGE, b->addr) = b; /* (constant pools: the shift) */
    else *granule_slot(h, POOL_SMALL, b->addr) = b;
    return true;
}
static inline __attribute__((always_inline)) void live_remove(heap_t *h, block_t *b) {
    if (!h->vmm) ptrmap_remove(&h->classic_live, b->addr);
    else if (b->pool == POOL_LARGE) *granule_slot(h, POOL_LARGE, b->addr) = NULL;
    else *granule_slot(h, POOL_SMALL, b->addr) = NULL;
}

/* ------------------------------------------------------------------ rounding */

static size_t round_to_division(size_t size, unsigned divisions) {
    if ((size & (size - 1)) == 0) return size;
    size_t floor_pow2 = (size_t)1 << floor_log2(size);
    size_t step = floor_pow2 >> floor_log2(divisions);
    if (step == 0) return floor_pow2 << 1;
    size_t floor = size & ~(step - 1);
    return floor == size ? size : floor + step;
}

size_t heap_round_size(const conf_t *c, size_t size) {
    if (size < CUALLOC_ALIGN) return CUALLOC_ALIGN;
    int idx = (int)floor_log2(size) - 20; /* intervals start at 1 MiB */
    if (idx < 0) idx = 0;
    if (idx >= CONF_ROUNDUP_INTERVALS) idx = CONF_ROUNDUP_INTERVALS - 1;
    unsigned div = c->roundup_power2_divisions[idx];
    if (div > 1 && size > (size_t)CUALLOC_ALIGN * div) return round_to_division(size, div);
    if (size > SIZE_MAX - CUALLOC_ALIGN) return 0;
    return align_up(size, CUALLOC_ALIGN);
}

/* ------------------------------------------------------------------ free indexes */

static findex_t *index_get(heap_t *h, pool_t *p, unsigned tag) {
    findex_t *ix = p->index[tag];
    if (ix) return ix;
    void *mem = mmap(NULL, sizeof(findex_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        h->host_refused = HOST_INDEX;
        return NULL;
    }
    ix = mem;
    if (h->vmm) sizeclass_init(&ix->sc);
    else tree_init(&ix->tree);
    p->index[tag] = ix;
    return ix;
}

/* Free bytes that cannot be released now: free memory (mapped, not allocated) minus its
 * releasable part, over both pools. */
static inline size_t heap_inactive_split(const heap_t *h) {
    const pool_t *s = &h->pools[POOL_SMALL], *l = &h->pools[POOL_LARGE];
    return s->mapped + l->mapped - h->stats.allocated_bytes - s->releasable - l->releasable;
}

/* Bytes of the whole chunks that [addr, addr + size) covers (VMM). */
static inline size_t chunk_interior(const pool_t *p, uintptr_t addr, size_t size) {
    size_t lo = (addr + p->chunk_mask) & ~p->chunk_mask, hi = (addr + size) & ~p->chunk_mask;
    return hi > lo ? hi - lo : 0;
}

/* Bytes of a free range that a release could return to the device right now (VMM). */
static inline __attribute__((always_inline)) size_t vmm_releasable(const pool_t *p, uintptr_t addr, size_t size) {
    if (size < p->chunk) return 0; /* holds no whole chunk: the common case, decided at once */
    return chunk_interior(p, addr, size);
}

/* The same for a free block, either mode. */
static inline __attribute__((always_inline)) size_t block_releasable(const heap_t *h, const pool_t *p, const block_t *b) {
    if (!h->vmm) return (!b->prev && !b->next) ? b->size : 0;
    return vmm_releasable(p, b->addr, b->size);
}

/* Accounting of a FREE block entering or leaving its index (CACHED blocks: quick_account). Free
 * physical memory is releasable or inactive-split (kept current here; its peak is taken by the
 * caller). The block's releasable bytes stay in its record while it is in the index, where nothing
 * changes them but free_resize: removal and resizing read them instead of computing them again. A
 * tag's free bytes are not counted here: they are its indexes' own count (tag_free_bytes). */
static inline void free_account_add(heap_t *h, pool_t *p, block_t *b) {
    size_t rel = block_releasable(h, p, b);
    b->releasable = rel;
    p->releasable += rel;
    h->stats.inactive_split_bytes += b->size - rel;
}

static inline void free_account_sub(heap_t *h, pool_t *p, const block_t *b) {
    p->releasable -= b->releasable;
    h->stats.inactive_split_bytes -= b->size - b->releasable;
}

/* The free bytes of one pool's index of tag t (0 when it has none). */
static size_t pool_tag_free_bytes(const heap_t *h, const pool_t *p, unsigned t) {
    const findex_t *ix = p->index[t];
    return !ix ? 0 : h->vmm ? ix->sc.bytes : ix->tree.bytes;
}

/* Bytes of FREE blocks with tag t, both pools (CACHED blocks are not counted: every reader that
 * must see them runs after quick_flush). */
static size_t tag_free_bytes(const heap_t *h, unsigned t) {
    size_t bytes = 0;
    for (int pi = 0; pi < POOL_COUNT; pi++) bytes += pool_tag_free_bytes(h, &h->pools[pi], t);
    return bytes;
}

/* Puts a FREE block (tag and size final) into its index and the accounting. The index exists:
 * free_insert's callers made it with index_get when they took the tag. Inline, as free_remove:
 * each miss of the quick lists does about two of each, and a call costs as much as the work. */
static inline __attribute__((always_inline)) void free_insert_in(heap_t *h, pool_t *p, block_t *b,
                                                                 bool vmm /* h->vmm, constant where the caller knows it */) {
    findex_t *ix = p->index[b->tag];
    if (vmm) sizeclass_insert(&ix->sc, b);
    else tree_insert(&ix->tree, b);
    free_account_add(h, p, b);
    b->gc_base = p->free_block_searches;
}

static inline __attribute__((always_inline)) void free_remove_in(heap_t *h, pool_t *p, block_t *b, bool vmm) {
    findex_t *ix = p->index[b->tag];
    if (vmm) sizeclass_remove(&ix->sc, b);
    else tree_remove(&ix->tree, b);
    free_account_sub(h, p, b);
}

/* The same, the mode read from the heap: the VMM fast paths and the merges they make pass it as a
 * constant instead, so that they carry no call into the treap (and no registers saved for one). */
static inline __attribute__((always_inline)) void free_insert(heap_t *h, pool_t *p, block_t *b) {
    free_insert_in(h, p, b, h->vmm);
}

static inline __attribute__((always_inline)) void free_remove(heap_t *h, pool_t *p, block_t *b) {
    free_remove_in(h, p, b, h->vmm);
}

/* Free neighbours with compatible tags merge: equal tags, or one TAG_ANY block and one of a stream
 * (the merged block takes the stream's tag: at least as safe, and that stream may use it at once).
 * Device-wide blocks merge only among their own tag: a TAG_ANY neighbour absorbed into one would be
 * hidden from every stream until the generation settles. */
static inline bool tags_compatible(unsigned a, unsigned b) {
    return a == b || ((a == TAG_ANY || b == TAG_ANY) && (a | b) < TAG_STREAMS_END);
}

/* Merges b's next block into b (b's record survives, the next one's goes back to the slab). */
static inline __attribute__((always_inline)) void absorb_next(heap_t *h, block_t *b) {
    block_t *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (b->next) b->next->prev = b;
    slab_free(&h->blocks, n);
}

/* Merges FREE block b (in no index) with compatible FREE neighbours; returns the merged block
 * (not in any index). The lower block's record survives, which keeps segment heads stable.
 * Inline where a quick list is merged back (quick_evict: one call per parked block), out of line
 * (coalesce_free) elsewhere. */
static inline __attribute__((always_inline)) block_t *coalesce_free_inline(heap_t *h, pool_t *p, block_t *b, bool vmm) {
    block_t *n = b->next;
    if (n && n->state == BLOCK_FREE && tags_compatible(b->tag, n->tag)) {
        free_remove_in(h, p, n, vmm);
        if (b->tag == TAG_ANY) b->tag = n->tag;
        absorb_next(h, b);
    }
    block_t *pr = b->prev;
    if (pr && pr->state == BLOCK_FREE && tags_compatible(pr->tag, b->tag)) {
        free_remove_in(h, p, pr, vmm);
        if (pr->tag == TAG_ANY) pr->tag = b->tag;
        absorb_next(h, pr);
        b = pr;
    }
    return b;
}

static block_t *coalesce_free(heap_t *h, pool_t *p, block_t *b) { return coalesce_free_inline(h, p, b, h->vmm); }

/* VMM: FREE block b, in its index, becomes [addr, addr + size) with the same tag; its bin and the
 * accounting follow. Afterwards b heads its bin, exactly as if it had been removed and inserted
 * again (sizeclass_find's choice among equals depends on that order); when the size stays in its
 * bin and b heads it already, no list or bitmap is touched. Carving an allocation off a free block
 * and merging a freed block into a free neighbour both come down to this. */
static inline __attribute__((always_inline)) void free_resize_in(heap_t *h, pool_t *p, block_t *b, uintptr_t addr,
                                                                 size_t size, bool only /* b is its index's only block */) {
    size_t old_rel = b->releasable, rel = vmm_releasable(p, addr, size);
    p->releasable += rel - old_rel;
    h->stats.inactive_split_bytes += (size - rel) - (b->size - old_rel);
    b->releasable = rel;
    b->addr = addr;
    if (only) sizeclass_resize_only(&p->index[b->tag]->sc, b, size);
    else sizeclass_resize(&p->index[b->tag]->sc, b, size);
}

static inline __attribute__((always_inline)) void free_resize(heap_t *h, pool_t *p, block_t *b, uintptr_t addr, size_t size) {
    free_resize_in(h, p, b, addr, size, false);
}

/* VMM: what coalesce_free and free_insert do together for a just-freed block b (FREE, in no index),
 * merging in place where it can: into its lower neighbour when that one has b's tag, else into its
 * upper neighbour when that one has b's tag and b does not head its segment (a segment's first
 * record lives as long as the segment). The surviving record is then resized, not
 * taken out and put back; the addresses, tags and bin order that result are coalesce_free's.
 * Returns the merged block (in its index). */
static inline __attribute__((always_inline)) block_t *coalesce_insert_vmm(heap_t *h, pool_t *p, block_t *b) {
    block_t *pr = b->prev, *n = b->next;
    unsigned tag = b->tag;
    /* A TAG_ANY block takes a tagged neighbour's tag and passes it on: coalesce_free's case. */
    if (__builtin_expect(tag != TAG_ANY, 1)) {
        bool next_free = n && n->state == BLOCK_FREE && tags_compatible(tag, n->tag);
        if (pr && pr->state == BLOCK_FREE && pr->tag == tag) {
            /* pr's size changes only in free_resize, which accounts from the old one. */
            block_t *last = b;
            size_t size = pr->size + b->size;
            if (next_free) {
                free_remove_in(h, p, n, true);
                size += n->size;
                last = n;
            }
            pr->next = last->next;
            if (pr->next) pr->next->prev = pr;
            if (last != b) slab_free(&h->blocks, last);
            slab_free(&h->blocks, b);
            free_resize(h, p, pr, pr->addr, size);
            return pr;
        }
        if (next_free && n->tag == tag && pr && !(pr->state == BLOCK_FREE && tags_compatible(pr->tag, tag))) {
            pr->next = n;
            n->prev = pr;
            free_resize(h, p, n, b->addr, b->size + n->size);
            slab_free(&h->blocks, b);
            return n;
        }
    }
    b = coalesce_free_inline(h, p, b, true);
    free_insert_in(h, p, b, true);
    return b;
}

/* Merges UNMAPPED block b (in no index) with UNMAPPED neighbours. */
static block_t *coalesce_unmapped(heap_t *h, pool_t *p, block_t *b) {
    block_t *n = b->next;
    if (n && n->state == BLOCK_UNMAPPED) {
        sizeclass_remove(&p->unmapped, n);
        absorb_next(h, b);
    }
    block_t *pr = b->prev;
    if (pr && pr->state == BLOCK_UNMAPPED) {
        sizeclass_remove(&p->unmapped, pr);
        absorb_next(h, pr);
        b = pr;
    }
    return b;
}

/* Sets every field of record r for [addr, addr + size), in state `state`, tag `tag`, pool `pool`,
 * in no index, between prev and next (not linked to them: the caller does that). The unused fields
 * are zero, as slab_alloc would leave them: one store each instead of a memset call and the stores. */
static inline __attribute__((always_inline)) void block_init(block_t *r, uintptr_t addr, size_t size, block_t *prev,
                                                            block_t *next, uint8_t state, unsigned tag, uint8_t pool) {
    r->addr = addr;
    r->size = size;
    r->prev = prev;
    r->next = next;
    r->link.list.prev_free = r->link.list.next_free = NULL;
    r->seg_prev = r->seg_next = NULL;
    r->requested = 0;
    r->stream = NULL;
    r->prio = 0;
    r->gc_base = 0;
    r->tag = (uint16_t)tag;
    r->state = state;
    r->pool = pool;
    r->quick_hint = 0;
}

/* A new record for [addr, addr + size), linked into the address list between prev and next
 * (either may be NULL), in state `state`, tag `tag`, pool `pool`, in no index. NULL when no record
 * could be had (nothing is changed then). */
static inline __attribute__((always_inline)) block_t *block_new(heap_t *h, uintptr_t addr, size_t size, block_t *prev,
                                                               block_t *next, uint8_t state, unsigned tag, uint8_t pool) {
    block_t *r = slab_alloc_uninit(&h->blocks);
    if (__builtin_expect(!r, 0)) {
        h->host_refused = HOST_RECORDS;
        return NULL;
    }
    block_init(r, addr, size, prev, next, state, tag, pool);
    if (prev) prev->next = r;
    if (next) next->prev = r;
    return r;
}

/* Cuts b at `size` bytes; the back part becomes a new block after b, in state `state`, tag `tag`,
 * in no index. Returns it, or NULL when no record could be had (b is then unchanged). */
static block_t *block_split(heap_t *h, block_t *b, size_t size, uint8_t state, unsigned tag) {
    block_t *r = block_new(h, b->addr + size, b->size - size, b, b->next, state, tag, b->pool);
    if (r) b->size = size;
    return r;
}


/* ------------------------------------------------------------------ quick lists */

static block_t *coalesce_free(heap_t *h, pool_t *p, block_t *b);

/* (size, tag) as one word: sizes are below 2^48 (heap_alloc refuses larger), tags below 2^16. */
static inline uint64_t quick_key_tag(unsigned tag) { return (uint64_t)tag << 48; }
static inline uint64_t quick_key(size_t size, unsigned tag) { return (uint64_t)size | quick_key_tag(tag); }

/* The bucket of (size, tag): a hash of the key's bits 9..40 (the size in 512 B units, low 32 bits)
 * with the tag folded in, computed from the parts (no shifts of the packed key). */
static inline uint32_t quick_hash_tag(unsigned tag) { return (uint32_t)tag << 26; }
static inline unsigned quick_index_hashed(size_t size, uint32_t tag_hash) {
    uint32_t k = (uint32_t)(size >> 9) ^ tag_hash;
    return (k * 2654435761u) >> (32 - QUICK_BUCKETS_LOG2);
}
static inline unsigned quick_index(size_t size, unsigned tag) { return quick_index_hashed(size, quick_hash_tag(tag)); }

/* A parked (CACHED) block's accounting, added or taken away (size == b->size): free memory as
 * free_account_add counts it. Parked blocks are the small pool's, at most CUALLOC_SMALL_MAX bytes,
 * and its chunks are larger (heap_create), so none holds a whole chunk: all of it is inactive split,
 * none releasable. */
static inline void quick_account(heap_t *h, size_t size, bool add) {
    h->stats.inactive_split_bytes += add ? size : -size;
}

/* Can list i take a block of `key`: empty, or holding that key with room? */
static inline bool quick_room(const quick_t *q, uint64_t key) {
    return !q->head || (q->key == key && q->count < QUICK_DEPTH);
}

/* Parks b (size bytes, tag final) on list q, which has room and whose key is b's already (kept
 * when it empties), and b->quick_hint is q's index: the free path's case when the hint names the
 * list. */
static inline __attribute__((always_inline)) void quick_link(heap_t *h, block_t *b, size_t size, quick_t *q) {
    if (!q->head) {
        unsigned i = (unsigned)(q - h->quick); /* (only here: the free path keeps q, not i) */
        q->ref = false;
        h->quick_nonempty[i / 64] |= (uint64_t)1 << (i % 64);
    }
    b->state = BLOCK_CACHED;
    b->link.list.next_free = q->head;
    q->head = b;
    q->count++;
    quick_account(h, size, true);
}

/* Parks b (size bytes, tag final) on list i, for which quick_room(key) holds. */
static inline void quick_park(heap_t *h, block_t *b, size_t size, unsigned i, uint64_t key) {
    if (!h->quick[i].head) h->quick[i].key = key;
    b->quick_hint = (uint16_t)i;
    quick_link(h, b, size, &h->quick[i]);
}

/* Parks a just-freed block (tag and size final) on its quick list; false when the bucket is taken
 * by another (size, tag) or full. */
static inline bool quick_push(heap_t *h, block_t *b) {
    /* Device-wide frees are never handed out unsettled; large blocks are never parked. */
    if (__builtin_expect(tag_is_device_wide(b->tag) || b->pool != POOL_SMALL, 0)) return false;
    uint64_t key = quick_key(b->size, b->tag);
    unsigned i = quick_index(b->size, b->tag);
    if (!quick_room(&h->quick[i], key)) return false;
    quick_park(h, b, b->size, i, key);
    return true;
}

/* (No list has device-wide blocks: quick_push refuses them.) */
static inline __attribute__((always_inline)) block_t *quick_pop_keyed(heap_t *h, size_t size, uint64_t key, unsigned i) {
    quick_t *q = &h->quick[i];
    block_t *b = q->head;
    if (!b || q->key != key) return NULL;
    q->head = b->link.list.next_free;
    q->count--;
    q->ref = true;
    /* (the bucket's bit stays, if this was its last block: lazy) */
    quick_account(h, size, false);
    return b;
}

static inline block_t *quick_pop(heap_t *h, size_t size, unsigned tag) {
    return quick_pop_keyed(h, size, quick_key(size, tag), quick_index(size, tag));
}

/* Merges the blocks of one quick list back into the small pool's free index, restoring "no two
 * adjacent compatible FREE blocks" (a block merges with neighbours merged before it). True when a
 * merge yielded a block of at least `size` bytes that tag `tag` may use (TAG_ANY or its own) — a
 * hint only: a later merge may absorb it (its record is then gone) or change its tag. */
static bool quick_evict(heap_t *h, unsigned i, unsigned tag, size_t size) {
    quick_t *q = &h->quick[i];
    pool_t *p = &h->pools[POOL_SMALL];
    bool fit = false;
    while (q->head) {
        block_t *b = q->head;
        q->head = b->link.list.next_free;
        q->count--;
        quick_account(h, b->size, false);
        *granule_slot(h, POOL_SMALL, b->addr) = NULL;
        b->state = BLOCK_FREE;
        b = coalesce_insert_vmm(h, p, b); /* (quick lists are VMM's) */
        if ((b->tag == tag || b->tag == TAG_ANY) && b->size >= size) fit = true;
    }
    return fit;
}

/* Might a quick list hold blocks? (Bits may be stale: then a flush finds nothing.) */
static bool quick_any(const heap_t *h) {
    uint64_t any = 0;
    for (unsigned w = 0; w < QUICK_BUCKETS / 64; w++) any |= h->quick_nonempty[w];
    return any != 0;
}

/* The tag of a list's key. */
static inline unsigned quick_key_tag_of(uint64_t key) { return (unsigned)(key >> 48); }

/* Merges every CACHED block back into the free indexes but `keep`'s (a stream tag; TAG_ANY, which
 * no list has, keeps none). */
static void quick_flush_others(heap_t *h, unsigned keep) {
    /* In bucket order: the order of the merges decides which records survive and the order of the
     * bins' lists, hence later placement. */
    for (unsigned w = 0; w < QUICK_BUCKETS / 64; w++) {
        for (uint64_t bits = h->quick_nonempty[w]; bits; bits &= bits - 1) {
            unsigned i = w * 64 + (unsigned)__builtin_ctzll(bits);
            quick_t *q = &h->quick[i];
            if (q->head && quick_key_tag_of(q->key) == keep) continue;
            h->quick_nonempty[w] &= ~((uint64_t)1 << (i % 64));
            if (q->head) quick_evict(h, i, TAG_ANY, SIZE_MAX);
        }
    }
}

/* Merges every CACHED block back into the free indexes. */
static void quick_flush(heap_t *h) { quick_flush_others(h, TAG_ANY); }

/* List i (non-empty, another tag's) becomes tag `to`'s list of its size, its blocks retagged: on
 * its own bucket if that is to's bucket too, else spliced onto to's bucket, which must be empty or
 * hold to's key with room for them. False, nothing changed, where it cannot go. */
static bool quick_retag(heap_t *h, unsigned i, unsigned to) {
    quick_t *q = &h->quick[i];
    size_t size = (size_t)(q->key & (HEAP_MAX_REQUEST - 1));
    uint64_t key = quick_key(size, to);
    unsigned j = quick_index(size, to);
    quick_t *d = &h->quick[j];
    if (j != i && d->head && (d->key != key || d->count + q->count > QUICK_DEPTH)) return false;
    block_t *tail = NULL;
    for (block_t *b = q->head; b; b = b->link.list.next_free) {
        b->tag = (uint16_t)to;
        b->quick_hint = (uint16_t)j;
        tail = b;
    }
    if (j == i) {
        q->key = key;
        return true;
    }
    if (!d->head) {
        d->key = key;
        d->ref = false;
        h->quick_nonempty[j / 64] |= (uint64_t)1 << (j % 64);
    }
    tail->link.list.next_free = d->head;
    d->head = q->head;
    d->count += q->count;
    q->head = NULL; /* (its bit stays: stale, which the flushes allow) */
    q->count = 0;
    return true;
}

/* A search for `rsize` on `tag` in the small pool missed: merges its quick lists back. With
 * `until_fit`, one list at a time, stopping once a merge yields a block the search would find, so
 * that one request does not empty every list (each emptied list costs its size a miss later). The
 * lists are visited in CLOCK order: from where the last such flush stopped, a list taken from
 * since it was last passed gets a second chance, so sizes that stopped recurring (odd shapes) go
 * first. True when a fitting block appeared (the caller searches again: the block may have merged
 * further). */
static bool quick_flush_small(heap_t *h, unsigned tag, size_t rsize, bool until_fit) {
    bool fit = false;
    for (unsigned pass = until_fit ? 0 : 1; pass < 2; pass++) {
        for (unsigned n = 0; n < QUICK_BUCKETS / 64; n++) {
            unsigned w = (h->quick_cursor + n) % (QUICK_BUCKETS / 64);
            for (uint64_t bits = h->quick_nonempty[w]; bits; bits &= bits - 1) {
                unsigned i = w * 64 + (unsigned)__builtin_ctzll(bits);
                quick_t *q = &h->quick[i];
                bool stale = !q->head;
                if (!stale && pass == 0 && q->ref) {
                    q->ref = false;
                    continue;
                }
                h->quick_nonempty[w] &= ~((uint64_t)1 << (i % 64));
                if (stale) continue;
                if (quick_evict(h, i, tag, rsize)) {
                    fit = true;
                    if (until_fit) {
                        h->quick_cursor = w;
                        return true;
                    }
                }
            }
        }
    }
    return fit;
}

/* ------------------------------------------------------------------ streams */

static void settle_all(heap_t *h);
static size_t classic_release_all(heap_t *h);

/* Sets tag_of's one-entry cache (tag 0: empty) and the fast paths' view of it. */
static void last_set(heap_t *h, cua_stream stream, unsigned tag) {
    h->last_stream = stream;
    h->last_tag = tag;
    h->fast_free_stream = tag && h->vmm && !h->recording ? stream : NO_STREAM;
    h->fast_alloc_stream = tag && h->fast_alloc && !h->recording ? stream : NO_STREAM;
    h->last_tag_key = quick_key_tag(tag);
    h->last_tag_hash = quick_hash_tag(tag);
}

/* The recorder stopped (any way it can: cualloc_trace_stop, exit, a write error, fork): the fast
 * paths may serve again. The slow paths call this, since while recording every call takes them. */
static inline void recording_check(heap_t *h) {
    if (__builtin_expect(h->recording, 0) && !trace_enabled()) {
        h->recording = false;
        last_set(h, h->last_stream, h->last_tag);
    }
}

/* An unused stream slot, 0 when every one is taken. */
static unsigned slot_unused(const heap_t *h) {
    uint64_t unused = ~h->tags_used & STREAM_TAGS_MASK;
    return unused ? (unsigned)__builtin_ctzll(unused) : 0;
}

/* Unused slot t becomes an open tag of `stream` (its event handle stays with the slot). False when
 * its free indexes could not be had. */
static bool slot_claim(heap_t *h, unsigned t, cua_stream stream) {
    for (int pi = 0; pi < POOL_COUNT; pi++)
        if (!index_get(h, &h->pools[pi], t)) return false;
    stream_rec_t *r = &h->tags[t];
    cua_event ev = r->event;
    memset(r, 0, sizeof *r);
    r->event = ev;
    tag_set_used(h, t, true);
    r->handle = stream;
    return true;
}

/* The open tag of `stream`, TAG_ANY when it has none. */
static unsigned tag_lookup(const heap_t *h, cua_stream stream) {
    FOR_USED_STREAM_TAGS(h, t)
        if (!h->tags[t].closed && h->tags[t].handle == stream) return t;
    return TAG_ANY;
}

/* An open tag that holds free blocks or has a closed generation: what a settling has to look at. */
static bool open_tag_waiting(const heap_t *h, unsigned t) {
    const stream_rec_t *r = &h->tags[t];
    return tag_used(h, t) && !r->closed && (r->partner || tag_free_bytes(h, t));
}

/* The tag of `stream`, registering it on first sight; 0 (TAG_ANY) never names a stream. Returns
 * HEAP_MAX_TAGS when the table is full even after recycling. */
static __attribute__((noinline)) unsigned tag_of_uncached(heap_t *h, cua_stream stream) {
    unsigned found = tag_lookup(h, stream);
    if (found) {
        last_set(h, stream, found);
        return found;
    }
    unsigned free_slot = slot_unused(h);
    if (!free_slot) {
        /* Every slot names a stream: settle everything (synchronizing: closed generations go with
         * it) and forget the streams that then hold nothing. Allocated blocks remember stream
         * handles, not tags, so this is safe. Classic mode never moves a free block to another
         * stream (a segment serves one), so there its streams' wholly free segments are released
         * instead, as PyTorch releases its cache before giving up. */
        settle_all(h);
        if (!h->vmm) classic_release_all(h);
        FOR_USED_STREAM_TAGS(h, t) {
            stream_rec_t *r = &h->tags[t];
            if (!r->closed && !open_tag_waiting(h, t)) {
                tag_set_used(h, t, false);
                if (h->last_tag == t) last_set(h, NO_STREAM, 0);
                if (!free_slot) free_slot = t;
            }
        }
        if (!free_slot) return HEAP_MAX_TAGS;
    }
    if (!slot_claim(h, free_slot, stream)) return HEAP_MAX_TAGS;
    last_set(h, stream, free_slot);
    return free_slot;
}

/* The tag of a stream: the one-entry cache inline, the table out of line. */
static inline unsigned tag_of(heap_t *h, cua_stream stream) {
    return stream == h->last_stream && h->last_tag ? h->last_tag : tag_of_uncached(h, stream);
}

/* Moves every FREE block tagged `tag` to TAG_ANY, merging as it goes (a merged block takes a
 * compatible neighbour's tag, which is at least as safe as its own). */
static void settle_tag(heap_t *h, unsigned tag) {
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        findex_t *ix = p->index[tag];
        if (!ix) continue;
        for (;;) {
            block_t *b = h->vmm ? sizeclass_find(&ix->sc, CUALLOC_ALIGN) : tree_lower_bound(&ix->tree, 0);
            if (!b) break;
            free_remove(h, p, b);
            /* Classic mode: a segment serves one stream (its blocks remember it in `stream`), so a
             * settled device-wide block goes back to that stream's index, the only one classic
             * searches (TAG_ANY when the stream's record is gone: then only a release finds it). */
            b->tag = (!h->vmm && tag_is_device_wide(tag)) ? (uint16_t)tag_lookup(h, b->stream) : TAG_ANY;
            b = coalesce_free(h, p, b);
            free_insert(h, p, b);
        }
    }
}

/* A key (stream_is_key) names no CUDA stream and cannot be synchronized: an error, which sends the
 * callers to their device-wide fallbacks. */
static cua_result stream_sync(heap_t *h, cua_stream s) {
    if (stream_is_key(s)) return CUA_ERROR_INVALID_HANDLE;
    h->stats.num_syncs++;
    return h->drv->stream_synchronize(h->dev, s);
}

/* Capture (CUDA graphs): nothing records on, queries or synchronizes a capturing stream; an error
 * from the query counts as capturing. A key is not asked about (the front door asked about the
 * stream it stands for before serving). */
static bool is_capturing(heap_t *h, cua_stream s) {
    if (!h->drv->stream_is_capturing || stream_is_key(s)) return false;
    bool cap = false;
    return h->drv->stream_is_capturing(h->dev, s, &cap) != CUA_SUCCESS || cap;
}

/* The device-wide generations (see the top of this file). Their events live in one record,
 * tags[TAG_DW_A]: `event` is the legacy stream's, `event_in_flight` says the group's events, which
 * cover the closed tag, have not been seen complete. Invariant: the closed tag holds blocks only
 * while they are in flight. */
static inline stream_rec_t *dw_rec(heap_t *h) { return &h->tags[TAG_DW_A]; }
static inline unsigned dw_closed(const heap_t *h) { return h->dw_open ^ TAG_DW_A ^ TAG_DW_B; }
static size_t dw_free_bytes(const heap_t *h) { return tag_free_bytes(h, TAG_DW_A) + tag_free_bytes(h, TAG_DW_B); }
/* The same for one pool. */
static size_t pool_dw_free_bytes(const heap_t *h, const pool_t *p) {
    return pool_tag_free_bytes(h, p, TAG_DW_A) + pool_tag_free_bytes(h, p, TAG_DW_B);
}

/* The device-wide group is the legacy stream plus every known non-blocking stream. */
static bool dw_any_capturing(heap_t *h) {
    if (is_capturing(h, NULL)) return true;
    for (unsigned i = 0; i < h->n_nb; i++)
        if (is_capturing(h, h->nb[i].handle)) return true;
    return false;
}

/* Any stream the heap knows of captures: the device-wide group's, or one it holds free blocks for
 * (dw_any_capturing covers the blocking ones through the legacy stream's query). */
static bool capture_in_progress(heap_t *h) {
    if (dw_any_capturing(h)) return true;
    FOR_USED_STREAM_TAGS(h, t)
        if (is_capturing(h, h->tags[t].handle)) return true;
    return false;
}

/* A device synchronize joins every capture in progress on the device, and CUDA then invalidates
 * the capture: it is made only when no stream the heap knows of captures (the legacy stream's
 * query also fails while any blocking stream captures, known or not). An error when it is not
 * made or fails. */
static cua_result device_sync(heap_t *h) {
    /* Every stream with a record, not only those with free bytes in their index: a stream whose
     * free memory is all parked on its quick lists captures just the same. */
    if (capture_in_progress(h)) return CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    h->stats.num_syncs++;
    return h->drv->device_synchronize(h->dev);
}

/* Waits for all the group's work (one device synchronize) and settles both generations. True when
 * the device was synchronized (false too when there was nothing to wait for). */
static bool dw_sync(heap_t *h) {
    stream_rec_t *r = dw_rec(h);
    if (dw_free_bytes(h) == 0 && !r->event_in_flight) return false;
    if (device_sync(h) != CUA_SUCCESS) return false; /* captures in progress, or refused: stay unsettled */
    r->event_in_flight = false;
    for (unsigned i = 0; i < h->n_nb; i++) h->nb[i].in_flight = false;
    while (h->n_retired) h->drv->event_destroy(h->dev, h->retired[--h->n_retired].event);
    h->retired_unknown = false;
    settle_tag(h, TAG_DW_A);
    settle_tag(h, TAG_DW_B);
    return true;
}

/* A destroyed stream's event seen complete: dropped (the last entry takes its place). */
static void retired_drop(heap_t *h, unsigned i) {
    h->drv->event_destroy(h->dev, h->retired[i].event);
    h->retired[i] = h->retired[--h->n_retired];
}

/* Applies `look` (the driver's event query, or its event wait) to the group's events, the legacy
 * stream's first (it is the busiest), then the live non-blocking streams', then the destroyed
 * ones', up to the first that is not complete; those seen complete are marked so (a destroyed
 * stream's is dropped). True when all are. */
static bool dw_events_complete(heap_t *h, cua_result (*look)(int dev, cua_event event)) {
    stream_rec_t *r = dw_rec(h);
    if (look(h->dev, r->event) != CUA_SUCCESS) return false;
    for (unsigned i = 0; i < h->n_nb; i++) {
        if (!h->nb[i].in_flight) continue;
        if (look(h->dev, h->nb[i].event) != CUA_SUCCESS) return false;
        h->nb[i].in_flight = false;
    }
    for (unsigned i = h->n_retired; i-- > 0;) {
        if (h->retired[i].closes >= h->dw_closes) continue; /* destroyed after the closing */
        if (look(h->dev, h->retired[i].event) != CUA_SUCCESS) return false;
        retired_drop(h, i);
    }
    r->event_in_flight = false;
    return true;
}

/* Without waiting: looks at the group's events. True when all have completed. */
static bool dw_query(heap_t *h) { return dw_events_complete(h, h->drv->event_query); }

/* Waits for the closed generation's events (the group's, recorded when it closed), not for the work
 * queued since, and settles it. One device synchronize instead where the driver has no event wait,
 * or where events cannot cover the group (non-blocking streams the heap does not know of: then no
 * generation is ever closed). False when nothing could be waited for (no events in flight, a
 * capture, or a driver error). */
static bool dw_wait_closed(heap_t *h) {
    stream_rec_t *r = dw_rec(h);
    if (dw_any_capturing(h)) return false;
    if (h->nb_overflow || h->retired_unknown || !h->drv->event_synchronize) {
        dw_sync(h);
        return true;
    }
    if (!r->event_in_flight) return false;
    h->stats.num_syncs++;
    if (!dw_events_complete(h, h->drv->event_synchronize)) return false;
    settle_tag(h, dw_closed(h));
    return true;
}

/* Without waiting: settles the closed generation when its events have completed, then closes the
 * open one (recording a new set of events) when it holds blocks. True when something settled.
 * With non-blocking streams the heap does not know of (nb_overflow, retired_unknown), only dw_sync
 * can settle. */
static bool dw_settle_completed(heap_t *h) {
    stream_rec_t *r = dw_rec(h);
    if (h->nb_overflow || h->retired_unknown || dw_free_bytes(h) == 0) return false;
    if (r->event_in_flight && !dw_query(h)) return false;
    bool settled = false;
    unsigned closed = dw_closed(h), open = h->dw_open;
    if (tag_free_bytes(h, closed)) {
        settle_tag(h, closed);
        settled = true;
    }
    if (tag_free_bytes(h, open) == 0 || dw_any_capturing(h)) return settled;
    if (!r->event && h->drv->event_create(h->dev, &r->event) != CUA_SUCCESS) return settled;
    bool covered = true;
    for (unsigned i = 0; i < h->n_nb; i++) {
        if (!h->nb[i].event && h->drv->event_create(h->dev, &h->nb[i].event) != CUA_SUCCESS) covered = false;
        else if (h->drv->event_record(h->dev, h->nb[i].event, h->nb[i].handle) != CUA_SUCCESS) covered = false;
        else h->nb[i].in_flight = true;
    }
    if (h->drv->event_record(h->dev, r->event, NULL) != CUA_SUCCESS) covered = false;
    if (!covered) return settled; /* some stream not covered: the open tag stays open, try later */
    h->dw_open = closed; /* empty: settled above */
    h->dw_closes++;
    r->event_in_flight = true;
    if (dw_query(h)) {
        settle_tag(h, open);
        settled = true;
    }
    return settled;
}

/* The stream generations (see the top of this file). */

/* Closed tag c's event has completed (or its stream was synchronized): its blocks settle and its
 * slot is freed. */
static void closed_settle(heap_t *h, unsigned c) {
    stream_rec_t *r = &h->tags[c];
    settle_tag(h, c);
    h->tags[r->partner].partner = 0;
    tag_set_used(h, c, false);
    r->closed = r->event_in_flight = false;
    r->partner = 0;
}

/* Closes open tag t (VMM, quick lists flushed, no closed partner): an event recorded on its stream
 * now covers every block t holds, t becomes the stream's closed tag, and a fresh slot its open one.
 * False, nothing changed, when no slot, index or event could be had. */
static bool stream_close(heap_t *h, unsigned t) {
    stream_rec_t *r = &h->tags[t];
    if (stream_is_key(r->handle)) return false; /* no event can be recorded on it: settle_all's device synchronize settles it */
    unsigned n = slot_unused(h);
    if (!n || !slot_claim(h, n, r->handle)) return false;
    if ((!r->event && h->drv->event_create(h->dev, &r->event) != CUA_SUCCESS) ||
        h->drv->event_record(h->dev, r->event, r->handle) != CUA_SUCCESS) {
        tag_set_used(h, n, false);
        return false;
    }
    r->closed = r->event_in_flight = true;
    r->partner = (uint16_t)n;
    h->tags[n].partner = (uint16_t)t;
    if (h->last_tag == t) last_set(h, r->handle, n);
    return true;
}

/* Without waiting, for the stream of open tag t: settles its closed generation if that one's event
 * has completed, then closes the open one if it holds blocks. True when something settled. */
static bool stream_settle_completed(heap_t *h, unsigned t) {
    stream_rec_t *r = &h->tags[t];
    bool settled = false;
    if (r->partner) {
        /* Not ready, or an error: the closed generation stays closed (the open one waits for it). */
        if (h->drv->event_query(h->dev, h->tags[r->partner].event) != CUA_SUCCESS) return false;
        closed_settle(h, r->partner);
        settled = true;
    }
    if (!tag_free_bytes(h, t) || !stream_close(h, t)) return settled;
    if (h->drv->event_query(h->dev, r->event) == CUA_SUCCESS) { /* the stream was idle */
        closed_settle(h, t);
        settled = true;
    }
    return settled;
}

/* Open tag t's stream has been synchronized: its closed generation and (VMM) its open one settle. */
static void stream_settle_synced(heap_t *h, unsigned t) {
    if (h->tags[t].partner) closed_settle(h, h->tags[t].partner);
    if (h->vmm) settle_tag(h, t);
}

/* Synchronizes every stream holding free blocks and settles them (VMM; classic mode never moves
 * blocks between streams, only waits), both generations and the device-wide ones. */
static void settle_all(heap_t *h) {
    quick_flush(h);
    bool device_synced = dw_sync(h);
    FOR_USED_STREAM_TAGS(h, t) {
        stream_rec_t *r = &h->tags[t];
        if (!open_tag_waiting(h, t)) continue;
        if (is_capturing(h, r->handle)) continue; /* its blocks stay unsettled until the capture ends */
        if (!device_synced && stream_sync(h, r->handle) != CUA_SUCCESS) {
            /* A stream the driver will not synchronize (destroyed, or another device's): wait for
             * the whole device instead, once. */
            if (device_sync(h) != CUA_SUCCESS) continue; /* cannot prove it idle */
            device_synced = true;
        }
        stream_settle_synced(h, t);
    }
}

/* Has every piece of work queued so far on open tag t's stream completed? An event recorded on it
 * now, and queried: what settling the tag would prove. The tag's event is free while the tag is
 * open (stream_close records it again when it closes). False for a stream that captures, or that
 * no event can be recorded on. */
static bool stream_idle_now(heap_t *h, unsigned t) {
    stream_rec_t *r = &h->tags[t];
    if (stream_is_key(r->handle) || is_capturing(h, r->handle)) return false;
    if (!r->event && h->drv->event_create(h->dev, &r->event) != CUA_SUCCESS) return false;
    return h->drv->event_record(h->dev, r->event, r->handle) == CUA_SUCCESS &&
           h->drv->event_query(h->dev, r->event) == CUA_SUCCESS;
}

/* A search on stream tag `self` missed. Other streams' parked blocks are merged back before their
 * tags settle, and then carved again, one search and split at a time, into the blocks `self` asks
 * for: when streams take turns with the same shapes (each step's memory last freed on another
 * stream), every step paid that for all its small blocks. So first, the parked lists of each
 * other stream that is idle now (an event recorded on it after its frees has completed: what
 * settling it would prove) become self's own lists, unmerged. A stream still busy, one capturing,
 * or a list with nowhere to go is left to the flush. Returns true when a list was handed over. */
static bool quick_hand_over_idle(heap_t *h, unsigned self) {
    uint64_t asked = 0, idle = 0; /* the other tags looked at, and those found idle (tags are below 64) */
    bool moved = false;
    for (unsigned w = 0; w < QUICK_BUCKETS / 64; w++)
        for (uint64_t bits = h->quick_nonempty[w]; bits; bits &= bits - 1) {
            unsigned i = w * 64 + (unsigned)__builtin_ctzll(bits), t = quick_key_tag_of(h->quick[i].key);
            if (!h->quick[i].head || t == self) continue;
            if (!(asked >> t & 1)) {
                if (!asked && is_capturing(h, h->tags[self].handle)) return false;
                asked |= (uint64_t)1 << t;
                if (stream_idle_now(h, t)) idle |= (uint64_t)1 << t;
            }
            /* (A list moved to a later bucket has self's key there, and is skipped.) */
            if ((idle >> t & 1) && quick_retag(h, i, self)) {
                moved = true;
                h->quick_handed_over++;
            }
        }
    return moved;
}

/* The cheap way to find memory other streams freed: the parked lists of idle streams handed over
 * to self (quick_hand_over_idle); then, for each other stream holding free blocks, settle what its
 * completed event covers, and close its open generation (recording an event) when it holds blocks
 * no event covers. Returns true when something was settled or handed over. Never synchronizes.
 * Every other list is merged back first, as before any settling; self's stay parked when it was
 * handed some (it is not settled here). Only a large request can leave lists parked past this: a
 * small one comes here after alloc_search merged every list back, so the small pool never grows
 * while blocks are parked. */
static bool settle_completed(heap_t *h, unsigned self) {
    bool settled = false;
    if (h->vmm && quick_hand_over_idle(h, self)) {
        settled = true;
        quick_flush_others(h, self);
    } else {
        quick_flush(h);
    }
    if (dw_settle_completed(h)) settled = true;
    FOR_USED_STREAM_TAGS(h, t) {
        stream_rec_t *r = &h->tags[t];
        if (t == self || !open_tag_waiting(h, t)) continue;
        if (r->handle == DEVICE_WIDE_ALLOC_KEY) {
            /* No free names the key: its free blocks are memory mapped for device-wide requests
             * and never used, everyone's at once. */
            settle_tag(h, t);
            settled = true;
            continue;
        }
        if (is_capturing(h, r->handle)) continue;
        if (stream_settle_completed(h, t)) settled = true;
    }
    return settled;
}

/* ------------------------------------------------------------------ VMM physical memory */

static inline size_t chunk_index(const pool_t *p, uintptr_t addr) { return (addr - p->va_base) / p->chunk; }

/* Unmaps and releases chunks [first, first+n) of p (all mapped), stopping at the first chunk the
 * driver refuses to unmap, which stays mapped and counted. Returns how many were unmapped. A handle
 * that unmaps but will not release is kept for a later try (pending_release), so nothing leaks. */
static void retry_pending_releases(heap_t *h);

/* The small pool's by_granule slots of chunks [first, first + n), as whole pages: `outward` the
 * pages that hold any of them, else the pages that hold only them. */
static void granule_pages(const pool_t *p, size_t first, size_t n, bool outward, uintptr_t *lo, uintptr_t *hi) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), per_chunk = (p->chunk >> SMALL_GRANULE_SHIFT) * sizeof(block_t *);
    uintptr_t a = (uintptr_t)p->by_granule + first * per_chunk, b = a + n * per_chunk;
    *lo = outward ? align_down(a, page) : align_up(a, page);
    *hi = outward ? align_up(b, page) : align_down(b, page);
}

/* Chunks [first, first + n) of the small pool were mapped: their slots become writable (and, under
 * strict overcommit, charged). False when the kernel refuses. */
static bool granules_open(pool_t *p, size_t first, size_t n) {
    uintptr_t lo, hi;
    granule_pages(p, first, n, true, &lo, &hi);
    return mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) == 0;
}

/* Chunks [first, first + n) of the small pool were unmapped: the pages that hold only their slots
 * (all NULL: no block lies there) go back to the zero page, read-only. Pages shared with other
 * chunks stay as they are. */
static void granules_close(pool_t *p, size_t first, size_t n) {
    uintptr_t lo, hi;
    granule_pages(p, first, n, false, &lo, &hi);
    if (hi <= lo) return;
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
    mprotect((void *)lo, hi - lo, PROT_READ);
}

/* Releases the physical handle of a chunk of p that nothing maps (any longer). One the driver will
 * not release yet is kept for a later try (pending_release), so that nothing leaks. */
static void chunk_handle_release(heap_t *h, const pool_t *p, cua_memhandle handle) {
    cua_result r = h->drv->phys_release(h->dev, handle);
    if (r == CUA_SUCCESS) return;
    if (h->npending < HEAP_PENDING_RELEASES)
        h->pending_release[h->npending++] = handle;
    else
        cua_error("device %d: releasing a chunk failed (%s); %zu B are lost", h->dev, driver_error_name(r), p->chunk);
}

static size_t chunks_unmap(heap_t *h, pool_t *p, size_t first, size_t n) {
    size_t done = 0;
    for (; done < n; done++) {
        size_t i = first + done;
        uintptr_t va = p->va_base + i * p->chunk;
        cua_result r = h->drv->unmap(h->dev, va, p->chunk);
        if (r != CUA_SUCCESS) {
            cua_error("device %d: unmapping chunk at %#lx failed (%s); it stays mapped", h->dev, (unsigned long)va,
                      driver_error_name(r));
            break;
        }
        chunk_handle_release(h, p, p->chunks[i]);
        p->chunks[i] = 0;
    }
    if (done && p->id == POOL_SMALL) granules_close(p, first, done);
    p->mapped -= done * p->chunk;
    h->stats.reserved_bytes -= done * p->chunk;
    h->stats.num_unmaps += done;
    if (done && trace_enabled()) trace_on_unmap(h->dev, p->va_base + first * p->chunk, done * p->chunk);
    if (h->npending) retry_pending_releases(h);
    return done;
}

static void retry_pending_releases(heap_t *h) {
    size_t keep = 0;
    for (size_t i = 0; i < h->npending; i++)
        if (h->drv->phys_release(h->dev, h->pending_release[i]) != CUA_SUCCESS) h->pending_release[keep++] = h->pending_release[i];
    h->npending = keep;
}

/* The driver answered r to a call that creates or maps memory: grow_error's rule. */
static inline void grow_answer(heap_t *h, cua_result r) {
    h->grow_error = r == CUA_ERROR_OUT_OF_MEMORY ? CUA_SUCCESS : r;
}

/* Maps [addr, addr+len) (chunk-aligned, nothing mapped there) chunk by chunk, then grants access
 * with one call. All or nothing: on failure everything mapped here is undone and the driver's error
 * returned. */
static cua_result chunks_map(heap_t *h, pool_t *p, uintptr_t addr, size_t len) {
    size_t first = chunk_index(p, addr), n = len / p->chunk, done = 0;
    cua_result r = CUA_SUCCESS;
    for (; done < n; done++) {
        uintptr_t va = addr + done * p->chunk;
        cua_memhandle handle = 0;
        r = h->drv->phys_create(h->dev, p->chunk, &handle);
        if (r != CUA_SUCCESS) break;
        r = h->drv->map(h->dev, va, p->chunk, handle);
        if (r != CUA_SUCCESS) {
            chunk_handle_release(h, p, handle); /* (a refused release is kept and tried again) */
            break;
        }
        p->chunks[first + done] = handle;
    }
    if (r == CUA_SUCCESS) r = h->drv->set_access(h->dev, addr, len);
    grow_answer(h, r);
    if (r == CUA_SUCCESS && p->id == POOL_SMALL && !granules_open(p, first, n)) {
        h->host_refused = HOST_LIVE_MAP;
        r = CUA_ERROR_OUT_OF_MEMORY;
    }
    p->mapped += done * p->chunk;
    h->stats.reserved_bytes += done * p->chunk;
    h->stats.num_maps += done;
    /* Recorded even when set_access failed: the rollback below records the matching unmap. */
    if (done && trace_enabled()) trace_on_map(h->dev, addr, done * p->chunk);
    if (r != CUA_SUCCESS) {
        /* The caller marks the whole range unmapped again, so the rollback must leave nothing
         * mapped: an unmap the driver refuses is tried again (chunks_unmap stops at it). */
        size_t undone = 0;
        for (int tries = 0; undone < done && tries < 4; tries++) undone += chunks_unmap(h, p, first + undone, done - undone);
        if (undone < done)
            cua_error("device %d: %zu chunks of a failed map could not be unmapped; the heap's view of them is wrong "
                      "until the process ends", h->dev, done - undone);
        return r;
    }
    if (h->stats.reserved_bytes > h->stats.reserved_peak) h->stats.reserved_peak = h->stats.reserved_bytes;
    return CUA_SUCCESS;
}

/* Unmaps the chunk-aligned interior of FREE block b (tag ANY, or its stream synchronized by the
 * caller). Returns the last block of what b became, so a walk can go on from its `next`. */
static block_t *vmm_release_block(heap_t *h, pool_t *p, block_t *b) {
    uintptr_t lo = align_up(b->addr, p->chunk), hi = align_down(b->addr + b->size, p->chunk);
    if (hi <= lo) return b;
    /* Records for the pieces first, so a failure leaves b whole. An allocation that then fails
     * for want of the memory b holds failed for want of host memory (alloc_fail says which). */
    block_t *spare[2] = {slab_alloc(&h->blocks), slab_alloc(&h->blocks)};
    if (!spare[0] || !spare[1]) {
        slab_free(&h->blocks, spare[0]);
        slab_free(&h->blocks, spare[1]);
        h->host_refused = HOST_RECORDS;
        return b;
    }
    unsigned tag = b->tag;
    free_remove(h, p, b);
    size_t done = chunks_unmap(h, p, chunk_index(p, lo), (hi - lo) / p->chunk);
    if (done == 0) {
        free_insert(h, p, b);
        slab_free(&h->blocks, spare[0]);
        slab_free(&h->blocks, spare[1]);
        return b;
    }
    hi = lo + done * p->chunk; /* chunks past a refused unmap stay mapped, in the tail piece */
    /* b becomes [b.addr, lo) FREE + [lo, hi) UNMAPPED + [hi, end) FREE, the empty ones omitted. */
    block_t *mid = b, *last;
    if (lo > b->addr) {
        mid = spare[0];
        spare[0] = NULL;
        mid->addr = lo;
        mid->size = b->addr + b->size - lo;
        mid->pool = b->pool;
        mid->prev = b;
        mid->next = b->next;
        if (mid->next) mid->next->prev = mid;
        b->next = mid;
        b->size = lo - b->addr;
        free_insert(h, p, b); /* b keeps its tag */
    }
    mid->state = BLOCK_UNMAPPED;
    mid->tag = TAG_ANY;
    last = mid;
    if (hi < mid->addr + mid->size) {
        block_t *tail = spare[1];
        spare[1] = NULL;
        tail->addr = hi;
        tail->size = mid->addr + mid->size - hi;
        tail->pool = mid->pool;
        tail->state = BLOCK_FREE;
        tail->tag = (uint16_t)tag;
        tail->prev = mid;
        tail->next = mid->next;
        if (tail->next) tail->next->prev = tail;
        mid->next = tail;
        mid->size = hi - mid->addr;
        free_insert(h, p, tail);
        last = tail;
    }
    block_t *merged = coalesce_unmapped(h, p, mid);
    sizeclass_insert(&p->unmapped, merged);
    if (last == mid) last = merged;
    slab_free(&h->blocks, spare[0]);
    slab_free(&h->blocks, spare[1]);
    return last;
}

/* Unmaps free chunks of every pool, at least `target` bytes if there are that many (SIZE_MAX:
 * all). Streams are synchronized first (chunks may still be in use by their work). */
static size_t vmm_release(heap_t *h, size_t target) {
    settle_all(h);
    size_t before = h->stats.reserved_bytes;
    for (int pi = 0; pi < POOL_COUNT && before - h->stats.reserved_bytes < target; pi++) {
        pool_t *p = &h->pools[pi];
        for (block_t *b = p->segments; b && before - h->stats.reserved_bytes < target; b = b->next) {
            /* Only settled blocks: a stream that could not be synchronized may still use its own. */
            if (b->state == BLOCK_FREE && b->tag == TAG_ANY && block_releasable(h, p, b)) b = vmm_release_block(h, p, b);
        }
    }
    return before - h->stats.reserved_bytes;
}

/* Where to back more of pool p's address space for a request of rsize on `tag`: `len` bytes from
 * `at`, inside UNMAPPED block u. */
typedef struct grow_plan_s {
    block_t *u;
    uintptr_t at;
    size_t len;
} grow_plan_t;

/* The bytes of b when it is a FREE block that `tag` may merge with, else 0. */
static inline size_t free_neighbour_bytes(const block_t *b, unsigned tag) {
    return b && b->state == BLOCK_FREE && tags_compatible(b->tag, tag) ? b->size : 0;
}

/* The plan that maps the fewest new bytes. Every UNMAPPED range is a candidate together with the
 * compatible FREE blocks beside it (each too small alone, or the search would have found it):
 * mapping the range's start extends the free block before it, mapping its end the one after it,
 * mapping all of it joins both. Among plans of equal length the one whose block starts lowest wins,
 * so that memory stays packed at the bottom of the reservation. Growing into the best-fitting
 * unmapped range instead, whatever lies beside it, left the free blocks around it unused: replaying
 * the GPT-2-small variable-length snapshot step after step on a device just above its peak (24.6 to
 * 25.5 GB), every pass released cached memory and mapped about 1570 chunks again; growing this way,
 * the heap settles at 24378 MiB and maps nothing after a few passes. (PyTorch's expandable
 * segments grow likewise, from the free block before an unmapped range.)
 * Walks every UNMAPPED block: growth maps memory, whose driver calls cost far more. False when no
 * range is large enough. */
static bool grow_plan(const pool_t *p, unsigned tag, size_t rsize, grow_plan_t *best) {
    best->u = NULL;
    best->len = SIZE_MAX;
    uintptr_t best_start = UINTPTR_MAX;
    const sizeclass_t *sc = &p->unmapped;
    for (uint64_t fls = sc->fl_bitmap; fls; fls &= fls - 1) {
        unsigned fl = (unsigned)__builtin_ctzll(fls);
        for (uint32_t sls = sc->sl_bitmap[fl]; sls; sls &= sls - 1) {
            for (block_t *u = sc->bins[SC_BIN(fl, __builtin_ctz(sls))]; u; u = u->link.list.next_free) {
                size_t before = free_neighbour_bytes(u->prev, tag), after = free_neighbour_bytes(u->next, tag);
                if (before + u->size + after < rsize) continue;
                /* All of u by default; its start or its end alone where that is enough. Lengths
                 * are whole chunks (u's ends are chunk-aligned) and at least one. */
                uintptr_t at = u->addr;
                size_t len = u->size;
                if (before + u->size >= rsize) len = align_up(rsize > before ? rsize - before : 1, p->chunk);
                if (after + u->size >= rsize) {
                    size_t tail = align_up(rsize > after ? rsize - after : 1, p->chunk);
                    if (tail < len) {
                        len = tail;
                        at = u->addr + u->size - tail;
                    }
                }
                uintptr_t start = at == u->addr && before ? u->prev->addr : at;
                if (len < best->len || (len == best->len && start < best_start)) {
                    best->u = u;
                    best->at = at;
                    best->len = len;
                    best_start = start;
                }
            }
        }
    }
    return best->u != NULL;
}

/* Backs more of pool p's address space so that a request of rsize for `tag` fits (grow_plan), and
 * returns the resulting FREE block, merged with its compatible free neighbours. NULL when the cap,
 * the driver or the address space says no. */
static block_t *vmm_grow(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    grow_plan_t plan;
    if (!grow_plan(p, tag, rsize, &plan) || h->stats.reserved_bytes + plan.len > h->cap) return NULL;
    block_t *u = plan.u, *m = u;
    sizeclass_remove(&p->unmapped, u);
    if (plan.at > u->addr) {
        m = block_split(h, u, plan.at - u->addr, BLOCK_UNMAPPED, TAG_ANY);
        sizeclass_insert(&p->unmapped, u);
        if (!m) return NULL;
    }
    if (m->size > plan.len) {
        block_t *rest = block_split(h, m, plan.len, BLOCK_UNMAPPED, TAG_ANY);
        if (rest) sizeclass_insert(&p->unmapped, rest);
    }
    if (m->size != plan.len || chunks_map(h, p, m->addr, plan.len) != CUA_SUCCESS) {
        m = coalesce_unmapped(h, p, m);
        sizeclass_insert(&p->unmapped, m);
        return NULL;
    }
    /* Fresh memory has no work in flight; tagging it with the requesting stream keeps the
     * single-stream case to one index. (Not TAG_ANY even for a device-wide allocation, whose tag
     * settle_completed hands to everyone at once: merged with a neighbour, TAG_ANY memory takes
     * the neighbour's tag, and the allocation would then be carved from that neighbour.) */
    m->state = BLOCK_FREE;
    m->tag = (uint16_t)tag;
    m = coalesce_free(h, p, m);
    free_insert(h, p, m);
    return m;
}

/* ------------------------------------------------------------------ classic segments */

static size_t classic_segment_size(size_t rsize) {
    if (rsize <= CUALLOC_SMALL_MAX) return PT_SMALL_BUFFER;
    if (rsize < PT_MIN_LARGE_ALLOC) return PT_LARGE_BUFFER;
    return align_up(rsize, PT_ROUND_LARGE);
}

static void segment_link(pool_t *p, block_t *head) {
    head->seg_prev = NULL;
    head->seg_next = p->segments;
    if (p->segments) p->segments->seg_prev = head;
    p->segments = head;
}

static void segment_unlink(pool_t *p, block_t *head) {
    if (head->seg_prev) head->seg_prev->seg_next = head->seg_next;
    else p->segments = head->seg_next;
    if (head->seg_next) head->seg_next->seg_prev = head->seg_prev;
}

/* PyTorch's alloc_block: a new segment for the request, inserted FREE. */
static block_t *classic_alloc_segment(heap_t *h, pool_t *p, unsigned tag, size_t rsize, bool retry) {
    if (retry) h->stats.num_alloc_retries++;
    size_t size = classic_segment_size(rsize);
    if (h->stats.reserved_bytes + size > h->cap) return NULL;
    block_t *b = slab_alloc(&h->blocks);
    if (!b) {
        h->host_refused = HOST_RECORDS;
        return NULL;
    }
    cua_devptr ptr = 0;
    cua_result r = h->drv->mem_alloc(h->dev, size, &ptr);
    grow_answer(h, r);
    if (r != CUA_SUCCESS) {
        slab_free(&h->blocks, b);
        return NULL;
    }
    b->addr = (uintptr_t)ptr;
    b->size = size;
    b->pool = (uint8_t)p->id;
    b->state = BLOCK_FREE;
    b->tag = (uint16_t)tag;
    segment_link(p, b);
    p->mapped += size;
    h->stats.reserved_bytes += size;
    h->stats.num_maps++;
    if (h->stats.reserved_bytes > h->stats.reserved_peak) h->stats.reserved_peak = h->stats.reserved_bytes;
    if (trace_enabled()) trace_on_map(h->dev, b->addr, size);
    free_insert(h, p, b);
    return b;
}

/* PyTorch's release_block: frees a whole-segment FREE block. When the driver refuses, the segment
 * stays cached (and counted) and false is returned. Its callers release nothing while a capture
 * the heap knows of is in progress (asked once per release, not per segment): cuMemFree waits for
 * the device, and CUDA invalidates a global-mode capture on it (as on cuMemAlloc, which the CUDA
 * backend makes in relaxed mode); the segments stay cached until the capture ends. */
static bool classic_release_segment(heap_t *h, pool_t *p, block_t *b) {
    cua_result r = h->drv->mem_free(h->dev, (cua_devptr)b->addr);
    if (r != CUA_SUCCESS) {
        cua_error("device %d: freeing segment at %#lx failed (%s); it stays cached", h->dev, (unsigned long)b->addr,
                  driver_error_name(r));
        return false;
    }
    free_remove(h, p, b);
    segment_unlink(p, b);
    p->mapped -= b->size;
    h->stats.reserved_bytes -= b->size;
    h->stats.num_unmaps++;
    if (trace_enabled()) trace_on_unmap(h->dev, b->addr, b->size);
    slab_free(&h->blocks, b);
    return true;
}

/* PyTorch's release_cached_blocks: every wholly free segment of every pool and stream. cuMemFree
 * waits for the device itself, so no stream is synchronized here. */
static size_t classic_release_all(heap_t *h) {
    /* Device-wide frees go back to their segments' streams first, so that a segment they share
     * with that stream's free blocks is whole again. */
    dw_sync(h);
    if (capture_in_progress(h)) return 0; /* (classic_release_segment) */
    size_t before = h->stats.reserved_bytes;
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        block_t *next;
        for (block_t *b = p->segments; b; b = next) {
            next = b->seg_next;
            if (b->state == BLOCK_FREE && !b->next) classic_release_segment(h, p, b);
        }
    }
    return before - h->stats.reserved_bytes;
}

/* PyTorch's release_available_cached_blocks: with max_split_size set, free one oversize cached
 * block of the stream large enough for the request, or else the largest ones until enough. */
static bool classic_release_available(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    size_t max_split = h->conf.max_split_size;
    if (max_split == SIZE_MAX || !p->index[tag] || capture_in_progress(h)) return false; /* (classic_release_segment) */
    tree_t *t = &p->index[tag]->tree;
    size_t key = rsize < max_split ? max_split : rsize;
    block_t *b = tree_lower_bound(t, key);
    if (b) {
        if (b->prev || b->next) return false; /* oversize blocks are whole segments */
        return classic_release_segment(h, p, b);
    }
    size_t released = 0;
    while (released < key) {
        b = tree_largest(t);
        if (!b || b->size < max_split || b->prev || b->next) break;
        size_t size = b->size;
        if (!classic_release_segment(h, p, b)) break;
        released += size;
    }
    return released >= key;
}

/* PyTorch's garbage_collect_cached_blocks: above garbage_collection_threshold of the cap, free the
 * wholly free large segments that have waited longest (unused through more free-block searches than
 * the average), round after round, until under the threshold. */
static void classic_garbage_collect(heap_t *h) {
    size_t threshold = (size_t)(h->conf.garbage_collection_threshold * (double)h->cap);
    if (h->stats.reserved_bytes <= threshold || capture_in_progress(h)) return; /* (classic_release_segment) */
    size_t target = h->stats.reserved_bytes - threshold, reclaimed = 0;
    pool_t *p = &h->pools[POOL_LARGE];
    double total_age = 0;
    size_t freeable = 0;
    for (block_t *b = p->segments; b; b = b->seg_next) {
        if (b->state == BLOCK_FREE && !b->next) {
            total_age += (double)(uint32_t)(p->free_block_searches - b->gc_base);
            freeable++;
        }
    }
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
        double age_threshold = total_age / (double)freeable;
        freed = false;
        block_t *next;
        for (block_t *b = p->segments; b; b = next) {
            next = b->seg_next;
            if (b->state != BLOCK_FREE || b->next) continue;
            double age = (double)(uint32_t)(p->free_block_searches - b->gc_base);
            size_t size = b->size;
            if (age >= age_threshold && classic_release_segment(h, p, b)) {
                freed = true;
                reclaimed += size;
                total_age -= age;
                freeable--;
            }
        }
    }
}

/* ------------------------------------------------------------------ allocation */

/* VMM: the closer fit of the tag's own index and the settled (TAG_ANY) one, which exists from
 * heap_create on. */
static inline __attribute__((always_inline)) block_t *find_free_vmm(pool_t *p, unsigned tag, size_t rsize) {
    findex_t *own = p->index[tag], *any = p->index[TAG_ANY];
    block_t *a = own ? sizeclass_find(&own->sc, rsize) : NULL;
    block_t *b = any->sc.count ? sizeclass_find(&any->sc, rsize) : NULL;
    if (!a) return b;
    return (b && b->size < a->size) ? b : a;
}

/* find_free_vmm for the fast paths, for a tag that names a stream (so its index exists: slot_claim
 * made it), without the out-of-line part of the search: SC_FIND_CUT where it would be needed. */
static inline __attribute__((always_inline)) block_t *find_free_vmm_uncut(pool_t *p, unsigned tag, size_t rsize) {
    const findex_t *own = p->index[tag], *any = p->index[TAG_ANY];
    block_t *a = sizeclass_find_uncut(&own->sc, rsize);
    block_t *b = any->sc.count ? sizeclass_find_uncut(&any->sc, rsize) : NULL;
    if (__builtin_expect(a == SC_FIND_CUT || b == SC_FIND_CUT, 0)) return SC_FIND_CUT;
    if (!a) return b;
    return (b && b->size < a->size) ? b : a;
}

static block_t *find_free(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    if (h->vmm) return find_free_vmm(p, tag, rsize);
    /* PyTorch's get_free_block, including its refusals under max_split_size. */
    findex_t *ix = p->index[tag];
    p->free_block_searches++;
    block_t *b = ix ? tree_lower_bound(&ix->tree, rsize) : NULL;
    if (!b) return NULL;
    size_t max_split = h->conf.max_split_size;
    if (rsize < max_split && b->size >= max_split) return NULL;
    if (rsize >= max_split && b->size >= rsize + PT_LARGE_BUFFER) return NULL;
    return b;
}

/* Before the heap maps new memory: when the pool holds device-wide frees, they are waited for (one
 * device synchronize, which cudaFree itself makes on every call) rather than left pending while the
 * heap grows past them. Any amount counts, not only a request's worth: settled, they merge with
 * their free neighbours. (Waiting only for as much as the request let PyTorch without its cache
 * reserve 2.2 times its peak on an H100: bench/RESULTS.md.) */
static block_t *dw_wait_fit(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    if (!pool_dw_free_bytes(h, p)) return NULL;
    dw_sync(h);
    return find_free(h, p, tag, rsize);
}

static block_t *alloc_slow_vmm(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    block_t *b;
    /* The stream's closed generation is its own to reuse at once, like its open one. */
    unsigned closed = h->tags[tag].partner;
    if (closed && (b = sizeclass_find(&p->index[closed]->sc, rsize))) return b;
    if (settle_completed(h, tag) && (b = find_free(h, p, tag, rsize))) return b;
    if ((b = dw_wait_fit(h, p, tag, rsize))) return b;
    if (h->conf.garbage_collection_threshold > 0) {
        /* Growing past the threshold: return cached chunks first (PyTorch's GC, for chunks). */
        size_t threshold = (size_t)(h->conf.garbage_collection_threshold * (double)h->cap);
        size_t need = align_up(rsize, p->chunk);
        if (h->stats.reserved_bytes + need > threshold && vmm_release(h, h->stats.reserved_bytes + need - threshold) &&
            (b = find_free(h, p, tag, rsize)))
            return b;
    }
    if ((b = vmm_grow(h, p, tag, rsize)) || (b = find_free(h, p, tag, rsize))) return b;
    /* Pressure: synchronize, settle everything, and look again before unmapping anything. */
    h->stats.num_alloc_retries++;
    settle_all(h);
    if ((b = find_free(h, p, tag, rsize))) return b;
    vmm_release(h, SIZE_MAX);
    if ((b = find_free(h, p, tag, rsize))) return b;
    return vmm_grow(h, p, tag, rsize);
}

/* PyTorch's malloc after a failed get_free_block: GC, new segment, release oversize blocks and
 * retry, release every cached segment and retry. */
static block_t *alloc_slow_classic(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    block_t *b;
    if ((b = dw_wait_fit(h, p, tag, rsize))) return b;
    if (h->conf.garbage_collection_threshold > 0) classic_garbage_collect(h);
    if ((b = classic_alloc_segment(h, p, tag, rsize, false))) return b;
    if (classic_release_available(h, p, tag, rsize) && (b = classic_alloc_segment(h, p, tag, rsize, false))) return b;
    classic_release_all(h);
    return classic_alloc_segment(h, p, tag, rsize, true);
}

static bool should_split(const heap_t *h, const pool_t *p, size_t block_size, size_t rsize) {
    size_t remaining = block_size - rsize;
    if (h->vmm || p->id == POOL_SMALL) return remaining >= CUALLOC_ALIGN;
    return rsize < h->conf.max_split_size && remaining > CUALLOC_SMALL_MAX;
}

/* Where an operation ends: inactive_split_bytes is current (the accounting keeps it so); its peak. */
static inline void update_inactive_split(heap_t *h) {
    if (h->stats.inactive_split_bytes > h->stats.inactive_split_peak) h->stats.inactive_split_peak = h->stats.inactive_split_bytes;
}

static size_t largest_free_locked(heap_t *h) {
    size_t best = 0;
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        for (unsigned t = 0; t < HEAP_MAX_TAGS; t++) {
            findex_t *ix = h->pools[pi].index[t];
            if (!ix) continue;
            block_t *b = h->vmm ? sizeclass_largest(&ix->sc) : tree_largest(&ix->tree);
            if (b && b->size > best) best = b->size;
        }
    }
    for (unsigned i = 0; i < QUICK_BUCKETS; i++)
        if (h->quick[i].head && h->quick[i].head->size > best) best = h->quick[i].head->size;
    return best;
}

/* The device's free and total memory now (cuMemGetInfo); false, both 0, when the driver cannot
 * tell. */
static bool device_free_now(const heap_t *h, size_t *dfree, size_t *dtotal) {
    if (h->drv->mem_get_info(h->dev, dfree, dtotal) == CUA_SUCCESS) return true;
    *dfree = *dtotal = 0;
    return false;
}

/* Classic: the size of the largest large-pool segment holding a live block smaller than itself
 * (more than one block: after the release that precedes an OOM no segment is wholly free), 0
 * when none. For oom_max_split_mb. Lock held. */
static size_t classic_largest_split_segment(const heap_t *h) {
    size_t best = 0;
    for (const block_t *seg = h->pools[POOL_LARGE].segments; seg; seg = seg->seg_next) {
        if (!seg->next) continue;
        size_t size = 0;
        for (const block_t *b = seg; b; b = b->next) size += b->size;
        if (size > best) best = size;
    }
    return best;
}

/* What live memory must do when no allocator setting can help: the training-side fixes of the
 * OOM ladder, in cost order. */
#define OOM_LIVE_FIXES                                                                              \
    "reduce the batch size and keep the effective batch with gradient accumulation; then bf16/fp16 " \
    "mixed precision if not already used; then activation checkpointing; then offloading or sharding " \
    "(FSDP / ZeRO)"

/* Free blocks that wait for their streams after the settling that precedes an OOM: device-wide
 * frees, and with expandable segments the stream tags' blocks (classic segments keep a stream's free
 * blocks in its tag by design, as PyTorch's do). settle_all synchronized every stream it could, so
 * these belong to streams it could not, a capturing one (or device-wide frees, with a capture in
 * progress anywhere the heap knows), or one the driver refused. Only those of the request's pool
 * count: the other pool's, in chunks or segments that live blocks share, may never serve it. When
 * the request fits in them plus the device's free memory, and not in what the heap holds beyond
 * the live blocks without them plus the device's free memory, that is the cause: writes the
 * diagnosis and returns true. Lock held. */
static bool oom_frees_waiting_text(heap_t *h, size_t rsize, size_t allocated, size_t reserved, size_t dfree, char *text,
                                   size_t len) {
    const pool_t *p = &h->pools[rsize <= CUALLOC_SMALL_MAX ? POOL_SMALL : POOL_LARGE];
    size_t waiting = pool_dw_free_bytes(h, p);
    for (unsigned t = 1; h->vmm && t < TAG_STREAMS_END; t++) waiting += pool_tag_free_bytes(h, p, t);
    size_t unused = reserved - allocated;
    if (!waiting || waiting > unused || (uint64_t)waiting + dfree < rsize || unused - waiting + (uint64_t)dfree >= rsize)
        return false;
    bool capture = capture_in_progress(h);
    char alloc[32], cap[32], wait[32];
    fmt_bytes(allocated, alloc, sizeof alloc);
    fmt_bytes(h->cap, cap, sizeof cap);
    fmt_bytes(waiting, wait, sizeof wait);
    if (capture) {
        snprintf(text, len,
                 "freed memory waiting for a CUDA graph capture — live blocks (%s) plus this request fit in %s and in "
                 "what this heap holds plus the device's free memory, but %s of what it holds was freed on streams it "
                 "cannot synchronize while a capture is in progress on this device (device-wide frees, cudaFree's, "
                 "wait for a device synchronize, which would invalidate the capture; frees on a capturing stream "
                 "wait for its capture to end); that memory is reused once the capture ends. First fix: free (or "
                 "allocate) that memory before the capture begins, or free it with cudaFreeAsync on a stream that is "
                 "not captured, whose own events let it be reused.",
                 alloc, cap, wait);
    } else {
        snprintf(text, len,
                 "freed memory not yet reusable — live blocks (%s) plus this request fit in %s and in what this heap "
                 "holds plus the device's free memory, but %s of what it holds was freed on streams the driver would "
                 "not synchronize (a stream in an error state, or destroyed with work pending); that memory is reused "
                 "once the device is seen past it. First fix: check the CUDA errors of the streams that freed it.",
                 alloc, cap, wait);
    }
    return true;
}

/* The diagnosis of a request of rsize bytes that found no memory, by oom.c's rule, written to
 * `text` as the sentence that follows "diagnosis: " in the report, with the first fix of the OOM
 * ladder that applies:
 *   shortage (live blocks + the request exceed the cap) and a full device (they fit under the cap
 *     but not in what the heap holds plus the device's free memory): the training-side fixes in
 *     cost order, since no allocator setting can help; a full device names what holds the rest;
 *     a shortage against a configured cap that the device has room beyond names the key to raise;
 *   fragmentation: the allocator's own fixes, free of cost — expandable segments, a lower
 *     max_split_size_mb where it would have kept a carved segment whole (oom_classic_fixes; VMM
 *     mode: the address space, va_factor), or, when the device refused memory the cap allows,
 *     what holds it; where none applies, the training-side fixes.
 * dknown: the driver told dfree and dtotal. *vmm (when not NULL): why expandable segments failed
 * a request the rule calls fragmentation (oom_vmm_failure), else 0 — what the trace records. Lock
 * held. */
static oom_kind_t oom_diagnose(heap_t *h, size_t rsize, size_t dfree, size_t dtotal, bool dknown, char *text,
                               size_t len, unsigned *vmm) {
    if (vmm) *vmm = 0;
    size_t allocated = h->stats.allocated_bytes, reserved = h->stats.reserved_bytes;
    char req[32], cap[32], alloc[32], devfree[32], excess[32], held[32], outside[32], total[32];
    fmt_bytes(h->cap, cap, sizeof cap);
    fmt_bytes(allocated, alloc, sizeof alloc);
    fmt_bytes(dfree, devfree, sizeof devfree);
    oom_kind_t kind = oom_classify(rsize, h->cap, allocated, reserved, dknown ? dfree : UINT64_MAX);
    /* A cap configured below the device's memory is a setting: where the device itself has room
     * for the live blocks and the request (what the heap holds plus what the device reports free,
     * or the whole device when the driver does not say), raising the cap fixes the shortage. */
    uint64_t device_room = dknown ? oom_room(reserved, dfree) : h->total;
    bool cap_only = oom_cap_reached(rsize, h->cap, h->total, allocated, device_room);
    const char *cap_key = oom_cap_key(h->conf.max_memory, h->cap); /* (when the cap is below the device's memory) */
    if (cap_only) {
        snprintf(text, len,
                 "the configured cap is reached — live blocks (%s) plus this request need %s more than the cap of "
                 "%s that %s sets, but the device has room for them (of its %s, it reports %s free besides the %s "
                 "this heap holds). First fix: raise %s if this process may use more of the device; else " OOM_LIVE_FIXES
                 ".",
                 alloc, fmt_bytes(oom_missing(rsize, allocated, h->cap), excess, sizeof excess), cap, cap_key,
                 fmt_bytes(h->total, total, sizeof total), dknown ? devfree : "(unknown)",
                 fmt_bytes(reserved, held, sizeof held), cap_key);
    } else if (kind == OOM_SHORTAGE) {
        snprintf(text, len,
                 "genuine shortage — live blocks (%s) plus this request need %s more than the cap of %s; no allocator "
                 "setting can fix that. First fix: " OOM_LIVE_FIXES ".",
                 alloc, fmt_bytes(oom_missing(rsize, allocated, h->cap), excess, sizeof excess), cap);
    } else if (kind == OOM_DEVICE_FULL) {
        uint64_t room = oom_room(reserved, dfree);
        size_t elsewhere = dtotal > room ? dtotal - room : 0;
        snprintf(text, len,
                 "the device is full, not fragmented — live blocks (%s) plus this request fit in the cap of %s, but "
                 "not in the %s this heap holds plus the %s the device reports free: %s of the device's %s is held "
                 "outside this heap (other processes, other allocators in this one, the CUDA context and "
                 "libraries). No setting of this heap can fix that. First fix: free what holds that memory; else "
                 "live memory must shrink by %s: " OOM_LIVE_FIXES ". Setting max_memory_mb to what this process "
                 "can have makes the cap say so.",
                 alloc, cap, fmt_bytes(reserved, held, sizeof held), devfree,
                 fmt_bytes(elsewhere, outside, sizeof outside), fmt_bytes(dtotal, total, sizeof total),
                 fmt_bytes(oom_missing(rsize, allocated, room), excess, sizeof excess));
    } else if (oom_frees_waiting_text(h, rsize, allocated, reserved, dknown ? dfree : 0, text, len)) {
        if (vmm) *vmm = OOM_VMM_WAITING;
    } else {
        const pool_t *p = &h->pools[rsize <= CUALLOC_SMALL_MAX ? POOL_SMALL : POOL_LARGE];
        size_t need = h->vmm ? align_up(rsize, p->chunk) : 0;
        /* sizeclass_find: a free range of the address space for the new chunks */
        oom_vmm_failure_t why =
            h->vmm ? oom_vmm_failure(need, reserved, h->cap, sizeclass_find(&p->unmapped, need) != NULL) : 0;
        if (vmm) *vmm = why;
        if (why == OOM_VMM_REFUSED) {
            snprintf(text, len,
                     "the device refused more memory — the heap's cap would allow it, but creating or mapping %s "
                     "failed and the device reports %s free. Other processes (or other allocators in this one) "
                     "hold the rest: free them, or lower per_process_memory_fraction / max_memory_mb so that the "
                     "cap matches what this process can have.",
                     fmt_bytes(need, req, sizeof req), devfree);
        } else if (why == OOM_VMM_CHUNKS) {
            /* The cap is reached at chunk granularity (whether or not address space was free).
             * Everything cached was released before this report, so what is reserved beyond the
             * live blocks lies in chunks that live blocks share. Chunks larger than the device's granularity
             * (chunk_size_mb) are what makes the granularity coarse. They are the large pool's,
             * whichever pool the request is for: a small request also fails when the large pool's
             * partly used chunks leave no room for a small-pool chunk. */
            char partial[32], chunk[32], needs[32];
            const pool_t *lp = &h->pools[POOL_LARGE];
            size_t coarse = lp->chunk > h->granularity ? lp->chunk : p->chunk;
            char fix[256];
            oom_chunks_fix(fix, sizeof fix, lp->chunk, h->granularity, h->cap < h->total ? cap_key : NULL,
                           oom_missing(need, reserved, device_room) == 0, dknown ? devfree : "(unknown)");
            snprintf(text, len,
                     "shortage at chunk granularity — live blocks (%s) plus this request fit in %s, but memory is "
                     "mapped in whole chunks of %s and live blocks keep %s in partly used chunks; this request "
                     "needs %s of new chunks. First fix: %s.",
                     alloc, cap, fmt_bytes(coarse, chunk, sizeof chunk),
                     fmt_bytes(reserved - allocated, partial, sizeof partial), fmt_bytes(need, needs, sizeof needs),
                     fix);
        } else if (why == OOM_VMM_ADDRESS_SPACE) {
            char fix[128];
            oom_address_space_fix(fix, sizeof fix, h->conf.va_factor);
            snprintf(text, len,
                     "fragmentation of the address space — live blocks (%s) plus this request fit in %s, but no "
                     "free range of the reserved address space is large enough. First fix: %s.",
                     alloc, cap, fix);
        } else {
            /* The allocator's own fixes that could change this (oom_classic_fixes): expandable
             * segments unless asked for already (they fell back here: the device has no VMM), a
             * max_split_size_mb that would have kept the largest carved segment whole. */
            char fixes[512];
            int nfix = oom_classic_fixes(fixes, sizeof fixes, rsize, classic_largest_split_segment(h),
                                         h->conf.max_split_size, h->conf.expandable_segments, false);
            snprintf(text, len,
                     "fragmentation — live blocks (%s) plus this request fit in %s, but the cached free memory is "
                     "split into pieces smaller than the request.%s %s%s%s%s.",
                     alloc, cap,
                     h->conf.expandable_segments ? " (Expandable segments are asked for, but this device has no "
                                                   "virtual memory management, so its segments are classic.)"
                                                 : "",
                     nfix ? "First fix (free): " : "No setting of this heap can fix that (", fixes,
                     nfix ? "" : "). First fix: ", nfix ? "" : OOM_LIVE_FIXES);
        }
    }
    return kind;
}

/* The OOM report (DESIGN.md decision 10), in the spirit of PyTorch's message: the figures, then
 * the diagnosis (oom_diagnose), which stays in h->oom_text for cualloc_oom_message. One report per
 * distinct situation (power-of-two bucket of the request, diagnosis kind and reason) per heap; the first
 * repeat says once that further ones are only counted (num_ooms). Returns the diagnosis's
 * vmm_failure (oom_diagnose), reported or not. Lock held. */
static unsigned report_oom(heap_t *h, size_t size, size_t rsize, size_t dfree, size_t dtotal, bool dknown) {
    unsigned vmm;
    uint8_t kind = (uint8_t)oom_diagnose(h, rsize, dfree, dtotal, dknown, h->oom_text, sizeof h->oom_text, &vmm);
    uint8_t bucket = (uint8_t)(rsize ? floor_log2(rsize) : 0);
    for (unsigned i = 0; i < h->n_oom_seen; i++) {
        if (h->oom_seen[i].bucket == bucket && h->oom_seen[i].kind == kind && h->oom_seen[i].vmm == vmm) {
            if (!h->oom_suppressed_said) {
                h->oom_suppressed_said = true;
                cua_error("device %d: out of memory again in a situation already reported; further ones are not "
                          "reported, only counted in num_ooms (cualloc_get_stats)",
                          h->dev);
            }
            return vmm;
        }
    }
    if (h->n_oom_seen < HEAP_OOM_KINDS) {
        h->oom_seen[h->n_oom_seen].bucket = bucket;
        h->oom_seen[h->n_oom_seen].kind = kind;
        h->oom_seen[h->n_oom_seen].vmm = (uint8_t)vmm;
        h->n_oom_seen++;
    } else {
        return vmm; /* that many distinct reports already: enough */
    }
    h->oom_reports++;
    size_t allocated = h->stats.allocated_bytes, reserved = h->stats.reserved_bytes;
    char req[32], cap[32], alloc[32], cached[32], largest[32], devfree[32];
    cua_error("device %d: out of memory: tried to allocate %s (%zu B requested); the heap may use %s (its cap); "
              "%s is allocated by live blocks, %s is reserved but unallocated (largest free block %s); the "
              "device reports %s free.",
              h->dev, fmt_bytes(rsize, req, sizeof req), size, fmt_bytes(h->cap, cap, sizeof cap),
              fmt_bytes(allocated, alloc, sizeof alloc), fmt_bytes(reserved - allocated, cached, sizeof cached),
              fmt_bytes(largest_free_locked(h), largest, sizeof largest),
              dknown ? fmt_bytes(dfree, devfree, sizeof devfree) : "(unknown: the driver did not say)");
    cua_error("device %d: diagnosis: %s", h->dev, h->oom_text);
    return vmm;
}

/* The front `size` bytes of b become a new record before it, in state `state`, tag `tag`, in no
 * index; b keeps the rest (its addr and size are the caller's to change). NULL when no record
 * could be had. Not for a segment's first block (b->prev must exist: see block_t). */
static inline __attribute__((always_inline)) block_t *block_split_front(heap_t *h, block_t *b, size_t size, uint8_t state,
                                                                       unsigned tag) {
    return block_new(h, b->addr, size, b->prev, b, state, tag, b->pool);
}

/* Takes the front `rsize` bytes of FREE block b, found for them, out of the free index; returns the
 * block that holds them (in no index). The rest, if it is to be split off, stays there as a FREE
 * block of the same tag: in VMM mode b's own record, resized in place (unless b heads its
 * segment), else a new one. NULL when the split gets no record (host memory: h->host_refused),
 * b then in its index as before: the allocation fails rather than hold all of b, however large. */
static inline __attribute__((always_inline)) block_t *block_take(heap_t *h, pool_t *p, block_t *b, size_t rsize,
                                                                bool vmm /* h->vmm, constant where the caller knows it */) {
    if (vmm && b->size - rsize >= CUALLOC_ALIGN && b->prev) {
        block_t *f = block_split_front(h, b, rsize, BLOCK_FREE, b->tag);
        if (__builtin_expect(f != NULL, 1)) free_resize(h, p, b, b->addr + rsize, b->size - rsize);
        return f;
    }
    free_remove_in(h, p, b, vmm);
    if (should_split(h, p, b->size, rsize)) {
        block_t *rest = block_split(h, b, rsize, BLOCK_FREE, b->tag);
        if (__builtin_expect(!rest, 0)) {
            free_insert_in(h, p, b, vmm);
            return NULL;
        }
        free_insert_in(h, p, rest, vmm);
    }
    return b;
}

/* The slow part of an allocation: flush the quick lists, search, grow or release; then carve the
 * block. Returns the ALLOCATED-to-be block (in no index) or NULL. */
static block_t *alloc_search(heap_t *h, pool_t *p, unsigned tag, size_t rsize) {
    block_t *b = find_free(h, p, tag, rsize);
    if (!b && p->id == POOL_SMALL && quick_any(h)) {
        /* Parked blocks (small pool only) are merged back before the heap grows, so they never
         * cost physical memory: as many lists as it takes, then all. */
        if (quick_flush_small(h, tag, rsize, true)) b = find_free(h, p, tag, rsize);
        if (!b && quick_flush_small(h, tag, rsize, false)) b = find_free(h, p, tag, rsize);
    }
    if (!b) {
        b = h->vmm ? alloc_slow_vmm(h, p, tag, rsize) : alloc_slow_classic(h, p, tag, rsize);
        if (!b) return NULL;
        /* Memory was found: a driver error on the way fails nothing (where the block then cannot
         * be carved or entered, host memory is what failed). */
        h->grow_error = CUA_SUCCESS;
    }
    return block_take(h, p, b, rsize, h->vmm);
}

/* An allocation failed because host memory was refused for h->host_refused: said once per kind of
 * table, and not as the device running out (it has room; the device diagnosis would send the user
 * to the wrong fix). Not recorded as an OOM event either, for the same reason. */
static void report_host_refused(heap_t *h, size_t size) {
    unsigned bit = 1u << h->host_refused;
    snprintf(h->oom_text, sizeof h->oom_text,
             "not the device — host memory ran out for cualloc's own bookkeeping (%s). " CUA_HOST_MEMORY_FIX ".",
             host_table_names[h->host_refused]);
    if (!(h->host_refused_said & bit)) {
        h->host_refused_said |= bit;
        char req[32];
        cua_error("device %d: cannot allocate %s: host memory ran out for cualloc's own bookkeeping (%s), not "
                  "device memory. " CUA_HOST_MEMORY_FIX "; later failures of this kind are only counted in num_ooms",
                  h->dev, fmt_bytes(size, req, sizeof req), host_table_names[h->host_refused]);
    }
    h->host_refused = HOST_NONE;
}

/* The failed allocation's result, for heap_alloc (the pointer alone cannot say it). */
static _Thread_local cua_result alloc_fail_result;

/* No tag could be had for `stream`, and not for want of host memory: every stream slot belongs to a
 * stream whose free blocks cannot settle now (capturing a CUDA graph, so nothing may synchronize
 * it, or its synchronize failed; in classic mode, free blocks in a segment shared with live ones).
 * An allocation needs its stream's tag: memory the heap maps for it merges with a free neighbour
 * and takes that block's tag, which then names who may use it. Counted in num_ooms and said once,
 * but not as the device running out (it has room) and not recorded as an OOM. Lock held; released
 * here. */
static __attribute__((noinline, cold)) void alloc_fail_no_slot(heap_t *h, cua_stream stream, size_t size) {
    h->stats.num_ooms++;
    alloc_fail_result = CUA_ERROR_OUT_OF_MEMORY;
    h->last_fail_error = CUA_SUCCESS;
    /* Classic mode keeps a segment to one stream, so there a stream holding part of a segment
     * keeps its slot; in VMM mode only a stream that cannot settle does. */
    const char *why = h->vmm ? "whose freed memory cannot be reused yet (they are capturing CUDA graphs, or could "
                               "not be synchronized)"
                             : "that hold cached memory in segments shared with their live blocks (classic mode keeps "
                               "each segment to one stream)";
    const char *fix = h->vmm ? "End those captures, or capture on fewer streams at once"
                             : "Use expandable segments (the default: remove expandable_segments:False), or allocate "
                               "on fewer streams at once";
    snprintf(h->oom_text, sizeof h->oom_text,
             "not the device — all %d of cualloc's stream slots belong to streams %s. %s.", TAG_STREAMS_END - 1, why,
             fix);
    if (!h->no_slot_said) {
        h->no_slot_said = true;
        char req[32];
        cua_error("device %d: cannot allocate %s on stream %p: all %d of cualloc's stream slots belong to streams "
                  "%s; the device itself has room. %s; later failures of this kind are only counted in num_ooms",
                  h->dev, fmt_bytes(size, req, sizeof req), (void *)stream, TAG_STREAMS_END - 1, why, fix);
    }
    update_inactive_split(h);
    cua_unlock(&h->lock);
}

/* The latest attempt to create or map memory failed with a driver error that is not out of
 * memory (h->grow_error): the allocation failed for it. Said once per error, not per call (a
 * context left unusable fails every later one the same way). Lock held; released here. */
static __attribute__((noinline, cold)) cua_result alloc_fail_driver(heap_t *h, cua_stream stream, size_t size,
                                                                    size_t rsize) {
    cua_result r = h->grow_error;
    h->grow_error = CUA_SUCCESS;
    h->host_refused = HOST_NONE;
    h->last_fail_error = r;
    char req[32];
    fmt_bytes(size, req, sizeof req);
    snprintf(h->oom_text, sizeof h->oom_text,
             "not a shortage of memory — the driver failed with %s (%d) while %s memory for this request. An "
             "earlier error, such as a kernel's illegal memory access or a failed launch, leaves the CUDA "
             "context unusable, and every later call fails with it: find the first failing call (run with "
             "CUDA_LAUNCH_BLOCKING=1, or under compute-sanitizer). No memory setting applies.",
             driver_error_name(r), (int)r, h->vmm ? "creating or mapping" : "allocating");
    if (h->grow_error_said != r) {
        h->grow_error_said = r;
        cua_error("device %d: cannot allocate %s on stream %p: %s Later failures with this error are only counted "
                  "in num_ooms", h->dev, req, (void *)stream, h->oom_text);
    }
    if (trace_enabled())
        trace_on_oom(h->dev, stream, size, rsize, h->cap, h->stats.allocated_bytes, h->stats.reserved_bytes, 0,
                     largest_free_locked(h), CUA_TRACE_VMM_DRIVER_ERROR);
    update_inactive_split(h);
    cua_unlock(&h->lock);
    return alloc_fail_result = r;
}

/* Lock held; released here. */
static cua_result alloc_fail(heap_t *h, cua_stream stream, size_t size, size_t rsize) {
    h->stats.num_ooms++;
    alloc_fail_result = CUA_ERROR_OUT_OF_MEMORY;
    /* The driver's last answer to a growth was an error: that is the cause, even where a release
     * or a later attempt was refused host memory, which would not have helped. */
    if (h->grow_error != CUA_SUCCESS) return alloc_fail_driver(h, stream, size, rsize);
    h->last_fail_error = CUA_SUCCESS;
    if (h->host_refused != HOST_NONE) {
        h->host_refusals++;
        report_host_refused(h, size);
        update_inactive_split(h);
        cua_unlock(&h->lock);
        return CUA_ERROR_OUT_OF_MEMORY;
    }
    size_t dfree, dtotal;
    bool dknown = device_free_now(h, &dfree, &dtotal);
    /* The trace records what the report's diagnosis says of expandable segments, which the
     * recorded figures cannot tell (the address space, the chunks, or the device). */
    unsigned vmm = report_oom(h, size, rsize, dfree, dtotal, dknown);
    if (trace_enabled())
        trace_on_oom(h->dev, stream, size, rsize, h->cap, h->stats.allocated_bytes, h->stats.reserved_bytes, dfree,
                     largest_free_locked(h), vmm);
    update_inactive_split(h);
    cua_unlock(&h->lock);
    return CUA_ERROR_OUT_OF_MEMORY;
}

/* b (`bytes` long) becomes ALLOCATED for `size` requested bytes on `stream`: its record and the
 * heap's statistics with their peaks. Shared by the fast path and alloc_finish. */
static inline __attribute__((always_inline)) void account_alloc(heap_t *h, block_t *b, size_t bytes, size_t size,
                                                                cua_stream stream) {
    b->state = BLOCK_ALLOCATED;
    b->requested = size;
    b->stream = stream;
    cualloc_stats *s = &h->stats;
    s->num_allocs++;
    s->requested_bytes += size;
    if (s->requested_bytes > s->requested_peak) s->requested_peak = s->requested_bytes;
    s->allocated_bytes += bytes;
    if (s->allocated_bytes > s->allocated_peak) s->allocated_peak = s->allocated_bytes;
}

/* The statistics of freeing ALLOCATED block b (`bytes` long); its record is the caller's. Shared by
 * the fast path and free_locked. */
static inline __attribute__((always_inline)) void account_free(heap_t *h, const block_t *b, size_t bytes) {
    cualloc_stats *s = &h->stats;
    s->num_frees++;
    s->requested_bytes -= b->requested;
    s->allocated_bytes -= bytes;
}

/* A free on `tag` (a stream's open one, or the open device-wide one): the block tagged. (Its
 * `requested` is left as it is: only ALLOCATED blocks have one.) */
static inline __attribute__((always_inline)) void free_tag(block_t *b, unsigned tag) {
    b->tag = (uint16_t)tag;
}

/* classic_live could not grow to take b (block_take'n for the request): b goes back, and the
 * allocation fails. Lock held; released here. */
static __attribute__((noinline, cold)) void alloc_untake(heap_t *h, pool_t *p, block_t *b, cua_stream stream, size_t size,
                                                         size_t rsize) {
    h->host_refused = HOST_LIVE_MAP;
    b->state = BLOCK_FREE;
    b = coalesce_free(h, p, b);
    free_insert(h, p, b);
    alloc_fail(h, stream, size, rsize);
}

/* An allocation the quick lists did not serve: search, grow or release, then enter the block in
 * the live map (live_insert). Returns the block, or NULL after
 * alloc_fail (which unlocks). Part of alloc_after_miss, its only caller (out of line, so that
 * the hit path stays short): one call frame for the whole miss. */
static inline __attribute__((always_inline)) block_t *alloc_miss(heap_t *h, pool_t *p, cua_stream stream, unsigned tag,
                                                                 size_t size, size_t rsize) {
    block_t *b = alloc_search(h, p, tag, rsize);
    if (!b) {
        alloc_fail(h, stream, size, rsize);
        return NULL;
    }
    if (__builtin_expect(!live_insert(h, b), 0)) {
        alloc_untake(h, p, b, stream, size, rsize);
        return NULL;
    }
    return b;
}

/* Every allocation heap_malloc's fast path does not serve. Lock held; released on return. The
 * pointer, or NULL (out of memory, reported). */
static void *alloc_after_miss(heap_t *h, pool_t *p, cua_stream stream, unsigned tag, size_t size, size_t rsize);
static inline void *alloc_finish(heap_t *h, pool_t *p, block_t *b, cua_stream stream, size_t size);

/* cudaStreamPerThread (CU_STREAM_PER_THREAD) names the calling thread's own default stream, a
 * different stream in each thread: the heap cannot order blocks by the handle as one stream (a block
 * one thread freed on it would go at once to another thread's allocation on it, whose work does not
 * follow the first's). As the LD_PRELOAD front door does for cudaMalloc's callers (interpose.c), an
 * allocation on it takes a key of the calling thread's (no driver call is ever made on it), and a
 * free on it is device-wide: reused once an event on the legacy stream, which every thread's
 * default stream (a blocking stream) precedes, has completed. The handle never enters tag_of's
 * cache, so the fast paths, which serve only the cached stream, send it here and to free_locked. */
#define STREAM_PER_THREAD_HANDLE ((cua_stream)(uintptr_t)0x2)
static __thread char per_thread_stream_name;

static __attribute__((noinline)) void *alloc_locked(heap_t *h, size_t size, cua_stream stream) {
    recording_check(h);
    if (__builtin_expect(stream == STREAM_PER_THREAD_HANDLE, 0)) stream = stream_key_make(&per_thread_stream_name);
    /* Before any failure: a trim or a free may have left host_refused set (a release or a stream's
     * index refused host memory), which alloc_fail would blame for this request. */
    h->host_refused = HOST_NONE;
    h->grow_error = CUA_SUCCESS;
    size_t rsize = h->plain_rounding && size - 1 < HEAP_MAX_REQUEST ? (size + CUALLOC_ALIGN - 1) & ~(size_t)(CUALLOC_ALIGN - 1)
                                                                   : heap_round_size(&h->conf, size);
    if (__builtin_expect(rsize == 0 || rsize > HEAP_MAX_REQUEST, 0)) {
        alloc_fail(h, stream, size, size);
        return NULL;
    }
    pool_t *p = &h->pools[rsize <= CUALLOC_SMALL_MAX ? POOL_SMALL : POOL_LARGE];
    unsigned tag = tag_of(h, stream);
    if (__builtin_expect(tag >= HEAP_MAX_TAGS, 0)) {
        if (h->host_refused == HOST_NONE) alloc_fail_no_slot(h, stream, size);
        else alloc_fail(h, stream, size, rsize);
        return NULL;
    }
    block_t *b = h->vmm && p->id == POOL_SMALL ? quick_pop(h, rsize, tag) : NULL;
    if (!b) return alloc_after_miss(h, p, stream, tag, size, rsize);
    return alloc_finish(h, p, b, stream, size);
}

/* alloc_locked after the quick lists missed (heap_malloc's fast path comes here directly). */
static __attribute__((noinline)) void *alloc_after_miss(heap_t *h, pool_t *p, cua_stream stream, unsigned tag,
                                                        size_t size, size_t rsize) {
    h->host_refused = HOST_NONE;
    h->grow_error = CUA_SUCCESS;
    block_t *b = alloc_miss(h, p, stream, tag, size, rsize);
    return b ? alloc_finish(h, p, b, stream, size) : NULL;
}

/* The end of every allocation but the fast path's hit: b becomes ALLOCATED; accounting, the
 * recorder, unlock. */
static inline void *alloc_finish(heap_t *h, pool_t *p, block_t *b, cua_stream stream, size_t size) {
    account_alloc(h, b, b->size, size, stream);
    update_inactive_split(h);
    if (trace_enabled()) trace_on_alloc(h->dev, stream, b->addr, b->size, size);
    cua_unlock(&h->lock);
    return (void *)b->addr;
}

static __attribute__((noinline, cold)) void *unlock_wake_ptr(heap_t *h, void *ret);

/* The end of the fast paths' allocations, block a accounted (account_alloc): its live entry, the
 * peak, unlock. */
static inline __attribute__((always_inline)) void *alloc_fast_finish(heap_t *h, pool_id_t pool, block_t *a) {
    *granule_slot(h, pool, a->addr) = a;
    update_inactive_split(h);
    void *ptr = (void *)a->addr;
    if (__builtin_expect(cua_unlock_nowake(&h->lock), 0)) return unlock_wake_ptr(h, ptr);
    return ptr;
}

/* heap_malloc's fast path past the quick lists: the small pool's misses, and the large allocations
 * alloc_large_fast does not serve itself (large blocks are never parked). What alloc_after_miss
 * does when the free indexes hold a fitting block, for the fast path's case (VMM, 512 B rounding,
 * the previous call's stream, not recording), without its general checks and calls: a search cut
 * short (sizeclass_find_cut), a block that heads its segment (block_take splits it from the back),
 * no record at hand (slab_alloc_at_hand) and no fit at all (flush, grow, release) go there, which
 * searches again (nothing has changed meanwhile, so it finds the same block). Its only calls are
 * tail calls: no call returns to it. One body, compiled per pool (`pool` a constant). Lock held;
 * released on return. */
static inline __attribute__((always_inline)) void *alloc_indexed_fast(heap_t *h, pool_id_t pool, size_t size, size_t rsize,
                                                                     cua_stream stream) {
    pool_t *p = &h->pools[pool];
    unsigned tag = h->last_tag;
    block_t *b = find_free_vmm_uncut(p, tag, rsize), *a;
    if (__builtin_expect(!b || b == SC_FIND_CUT, 0)) return alloc_after_miss(h, p, stream, tag, size, rsize);
    if (__builtin_expect(b->size == rsize, 0)) {
        free_remove_in(h, p, b, true); /* an exact fit: block_take takes b whole */
        a = b;
    } else {
        /* block_take's split: the front becomes a new record, b keeps the rest. */
        block_t *prev = b->prev;
        if (__builtin_expect(!prev, 0) || __builtin_expect(!(a = slab_alloc_at_hand(&h->blocks)), 0))
            return alloc_after_miss(h, p, stream, tag, size, rsize);
        uintptr_t addr = b->addr;
        free_resize(h, p, b, addr + rsize, b->size - rsize);
        block_init(a, addr, rsize, prev, b, BLOCK_FREE, b->tag, (uint8_t)pool);
        prev->next = a;
        b->prev = a;
    }
    account_alloc(h, a, rsize, size, stream);
    return alloc_fast_finish(h, pool, a);
}

static __attribute__((noinline)) void *alloc_large_indexed(heap_t *h, size_t size, size_t rsize, cua_stream stream) {
    return alloc_indexed_fast(h, POOL_LARGE, size, rsize, stream);
}

/* heap_malloc's large allocations. When the tag's index holds one block and the settled one none
 * (a training step's large remainder), that block is what find_free_vmm would find if it fits,
 * and it has the index to itself (sizeclass_resize_only): it is carved here, without a search;
 * everything else is alloc_indexed_fast's (a tail call: this path keeps few values, so that it
 * saves few registers). */
static __attribute__((noinline)) void *alloc_large_fast(heap_t *h, size_t size, size_t rsize, cua_stream stream) {
    pool_t *p = &h->pools[POOL_LARGE];
    findex_t *own = p->index[h->last_tag];
    if (own->sc.count != 1 || p->index[TAG_ANY]->sc.count) return alloc_large_indexed(h, size, rsize, stream);
    block_t *b = sizeclass_only(&own->sc), *r, *a;
    if (__builtin_expect(b->size <= rsize, 0) || __builtin_expect(!(r = slab_alloc_at_hand(&h->blocks)), 0))
        return alloc_large_indexed(h, size, rsize, stream);
    uintptr_t addr = b->addr;
    size_t rest = b->size - rsize;
    block_t *prev = b->prev;
    if (__builtin_expect(prev != NULL, 1)) {
        /* block_take's split: the front becomes the new record, b keeps the rest. */
        /* (The new record is accounted first: the request's size and stream are then done with.) */
        a = r;
        block_init(a, addr, rsize, prev, b, BLOCK_FREE, b->tag, POOL_LARGE);
        account_alloc(h, a, rsize, size, stream);
        prev->next = a;
        b->prev = a;
        free_resize_in(h, p, b, addr + rsize, rest, true);
    } else {
        /* b heads its segment, whose first record stays with it (block_t): block_take splits the
         * rest off into the new record, which takes b's place as the index's only block (as b's
         * size and releasable bytes, then resized: the accounting of removing b and inserting the
         * rest). */
        a = b;
        block_init(r, addr + rsize, b->size, b, b->next, BLOCK_FREE, b->tag, POOL_LARGE);
        r->releasable = b->releasable;
        r->bin = b->bin;
        r->gc_base = p->free_block_searches;
        own->sc.bins[b->bin] = r;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = rsize;
        free_resize_in(h, p, r, addr + rsize, rest, true);
        account_alloc(h, a, rsize, size, stream);
    }
    return alloc_fast_finish(h, POOL_LARGE, a);
}

static __attribute__((noinline)) void *alloc_small_fast_miss(heap_t *h, size_t size, size_t rsize, cua_stream stream) {
    return alloc_indexed_fast(h, POOL_SMALL, size, rsize, stream);
}

/* The fast paths' unlock when a waiter sleeps: wakes it and returns what the fast path would
 * have. Out of line and reached by tail calls, as the contended lock (heap_malloc_contended,
 * heap_free_contended): the fast paths then make no call that returns to them, and the compiler
 * gives them no stack frame (no registers saved and restored). */
static __attribute__((noinline, cold)) void *unlock_wake_ptr(heap_t *h, void *ret) {
    cua_wake(&h->lock);
    return ret;
}

static __attribute__((noinline, cold)) bool unlock_wake_true(heap_t *h) {
    cua_wake(&h->lock);
    return true;
}

/* The fast path (DESIGN: the allocation a training step repeats): 512 B rounding, the stream of
 * the previous call, a block of exactly that size parked for that stream, not recording. It does
 * what alloc_locked would do for that case and nothing else; everything else goes there. Taking a
 * parked block only lowers inactive_split_bytes, so its peak needs no update here. Lock held;
 * released on return. */
static inline __attribute__((always_inline)) void *heap_malloc_locked(heap_t *h, size_t size, cua_stream stream) {
    if (__builtin_expect(stream == h->fast_alloc_stream, 1)) {
        /* One comparison admits 1 .. CUALLOC_SMALL_MAX bytes: a size of 0 rounds to 0, and one
         * within 511 of SIZE_MAX wraps to 0 too. */
        size_t rsize = (size + CUALLOC_ALIGN - 1) & ~(size_t)(CUALLOC_ALIGN - 1);
        if (__builtin_expect(rsize - 1 >= CUALLOC_SMALL_MAX, 0)) {
            if (size - 1 < HEAP_MAX_REQUEST) return alloc_large_fast(h, size, rsize, stream);
            return alloc_locked(h, size, stream);
        }
        block_t *b = quick_pop_keyed(h, rsize, rsize | h->last_tag_key, quick_index_hashed(rsize, h->last_tag_hash));
        if (__builtin_expect(b != NULL, 1)) {
            account_alloc(h, b, rsize, size, stream);
            void *ptr = (void *)b->addr;
            if (__builtin_expect(cua_unlock_nowake(&h->lock), 0)) return unlock_wake_ptr(h, ptr);
            return ptr;
        }
        return alloc_small_fast_miss(h, size, rsize, stream);
    }
    return alloc_locked(h, size, stream);
}

static __attribute__((noinline, cold)) void *heap_malloc_contended(heap_t *h, size_t size, cua_stream stream) {
    cua_lock(&h->lock);
    return heap_malloc_locked(h, size, stream);
}

void *heap_malloc(heap_t *h, size_t size, cua_stream stream) {
    if (__builtin_expect(!cua_trylock(&h->lock), 0)) return heap_malloc_contended(h, size, stream);
    return heap_malloc_locked(h, size, stream);
}

cua_result heap_alloc(heap_t *h, size_t size, cua_stream stream, void **out) {
    *out = heap_malloc(h, size, stream);
    return *out ? CUA_SUCCESS : alloc_fail_result;
}

const char heap_device_wide_alloc_name;

static void legacy_sync_for_nonblocking(heap_t *h);

/* Lock held. May a non-blocking stream exist (one the front door reported, or one it lost)? */
static bool nonblocking_streams(const heap_t *h) { return h->n_nb > 0 || h->nb_overflow; }

/* Lock held. A classic-mode block of the legacy stream's freed where the legacy stream's earlier
 * work may still use it (on the legacy stream itself, or on a blocking stream, whose work follows
 * that work without waiting for it): cudaMalloc takes the legacy stream's blocks, and its memory
 * may serve a non-blocking stream, which does not wait for the legacy stream. True: free it
 * device-wide (one exists); else the first one created synchronizes the legacy stream. */
static bool legacy_free_device_wide(heap_t *h) {
    if (nonblocking_streams(h)) return true;
    h->legacy_handed_out = true;
    return false;
}

cua_result heap_alloc_device_wide(heap_t *h, size_t size, void **out) {
    /* Decided under the lock: a non-blocking stream created meanwhile (its synchronize of the
     * legacy stream made) and a legacy free after it must not meet a choice made before. */
    cua_lock(&h->lock);
    bool nb = nonblocking_streams(h);
    cua_stream as = NULL;
    if (nb && h->vmm) {
        as = DEVICE_WIDE_ALLOC_KEY;
    } else if (!nb) {
        /* As the legacy stream: a block it freed may still be in use by its work, which a
         * non-blocking stream created later would not wait for (heap_stream_created). */
        h->legacy_handed_out = true;
    } else if (h->legacy_handed_out) {
        /* Classic mode, as the legacy stream, whose free blocks may still be in use by its work
         * from before a non-blocking stream was created without the synchronize that should have
         * followed (a capture, a refusal): made now where it can be; else the request takes a
         * segment of its own under the key, which no legacy free reached. */
        legacy_sync_for_nonblocking(h);
        if (h->legacy_handed_out) as = DEVICE_WIDE_ALLOC_KEY;
    }
    *out = heap_malloc_locked(h, size, as);
    return *out ? CUA_SUCCESS : alloc_fail_result;
}

/* A just-freed block (tag final, no longer live_get's) goes into its index, merged with its
 * neighbours. `vmm`: h->vmm, a constant where the caller knows it (free_insert_in). */
static inline __attribute__((always_inline)) void free_into_index(heap_t *h, pool_t *p, block_t *b, bool vmm) {
    b->state = BLOCK_FREE;
    if (vmm) {
        (void)coalesce_insert_vmm(h, p, b);
        return;
    }
    b = coalesce_free_inline(h, p, b, false);
    free_insert_in(h, p, b, false);
}

/* The same for a block live_get still finds. */
static __attribute__((noinline)) void free_to_index(heap_t *h, pool_t *p, block_t *b) {
    live_remove(h, b);
    free_into_index(h, p, b, h->vmm);
}

/* A free on `tag`, or, when the stream has no tag (tag == HEAP_MAX_TAGS: the table is full even
 * after recycling), made safe for every stream the slow way: its stream is synchronized and the
 * block settled. A stream that cannot be synchronized (capturing, or the driver refuses) leaves the
 * block in the open device-wide generation instead, to be reused once the device is seen past it,
 * never at once. Into the free index. */
static void free_on_tag(heap_t *h, pool_t *p, block_t *b, cua_stream stream, unsigned tag) {
    if (tag >= HEAP_MAX_TAGS) {
        b->tag = !is_capturing(h, stream) && stream_sync(h, stream) == CUA_SUCCESS ? TAG_ANY : h->dw_open;
    } else {
        free_tag(b, tag);
    }
    free_to_index(h, p, b);
}

/* When the device runs far behind the host, a program that frees device-wide all the time keeps
 * much of its memory waiting: the searches cannot use it, take other free blocks and map more, and
 * the heap fragments. Replaying GPT-2 small's requests with every free device-wide and the device
 * completing work only every 513 requests, cualloc reserved 20.7 GiB for a 12.1 GiB peak (13.3 GiB
 * with this bound: bench/RESULTS.md, "Device-wide frees while the device runs behind"). So once
 * pool p's waiting bytes pass 1/DW_PENDING_DIV of its mapped bytes, the host waits for the older,
 * closed generation (recorded some time ago, so the device is usually past most of it), which then
 * settles, and the open one closes. */
static void dw_bound_pending(heap_t *h, pool_t *p) {
    if (pool_dw_free_bytes(h, p) <= p->mapped / DW_PENDING_DIV || !dw_wait_closed(h)) return;
    dw_settle_completed(h);
}

/* Is `stream` a non-blocking stream the heap was told of? */
static bool nb_listed(const heap_t *h, cua_stream stream) {
    for (unsigned i = 0; i < h->n_nb; i++)
        if (h->nb[i].handle == stream) return true;
    return false;
}

/* The frees that never park: device-wide ones, and all of classic mode. Accounting done. */
static __attribute__((noinline)) void free_unparked(heap_t *h, pool_t *p, block_t *b, cua_stream stream, bool device_wide) {
    if (device_wide) {
        /* Not reusable by anyone until the legacy stream and every non-blocking stream have
         * passed the free (seen in their events, or by a device synchronize); never quick-listed. */
        free_tag(b, h->dw_open);
        free_to_index(h, p, b);
        /* Every DW_CHECK_EVERY-th such free looks at the events (and records new ones), so that
         * blocks settle about as soon as the device has passed them, not only when an allocation
         * misses: until then the searches do not see them, take other free blocks, and the heap
         * fragments and grows (replaying GPT-2 small's requests with every free device-wide, it
         * reserved twice its peak). */
        if (++h->dw_frees_unchecked >= DW_CHECK_EVERY) {
            h->dw_frees_unchecked = 0;
            dw_settle_completed(h);
            dw_bound_pending(h, p);
        }
        return;
    }
    if (!h->vmm && stream != b->stream && !is_capturing(h, stream)) {
        /* Classic mode keeps PyTorch's rule that a segment serves one stream: the block returns to
         * its allocation stream, which may reuse it only after the freeing stream's work. When
         * that stream cannot be synchronized, the block waits device-wide first (a settled
         * device-wide block returns to its allocation stream: settle_tag). */
        /* The legacy stream's block freed on a blocking stream: that stream's synchronize below
         * does not cover the legacy stream's earlier work. */
        if (!b->stream && !nb_listed(h, stream) && legacy_free_device_wide(h)) {
            free_unparked(h, p, b, NULL, true);
            return;
        }
        if (stream_sync(h, stream) != CUA_SUCCESS) {
            free_tag(b, h->dw_open);
            free_to_index(h, p, b);
            return;
        }
        stream = b->stream;
    }
    free_on_tag(h, p, b, stream, tag_of(h, stream));
}

/* Every free heap_free's fast path does not serve. Lock held; released here. b: the live-map entry
 * at ptr, NULL when none. False (nothing done) when b is not an ALLOCATED block. */
static __attribute__((noinline)) bool free_locked(heap_t *h, block_t *b, cua_stream stream, bool device_wide) {
    recording_check(h);
    if (!b || b->state != BLOCK_ALLOCATED) { /* not ours, or parked (freed already) */
        cua_unlock(&h->lock);
        return false;
    }
    if (__builtin_expect(stream == STREAM_PER_THREAD_HANDLE, 0)) { /* (see alloc_locked) */
        stream = NULL;
        device_wide = true;
    }
    pool_t *p = &h->pools[b->pool];
    account_free(h, b, b->size);
    if (trace_enabled()) trace_on_free(h->dev, stream, b->addr, b->size, b->requested);
    if (device_wide || !h->vmm) {
        free_unparked(h, p, b, stream, device_wide);
    } else {
        unsigned tag = tag_of(h, stream);
        if (tag >= HEAP_MAX_TAGS) {
            free_on_tag(h, p, b, stream, tag);
        } else {
            free_tag(b, tag);
            if (!quick_push(h, b)) free_to_index(h, p, b); /* parked: keeps its entry */
        }
    }
    update_inactive_split(h);
    cua_unlock(&h->lock);
    return true;
}

/* heap_free's fast path in the large pool, whose blocks are never parked: what free_locked does for
 * the fast path's case (VMM, an ALLOCATED block, the previous call's stream, not recording)
 * without its general checks and calls. `slot`: b's in by_granule. Lock held; released on return. */
static __attribute__((noinline)) bool free_large_fast(heap_t *h, block_t *b, block_t **slot) {
    pool_t *p = &h->pools[POOL_LARGE];
    unsigned tag = h->last_tag;
    account_free(h, b, b->size);
    *slot = NULL;
    block_t *pr = b->prev, *n = b->next;
    if (n && n->state == BLOCK_FREE && n->tag == tag && pr && pr->state != BLOCK_FREE && p->index[tag]->sc.count == 1) {
        /* coalesce_insert_vmm's merge into the upper neighbour, which is its index's only block (a
         * training step's large remainder, merged back): resized by sizeclass_resize_only. */
        pr->next = n;
        n->prev = pr;
        free_resize_in(h, p, n, b->addr, b->size + n->size, true);
        slab_free(&h->blocks, b);
    } else {
        free_tag(b, tag);
        free_into_index(h, p, b, true); /* (the fast stream is VMM's) */
    }
    update_inactive_split(h);
    if (__builtin_expect(cua_unlock_nowake(&h->lock), 0)) return unlock_wake_true(h);
    return true;
}

/* free_locked for heap_free_in_small_pool and _large_pool: a pointer it does not hold is reported. */
static __attribute__((noinline)) bool free_locked_or_report(heap_t *h, block_t *b, cua_stream stream, void *ptr) {
    if (free_locked(h, b, stream, false)) return true;
    cua_error("cualloc_free: %p was not allocated by cualloc (or was already freed); ignored", ptr);
    return false;
}

/* Where heap_free_locked's caller found the pointer: in one of the pools' reservations, or not
 * looked (the heap finds out). */
typedef enum { FREE_IN_SMALL = POOL_SMALL, FREE_IN_LARGE = POOL_LARGE, FREE_ANYWHERE } free_where_t;

/* The fast path: a VMM free of an allocated block on the stream of the previous call, whose quick
 * list has room (or that lies in the large pool), not recording. What free_locked would do for
 * that case and nothing else; everything else goes there. Lock held; released on return.
 * `report` and `where`: constants where inlined. */
static inline __attribute__((always_inline)) bool heap_free_locked(heap_t *h, void *ptr, cua_stream stream, bool report,
                                                                   free_where_t where) {
    uintptr_t a = (uintptr_t)ptr;
    block_t *b;
    if (where == FREE_IN_LARGE || (where == FREE_ANYWHERE && __builtin_expect(in_pool_va(h, POOL_LARGE, a), 0))) {
        block_t **slot = granule_slot(h, POOL_LARGE, a);
        b = slot_get(slot, a);
        if (__builtin_expect(b && stream == h->fast_free_stream, 1)) return free_large_fast(h, b, slot);
        return report ? free_locked_or_report(h, b, stream, ptr) : free_locked(h, b, stream, false);
    }
    if (where == FREE_IN_SMALL || in_pool_va(h, POOL_SMALL, a)) b = slot_get(granule_slot(h, POOL_SMALL, a), a);
    else b = live_get(h, a); /* classic mode, or not this heap's */
    if (__builtin_expect(b && b->state == BLOCK_ALLOCATED && stream == h->fast_free_stream, 1)) {
        unsigned tag = h->last_tag;
        size_t size = b->size;
        uint64_t key = size | h->last_tag_key;
        /* The list the block was parked on last is the likely one: a key that matches there names
         * the right bucket (keys are set only on their own bucket, and stay when it empties), so
         * no hash is needed, and the list is empty or holds that key: its count decides. */
        unsigned i = b->quick_hint;
        quick_t *q = &h->quick[i];
        bool hinted = q->key == key, room;
        if (__builtin_expect(hinted, 1)) {
            room = q->count < QUICK_DEPTH;
        } else {
            i = quick_index_hashed(size, h->last_tag_hash);
            room = quick_room(&h->quick[i], key);
        }
        if (__builtin_expect(room, 1)) {
            /* (b is the small pool's: the fast stream is VMM's, and b is not large) */
            account_free(h, b, size);
            free_tag(b, tag);
            if (__builtin_expect(hinted, 1)) quick_link(h, b, size, q); /* keeps its slot */
            else quick_park(h, b, size, i, key);
            update_inactive_split(h);
            if (__builtin_expect(cua_unlock_nowake(&h->lock), 0)) return unlock_wake_true(h);
            return true;
        }
    }
    return report ? free_locked_or_report(h, b, stream, ptr) : free_locked(h, b, stream, false);
}

static __attribute__((noinline, cold)) bool heap_free_contended(heap_t *h, void *ptr, cua_stream stream, bool report) {
    cua_lock(&h->lock);
    return heap_free_locked(h, ptr, stream, report, FREE_ANYWHERE);
}

bool heap_free(heap_t *h, void *ptr, cua_stream stream) {
    if (__builtin_expect(!cua_trylock(&h->lock), 0)) return heap_free_contended(h, ptr, stream, false);
    return heap_free_locked(h, ptr, stream, false, FREE_ANYWHERE);
}

void heap_free_in_small_pool(heap_t *h, void *ptr, cua_stream stream) {
    if (__builtin_expect(!cua_trylock(&h->lock), 0)) {
        heap_free_contended(h, ptr, stream, true);
        return;
    }
    heap_free_locked(h, ptr, stream, true, FREE_IN_SMALL);
}

void heap_free_in_large_pool(heap_t *h, void *ptr, cua_stream stream) {
    if (__builtin_expect(!cua_trylock(&h->lock), 0)) {
        heap_free_contended(h, ptr, stream, true);
        return;
    }
    heap_free_locked(h, ptr, stream, true, FREE_IN_LARGE);
}

bool heap_free_device_wide(heap_t *h, void *ptr) {
    cua_lock(&h->lock);
    /* Device-wide even with no non-blocking stream known: the legacy stream orders the blocking
     * streams before it, not the blocking streams (nor threads' per-thread streams) among
     * themselves, and the block's next cudaMalloc may serve any of them. The legacy stream's event
     * alone then covers the group. */
    return free_locked(h, live_get(h, (uintptr_t)ptr), NULL, true);
}

bool heap_free_on_legacy(heap_t *h, void *ptr) {
    if (h->vmm) return heap_free(h, ptr, NULL); /* device-wide allocations take no legacy block at once */
    cua_lock(&h->lock);
    return free_locked(h, live_get(h, (uintptr_t)ptr), NULL, legacy_free_device_wide(h));
}

/* ------------------------------------------------------------------ lifecycle */

static cua_result pool_init_vmm(heap_t *h, pool_t *p, size_t chunk, size_t va_size) {
    p->chunk = chunk;
    p->chunk_mask = chunk - 1;
    p->va_size = align_up(va_size, chunk);
    p->nchunks = p->va_size / chunk;
    size_t table = align_up(p->nchunks * sizeof(cua_memhandle), 4096);
    void *mem = mmap(NULL, table, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        h->host_refused = HOST_CHUNK_TABLES;
        return CUA_ERROR_HOST_MEMORY;
    }
    p->chunks = mem;
    /* The small pool's slots open as its chunks are mapped (granules_open). */
    int prot = p->id == POOL_LARGE ? PROT_READ | PROT_WRITE : PROT_READ;
    mem = mmap(NULL, by_granule_bytes(p), prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        h->host_refused = HOST_CHUNK_TABLES;
        return CUA_ERROR_HOST_MEMORY;
    }
    p->by_granule = mem;
    cua_devptr va = 0;
    cua_result r = h->drv->va_reserve(h->dev, p->va_size, chunk, &va);
    if (r != CUA_SUCCESS) return r;
    p->va_base = (uintptr_t)va;
    block_t *all = slab_alloc(&h->blocks);
    if (!all) {
        /* heap_destroy gives a pool's reservation back with its segment, which this one lacks */
        h->drv->va_free(h->dev, va, p->va_size);
        p->va_base = 0;
        h->host_refused = HOST_RECORDS;
        return CUA_ERROR_HOST_MEMORY;
    }
    all->addr = p->va_base;
    all->size = p->va_size;
    all->pool = (uint8_t)p->id;
    all->state = BLOCK_UNMAPPED;
    segment_link(p, all);
    sizeclass_insert(&p->unmapped, all);
    return CUA_SUCCESS;
}

/* Devices whose heap could not be set up for want of host memory, told so since the last set-up
 * that succeeded: the front door tries again at each of the device's allocations (a shortage may
 * pass), and the user hears of it once. */
static _Atomic bool setup_host_said[CUALLOC_MAX_DEVICES];

/* The heap could not be set up because host memory was refused for `what`: said as host memory,
 * not as the device (which has room), with the fix. */
static void report_setup_host_refused(int dev, const char *what) {
    if (dev >= 0 && dev < CUALLOC_MAX_DEVICES && atomic_exchange(&setup_host_said[dev], true)) return;
    cua_error("device %d: cannot set up the heap: host memory ran out for cualloc's own bookkeeping (%s), not "
              "device memory. " CUA_HOST_MEMORY_FIX ". Until then the device's allocations fail (under LD_PRELOAD "
              "they go to CUDA's own allocator); cualloc tries the set-up again at each of them",
              dev, what);
}

/* The heap record itself: mmap'd like all metadata, except in sanitizer builds, where it comes from
 * calloc so that LeakSanitizer scans it and sees the block records it reaches. */
static void *heap_mem_alloc(void) {
#ifdef CUALLOC_SLAB_MALLOC
    return calloc(1, sizeof(heap_t));
#else
    void *mem = mmap(NULL, sizeof(heap_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return mem == MAP_FAILED ? NULL : mem;
#endif
}

static void heap_mem_free(heap_t *h) {
#ifdef CUALLOC_SLAB_MALLOC
    free(h);
#else
    munmap(h, sizeof(heap_t));
#endif
}

heap_t *heap_create(int dev, const conf_t *conf, const driver_ops_t *drv, cua_result *err) {
    driver_device_info_t info;
    cua_result r = drv->device_info(dev, &info);
    if (r != CUA_SUCCESS) {
        if (err) *err = r;
        cua_error("device %d: cannot query the device (%s)", dev, driver_error_name(r));
        return NULL;
    }
    void *mem = heap_mem_alloc();
    if (!mem) {
        if (err) *err = CUA_ERROR_HOST_MEMORY;
        report_setup_host_refused(dev, "the heap record");
        return NULL;
    }
    heap_t *h = mem;
    cua_lock_init(&h->lock);
    h->dev = dev;
    h->conf = *conf;
    h->drv = drv;
    h->total = info.total_bytes;
    h->granularity = info.granularity ? info.granularity : 2 * MiB;
    h->cap = conf_capacity(conf, info.total_bytes);
    h->stats.capacity_bytes = h->cap;
    h->vmm = conf->expandable_segments && info.vmm_supported;
    h->plain_rounding = true;
    for (int i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
        if (conf->roundup_power2_divisions[i] > 1) h->plain_rounding = false;
    h->fast_alloc = h->plain_rounding && h->vmm;
    h->recording = trace_enabled(); /* heaps are made, and recorders started, under one lock (api.c) */
    last_set(h, NO_STREAM, 0);
    slab_init(&h->blocks, sizeof(block_t));
    h->tags_used = UINT64_C(1) << TAG_ANY | UINT64_C(1) << TAG_DW_A | UINT64_C(1) << TAG_DW_B;
    h->tags[TAG_DW_A].handle = h->tags[TAG_DW_B].handle = DW_HANDLE;
    h->dw_open = TAG_DW_A;
    if (!h->vmm && !ptrmap_init(&h->classic_live)) {
        h->host_refused = HOST_LIVE_MAP;
        r = CUA_ERROR_HOST_MEMORY;
    }
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        h->pools[pi].id = (pool_id_t)pi;
        sizeclass_init(&h->pools[pi].unmapped);
    }
    for (int pi = 0; pi < POOL_COUNT && r == CUA_SUCCESS; pi++)
        if (!index_get(h, &h->pools[pi], TAG_ANY) || !index_get(h, &h->pools[pi], TAG_DW_A) ||
            !index_get(h, &h->pools[pi], TAG_DW_B))
            r = CUA_ERROR_HOST_MEMORY; /* (index_get set host_refused) */
    if (r == CUA_SUCCESS && h->vmm) {
        /* Chunks are a power-of-two multiple of the granularity: the reservation is aligned to them
         * and chunk arithmetic on the fast path is a mask. */
        uint64_t wanted;
        size_t large_chunk = oom_vmm_large_chunk(h->granularity, conf->chunk_size, h->cap, &wanted);
        if (large_chunk < wanted) {
            /* A chunk larger than the cap could never be mapped: every large allocation would fail.
             * The largest chunk that fits serves instead, and the user is told. */
            char want[32], cap[32], got[32];
            fmt_bytes(wanted, want, sizeof want);
            cua_error("device %d: chunk_size_mb asks for chunks of %s, more than the heap may use (%s, its cap); "
                      "using chunks of %s. Set chunk_size_mb to at most %zu, or 0 for the device's granularity",
                      dev, want, fmt_bytes(h->cap, cap, sizeof cap), fmt_bytes(large_chunk, got, sizeof got),
                      large_chunk / MiB);
        }
        size_t factor = conf->va_factor >= 2 ? conf->va_factor : 2;
        /* The small pool's chunks are larger than its blocks, so that no parked block holds a
         * whole chunk (quick_account). The granularity of every CUDA device is 2 MiB already;
         * only the sim device may have less. */
        size_t small_chunk = oom_vmm_small_chunk(h->granularity);
        r = pool_init_vmm(h, &h->pools[POOL_SMALL], small_chunk, align_up(h->total, small_chunk));
        if (r == CUA_SUCCESS) r = pool_init_vmm(h, &h->pools[POOL_LARGE], large_chunk, factor * align_up(h->total, large_chunk));
    }
    if (r == CUA_ERROR_HOST_MEMORY) report_setup_host_refused(dev, host_table_names[h->host_refused]);
    else if (r != CUA_SUCCESS) cua_error("device %d: cannot set up the heap (%s)", dev, driver_error_name(r));
    if (r != CUA_SUCCESS) {
        heap_destroy(h);
        if (err) *err = r;
        return NULL;
    }
    trace_on_device(dev, info.name, info.total_bytes, h->cap, h->granularity, h->vmm);
    if (dev >= 0 && dev < CUALLOC_MAX_DEVICES) atomic_store(&setup_host_said[dev], false);
    if (err) *err = CUA_SUCCESS;
    return h;
}

/* Bytes of a classic segment: its blocks tile it. */
static size_t seg_bytes(const block_t *seg) {
    size_t n = 0;
    for (const block_t *b = seg; b; b = b->next) n += b->size;
    return n;
}

void heap_destroy(heap_t *h) {
    if (!h) return;
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        block_t *seg = p->segments;
        while (seg) {
            block_t *next_seg = seg->seg_next;
            if (h->vmm) {
                for (size_t i = 0; i < p->nchunks; i++)
                    if (p->chunks[i]) chunks_unmap(h, p, i, 1);
                h->drv->va_free(h->dev, (cua_devptr)p->va_base, p->va_size);
            } else {
                h->drv->mem_free(h->dev, (cua_devptr)seg->addr);
                if (trace_enabled()) trace_on_unmap(h->dev, seg->addr, seg_bytes(seg));
            }
            for (block_t *b = seg, *n; b; b = n) {
                n = b->next;
                slab_free(&h->blocks, b);
            }
            seg = next_seg;
        }
        if (p->chunks) munmap(p->chunks, align_up(p->nchunks * sizeof(cua_memhandle), 4096));
        if (p->by_granule) munmap(p->by_granule, by_granule_bytes(p));
        for (unsigned t = 0; t < HEAP_MAX_TAGS; t++)
            if (p->index[t]) munmap(p->index[t], sizeof(findex_t));
    }
    retry_pending_releases(h);
    for (unsigned t = 1; t < HEAP_MAX_TAGS; t++)
        if (h->tags[t].event) h->drv->event_destroy(h->dev, h->tags[t].event);
    for (unsigned i = 0; i < h->n_nb; i++)
        if (h->nb[i].event) h->drv->event_destroy(h->dev, h->nb[i].event);
    grow_table_free(h->nb, h->cap_nb, sizeof *h->nb);
    for (unsigned i = 0; i < h->n_retired; i++) h->drv->event_destroy(h->dev, h->retired[i].event);
    grow_table_free(h->retired, h->cap_retired, sizeof *h->retired);
    ptrmap_destroy(&h->classic_live);
    slab_destroy(&h->blocks);
    heap_mem_free(h);
}

/* ------------------------------------------------------------------ queries */

/* Classic mode: does a segment start at a? (A walk of the segment lists: for the rare frees and
 * IPC requests of addresses that start no live block.) Lock held. */
static bool segment_at(const heap_t *h, uintptr_t a) {
    for (int pi = 0; pi < POOL_COUNT; pi++)
        for (const block_t *seg = h->pools[pi].segments; seg; seg = seg->seg_next)
            if (seg->addr == a) return true;
    return false;
}

bool heap_owns(heap_t *h, const void *ptr) {
    uintptr_t a = (uintptr_t)ptr;
    if (h->vmm) {
        for (int pi = 0; pi < POOL_COUNT; pi++) {
            const pool_t *p = &h->pools[pi];
            if (a >= p->va_base && a - p->va_base < p->va_size) return true;
        }
        return false;
    }
    cua_lock(&h->lock);
    block_t *b = live_get(h, a);
    /* A segment's base is the heap's even when no live block starts there (a double free): passed
     * on, the driver would free the whole segment. Other addresses the driver refuses itself. */
    bool owned = (b && b->state == BLOCK_ALLOCATED) || segment_at(h, a);
    cua_unlock(&h->lock);
    return owned;
}

/* Classic mode: is a inside one of h's segments? Lock held. A segment's blocks tile it in address
 * order from its first block, so the walk of one segment stops at the first block past a. */
static bool segment_holding(const heap_t *h, uintptr_t a) {
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        for (const block_t *seg = h->pools[pi].segments; seg; seg = seg->seg_next) {
            if (a < seg->addr) continue;
            for (const block_t *b = seg; b && a >= b->addr; b = b->next)
                if (a - b->addr < b->size) return true;
        }
    }
    return false;
}

bool heap_holds(heap_t *h, const void *ptr) {
    if (h->vmm) return heap_owns(h, ptr);
    cua_lock(&h->lock);
    bool held = segment_holding(h, (uintptr_t)ptr);
    cua_unlock(&h->lock);
    return held;
}

bool heap_starts_segment(heap_t *h, const void *ptr) {
    if (h->vmm) return false;
    cua_lock(&h->lock);
    bool starts = segment_at(h, (uintptr_t)ptr);
    cua_unlock(&h->lock);
    return starts;
}

size_t heap_block_size(heap_t *h, const void *ptr) {
    cua_lock(&h->lock);
    block_t *b = live_get(h, (uintptr_t)ptr);
    size_t n = b && b->state == BLOCK_ALLOCATED ? b->requested : SIZE_MAX;
    cua_unlock(&h->lock);
    return n;
}

bool heap_block_range(heap_t *h, const void *ptr, uintptr_t *base, size_t *size) {
    uintptr_t a = (uintptr_t)ptr;
    cua_lock(&h->lock);
    block_t *found = live_get(h, a);
    if (found && found->state != BLOCK_ALLOCATED) found = NULL; /* parked: free */
    /* An interior pointer: walk the blocks of the segment holding it (O(blocks); rare queries). */
    for (int pi = 0; pi < POOL_COUNT && !found; pi++) {
        for (block_t *seg = h->pools[pi].segments; seg && !found; seg = seg->seg_next) {
            if (h->vmm && (a < h->pools[pi].va_base || a - h->pools[pi].va_base >= h->pools[pi].va_size)) break;
            if (a < seg->addr) continue;
            for (block_t *b = seg; b; b = b->next) {
                if (a < b->addr) break;
                if (a - b->addr < b->size) {
                    if (b->state == BLOCK_ALLOCATED) found = b;
                    break;
                }
            }
        }
    }
    if (found) {
        *base = found->addr;
        *size = found->size;
    }
    cua_unlock(&h->lock);
    return found != NULL;
}

/* The next run of mapped chunks at or after chunk `from`: [*start, *end). False when none is left. */
static bool next_mapped_run(const pool_t *p, size_t from, size_t *start, size_t *end) {
    size_t i = from;
    while (i < p->nchunks && !p->chunks[i]) i++;
    if (i == p->nchunks) return false;
    size_t j = i;
    while (j < p->nchunks && p->chunks[j]) j++;
    *start = i;
    *end = j;
    return true;
}

void heap_peer_enabled(heap_t *h) {
    cua_lock(&h->lock);
    if (h->vmm) {
        for (int pi = 0; pi < POOL_COUNT; pi++) {
            pool_t *p = &h->pools[pi];
            for (size_t i = 0, j; next_mapped_run(p, i, &i, &j); i = j) {
                cua_result r = h->drv->set_access(h->dev, p->va_base + i * p->chunk, (j - i) * p->chunk);
                if (r != CUA_SUCCESS)
                    cua_error("device %d: granting peer access to %#lx (+%zu B) failed (%s)", h->dev,
                              (unsigned long)(p->va_base + i * p->chunk), (j - i) * p->chunk, driver_error_name(r));
            }
        }
    }
    cua_unlock(&h->lock);
}

block_t *heap_test_find_block(heap_t *h, const void *ptr) {
    block_t *b = live_get(h, (uintptr_t)ptr);
    return b && b->state == BLOCK_ALLOCATED ? b : NULL;
}
bool heap_is_vmm(const heap_t *h) { return h->vmm; }
int heap_device(const heap_t *h) { return h->dev; }

void heap_pool_range(const heap_t *h, pool_id_t pool, uintptr_t *lo, uintptr_t *hi) {
    *lo = h->pools[pool].va_base;
    *hi = h->pools[pool].va_base + h->pools[pool].va_size;
}
size_t heap_chunk_size(const heap_t *h, pool_id_t pool) { return h->pools[pool].chunk; }

void heap_snapshot(heap_t *h, void (*mapped)(int dev, uintptr_t addr, size_t size, void *arg),
                   void (*live)(int dev, const block_t *b, void *arg), void (*done)(int dev, void *arg),
                   void *arg) {
    cua_lock(&h->lock);
    /* Every change after this snapshot must reach the recorder: the fast paths stand aside. */
    h->recording = true;
    last_set(h, h->last_stream, h->last_tag);
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        if (h->vmm) {
            /* Runs of mapped chunks, each reported once. */
            for (size_t i = 0, j; next_mapped_run(p, i, &i, &j); i = j)
                if (mapped) mapped(h->dev, p->va_base + i * p->chunk, (j - i) * p->chunk, arg);
        } else {
            for (block_t *seg = p->segments; seg; seg = seg->seg_next)
                if (mapped) mapped(h->dev, seg->addr, seg_bytes(seg), arg);
        }
    }
    for (int pi = 0; pi < POOL_COUNT; pi++)
        for (block_t *seg = h->pools[pi].segments; seg; seg = seg->seg_next)
            for (block_t *b = seg; b; b = b->next)
                if (b->state == BLOCK_ALLOCATED && live) live(h->dev, b, arg);
    if (done) done(h->dev, arg);
    cua_unlock(&h->lock);
}

static void stats_read_locked(heap_t *h, cualloc_stats *out);

void heap_stats_hold(heap_t *h, cualloc_stats *out) {
    cua_lock(&h->lock);
    stats_read_locked(h, out);
}

bool retry_for_ms(bool (*attempt)(void *), void *arg, unsigned wait_ms) {
    for (unsigned waited = 0; !attempt(arg); waited++) {
        if (waited >= wait_ms) return false;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return true;
}

static bool heap_trylock_attempt(void *h) { return cua_trylock(&((heap_t *)h)->lock); }

bool heap_stats_try_hold(heap_t *h, cualloc_stats *out, unsigned wait_ms) {
    if (!retry_for_ms(heap_trylock_attempt, h, wait_ms)) return false;
    stats_read_locked(h, out);
    return true;
}

static void stats_read_locked(heap_t *h, cualloc_stats *out) {
    *out = h->stats;
    out->active_bytes = h->stats.allocated_bytes;
    out->active_peak = h->stats.allocated_peak;
    out->largest_free_block = largest_free_locked(h);
}

void heap_stats_release(heap_t *h) { cua_unlock(&h->lock); }

void heap_reset_peaks(heap_t *h) {
    cua_lock(&h->lock);
    cualloc_stats *s = &h->stats;
#define RESET_PEAK_(cur, peak) s->peak = s->cur;
    CUALLOC_STATS_GAUGES(RESET_PEAK_)
#undef RESET_PEAK_
    cua_unlock(&h->lock);
}

void heap_get_stats(heap_t *h, cualloc_stats *out) {
    heap_stats_hold(h, out);
    heap_stats_release(h);
}

cua_result heap_oom_facts(heap_t *h, size_t size, cualloc_stats *out, size_t *dfree, bool *dknown, char *diagnosis,
                          size_t len) {
    size_t dtotal;
    heap_stats_hold(h, out);
    *dknown = device_free_now(h, dfree, &dtotal);
    size_t rsize = heap_round_size(&h->conf, size);
    if (h->oom_text[0]) {
        snprintf(diagnosis, len, "%s", h->oom_text);
    } else if (rsize && oom_classify(rsize, h->cap, h->stats.allocated_bytes, h->stats.reserved_bytes,
                                     *dknown ? *dfree : UINT64_MAX) == OOM_FRAGMENTATION &&
               (out->largest_free_block >= rsize || (*dknown && rsize <= *dfree))) {
        /* Asked before anything failed, of a request the heap would serve now: the diagnosis of a
         * failure would describe one that never was. */
        char largest[32], devfree[32];
        snprintf(diagnosis, len,
                 "none yet — no allocation has failed on this device, and this request would be served now "
                 "(largest free block %s; the device reports %s free).",
                 fmt_bytes(out->largest_free_block, largest, sizeof largest),
                 *dknown ? fmt_bytes(*dfree, devfree, sizeof devfree) : "(unknown)");
    } else {
        oom_diagnose(h, rsize ? rsize : size /* 0: rounding would overflow */, *dfree, dtotal, *dknown, diagnosis,
                     len, NULL);
    }
    cua_result driver_error = h->last_fail_error;
    heap_stats_release(h);
    return driver_error;
}

void heap_trim(heap_t *h) {
    cua_lock(&h->lock);
    h->stats.num_trims++;
    if (trace_enabled()) trace_on_trim(h->dev); /* before the unmaps it causes */
    if (h->vmm) vmm_release(h, SIZE_MAX);
    else classic_release_all(h);
    update_inactive_split(h);
    cua_unlock(&h->lock);
}

/* Lock held, no capture in progress (a query from a thread in global capture mode invalidates
 * another stream's capture). Drops the destroyed streams' events that have completed. */
static void retired_drain(heap_t *h) {
    for (unsigned i = h->n_retired; i-- > 0;) {
        if (h->drv->event_query(h->dev, h->retired[i].event) == CUA_SUCCESS) retired_drop(h, i);
    }
}

/* Lock held. A destroyed non-blocking stream's last event, recorded before the destroy: its work
 * runs on after it, and the blocks cudaFree'd later must wait for that as for a live stream's
 * (dw_events_complete). Not asked at once (two driver calls a destroy, three when the stream had no
 * event yet): the kept ones that completed are dropped when the table has grown (while no capture
 * is in progress), and by the device-wide settling. Where none can be recorded or kept,
 * retired_unknown. Takes *event (NULL after). */
static void nb_retire(heap_t *h, cua_stream stream, cua_event *event) {
    if (is_capturing(h, stream) || (!*event && h->drv->event_create(h->dev, event) != CUA_SUCCESS) ||
        h->drv->event_record(h->dev, *event, stream) != CUA_SUCCESS) {
        h->retired_unknown = true;
        return;
    }
    if (h->n_retired >= RETIRED_DRAIN_AT && !capture_in_progress(h)) retired_drain(h);
    retired_t *table = grow_table_reserve(h->retired, h->n_retired, &h->cap_retired, sizeof *h->retired);
    if (!table) {
        h->retired_unknown = true;
        return;
    }
    h->retired = table;
    h->retired[h->n_retired++] = (retired_t){*event, h->dw_closes};
    *event = NULL;
}

/* Lock held. Forgets `stream` as a non-blocking stream. Device-wide blocks still waiting for it
 * are made safe first (the handle may be reused): its work is synchronized, or, when that cannot be
 * done (capture), the table is marked overflowed so that only a device synchronize settles them.
 * `destroyed`: the stream is being destroyed (not a handle seen again): its work in flight, which
 * runs on, is waited for by later device-wide frees (nb_retire). */
static void nb_forget(heap_t *h, cua_stream stream, bool destroyed) {
    for (unsigned i = 0; i < h->n_nb; i++) {
        if (h->nb[i].handle != stream) continue;
        /* Blocks of the open generation, or of the closed one that this stream's event covers. */
        if (tag_free_bytes(h, h->dw_open) || (h->nb[i].in_flight && tag_free_bytes(h, dw_closed(h)))) {
            if (is_capturing(h, stream) || stream_sync(h, stream) != CUA_SUCCESS) h->nb_overflow = true;
        } else if (destroyed) {
            nb_retire(h, stream, &h->nb[i].event);
        }
        if (h->nb[i].event) h->drv->event_destroy(h->dev, h->nb[i].event);
        h->nb[i] = h->nb[--h->n_nb];
        h->nb[h->n_nb].handle = NULL;
        h->nb[h->n_nb].event = NULL;
        h->nb[h->n_nb].in_flight = false;
        return;
    }
}

/* Lock held. The legacy stream synchronized for the non-blocking streams, whose work does not
 * wait for the legacy stream's (legacy_handed_out): not during a capture, which a synchronize
 * would invalidate; a device synchronize where the stream's is refused. Clears the flag when
 * made. */
static void legacy_sync_for_nonblocking(heap_t *h) {
    if (capture_in_progress(h)) return;
    if (stream_sync(h, NULL) == CUA_SUCCESS || device_sync(h) == CUA_SUCCESS) h->legacy_handed_out = false;
}

void heap_stream_created(heap_t *h, cua_stream stream, bool non_blocking) {
    cua_lock(&h->lock);
    nb_forget(h, stream, false); /* a reused handle: whatever it was before is gone */
    /* Device-wide allocations served as the legacy stream may hold blocks the legacy stream freed
     * while its work still used them: safe for the blocking streams, whose later work waits for
     * it, but not for this one. Its first work must not start before that: the legacy stream is
     * synchronized once (not during a capture, which a synchronize would invalidate). */
    if (non_blocking && h->legacy_handed_out) legacy_sync_for_nonblocking(h);
    if (non_blocking) {
        nb_stream_t *table = grow_table_reserve(h->nb, h->n_nb, &h->cap_nb, sizeof *h->nb);
        if (table) {
            h->nb = table;
            h->nb[h->n_nb].handle = stream;
            h->nb[h->n_nb].event = NULL;
            h->nb[h->n_nb].in_flight = false;
            h->n_nb++;
        } else {
            h->nb_overflow = true;
        }
    }
    cua_unlock(&h->lock);
}

void heap_streams_untracked(heap_t *h) {
    cua_lock(&h->lock);
    h->nb_overflow = true;
    cua_unlock(&h->lock);
}

void heap_stream_destroyed(heap_t *h, cua_stream stream) {
    cua_lock(&h->lock);
    quick_flush(h);
    nb_forget(h, stream, true);
    FOR_USED_STREAM_TAGS(h, t) {
        stream_rec_t *r = &h->tags[t];
        if (r->closed || r->handle != stream) continue;
        if (open_tag_waiting(h, t)) {
            /* The handle may come back for a new stream: its blocks must not stay tied to it. They
             * settle once the stream, or else the whole device, is seen idle. When neither can be
             * (a capture in progress, a failing device), the stream's work runs on after the
             * destroy, so both its generations are renamed to a key of their own, which no stream
             * passes: a new stream given the same handle does not find them (it would reuse the
             * blocks at once), and only a device synchronize (settle_all) or the closed
             * generation's event settles them. */
            if (stream_sync(h, stream) == CUA_SUCCESS || device_sync(h) == CUA_SUCCESS) {
                stream_settle_synced(h, t);
            } else {
                r->handle = stream_key_make(r);
                if (r->partner) h->tags[r->partner].handle = r->handle;
            }
        }
        /* A tag that keeps blocks or a closed generation stays (a closed tag needs its open
         * partner: settle_completed and settle_all reach it only through that one). */
        if (!open_tag_waiting(h, t)) tag_set_used(h, t, false);
        if (h->last_tag == t) last_set(h, NO_STREAM, 0);
    }
    cua_unlock(&h->lock);
}

/* ------------------------------------------------------------------ checker */

typedef struct {
    heap_t *h;
    FILE *report;
    int bad;
    size_t allocated_blocks;
    size_t cached_blocks;
    size_t cached_bytes;
    size_t records;              /* blocks of every segment */
} check_ctx_t;

#define CHECK(ctx, cond, ...)                                   \
    do {                                                        \
        if (!(cond)) {                                          \
            (ctx)->bad++;                                       \
            if ((ctx)->report) {                                \
                fprintf((ctx)->report, "heap %d: ", (ctx)->h->dev); \
                fprintf((ctx)->report, __VA_ARGS__);            \
                fputc('\n', (ctx)->report);                     \
            }                                                   \
        }                                                       \
    } while (0)

typedef struct { check_ctx_t *c; pool_t *p; unsigned tag; } index_check_t;

/* An index entry is a record of its pool's block list: its neighbours link back to it (a record
 * the list no longer holds, such as a stale copy, has neighbours that name another). */
static bool in_block_list(const block_t *b) {
    return (!b->prev || b->prev->next == b) && (!b->next || b->next->prev == b);
}

static void check_index_entry(block_t *b, void *arg) {
    index_check_t *ic = arg;
    CHECK(ic->c, b->state == BLOCK_FREE && b->tag == ic->tag && b->pool == ic->p->id,
          "block %#lx in free index (pool %d, tag %u) is state %d tag %u pool %d", (unsigned long)b->addr,
          ic->p->id, ic->tag, b->state, b->tag, b->pool);
    CHECK(ic->c, in_block_list(b), "block %#lx in free index (pool %d, tag %u) is not in the block list",
          (unsigned long)b->addr, ic->p->id, ic->tag);
}

/* The unmapped index holds its pool's UNMAPPED blocks and nothing else: the grow path maps the
 * chunks under what it finds there (count and bytes alone would pass another block of the size). */
static void check_unmapped_entry(block_t *b, void *arg) {
    index_check_t *ic = arg;
    CHECK(ic->c, b->state == BLOCK_UNMAPPED && b->pool == ic->p->id && in_block_list(b),
          "block %#lx in pool %d's unmapped index is state %d, pool %d%s", (unsigned long)b->addr, ic->p->id,
          b->state, b->pool, in_block_list(b) ? "" : ", not in the block list");
}

static void check_live_entry(block_t *b, void *arg) {
    check_ctx_t *c = arg;
    CHECK(c, b->state == BLOCK_ALLOCATED || b->state == BLOCK_CACHED, "live map holds block %#lx in state %d",
          (unsigned long)b->addr, b->state);
}

/* Checks pool p; returns the bytes of its ALLOCATED blocks. */
static size_t check_pool(check_ctx_t *c, pool_t *p) {
    heap_t *h = c->h;
    size_t allocated = 0, free_mapped = 0, releasable = 0, unmapped_bytes = 0, unmapped_count = 0;
    if (h->vmm && p->id == POOL_SMALL)
        CHECK(c, p->chunk > CUALLOC_SMALL_MAX, "small-pool chunks of %zu B: a parked block could hold one", p->chunk);
    size_t free_count[HEAP_MAX_TAGS] = {0}, free_bytes[HEAP_MAX_TAGS] = {0};
    /* Each list's back links name the one walked before (NULL at its head). A list that loops
     * comes back to a record whose back link names another: the walks stop there, so that damage
     * is reported, not walked for ever. */
    block_t *prev_seg = NULL;
    for (block_t *seg = p->segments; seg; prev_seg = seg, seg = seg->seg_next) {
        bool seg_linked = seg->seg_prev == prev_seg;
        CHECK(c, seg_linked, "segment list broken at %#lx", (unsigned long)seg->addr);
        size_t seg_size = 0;
        block_t *prev_b = NULL;
        for (block_t *b = seg; b; prev_b = b, b = b->next) {
            bool cut = b->prev != prev_b;
            CHECK(c, !cut, "block %#lx: %s", (unsigned long)b->addr,
                  prev_b ? "its prev link is not the block before it" : "a segment head with a previous block");
            CHECK(c, b->size > 0 && b->size % CUALLOC_ALIGN == 0 && b->addr % CUALLOC_ALIGN == 0,
                  "block %#lx size %zu not aligned", (unsigned long)b->addr, b->size);
            CHECK(c, b->pool == p->id, "block %#lx of pool %d found in pool %d", (unsigned long)b->addr, b->pool, p->id);
            CHECK(c, b->quick_hint < QUICK_BUCKETS, "block %#lx: quick-list hint %u is no bucket", (unsigned long)b->addr,
                  b->quick_hint);
            if (b->next) {
                CHECK(c, b->addr + b->size == b->next->addr, "block %#lx + %zu does not meet next at %#lx",
                      (unsigned long)b->addr, b->size, (unsigned long)b->next->addr);
                if (b->state == BLOCK_FREE && b->next->state == BLOCK_FREE)
                    CHECK(c, !tags_compatible(b->tag, b->next->tag), "free blocks %#lx and %#lx should have merged",
                          (unsigned long)b->addr, (unsigned long)b->next->addr);
                CHECK(c, !(b->state == BLOCK_UNMAPPED && b->next->state == BLOCK_UNMAPPED),
                      "unmapped blocks %#lx and %#lx should have merged", (unsigned long)b->addr, (unsigned long)b->next->addr);
            }
            seg_size += b->size;
            c->records++;
            if (b->state == BLOCK_FREE || b->state == BLOCK_UNMAPPED)
                CHECK(c, live_get(h, b->addr) == NULL, "%s block %#lx is in the live map",
                      b->state == BLOCK_FREE ? "free" : "unmapped", (unsigned long)b->addr);
            switch (b->state) {
            case BLOCK_ALLOCATED:
                allocated += b->size;
                c->allocated_blocks++;
                CHECK(c, live_get(h, b->addr) == b, "allocated block %#lx missing from the live map", (unsigned long)b->addr);
                break;
            case BLOCK_FREE:
                free_mapped += b->size;
                releasable += block_releasable(h, p, b);
                CHECK(c, b->releasable == block_releasable(h, p, b), "free block %#lx: %zu B releasable, its record says %zu",
                      (unsigned long)b->addr, block_releasable(h, p, b), b->releasable);
                if (b->tag < HEAP_MAX_TAGS) {
                    free_count[b->tag]++;
                    free_bytes[b->tag] += b->size;
                }
                CHECK(c, b->tag < HEAP_MAX_TAGS && tag_used(h, b->tag), "free block %#lx has unknown tag %u", (unsigned long)b->addr, b->tag);
                break;
            case BLOCK_CACHED:
                CHECK(c, h->vmm, "cached block %#lx in classic mode", (unsigned long)b->addr);
                free_mapped += b->size;
                releasable += block_releasable(h, p, b);
                CHECK(c, !tag_is_device_wide(b->tag), "cached block %#lx is tagged device-wide", (unsigned long)b->addr);
                CHECK(c, b->tag < HEAP_MAX_TAGS && tag_used(h, b->tag) && !h->tags[b->tag].closed,
                      "cached block %#lx has tag %u, which is not an open tag", (unsigned long)b->addr, b->tag);
                CHECK(c, live_get(h, b->addr) == b, "cached block %#lx missing from the live map", (unsigned long)b->addr);
                c->cached_blocks++;
                c->cached_bytes += b->size;
                break;
            case BLOCK_UNMAPPED:
                CHECK(c, h->vmm, "unmapped block %#lx in classic mode", (unsigned long)b->addr);
                unmapped_bytes += b->size;
                unmapped_count++;
                if (h->vmm)
                    CHECK(c, (b->addr - p->va_base) % p->chunk == 0 && b->size % p->chunk == 0,
                          "unmapped block %#lx size %zu not chunk-aligned", (unsigned long)b->addr, b->size);
                break;
            default:
                CHECK(c, false, "block %#lx has bad state %d", (unsigned long)b->addr, b->state);
            }
            if (h->vmm && b->addr >= p->va_base && b->addr + b->size <= p->va_base + p->va_size) {
                size_t first = chunk_index(p, b->addr), last = chunk_index(p, b->addr + b->size - 1);
                for (size_t i = first; i <= last; i++) {
                    bool mapped = p->chunks[i] != 0;
                    if (b->state == BLOCK_UNMAPPED)
                        CHECK(c, !mapped, "chunk %zu mapped under unmapped block %#lx", i, (unsigned long)b->addr);
                    else
                        CHECK(c, mapped, "chunk %zu not mapped under %s block %#lx", i,
                              b->state == BLOCK_ALLOCATED ? "allocated" : "free", (unsigned long)b->addr);
                }
            }
            if (cut) break;
        }
        if (h->vmm) {
            CHECK(c, seg->addr == p->va_base && seg_size == p->va_size, "blocks cover %zu B of the %zu B reservation",
                  seg_size, p->va_size);
        }
        if (!seg_linked) break;
    }
    if (h->vmm) {
        size_t mapped_chunks = 0;
        for (size_t i = 0; i < p->nchunks; i++) mapped_chunks += p->chunks[i] != 0;
        CHECK(c, mapped_chunks * p->chunk == p->mapped, "pool %d: %zu chunks mapped, accounting says %zu B", p->id,
              mapped_chunks, p->mapped);
        CHECK(c, p->unmapped.count == unmapped_count && p->unmapped.bytes == unmapped_bytes,
              "pool %d: unmapped index holds %zu blocks / %zu B, the block list %zu / %zu", p->id, p->unmapped.count,
              p->unmapped.bytes, unmapped_count, unmapped_bytes);
        c->bad += sizeclass_check(&p->unmapped, c->report);
        index_check_t ic = {c, p, TAG_ANY};
        sizeclass_foreach(&p->unmapped, check_unmapped_entry, &ic);
    }
    CHECK(c, releasable == p->releasable, "pool %d: releasable %zu, accounting says %zu", p->id, releasable, p->releasable);
    CHECK(c, allocated + free_mapped == p->mapped, "pool %d: allocated blocks total %zu and free ones %zu, but %zu are mapped",
          p->id, allocated, free_mapped, p->mapped);
    for (unsigned t = 0; t < HEAP_MAX_TAGS; t++) {
        findex_t *ix = p->index[t];
        size_t n = ix ? (h->vmm ? ix->sc.count : ix->tree.count) : 0;
        size_t bytes = ix ? (h->vmm ? ix->sc.bytes : ix->tree.bytes) : 0;
        CHECK(c, n == free_count[t] && bytes == free_bytes[t],
              "pool %d tag %u: index holds %zu blocks / %zu B, the block list %zu / %zu", p->id, t, n, bytes,
              free_count[t], free_bytes[t]);
        if (!ix) continue;
        index_check_t ic = {c, p, t};
        if (h->vmm) {
            c->bad += sizeclass_check(&ix->sc, c->report);
            sizeclass_foreach(&ix->sc, check_index_entry, &ic);
        } else {
            c->bad += tree_check(&ix->tree, c->report);
            tree_foreach(&ix->tree, check_index_entry, &ic);
        }
    }
    return allocated;
}

/* Slots [from, to) of pool pi's by_granule table: each entry a block the table may hold, at its own
 * slot. Returns how many entries there are. */
static size_t check_live_slots(check_ctx_t *c, pool_id_t pi, size_t from, size_t to) {
    const pool_t *p = &c->h->pools[pi];
    size_t n = 0;
    for (size_t i = from; i < to; i++) {
        block_t *b = p->by_granule[i];
        if (!b) continue;
        n++;
        CHECK(c, (b->state == BLOCK_ALLOCATED || (pi == POOL_SMALL && b->state == BLOCK_CACHED)) && b->pool == pi &&
                     granule_slot(c->h, pi, b->addr) == &p->by_granule[i],
              "%s-pool live table entry %zu holds block %#lx (state %d, pool %d)", pi == POOL_SMALL ? "small" : "large", i,
              (unsigned long)b->addr, b->state, b->pool);
    }
    return n;
}

int heap_check(heap_t *h, FILE *report) {
    cua_lock(&h->lock);
    check_ctx_t c = {.h = h, .report = report};
    size_t mapped = 0, allocated = 0, free_mapped = 0, releasable = 0;
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        size_t pool_allocated = check_pool(&c, p);
        mapped += p->mapped;
        allocated += pool_allocated;
        free_mapped += p->mapped - pool_allocated;
        releasable += p->releasable;
    }
    size_t listed = 0, listed_bytes = 0;
    for (unsigned i = 0; i < QUICK_BUCKETS; i++) {
        quick_t *q = &h->quick[i];
        size_t n = 0;
        for (block_t *b = q->head; b && n <= QUICK_DEPTH; b = b->link.list.next_free, n++) {
            CHECK(&c, b->state == BLOCK_CACHED && quick_key(b->size, b->tag) == q->key,
                  "quick list %u (key %#llx) holds block %#lx: state %d, %zu B, tag %u", i, (unsigned long long)q->key,
                  (unsigned long)b->addr, b->state, b->size, b->tag);
            CHECK(&c, quick_index(b->size, b->tag) == (unsigned)i, "block %#lx is on the wrong quick list",
                  (unsigned long)b->addr);
            CHECK(&c, b->pool == POOL_SMALL, "quick list %u holds block %#lx of the large pool", i, (unsigned long)b->addr);
            listed_bytes += b->size;
        }
        CHECK(&c, n == q->count, "quick list %u holds %zu blocks, its count says %u", i, n, q->count);
        /* Empty or not: the free path takes a matching key as naming the right bucket. */
        CHECK(&c, !q->key || quick_index((size_t)(q->key & (HEAP_MAX_REQUEST - 1)), (unsigned)(q->key >> 48)) == i,
              "quick list %u has key %#llx, which belongs to another bucket", i, (unsigned long long)q->key);
        if (q->head)
            CHECK(&c, h->quick_nonempty[i / 64] >> (i % 64) & 1, "quick list %u holds blocks, but its non-empty bit is clear", i);
        listed += n;
    }
    /* Device-wide frees: the pseudo-stream record, and the non-blocking stream table. */
    for (unsigned t = TAG_DW_A; t <= TAG_DW_B; t++)
        CHECK(&c, tag_used(h, t) && h->tags[t].handle == DW_HANDLE, "the device-wide tag record %u is damaged", t);
    CHECK(&c, h->dw_open == TAG_DW_A || h->dw_open == TAG_DW_B, "the open device-wide tag is %u", h->dw_open);
    if (h->dw_open == TAG_DW_A || h->dw_open == TAG_DW_B)
        CHECK(&c, !tag_free_bytes(h, dw_closed(h)) || dw_rec(h)->event_in_flight,
              "the closed device-wide generation holds %zu B, but no event covers it", tag_free_bytes(h, dw_closed(h)));
    for (unsigned t = 1; t < TAG_STREAMS_END; t++)
        CHECK(&c, !tag_used(h, t) || h->tags[t].handle != DW_HANDLE, "tag %u names the device-wide pseudo-stream", t);
    /* Stream generations: partners name each other, one open and one closed, of one stream. */
    for (unsigned t = 1; t < TAG_STREAMS_END; t++) {
        const stream_rec_t *r = &h->tags[t];
        if (!tag_used(h, t)) {
            CHECK(&c, !r->closed && !r->partner, "unused tag %u is marked closed or partnered", t);
            continue;
        }
        CHECK(&c, h->vmm || !r->closed, "tag %u is closed in classic mode", t);
        CHECK(&c, r->event_in_flight == r->closed, "tag %u: %s, but its event is %sin flight", t,
              r->closed ? "closed" : "open", r->event_in_flight ? "" : "not ");
        CHECK(&c, !r->closed || r->partner, "closed tag %u has no open partner", t);
        if (r->partner) {
            const stream_rec_t *q = r->partner < TAG_STREAMS_END ? &h->tags[r->partner] : NULL;
            CHECK(&c, q && tag_used(h, r->partner) && q->partner == t && q->closed != r->closed && q->handle == r->handle,
                  "tag %u and its partner %u are not the two generations of one stream", t, r->partner);
        }
        for (unsigned u = t + 1; u < TAG_STREAMS_END; u++)
            CHECK(&c, !tag_used(h, u) || h->tags[u].closed || r->closed || h->tags[u].handle != r->handle,
                  "tags %u and %u are both open for stream %p", t, u, (void *)r->handle);
    }
    CHECK(&c, h->n_nb <= h->cap_nb && (h->nb || !h->cap_nb), "%u non-blocking streams recorded in a table of %zu",
          h->n_nb, h->cap_nb);
    CHECK(&c, h->n_retired <= h->cap_retired && (h->retired || !h->cap_retired),
          "%u destroyed streams' events in a table of %zu", h->n_retired, h->cap_retired);
    for (unsigned i = 0; i < h->n_retired && i < h->cap_retired; i++)
        CHECK(&c, h->retired[i].event != NULL && h->retired[i].closes <= h->dw_closes,
              "destroyed stream's event %u: %p, kept after %llu generations closed of %llu", i,
              (void *)h->retired[i].event, (unsigned long long)h->retired[i].closes,
              (unsigned long long)h->dw_closes);
    CHECK(&c, h->recording || !trace_enabled() || !trace_device_begun(h->dev),
          "the recorder is on and has begun device %d, but its fast paths still serve", h->dev);
    CHECK(&c, !h->last_tag || (h->last_tag < TAG_STREAMS_END && tag_used(h, h->last_tag) &&
                               !h->tags[h->last_tag].closed && h->tags[h->last_tag].handle == h->last_stream),
          "the stream cache names tag %u, which is not stream %p's", h->last_tag, (void *)h->last_stream);
    CHECK(&c, h->fast_free_stream == (h->last_tag && h->vmm && !h->recording ? h->last_stream : NO_STREAM) &&
                  h->fast_alloc_stream == (h->last_tag && h->fast_alloc && !h->recording ? h->last_stream : NO_STREAM) &&
                  h->last_tag_key == quick_key_tag(h->last_tag) && h->last_tag_hash == quick_hash_tag(h->last_tag),
          "the fast paths' stream cache disagrees with the stream cache");
    for (unsigned i = 0; i < h->n_nb && i < h->cap_nb; i++)
        for (unsigned j = i + 1; j < h->n_nb && j < h->cap_nb; j++)
            CHECK(&c, h->nb[i].handle != h->nb[j].handle, "non-blocking stream %p recorded twice", (void *)h->nb[i].handle);
    CHECK(&c, listed == c.cached_blocks && listed_bytes == c.cached_bytes,
          "quick lists hold %zu blocks / %zu B; segments have %zu cached blocks / %zu B", listed, listed_bytes,
          c.cached_blocks, c.cached_bytes);
    CHECK(&c, mapped == h->stats.reserved_bytes, "pools map %zu B, reserved_bytes says %zu", mapped, h->stats.reserved_bytes);
    CHECK(&c, allocated == h->stats.allocated_bytes, "pools allocate %zu B, allocated_bytes says %zu", allocated,
          h->stats.allocated_bytes);
    CHECK(&c, free_mapped - releasable == heap_inactive_split(h), "pool free/releasable totals disagree");
    CHECK(&c, h->stats.reserved_bytes <= h->cap, "reserved %zu exceeds the cap %zu", h->stats.reserved_bytes, h->cap);
    CHECK(&c, h->stats.inactive_split_bytes == heap_inactive_split(h), "inactive_split_bytes is stale");
    CHECK(&c, h->stats.requested_bytes <= h->stats.allocated_bytes, "requested exceeds allocated");
    /* The pools' tables: only their ALLOCATED blocks (and the small pool's CACHED ones), each at
     * its own slot; above, every such block was found there. The large pool's table is scanned
     * whole; the small pool's (1/64 of its reservation) where chunks are mapped: elsewhere it is
     * the zero page, read-only. */
    size_t live = h->vmm ? 0 : h->classic_live.count;
    if (h->vmm) {
        const pool_t *sp = &h->pools[POOL_SMALL];
        size_t per_chunk = sp->chunk >> SMALL_GRANULE_SHIFT;
        for (size_t run = 0, run_end; next_mapped_run(sp, run, &run, &run_end); run = run_end)
            live += check_live_slots(&c, POOL_SMALL, run * per_chunk, run_end * per_chunk);
        live += check_live_slots(&c, POOL_LARGE, 0, by_granule_bytes(&h->pools[POOL_LARGE]) / sizeof(block_t *));
    }
    CHECK(&c, c.allocated_blocks + c.cached_blocks == live, "%zu allocated and %zu cached blocks, live tables hold %zu",
          c.allocated_blocks, c.cached_blocks, live);
    CHECK(&c, h->stats.num_allocs - h->stats.num_frees == c.allocated_blocks, "allocs - frees = %llu, allocated blocks %zu",
          (unsigned long long)(h->stats.num_allocs - h->stats.num_frees), c.allocated_blocks);
    if (!h->vmm) {
        c.bad += ptrmap_check(&h->classic_live, report);
        ptrmap_foreach(&h->classic_live, check_live_entry, &c);
    }
    /* Between operations every record handed out is a block of a segment. */
    c.bad += slab_check(&h->blocks, report);
    CHECK(&c, h->blocks.live == c.records, "the slab hands out %zu block records, the segments hold %zu blocks",
          h->blocks.live, c.records);
    cua_unlock(&h->lock);
    return c.bad;
}

void heap_dump(heap_t *h, FILE *out) {
    cua_lock(&h->lock);
    static const char *state_names[] = {"?", "allocated", "free", "unmapped", "cached"};
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        size_t allocated = 0;
        for (block_t *seg = p->segments; seg; seg = seg->seg_next)
            for (block_t *b = seg; b; b = b->next) allocated += b->state == BLOCK_ALLOCATED ? b->size : 0;
        fprintf(out, "pool %s: mapped %zu allocated %zu free %zu releasable %zu\n", pi == POOL_SMALL ? "small" : "large",
                p->mapped, allocated, p->mapped - allocated, p->releasable);
        for (block_t *seg = p->segments; seg; seg = seg->seg_next) {
            fprintf(out, " segment %#lx\n", (unsigned long)seg->addr);
            for (block_t *b = seg; b; b = b->next)
                fprintf(out, "  %#lx %12zu %-9s tag %u\n", (unsigned long)b->addr, b->size,
                        state_names[b->state < 5 ? b->state : 0], b->tag);
        }
    }
    for (unsigned t = 0; t < HEAP_MAX_TAGS; t++)
        if (tag_used(h, t))
            fprintf(out, "tag %u: stream %p free %zu %s in-flight %d partner %u\n", t, (void *)h->tags[t].handle,
                    tag_free_bytes(h, t), h->tags[t].closed ? "closed" : "open", h->tags[t].event_in_flight,
                    h->tags[t].partner);
    cua_unlock(&h->lock);
}

cualloc_stats *heap_test_stats(heap_t *h) { return &h->stats; }

uint64_t heap_host_refusals(heap_t *h) {
    cua_lock(&h->lock);
    uint64_t n = h->host_refusals;
    cua_unlock(&h->lock);
    return n;
}

void heap_test_tag_fields(heap_t *h, unsigned t, bool **closed, bool **in_flight, uint16_t **partner) {
    *closed = &h->tags[t].closed;
    *in_flight = &h->tags[t].event_in_flight;
    *partner = &h->tags[t].partner;
}

void heap_test_fields(heap_t *h, heap_test_fields_t *out) {
    out->records = &h->blocks;
    out->classic_live = &h->classic_live;
    out->last_tag = &h->last_tag;
    out->dw_open = &h->dw_open;
    out->n_retired = &h->n_retired;
}

void heap_test_tag_owner(heap_t *h, unsigned t, uint64_t **used_mask, cua_stream **handle) {
    *used_mask = &h->tags_used;
    *handle = &h->tags[t].handle;
}

void heap_test_quick(heap_t *h, unsigned i, uint64_t **key, uint32_t **count, uint64_t **word, unsigned *bit) {
    *key = &h->quick[i].key;
    *count = &h->quick[i].count;
    *word = &h->quick_nonempty[i / 64];
    *bit = i % 64;
}

uint64_t heap_test_quick_handed_over(const heap_t *h) { return h->quick_handed_over; }

block_t **heap_test_live_slot(heap_t *h, const void *ptr) { return h->vmm ? live_slot(h, (uintptr_t)ptr) : NULL; }

sizeclass_t *heap_test_unmapped_index(heap_t *h, pool_id_t pool) { return &h->pools[pool].unmapped; }

cua_memhandle *heap_test_chunk(heap_t *h, const void *ptr) {
    for (int pi = 0; pi < POOL_COUNT; pi++) {
        pool_t *p = &h->pools[pi];
        uintptr_t a = (uintptr_t)ptr;
        if (h->vmm && a >= p->va_base && a - p->va_base < p->va_size) return &p->chunks[chunk_index(p, a)];
    }
    return NULL;
}
