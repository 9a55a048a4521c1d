/* replay.c — `allocview replay TRACE [--conf CONF]... [--memory SIZE] [--passes N] [--cudafree
 * [--device-lag N]] [--min-fit] [--json]`.
 *
 * The trace is read once into a compact array of requests (24 bytes each); every run then feeds
 * that array to fresh heaps (heap.c, linked as the static library cualloc_internal — the trace
 * recorder is linked too but never started, so a replay records nothing) on the sim device
 * without host backing:
 *   INIT_BLOCK  (blocks live when recording started) allocated first, in the trace's order;
 *   ALLOC       heap_alloc(requested bytes, the recorded stream); the replayed pointer is kept in
 *               a map recorded (dev, addr) -> replayed pointer;
 *   FREE        heap_free of the mapped pointer on the free's stream (requested and completed
 *               frees alike; FREE_DONE changes nothing: the heap orders reuse by stream itself);
 *   TRIM        heap_trim;
 *   OOM         the request that failed is tried again: a replay can show that the job would have
 *               gone on. A retried request that succeeds stays live to the end of the trace (the
 *               trace never says when the job would have freed it).
 * --passes N runs the requests N times on the same heaps, as a job repeats its steps: every pass
 * after the first starts where the trace started, so the previous pass is closed first by freeing
 * what it left live (blocks allocated during the pass, retried OOM requests) and allocating again
 * the initial blocks it freed. The peaks are over all passes: a placement that fragments a little
 * more every step shows here, where one pass hides it.
 * --cudafree replays every free as cudaFree (heap_free_device_wide), what PyTorch without its cache
 * (PYTORCH_NO_CUDA_MEMORY_CACHING=1) does under LD_PRELOAD: each heap knows one non-blocking stream,
 * as under PyTorch, so a freed block waits for the device. With --device-lag N the sim device runs
 * N requests behind the host: its work completes after every N + 1 requests (default 0: after
 * every request). How far the GPU runs behind decides how much freed memory is waiting at a time.
 * MAP/UNMAP/INIT_MAP are the recording allocator's decisions, not requests: the replayed heap
 * makes its own. A free of an address with no replayed pointer (its allocation failed in the
 * replay, or a ring trace lost it) is skipped.
 *
 * Capacity: sim_memory = --memory, else the largest recorded device capacity (a device recorded
 * with a smaller capacity gets max_memory = its capacity). Several devices: each device has its
 * own heap, run interleaved in trace order; the figures reported are totals over devices (the
 * peak of the sum, sampled after every request, as `summary` sums them), with a per-device table
 * in the text output. --min-fit varies the per-device capacity (the same on every device).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "../min_fit_search.h"
#include "reader.h"
#include "replay.h"
#include "text.h"
#include "devaddr_map.h"
#include "grow.h"
#include "xalloc.h"

enum { RP_EXIT_USAGE = 1, RP_EXIT_UNREADABLE = 2, RP_EXIT_CORRUPT = 3 };

/* The largest per-device capacity a replay simulates: the largest sim device (1 PiB). The sim's
 * bookkeeping grows with the capacity, so a larger one would fail for want of host memory instead
 * of saying what was wrong. --min-fit searches up to it. */
#define REPLAY_MAX_MEMORY (CONF_SIM_MEMORY_MAX_MB << 20)

enum { EV_INIT = 1, EV_ALLOC, EV_FREE, EV_TRIM, EV_OOM };

typedef struct ev {
    uint8_t op;
    uint8_t dev;
    uint16_t pad;
    uint32_t stream;   /* stream id (index into streams[]) */
    uint64_t addr;     /* recorded address (INIT, ALLOC, FREE) */
    uint64_t size;     /* requested bytes (INIT, ALLOC, OOM) */
} ev_t;

typedef struct trace_reqs {
    ev_t *ev;
    size_t n, cap;
    uint64_t *streams;       /* handle per stream id */
    size_t nstreams;
    int ndev;                /* devices 0..ndev-1 */
    bool dev_used[CUA_TRACE_MAX_DEVICES];
    uint64_t dev_capacity[CUA_TRACE_MAX_DEVICES];
    uint64_t dev_total[CUA_TRACE_MAX_DEVICES];
    uint64_t dev_gran[CUA_TRACE_MAX_DEVICES];
    bool have_dev[CUA_TRACE_MAX_DEVICES];
    bool dev_classic[CUA_TRACE_MAX_DEVICES]; /* recorded with classic segments */
    bool by_cualloc;         /* recorded by cualloc (not imported) */
    /* Recorded by cualloc with expandable segments asked for, yet on classic segments: the device
     * had no VMM (the heap fell back), and no replay of its requests may use VMM either. */
    bool no_vmm;
    uint64_t peak_requested_dev[CUA_TRACE_MAX_DEVICES]; /* the requests' own peak (any allocator) */
    char *config;            /* the recorded configuration, or NULL */
    uint64_t records;
    /* What the recording allocator itself did (peaks of the sums over devices): allocated from
     * ALLOC/FREE sizes, reserved from MAP/UNMAP, initial state included. A replay under the
     * recording's configuration should reproduce them; the difference is the prediction error. */
    uint64_t rec_allocated, rec_reserved, rec_peak_allocated, rec_peak_reserved;
    bool rec_maps;           /* the trace records its memory (MAP/INIT_MAP) */
    bool overwritten;        /* a ring whose oldest events were overwritten: the rec_* are of the window */
    unsigned passes;         /* how many times a run replays the requests (--passes) */
    bool cudafree;           /* every free device-wide (--cudafree) */
    uint64_t device_lag;     /* requests between completions of the device's work (--device-lag) */
} trace_reqs_t;

typedef struct run_result {
    uint64_t peak_requested, peak_allocated, peak_reserved;
    uint64_t num_ooms, failed_frees;
    uint64_t num_syncs;      /* the heaps' waits for the device (synchronizations, event waits) */
    uint64_t dev_peak[CUA_TRACE_MAX_DEVICES][3];
    uint64_t dev_ooms[CUA_TRACE_MAX_DEVICES];
    double seconds;
} run_result_t;

/* ------------------------------------------------------------------------------- loading */

static void push(trace_reqs_t *t, ev_t e)
{
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 65536;
        t->ev = xrealloc(t->ev, nc * sizeof *t->ev);
        t->cap = nc;
    }
    t->ev[t->n++] = e;
}

/* A live block's value by (device, address), any address: its requested size while the trace
 * loads, its pointer in the replay heap while replaying. */
typedef struct rp_block {
    devaddr_entry_t key;
    uint64_t val;
    uint32_t stream;   /* replaying: the stream id it was allocated on */
    bool initial;      /* replaying: an initial block, not freed since it was allocated */
} rp_block_t;

/* Sets (dev, addr)'s value, adding the block if absent (stream 0, not initial); the block, or NULL
 * when out of memory. */
static rp_block_t *block_put(devaddr_map_t *m, uint32_t dev, uint64_t addr, uint64_t val)
{
    bool found;
    rp_block_t *b = devaddr_map_get(m, dev, addr, &found);
    if (!b)
        return NULL;
    b->val = val;
    b->stream = 0;
    b->initial = false;
    return b;
}

/* Removes (dev, addr); true with *val when it was there. */
static bool block_take(devaddr_map_t *m, uint32_t dev, uint64_t addr, uint64_t *val)
{
    rp_block_t *b = devaddr_map_find(m, dev, addr);
    if (!b)
        return false;
    *val = b->val;
    devaddr_map_remove(m, b);
    return true;
}

static void reqs_free(trace_reqs_t *t)
{
    free(t->ev);
    free(t->streams);
    free(t->config);
}

static int load_trace(const char *path, trace_reqs_t *t)
{
    memset(t, 0, sizeof *t);
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "allocview: %s: %s\n", path, err);
        return RP_EXIT_UNREADABLE;
    }
    t->overwritten = tr_info(r)->overwritten;
    devaddr_map_t live;
    devaddr_map_init(&live, sizeof(rp_block_t));
    uint64_t cur_req[CUA_TRACE_MAX_DEVICES] = {0};
    tr_record_t rec;
    int k;
    int status = 0;
    while ((k = tr_next(r, &rec)) > 0) {
        t->records++;
        if (!rec.known)
            continue;
        ev_t e = {0};
        e.dev = (uint8_t)rec.dev;
        e.stream = rec.stream;
        switch (rec.type) {
        case CUA_TRACE_CONFIG:
            free(t->config);
            t->config = xstrndup(rec.u.text.p, rec.u.text.len);
            continue;
        case CUA_TRACE_DEVICE:
            if (rec.u.device.dev < CUA_TRACE_MAX_DEVICES) {
                int d = (int)rec.u.device.dev;
                t->have_dev[d] = true;
                t->dev_capacity[d] = rec.u.device.capacity;
                t->dev_total[d] = rec.u.device.total;
                t->dev_gran[d] = rec.u.device.granularity;
                t->dev_classic[d] = rec.u.device.mode != CUA_TRACE_MODE_VMM;
            }
            continue;
        case CUA_TRACE_PROCESS:
            t->by_cualloc = rec.u.process.recorder.len >= 7 && memcmp(rec.u.process.recorder.p, "cualloc", 7) == 0;
            continue;
        case CUA_TRACE_STREAM:
            if (rec.u.stream.id < (1u << 24)) {
                uint32_t id = (uint32_t)rec.u.stream.id;
                uint64_t *streams = av_grow_zeroed(t->streams, &t->nstreams, id, sizeof *streams);
                if (!streams)
                    goto oom;
                t->streams = streams;
                t->streams[id] = rec.u.stream.handle;
            }
            continue;
        case CUA_TRACE_INIT_MAP:
        case CUA_TRACE_MAP:
            t->rec_maps = true;
            t->rec_reserved += rec.size;
            if (t->rec_reserved > t->rec_peak_reserved)
                t->rec_peak_reserved = t->rec_reserved;
            continue;
        case CUA_TRACE_UNMAP:
            t->rec_reserved -= rec.size < t->rec_reserved ? rec.size : t->rec_reserved;
            continue;
        case CUA_TRACE_INIT_BLOCK:
        case CUA_TRACE_ALLOC:
            t->rec_allocated += rec.size;
            if (t->rec_allocated > t->rec_peak_allocated)
                t->rec_peak_allocated = t->rec_allocated;
            e.op = rec.type == CUA_TRACE_INIT_BLOCK ? EV_INIT : EV_ALLOC;
            e.addr = rec.addr;
            e.size = rec.requested;
            if (!block_put(&live, rec.dev, rec.addr, rec.requested))
                goto oom;
            cur_req[rec.dev] += rec.requested;
            if (cur_req[rec.dev] > t->peak_requested_dev[rec.dev])
                t->peak_requested_dev[rec.dev] = cur_req[rec.dev];
            break;
        case CUA_TRACE_FREE: {
            t->rec_allocated -= rec.size < t->rec_allocated ? rec.size : t->rec_allocated;
            e.op = EV_FREE;
            e.addr = rec.addr;
            uint64_t req;
            if (block_take(&live, rec.dev, rec.addr, &req))
                cur_req[rec.dev] -= req;
            break;
        }
        case CUA_TRACE_TRIM:
            e.op = EV_TRIM;
            break;
        case CUA_TRACE_OOM:
            e.op = EV_OOM;
            e.size = rec.u.oom.requested;
            cur_req[rec.dev] += rec.u.oom.requested; /* stays live if the retry succeeds */
            if (cur_req[rec.dev] > t->peak_requested_dev[rec.dev])
                t->peak_requested_dev[rec.dev] = cur_req[rec.dev];
            break;
        default:
            continue;
        }
        t->dev_used[rec.dev] = true;
        if ((int)rec.dev + 1 > t->ndev)
            t->ndev = (int)rec.dev + 1;
        push(t, e);
    }
    if (k < 0) {
        fprintf(stderr, "allocview replay: %s: corrupt trace: %s; replaying the readable prefix\n", path,
                tr_error(r));
        status = RP_EXIT_CORRUPT;
    } else if (tr_warning(r)[0]) {
        fprintf(stderr, "allocview replay: %s: %s\n", path, tr_warning(r));
    }
    /* The configuration as the recorder writes it: "expandable_segments:True" is an item of its own. */
    static const char item[] = "expandable_segments:True";
    bool asked = false;
    for (const char *p = t->config; p && (p = strstr(p, item)); p++)
        asked |= (p == t->config || p[-1] == ',') && (p[sizeof item - 1] == ',' || p[sizeof item - 1] == '\0');
    for (int d = 0; d < t->ndev; d++)
        t->no_vmm |= t->by_cualloc && asked && t->dev_used[d] && t->have_dev[d] && t->dev_classic[d];
    /* What no sim device can be, said by name (the heaps would not be set up, for no reason given):
     * a granularity the sim does not take is replaced by the default; devices past the sim's last
     * cannot be replayed. */
    for (int d = 0; d < t->ndev && d < CUALLOC_MAX_DEVICES; d++) {
        uint64_t g = t->dev_gran[d];
        if (t->have_dev[d] && g && ((g & (g - 1)) || g < 4 * KiB || g > GiB)) {
            fprintf(stderr,
                    "allocview replay: %s: device %d's recorded granularity (%" PRIu64 " B) is not a power of two "
                    "from 4 KiB to 1 GiB; replaying it with 2 MiB\n", path, d, g);
            t->dev_gran[d] = 0;
        }
    }
    if (t->ndev > CUALLOC_MAX_DEVICES) {
        fprintf(stderr,
                "allocview replay: %s: device %d holds requests, but the sim device has %d devices at most "
                "(0 to %d): this trace cannot be replayed\n", path, t->ndev - 1, CUALLOC_MAX_DEVICES,
                CUALLOC_MAX_DEVICES - 1);
        status = RP_EXIT_UNREADABLE;
    }
    devaddr_map_free(&live);
    tr_close(r);
    return status;
oom:
    fprintf(stderr, "allocview replay: out of memory reading %s\n", path);
    devaddr_map_free(&live);
    tr_close(r);
    return RP_EXIT_UNREADABLE;
}

/* ------------------------------------------------------------------------------- running */

static cua_stream stream_of(const trace_reqs_t *t, uint32_t id)
{
    return (cua_stream)(uintptr_t)(id < t->nstreams ? t->streams[id] : 0);
}

/* A replayed free: on its stream, or device-wide under --cudafree. */
static void replay_free(const trace_reqs_t *t, heap_t *h, void *p, uint32_t stream)
{
    if (t->cudafree)
        heap_free_device_wide(h, p);
    else
        heap_free(h, p, stream_of(t, stream));
}

/* An OOM request that succeeded when retried: live to the end of its pass. */
typedef struct retried {
    int dev;
    void *ptr;
} retried_t;

/* Replays allocation e (EV_INIT or EV_ALLOC) on its device's heap: the pointer is kept under e's
 * (device, address), or an OOM is counted when the heap refuses. False when the host is out of
 * memory. */
static bool replay_alloc(const trace_reqs_t *t, heap_t **heaps, devaddr_map_t *ptrs, const ev_t *e, run_result_t *res)
{
    void *p = NULL;
    if (heap_alloc(heaps[e->dev], (size_t)e->size, stream_of(t, e->stream), &p) != CUA_SUCCESS) {
        res->num_ooms++;
        res->dev_ooms[e->dev]++;
        return true;
    }
    rp_block_t *b = block_put(ptrs, e->dev, e->addr, (uint64_t)(uintptr_t)p);
    if (!b)
        return false;
    b->stream = e->stream;
    b->initial = e->op == EV_INIT;
    return true;
}

/* Between passes: frees what the pass left live (every block that is not an initial one still
 * unfreed, and the retried OOM requests), then allocates again the initial blocks it freed. A
 * request that fails is counted as an OOM. False when out of memory. */
static bool close_pass(const trace_reqs_t *t, heap_t **heaps, devaddr_map_t *ptrs, const retried_t *retried,
                       size_t *nretried, run_result_t *res)
{
    size_t n = 0, pos = 0;
    rp_block_t *b;
    while ((b = devaddr_map_next(ptrs, &pos)) != NULL)
        n += !b->initial;
    rp_block_t *left = xmalloc((n ? n : 1) * sizeof *left);
    n = 0;
    pos = 0;
    while ((b = devaddr_map_next(ptrs, &pos)) != NULL)
        if (!b->initial)
            left[n++] = *b;
    for (size_t i = 0; i < n; i++) {
        replay_free(t, heaps[left[i].key.dev], (void *)(uintptr_t)left[i].val, left[i].stream);
        devaddr_map_remove(ptrs, devaddr_map_find(ptrs, left[i].key.dev, left[i].key.addr));
    }
    free(left);
    for (size_t i = 0; i < *nretried; i++)
        replay_free(t, heaps[retried[i].dev], retried[i].ptr, 0);
    *nretried = 0;
    for (size_t i = 0; i < t->n && t->ev[i].op == EV_INIT; i++) {
        const ev_t *e = &t->ev[i];
        if (!devaddr_map_find(ptrs, e->dev, e->addr) && !replay_alloc(t, heaps, ptrs, e, res))
            return false;
    }
    return true;
}

static void quiet(const char *line, void *arg)
{
    (void)line;
    (void)arg;
}

static uint64_t gran_of(const trace_reqs_t *t)
{
    uint64_t g = 0;
    for (int d = 0; d < t->ndev; d++)
        if (t->have_dev[d] && t->dev_gran[d] > g)
            g = t->dev_gran[d];
    return g ? g : 2 * MiB;
}

/* The per-device capacity a run of `memory` bytes simulates: whole granules, at least one. */
static uint64_t sim_capacity(const trace_reqs_t *t, uint64_t memory)
{
    uint64_t gran = gran_of(t);
    uint64_t c = (memory + gran - 1) / gran * gran;
    return c ? c : gran;
}

/* The largest peak of requested bytes on one device: what a per-device capacity is set against. */
static uint64_t peak_requested_one_device(const run_result_t *r)
{
    uint64_t m = 0;
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        if (r->dev_peak[d][0] > m)
            m = r->dev_peak[d][0];
    return m ? m : r->peak_requested;
}

static uint64_t default_memory(const trace_reqs_t *t)
{
    uint64_t m = 0;
    for (int d = 0; d < t->ndev; d++)
        if (t->have_dev[d] && t->dev_capacity[d] > m)
            m = t->dev_capacity[d];
    if (m > REPLAY_MAX_MEMORY) {
        fprintf(stderr, "allocview replay: the recorded capacity (%" PRIu64 " B) is above the largest sim device; "
                "replaying on 1 PiB\n", m);
        m = REPLAY_MAX_MEMORY;
    }
    return m ? m : 16 * GiB;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Host memory refused to the sim's bookkeeping or to a heap's own tables fails its request as the
 * device running out would: the run's figures (OOMs, peaks) would then be wrong, so allocview
 * stops as for any host shortage of its own (xalloc.h). `sim_refused`: sim_host_refusals() before
 * the run. */
static void stop_if_host_refused(heap_t *const *heaps, int ndev, uint64_t sim_refused)
{
    uint64_t n = sim_host_refusals() - sim_refused;
    for (int d = 0; d < ndev; d++)
        if (heaps[d])
            n += heap_host_refusals(heaps[d]);
    if (n)
        xalloc_out_of_memory(0);
}

/* One replay of every request on fresh heaps of `memory` bytes per device. per_dev_caps: give a
 * device recorded with a smaller capacity max_memory = that capacity. False when the heaps could
 * not be set up (a message printed). */
static bool run_once(const trace_reqs_t *t, const conf_t *base, uint64_t memory, bool per_dev_caps,
                     run_result_t *res)
{
    memset(res, 0, sizeof *res);
    uint64_t sim_refused = sim_host_refusals();
    uint64_t gran = gran_of(t);
    conf_t c = *base;
    c.driver = DRIVER_SIM;
    c.sim_host_backed = false;
    c.sim_memory = (size_t)sim_capacity(t, memory);
    c.sim_granularity = (size_t)gran;
    c.sim_vmm = !t->no_vmm;
    c.sim_devices = t->ndev > 0 ? t->ndev : 1;
    c.sim_latency_us = 0;
    c.sim_fail_op = SIM_OP_COUNT;
    c.trace[0] = '\0';
    c.summary = false;
    sim_configure(&c);
    if (driver_sim_ops.init() != CUA_SUCCESS) {
        stop_if_host_refused(NULL, 0, sim_refused);
        fprintf(stderr, "allocview replay: the sim device cannot start\n");
        return false;
    }
    heap_t *heaps[CUA_TRACE_MAX_DEVICES] = {0};
    const cualloc_stats *st[CUA_TRACE_MAX_DEVICES] = {0};
    for (int d = 0; d < t->ndev; d++) {
        if (!t->dev_used[d])
            continue;
        conf_t cd = c;
        if (per_dev_caps && t->have_dev[d] && t->dev_capacity[d] && t->dev_capacity[d] < c.sim_memory &&
            (!cd.max_memory || cd.max_memory > t->dev_capacity[d]))
            cd.max_memory = (size_t)t->dev_capacity[d];
        cua_result err = CUA_SUCCESS;
        heaps[d] = heap_create(d, &cd, &driver_sim_ops, &err);
        if (!heaps[d] && err == CUA_ERROR_HOST_MEMORY)
            xalloc_out_of_memory(0);
        if (!heaps[d]) {
            stop_if_host_refused(heaps, d, sim_refused);
            for (int e = 0; e < d; e++)
                heap_destroy(heaps[e]);
            return false;
        }
        st[d] = heap_test_stats(heaps[d]);
    }
    /* --cudafree: one non-blocking stream per device, whose work completes every device_lag + 1
     * requests (a held sim stream). */
    cua_stream nb[CUA_TRACE_MAX_DEVICES] = {0};
    if (t->cudafree) {
        for (int d = 0; d < t->ndev; d++) {
            if (!heaps[d])
                continue;
            nb[d] = sim_stream_create(d, true);
            heap_stream_created(heaps[d], nb[d], true);
        }
    }
    uint64_t since_completion = 0;
    devaddr_map_t ptrs;
    devaddr_map_init(&ptrs, sizeof(rp_block_t));
    int single = 0;
    for (int d = 0; d < t->ndev; d++)
        single += t->dev_used[d];
    retried_t *retried = NULL; /* this pass's */
    size_t nretried = 0, retried_cap = 0;
    bool good = true;
    double t0 = now_s();
    for (unsigned pass = 0; pass < t->passes && good; pass++) {
        if (pass > 0 && !(good = close_pass(t, heaps, &ptrs, retried, &nretried, res)))
            break;
        for (size_t i = 0; i < t->n; i++) {
            const ev_t *e = &t->ev[i];
            if (pass > 0 && e->op == EV_INIT)
                continue;
            heap_t *h = heaps[e->dev];
            cua_stream s = stream_of(t, e->stream);
            switch (e->op) {
            case EV_INIT:
            case EV_ALLOC:
                good = replay_alloc(t, heaps, &ptrs, e, res);
                break;
            case EV_FREE: {
                uint64_t p;
                if (block_take(&ptrs, e->dev, e->addr, &p))
                    replay_free(t, h, (void *)(uintptr_t)p, e->stream);
                else
                    res->failed_frees++;
                break;
            }
            case EV_TRIM:
                heap_trim(h);
                break;
            case EV_OOM: {
                void *p = NULL;
                if (heap_alloc(h, (size_t)e->size, s, &p) != CUA_SUCCESS) {
                    res->num_ooms++;
                    res->dev_ooms[e->dev]++;
                } else if (t->passes > 1) {
                    retried_t *q = av_grow_zeroed(retried, &retried_cap, nretried, sizeof *q);
                    if (!q) {
                        good = false;
                        break;
                    }
                    retried = q;
                    retried[nretried++] = (retried_t){e->dev, p};
                }
                break;
            }
            }
            if (!good)
                break;
            if (t->cudafree && ++since_completion > t->device_lag) {
                since_completion = 0;
                for (int d = 0; d < t->ndev; d++)
                    if (nb[d])
                        sim_stream_complete(nb[d]);
            }
            if (single > 1) {
                uint64_t rq = 0, al = 0, rs = 0;
                for (int d = 0; d < t->ndev; d++) {
                    if (!st[d])
                        continue;
                    rq += st[d]->requested_bytes;
                    al += st[d]->allocated_bytes;
                    rs += st[d]->reserved_bytes;
                }
                if (rq > res->peak_requested)
                    res->peak_requested = rq;
                if (al > res->peak_allocated)
                    res->peak_allocated = al;
                if (rs > res->peak_reserved)
                    res->peak_reserved = rs;
            }
        }
    }
    res->seconds = now_s() - t0;
    free(retried);
    stop_if_host_refused(heaps, t->ndev, sim_refused);
    if (!good)
        fprintf(stderr, "allocview replay: out of memory\n");
    for (int d = 0; good && d < t->ndev; d++) {
        if (!st[d])
            continue;
        res->num_syncs += st[d]->num_syncs;
        res->dev_peak[d][0] = st[d]->requested_peak;
        res->dev_peak[d][1] = st[d]->allocated_peak;
        res->dev_peak[d][2] = st[d]->reserved_peak;
        if (single <= 1) {
            res->peak_requested = st[d]->requested_peak;
            res->peak_allocated = st[d]->allocated_peak;
            res->peak_reserved = st[d]->reserved_peak;
        }
    }
    devaddr_map_free(&ptrs);
    for (int d = 0; d < t->ndev; d++) {
        heap_destroy(heaps[d]);
        if (nb[d])
            sim_stream_destroy(nb[d]);
    }
    return good;
}

/* ------------------------------------------------------------------------------- min-fit */

typedef struct fit {
    bool found;             /* some capacity completed */
    uint64_t bytes;         /* the smallest that did */
    bool monotone;          /* every capacity tried above it completed too */
    uint64_t failed_above;  /* the first that did not (when !monotone) */
    run_result_t at;        /* the confirming run at `bytes` */
    unsigned runs;
} fit_t;

static bool completes(const trace_reqs_t *t, const conf_t *c, uint64_t cap, fit_t *f, run_result_t *res)
{
    run_result_t tmp;
    if (!res)
        res = &tmp;
    f->runs++;
    if (!run_once(t, c, cap, false, res))
        return false;
    return res->num_ooms == 0;
}

struct replay_probe {
    const trace_reqs_t *t;
    const conf_t *c;
    fit_t *f;
    uint64_t gran;
};

static int replay_probe(void *ctx, uint64_t granules)
{
    struct replay_probe *p = ctx;
    return completes(p->t, p->c, granules * p->gran, p->f, NULL);
}

static void min_fit(const trace_reqs_t *t, const conf_t *c, uint64_t start, fit_t *f)
{
    memset(f, 0, sizeof *f);
    uint64_t g = gran_of(t);
    uint64_t need = 0; /* the largest per-device peak of requested bytes: no capacity below fits */
    for (int d = 0; d < t->ndev; d++)
        if (t->peak_requested_dev[d] > need)
            need = t->peak_requested_dev[d];
    if (need > REPLAY_MAX_MEMORY)
        return; /* no sim device holds the requests (and ceil(need / g) below could wrap) */
    uint64_t lo = (need + g - 1) / g * g; /* lo - g < need: fails for sure */
    lo = lo >= g ? lo - g : 0;
    const uint64_t sure_fail = lo;
    uint64_t hi = (start + g - 1) / g * g; /* start <= REPLAY_MAX_MEMORY, a multiple of g */
    if (hi <= lo)
        hi = lo + g; /* lo < need <= REPLAY_MAX_MEMORY, both multiples of g: hi stays within it */
    while (!completes(t, c, hi, f, NULL)) {
        if (hi >= REPLAY_MAX_MEMORY)
            return; /* nothing up to 1 PiB completes */
        lo = hi;
        hi = hi < REPLAY_MAX_MEMORY / 2 ? hi * 2 : REPLAY_MAX_MEMORY;
    }
    /* Bisection, then a few capacities below its answer (min_fit_search.h says why). */
    struct replay_probe ctx = {t, c, f, g};
    min_fit_search_t s;
    min_fit_search(sure_fail / g, lo / g, hi / g, UINT_MAX, replay_probe, &ctx, &s);
    f->monotone = s.monotone;
    f->failed_above = s.failed_above * g;
    hi = s.units * g;
    f->found = true;
    f->bytes = hi;
    if (!completes(t, c, hi, f, &f->at)) { /* cannot happen: the run is deterministic */
        f->found = false;
        return;
    }
    /* ... and a few sizes above. */
    static const unsigned steps[] = {1, 2, 3, 4, 8, 16, 64};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0] && f->monotone; i++) {
        uint64_t cap = hi + steps[i] * g;
        if (cap > REPLAY_MAX_MEMORY)
            break;
        if (!completes(t, c, cap, f, NULL)) {
            f->monotone = false;
            f->failed_above = cap;
            break;
        }
    }
}

/* ------------------------------------------------------------------------------- output */

static void replay_usage(FILE *out)
{
    fprintf(out,
            "usage: allocview replay TRACE [--conf CONF]... [--memory SIZE] [--passes N]\n"
            "                        [--cudafree [--device-lag N]] [--min-fit] [--json]\n"
            "  runs the trace's requests against cualloc's heap on the sim device under each CONF\n"
            "  (CUALLOC_CONF syntax; 'default' = cualloc's defaults, 'recorded' = the trace's own;\n"
            "  e.g. expandable_segments:0 predicts PyTorch's native allocator). SIZE: bytes or\n"
            "  16GiB, 40G, 512MiB, at most 1 PiB (default: the recorded device capacity). --passes N:\n"
            "  run the requests N times on the same heap (1 to 1000; default 1), as a job repeats its\n"
            "  steps; the peaks are over all passes. --cudafree: every free as cudaFree (device-wide,\n"
            "  one non-blocking stream known), as PyTorch without its cache frees under LD_PRELOAD;\n"
            "  --device-lag N: the device runs N requests behind, its work completing every N + 1\n"
            "  requests (0 to 1000000; default 0). --min-fit: the smallest capacity on which the whole\n"
            "  sequence completes without OOM.\n");
}

#define MAX_CONFS 32

/* Applies a --conf value to the defaults. The recorded configuration drops what only concerned the
 * recording (driver, sim device, trace file) and the caps (the recorded capacity has them). */
static bool make_conf(const char *spec, const trace_reqs_t *t, conf_t *c)
{
    conf_defaults(c);
    if (strcmp(spec, "default") == 0)
        return true;
    if (strcmp(spec, "recorded") == 0) {
        if (!t->config) {
            fprintf(stderr, "allocview replay: --conf recorded: the trace has no configuration record\n");
            return false;
        }
        if (conf_parse(t->config, c) != 0)
            fprintf(stderr, "allocview replay: (the recorded configuration has keys this version does not know)\n");
        c->max_memory = 0;
        c->per_process_memory_fraction = 0;
        return true;
    }
    if (conf_parse(spec, c) != 0) {
        fprintf(stderr, "allocview replay: bad --conf '%s'\n", spec);
        return false;
    }
    /* run_once sets these itself: a value given here would be dropped without a word. The replay
     * goes on (a --conf copied from a trace's configuration holds them). (driver is left out: its
     * default, cuda, cannot be told from one given, and a replay is always on the sim device.) */
    conf_t def;
    conf_defaults(&def);
    const struct { bool given; const char *key, *instead; } own[] = {
        {c->sim_memory != def.sim_memory, "sim_memory_mb", "--memory"},
        {c->sim_granularity != def.sim_granularity, "sim_granularity_kb", "the trace's device"},
        {c->sim_vmm != def.sim_vmm, "sim_vmm", "the trace's device"},
        {c->sim_devices != def.sim_devices, "sim_devices", "the trace's devices"},
        {c->sim_fail_op != def.sim_fail_op, "sim_fail", "no failures are injected"},
        {c->trace[0] != '\0', "trace", "a replay records nothing"},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i].given)
            fprintf(stderr, "allocview replay: --conf '%s': %s is replay's own (%s); ignored\n", spec, own[i].key,
                    own[i].instead);
    return true;
}

/* Is the word a option `name`, as `--name` or `--name=V`? */
static bool is_option(const char *a, const char *name)
{
    size_t len = strlen(name);
    return strncmp(a, name, len) == 0 && (a[len] == '\0' || a[len] == '=');
}

/* The value of option `name` at argv[*i] (is_option): V of `--name=V`, or of `--name V` (*i then
 * moves past V); NULL when `--name` is the last word. */
static const char *option_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    size_t len = strlen(name);
    return a[len] == '=' ? a + len + 1 : *i + 1 < argc ? argv[++*i] : NULL;
}

/* A whole-number option (is_option): its value, from lo to hi, in *out; false after saying what
 * was wrong (`what`: the range in words). Digits only: no sign and no spaces. */
static bool replay_number_option(int argc, char **argv, int *i, const char *name, unsigned long long lo,
                                 unsigned long long hi, const char *what, unsigned long long *out)
{
    const char *v = option_value(argc, argv, i, name);
    if (!v || !txt_parse_count(v, lo, hi, out)) {
        fprintf(stderr, "allocview replay: bad %s '%s' (%s)\n", name, v ? v : "", what);
        return false;
    }
    return true;
}

int av_cmd_replay(int argc, char **argv)
{
    const char *path = NULL;
    const char *confs[MAX_CONFS];
    int nconfs = 0;
    uint64_t memory = 0;
    unsigned passes = 1;
    bool fit = false, json = false, cudafree = false;
    uint64_t device_lag = 0;
    bool lag_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool is_conf = is_option(a, "--conf");
        if (is_conf || is_option(a, "--memory")) {
            const char *v = option_value(argc, argv, &i, is_conf ? "--conf" : "--memory");
            if (!v) {
                fprintf(stderr, "allocview replay: %s needs a value\n", a);
                return RP_EXIT_USAGE;
            }
            if (is_conf) {
                if (nconfs == MAX_CONFS) {
                    fprintf(stderr, "allocview replay: at most %d --conf\n", MAX_CONFS);
                    return RP_EXIT_USAGE;
                }
                confs[nconfs++] = v;
            } else if (!txt_parse_size(v, &memory) || memory == 0) {
                fprintf(stderr, "allocview replay: bad --memory '%s' (bytes, or e.g. 16GiB, 40G, 512MiB)\n", v);
                return RP_EXIT_USAGE;
            } else if (memory > REPLAY_MAX_MEMORY) {
                fprintf(stderr, "allocview replay: bad --memory '%s' (at most 1 PiB, the largest sim device)\n", v);
                return RP_EXIT_USAGE;
            }
        } else if (is_option(a, "--passes")) {
            unsigned long long n;
            if (!replay_number_option(argc, argv, &i, "--passes", 1, 1000, "a number from 1 to 1000", &n))
                return RP_EXIT_USAGE;
            passes = (unsigned)n;
        } else if (is_option(a, "--device-lag")) {
            unsigned long long n;
            if (!replay_number_option(argc, argv, &i, "--device-lag", 0, 1000000, "requests, from 0 to 1000000", &n))
                return RP_EXIT_USAGE;
            device_lag = n;
            lag_given = true;
        } else if (strcmp(a, "--cudafree") == 0) {
            cudafree = true;
        } else if (strcmp(a, "--min-fit") == 0) {
            fit = true;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            replay_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "allocview replay: unknown option %s\n", a);
            replay_usage(stderr);
            return RP_EXIT_USAGE;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "allocview replay: one trace at a time (got %s and %s)\n", path, a);
            return RP_EXIT_USAGE;
        }
    }
    if (!path) {
        replay_usage(stderr);
        return RP_EXIT_USAGE;
    }
    if (lag_given && !cudafree) {
        fprintf(stderr, "allocview replay: --device-lag needs --cudafree (only device-wide frees wait for the device)\n");
        return RP_EXIT_USAGE;
    }
    if (nconfs == 0)
        confs[nconfs++] = "default";

    trace_reqs_t *t = xmalloc(sizeof *t);
    int status = load_trace(path, t);
    if (status == RP_EXIT_UNREADABLE) {
        reqs_free(t);
        free(t);
        return status;
    }
    t->passes = passes;
    t->cudafree = cudafree;
    t->device_lag = device_lag;
    uint64_t mem = memory ? memory : default_memory(t);
    error_set_callback(quiet, NULL); /* the replayed heap's OOM reports are counted, not printed */

    run_result_t *res = xcalloc((size_t)nconfs, sizeof *res);
    fit_t *fits = xcalloc((size_t)nconfs, sizeof *fits);
    bool *ok = xcalloc((size_t)nconfs, sizeof *ok);
    conf_t *cs = xcalloc((size_t)nconfs, sizeof *cs);
    for (int i = 0; i < nconfs; i++) {
        error_set_callback(NULL, NULL);
        bool good = make_conf(confs[i], t, &cs[i]);
        error_set_callback(quiet, NULL);
        if (!good) {
            status = RP_EXIT_USAGE;
            goto done;
        }
    }
    for (int i = 0; i < nconfs; i++) {
        ok[i] = run_once(t, &cs[i], mem, memory == 0, &res[i]);
        if (ok[i] && fit)
            min_fit(t, &cs[i], mem, &fits[i]);
    }
    error_set_callback(NULL, NULL);

    if (json) {
        printf("[");
        for (int i = 0; i < nconfs; i++) {
            const run_result_t *r = &res[i];
            printf("%s{\"conf\": ", i ? ", " : "");
            txt_json_string(stdout, confs[i]);
            printf(", \"passes\": %u, \"cudafree\": %s, \"device_lag\": %" PRIu64, passes, cudafree ? "true" : "false",
                   device_lag);
            printf(", \"peak_requested_bytes\": %" PRIu64 ", \"peak_allocated_bytes\": %" PRIu64
                   ", \"peak_reserved_bytes\": %" PRIu64 ", \"utilisation\": %.6f, \"num_ooms\": %" PRIu64
                   ", \"num_syncs\": %" PRIu64 ", \"min_fit_bytes\": ",
                   r->peak_requested, r->peak_allocated, r->peak_reserved,
                   r->peak_reserved ? (double)r->peak_allocated / (double)r->peak_reserved : 0.0, r->num_ooms,
                   r->num_syncs);
            if (fit && fits[i].found)
                printf("%" PRIu64, fits[i].bytes);
            else
                printf("null");
            printf("}");
        }
        printf("]\n");
    } else {
        char b0[32], b1[32], b2[32], b3[32];
        size_t nev = t->n;
        printf("replay of %s: %zu requests on %d device%s, sim memory %s per device%s", path, nev, t->ndev,
               t->ndev == 1 ? "" : "s", txt_human(sim_capacity(t, mem), b0, sizeof b0),
               memory ? "" : " (the recorded capacity)");
        if (passes > 1)
            printf("; %u passes (peaks over all of them)", passes);
        if (t->no_vmm)
            printf("; without VMM, as the recorded device (expandable segments fall back to classic ones)");
        printf("\n");
        if (cudafree)
            printf("every free replayed as cudaFree (device-wide, one non-blocking stream known); the device completes "
                   "work every %" PRIu64 " request%s\n", device_lag + 1, device_lag ? "s" : "");
        if (t->ndev > 1)
            printf("figures are totals over devices (peak of the sum); per device below\n");
        if (t->overwritten)
            printf("warning: " TR_RING_OVERWRITTEN ": only the newest events' requests are "
                   "replayed, and the recording allocator's own figures, of that window (what it mapped before the "
                   "window is not counted), are not compared\n");
        printf("%-36s %16s %16s %16s %11s %6s%s\n", "conf", "peak requested", "peak allocated", "peak reserved",
               "utilisation", "OOMs", fit ? "  min-fit" : "");
        for (int i = 0; i < nconfs; i++) {
            const run_result_t *r = &res[i];
            if (!ok[i]) {
                printf("%-36s (the heap could not be set up)\n", confs[i]);
                continue;
            }
            printf("%-36s %16s %16s %16s %11.4f %6" PRIu64, confs[i], txt_human(r->peak_requested, b1, sizeof b1),
                   txt_human(r->peak_allocated, b2, sizeof b2), txt_human(r->peak_reserved, b3, sizeof b3),
                   r->peak_reserved ? (double)r->peak_allocated / (double)r->peak_reserved : 0.0, r->num_ooms);
            if (fit) {
                if (fits[i].found)
                    printf("  %s (%" PRIu64 " B)", txt_human(fits[i].bytes, b0, sizeof b0), fits[i].bytes);
                else
                    printf("  none up to 1 PiB");
            }
            printf("\n");
        }
        if (cudafree) {
            /* The price of making freed memory reusable: the host waited for the device this often. */
            printf("waits for the device (synchronizations and event waits):");
            for (int i = 0; i < nconfs; i++)
                if (ok[i])
                    printf("%s %s %" PRIu64, i ? "," : "", confs[i], res[i].num_syncs);
            printf("\n");
        }
        if (t->rec_maps && t->rec_peak_reserved && !t->overwritten) {
            /* The recording allocator's own figures, and each configuration's distance from them:
             * under the recording's own configuration (for an imported PyTorch snapshot, classic
             * mode predicts PyTorch's default allocator) the distance is the prediction error. */
            printf("%-36s %16s %16s %16s %11.4f %6s\n", "recorded (the trace's own allocator)", "",
                   txt_human(t->rec_peak_allocated, b2, sizeof b2), txt_human(t->rec_peak_reserved, b3, sizeof b3),
                   (double)t->rec_peak_allocated / (double)t->rec_peak_reserved, "");
            printf("peak reserved against the recorded %s (%s):", txt_human(t->rec_peak_reserved, b3, sizeof b3),
                   t->config ? t->config : "configuration not recorded");
            for (int i = 0; i < nconfs; i++)
                if (ok[i])
                    printf("%s %s %+.3f%%", i ? "," : "", confs[i],
                           100.0 * ((double)res[i].peak_reserved - (double)t->rec_peak_reserved) /
                               (double)t->rec_peak_reserved);
            printf("\n");
        }
        for (int i = 0; i < nconfs && t->ndev > 1; i++) {
            for (int d = 0; d < t->ndev; d++) {
                if (!t->dev_used[d] || !ok[i])
                    continue;
                const run_result_t *r = &res[i];
                printf("  %-34s device %-3d %s requested, %s allocated, %s reserved, %" PRIu64 " OOMs\n", confs[i], d,
                       txt_human(r->dev_peak[d][0], b1, sizeof b1), txt_human(r->dev_peak[d][1], b2, sizeof b2),
                       txt_human(r->dev_peak[d][2], b3, sizeof b3), r->dev_ooms[d]);
            }
        }
        if (fit) {
            printf("min-fit (bisection over the per-device capacity in %s steps, confirmed by a run there):\n",
                   txt_human(gran_of(t), b0, sizeof b0));
            for (int i = 0; i < nconfs; i++) {
                const fit_t *f = &fits[i];
                if (!ok[i])
                    continue;
                if (!f->found) {
                    printf("  %-34s no capacity up to 1 PiB completes\n", confs[i]);
                    continue;
                }
                /* The capacity is per device: set against the device that needed most. */
                uint64_t one = peak_requested_one_device(&f->at);
                printf("  %-34s %s: peak requested %s, allocated %s, reserved %s, utilisation %.4f, %.4f x peak "
                       "requested%s; %s (%u runs)",
                       confs[i], txt_human(f->bytes, b0, sizeof b0), txt_human(f->at.peak_requested, b1, sizeof b1),
                       txt_human(f->at.peak_allocated, b2, sizeof b2), txt_human(f->at.peak_reserved, b3, sizeof b3),
                       f->at.peak_reserved ? (double)f->at.peak_allocated / (double)f->at.peak_reserved : 0.0,
                       one ? (double)f->bytes / (double)one : 0.0, t->ndev > 1 ? " (of the device needing most)" : "",
                       f->monotone ? "monotone around it (-64..+64 granules sampled)" : "NOT MONOTONE", f->runs);
                if (!f->monotone)
                    printf(": %s fails", txt_human(f->failed_above, b1, sizeof b1));
                printf("\n");
            }
        }
        for (int i = 0; i < nconfs; i++)
            if (ok[i] && res[i].seconds > 0)
                fprintf(stderr, "allocview replay: %s: %zu requests in %.3f s (%.2f M requests/s)\n", confs[i],
                        nev * passes, res[i].seconds, (double)nev * passes / res[i].seconds / 1e6);
    }
    for (int i = 0; i < nconfs; i++)
        if (!ok[i] && status == 0)
            status = RP_EXIT_UNREADABLE;
done:
    free(res);
    free(fits);
    free(ok);
    free(cs);
    reqs_free(t);
    free(t);
    return status;
}
