/* analysis.h — one streaming pass over a trace (reader.h) that builds what every allocview report
 * needs: what ran, the peak and who held memory then, steps and phases from marks, per-call-site
 * live bytes (now, at the peak, at the first OOM, at each step end for leak detection), and the
 * OOMs. Memory is bounded by the live blocks, the stacks and the marks, never by the number of
 * events: per-stack values at the peak are kept lazily (an epoch per peak; a stack's value is
 * saved the first time it changes after a new peak), leak state is caught up the same way.
 *
 *   av_t *a = av_analyze(path, &opts, err, sizeof err);   // NULL: unreadable (message in err)
 *   ... a->status: 0 ok, 3 corrupt after a readable prefix (a->error says where)
 *   av_free(a);
 */
#ifndef ALLOCVIEW_ANALYSIS_H
#define ALLOCVIEW_ANALYSIS_H

#include <stdbool.h>
#include <stdint.h>

#include "devices.h"
#include "ranges.h"
#include "reader.h"

/* Leak state of one stack over a series of boundaries (step ends or time windows). */
/* A mark's text, NUL included: the longest a trace holds (the recorder writes up to 1024 bytes,
 * allocview import up to 4000), cut beyond. Marks are matched whole: an optimizer annotation's START
 * with its END, a mark with `--at MARK`. */
#define AV_MARK_MAX 4001

typedef struct av_leak {
    uint32_t last_b;            /* boundaries accounted for */
    uint32_t n, inc, dec;       /* boundaries seen while live, rises, falls */
    uint64_t first_v, last_v;   /* live bytes at the first and last of them */
    uint32_t first_b;           /* boundary index of the first */
    uint32_t last_inc_b;        /* boundary index of the last rise: the first boundary that saw it */
} av_leak_t;

typedef struct av_stack {
    uint64_t cur_bytes, cur_req;
    uint32_t cur_count;
    uint64_t pk_epoch;           /* pk_* hold the value at the last peak when pk_epoch == a->epoch */
    uint64_t pk_bytes, pk_req;
    uint32_t pk_count;
    uint64_t oom_bytes;          /* at the first OOM */
    uint32_t oom_count;
    uint64_t oom_dev_bytes;      /* the same on the first OOM's device only (differs from oom_* only */
    uint32_t oom_dev_count;      /* where the analysis sums several devices: --device all) */
    uint64_t max_bytes;          /* its own highest live bytes */
    uint64_t max_block;          /* the largest block allocated from it */
    uint64_t max_block_before;   /* the same before segment max_block_seg, the last it allocated in */
    uint32_t max_block_seg;
    uint64_t oom_max_block;      /* the largest before the segment of the first OOM */
    uint64_t first_seq, first_time;
    uint32_t first_seg;
    uint64_t num_allocs, alloc_bytes;
    av_leak_t lk_step, lk_win;
} av_stack_t;

enum av_seg_kind { AV_SEG_START = 0, AV_SEG_STEP = 1, AV_SEG_PHASE = 2 };

typedef struct av_seg {
    char label[64];
    int kind;
    long step;                 /* AV_SEG_STEP: N */
    uint64_t start_time, end_time, start_seq;
    uint64_t alloc_at_start;
    uint64_t peak_alloc, peak_req, peak_reserved, peak_time, peak_seq;
    uint64_t num_allocs;
    uint64_t first_free_seq;   /* 0: no free in it */
    bool closed;
    /* AV_SEG_PHASE closed by "step N" where such marks end their steps: the segment holds the
     * phase's work and then step N's (the rest of it, or all of it when the phase mark came
     * between steps), and no mark tells the two apart; step = N, and the label names both. */
    bool with_step;
} av_seg_t;

typedef struct av_oom {
    uint64_t seq, time;
    uint32_t dev, stack, seg;
    uint64_t requested, rounded, capacity, allocated, reserved, device_free, largest_free;
    uint64_t vmm_failure; /* CUA_TRACE_VMM_*, as recorded (0: none, or a trace before format 1.1) */
    /* The first OOM on classic segments: the largest segment of its device mapped then that holds
     * a live block smaller than itself (carved by smaller requests; oom_max_split_mb); 0: none. */
    uint64_t split_segment;
} av_oom_t;

typedef struct av_opts {
    int64_t at_time_ns;        /* peak --at TIME (ns after the first event); -1: none */
    const char *at_mark;       /* peak --at MARK: the state when this mark was written */
    bool progress;             /* a progress bar on stderr */
    dv_scope_t scope;          /* which device (devices.h): with scope.one, only that device's blocks,
                                * maps and OOMs (marks and the clock stay the whole trace's) */
} av_opts_t;

typedef struct av {
    const char *path;
    tr_reader_t *r;            /* kept open: the stack and module definitions */
    tr_acct_t acct;
    int status;                /* 0, or 3: corrupt after the prefix */
    char error[512], warning[512];
    /* what ran */
    bool have_process;
    uint64_t pid;
    int64_t rank;
    char host[256], cmd[1024], recorder[64], config[4096];
    uint8_t clock;
    uint64_t start_realtime, start_monotonic;
    bool have_dev[CUA_TRACE_MAX_DEVICES];
    char dev_name[CUA_TRACE_MAX_DEVICES][96];
    uint64_t dev_total[CUA_TRACE_MAX_DEVICES], dev_capacity[CUA_TRACE_MAX_DEVICES];
    uint8_t dev_mode[CUA_TRACE_MAX_DEVICES];
    uint64_t dev_granularity[CUA_TRACE_MAX_DEVICES];
    /* stacks, indexed by stack id (0: not captured) */
    av_stack_t *st;
    size_t nst;
    uint64_t epoch;
    /* the peak of allocated bytes (all devices) */
    uint64_t peak_alloc, peak_req, peak_reserved, peak_time, peak_seq;
    uint32_t peak_seg;
    bool have_peak;
    /* segments (marks) */
    av_seg_t *segs;
    size_t nsegs, capsegs;
    uint32_t nmarks, nstep_marks;
    bool marks_start_steps, mark_convention_known;
    char torch_step_label[AV_MARK_MAX]; /* PyTorch's "END Optimizer.step#..." annotation that ends steps */
    long torch_steps;           /* how many of them so far */
    /* Inside PyTorch's "START/END Optimizer.step#NAME" annotations: open, since which record, NAME;
     * and the same at the allocated peak. */
    bool opt_open, peak_in_opt;
    uint64_t opt_start_seq, peak_opt_start_seq;
    char opt_name[AV_MARK_MAX], peak_opt_name[AV_MARK_MAX]; /* whole marks: they are compared */
    /* The same at the first OOM: inside an optimizer step, since which record, its NAME. */
    bool oom_in_opt;
    uint64_t oom_opt_start_seq;
    char oom_opt_name[AV_MARK_MAX];
    uint32_t step_bounds, win_bounds;
    uint64_t win_every, win_allocs;
    /* OOMs */
    av_oom_t *ooms;
    size_t nooms, capooms;
    bool oom_snap;
    uint64_t oom_live_count;
    /* --at */
    bool at_hit;
    uint64_t at_time, at_seq, at_alloc, at_req, at_reserved;
    uint32_t at_seg;
    uint32_t at_mark_count;    /* marks with --at MARK's label: the state is the first's */
    devaddr_map_t live;        /* live blocks (struct av_live in analysis.c) */
    addr_ranges_t *segments[CUA_TRACE_MAX_DEVICES]; /* classic devices: the segments mapped now */
    uint64_t last_seq, last_time;
    /* Traces with blocks on several devices: which one this analysis is of (opts.scope), why, and
     * every device's own peak of allocated bytes (0: none) as this analysis saw them. */
    dv_scope_t scope;
} av_t;

av_t *av_analyze(const char *path, const av_opts_t *opts, char *err, size_t errlen);
void av_free(av_t *a);

/* Value of stack s at the last peak. */
static inline uint64_t av_peak_bytes(const av_t *a, const av_stack_t *s)
{
    return s->pk_epoch == a->epoch ? s->pk_bytes : s->cur_bytes;
}
static inline uint32_t av_peak_count(const av_t *a, const av_stack_t *s)
{
    return s->pk_epoch == a->epoch ? s->pk_count : s->cur_count;
}
/* Leak verdict of a tracker: true when live bytes rose boundary after boundary and never fell. */
bool av_leak_growing(const av_leak_t *l, uint64_t end_bytes);
/* Parses "step N" (also "step N (optimizer K)"); returns N or -1. */
long av_step_of(const char *label);

#endif
