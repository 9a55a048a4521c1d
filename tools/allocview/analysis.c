/* analysis.c — see analysis.h. */
#include "analysis.h"
#include "grow.h"
#include "text.h"
#include "xalloc.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct av_live {
    devaddr_entry_t key;
    uint32_t stack;
    uint64_t size, req;
};

static void copy_str(char *dst, size_t len, tr_str_t s)
{
    size_t n = s.len < len - 1 ? s.len : len - 1;
    memcpy(dst, s.p, n);
    dst[n] = '\0';
}

/* ---------------------------------------------------------------------------- helpers */

long av_step_of(const char *label)
{
    while (*label == ' ')
        label++;
    if (strncasecmp(label, "step", 4) != 0)
        return -1;
    const char *p = label + 4;
    while (*p == ' ' || *p == '_' || *p == '-' || *p == '=')
        p++;
    if (!isdigit((unsigned char)*p))
        return -1;
    char *end;
    long n = strtol(p, &end, 10);
    if (*end && *end != ' ')
        return -1;
    return n;
}

static av_stack_t *stack_get(av_t *a, uint32_t id)
{
    if (id >= a->nst) {
        size_t old = a->nst;
        av_stack_t *st = av_grow_zeroed(a->st, &a->nst, id, sizeof *st);
        if (!st)
            xalloc_out_of_memory(0);
        a->st = st;
        for (size_t i = old; i < a->nst; i++) {
            a->st[i].lk_step.last_b = a->step_bounds;
            a->st[i].lk_win.last_b = a->win_bounds;
            a->st[i].first_seq = UINT64_MAX;
        }
    }
    return &a->st[id];
}

/* Brings a leak tracker up to `nb` boundaries, every one since its last seeing value `cur`. */
static void lk_catch(av_leak_t *l, uint32_t nb, uint64_t cur)
{
    if (l->last_b >= nb)
        return;
    uint32_t k = nb - l->last_b;
    if (l->n == 0) {
        if (cur > 0) {
            l->n = k;
            l->first_v = l->last_v = cur;
            l->first_b = l->last_b + 1;
        }
    } else {
        if (cur > l->last_v) {
            l->inc++;
            l->last_inc_b = l->last_b + 1; /* the value rose before the first of the k boundaries */
        }
        else if (cur < l->last_v)
            l->dec++;
        l->n += k;
        l->last_v = cur;
    }
    l->last_b = nb;
}

bool av_leak_growing(const av_leak_t *l, uint64_t end_bytes)
{
    if (l->n < 3 || l->dec > 0 || l->inc < 2 || l->last_v <= l->first_v)
        return false;
    if (l->inc * 2 < l->n - 1)
        return false;
    return end_bytes >= l->last_v; /* never given back */
}

/* Before a stack changes: save its value at the last peak, catch up its leak state. */
static void stack_touch(av_t *a, av_stack_t *s)
{
    if (s->pk_epoch != a->epoch) {
        s->pk_epoch = a->epoch;
        s->pk_bytes = s->cur_bytes;
        s->pk_req = s->cur_req;
        s->pk_count = s->cur_count;
    }
    lk_catch(&s->lk_step, a->step_bounds, s->cur_bytes);
    lk_catch(&s->lk_win, a->win_bounds, s->cur_bytes);
}

static av_seg_t *seg_cur(av_t *a)
{
    return &a->segs[a->nsegs - 1];
}

/* `mark`: the label of the mark that opens it (NULL: the start); `step`: its step number, or -1
 * when it is not a step mark (a phase). */
static void seg_open(av_t *a, const char *mark, long step, uint64_t time, uint64_t seq)
{
    if (a->nsegs == a->capsegs) {
        a->capsegs = a->capsegs ? a->capsegs * 2 : 16;
        a->segs = xrealloc(a->segs, a->capsegs * sizeof *a->segs);
    }
    av_seg_t *g = &a->segs[a->nsegs++];
    memset(g, 0, sizeof *g);
    g->start_time = g->end_time = g->peak_time = time;
    g->start_seq = g->peak_seq = seq;
    g->alloc_at_start = g->peak_alloc = a->acct.allocated;
    g->peak_req = a->acct.requested;
    g->peak_reserved = a->acct.reserved;
    g->kind = AV_SEG_START;
    /* Provisional label from the opening mark; fixed when the segment closes. */
    if (mark) {
        long n = step;
        if (n < 0) {
            g->kind = AV_SEG_PHASE;
            snprintf(g->label, sizeof g->label, "%.*s", (int)txt_utf8_cut(mark, strlen(mark), sizeof g->label - 1),
                     mark);
        } else if (a->marks_start_steps) {
            g->kind = AV_SEG_STEP;
            g->step = n;
            snprintf(g->label, sizeof g->label, "step %ld", n);
        } else {
            /* "step N" is written after step N (cualloc_torch): what follows is step N+1. */
            g->kind = AV_SEG_STEP;
            g->step = n + 1;
            snprintf(g->label, sizeof g->label, "step %ld", n + 1);
        }
    } else {
        snprintf(g->label, sizeof g->label, "start");
    }
}

/* PyTorch's own annotations around the optimizer (record_function "START/END Optimizer.step#
 * AdamW.step", "... Optimizer.zero_grad#...", in snapshots recorded with them): the end of the
 * first optimizer's step ends a training step, as cualloc_torch's "step N" does, numbered by
 * count; the other optimizer annotations open no segment of their own. Returns the step number,
 * -1 for any other mark (a phase, or "step N" by av_step_of), -2 for an annotation to pass over. */
static long torch_optimizer_mark(av_t *a, const char *label, uint64_t seq)
{
    if (strncmp(label, "START Optimizer.", 16) != 0 && strncmp(label, "END Optimizer.", 14) != 0)
        return -1;
    /* Inside an optimizer step (any optimizer's): where its state is made. */
    if (strncmp(label, "START Optimizer.step", 20) == 0 && !a->opt_open) {
        a->opt_open = true;
        a->opt_start_seq = seq;
        snprintf(a->opt_name, sizeof a->opt_name, "%s", label + 6);
    }
    if (strncmp(label, "END Optimizer.step", 18) == 0 && a->opt_open && strcmp(label + 4, a->opt_name) == 0)
        a->opt_open = false;
    if (strncmp(label, "END Optimizer.step", 18) != 0)
        return -2;
    if (!a->torch_step_label[0])
        snprintf(a->torch_step_label, sizeof a->torch_step_label, "%s", label);
    if (strcmp(label, a->torch_step_label) != 0)
        return -2; /* a second optimizer's step: the first one's count the steps */
    return ++a->torch_steps;
}

static void on_mark(av_t *a, const char *label, uint64_t time, uint64_t seq)
{
    a->nmarks++;
    long n = torch_optimizer_mark(a, label, seq);
    if (n == -2)
        return;
    if (n == -1)
        n = av_step_of(label);
    if (n >= 0) {
        a->opt_open = false; /* a step ends with its optimizer's step (cualloc_torch's "step N") */
        a->nstep_marks++;    /* a step named, whether the mark starts or ends it */
    }
    if (n >= 0 && !a->mark_convention_known) {
        a->mark_convention_known = true;
        /* A "step N" written before any allocation starts its step; after work, it ends it. */
        a->marks_start_steps = a->acct.num_allocs == 0;
        if (a->marks_start_steps && a->nsegs == 1 && a->segs[0].num_allocs == 0)
            snprintf(a->segs[0].label, sizeof a->segs[0].label, "start");
    }
    av_seg_t *g = seg_cur(a);
    g->closed = true;
    g->end_time = time;
    if (n >= 0 && !a->marks_start_steps && g->kind != AV_SEG_PHASE) {
        g->kind = AV_SEG_STEP;
        g->step = n;
        snprintf(g->label, sizeof g->label, "step %ld", n);
    } else if (n >= 0 && !a->marks_start_steps && g->kind == AV_SEG_PHASE) {
        /* "step N" is written at step N's end: step N's work ran before it, after the phase's mark
         * (or around it), with no mark in between. The segment is both; its label says so, the
         * phase's name cut to leave room for the step's. */
        char step[32];
        int sl = snprintf(step, sizeof step, " + step %ld", n);
        int room = (int)sizeof g->label - 1 - sl;
        char phase[sizeof g->label];
        snprintf(phase, sizeof phase, "%s", g->label);
        snprintf(g->label, sizeof g->label, "%.*s%s", (int)txt_utf8_cut(phase, strlen(phase), room > 0 ? (size_t)room : 0),
                 phase, step);
        g->with_step = true;
        g->step = n;
    }
    if (g->kind == AV_SEG_STEP)
        a->step_bounds++;
    seg_open(a, label, n, time, seq);
}

static void new_peak(av_t *a, uint64_t time, uint64_t seq)
{
    a->epoch++;
    a->have_peak = true;
    a->peak_alloc = a->acct.allocated;
    a->peak_req = a->acct.requested;
    a->peak_reserved = a->acct.reserved;
    a->peak_time = time;
    a->peak_seq = seq;
    a->peak_seg = (uint32_t)(a->nsegs - 1);
    a->peak_in_opt = a->opt_open;
    /* The window's start and name, copied once per window (a rising trace makes a peak per
     * allocation). */
    if (a->opt_open && a->peak_opt_start_seq != a->opt_start_seq) {
        a->peak_opt_start_seq = a->opt_start_seq;
        snprintf(a->peak_opt_name, sizeof a->peak_opt_name, "%s", a->opt_name);
    }
}

/* Classic segments: a MAP or INIT_MAP is a segment, an UNMAP releases one (VMM chunks are not
 * tracked: oom_max_split_mb concerns classic segments only). */
static void segment_event(av_t *a, const tr_record_t *rec)
{
    uint32_t d = rec->dev;
    if (d >= CUA_TRACE_MAX_DEVICES || !a->have_dev[d] || a->dev_mode[d] == CUA_TRACE_MODE_VMM || !rec->size ||
        rec->addr > UINT64_MAX - rec->size)
        return;
    if (!a->segments[d])
        a->segments[d] = xcalloc(1, sizeof *a->segments[d]);
    if (rec->type == CUA_TRACE_UNMAP)
        ranges_remove(a->segments[d], rec->addr, rec->addr + rec->size);
    else
        ranges_add_missing(a->segments[d], rec->addr, rec->addr + rec->size);
}

/* The largest segment of device d holding a live block smaller than itself (av_oom_t.split_segment). */
static uint64_t largest_split_segment(const av_t *a, uint32_t d)
{
    const addr_ranges_t *m = d < CUA_TRACE_MAX_DEVICES ? a->segments[d] : NULL;
    uint64_t best = 0;
    size_t pos = 0;
    const struct av_live *e;
    while (m && (e = devaddr_map_next(&a->live, &pos))) {
        if (e->key.dev != d)
            continue;
        size_t i = ranges_after(m, e->key.addr);
        if (i < m->n && m->v[i].addr <= e->key.addr) {
            uint64_t size = m->v[i].end - m->v[i].addr;
            if (e->size < size && size > best)
                best = size;
        }
    }
    return best;
}

static void snapshot_oom(av_t *a, uint32_t dev)
{
    a->oom_snap = true;
    for (size_t i = 0; i < a->nst; i++) {
        a->st[i].oom_bytes = a->st[i].cur_bytes;
        a->st[i].oom_count = a->st[i].cur_count;
        a->st[i].oom_max_block =
            a->st[i].max_block_seg == (uint32_t)(a->nsegs - 1) ? a->st[i].max_block_before : a->st[i].max_block;
    }
    /* The OOM's own device's blocks (once: the first OOM): what could have made room for it. */
    size_t pos = 0;
    const struct av_live *e;
    while ((e = devaddr_map_next(&a->live, &pos)))
        if (e->key.dev == dev && e->stack < a->nst) {
            a->st[e->stack].oom_dev_bytes += e->size;
            a->st[e->stack].oom_dev_count++;
        }
    a->oom_live_count = a->live.count;
}

static void progress(const av_t *a, uint64_t off, uint64_t total, int *last)
{
    if (!total)
        return;
    int pct = (int)(off * 100 / total);
    if (pct == *last)
        return;
    *last = pct;
    int w = 40, fill = pct * w / 100;
    fprintf(stderr, "\rallocview: reading %-.40s [", a->path);
    for (int i = 0; i < w; i++)
        fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %3d%%", pct);
}

/* Up to this size a trace's allocations are counted before it is analyzed (a second pass, a
 * fraction of a second at most); a larger one's are estimated from its size. */
#define WINDOW_COUNT_MAX_BYTES ((uint64_t)32 << 20)

/* The allocations per leak window: a sixteenth of the trace's allocations in scope, at least 16.
 * A small trace is counted: its size says little of its events (the recorder lays the file out in
 * 64 KiB blocks, so a trace of a thousand events takes as much room as one of eight thousand, and
 * deep stacks fill blocks of their own), and an estimate from it gave a short job one or two
 * windows, too few for any leak to show. A large trace's blocks are nearly all full: a few bytes
 * per event, about half of them allocations. */
static uint64_t window_allocs(const char *path, uint64_t fsize, const dv_scope_t *scope)
{
    uint64_t allocs = fsize / 16;
    if (fsize <= WINDOW_COUNT_MAX_BYTES) {
        char err[256];
        tr_reader_t *r = tr_open(path, err, sizeof err);
        if (r) {
            tr_record_t rec;
            uint64_t n = 0;
            while (tr_next(r, &rec) > 0)
                n += rec.known && rec.type == CUA_TRACE_ALLOC && !dv_skips(scope, &rec);
            tr_close(r);
            allocs = n; /* up to a corrupt record, where the analysis stops too */
        }
    }
    return allocs / 16 > 16 ? allocs / 16 : 16;
}

av_t *av_analyze(const char *path, const av_opts_t *opts, char *err, size_t errlen)
{
    tr_reader_t *r = tr_open(path, err, errlen);
    if (!r)
        return NULL;
    av_t *a = xcalloc(1, sizeof *a);
    a->path = path;
    a->r = r;
    a->rank = -1;
    tr_acct_init(&a->acct);
    devaddr_map_init(&a->live, sizeof(struct av_live));
    stack_get(a, 0);
    uint64_t fsize = tr_info(r)->file_size;
    if (opts)
        a->scope = opts->scope;
    /* Without step marks, leaks are judged over ~16 windows of allocations. */
    a->win_every = window_allocs(path, fsize, &a->scope);
    seg_open(a, NULL, -1, 0, 0);
    int last_pct = -1;
    bool prog = opts && opts->progress && fsize > ((uint64_t)64 << 20);
    tr_record_t rec;
    int k;
    bool first_event = true;
    uint64_t first_time = 0;
    while ((k = tr_next(r, &rec)) > 0) {
        if (prog && (rec.seq & 0xffff) == 0)
            progress(a, rec.offset, fsize, &last_pct);
        if (opts && opts->at_time_ns >= 0 && !a->at_hit && !first_event && rec.known &&
            rec.type >= CUA_TRACE_FIRST_EVENT && rec.time_ns - first_time > (uint64_t)opts->at_time_ns) {
            /* peak --at TIME: the state after every event up to TIME, taken before this first event
             * past it changes the totals or any site */
            a->at_hit = true;
            new_peak(a, first_time + (uint64_t)opts->at_time_ns, a->last_seq);
        }
        if (rec.known && rec.type >= CUA_TRACE_FIRST_EVENT) {
            if (first_event) {
                first_event = false;
                first_time = rec.time_ns;
                a->segs[0].start_time = a->segs[0].end_time = a->segs[0].peak_time = rec.time_ns;
            }
            a->last_time = rec.time_ns;
            seg_cur(a)->end_time = rec.time_ns;
        }
        if (dv_skips(&a->scope, &rec)) {
            /* another device's record still moves the trace's clock, so that times read as in the
             * whole trace; nothing else of it is counted */
            tr_acct_clock(&a->acct, &rec);
            a->last_seq = rec.seq;
            continue;
        }
        tr_acct_add(&a->acct, &rec);
        a->last_seq = rec.seq;
        if (!rec.known)
            continue;
        switch (rec.type) {
        case CUA_TRACE_PROCESS:
            a->have_process = true;
            a->pid = rec.u.process.pid;
            a->rank = rec.u.process.rank;
            a->clock = rec.u.process.clock;
            a->start_realtime = rec.u.process.realtime_ns;
            a->start_monotonic = rec.u.process.monotonic_ns;
            copy_str(a->host, sizeof a->host, rec.u.process.host);
            copy_str(a->cmd, sizeof a->cmd, rec.u.process.cmdline);
            copy_str(a->recorder, sizeof a->recorder, rec.u.process.recorder);
            break;
        case CUA_TRACE_CONFIG:
            copy_str(a->config, sizeof a->config, rec.u.text);
            break;
        case CUA_TRACE_DEVICE:
            if (rec.u.device.dev < CUA_TRACE_MAX_DEVICES) {
                int d = (int)rec.u.device.dev;
                a->have_dev[d] = true;
                copy_str(a->dev_name[d], sizeof a->dev_name[d], rec.u.device.name);
                a->dev_total[d] = rec.u.device.total;
                a->dev_capacity[d] = rec.u.device.capacity;
                a->dev_mode[d] = rec.u.device.mode;
                a->dev_granularity[d] = rec.u.device.granularity;
            }
            break;
        case CUA_TRACE_STACK:
            stack_get(a, (uint32_t)rec.u.stack.id);
            break;
        case CUA_TRACE_ALLOC:
        case CUA_TRACE_INIT_BLOCK: {
            if (devaddr_map_find(&a->live, rec.dev, rec.addr))
                break; /* double alloc: tr_acct counts it */
            av_stack_t *s = stack_get(a, rec.stack);
            stack_touch(a, s);
            struct av_live *e = devaddr_map_insert(&a->live, rec.dev, rec.addr);
            if (!e)
                xalloc_out_of_memory(0);
            e->stack = rec.stack;
            e->size = rec.size;
            e->req = rec.requested;
            s->cur_bytes += rec.size;
            s->cur_req += rec.requested;
            s->cur_count++;
            if (s->cur_bytes > s->max_bytes)
                s->max_bytes = s->cur_bytes;
            if (s->max_block_seg != (uint32_t)(a->nsegs - 1)) {
                s->max_block_before = s->max_block;
                s->max_block_seg = (uint32_t)(a->nsegs - 1);
            }
            if (rec.size > s->max_block)
                s->max_block = rec.size;
            if (s->first_seq == UINT64_MAX) {
                s->first_seq = rec.seq;
                s->first_time = rec.time_ns;
                s->first_seg = (uint32_t)(a->nsegs - 1);
            }
            if (rec.type == CUA_TRACE_ALLOC) {
                s->num_allocs++;
                s->alloc_bytes += rec.size;
                seg_cur(a)->num_allocs++;
                if (++a->win_allocs >= a->win_every) {
                    a->win_allocs = 0;
                    a->win_bounds++;
                }
            }
            av_seg_t *g = seg_cur(a);
            if (a->acct.allocated > g->peak_alloc) {
                g->peak_alloc = a->acct.allocated;
                g->peak_req = a->acct.requested;
                g->peak_reserved = a->acct.reserved;
                g->peak_time = rec.time_ns;
                g->peak_seq = rec.seq;
            }
            bool at_mode = opts && (opts->at_time_ns >= 0 || opts->at_mark);
            if (!at_mode && a->acct.allocated > a->peak_alloc)
                new_peak(a, rec.time_ns, rec.seq);
            break;
        }
        case CUA_TRACE_FREE: {
            struct av_live *e = devaddr_map_find(&a->live, rec.dev, rec.addr);
            if (!e)
                break;
            if (!seg_cur(a)->first_free_seq)
                seg_cur(a)->first_free_seq = rec.seq;
            av_stack_t *s = stack_get(a, e->stack);
            stack_touch(a, s);
            s->cur_bytes -= e->size <= s->cur_bytes ? e->size : s->cur_bytes;
            s->cur_req -= e->req <= s->cur_req ? e->req : s->cur_req;
            if (s->cur_count)
                s->cur_count--;
            devaddr_map_remove(&a->live, e);
            break;
        }
        case CUA_TRACE_MAP:
        case CUA_TRACE_INIT_MAP:
            if (a->acct.reserved > seg_cur(a)->peak_reserved)
                seg_cur(a)->peak_reserved = a->acct.reserved;
            segment_event(a, &rec);
            break;
        case CUA_TRACE_UNMAP:
            segment_event(a, &rec);
            break;
        case CUA_TRACE_OOM: {
            if (a->nooms == a->capooms) {
                a->capooms = a->capooms ? a->capooms * 2 : 8;
                a->ooms = xrealloc(a->ooms, a->capooms * sizeof *a->ooms);
            }
            av_oom_t *o = &a->ooms[a->nooms++];
            o->seq = rec.seq;
            o->time = rec.time_ns;
            o->dev = rec.dev;
            o->stack = rec.stack;
            o->seg = (uint32_t)(a->nsegs - 1);
            o->requested = rec.u.oom.requested;
            o->rounded = rec.u.oom.rounded;
            o->capacity = rec.u.oom.capacity;
            o->allocated = rec.u.oom.allocated;
            o->reserved = rec.u.oom.reserved;
            o->device_free = rec.u.oom.device_free;
            o->largest_free = rec.u.oom.largest_free;
            o->vmm_failure = rec.u.oom.vmm_failure;
            stack_get(a, rec.stack);
            if (!a->oom_snap) {
                o->split_segment = largest_split_segment(a, rec.dev);
                a->oom_in_opt = a->opt_open;
                a->oom_opt_start_seq = a->opt_start_seq;
                if (a->opt_open)
                    snprintf(a->oom_opt_name, sizeof a->oom_opt_name, "%s", a->opt_name);
                snapshot_oom(a, rec.dev);
            } else {
                o->split_segment = 0;
            }
            break;
        }
        case CUA_TRACE_MARK: {
            char label[AV_MARK_MAX];
            copy_str(label, sizeof label, rec.u.text);
            if (opts && opts->at_mark && strcmp(label, opts->at_mark) == 0 && a->at_mark_count++ == 0) {
                a->at_hit = true;
                a->at_seg = (uint32_t)(a->nsegs - 1);
            }
            on_mark(a, label, rec.time_ns, rec.seq);
            break;
        }
        default:
            break;
        }
        if (a->at_hit && !a->have_peak) {
            /* peak --at MARK: the snapshot is taken at the mark instead of the maximum */
            new_peak(a, rec.time_ns, rec.seq);
            a->peak_seg = a->at_seg;
        }
    }
    if (opts && opts->at_time_ns >= 0 && !a->at_hit && !first_event && k == 0 &&
        a->last_time - first_time >= (uint64_t)opts->at_time_ns) {
        /* TIME at or after the last event, within the trace's span: the state at its end */
        a->at_hit = true;
        new_peak(a, first_time + (uint64_t)opts->at_time_ns, a->last_seq);
    }
    if (prog) {
        progress(a, fsize, fsize, &last_pct);
        fputc('\n', stderr);
    }
    if (k < 0) {
        a->status = 3;
        snprintf(a->error, sizeof a->error, "%s", tr_error(r));
    }
    snprintf(a->warning, sizeof a->warning, "%s", tr_warning(r));
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        a->scope.peak[d] = a->acct.dev[d].allocated_peak;
    seg_cur(a)->end_time = a->last_time;
    /* An unfinished last step (the job died in it) keeps its provisional label. */
    for (size_t i = 0; i < a->nst; i++) {
        lk_catch(&a->st[i].lk_step, a->step_bounds, a->st[i].cur_bytes);
        lk_catch(&a->st[i].lk_win, a->win_bounds, a->st[i].cur_bytes);
    }
    return a;
}

void av_free(av_t *a)
{
    if (!a)
        return;
    tr_acct_free(&a->acct);
    free(a->st);
    free(a->segs);
    free(a->ooms);
    devaddr_map_free(&a->live);
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++) {
        if (a->segments[d])
            ranges_free(a->segments[d]);
        free(a->segments[d]);
    }
    tr_close(a->r);
    free(a);
}
