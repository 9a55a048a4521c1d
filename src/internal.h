/* internal.h — declarations shared between cualloc's source files, grouped under a heading naming
 * the file that defines them. Nothing here is exported (the library builds with hidden visibility;
 * only include/cualloc.h's CUALLOC_API names leave the .so).
 *
 * Glossary (device → pool → segment → chunk → block):
 *   device   one GPU or sim device; owns one heap_t with one lock.
 *   pool     SMALL (rounded requests <= 1 MiB) or LARGE. Pools never share memory, so a few live
 *            small blocks cannot pin the chunks large blocks need.
 *   segment  classic mode: one cuMemAlloc'd range. VMM mode: the pool's whole VA reservation.
 *   chunk    VMM mode: one physical handle, mapped whole at a fixed place in the segment; the unit
 *            of map and unmap (the driver cannot map or unmap part of a handle).
 *   block    a range of a segment: ALLOCATED, FREE (backed by physical memory) or UNMAPPED (VMM
 *            address space with nothing behind it). Blocks tile each segment in address order.
 *   tag      a free block remembers the stream it was freed on (tag > 0); tag 0 (ANY) means no
 *            work in flight can touch it, so any stream may reuse it.
 */
#ifndef CUALLOC_INTERNAL_H
#define CUALLOC_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cualloc.h"
#include "cualloc_trace.h"
#include "driver.h"

#define CUALLOC_MAX_DEVICES 64
#define CUALLOC_ALIGN 512                  /* every block size and address is a multiple */
#define CUALLOC_SMALL_MAX ((size_t)1 << 20) /* largest request served by the SMALL pool */
#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define GiB ((size_t)1024 * 1024 * 1024)

/* floor(log2(v)) for v > 0. Written 63 ^ clz (equal to 63 - clz, as clz <= 63), which GCC compiles
 * to a single bsr where 63 - clz took a bsr, an xor and a subtraction. */
static inline unsigned floor_log2(uint64_t v) { return 63u ^ (unsigned)__builtin_clzll(v); }

/* ======================================================================== error.c */

/* The one path for user-visible messages: "cualloc: " + text + newline, to stderr or to the
 * callback installed with error_set_callback. Async-signal-unsafe; never called with a heap lock
 * held while calling back into the heap. */
void cua_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cua_verror(const char *fmt, va_list ap);
typedef void (*cua_error_fn)(const char *line, void *arg);
void error_set_callback(cua_error_fn fn, void *arg); /* NULL restores stderr */
/* The fix every message about host memory running out names (heap.c, trace.c). */
#define CUA_HOST_MEMORY_FIX \
    "Free host memory or raise this process's limits on it (ulimit -v and -d, the container's memory limit)"
/* Human size: "512 B", "1.50 KiB", "20.00 MiB", "3.25 GiB". Returns buf. */
const char *fmt_bytes(size_t bytes, char *buf, size_t len);

/* ======================================================================== conf.c */

typedef enum { DRIVER_CUDA = 0, DRIVER_SIM = 1 } driver_kind_t;

typedef enum {
    SIM_OP_VA_RESERVE, SIM_OP_VA_FREE, SIM_OP_PHYS_CREATE, SIM_OP_PHYS_RELEASE, SIM_OP_MAP,
    SIM_OP_UNMAP, SIM_OP_SET_ACCESS, SIM_OP_MEM_ALLOC, SIM_OP_MEM_FREE, SIM_OP_EVENT_CREATE,
    SIM_OP_EVENT_RECORD, SIM_OP_EVENT_QUERY, SIM_OP_STREAM_SYNC, SIM_OP_DEVICE_SYNC, SIM_OP_EVENT_SYNC,
    SIM_OP_COUNT
} sim_op_t;

/* Number of roundup_power2_divisions intervals: [1 MiB, 2 MiB), [2, 4), ..., [32 GiB, ...) — as
 * PyTorch's allocator config. Index 0 also covers sizes below 1 MiB. */
#define CONF_ROUNDUP_INTERVALS 16
/* Longest path value (the trace file template) plus its NUL. */
#define CONF_PATH_MAX 256
/* The largest sim device, in MiB (2^30 MiB = 1 PiB): sim_memory_mb's bound, and what a replay may
 * simulate (the sim's bookkeeping grows with the capacity). */
#define CONF_SIM_MEMORY_MAX_MB ((uint64_t)1 << 30)

/* The configuration in force. Built by conf_parse from CUALLOC_CONF; every field has its
 * descriptor in conf.c's table (key, type, default, doc), from which README's table is made. */
typedef struct conf_s {
    /* allocator policy (PyTorch's spelling where the meaning is the same) */
    bool expandable_segments;             /* VMM chunks (default) vs classic cuMemAlloc segments */
    size_t max_split_size;                /* bytes; SIZE_MAX = unlimited (classic mode) */
    double garbage_collection_threshold;  /* fraction of the cap; 0 = off */
    unsigned roundup_power2_divisions[CONF_ROUNDUP_INTERVALS]; /* 0 or 1 = plain 512 B rounding */
    double per_process_memory_fraction;   /* of device memory; 0 = not set */
    size_t max_memory;                    /* absolute cap in bytes; 0 = not set */
    size_t chunk_size;                    /* VMM chunk bytes for the LARGE pool; 0 = granularity */
    size_t va_factor;                     /* LARGE pool VA reservation = va_factor x device memory */
    bool summary;                         /* print a stats table per device at exit */
    char exclude[CONF_PATH_MAX];          /* caller modules (globs, ';' or '|' separated) whose
                                           * allocations the front door passes to CUDA unchanged */
    /* trace recorder (trace.c) */
    char trace[CONF_PATH_MAX];            /* trace file template (%p %r %h); "" = off */
    unsigned trace_stack_depth;           /* native frames per stack, 0..64; 0 = no stacks */
    size_t trace_max;                     /* bytes the trace file may take; 0 = unbounded */
    bool trace_ring;                      /* at trace_max keep the newest events (else stop) */
    /* driver */
    driver_kind_t driver;
    /* sim device */
    size_t sim_memory;                    /* bytes per sim device, up to CONF_SIM_MEMORY_MAX_MB MiB */
    bool sim_host_backed;                 /* pointers are real host memory */
    size_t sim_granularity;               /* bytes, power of two */
    bool sim_vmm;                         /* the sim device supports VMM */
    int sim_devices;
    unsigned sim_latency_us;              /* added to every map/unmap/create/release call */
    uint64_t sim_va_base;                 /* first address handed out (deterministic reports) */
    /* injected failure: the (sim_fail_after+1)-th call of sim_fail_op fails, sim_fail_count
     * times in a row (sim_fail_op == SIM_OP_COUNT: none) */
    sim_op_t sim_fail_op;
    unsigned sim_fail_after;
    unsigned sim_fail_count;
    unsigned sim_fail_error; /* the CUresult the failures return; 0: the op's usual one */
} conf_t;

/* Fills *out with every default. */
void conf_defaults(conf_t *out);
/* Parses "key:value,key:value" (PyTorch syntax too: True/False, [a:b,c:d] lists) over the values
 * already in *out. An unknown key or bad value is reported through cua_error naming it and
 * leaves that field as it was. Returns the number of problems (0 = all applied). NULL text = "". */
int conf_parse(const char *text, conf_t *out);
/* What a heap may reserve on a device of device_total bytes: device_total, lowered by
 * per_process_memory_fraction and max_memory_mb. */
size_t conf_capacity(const conf_t *c, size_t device_total);
/* conf_defaults + conf_parse(getenv("CUALLOC_CONF")). */
void conf_load(conf_t *out);
/* An environment switch such as CUALLOC_DISABLE: unset or empty is off, else a boolean as
 * CUALLOC_CONF reads one (1/0, true/false, yes/no, on/off, any case); anything else is reported
 * and taken as on. */
bool conf_env_flag(const char *name);
/* A boolean as the configuration takes one, the len bytes at s: 1/true/yes/on or 0/false/no/off,
 * any case. NULL with *out set, else what is wrong (for a message). */
const char *conf_parse_bool(const char *s, size_t len, bool *out);
/* CUALLOC_DISABLE, read once per process: the interposer and the API decide on the same answer
 * even when the environment changes while the program runs. */
bool conf_disabled(void);
/* Writes the configuration as "key:value,..." (all keys), for traces and summaries. */
size_t conf_format(const conf_t *c, char *buf, size_t len);
/* Writes the descriptor table as a Markdown table (key | default | meaning), for the README. */
void conf_write_markdown(FILE *out);
const char *sim_op_name(sim_op_t op);

/* ======================================================================== driver_sim.c */

/* The sim device is configured from conf_t's sim_* fields. sim_configure drops every sim device,
 * handle, mapping, stream and event and builds new ones; nothing may be using the old ones. */
void sim_configure(const conf_t *c);
/* fork: sim_fork_prepare takes the sim device's lock, so that no other thread is inside a sim call
 * while the process is copied; sim_fork_release gives it back, in the parent and in the child
 * (which configures the sim afresh when it starts cualloc again). api.c's fork handlers call them. */
void sim_fork_prepare(void);
void sim_fork_release(void);
/* A stream whose work completes only when sim_stream_complete says (held), or at once (!held).
 * Unknown stream handles (including NULL, the legacy stream) behave as !held streams. */
cua_stream sim_stream_create(int dev, bool held);
void sim_stream_complete(cua_stream s);    /* all work recorded on s so far completes */
bool sim_stream_idle(cua_stream s);        /* all work recorded on s so far has completed */
void sim_stream_destroy(cua_stream s);
/* Destroys everything of device dev, as a reset of its primary context does (the fake libcuda's
 * cuDevicePrimaryCtxReset): mappings, handles, reservations, mem_alloc ranges, events, streams. */
void sim_device_reset(int dev);
/* Injected failures: the (after+1)-th next call of op fails `count` times with `err`. */
void sim_fail(sim_op_t op, unsigned after, unsigned count, cua_result err);
uint64_t sim_calls(sim_op_t op);           /* calls so far, failed ones included */
/* The sim's own host allocations refused so far (each failed its call as the device running out). */
uint64_t sim_host_refusals(void);
size_t sim_used_bytes(int dev);            /* physical bytes in use (handles + mem_alloc) */
size_t sim_live_handles(int dev);          /* physical handles not yet released */
size_t sim_live_mappings(int dev);
/* For the fake libcuda (tests/fakecuda), whose entry points name no device: the device a live
 * physical handle, event or stream belongs to, or whose reservation or mem_alloc range holds
 * `va`; -1 when none does. */
int sim_handle_device(cua_memhandle handle);
int sim_event_device(cua_event e);
int sim_stream_device(cua_stream s);
int sim_address_device(cua_devptr va);
/* The mem_alloc range or the mapping that holds `va` (what cuMemGetAddressRange answers for
 * cuMemAlloc'd and for mapped VMM memory); false when none does (a reserved address with nothing
 * mapped there included). */
bool sim_address_range(cua_devptr va, cua_devptr *base, size_t *size);
/* Host-backed only: is [va, va+size) inside one mem_alloc range, or mapped with access granted
 * throughout (so the host may touch it)? */
bool sim_range_accessible(cua_devptr va, size_t size);
/* Host-backed or not: is [va, va+size) mapped with access granted to device `dev` throughout (the
 * owner's set_access granted dev: dev is the owner or one of its enabled peers), or a mem_alloc
 * range of dev or of a device that enabled dev as a peer? */
bool sim_range_accessible_from(int dev, cua_devptr va, size_t size);
/* The peers driver_sim_ops.peer_enable recorded for dev (bit d). */
uint64_t sim_peer_mask(int dev);
/* Marks a stream capturing (a CUDA graph capture in progress) or not; the heap must then never
 * record, query or synchronize on it. */
void sim_stream_set_capturing(cua_stream s, bool capturing);
/* Marks a stream blocking (cudaStreamCreate without cudaStreamNonBlocking; streams are
 * non-blocking by default): while it captures, the legacy stream's capture query fails with
 * CUDA's ..._STREAM_CAPTURE_IMPLICIT. */
void sim_stream_set_blocking(cua_stream s, bool blocking);
/* Captures the sim invalidated so far, as CUDA would: a synchronize of a capturing stream, an
 * event recorded on one, a device synchronize while any stream of the device captures. */
uint64_t sim_captures_broken(void);
/* Invalidates every capture in progress, as CUDA does to captures in global mode when any thread in
 * global mode makes a call it deems unsafe for them (tests/fakecuda's event queries, synchronizes,
 * cuMemAlloc and cuMemFree). Returns how many. */
uint64_t sim_break_all_captures(void);
/* The device driver_sim_ops.current_device reports for the calling thread (default 0). */
void sim_set_current_device(int dev);

/* ======================================================================== oom.c */

/* What a request that found no device memory was (see oom.c for the rule). */
typedef enum { OOM_SHORTAGE = 1, OOM_DEVICE_FULL = 2, OOM_FRAGMENTATION = 3 } oom_kind_t;
/* request: the rounded size asked for; capacity: what the heap may reserve; allocated, reserved:
 * the heap's bytes at the failure; device_free: the device's free memory then (UINT64_MAX when
 * the driver could not tell, which rules out "device full"). */
oom_kind_t oom_classify(uint64_t request, uint64_t capacity, uint64_t allocated, uint64_t reserved,
                        uint64_t device_free);
/* What the heap could have had at the failure: what it held plus what the device had free
 * (saturating). */
uint64_t oom_room(uint64_t reserved, uint64_t device_free);
/* How far allocated + request exceeds limit (0 when it does not; UINT64_MAX when the excess itself
 * does not fit in 64 bits): what live memory must shrink by. */
uint64_t oom_missing(uint64_t request, uint64_t allocated, uint64_t limit);
/* A shortage only against a cap configured below the device's memory (capacity < device_total):
 * the device had room for the live blocks and the request, in all (device_total) and then
 * (device_room: what the heap held plus the device's free memory, or device_total when the driver
 * could not tell). Raising the cap fixes it. */
bool oom_cap_reached(uint64_t request, uint64_t capacity, uint64_t device_total, uint64_t allocated,
                     uint64_t device_room);

/* The VMM pools' chunk sizes, as heap_create sets them up: the large pool's is the granularity
 * doubled until it reaches chunk_size (chunk_size_mb; 0: the granularity), then halved while it
 * exceeds the cap (*wanted, when not NULL: before that halving); the small pool's is the
 * granularity doubled past CUALLOC_SMALL_MAX, so that no small block holds a whole chunk. */
uint64_t oom_vmm_large_chunk(uint64_t granularity, uint64_t chunk_size, uint64_t cap, uint64_t *wanted);
uint64_t oom_vmm_small_chunk(uint64_t granularity);
/* Why a VMM heap failed a request that oom_classify calls fragmentation (live blocks plus the
 * request fit in what it held plus the device's free memory), after releasing every whole cached
 * chunk: the new chunks (need bytes) would pass the cap, as live blocks keep the rest of what is
 * reserved in partly used chunks (whether or not address space was free for them: more of it
 * would not have served them); else no free range of its address space could take them
 * (address_space_fits false); else the device refused them. */
typedef enum {
    OOM_VMM_ADDRESS_SPACE = CUA_TRACE_VMM_ADDRESS_SPACE,
    OOM_VMM_CHUNKS = CUA_TRACE_VMM_CHUNKS,
    OOM_VMM_REFUSED = CUA_TRACE_VMM_REFUSED,
    OOM_VMM_WAITING = CUA_TRACE_VMM_WAITING, /* not oom_vmm_failure's: heap.c's oom_diagnose sees it */
} oom_vmm_failure_t; /* the trace records it as it is */
oom_vmm_failure_t oom_vmm_failure(uint64_t need, uint64_t reserved, uint64_t cap, bool address_space_fits);
/* The first fix for a shortage at chunk granularity, a clause for "First fix: ...": smaller chunks
 * where chunk_size_mb made them larger than the granularity; else the cap's key (cap_key, NULL:
 * the cap is the device's memory) where the device has room for the new chunks; else a slightly
 * smaller batch. devfree: the device's free memory as text. */
void oom_chunks_fix(char *buf, size_t len, uint64_t large_chunk, uint64_t granularity, const char *cap_key,
                    bool device_has_room, const char *devfree);
/* The key that set a cap of `cap` bytes below the device's memory: max_memory_mb where the cap
 * equals it (max_memory: its bytes, 0 when unset), else per_process_memory_fraction. */
const char *oom_cap_key(uint64_t max_memory, uint64_t cap);
/* The first fix for a fragmented address space at va_factor (a clause, as above). */
void oom_address_space_fix(char *buf, size_t len, uint64_t va_factor);

/* Classic segments (PyTorch's policy): the max_split_size_mb to advise after a fragmentation OOM of
 * `request` bytes, where `split_segment` is the size of the largest segment holding a live block
 * smaller than itself (carved by smaller requests; 0: none) and max_split the value in force
 * (bytes, SIZE_MAX: unlimited). A cached block of max_split_size_mb or more is never handed to a
 * smaller request, and is not split, so a segment at least that large stays whole for requests
 * of about its size. The value: the largest power of two MiB within both the request and that
 * segment (the whole MiB below them when that power is not above 20, the key's least); 0 when
 * there is none above 20 MiB (the only segments split are at most 20 MiB, like those requests
 * under 10 MiB share, which no value of the key governs) or it is not below the value in force.
 * garbage_collection_threshold is never advised for an OOM: it releases only wholly free segments,
 * which the heap releases anyway before it fails (PyTorch gives it for latency, not for OOMs). */
uint64_t oom_max_split_mb(uint64_t request, uint64_t split_segment, uint64_t max_split);
/* The allocator's fixes for a fragmentation OOM of `request` bytes on classic segments, in the
 * order to try, as a clause for "First fix (free): ...": expandable segments unless they were
 * asked for (then the device has no virtual memory management and they fell back to classic
 * ones), then max_split_size_mb at oom_max_split_mb(request, split_segment, max_split). Each key is
 * given as CUALLOC_CONF=KEY:VALUE, with torch_too also as PYTORCH_CUDA_ALLOC_CONF's. Returns how
 * many were written; 0 when none applies, and buf then says, as a sentence, why max_split_size_mb
 * does not. */
int oom_classic_fixes(char *buf, size_t len, uint64_t request, uint64_t split_segment, uint64_t max_split,
                      bool expandable_asked, bool torch_too);

/* The va_factor to advise after an OOM by fragmentation of the reserved address space: twice the
 * current one, at most VA_FACTOR_MAX; 0 when it is at the maximum already (no larger one to
 * advise). */
#define VA_FACTOR_MAX 1024
uint64_t oom_va_factor_next(uint64_t current);

/* ======================================================================== slab.c */

/* Fixed-size records from 64 KiB mmap'd slabs, a free list threaded through them. Not
 * thread-safe: each slab belongs to one heap and is used under its lock. Built with
 * -DCUALLOC_SLAB_MALLOC (sanitizer builds), records come from calloc/free instead, so
 * use-after-free is caught.
 * Invariant (slab_check): every record carved from the slabs is either handed out (counted in
 * `live`) or on the free list, once; the free list holds only carved records (each at a record's
 * start, below the newest slab's carving point `cur`). */
typedef struct slab_s {
    size_t rec_size;
    void *free_list;
    char *cur, *end;     /* unused tail of the newest slab */
    void *slabs;         /* list of slabs, for slab_destroy */
    size_t live;         /* records handed out and not returned */
} slab_t;
void slab_init(slab_t *s, size_t rec_size);
void *slab_alloc(slab_t *s);   /* zeroed record, or NULL when mmap fails */
void *slab_alloc_uninit(slab_t *s); /* the same, its contents unspecified (the caller sets them all) */
/* slab_alloc_uninit where that needs no call: a record from the free list, NULL when it is empty
 * (slab_alloc_uninit would then carve one, or map a slab). Inline, for the heap's fast paths, which
 * take the general path when it gives none. Malloc builds: slab_alloc_uninit itself. */
static inline void *slab_alloc_at_hand(slab_t *s) {
#ifdef CUALLOC_SLAB_MALLOC
    return slab_alloc_uninit(s);
#else
    void *r = s->free_list;
    if (r) {
        s->free_list = *(void **)r;
        s->live++;
    }
    return r;
#endif
}
void slab_free(slab_t *s, void *rec);
void slab_destroy(slab_t *s);  /* returns every slab to the system */
/* Number of invariant violations, each described on `report` (may be NULL). 0 in malloc builds. */
int slab_check(const slab_t *s, FILE *report);

/* ------------------------------------------------------------------ grow_table.c */

/* Room for one more entry in `table` (*cap entries of entry_size bytes, the first `used` in use;
 * NULL with *cap 0 before the first): the table itself where it has room; else, the entries moved
 * to an anonymous mapping twice its size (a page at least), which is returned (the old one is
 * unmapped; *cap updated). NULL when the memory is refused; the table and *cap are then unchanged.
 * Not thread-safe: the caller's lock guards the table. */
void *grow_table_reserve(void *table, size_t used, size_t *cap, size_t entry_size);
/* Unmaps a table grow_table_reserve made (nothing for NULL). */
void grow_table_free(void *table, size_t cap, size_t entry_size);

/* ======================================================================== block (heap.c) */

/* CACHED: free, parked unmerged on an exact-size quick list for its (size, tag) — the fast path
 * for the sizes a training step repeats. Merged back (flushed) before any search that misses. */
typedef enum { BLOCK_ALLOCATED = 1, BLOCK_FREE = 2, BLOCK_UNMAPPED = 3, BLOCK_CACHED = 4 } block_state_t;
typedef enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_COUNT = 2 } pool_id_t;
#define TAG_ANY 0
#define HEAP_MAX_TAGS 64
/* Blocks freed device-wide (cudaFree while non-blocking streams exist): reusable by no stream until
 * work on the legacy stream and on every known non-blocking stream up to the free has completed.
 * Two tags take turns (heap.c: the device-wide generations): frees go to the open one, and the
 * events recorded for the group cover exactly the other, closed one, so blocks freed after the
 * events were recorded never keep the covered ones waiting. Never a real stream's tag, never on a
 * quick list, never merged with a TAG_ANY neighbour (it would hide that memory from every stream).
 * Stream tags are 1 .. TAG_STREAMS_END - 1. */
#define TAG_DW_A (HEAP_MAX_TAGS - 2)
#define TAG_DW_B (HEAP_MAX_TAGS - 1)
#define TAG_STREAMS_END TAG_DW_A
static inline bool tag_is_device_wide(unsigned tag) { return tag >= TAG_DW_A; }

typedef struct block_s block_t;
struct block_s {
    uintptr_t addr;          /* device address; multiple of CUALLOC_ALIGN */
    size_t size;             /* bytes; multiple of CUALLOC_ALIGN; > 0 */
    block_t *prev, *next;    /* address-order neighbours in the same segment; NULL at its ends,
                              * and addr + size == next->addr */
    union {                  /* links of the free index or quick list the block is in */
        struct { block_t *prev_free, *next_free; } list;  /* TLSF bin list */
        struct { block_t *left, *right; } tree;           /* classic treap */
    } link;
    block_t *seg_prev, *seg_next; /* first block of each segment: the pool's segment list. The
                              * first block of a segment keeps its record for the segment's life
                              * (splits and merges that touch it keep its record: heap.c). */
    union {
        size_t requested;    /* ALLOCATED: the caller's size */
        size_t releasable;   /* FREE (in its index): the bytes a release could return now, kept by
                              * the index's accounting (heap.c: free_account_add, free_resize) */
    };
    cua_stream stream;       /* ALLOCATED: the stream it was allocated on */
    uint32_t prio;           /* treap priority (classic) */
    uint32_t gc_base;        /* classic GC: pool's free-block-search count when freed */
    uint16_t tag;            /* FREE: stream tag (TAG_ANY = safe for every stream) */
    uint8_t state;           /* block_state_t */
    uint8_t pool;            /* pool_id_t */
    uint16_t bin;            /* in a TLSF index: its bin, SC_BIN(fl, sl) (set by
                              * sizeclass_insert, so that removal need not map the size again; a
                              * block's size does not change while it is in an index) */
    uint16_t quick_hint;     /* VMM: the quick list it was last parked on (a bucket index, any
                              * value below the bucket count; only a hint: the list's key decides) */
};

/* ======================================================================== ptrmap.c */

/* Allocated blocks by address (classic mode): open addressing with linear probing and
 * backward-shift deletion, table memory from mmap, grown at half full. Not thread-safe (used under
 * the heap lock).
 * Invariant (ptrmap_check): the capacity is a power of two that the shift matches; every key sits
 * in its probe run, with no other entry of its key before it; count equals the occupied slots and
 * is at most half the capacity; an empty slot holds no block, a key the block at that address. */
typedef struct ptrmap_entry_s { uintptr_t key; block_t *val; } ptrmap_entry_t;
typedef struct ptrmap_s {
    ptrmap_entry_t *slots;
    size_t mask;        /* capacity - 1; capacity a power of two */
    unsigned shift;     /* 64 - log2(capacity) */
    size_t count;
} ptrmap_t;
bool ptrmap_init(ptrmap_t *m);
void ptrmap_destroy(ptrmap_t *m);
bool ptrmap_grow(ptrmap_t *m); /* doubles the table; false when no memory could be had */
/* Look-up, insertion and removal are inline: every allocation and free outside the quick lists
 * makes one or two, and a call costs about as much as the work. An empty slot has key 0 and val
 * NULL (keys are block addresses, never 0). */
static inline size_t ptrmap_home(const ptrmap_t *m, uintptr_t key) {
    /* Fibonacci hashing of the address without its always-zero low bits. */
    return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> m->shift);
}
/* The slot holding key, or the empty slot that ends its probe run. */
static inline size_t ptrmap_find(const ptrmap_t *m, uintptr_t key) {
    size_t i = ptrmap_home(m, key);
    while (m->slots[i].key != key && m->slots[i].key) i = (i + 1) & m->mask;
    return i;
}
static inline block_t *ptrmap_get(const ptrmap_t *m, uintptr_t key) { return m->slots[ptrmap_find(m, key)].val; }
/* Puts (key, val) in the first empty slot of key's probe run (key is not in the map; the table has
 * room). Also what ptrmap_grow re-inserts with. */
static inline void ptrmap_place(ptrmap_t *m, uintptr_t key, block_t *val) {
    size_t i = ptrmap_home(m, key);
    while (m->slots[i].key) i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
}
/* false when the table had to grow and could not */
static inline bool ptrmap_insert(ptrmap_t *m, uintptr_t key, block_t *val) {
    if (__builtin_expect((m->count + 1) * 2 > m->mask + 1, 0) && !ptrmap_grow(m)) return false;
    ptrmap_place(m, key, val);
    m->count++;
    return true;
}
/* The record under key, removed; NULL when key is not in the map. Later entries of the run shift
 * back into the hole unless their home lies after it. */
static inline block_t *ptrmap_remove(ptrmap_t *m, uintptr_t key) {
    size_t i = ptrmap_find(m, key);
    block_t *val = m->slots[i].val;
    if (!val) return NULL;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t h = ptrmap_home(m, m->slots[j].key);
        if (((j - h) & m->mask) >= ((j - i) & m->mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key = 0;
    m->slots[i].val = NULL;
    m->count--;
    return val;
}
void ptrmap_foreach(const ptrmap_t *m, void (*fn)(block_t *, void *), void *arg);
int ptrmap_check(const ptrmap_t *m, FILE *report);

/* ======================================================================== sizeclass.c */

/* A TLSF-style segregated free index: sizes (multiples of 512 B) fall into bins of 32 per power
 * of two, each bin a doubly linked list, two levels of bitmaps saying which bins are non-empty.
 * insert/remove/search are O(1). Invariant (sizeclass_check): a bin's bit is set iff its list is
 * non-empty, and a first-level bit iff its second-level word is non-zero; every block in a bin maps
 * to that bin and records it (block_t.bin); each block's back link names the block before it (the
 * head's is NULL); `count` and `bytes` equal the lists' totals. */
#define SC_SL_LOG2 5
#define SC_SL_COUNT (1u << SC_SL_LOG2)
#define SC_UNIT_SHIFT 9 /* sizes are counted in 512 B units */
/* First levels for every size a size_t holds (units below 2^(64 - SC_UNIT_SHIFT)), not only for
 * requests: the large pool's first UNMAPPED block is its whole reservation, va_factor (up to
 * 1024) times device memory, which reaches 2^53 B and more on a sim device of 1 PiB
 * (sim_memory_mb's largest) with va_factor 8 or more. */
#define SC_FL_COUNT (64 - SC_UNIT_SHIFT - SC_SL_LOG2 + 1)
#define SC_BIN(fl, sl) ((fl) * SC_SL_COUNT + (sl))
_Static_assert(SC_FL_COUNT <= 64, "sizeclass_t.fl_bitmap holds a bit per first level");
typedef struct sizeclass_s {
    uint64_t fl_bitmap;
    uint32_t sl_bitmap[SC_FL_COUNT];
    block_t *bins[SC_FL_COUNT * SC_SL_COUNT]; /* bin SC_BIN(fl, sl), the number block_t.bin holds */
    size_t count, bytes;
} sizeclass_t;
void sizeclass_init(sizeclass_t *sc);
/* Bin of a size (also used by the tests). */
static inline void sizeclass_mapping(size_t size, unsigned *fl, unsigned *sl) {
    uint64_t u = size >> SC_UNIT_SHIFT;
    if (u < SC_SL_COUNT) {
        *fl = 0;
        *sl = (unsigned)u;
    } else {
        unsigned f = floor_log2(u);
        *fl = f - SC_SL_LOG2 + 1;
        *sl = (unsigned)(u >> (f - SC_SL_LOG2)) - SC_SL_COUNT;
    }
}
/* Insert, remove and resize are inline: the heap's miss path does one or two of them per request,
 * and a call costs as much as the work. A block goes to the front of its bin (sizeclass_find's
 * choice among equals depends on that order). link/unlink do the lists and bitmaps, not the
 * counters. */
static inline void sizeclass_link(sizeclass_t *sc, block_t *b, unsigned fl, unsigned sl) {
    unsigned bin = SC_BIN(fl, sl);
    block_t *head = sc->bins[bin];
    b->link.list.prev_free = NULL;
    b->link.list.next_free = head;
    if (head) head->link.list.prev_free = b;
    sc->bins[bin] = b;
    b->bin = (uint16_t)bin;
    sc->sl_bitmap[fl] |= 1u << sl;
    sc->fl_bitmap |= 1ull << fl;
}
static inline void sizeclass_unlink(sizeclass_t *sc, block_t *b) {
    block_t *p = b->link.list.prev_free, *n = b->link.list.next_free;
    if (n) n->link.list.prev_free = p;
    if (p) {
        p->link.list.next_free = n;
    } else {
        sc->bins[b->bin] = n;
        if (!n) {
            unsigned fl = b->bin / SC_SL_COUNT, sl = b->bin % SC_SL_COUNT;
            sc->sl_bitmap[fl] &= ~(1u << sl);
            if (!sc->sl_bitmap[fl]) sc->fl_bitmap &= ~(1ull << fl);
        }
    }
}
static inline void sizeclass_insert(sizeclass_t *sc, block_t *b) {
    unsigned fl, sl;
    sizeclass_mapping(b->size, &fl, &sl);
    sizeclass_link(sc, b, fl, sl);
    sc->count++;
    sc->bytes += b->size;
}
static inline void sizeclass_remove(sizeclass_t *sc, block_t *b) {
    sizeclass_unlink(sc, b);
    b->link.list.prev_free = b->link.list.next_free = NULL;
    sc->count--;
    sc->bytes -= b->size;
}
/* b, in the index, takes size `size`: it ends at the front of that size's bin, exactly as remove
 * then insert would leave it, and when it heads that bin already nothing moves. */
static inline void sizeclass_resize(sizeclass_t *sc, block_t *b, size_t size) {
    unsigned fl, sl;
    sizeclass_mapping(size, &fl, &sl);
    sc->bytes += size - b->size;
    b->size = size;
    if (b->bin == SC_BIN(fl, sl) && !b->link.list.prev_free) return;
    sizeclass_unlink(sc, b);
    sizeclass_link(sc, b, fl, sl);
}
/* sizeclass_resize where b is the index's only block (count == 1), so that its bin's bits are the
 * bitmaps' only ones and nothing else is in its lists: the bitmaps and bins are written, not read.
 * The large pool's free remainder in a training step, carved and merged back, is such a block,
 * and crosses bins on most of those changes. */
static inline __attribute__((always_inline)) void sizeclass_resize_only(sizeclass_t *sc, block_t *b, size_t size) {
    unsigned fl, sl;
    sizeclass_mapping(size, &fl, &sl);
    sc->bytes = size;
    b->size = size;
    unsigned bin = SC_BIN(fl, sl), old = b->bin;
    if (old == bin) return;
    sc->bins[old] = NULL;
    sc->sl_bitmap[old / SC_SL_COUNT] = 0; /* before the new level's bit: the level may be the same */
    sc->sl_bitmap[fl] = 1u << sl;
    sc->fl_bitmap = 1ull << fl;
    sc->bins[bin] = b;
    b->bin = (uint16_t)bin;
}
/* The index's only block, when it has exactly one (count == 1): the bitmaps' only bits name its bin. */
static inline block_t *sizeclass_only(const sizeclass_t *sc) {
    unsigned fl = (unsigned)__builtin_ctzll(sc->fl_bitmap);
    return sc->bins[SC_BIN(fl, (unsigned)__builtin_ctz(sc->sl_bitmap[fl]))];
}
/* How many blocks of the request's own bin are examined for a closer fit before moving on to the
 * next non-empty bin, whose every block is large enough. Bounds search at O(1) but in the case
 * below. */
#define SC_OWN_BIN_SCAN 8
/* The first non-empty bin above bin (fl, sl), whose every block is larger than any of (fl, sl)'s;
 * 0 when there is none (bin 0 is above no bin). */
static inline unsigned sizeclass_above(const sizeclass_t *sc, unsigned fl, unsigned sl) {
    uint32_t sl_map = (uint32_t)(((uint64_t)sc->sl_bitmap[fl] >> (sl + 1)) << (sl + 1));
    if (sl_map) return SC_BIN(fl, __builtin_ctz(sl_map));
    uint64_t fl_map = fl + 1 < 64 ? (sc->fl_bitmap >> (fl + 1)) << (fl + 1) : 0;
    if (!fl_map) return 0;
    unsigned f = (unsigned)__builtin_ctzll(fl_map);
    return SC_BIN(f, __builtin_ctz(sc->sl_bitmap[f]));
}
/* sizeclass_find when the scan of the own bin (fl, sl) was cut short without a fit, out of line:
 * the first block of the next non-empty bin if that bin is the adjacent one; otherwise a fit in
 * the rest of the own bin is closer than anything above, so the rest is scanned first. */
block_t *sizeclass_find_cut(const sizeclass_t *sc, unsigned fl, unsigned sl, size_t size);
/* sizeclass_find without its out-of-line part, for the heap's fast paths, which make no calls that
 * return to them: SC_FIND_CUT where the scan of the own bin was cut short (sizeclass_find then
 * calls sizeclass_find_cut), else sizeclass_find's answer. */
#define SC_FIND_CUT ((block_t *)(uintptr_t)1)
static inline __attribute__((always_inline)) block_t *sizeclass_find_uncut(const sizeclass_t *sc, size_t size) {
    unsigned fl, sl;
    sizeclass_mapping(size, &fl, &sl);
    if (!sc->fl_bitmap) return NULL;
    /* Own bin: it may hold blocks both smaller and larger than the request. */
    block_t *best = NULL;
    int scanned = 0;
    for (block_t *b = sc->bins[SC_BIN(fl, sl)]; b && scanned < SC_OWN_BIN_SCAN; b = b->link.list.next_free, scanned++) {
        if (b->size == size) return b;
        if (b->size > size && (!best || b->size < best->size)) best = b;
    }
    if (best) return best;
    if (__builtin_expect(scanned == SC_OWN_BIN_SCAN, 0)) return SC_FIND_CUT;
    unsigned above = sizeclass_above(sc, fl, sl);
    return above ? sc->bins[above] : NULL;
}
/* A block of size >= size: the best fit among a few of the request's own bin, else the first of
 * the next non-empty bin (every block there is larger), so at most one bin above the best fit's
 * (sizeclass_find_cut). NULL when none. Does not remove it. */
static inline __attribute__((always_inline)) block_t *sizeclass_find(const sizeclass_t *sc, size_t size) {
    block_t *b = sizeclass_find_uncut(sc, size);
    if (__builtin_expect(b == SC_FIND_CUT, 0)) {
        unsigned fl, sl;
        sizeclass_mapping(size, &fl, &sl);
        return sizeclass_find_cut(sc, fl, sl, size);
    }
    return b;
}
/* The largest block (scans the top non-empty bin). NULL when empty. */
block_t *sizeclass_largest(const sizeclass_t *sc);
/* Calls fn on every block (order unspecified); fn must not modify the index. */
void sizeclass_foreach(const sizeclass_t *sc, void (*fn)(block_t *, void *), void *arg);
int sizeclass_check(const sizeclass_t *sc, FILE *report);

/* ======================================================================== tree.c */

/* The classic-mode free index: a treap ordered by (size, addr), giving PyTorch's exact best fit
 * (the smallest block not smaller than the request, lowest address first). O(log n) expected. */
typedef struct tree_s {
    block_t *root;
    size_t count, bytes;
    uint32_t rng;   /* priority generator state */
} tree_t;
void tree_init(tree_t *t);
void tree_insert(tree_t *t, block_t *b);
void tree_remove(tree_t *t, block_t *b);
block_t *tree_lower_bound(const tree_t *t, size_t size); /* smallest (size, addr) with size >= size */
block_t *tree_largest(const tree_t *t);
/* In-order traversal (ascending size, then address). fn may not modify the tree. */
void tree_foreach(const tree_t *t, void (*fn)(block_t *, void *), void *arg);
/* In-order list of up to `max` blocks into out[], returns the count (for loops that release). */
size_t tree_collect(const tree_t *t, block_t **out, size_t max);
int tree_check(const tree_t *t, FILE *report);

/* ======================================================================== heap.c */

typedef struct heap_s heap_t;

/* Creates device `dev`'s heap over `drv` (which must be initialized). NULL on failure, with *err
 * the driver's error (CUA_ERROR_HOST_MEMORY when host memory ran out for the heap's own tables)
 * and a message printed. */
heap_t *heap_create(int dev, const conf_t *conf, const driver_ops_t *drv, cua_result *err);
/* Frees every block, unmaps and releases everything, returns the VA. Live pointers die. */
void heap_destroy(heap_t *h);
/* Stream keys: handles the heap orders blocks by that name no CUDA stream (the front door's key for
 * one thread's cudaStreamPerThread, interpose.c). Their top bit is set, which no user-space address
 * and no special handle (CU_STREAM_LEGACY 0x1, CU_STREAM_PER_THREAD 0x2) has. The heap never hands
 * a key to the driver: an event or a synchronize on it would act on no stream (or crash it). */
#define STREAM_KEY_BIT ((uintptr_t)1 << (sizeof(uintptr_t) * 8 - 1))
static inline cua_stream stream_key_make(const void *unique) { return (cua_stream)((uintptr_t)unique | STREAM_KEY_BIT); }
static inline bool stream_is_key(cua_stream s) { return ((uintptr_t)s & STREAM_KEY_BIT) != 0; }

/* 0 and *out on success; CUA_ERROR_OUT_OF_MEMORY (after releasing cache and retrying) or the
 * driver's error otherwise. `stream` may be a key (stream_key_make). Thread-safe. */
cua_result heap_alloc(heap_t *h, size_t size, cua_stream stream, void **out);
/* An allocation with cudaMalloc's meaning: no stream's earlier work may still use the block, for
 * it may serve any stream. With no non-blocking stream this is heap_alloc on the legacy stream
 * (whose freed blocks every blocking stream's later work waits for; the first non-blocking stream
 * created afterwards waits for it too: heap_stream_created synchronizes the legacy stream once).
 * Otherwise, in VMM mode, it allocates under DEVICE_WIDE_ALLOC_KEY, which no free names: no block
 * freed on the legacy stream until that stream's event says the device is past it, and its fresh
 * memory is everyone's (TAG_ANY). Classic mode keeps the legacy stream (its segments serve one
 * stream, which a key would strand); the front door's legacy frees (heap_free_on_legacy) keep that
 * safe. */
cua_result heap_alloc_device_wide(heap_t *h, size_t size, void **out);
/* The key of heap_alloc_device_wide's allocations (stream_key_make of a fixed address). */
extern const char heap_device_wide_alloc_name;
#define DEVICE_WIDE_ALLOC_KEY stream_key_make(&heap_device_wide_alloc_name)
/* heap_alloc returning the pointer, NULL on failure (whichever error heap_alloc would return). */
void *heap_malloc(heap_t *h, size_t size, cua_stream stream);
/* Frees ptr ordered on stream. Returns false (and does nothing) when h does not own ptr. */
bool heap_free(heap_t *h, void *ptr, cua_stream stream);
/* heap_free ordered on the legacy stream (cudaFreeAsync(p, 0)), in a heap whose cudaMalloc takes the
 * legacy stream's blocks at once (heap_alloc_device_wide): the front door's legacy-stream free. In
 * classic mode while a non-blocking stream exists, whose work does not wait for the legacy stream's,
 * the block is freed device-wide instead (it waits for the legacy stream's event, as cudaFree's do);
 * with none yet, the first one created synchronizes the legacy stream once, as after a device-wide
 * allocation served as the legacy stream. In VMM mode, plain heap_free(h, ptr, NULL). */
bool heap_free_on_legacy(heap_t *h, void *ptr);
/* heap_free for a pointer the caller found in the reservation of h's small (large) pool
 * (heap_pool_range), which h therefore owns or nobody does: when h has no allocated block at ptr (a
 * pointer not returned by cualloc, or one freed already) it reports that and ignores it. Returns
 * nothing, so that the front door's common case is a tail call. */
void heap_free_in_small_pool(heap_t *h, void *ptr, cua_stream stream);
void heap_free_in_large_pool(heap_t *h, void *ptr, cua_stream stream);
/* Does ptr fall in memory this heap manages? (Exact for VMM; for classic, an allocated block or a
 * segment's base: freed again, the driver would take that for the segment.) */
bool heap_owns(heap_t *h, const void *ptr);
/* Does ptr fall anywhere in memory this heap holds from the driver, allocated to the program or
 * not: a VMM pool's reservation, any byte of a classic segment? O(blocks) in classic mode. */
bool heap_holds(heap_t *h, const void *ptr);
/* Classic mode: does one of h's segments (one cuMemAlloc) start at ptr? False in VMM mode. */
bool heap_starts_segment(heap_t *h, const void *ptr);
/* The requested size of an allocated block, or SIZE_MAX when ptr is not one of h's. */
size_t heap_block_size(heap_t *h, const void *ptr);
void heap_get_stats(heap_t *h, cualloc_stats *out);
/* heap_get_stats that leaves h's lock held, so that nothing on h changes (and no event of h's is
 * recorded) until heap_stats_release: a trace's END record then states the heap as its last event
 * left it. Heaps are held in device order, under api.c's create_lock. */
void heap_stats_hold(heap_t *h, cualloc_stats *out);
/* Calls attempt(arg) until it returns true, 1 ms apart, for at most wait_ms milliseconds: the
 * exit-time way to take a lock that may never come free (heap_stats_try_hold, api.c). */
bool retry_for_ms(bool (*attempt)(void *), void *arg, unsigned wait_ms);
/* heap_stats_hold at exit: false (nothing held) when h's lock stays taken for wait_ms. A signal
 * handler that calls exit() may have interrupted this very thread inside the heap, and its lock
 * would then never come free. */
bool heap_stats_try_hold(heap_t *h, cualloc_stats *out, unsigned wait_ms);
void heap_stats_release(heap_t *h);
/* Every gauge's peak set to its current value (cualloc_reset_peaks). */
void heap_reset_peaks(heap_t *h);
/* For cualloc_oom_message, read together under the heap's lock: its statistics, the device's free
 * memory (*dknown false when the driver could not tell) and the diagnosis of its last failed
 * request, or, before any has failed, what a request of `size` bytes would be diagnosed as now.
 * Returns the driver's error where the last failed request failed for one that is not out of
 * memory (heap_alloc returned it), else CUA_SUCCESS. */
cua_result heap_oom_facts(heap_t *h, size_t size, cualloc_stats *out, size_t *dfree, bool *dknown, char *diagnosis,
                          size_t len);
void heap_trim(heap_t *h);
/* The stream is being destroyed: settle its free blocks so its handle can be reused, and forget it
 * as a non-blocking stream. */
void heap_stream_destroyed(heap_t *h, cua_stream stream);
/* The front door saw `stream` created on this heap's device. Non-blocking streams (flag 0x1) are
 * not ordered by the legacy stream, so device-wide frees must wait for them too; a blocking one
 * only drops a stale non-blocking registration of a reused handle. */
void heap_stream_created(heap_t *h, cua_stream stream, bool non_blocking);
/* Non-blocking streams were created on this heap's device that it was not told of (the front door
 * could not remember them all): as with more than its table holds, device-wide frees then settle
 * only through a device synchronize. */
void heap_streams_untracked(heap_t *h);
/* Frees ptr with cudaFree's meaning: no stream may get it again while earlier work on any stream
 * may still use it. The block gets the open device-wide tag (also with no non-blocking stream
 * known: the legacy stream does not order two blocking streams, or two threads' per-thread
 * streams, among themselves) and settles once events on the legacy stream (which waits for every
 * blocking stream's earlier work) and every non-blocking stream, recorded after the free
 * (by a later device-wide free, every few of them, or by an allocation that misses), have
 * completed, or after a device synchronize, which an allocation makes rather than map new memory
 * while such blocks are pending (cudaFree itself would have synchronized). False when h does not
 * own ptr. */
bool heap_free_device_wide(heap_t *h, void *ptr);
/* Peer access changed for this heap's device (driver peer_enable): grants access again over every
 * mapped chunk range, so the enabled peers can reach existing memory. VMM only; no-op in classic. */
void heap_peer_enabled(heap_t *h);
/* The allocated block containing ptr (interior pointers too): its base and size (the block's
 * bytes, as cuMemGetAddressRange reports for cudaMalloc memory). False when none does: a freed
 * block (cached, still mapped) holds no allocation, as for CUDA's freed memory. */
bool heap_block_range(heap_t *h, const void *ptr, uintptr_t *base, size_t *size);
/* Allocations that failed because host memory was refused for the heap's own tables (counted in
 * num_ooms too, where the device's refusals are). */
uint64_t heap_host_refusals(heap_t *h);
/* Number of invariant violations, each described on `report` (may be NULL). */
int heap_check(heap_t *h, FILE *report);
/* Every block of every pool, one per line, and the stream records (debugging). */
void heap_dump(heap_t *h, FILE *out);
/* Test support: the block records, for corruption tests of heap_check. */
block_t *heap_test_find_block(heap_t *h, const void *ptr);
cualloc_stats *heap_test_stats(heap_t *h);               /* the heap's own counters */
cua_memhandle *heap_test_chunk(heap_t *h, const void *ptr); /* chunk table entry under ptr (VMM) */
sizeclass_t *heap_test_unmapped_index(heap_t *h, pool_id_t pool); /* the pool's index of UNMAPPED blocks */
block_t **heap_test_live_slot(heap_t *h, const void *ptr); /* VMM: ptr's entry in its pool's live table */
/* The fields of stream tag t's record that the stream-generation invariants bind. */
void heap_test_tag_fields(heap_t *h, unsigned t, bool **closed, bool **in_flight, uint16_t **partner);
/* The rest of the heap's own fields that heap_check binds, for its corruption tests. */
typedef struct {
    slab_t *records;          /* block records */
    ptrmap_t *classic_live;   /* classic mode: the live blocks by address */
    unsigned *last_tag;       /* the stream cache (tag_of's one entry) */
    unsigned *dw_open;        /* the open device-wide generation */
    unsigned *n_retired;      /* destroyed streams' events still awaited */
} heap_test_fields_t;
void heap_test_fields(heap_t *h, heap_test_fields_t *out);
/* The mask of tags in use (bit t: tags[t]), and the stream tag t names. */
void heap_test_tag_owner(heap_t *h, unsigned t, uint64_t **used_mask, cua_stream **handle);
/* Quick list i (< 1024): its key, its count and its bit in the non-empty bitmap's word (*word,
 * bit *bit). The list of a CACHED block b is b->quick_hint. */
void heap_test_quick(heap_t *h, unsigned i, uint64_t **key, uint32_t **count, uint64_t **word, unsigned *bit);
/* Quick lists handed over so far from an idle stream to one that missed (heap.c:
 * quick_hand_over_idle). */
uint64_t heap_test_quick_handed_over(const heap_t *h);
bool heap_is_vmm(const heap_t *h);
int heap_device(const heap_t *h); /* the device ordinal it serves */
/* The VA range [lo, hi) of a VMM pool (empty in classic mode). Fixed for the heap's life. */
void heap_pool_range(const heap_t *h, pool_id_t pool, uintptr_t *lo, uintptr_t *hi);
size_t heap_chunk_size(const heap_t *h, pool_id_t pool);
/* A consistent picture of the heap for a trace started mid-run, in one critical section under
 * the heap lock: mapped(dev, addr, size, arg) for every range of physical memory (VMM: runs of
 * mapped chunks; classic: segments), then live(dev, block, arg) for every allocated block in
 * address order, then done(dev, arg). The callbacks must not call the heap (any may be NULL).
 * From then on the heap's fast paths stand aside, so that every later change reaches the
 * recorder, until a slow path finds the recorder stopped. */
void heap_snapshot(heap_t *h, void (*mapped)(int dev, uintptr_t addr, size_t size, void *arg),
                   void (*live)(int dev, const block_t *b, void *arg), void (*done)(int dev, void *arg),
                   void *arg);

/* Size rounding as PyTorch's round_size: 512 B minimum and multiple, or the next of
 * roundup_power2_divisions steps. */
size_t heap_round_size(const conf_t *c, size_t size);

/* ======================================================================== stats.c */

/* Writes stats as one JSON object (every field of cualloc_stats), or as an aligned text table. */
void stats_write_json(const cualloc_stats *s, FILE *out);
void stats_write_text(const cualloc_stats *s, int device, FILE *out);

/* ======================================================================== trace.c */

/* The trace recorder (format: include/cualloc_trace.h). The hooks are called by the heap with its
 * lock held, each behind `if (trace_enabled())`, so a disabled recorder costs one predictable
 * branch; they take only the recorder's own short lock (ranked below every heap lock) and never
 * call the heap. Events of a device the recorder has not begun (trace_device_begin) are skipped,
 * so a trace started mid-run neither loses nor doubles what its snapshot covers. */
extern _Atomic bool trace_enabled_flag;
static inline bool trace_enabled(void)
{
    return __builtin_expect(atomic_load_explicit(&trace_enabled_flag, memory_order_relaxed), 0);
}
/* Opens a new trace file from a template (%p pid, %r rank, %h host, %% %) and writes the
 * process, configuration and known-device records. 0, or -1 with a message (already tracing,
 * symlink at the path, cannot create). Does not take heap locks. */
int trace_start(const char *tmpl, const conf_t *conf);
/* Writes the END record with per_dev[d] (NULL: no heap) for d < ndev, and closes the file. */
void trace_stop(const cualloc_stats *const *per_dev, int ndev);
bool trace_active(void);
size_t trace_path(char *out, size_t len); /* the file being written ("" when none) */
/* Front doors call this before taking any heap lock, behind `if (trace_enabled())`: captures the
 * call stack (trace_stack_depth native frames, plus Python frames when the thread holds the GIL)
 * and keeps its id for the thread's next alloc or OOM event. The recorder drops the frames up to
 * and including the function that called it, plus `skip` more (front doors reached through their
 * own wrappers); that function must be a real frame: mark it noinline. For the LD_PRELOAD entry
 * points: it never waits for the GIL (their callers may hold locks a GIL holder waits for). */
void trace_capture_stack(int skip);
/* The same for a front door that passes its own return address (__builtin_return_address(0)) to
 * an out-of-line helper it may or may not tail-call: the stack starts at the frame that address
 * lies in, whichever frames the compiler left between. For the public API (cualloc_malloc, which
 * PyTorch's pluggable allocator calls holding no lock): a thread with a Python thread state that
 * let the GIL go takes it back for the capture, so PyTorch's allocations get their Python lines. */
void trace_capture_stack_from(const void *caller_ip);
/* Event hooks (heap.c). Sizes are bytes; requested is the caller's size. trace_on_free records
 * a free requested and completed at once (the heap makes a block reusable by its stream at
 * once); the two separate ones are for stream-ordered frees that complete later. */
void trace_on_alloc(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested);
void trace_on_free(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested);
void trace_on_free_requested(int dev, cua_stream s, uintptr_t addr, size_t size);
void trace_on_free_completed(int dev, cua_stream s, uintptr_t addr, size_t size);
void trace_on_map(int dev, uintptr_t addr, size_t size);
void trace_on_unmap(int dev, uintptr_t addr, size_t size);
void trace_on_trim(int dev);
void trace_on_oom(int dev, cua_stream s, size_t requested, size_t rounded, size_t capacity, size_t allocated,
                  size_t reserved, size_t device_free, size_t largest_free, unsigned vmm_failure);
/* heap_create: remembered for every later trace; recorded (and the device begun) when tracing. */
void trace_on_device(int dev, const char *name, size_t total, size_t capacity, size_t granularity, bool vmm);
/* Snapshot records (api.c, through heap_snapshot), written before the device is begun. */
void trace_on_initial_block(int dev, cua_stream s, uintptr_t addr, size_t size, size_t requested);
void trace_on_initial_map(int dev, uintptr_t addr, size_t size);
void trace_device_begin(int dev);
bool trace_device_begun(int dev);
void trace_mark(const char *label);
/* fork's prepare and parent handlers (api.c): the fork waits until no thread is inside the
 * recorder, so the child's copy of its tables is whole. Taken after every other lock of api.c's
 * prepare handler. */
void trace_fork_prepare(void);
void trace_fork_parent(void);
/* In a forked child: drops the parent's file (never writes to it). True, with the template in
 * tmpl_out, when the child should open its own (the template has %p). */
bool trace_after_fork_child(char *tmpl_out, size_t len);
/* Expands a template; returns its length, 0 when it does not fit in len. *has_pid (may be NULL):
 * whether it held a %p. */
size_t trace_expand_path(const char *tmpl, char *out, size_t len, bool *has_pid);
/* Number of invariant violations of the open file's blocks, ring and cursors (trace.c states them
 * next to the recorder's state), each described on `report` (may be NULL); 0 when no file is open.
 * Reads every block header back from the file: for tests. */
int trace_check(FILE *report);
/* Tests: the recorder's fields trace_check binds, for its corruption tests (valid while the file
 * stays open). */
typedef struct {
    uint64_t *ring;             /* the ring's list (max_blocks entries); NULL for a linear file */
    uint64_t *ring_start, *ring_count, *meta_blocks, *nblocks;
    size_t *ev_pos;             /* the EVENT cursor's position, its next serial, its last record */
    uint64_t *ev_serial, *ev_last_seq;
    uint64_t max_blocks;
} trace_test_fields_t;
void trace_test_fields(trace_test_fields_t *out);
/* Tests: the block size of files opened later (a multiple of the page size; 0 = default), and
 * the number of records written to the current file. */
void trace_set_block_size(uint32_t bytes);
/* Tests: the page size files opened later are laid out for (0 = the system's). */
void trace_set_page_size(uint32_t bytes);
uint64_t trace_test_records(void);
/* Tests: writes a record of any type (one a reader may not know) into the current META or EVENT
 * block, leaving the delta state alone. */
bool trace_test_raw(bool event_block, uint8_t type, const void *payload, size_t len);
/* Tests: what the recorder does when host memory is refused for one of its tables
 * (CUA_TRACE_LOST_*) while it records: the LOST record, once per table, and the message. */
void trace_test_table_refused(unsigned table);

/* ======================================================================== api.c */

/* The process-wide state behind the public API: configuration, driver, one heap per device. */
const conf_t *api_conf(void);
const driver_ops_t *api_driver(void);
/* The device's heap, created on first use. NULL when the device is not valid. */
heap_t *api_heap(int device);
/* cualloc_trace_start with the trace settings (stack depth, size bound, ring) of `conf` instead
 * of the configuration in force: snapshots every existing heap into the new trace. */
int api_trace_start(const char *path, const conf_t *conf);
/* For the front doors (interpose.c), which must not start anything for a call that needs no
 * heap: has api_init run? */
bool api_started(void);
/* Devices known (0 before api_init has run). */
int api_device_count(void);
/* The device's heap if it exists already (never creates one, never initializes). */
heap_t *api_heap_if_created(int device);
/* Before a reset of device's primary context: its heap is unlisted and destroyed (every pointer into
 * it dies, as CUDA's do); the next allocation makes a new one. */
void api_device_reset(int device);
/* The heap that owns ptr (an allocated block of it, or inside its VMM ranges), NULL when none
 * does or api_init has not run. Lock-free for VMM heaps. */
heap_t *api_owner(const void *ptr);
/* The heap whose memory holds ptr, allocated or not (heap_holds: a classic segment's interior
 * too), NULL when none does or api_init has not run. Lock-free for VMM heaps; for classic ones a
 * walk of their segments. */
heap_t *api_holder(const void *ptr);

/* ======================================================================== interpose.c */

/* The real dlsym (libc's), for cualloc's own look-ups: libcualloc.so exports a dlsym that
 * interposes the process's, so every look-up of its own must bypass it. Weak: objects that
 * link parts of the library without interpose.c (the fake libcuda, white-box tests) fall back
 * to plain dlsym. */
void *interpose_real_dlsym(void *handle, const char *symbol) __attribute__((weak));

#endif
