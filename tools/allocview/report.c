/* report.c — see report.h. Every figure printed comes from the trace; a diagnosis rule prints
 * nothing unless the trace supports it. The fixes follow the OOM ladder of ../shared/seeds in
 * cost order (smaller micro-batch with gradient accumulation, mixed precision, activation
 * checkpointing, expandable segments, ..., 8-bit optimizer, sharding, offload). */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis.h"
#include "internal.h" /* oom_classify: the heap's own OOM rule */
#include "symbolize.h"
#include "text.h"
#include "views.h"
#include "xalloc.h"

enum { EXIT_USAGE = 1, EXIT_UNREADABLE = 2, EXIT_CORRUPT = 3 };
/* --top: call sites listed at most (all of them, in practice). */
#define REPORT_MAX_TOP 1000000
/* VIEW_OOM_DEV: at the first OOM, its device's blocks only (VIEW_OOM sums the devices analyzed). */
enum { VIEW_PEAK, VIEW_OOM, VIEW_END, VIEW_EVER, VIEW_OOM_DEV };

typedef struct ropts {
    bool json, color, redact;
    int top;
    av_opts_t av;
} ropts_t;

/* ------------------------------------------------------------------------------- output */

static bool color;
static const char *C_B(void) { return color ? "\033[1m" : ""; }
static const char *C_R(void) { return color ? "\033[1;31m" : ""; }
static const char *C_Y(void) { return color ? "\033[33m" : ""; }
static const char *C_0(void) { return color ? "\033[0m" : ""; }

/* Up to 8 human strings per printf: H(x) */
static char hbuf[16][32];
static int hnext;
static const char *H(uint64_t b)
{
    hnext = (hnext + 1) % 16;
    return txt_human(b, hbuf[hnext], sizeof hbuf[hnext]);
}

static char tbuf[8][48];
static int tnext;
/* A time relative to the trace's first event. */
static const char *T(const av_t *a, uint64_t t)
{
    tnext = (tnext + 1) % 8;
    uint64_t rel = t >= a->acct.first_time ? t - a->acct.first_time : 0;
    snprintf(tbuf[tnext], sizeof tbuf[tnext], "+%.6f s", (double)rel / 1e9);
    return tbuf[tnext];
}

/* Paths inside a command line or configuration shortened to their last component. */
static void redact_paths(const char *in, char *out, size_t len)
{
    size_t o = 0;
    const char *p = in;
    while (*p && o + 1 < len) {
        const char *w = p;
        while (*p && *p != ' ' && *p != ',')
            p++;
        /* a word: key:value or a path */
        const char *colon = memchr(w, ':', (size_t)(p - w));
        const char *val = colon ? colon + 1 : w;
        const char *slash = NULL;
        for (const char *q = val; q < p; q++)
            if (*q == '/')
                slash = q;
        size_t n1 = (size_t)(val - w);
        const char *v2 = slash ? slash + 1 : val;
        size_t n2 = (size_t)(p - v2);
        if (o + n1 + n2 + 2 >= len)
            break;
        memcpy(out + o, w, n1);
        o += n1;
        memcpy(out + o, v2, n2);
        o += n2;
        if (*p)
            out[o++] = *p++;
    }
    out[o] = '\0';
}

/* ----------------------------------------------------------------------------------- sites */

typedef struct site {
    const char *frames[32];
    size_t nframes;
    const char *lframes[32]; /* what its label is made of (sym_stack_label) */
    size_t nlframes;
    uint32_t first_stack;
    uint64_t bytes, count;
    uint64_t extra; /* leaks: growth */
    char label[1024];
} site_t;

static uint64_t view_bytes(const av_t *a, const av_stack_t *s, int view)
{
    return view == VIEW_PEAK      ? av_peak_bytes(a, s)
           : view == VIEW_OOM     ? s->oom_bytes
           : view == VIEW_OOM_DEV ? s->oom_dev_bytes
           : view == VIEW_END     ? s->cur_bytes
                                  : s->alloc_bytes + s->cur_bytes;
}
static uint64_t view_count(const av_t *a, const av_stack_t *s, int view)
{
    return view == VIEW_PEAK      ? av_peak_count(a, s)
           : view == VIEW_OOM     ? s->oom_count
           : view == VIEW_OOM_DEV ? s->oom_dev_count
                                  : s->cur_count;
}

static bool same_frames(const site_t *x, const char *const *f, size_t n)
{
    if (x->nframes != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (x->frames[i] != f[i] && strcmp(x->frames[i], f[i]) != 0)
            return false;
    return true;
}

static int cmp_site(const void *p, const void *q)
{
    const site_t *x = p, *y = q;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x->first_stack < y->first_stack ? -1 : x->first_stack > y->first_stack;
}

/* Call sites (whole symbolized stacks; stacks that name the same frames are one site) holding
 * memory in `view`, largest first. `only`: when non-NULL, a per-stack filter. */
static site_t *collect_sites(const av_t *a, sym_ctx_t *sym, int view, bool (*only)(const av_t *, uint32_t),
                             size_t *n_out)
{
    site_t *v = NULL;
    size_t n = 0, cap = 0;
    /* A small hash from the innermost frame pointer to the candidate list would be faster; the
     * number of stacks with live bytes in one view is modest, so a hash on the joined text: */
    size_t hcap = 1024;
    while (hcap < a->nst * 2)
        hcap *= 2;
    int32_t *h = xmalloc(hcap * sizeof *h);
    for (size_t i = 0; i < hcap; i++)
        h[i] = -1;
    for (size_t id = 0; id < a->nst; id++) {
        const av_stack_t *s = &a->st[id];
        uint64_t b = view_bytes(a, s, view);
        if (!b || (only && !only(a, (uint32_t)id)))
            continue;
        const char *f[32];
        size_t nf = sym_stack(sym, (uint32_t)id, f, 32);
        uint64_t hv = 1469598103934665603ULL;
        for (size_t i = 0; i < nf; i++)
            for (const char *c = f[i]; *c; c++)
                hv = (hv ^ (unsigned char)*c) * 1099511628211ULL;
        hv ^= nf;
        size_t j = hv & (hcap - 1);
        for (; h[j] >= 0; j = (j + 1) & (hcap - 1))
            if (same_frames(&v[h[j]], f, nf))
                break;
        site_t *x;
        if (h[j] >= 0) {
            x = &v[h[j]];
        } else {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                v = xrealloc(v, cap * sizeof *v);
            }
            x = &v[n];
            memset(x, 0, sizeof *x);
            memcpy(x->frames, f, nf * sizeof *f);
            x->nframes = nf;
            x->nlframes = sym_stack_label(sym, (uint32_t)id, x->lframes, 32);
            x->first_stack = (uint32_t)id;
            h[j] = (int32_t)n++;
        }
        x->bytes += b;
        x->count += view_count(a, s, view);
    }
    free(h);
    if (n)
        qsort(v, n, sizeof *v, cmp_site);
    *n_out = n;
    return v;
}

/* Labels: frames from the user's innermost down to the first that tells the site apart from
 * the other sites listed (an allocation helper shared by many sites is followed by its callers). */
static site_t *ref_sites;
static size_t nref_sites;

static void label_each(site_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t need = 1;
        for (size_t j = 0; j < n + nref_sites; j++) {
            const site_t *w = j < n ? &v[j] : &ref_sites[j - n];
            if (j == i || (j >= n && same_frames(w, v[i].frames, v[i].nframes)))
                continue;
            size_t d = sym_label_depth(v[i].lframes, v[i].nlframes, w->lframes, w->nlframes);
            if (d > need)
                need = d;
        }
        sym_label(v[i].lframes, v[i].nlframes, need, v[i].first_stack != 0, v[i].label, sizeof v[i].label);
    }
}

/* Labels the `show` largest of the n sites (sorted, largest first), and merges those whose labels
 * come out the same: stacks that differ only where a label does not look (past SYM_LABEL_FRAMES
 * frames, or in the native frames between a Python line and the frame that allocated, such as the
 * several operators of one line under PyTorch) are one call site to the reader, and two rows with
 * one text would read as a mistake. A merged site keeps the frames of its largest part. Returns
 * the number of sites left, sorted again; the labels of the first min(show, that) are set. */
static size_t label_sites(site_t *v, size_t n, size_t show)
{
    for (;;) {
        size_t k = n < show ? n : show;
        label_each(v, k);
        bool merged = false;
        for (size_t i = 0; i < k; i++)
            for (size_t j = i + 1; j < k; j++) {
                if (strcmp(v[i].label, v[j].label) != 0)
                    continue;
                v[i].bytes += v[j].bytes;
                v[i].count += v[j].count;
                v[i].extra += v[j].extra;
                memmove(&v[j], &v[j + 1], (n - j - 1) * sizeof *v);
                n--, k--, j--;
                merged = true;
            }
        if (!merged)
            return n;
        /* The merged sites may have moved up, and one more site is in the shown set: the labels
         * are made again against the sites now shown. */
        qsort(v, n, sizeof *v, cmp_site);
    }
}

/* ----------------------------------------------------------------------- the facts, by rule */

typedef struct diag {
    const char *rule;      /* "oom-fragmentation", "oom-shortage", "oom-cap", "oom-device-full", "oom-chunk-granularity",
                              "oom-device-refused", "oom-frees-waiting", "oom-driver-error", "leak", "step2-jump", "optimizer-step",
                              "longest-batch", "phase",
                              "phase-or-step" */
    /* Room for the longest figures and names a rule writes: a mark's name (AV_MARK_MAX) and a few
     * call-site labels of up to 1023 bytes each. */
    char text[6144];
    char fix[4096];
    uint64_t saving;       /* bytes the trace implies the fix can save (0: none claimed) */
    char site[1024];
    const char *follows;   /* the rule of the diagnoses this fix defers to ("leak", "optimizer-step"),
                            * or NULL: where they are made, the fix says that they follow
                            * (diagnose's last pass), and `oom` prints them too */
} diag_t;

/* The diagnoses a report makes room for, besides every leak where `leaks` lists them all. */
#define MAX_DIAGS 32

/* Room for n diagnoses (11 KiB each: on the heap, not the stack). */
static diag_t *diags_new(size_t n)
{
    return xcalloc(n, sizeof(diag_t));
}

/* A new diagnosis for `rule` (site: the call site it names, or NULL), cleared. */
static diag_t *diag_add(diag_t *d, size_t *nd, const char *rule, const char *site)
{
    diag_t *x = &d[(*nd)++];
    memset(x, 0, sizeof *x);
    x->rule = rule;
    if (site)
        snprintf(x->site, sizeof x->site, "%s", site);
    return x;
}

/* Has a diagnosis of `rule` been made already? */
static bool has_rule(const diag_t *d, size_t nd, const char *rule)
{
    for (size_t i = 0; i < nd; i++)
        if (strcmp(d[i].rule, rule) == 0)
            return true;
    return false;
}

static const av_seg_t *first_step(const av_t *a)
{
    for (size_t i = 0; i < a->nsegs; i++)
        if (a->segs[i].kind == AV_SEG_STEP && a->segs[i].num_allocs)
            return &a->segs[i];
    return NULL;
}

/* What leaks are judged over: step ends (3 step marks or more); nothing (one or two: the trace is a
 * step or two, and what a step builds up, a forward pass's activations or an optimizer's state
 * made in its first step, would read as a leak over windows, while a leak shows over 3 steps); or
 * windows of allocations (no step mark). */
typedef enum { LEAKS_BY_STEPS, LEAKS_NOT_JUDGED, LEAKS_BY_WINDOWS } leak_basis_t;

static leak_basis_t leak_basis(const av_t *a)
{
    return a->step_bounds >= 3 ? LEAKS_BY_STEPS : a->step_bounds > 0 ? LEAKS_NOT_JUDGED : LEAKS_BY_WINDOWS;
}

static bool use_step_leaks(const av_t *a) { return leak_basis(a) == LEAKS_BY_STEPS; }

static bool is_leak(const av_t *a, uint32_t id)
{
    const av_stack_t *s = &a->st[id];
    switch (leak_basis(a)) {
    case LEAKS_BY_STEPS:
        return av_leak_growing(&s->lk_step, s->cur_bytes);
    case LEAKS_NOT_JUDGED:
        return false;
    case LEAKS_BY_WINDOWS:
        break;
    }
    /* A window is no step either, and a trace that ends inside a step still holds what the step
     * built up. A leak keeps growing: over at least half of the trace's windows, and into their
     * last quarter. */
    const av_leak_t *l = &s->lk_win;
    return av_leak_growing(l, s->cur_bytes) && (uint64_t)l->n * 2 >= a->win_bounds &&
           (uint64_t)l->last_inc_b * 4 >= (uint64_t)a->win_bounds * 3;
}

/* First allocated inside the optimizer step that holds the peak (PyTorch's annotations). */
static bool is_optimizer_new(const av_t *a, uint32_t id)
{
    const av_stack_t *s = &a->st[id];
    return s->first_seq != UINT64_MAX && s->first_seq > a->peak_opt_start_seq && s->first_seq <= a->peak_seq;
}

/* First allocated inside the optimizer step the first OOM came in, before the OOM. */
static bool is_optimizer_new_at_oom(const av_t *a, uint32_t id)
{
    const av_stack_t *s = &a->st[id];
    return s->first_seq != UINT64_MAX && s->first_seq > a->oom_opt_start_seq && s->first_seq < a->ooms[0].seq;
}

static const av_seg_t *step1_seg;
/* A class of allocations that first appears once step 1 has begun releasing memory (backward,
 * optimizer step) and stays: live at the end of step 1. */
static bool is_late(const av_t *a, uint32_t id)
{
    const av_stack_t *s = &a->st[id];
    return step1_seg && s->first_seq != UINT64_MAX && step1_seg->first_free_seq &&
           s->first_seq > step1_seg->first_free_seq && s->first_seg == (uint32_t)(step1_seg - a->segs) &&
           s->lk_step.n > 0 && s->lk_step.first_b == 1 && !is_leak(a, id);
}
/* The same, allocated once: holding at the peak (at the first OOM) no more than at the end of step 1
 * (lk_step.first_v, as first_b is 1). A class that went on growing after step 1, such as a cache
 * filled over the first steps, is no state made on the first step, and the bytes it added later
 * were not made late in step 1. */
static bool is_late_at_peak(const av_t *a, uint32_t id)
{
    return is_late(a, id) && av_peak_bytes(a, &a->st[id]) <= a->st[id].lk_step.first_v;
}
static bool is_late_at_oom(const av_t *a, uint32_t id)
{
    return is_late(a, id) && a->st[id].oom_bytes <= a->st[id].lk_step.first_v;
}

static int cmp_u64(const void *p, const void *q)
{
    uint64_t x = *(const uint64_t *)p, y = *(const uint64_t *)q;
    return x < y ? -1 : x > y;
}

/* The device the report is of: the one analyzed, else the first with blocks (0 when none). */
static uint32_t report_device(const av_t *a)
{
    uint32_t first = 0;
    if (a->scope.one)
        return a->scope.device;
    dv_with_blocks(&a->scope, &first, 1);
    return first;
}

static bool dev_vmm(const av_t *a, uint32_t dev)
{
    return dev < CUA_TRACE_MAX_DEVICES && a->have_dev[dev] && a->dev_mode[dev] == CUA_TRACE_MODE_VMM;
}

/* The item "KEY:VALUE" of the recorded configuration ("k:v,k:v,..."): where it starts, with its
 * length in *n; NULL when the configuration has no such key. */
static const char *config_item(const av_t *a, const char *key, size_t *n)
{
    size_t kl = strlen(key);
    for (const char *p = a->config; *p;) {
        const char *comma = strchr(p, ',');
        if (strncmp(p, key, kl) == 0 && p[kl] == ':') {
            *n = comma ? (size_t)(comma - p) : strlen(p);
            return p;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return NULL;
}

/* The value of KEY:N in the recorded configuration, or dflt when it is absent or not a number. */
static uint64_t config_number(const av_t *a, const char *key, uint64_t dflt)
{
    size_t n, kl = strlen(key);
    const char *p = config_item(a, key, &n);
    if (!p)
        return dflt;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p + kl + 1, &end, 10);
    return end != p + kl + 1 && end == p + n && errno == 0 ? v : dflt;
}

/* The recorded max_memory_mb, in bytes (0: unset, or too large to be a cap). */
static uint64_t config_max_memory(const av_t *a)
{
    uint64_t mb = config_number(a, "max_memory_mb", 0);
    return mb <= (UINT64_MAX >> 20) ? mb << 20 : 0;
}

/* The key that set a cap of `capacity` bytes below the device's memory, as the heap's own report
 * names it (oom_cap_key), where the recorded configuration says so: max_memory_mb where the cap
 * equals it, per_process_memory_fraction where that is set; NULL otherwise (no configuration: a
 * PyTorch snapshot). */
static const char *cap_key(const av_t *a, uint64_t capacity)
{
    const char *key = oom_cap_key(config_max_memory(a), capacity);
    if (strcmp(key, "max_memory_mb") == 0)
        return key;
    size_t n;
    const char *p = config_item(a, "per_process_memory_fraction", &n);
    if (p) {
        size_t kl = strlen("per_process_memory_fraction") + 1;
        char v[32];
        snprintf(v, sizeof v, "%.*s", (int)(n - kl < sizeof v - 1 ? n - kl : sizeof v - 1), p + kl);
        if (strtod(v, NULL) > 0)
            return key;
    }
    return NULL;
}

/* The boolean KEY:V of the recorded configuration (V as cualloc's configuration takes it: 1, true,
 * yes, on or 0, false, no, off, any case), or dflt when it is absent or not one of those. */
static bool config_bool(const av_t *a, const char *key, bool dflt)
{
    size_t n, kl = strlen(key);
    const char *p = config_item(a, key, &n);
    bool b;
    return p && conf_parse_bool(p + kl + 1, n - kl - 1, &b) == NULL ? b : dflt;
}

/* A trace cualloc recorded (not an import): its configuration's defaults are cualloc's. */
static bool by_cualloc(const av_t *a) { return strncmp(a->recorder, "cualloc", 7) == 0; }

/* Whether to advise expandable segments on device dev: not where it has them, nor where the trace
 * asked for them (cualloc's default) and the device, having no virtual memory management, gave
 * classic segments instead (the heap's own rule, oom_classic_fixes). */
static bool advise_expandable(const av_t *a, uint32_t dev)
{
    return !dev_vmm(a, dev) && !config_bool(a, "expandable_segments", by_cualloc(a));
}

/* An OOM record's largest free block, as text: a PyTorch snapshot's OOM entry has none, and its
 * import records 0, which is not the figure (reserved but unallocated memory is free somewhere). */
static bool largest_free_known(const av_t *a, const av_oom_t *o)
{
    return by_cualloc(a) || o->largest_free || o->reserved == o->allocated;
}
static const char *largest_free_text(const av_t *a, const av_oom_t *o)
{
    return largest_free_known(a, o) ? H(o->largest_free) : "not recorded";
}

/* An OOM that oom_classify calls fragmentation, on a device of expandable (VMM) segments: why the
 * heap, which releases every whole cached chunk before it fails, still could not serve it
 * (oom_vmm_failure, the rule the heap's own report on stderr follows). cualloc records the reason
 * (format 1.1). For a trace without it the address space's part is inferred, as the trace holds
 * no map of the reserved range: where the new chunks fit under the cap and in what the device had
 * free, only the address space can have been missing. That applies to cualloc's own traces; a
 * PyTorch snapshot's expandable segments reserve their address space per segment, so there the
 * device refused. */
static void oom_vmm_text(const av_t *a, const av_oom_t *o, diag_t *x)
{
    uint32_t dev = o->dev;
    uint64_t gran = a->dev_granularity[dev] ? a->dev_granularity[dev] : (uint64_t)2 << 20;
    uint64_t chunk_size_mb = config_number(a, "chunk_size_mb", 0);
    uint64_t large_chunk =
        oom_vmm_large_chunk(gran, chunk_size_mb <= (UINT64_MAX >> 20) ? chunk_size_mb << 20 : UINT64_MAX, o->capacity, NULL);
    uint64_t chunk = o->rounded <= CUALLOC_SMALL_MAX ? oom_vmm_small_chunk(gran) : large_chunk;
    uint64_t need = o->rounded <= UINT64_MAX - (chunk - 1) ? (o->rounded + chunk - 1) / chunk * chunk : UINT64_MAX;
    bool space_fits = !by_cualloc(a) || oom_missing(need, o->reserved, o->capacity) != 0 || o->device_free < need;
    uint64_t partial = o->reserved - o->allocated;
    x->saving = 0;
    oom_vmm_failure_t why = o->vmm_failure >= OOM_VMM_ADDRESS_SPACE && o->vmm_failure <= OOM_VMM_REFUSED
                                ? (oom_vmm_failure_t)o->vmm_failure
                                : oom_vmm_failure(need, o->reserved, o->capacity, space_fits);
    switch (why) {
    case OOM_VMM_CHUNKS: {
        uint64_t dev_total = a->dev_total[dev];
        const char *cap_key = o->capacity >= dev_total ? NULL : oom_cap_key(config_max_memory(a), o->capacity);
        char fix[256];
        oom_chunks_fix(fix, sizeof fix, large_chunk, gran, cap_key,
                       oom_missing(need, o->reserved, oom_room(o->reserved, o->device_free)) == 0, H(o->device_free));
        x->rule = "oom-chunk-granularity";
        snprintf(x->text, sizeof x->text,
                 "OOM at chunk granularity: the live blocks (%s) plus the request (%s) fit in the capacity (%s), but "
                 "memory is mapped in whole chunks of %s and the live blocks kept %s in partly used chunks (what "
                 "was reserved beyond them); the request needed %s of new chunks, which passed the capacity.",
                 H(o->allocated), H(o->rounded), H(o->capacity), H(large_chunk > gran ? large_chunk : chunk), H(partial),
                 H(need));
        snprintf(x->fix, sizeof x->fix, "First fix: %s.", fix);
        x->saving = oom_missing(need, o->reserved, o->capacity);
        break;
    }
    case OOM_VMM_ADDRESS_SPACE: {
        char fix[128];
        oom_address_space_fix(fix, sizeof fix, config_number(a, "va_factor", 4));
        x->rule = "oom-fragmentation";
        snprintf(x->text, sizeof x->text,
                 "OOM by fragmentation of the address space: the live blocks (%s) plus the request (%s) fit in the "
                 "capacity (%s), and its %s of new chunks fit under it%s%s, but no free range of the heap's "
                 "reserved address space was large enough for them.",
                 H(o->allocated), H(o->rounded), H(o->capacity), H(need),
                 o->device_free >= need ? " and in what the device had free, " : "",
                 o->device_free >= need ? H(o->device_free) : "");
        snprintf(x->fix, sizeof x->fix, "Fix (free): %s; no model change is needed.", fix);
        break;
    }
    case OOM_VMM_WAITING: /* diagnose() handles it first, on either kind of segments */
    case OOM_VMM_REFUSED:
        x->rule = "oom-device-refused";
        snprintf(x->text, sizeof x->text,
                 "OOM because the device refused more memory: the live blocks (%s) plus the request (%s) fit in the "
                 "capacity (%s) and its %s of new chunks under it, but creating or mapping them failed with %s "
                 "free on the device.",
                 H(o->allocated), H(o->rounded), H(o->capacity), H(need), H(o->device_free));
        snprintf(x->fix, sizeof x->fix,
                 "Free what holds the rest of the device (other processes, other allocators in this one); or set "
                 "per_process_memory_fraction / max_memory_mb so that the cap matches what this process can have.");
        break;
    }
}

/* What the heap's rule (oom.c) made of an OOM: a recorded vmm_failure is the heap's word that it gave
 * fragmentation (it classifies with the device's free memory unknown where the record can only say
 * 0). */
static oom_kind_t oom_kind_of(const av_oom_t *o)
{
    return o->vmm_failure ? OOM_FRAGMENTATION
                          : oom_classify(o->rounded, o->capacity, o->allocated, o->reserved, o->device_free);
}

/* The failing request's call site, every frame of it, as the OOM section names it. */
static void failing_site(sym_ctx_t *sym, const av_oom_t *o, char *buf, size_t len)
{
    const char *f[32];
    size_t nf = sym_stack_label(sym, o->stack, f, 32);
    sym_label(f, nf, nf, o->stack != 0, buf, len);
}

/* The training-side fixes of the OOM ladder, in cost order, where no allocator setting helps; inside
 * the optimizer's step, where the batch's activations are gone, those that shrink what it holds. */
#define LIVE_LADDER                                                                                    \
    "(1) a smaller micro-batch with gradient accumulation, (2) bf16 mixed precision, (3) activation " \
    "checkpointing, then an 8-bit optimizer, sharding (FSDP/ZeRO) or offload"
#define OPTIMIZER_LADDER                                                                                 \
    "fused=True or foreach=False (fewer temporaries), (7) an 8-bit or paged optimizer, (8) ZeRO-1 / FSDP " \
    "sharding; the batch size does not matter inside the optimizer's step"

static size_t diagnose(const av_t *a, sym_ctx_t *sym, diag_t *d, size_t maxd)
{
    size_t nd = 0;
    char pct[32];
    /* 1. OOM: shortage, a full device or fragmentation, by the heap's own rule (oom.c), so that
     *    allocview says what the report on stderr said (the first OOM, the one that ends most jobs). */
    if (a->nooms && nd < maxd) {
        const av_oom_t *o = &a->ooms[0];
        oom_kind_t kind = oom_kind_of(o);
        size_t ns;
        /* Only the OOM's device's blocks could have made room for it (--device all sums others in). */
        site_t *v = collect_sites(a, sym, VIEW_OOM_DEV, NULL, &ns);
        ns = label_sites(v, ns, 8);
        diag_t *x = diag_add(d, &nd, NULL, NULL);
        if (o->vmm_failure == CUA_TRACE_VMM_DRIVER_ERROR) {
            /* The heap's word (heap.c, alloc_fail_driver): the driver failed its last attempt to
             * create or map memory with an error that is not out of memory. The trace does not
             * hold the error; the heap's line on stderr names it. */
            x->rule = "oom-driver-error";
            snprintf(x->text, sizeof x->text,
                     "Not out of memory: the request (%s) failed because the driver refused to create or map memory "
                     "with an error other than out of memory (the job's stderr names it, on the line \"cualloc: "
                     "device %u: cannot allocate\"). An earlier error, such as a kernel's illegal memory access or a "
                     "failed launch, leaves the CUDA context unusable, and every later call fails with it; the "
                     "figures then (%s live, %s reserved, under a capacity of %s) say nothing of the cause.",
                     H(o->rounded), o->dev, H(o->allocated), H(o->reserved), H(o->capacity));
            snprintf(x->fix, sizeof x->fix,
                     "First fix: find the first CUDA call that failed: run the job with CUDA_LAUNCH_BLOCKING=1, or "
                     "under compute-sanitizer. No memory setting applies.");
        } else if (o->vmm_failure == CUA_TRACE_VMM_WAITING) {
            /* The heap's word (heap.c, oom_frees_waiting_text): memory freed on streams it could
             * not synchronize, a capture in progress or a stream the driver refused, would have
             * served the request. The trace holds no stream's capture state: both causes named. */
            x->rule = "oom-frees-waiting";
            snprintf(x->text, sizeof x->text,
                     "OOM with freed memory not yet reusable: the live blocks (%s) plus the request (%s) fit in the "
                     "capacity (%s) and in the %s the heap held plus the %s the device had free, but of the %s it "
                     "held beyond the live blocks, what would have served the request had been freed on streams "
                     "it could not synchronize: a CUDA graph capture in progress (device-wide frees, cudaFree's, "
                     "wait for a device synchronize, which would invalidate it; frees on a capturing stream wait "
                     "for its capture to end), or a stream the driver would not synchronize.",
                     H(o->allocated), H(o->rounded), H(o->capacity), H(o->reserved), H(o->device_free),
                     H(o->reserved - o->allocated));
            snprintf(x->fix, sizeof x->fix,
                     "First fix: free (or allocate) that memory before the capture begins, or free it with "
                     "cudaFreeAsync on a stream that is not captured, whose own events let it be reused; without a "
                     "capture, check the CUDA errors of the streams that freed it.");
        } else if (kind == OOM_FRAGMENTATION && dev_vmm(a, o->dev)) {
            oom_vmm_text(a, o, x);
        } else if (kind == OOM_FRAGMENTATION) {
            x->rule = "oom-fragmentation";
            snprintf(x->text, sizeof x->text,
                     "OOM by fragmentation: the live blocks (%s) plus the request (%s) fit in the capacity (%s) "
                     "and in the %s the heap held plus the %s the device had free, but %s was reserved and "
                     "unallocated and its largest free block (%s) is smaller than the request.",
                     H(o->allocated), H(o->rounded), H(o->capacity), H(o->reserved), H(o->device_free),
                     H(o->reserved - o->allocated),
                     largest_free_known(a, o) ? H(o->largest_free) : "not recorded in the snapshot");
            /* The heap's own rule (oom_classic_fixes): expandable segments unless the trace asked for
             * them (its device then had no VMM), a max_split_size_mb that keeps the largest carved
             * segment whole; where neither applies, what live memory must do. */
            char fixes[768];
            bool asked = config_bool(a, "expandable_segments", by_cualloc(a));
            uint64_t max_split_mb = config_number(a, "max_split_size_mb", 0);
            uint64_t max_split = max_split_mb && max_split_mb <= (UINT64_MAX >> 20) ? max_split_mb << 20 : UINT64_MAX;
            if (oom_classic_fixes(fixes, sizeof fixes, o->rounded, o->split_segment, max_split, asked, true)) {
                int w = snprintf(x->fix, sizeof x->fix, "Fix (free, ladder rung 4): %s.", fixes);
                if (!asked && w > 0 && (size_t)w < sizeof x->fix)
                    snprintf(x->fix + w, sizeof x->fix - (size_t)w,
                             " Expandable segments make the %s reserved but unallocated usable; the job then needs "
                             "%s, under the capacity %s.",
                             H(o->reserved - o->allocated), H(o->allocated + o->rounded), H(o->capacity));
                x->saving = o->reserved - o->allocated;
            } else {
                snprintf(x->fix, sizeof x->fix,
                         "No allocator setting can fix that here: expandable segments were asked for, and the device "
                         "had no virtual memory management for them; %s. Fix, in cost order: " LIVE_LADDER ".",
                         fixes);
            }
        } else {
            uint64_t over;
            /* lead: how the fix begins; then: the same after "Then, if still needed, " (below) */
            const char *lead = "Fix, in cost order", *then = "in cost order";
            char raise_lead[256], raise_then[256];
            uint64_t dev_total = o->dev < CUA_TRACE_MAX_DEVICES ? a->dev_total[o->dev] : 0;
            if (kind == OOM_SHORTAGE &&
                oom_cap_reached(o->rounded, o->capacity, dev_total, o->allocated, oom_room(o->reserved, o->device_free))) {
                x->rule = "oom-cap";
                over = oom_missing(o->rounded, o->allocated, o->capacity);
                snprintf(x->text, sizeof x->text,
                         "OOM at the configured cap: the live blocks (%s) plus the request (%s) need %s more than the "
                         "capacity (%s), a cap set below the device's %s, and the device had room for them (the %s "
                         "the heap held plus the %s the device had free).",
                         H(o->allocated), H(o->rounded), H(over), H(o->capacity), H(dev_total), H(o->reserved),
                         H(o->device_free));
                const char *key = cap_key(a, o->capacity);
                snprintf(raise_then, sizeof raise_then,
                         "raise the cap (CUALLOC_CONF %s) if this process may use more of the device; else, in cost "
                         "order",
                         key ? key : "max_memory_mb or per_process_memory_fraction, whichever set it");
                snprintf(raise_lead, sizeof raise_lead, "Fix (free): %s", raise_then);
                lead = raise_lead;
                then = raise_then;
            } else if (kind == OOM_SHORTAGE && o->rounded > o->capacity) {
                /* The request alone is larger than the capacity: no live memory given up makes room
                 * for it (the live blocks hold less than the excess); the tensor itself must shrink. */
                x->rule = "oom-shortage";
                over = oom_missing(o->rounded, o->allocated, o->capacity);
                failing_site(sym, o, x->site, sizeof x->site);
                snprintf(x->text, sizeof x->text,
                         "OOM by genuine shortage: the request alone (%s) is larger than the capacity (%s), so no "
                         "memory given up elsewhere (the live blocks held %s) and no allocator setting can make room "
                         "for it.",
                         H(o->rounded), H(o->capacity), H(o->allocated));
                snprintf(x->fix, sizeof x->fix,
                         "Fix: that one tensor must shrink by %s at least (%s beside the live blocks): the one asked "
                         "for at %s. Smaller dimensions (batch, sequence length, resolution), bf16, or computing it "
                         "in pieces (chunking, or sharding it across GPUs).",
                         H(o->rounded - o->capacity), H(over), x->site);
                x->saving = over;
            } else if (kind == OOM_SHORTAGE) {
                x->rule = "oom-shortage";
                over = oom_missing(o->rounded, o->allocated, o->capacity);
                snprintf(x->text, sizeof x->text,
                         "OOM by genuine shortage: the live blocks (%s) plus the request (%s) need %s more than the "
                         "capacity (%s); no allocator setting can fix that.",
                         H(o->allocated), H(o->rounded), H(over), H(o->capacity));
            } else {
                x->rule = "oom-device-full";
                over = oom_missing(o->rounded, o->allocated, oom_room(o->reserved, o->device_free));
                snprintf(x->text, sizeof x->text,
                         "OOM because the device was full, not fragmented: the live blocks (%s) plus the request "
                         "(%s) fit in the capacity (%s), but not in the %s the heap held plus the %s the device "
                         "had free; memory outside the heap (other processes, other allocators in this one, the "
                         "CUDA context and libraries) held the rest, and no allocator setting can fix that.",
                         H(o->allocated), H(o->rounded), H(o->capacity), H(o->reserved), H(o->device_free));
                lead = "Free what holds the rest of the device; else, in cost order";
                then = "free what holds the rest of the device; else, in cost order";
            }
            /* Unless the fix is written above: the ladder, and what to shrink first — the largest call
             * site at the OOM, where the trace names one; or, where call sites that leak (diagnosis
             * below) held at least the bytes missing, those: fixing the leak makes the room. */
            if (!x->fix[0]) {
                const char *ladder = a->oom_in_opt ? OPTIMIZER_LADDER : LIVE_LADDER;
                char holder[sizeof x->site + 256] = "";
                size_t nl;
                site_t *lv = collect_sites(a, sym, VIEW_OOM_DEV, is_leak, &nl);
                uint64_t leaked = 0;
                for (size_t i = 0; i < nl; i++)
                    leaked += lv[i].bytes;
                if (nl && leaked >= over) {
                    nl = label_sites(lv, nl, 8);
                    snprintf(x->site, sizeof x->site, "%s", lv[0].label);
                    if (nl == 1)
                        snprintf(holder, sizeof holder,
                                 "Fix the leak first (free): call site %s, which leaks, held %s "
                                 "at the OOM, more than the %s missing.",
                                 lv[0].label, H(leaked), H(over));
                    else
                        snprintf(holder, sizeof holder,
                                 "Fix the leaks first (free): the %zu call sites that leak held "
                                 "%s at the OOM, more than the %s missing.",
                                 nl, H(leaked), H(over));
                    snprintf(x->fix, sizeof x->fix, "%s Then, if still needed, %s: %s.", holder, then, ladder);
                    x->follows = "leak";
                } else {
                    if (ns) {
                        snprintf(pct, sizeof pct, "%.1f%%",
                                 o->allocated ? 100.0 * (double)v[0].bytes / (double)o->allocated : 0);
                        snprintf(x->site, sizeof x->site, "%s", v[0].label);
                        snprintf(holder, sizeof holder,
                                 ": call site %s held %s at the OOM (%s of the live bytes, %" PRIu64 " blocks)",
                                 v[0].label, H(v[0].bytes), pct, v[0].count);
                    }
                    snprintf(x->fix, sizeof x->fix, "%s: %s. Live memory must shrink by %s%s.", lead, ladder,
                             H(over), holder);
                    if (a->oom_in_opt)
                        x->follows = "optimizer-step";
                }
                free(lv);
                x->saving = over;
            }
        }
        free(v);
    }
    /* 2. Leaks. */
    {
        size_t ns;
        site_t *v = collect_sites(a, sym, VIEW_END, is_leak, &ns);
        /* Not merged: each leak's growth and holdings are its own stack's. */
        label_each(v, ns);
        for (size_t i = 0; i < ns && nd < maxd; i++) {
            const av_leak_t *l = use_step_leaks(a) ? &a->st[v[i].first_stack].lk_step : &a->st[v[i].first_stack].lk_win;
            uint64_t atpeak = 0;
            for (size_t id = 0; id < a->nst; id++)
                if (is_leak(a, (uint32_t)id)) {
                    const char *f[32];
                    size_t nf = sym_stack(sym, (uint32_t)id, f, 32);
                    if (same_frames(&v[i], f, nf))
                        atpeak += av_peak_bytes(a, &a->st[id]);
                }
            diag_t *x = diag_add(d, &nd, "leak", v[i].label);
            snprintf(x->text, sizeof x->text,
                     "Leak: call site %s grew from %s to %s over %u %s (+%s per %s on average) and never gave it "
                     "back; it holds %s in %" PRIu64 " blocks at the end, %s at the peak.",
                     v[i].label, H(l->first_v), H(l->last_v), l->n - 1, use_step_leaks(a) ? "steps" : "time windows",
                     H((l->last_v - l->first_v) / (l->n - 1)), use_step_leaks(a) ? "step" : "window", H(v[i].bytes),
                     v[i].count, H(atpeak));
            snprintf(x->fix, sizeof x->fix,
                     "Fix (free, before any rung of the ladder): drop the reference that keeps these blocks alive "
                     "from step to step (e.g. accumulate loss.item() rather than loss, detach() what is logged, "
                     "clear lists of tensors); empty_cache() does not help. Saves the %s this site held at the "
                     "peak.",
                     H(atpeak));
            x->saving = atpeak;
        }
        free(v);
    }
    /* Steps: every one of them (a long run has thousands), the peak of each in `peaks`. */
    uint64_t *peaks = xmalloc((a->nsegs ? a->nsegs : 1) * sizeof *peaks);
    size_t np = 0;
    const av_seg_t *best = NULL, *second = NULL;
    uint64_t max_step = 0;
    for (size_t i = 0; i < a->nsegs; i++) {
        const av_seg_t *g = &a->segs[i];
        if (g->kind != AV_SEG_STEP || !g->num_allocs)
            continue;
        peaks[np++] = g->peak_alloc;
        if (!best || g->peak_alloc > best->peak_alloc) {
            second = best;
            best = g;
        } else if (!second || g->peak_alloc > second->peak_alloc) {
            second = g;
        }
        if (g->peak_alloc > max_step)
            max_step = g->peak_alloc;
    }
    /* 3. The step-2 jump: a class of allocations first made after step 1's peak, still live at the
     * (later) peak, accounts for most of the rise over step 1's peak. Or, where the job ran out of
     * memory in the step after step 1 for want of room (not by fragmentation: there the room was
     * there), the same at the OOM: what step 2 needed then, its live blocks and the request, over
     * step 1's peak (step 2's OOM may come before its own peak could rise above step 1's). */
    step1_seg = first_step(a);
    uint32_t s1 = step1_seg ? (uint32_t)(step1_seg - a->segs) : 0;
    const av_oom_t *o1 = a->nooms ? &a->ooms[0] : NULL;
    bool jump_at_peak = step1_seg && np >= 2 && a->peak_seg != s1 &&
                        a->peak_alloc > step1_seg->peak_alloc + step1_seg->peak_alloc / 10;
    bool jump_at_oom = !jump_at_peak && step1_seg && o1 && o1->seg > s1 && a->segs[o1->seg].kind == AV_SEG_STEP &&
                       a->segs[o1->seg].step == step1_seg->step + 1 && oom_kind_of(o1) != OOM_FRAGMENTATION &&
                       o1->rounded <= UINT64_MAX - o1->allocated &&
                       o1->allocated + o1->rounded > step1_seg->peak_alloc;
    if ((jump_at_peak || jump_at_oom) && nd < maxd) {
        size_t ns;
        site_t *v = collect_sites(a, sym, jump_at_peak ? VIEW_PEAK : VIEW_OOM,
                                  jump_at_peak ? is_late_at_peak : is_late_at_oom, &ns);
        uint64_t late = 0;
        for (size_t i = 0; i < ns; i++)
            late += v[i].bytes;
        uint64_t level = jump_at_peak ? a->peak_alloc : o1->allocated + o1->rounded;
        uint64_t rise = level - step1_seg->peak_alloc;
        const char *when = jump_at_peak ? "the peak" : "the OOM";
        if (ns && late * 2 >= rise && late * 20 >= level) {
            ns = label_sites(v, ns, 8);
            diag_t *x = diag_add(d, &nd, "step2-jump", v[0].label);
            char head[512];
            if (jump_at_peak)
                snprintf(head, sizeof head, "%s peaked at %s, the peak (%s) is %s higher in %s", step1_seg->label,
                         H(step1_seg->peak_alloc), H(a->peak_alloc), H(rise), a->segs[a->peak_seg].label);
            else
                snprintf(head, sizeof head,
                         "%s peaked at %s and ran; %s ran out of memory needing %s (its live blocks and the "
                         "request), %s more",
                         step1_seg->label, H(step1_seg->peak_alloc), a->segs[o1->seg].label, H(level), H(rise));
            snprintf(x->text, sizeof x->text,
                     "Step-2 jump: %s. Allocations first made late in %s (once it had begun freeing) and kept held "
                     "%s at %s — largest: %s, %s in %" PRIu64 " block%s (state allocated once, like an "
                     "optimizer's on its first step).",
                     head, step1_seg->label, H(late), when, v[0].label, H(v[0].bytes), v[0].count,
                     v[0].count == 1 ? "" : "s");
            snprintf(x->fix, sizeof x->fix,
                     "Fix: budget for the peak after the first step, not step 1's. In cost order: (1) a smaller "
                     "micro-batch to make room beside that state; (7) an 8-bit or paged optimizer shrinks the "
                     "state, which held %s at %s; (8) ZeRO-1 / FSDP shards it across GPUs.",
                     H(late), when);
            x->saving = late;
        }
        free(v);
    }
    /* 3b. The peak inside the optimizer's step (PyTorch's annotations): what the step allocated
     * for the first time (its state, on the first step, and its temporaries) held at the peak. Or,
     * where the first OOM came inside the optimizer's step for want of room (not by fragmentation)
     * before its allocations could make the peak, the same at the OOM, with the request that failed. */
    bool opt_at_peak = a->peak_in_opt;
    bool opt_at_oom = !opt_at_peak && o1 && a->oom_in_opt && oom_kind_of(o1) != OOM_FRAGMENTATION &&
                      o1->rounded <= UINT64_MAX - o1->allocated;
    if ((opt_at_peak || opt_at_oom) && nd < maxd) {
        size_t ns;
        site_t *v = has_rule(d, nd, "step2-jump") ? NULL
                    : collect_sites(a, sym, opt_at_peak ? VIEW_PEAK : VIEW_OOM,
                                    opt_at_peak ? is_optimizer_new : is_optimizer_new_at_oom, &ns);
        uint64_t made = 0, blocks = 0;
        for (size_t i = 0; v && i < ns; i++) {
            made += v[i].bytes;
            blocks += v[i].count;
        }
        /* At the OOM the step's own failing request counts with what it had made. */
        uint64_t level = opt_at_peak ? a->peak_alloc : o1->allocated + o1->rounded;
        uint64_t stake = opt_at_peak ? made : made + o1->rounded;
        if (v && (ns || opt_at_oom) && stake * 5 >= level) {
            if (ns)
                ns = label_sites(v, ns, 8);
            char from[sizeof d->site] = "";
            if (!opt_at_peak)
                failing_site(sym, o1, from, sizeof from);
            diag_t *x = diag_add(d, &nd, "optimizer-step", opt_at_peak ? v[0].label : from);
            if (opt_at_peak)
                snprintf(x->text, sizeof x->text,
                         "Optimizer step: the peak (%s) lies inside the optimizer's step (%s), whose own first "
                         "allocations hold %s of it (%" PRIu64 " blocks: its state, created on its first step, and "
                         "its temporaries) — largest: %s, %s in %" PRIu64 " block%s.",
                         H(a->peak_alloc), a->peak_opt_name, H(made), blocks, v[0].label, H(v[0].bytes), v[0].count,
                         v[0].count == 1 ? "" : "s");
            else
                snprintf(x->text, sizeof x->text,
                         "Optimizer step: the OOM came inside the optimizer's step (%s), on its request of %s from "
                         "%s; the step's own first allocations held %s of the %s live then (%" PRIu64 " block%s: its "
                         "state, created on its first step, and its temporaries).",
                         a->oom_opt_name, H(o1->rounded), from, H(made), H(o1->allocated), blocks,
                         blocks == 1 ? "" : "s");
            snprintf(x->fix, sizeof x->fix,
                     "Fix: the batch size does not matter here (activations are gone by the optimizer's step); "
                     "parameters, gradients and this state do. In cost order: fused=True or foreach=False makes "
                     "fewer temporaries; (7) an 8-bit or paged optimizer shrinks the state; (8) ZeRO-1 / FSDP "
                     "shards it across GPUs. Up to %s is at stake.",
                     H(stake));
            x->saving = stake;
        }
        free(v);
    }
    /* 4. The longest batch: the peak step lies well above the median step, either as one outlier
     * or as the top of step peaks that rise and fall with the batch's shape (variable sequence
     * lengths). Step peaks that only rise are a trend (a leak, a growing cache), not a shape. */
    if (np >= 4 && best && second && nd < maxd && (uint32_t)(best - a->segs) == a->peak_seg) {
        uint64_t *sorted = xmalloc(np * sizeof *sorted);
        memcpy(sorted, peaks, np * sizeof *peaks);
        qsort(sorted, np, sizeof *sorted, cmp_u64);
        uint64_t med = sorted[np / 2 - (np % 2 == 0)];
        free(sorted);
        uint64_t over = best->peak_alloc - med;
        bool single = second->peak_alloc < med + over / 2;
        /* Falls of more than a twentieth from one step to the next: a quarter of the steps or more
         * is a shape that varies, not one that grows. */
        size_t falls = 0, high = 0;
        for (size_t i = 0; i < np; i++) {
            if (i > 0 && peaks[i] < peaks[i - 1] - peaks[i - 1] / 20)
                falls++;
            if (peaks[i] >= med + over / 2)
                high++;
        }
        bool varying = falls * 4 >= np - 1;
        if (best->peak_alloc > med + med / 5 && !has_rule(d, nd, "leak") && (single || varying)) {
            diag_t *x = diag_add(d, &nd, "longest-batch", NULL);
            if (single)
                snprintf(x->text, sizeof x->text,
                         "Longest batch: %s peaked at %s, %s above the median step's peak (%s over %zu steps); "
                         "the next highest step reached %s. One outlier batch sets the peak.",
                         best->label, H(best->peak_alloc), H(over), H(med), np, H(second->peak_alloc));
            else
                snprintf(x->text, sizeof x->text,
                         "Longest batches: %s peaked at %s, %.1fx the median step's peak (%s over %zu steps); "
                         "%zu step%s reached %s or more, the next highest %s. Step peaks rise and fall with the "
                         "batch's shape: the longest batches set the peak.",
                         best->label, H(best->peak_alloc), (double)best->peak_alloc / (double)(med ? med : 1),
                         H(med), np, high, high == 1 ? "" : "s", H(med + over / 2), H(second->peak_alloc));
            snprintf(x->fix, sizeof x->fix,
                     "Fix (ladder rung 1, for %s): cap the sequence length or bucket / sort by length so "
                     "the longest batch is no larger than typical ones%s. Saves up to %s at the peak.",
                     single ? "that batch" : "those batches",
                     advise_expandable(a, report_device(a)) ? "; expandable_segments:True also helps with the variable shapes" : "",
                     H(over));
            x->saving = over;
        }
    }
    /* 4b. The longest batch at the OOM: after steps that ran, a step runs out of memory for want of
     * room (not by fragmentation) on a request its call site never made so large before (a fifth
     * more than the largest block it had been given): that batch is larger than the ones before
     * it, and its peak, cut short by the OOM, never shows in the step peaks above. */
    if (o1 && nd < maxd && !has_rule(d, nd, "longest-batch") && !has_rule(d, nd, "step2-jump") &&
        !has_rule(d, nd, "optimizer-step") && a->segs[o1->seg].kind == AV_SEG_STEP &&
        oom_kind_of(o1) != OOM_FRAGMENTATION) {
        size_t before = 0;
        for (uint32_t i = 0; i < o1->seg; i++)
            before += a->segs[i].kind == AV_SEG_STEP && a->segs[i].num_allocs;
        /* The call site's stacks: those that name the failing request's frames (the OOM record's
         * own stack may hold frames of the allocator that naming folds away). */
        site_t want;
        memset(&want, 0, sizeof want);
        want.nframes = sym_stack(sym, o1->stack, want.frames, 32);
        uint64_t site_max = 0;
        for (size_t id = 1; o1->stack && id < a->nst; id++) {
            const char *f[32];
            if (a->st[id].oom_max_block > site_max && same_frames(&want, f, sym_stack(sym, (uint32_t)id, f, 32)))
                site_max = a->st[id].oom_max_block;
        }
        if (before >= 2 && site_max && o1->rounded > site_max + site_max / 5) {
            char from[sizeof d->site];
            failing_site(sym, o1, from, sizeof from);
            diag_t *x = diag_add(d, &nd, "longest-batch", from);
            snprintf(x->text, sizeof x->text,
                     "Longest batch: %s ran out of memory on a request of %s from %s, %.1fx the largest block that "
                     "call site had been given in the %zu step%s before (%s). This batch is larger than the ones "
                     "before it; its own peak, cut short by the OOM, is not among the step peaks.",
                     a->segs[o1->seg].label, H(o1->rounded), from,
                     (double)o1->rounded / (double)site_max, before, before == 1 ? "" : "s", H(site_max));
            snprintf(x->fix, sizeof x->fix,
                     "Fix (ladder rung 1, for that batch): cap the sequence length or bucket / sort by length so "
                     "the longest batch is no larger than typical ones, or size the micro-batch for the longest "
                     "one%s.",
                     advise_expandable(a, o1->dev) ? "; expandable_segments:True also helps with the variable shapes" : "");
        }
    }
    /* 5. A phase (evaluation, ...) peaking above training. */
    if (np >= 1) {
        for (size_t i = 0; i < a->nsegs && nd < maxd; i++) {
            const av_seg_t *g = &a->segs[i];
            if (g->kind != AV_SEG_PHASE || g->peak_alloc <= max_step + max_step / 20)
                continue;
            const char *rule = g->with_step ? "phase-or-step" : "phase";
            bool dup = false;
            for (size_t j = 0; j < nd; j++)
                if (strcmp(d[j].rule, rule) == 0 && strstr(d[j].text, g->label))
                    dup = true;
            if (dup)
                continue;
            diag_t *x = diag_add(d, &nd, rule, NULL);
            if (g->with_step) {
                /* The segment holds the phase and step N's training, unseparated by any mark: its
                 * peak is either's, and the trace cannot say which. Nothing is blamed or claimed. */
                char step[32];
                int plen = (int)strlen(g->label) - snprintf(step, sizeof step, " + step %ld", g->step);
                snprintf(x->text, sizeof x->text,
                         "'%s' peaked at %s, %s above the highest training step (%s); it holds phase '%.*s' and "
                         "then step %ld's training, with no mark between them, so the trace cannot tell which of "
                         "the two set that peak.",
                         g->label, H(g->peak_alloc), H(g->peak_alloc - max_step), H(max_step), plen, g->label,
                         g->step);
                snprintf(x->fix, sizeof x->fix,
                         "Fix: mark the return to training when '%.*s' ends (cualloc_mark(\"train\"), "
                         "cualloc_torch.mark(\"train\")) so that the next trace tells them apart; if it is "
                         "'%.*s', run it with a batch no larger than training's and under torch.no_grad().",
                         plen, g->label, plen, g->label);
                continue;
            }
            snprintf(x->text, sizeof x->text,
                     "Phase '%s' peaked at %s, %s above the highest training step (%s).", g->label,
                     H(g->peak_alloc), H(g->peak_alloc - max_step), H(max_step));
            snprintf(x->fix, sizeof x->fix,
                     "Fix: run '%s' with a batch no larger than training's and under torch.no_grad(); move "
                     "outputs to the CPU per batch instead of accumulating them on the GPU. Bringing it to the "
                     "training peak saves %s.",
                     g->label, H(g->peak_alloc - max_step));
            x->saving = g->peak_alloc - max_step;
        }
    }
    free(peaks);
    /* A fix that defers to other diagnoses says they follow only where they were made (a leak's
     * call site may fall past the room for diagnoses; the optimizer's step may have been the
     * step-2 jump's, or too small a share to name). */
    for (size_t i = 0; i < nd; i++) {
        size_t n = 0;
        for (size_t j = i + 1; d[i].follows && j < nd; j++)
            n += strcmp(d[j].rule, d[i].follows) == 0;
        if (!n)
            continue;
        const char *note = strcmp(d[i].follows, "leak") != 0 ? "The optimizer step's diagnosis follows."
                           : n == 1                          ? "The leak's diagnosis follows."
                                                             : "The leaks' diagnoses follow.";
        size_t len = strlen(d[i].fix);
        snprintf(d[i].fix + len, sizeof d[i].fix - len, " %s", note);
    }
    return nd;
}

/* The diagnoses `allocview oom` prints: the OOM's (the first), and those its fix defers to. In
 * place; their number. */
static size_t oom_diags(diag_t *d, size_t nd)
{
    if (!nd || strncmp(d[0].rule, "oom-", 4) != 0)
        return 0;
    size_t n = 1;
    for (size_t i = 1; i < nd; i++)
        if (d[0].follows && strcmp(d[i].rule, d[0].follows) == 0)
            d[n++] = d[i];
    return n;
}

/* ----------------------------------------------------------------------------- sections */

static void ended_text(const av_t *a, char *buf, size_t len)
{
    if (a->status == EXIT_CORRUPT)
        snprintf(buf, len, "corrupt after record #%" PRIu64 " (%s); the report covers the readable prefix",
                 a->last_seq, a->error);
    else if (a->acct.end_seen && a->acct.end_reason == CUA_TRACE_END_STOP)
        snprintf(buf, len, a->nooms ? "clean exit, after %zu OOM%s" : "clean exit", a->nooms,
                 a->nooms == 1 ? "" : "s");
    else if (a->acct.end_seen)
        snprintf(buf, len, "tracing stopped early (%s): later events were not recorded",
                 tr_end_reason_name(a->acct.end_reason));
    else if (a->nooms)
        snprintf(buf, len, "died after an OOM (no end record; the last complete record is #%" PRIu64 ")",
                 a->last_seq);
    else
        snprintf(buf, len, "killed or crashed (no end record; the last complete record is #%" PRIu64 ")",
                 a->last_seq);
}

static const char *ended_key(const av_t *a)
{
    if (a->status == EXIT_CORRUPT)
        return "corrupt";
    if (a->acct.end_seen)
        return a->acct.end_reason == CUA_TRACE_END_STOP ? "clean_exit" : "trace_stopped";
    return a->nooms ? "oom" : "killed";
}

static void config_keys(const av_t *a, const ropts_t *o, char *buf, size_t len)
{
    /* The keys that decide how memory is used; the rest are defaults or tracing options. */
    static const char *const keys[] = {"driver", "expandable_segments", "max_split_size_mb",
                                       "garbage_collection_threshold", "roundup_power2_divisions",
                                       "sim_memory_mb", "va_factor", "chunk_size_mb", "max_memory_mb",
                                       "per_process_memory_fraction"};
    /* Defaults are left out. */
    static const char *const defaults[] = {"", "expandable_segments:True", "max_split_size_mb:unlimited",
                                           "garbage_collection_threshold:0", "roundup_power2_divisions:0", "",
                                           "va_factor:4", "chunk_size_mb:0", "max_memory_mb:0",
                                           "per_process_memory_fraction:0"};
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        size_t n;
        const char *p = config_item(a, keys[i], &n);
        if (!p || (strlen(defaults[i]) == n && strncmp(p, defaults[i], n) == 0))
            continue;
        if (k + n + 3 < len)
            k += (size_t)snprintf(buf + k, len - k, "%s%.*s", k ? "," : "", (int)n, p);
    }
    (void)o;
    if (!k)
        snprintf(buf, len, "%s", a->config[0] ? a->config : "(not recorded)");
}

static void print_sites(FILE *out, const av_t *a, site_t *v, size_t n, int top, uint64_t total)
{
    (void)a;
    n = label_sites(v, n, (size_t)top);
    size_t show = n < (size_t)top ? n : (size_t)top;
    fprintf(out, "  %12s %6s %7s  %s\n", "bytes", "share", "blocks", "call site");
    uint64_t rest = 0, restc = 0;
    bool unrecorded = false;
    for (size_t i = 0; i < n; i++) {
        if (i < show) {
            fprintf(out, "  %12s %5.1f%% %7" PRIu64 "  %s\n", H(v[i].bytes),
                    total ? 100.0 * (double)v[i].bytes / (double)total : 0.0, v[i].count, v[i].label);
            unrecorded |= v[i].first_stack == 0;
        } else {
            rest += v[i].bytes;
            restc++;
        }
    }
    if (restc)
        fprintf(out, "  %12s %5.1f%% %7s  ... %" PRIu64 " more call sites\n", H(rest),
                total ? 100.0 * (double)rest / (double)total : 0.0, "", restc);
    if (!n)
        fprintf(out, "  (no live blocks)\n");
    /* Stack 0 is no call site but blocks the trace has no stack for; a large row of them (a
     * snapshot's blocks from before its history window) reads as a site otherwise. */
    if (unrecorded)
        fprintf(out, "  (stack not recorded: blocks allocated before recording began (a snapshot's blocks older than\n"
                     "   its history, a trace started while the program ran) or recorded with trace_stack_depth:0)\n");
}

static void sites_json(FILE *out, site_t *v, size_t n, int top)
{
    n = label_sites(v, n, (size_t)top);
    size_t show = n < (size_t)top ? n : (size_t)top;
    fprintf(out, "[");
    for (size_t i = 0; i < show; i++) {
        fprintf(out, "%s{\"bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 ", \"site\": ", i ? ", " : "", v[i].bytes,
                v[i].count);
        txt_json_string(out, v[i].label);
        fprintf(out, ", \"frames\": [");
        for (size_t f = 0; f < v[i].nframes; f++) {
            if (f)
                fprintf(out, ", ");
            txt_json_string(out, v[i].frames[f]);
        }
        fprintf(out, "]}");
    }
    fprintf(out, "]");
}

/* A trace with blocks on several devices: which one the report is of, or that it sums them, and
 * every device's own peak. */
static void devices_text(FILE *out, const av_t *a)
{
    char buf[512];
    if (dv_showing(&a->scope, C_B(), C_0(), buf, sizeof buf))
        fprintf(out, "  showing   %s\n", buf);
}

/* A ring trace that lost its oldest events: what the figures printed after it are of. */
static void ring_text(FILE *out, const av_t *a)
{
    if (!tr_info(a->r)->overwritten)
        return;
    /* The blocks and mappings made before the window are never seen: every figure is of the
     * window, and allocated and reserved count only what it made (reserved may read below
     * allocated when the mappings came before it). */
    char from[96] = "the times here count from its first event";
    if (a->have_process && a->clock == CUA_TRACE_CLOCK_MONOTONIC && a->acct.any_event &&
        a->acct.first_time >= a->start_monotonic)
        snprintf(from, sizeof from, "it begins %.3f s after the process started; the times here count from there",
                 (double)(a->acct.first_time - a->start_monotonic) / 1e9);
    fprintf(out,
            "  %swarning%s   " TR_RING_OVERWRITTEN ": the report covers only the newest "
            "events (%s); its peak, call sites, steps and leaks are of that window, and blocks "
            "allocated or memory mapped before it are not counted",
            C_R(), C_0(), from);
    if (a->acct.unmatched_frees)
        fprintf(out, " (%" PRIu64 " frees of blocks it never saw allocated)", a->acct.unmatched_frees);
    fprintf(out, "\n");
}

/* The recorder was refused host memory for some of its tables (LOST records): the call sites and
 * names it could not keep read as "(stack not recorded)" or unnamed frames, which are then not the
 * program's. */
static void lost_text(FILE *out, const av_t *a)
{
    char text[400];
    if (tr_lost_text(&a->acct.lost, &a->acct.first_time, text, sizeof text))
        fprintf(out, "  %swarning%s   %s\n", C_R(), C_0(), text);
}

/* What the figures after it are of: which device, which window of a ring, and whether the
 * recorder lost call sites. The default report's header ends with it; the other commands start
 * with it. */
static void scope_text(FILE *out, const av_t *a)
{
    devices_text(out, a);
    ring_text(out, a);
    lost_text(out, a);
}

static void header_text(FILE *out, const av_t *a, const ropts_t *o)
{
    char buf[2048], ended[768], conf[1024];
    fprintf(out, "%sallocview report%s: %s (%s)\n", C_B(), C_0(), o->redact ? txt_base_name(a->path) : a->path,
            a->recorder[0] ? a->recorder : "recorder unknown");
    fprintf(out, "%sWhat ran%s\n", C_B(), C_0());
    if (a->have_process) {
        if (o->redact)
            redact_paths(a->cmd, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "%s", a->cmd);
        fprintf(out, "  command   %s\n", buf);
        if (a->pid == 0 && !a->host[0])
            fprintf(out, "  process   not recorded (an import)\n"); /* a PyTorch snapshot has neither */
        else {
            if (o->redact)
                fprintf(out, "  process   pid * on *");
            else
                fprintf(out, "  process   pid %" PRIu64 " on %s", a->pid, a->host);
            if (a->rank >= 0)
                fprintf(out, ", rank %" PRId64 "\n", a->rank);
            else
                fprintf(out, ", no rank\n");
        }
    } else {
        fprintf(out, "  command   (not recorded)\n");
    }
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        if (a->have_dev[d])
            fprintf(out, "  device %-2d %s, %s, heap capacity %s, %s\n", d, a->dev_name[d], H(a->dev_total[d]),
                    H(a->dev_capacity[d]), a->dev_mode[d] == CUA_TRACE_MODE_VMM ? "expandable (VMM)" : "classic segments");
    config_keys(a, o, conf, sizeof conf);
    if (o->redact)
        redact_paths(conf, buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "%s", conf);
    fprintf(out, "  config    %s\n", buf);
    fprintf(out, "  duration  %.6f s, %" PRIu64 " allocations, %" PRIu64 " frees, %u mark%s (%u step%s)%s\n",
            a->acct.any_event ? (double)(a->acct.last_time - a->acct.first_time) / 1e9 : 0.0, a->acct.num_allocs,
            a->acct.num_frees, a->nmarks, a->nmarks == 1 ? "" : "s", a->nstep_marks, a->nstep_marks == 1 ? "" : "s",
            a->clock == CUA_TRACE_CLOCK_COUNTER ? " [sim clock]" : "");
    ended_text(a, ended, sizeof ended);
    fprintf(out, "  ended     %s%s%s\n", a->acct.end_seen && a->acct.end_reason == 0 && !a->nooms ? "" : C_R(),
            ended, C_0());
    scope_text(out, a);
    if (a->warning[0] && !o->redact)
        fprintf(out, "  warning   %s\n", a->warning);
}

static void peak_text(FILE *out, const av_t *a, sym_ctx_t *sym, const ropts_t *o, bool at)
{
    if (!a->have_peak) {
        fprintf(out, "%s%s%s\n  %s\n", C_B(), at ? "State" : "Peak", C_0(),
                at ? "the trace never reached that time or mark" : "no allocations in the trace");
        return;
    }
    const av_seg_t *g = &a->segs[a->peak_seg];
    if (at)
        fprintf(out, "%sState at %s%s (%s, in %s)\n", C_B(), o->av.at_mark ? o->av.at_mark : "the given time",
                C_0(), T(a, a->peak_time), g->label);
    else
        fprintf(out, "%sPeak%s at %s, in %s (record #%" PRIu64 ")\n", C_B(), C_0(), T(a, a->peak_time), g->label,
                a->peak_seq);
    fprintf(out, "  allocated %s, requested %s, reserved %s  (highest reserved %s)\n", H(a->peak_alloc),
            H(a->peak_req), H(a->peak_reserved), H(a->acct.reserved_peak));
    size_t n;
    site_t *v = collect_sites(a, sym, VIEW_PEAK, NULL, &n);
    fprintf(out, "  call sites holding memory %s, largest first:\n", at ? "then" : "at the peak");
    print_sites(out, a, v, n, o->top, a->peak_alloc);
    free(v);
}

static void oom_text(FILE *out, const av_t *a, sym_ctx_t *sym, const ropts_t *o)
{
    if (!a->nooms)
        return;
    const av_oom_t *x = &a->ooms[0];
    fprintf(out, "%sOOM%s at %s, in %s, device %u%s\n", C_R(), C_0(), T(a, x->time), a->segs[x->seg].label, x->dev,
            a->nooms > 1 ? " (the first of several)" : "");
    if (a->nooms > 1)
        fprintf(out, "  %zu OOMs in all\n", a->nooms);
    fprintf(out, "  tried to allocate %s (%" PRIu64 " B requested); capacity %s, allocated %s, reserved %s\n",
            H(x->rounded), x->requested, H(x->capacity), H(x->allocated), H(x->reserved));
    fprintf(out, "  reserved but unallocated %s, largest free block %s, device free %s\n",
            H(x->reserved - x->allocated), largest_free_text(a, x), H(x->device_free));
    static char from[SYM_LABEL_FRAMES * 1024 + 64];
    failing_site(sym, x, from, sizeof from);
    fprintf(out, "  failing request from: %s\n", from);
    size_t n;
    site_t *v = collect_sites(a, sym, VIEW_OOM, NULL, &n);
    fprintf(out, "  live at the OOM (%" PRIu64 " blocks), largest first:\n", a->oom_live_count);
    /* Shares of what is listed: the OOM's allocated bytes, or more where other devices' blocks are
     * summed in (--device all). */
    uint64_t listed = 0;
    for (size_t i = 0; i < n; i++)
        listed += v[i].bytes;
    print_sites(out, a, v, n, o->top, listed > x->allocated ? listed : x->allocated);
    free(v);
}

/* The rows of the Steps list: segments with allocations, and those holding the peak or the first
 * OOM even without any. Past STEPS_MAX_ROWS rows, runs of them are elided; the first STEPS_HEAD, the
 * last, the peak's and the first OOM's are always shown, since the report's other sections name
 * them. A run of one row is shown rather than elided: its "... 1 more" line would save nothing. */
#define STEPS_MAX_ROWS 12
#define STEPS_HEAD 10
static bool step_row(const av_t *a, size_t i)
{
    return a->segs[i].num_allocs || (a->nooms && a->ooms[0].seg == (uint32_t)i) ||
           (a->have_peak && a->peak_seg == (uint32_t)i);
}

static void steps_text(FILE *out, const av_t *a)
{
    if (a->nmarks == 0)
        return;
    fprintf(out, "%sSteps and phases%s (peak allocated in each)\n", C_B(), C_0());
    size_t nrows = 0;
    for (size_t i = 0; i < a->nsegs; i++)
        nrows += step_row(a, i);
    size_t row = 0, hidden = 0;
    for (size_t i = 0; i < a->nsegs; i++) {
        const av_seg_t *g = &a->segs[i];
        if (!step_row(a, i))
            continue;
        bool is_peak = a->have_peak && (uint32_t)i == a->peak_seg;
        row++;
        bool keep = nrows <= STEPS_MAX_ROWS || row <= STEPS_HEAD || row == nrows || is_peak ||
                    (a->nooms && a->ooms[0].seg == (uint32_t)i);
        if (!keep) {
            hidden++;
            continue;
        }
        if (hidden == 1) { /* the one row before this one: find it and show it */
            size_t j = i;
            while (!step_row(a, --j))
                ;
            fprintf(out, "  %-20s peak %12s at %s  %6" PRIu64 " allocs\n", a->segs[j].label,
                    H(a->segs[j].peak_alloc), T(a, a->segs[j].peak_time), a->segs[j].num_allocs);
        } else if (hidden) {
            fprintf(out, "  ... %zu more\n", hidden);
        }
        hidden = 0;
        fprintf(out, "  %-20s peak %12s at %s  %6" PRIu64 " allocs%s\n", g->label, H(g->peak_alloc),
                T(a, g->peak_time), g->num_allocs, is_peak ? "  <- the peak" : "");
    }
}

static void diag_text(FILE *out, const diag_t *d, size_t nd)
{
    fprintf(out, "%sDiagnosis%s\n", C_B(), C_0());
    if (!nd)
        fprintf(out, "  nothing to report: no OOM, no leak, no step-2 jump, no outlier step or phase\n");
    for (size_t i = 0; i < nd; i++) {
        fprintf(out, "  %zu. %s%s%s\n", i + 1, C_Y(), d[i].text, C_0());
        fprintf(out, "     %s\n", d[i].fix);
    }
}

static void diag_json(FILE *out, const diag_t *d, size_t nd)
{
    fprintf(out, "[");
    for (size_t i = 0; i < nd; i++) {
        fprintf(out, "%s{\"rule\": \"%s\", \"text\": ", i ? ", " : "", d[i].rule);
        txt_json_string(out, d[i].text);
        fprintf(out, ", \"fix\": ");
        txt_json_string(out, d[i].fix);
        fprintf(out, ", \"saving_bytes\": %" PRIu64 ", \"site\": ", d[i].saving);
        if (d[i].site[0])
            txt_json_string(out, d[i].site);
        else
            fprintf(out, "null");
        fprintf(out, "}");
    }
    fprintf(out, "]");
}

static void process_json(FILE *out, const av_t *a, const ropts_t *o)
{
    char buf[2048];
    fprintf(out, "\"trace\": ");
    txt_json_string(out, o->redact ? txt_base_name(a->path) : a->path);
    fprintf(out, ", \"command\": ");
    if (o->redact)
        redact_paths(a->cmd, buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "%s", a->cmd);
    txt_json_string(out, buf);
    fprintf(out, ", \"rank\": %" PRId64 ", \"ended\": \"%s\", \"duration_ns\": %" PRIu64 ", \"num_ooms\": %zu",
            a->rank, ended_key(a), a->acct.any_event ? a->acct.last_time - a->acct.first_time : 0, a->nooms);
    /* true: a ring trace that lost its oldest events; every figure is of the window that survived */
    fprintf(out, ", \"overwritten\": %s", tr_info(a->r)->overwritten ? "true" : "false");
    /* the recorder's tables refused host memory (LOST records): null, or which and when */
    vw_lost_json(out, &a->acct.lost, a->acct.first_time);
    fprintf(out, ", \"device\": ");
    dv_json(out, &a->scope);
    fprintf(out, ", \"error\": ");
    if (a->status)
        txt_json_string(out, a->error);
    else
        fprintf(out, "null");
}

static void peak_json(FILE *out, const av_t *a, sym_ctx_t *sym, const ropts_t *o)
{
    if (!a->have_peak) {
        fprintf(out, "null");
        return;
    }
    fprintf(out,
            "{\"time_ns\": %" PRIu64 ", \"seq\": %" PRIu64 ", \"in\": ", a->peak_time - a->acct.first_time, a->peak_seq);
    txt_json_string(out, a->segs[a->peak_seg].label);
    fprintf(out, ", \"allocated_bytes\": %" PRIu64 ", \"requested_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64
                 ", \"sites\": ",
            a->peak_alloc, a->peak_req, a->peak_reserved);
    size_t n;
    site_t *v = collect_sites(a, sym, VIEW_PEAK, NULL, &n);
    sites_json(out, v, n, o->top);
    free(v);
    fprintf(out, "}");
}

static void oom_json(FILE *out, const av_t *a, sym_ctx_t *sym, const ropts_t *o)
{
    if (!a->nooms) {
        fprintf(out, "null");
        return;
    }
    const av_oom_t *x = &a->ooms[0];
    fprintf(out,
            "{\"time_ns\": %" PRIu64 ", \"device\": %u, \"in\": ", x->time - a->acct.first_time, x->dev);
    txt_json_string(out, a->segs[x->seg].label);
    fprintf(out,
            ", \"requested_bytes\": %" PRIu64 ", \"rounded_bytes\": %" PRIu64 ", \"capacity_bytes\": %" PRIu64
            ", \"allocated_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64 ", \"largest_free_block\": ",
            x->requested, x->rounded, x->capacity, x->allocated, x->reserved);
    /* null where the trace does not say (a PyTorch snapshot's OOM entry), as the text's "not recorded" */
    if (largest_free_known(a, x))
        fprintf(out, "%" PRIu64, x->largest_free);
    else
        fprintf(out, "null");
    fprintf(out, ", \"device_free_bytes\": %" PRIu64 ", \"count\": %zu, \"failing_site\": [", x->device_free, a->nooms);
    const char *f[32];
    size_t nf = sym_stack(sym, x->stack, f, 32);
    for (size_t i = 0; i < nf; i++) {
        if (i)
            fprintf(out, ", ");
        txt_json_string(out, f[i]);
    }
    fprintf(out, "], \"live_sites\": ");
    size_t n;
    site_t *v = collect_sites(a, sym, VIEW_OOM, NULL, &n);
    sites_json(out, v, n, o->top);
    free(v);
    fprintf(out, "}");
}

/* ------------------------------------------------------------------------------ commands */

/* How many call sites leak: every one, where the diagnosis stops at its array's size. They are
 * counted as diagnose() lists them (stacks naming the same frames are one site, not merged by label). */
static size_t count_leaks(const av_t *a, sym_ctx_t *sym)
{
    size_t n;
    free(collect_sites(a, sym, VIEW_END, is_leak, &n));
    return n;
}

static void report_one(FILE *out, const char *cmd, av_t *a, const ropts_t *o)
{
    sym_ctx_t *sym = sym_new(a->r);
    /* Labels tell a site apart from every call site of the trace, not only from those listed. */
    ref_sites = collect_sites(a, sym, VIEW_EVER, NULL, &nref_sites);
    bool dflt = strcmp(cmd, "report") == 0, leaks = strcmp(cmd, "leaks") == 0;
    /* `leaks` lists every leak (--top of them): room for all of them besides the others. */
    size_t maxd = MAX_DIAGS + (leaks ? count_leaks(a, sym) : 0);
    diag_t *d = diags_new(maxd);
    size_t nd = 0;
    if (dflt || leaks || strcmp(cmd, "oom") == 0)
        nd = diagnose(a, sym, d, maxd);
    if (o->json) {
        fprintf(out, "{\"report\": \"%s\", ", cmd);
        process_json(out, a, o);
        if (dflt || strcmp(cmd, "peak") == 0) {
            fprintf(out, ", \"peak\": ");
            peak_json(out, a, sym, o);
        }
        if (dflt || strcmp(cmd, "oom") == 0) {
            fprintf(out, ", \"oom\": ");
            oom_json(out, a, sym, o);
        }
        if (strcmp(cmd, "oom") == 0) {
            /* What the text prints: the OOM's diagnosis and those its fix defers to ([] without an OOM). */
            fprintf(out, ", \"diagnosis\": ");
            diag_json(out, d, a->nooms ? oom_diags(d, nd) : 0);
        }
        if (strcmp(cmd, "sites") == 0) {
            size_t n;
            site_t *v = collect_sites(a, sym, VIEW_PEAK, NULL, &n);
            fprintf(out, ", \"sites_at_peak\": ");
            sites_json(out, v, n, o->top);
            free(v);
            v = collect_sites(a, sym, VIEW_END, NULL, &n);
            fprintf(out, ", \"sites_at_end\": ");
            sites_json(out, v, n, o->top);
            free(v);
        }
        if (dflt) {
            fprintf(out, ", \"steps\": [");
            const char *sep = "";
            for (size_t i = 0; i < a->nsegs; i++) {
                const av_seg_t *g = &a->segs[i];
                if (!g->num_allocs && g->kind == AV_SEG_START)
                    continue;
                fprintf(out, "%s{\"label\": ", sep);
                txt_json_string(out, g->label);
                fprintf(out, ", \"kind\": \"%s\", \"peak_allocated_bytes\": %" PRIu64 ", \"allocs\": %" PRIu64 "}",
                        g->kind == AV_SEG_STEP ? "step" : g->kind == AV_SEG_PHASE ? "phase" : "start", g->peak_alloc,
                        g->num_allocs);
                sep = ", ";
            }
            fprintf(out, "]");
        }
        if (dflt || strcmp(cmd, "leaks") == 0) {
            fprintf(out, ", \"diagnosis\": ");
            diag_t *l = diags_new(nd ? nd : 1);
            size_t nl = 0;
            /* leaks: the --top largest (by bytes at the end); num_leaks says how many there are */
            for (size_t i = 0; i < nd; i++)
                if (dflt || (strcmp(d[i].rule, "leak") == 0 && nl < (size_t)o->top))
                    l[nl++] = d[i];
            diag_json(out, l, nl);
            free(l);
            if (!dflt)
                fprintf(out, ", \"num_leaks\": %zu", count_leaks(a, sym));
        }
        fprintf(out, "}\n");
        free(ref_sites);
        ref_sites = NULL;
        nref_sites = 0;
        sym_free(sym);
        free(d);
        return;
    }
    if (!dflt)
        scope_text(out, a);
    if (dflt) {
        header_text(out, a, o);
        peak_text(out, a, sym, o, false);
        oom_text(out, a, sym, o);
        steps_text(out, a);
        diag_text(out, d, nd);
        size_t listed = 0, all = count_leaks(a, sym);
        for (size_t i = 0; i < nd; i++)
            listed += strcmp(d[i].rule, "leak") == 0;
        if (all > listed)
            fprintf(out, "  ... %zu more leaking call site%s: allocview leaks --top %zu lists every one\n", all - listed,
                    all - listed == 1 ? "" : "s", all);
    } else if (strcmp(cmd, "peak") == 0) {
        peak_text(out, a, sym, o, o->av.at_mark || o->av.at_time_ns >= 0);
    } else if (strcmp(cmd, "oom") == 0) {
        if (!a->nooms)
            fprintf(out, "no OOM in this trace\n");
        oom_text(out, a, sym, o);
        if (a->nooms)
            diag_text(out, d, oom_diags(d, nd));
    } else if (strcmp(cmd, "sites") == 0) {
        size_t n;
        site_t *v = collect_sites(a, sym, VIEW_PEAK, NULL, &n);
        fprintf(out, "%sCall sites at the peak%s (%s allocated, %s, in %s)\n", C_B(), C_0(), H(a->peak_alloc),
                T(a, a->peak_time), a->have_peak ? a->segs[a->peak_seg].label : "-");
        print_sites(out, a, v, n, o->top, a->peak_alloc);
        free(v);
        v = collect_sites(a, sym, VIEW_END, NULL, &n);
        fprintf(out, "%sCall sites live at the end of the trace%s (%s allocated)\n", C_B(), C_0(),
                H(a->acct.allocated));
        print_sites(out, a, v, n, o->top, a->acct.allocated);
        free(v);
    } else if (strcmp(cmd, "leaks") == 0) {
        size_t nl = 0;
        leak_basis_t basis = leak_basis(a);
        static const char *const basis_said[] = {
            [LEAKS_BY_STEPS] = "judged over step ends",
            [LEAKS_NOT_JUDGED] = "not judged: the trace has fewer than 3 step marks",
            [LEAKS_BY_WINDOWS] = "judged over windows of allocations: the trace has no step marks"};
        fprintf(out, "%sLeaks%s (%s)\n", C_B(), C_0(), basis_said[basis]);
        for (size_t i = 0; i < nd && nl < (size_t)o->top; i++)
            if (strcmp(d[i].rule, "leak") == 0) {
                fprintf(out, "  %zu. %s\n     %s\n", ++nl, d[i].text, d[i].fix);
            }
        size_t all = count_leaks(a, sym);
        if (all > nl)
            fprintf(out, "  ... %zu more leaking call site%s (--top N lists more)\n", all - nl, all - nl == 1 ? "" : "s");
        uint64_t seen = a->win_bounds * a->win_every + a->win_allocs; /* allocations in scope */
        if (nl)
            ; /* listed */
        else if (basis == LEAKS_BY_STEPS)
            fprintf(out, "  none: no call site's live bytes grew step after step without being freed\n");
        else if (basis == LEAKS_NOT_JUDGED)
            fprintf(out, "  none judged: the trace has %u step mark%s, and a leak shows over 3 steps or more.\n",
                    a->step_bounds, a->step_bounds == 1 ? "" : "s");
        else if (a->win_bounds < 3) /* av_leak_growing needs 3 boundaries */
            fprintf(out,
                    "  none found: too few allocations to judge (%" PRIu64 " allocation%s: %u window%s of %" PRIu64
                    "; a leak shows over 3 windows or more).\n"
                    "  Mark the steps (\"step N\", with cualloc_mark or cualloc_torch) to judge leaks step by step.\n",
                    seen, seen == 1 ? "" : "s", a->win_bounds, a->win_bounds == 1 ? "" : "s", a->win_every);
        else
            fprintf(out, "  none: no call site's live bytes grew window after window (%u windows of %" PRIu64
                         " allocations) without being freed\n", a->win_bounds, a->win_every);
    }
    free(ref_sites);
    ref_sites = NULL;
    nref_sites = 0;
    sym_free(sym);
    free(d);
}

static void rank_text(int64_t rank, char *buf, size_t len)
{
    if (rank >= 0)
        snprintf(buf, len, "rank %" PRId64, rank);
    else
        snprintf(buf, len, "no rank");
}

/* Several traces, one per rank: a table, then which rank peaked highest and which failed first. */
static void report_many(FILE *out, av_t **as, size_t n, const ropts_t *o)
{
    /* Times across processes compare on the wall clock where the clock is monotonic. */
    int64_t *fail_at = xmalloc((n ? n : 1) * sizeof *fail_at);
    int first_fail = -1, highest = -1;
    for (size_t i = 0; i < n; i++) {
        const av_t *a = as[i];
        bool failed = a->nooms || (!a->acct.end_seen && a->status == 0);
        uint64_t t = a->nooms ? a->ooms[0].time : a->acct.last_time;
        int64_t wall = a->clock == CUA_TRACE_CLOCK_MONOTONIC
                           ? (int64_t)a->start_realtime + ((int64_t)t - (int64_t)a->start_monotonic)
                           : (int64_t)(t - a->acct.first_time);
        fail_at[i] = failed ? wall : INT64_MAX;
        if (failed && (first_fail < 0 || wall < fail_at[first_fail]))
            first_fail = (int)i;
        if (highest < 0 || a->peak_alloc > as[highest]->peak_alloc)
            highest = (int)i;
    }
    if (o->json) {
        fprintf(out, "{\"report\": \"ranks\", \"ranks\": [");
        for (size_t i = 0; i < n; i++) {
            const av_t *a = as[i];
            fprintf(out, "%s{", i ? ", " : "");
            process_json(out, a, o);
            fprintf(out, ", \"peak_allocated_bytes\": %" PRIu64 ", \"peak_reserved_bytes\": %" PRIu64 ", \"peak_in\": ",
                    a->peak_alloc, a->acct.reserved_peak);
            txt_json_string(out, a->have_peak ? a->segs[a->peak_seg].label : "");
            fprintf(out, "}");
        }
        fprintf(out, "], \"peaked_highest\": %d, \"failed_first\": %d}\n", highest, first_fail);
        free(fail_at);
        return;
    }
    fprintf(out, "%sRanks%s (%zu traces)\n", C_B(), C_0(), n);
    fprintf(out, "  %-5s %-24s %12s %12s %-14s %5s  %s\n", "rank", "trace", "peak alloc", "peak reserv", "peak in",
            "OOMs", "ended");
    for (size_t i = 0; i < n; i++) {
        const av_t *a = as[i];
        char r[24], ended[768]; /* r: any int64 rank */
        if (a->rank >= 0)
            snprintf(r, sizeof r, "%" PRId64, a->rank);
        else
            snprintf(r, sizeof r, "-");
        ended_text(a, ended, sizeof ended);
        char *paren = strstr(ended, " (");
        if (paren)
            *paren = '\0';
        fprintf(out, "  %-5s %-24.24s %12s %12s %-14.14s %5zu  %s\n", r, txt_base_name(a->path), H(a->peak_alloc),
                H(a->acct.reserved_peak), a->have_peak ? a->segs[a->peak_seg].label : "-", a->nooms, ended);
    }
    char rk[40]; /* "rank N", or "no rank" for a trace recorded without RANK / LOCAL_RANK (rank -1) */
    if (highest >= 0) {
        rank_text(as[highest]->rank, rk, sizeof rk);
        fprintf(out, "  highest peak: %s (%s), %s allocated\n", txt_base_name(as[highest]->path), rk,
                H(as[highest]->peak_alloc));
    }
    if (first_fail >= 0) {
        rank_text(as[first_fail]->rank, rk, sizeof rk);
        fprintf(out, "  %sfailed first: %s (%s)%s, %s\n", C_R(), txt_base_name(as[first_fail]->path), rk, C_0(),
                as[first_fail]->nooms ? "OOM" : "no end record");
    } else {
        fprintf(out, "  no rank failed\n");
    }
    fprintf(out, "\n");
    free(fail_at);
}

static void help(const char *cmd, FILE *out)
{
    if (strcmp(cmd, "report") == 0)
        fprintf(out,
                "usage: allocview [report] [--json] [--no-color] [--redact] [--top N] TRACE [TRACE...]\n"
                "  The after-a-crash report: what ran and how it ended, the peak and the call sites holding\n"
                "  memory then, the OOM (what was live, where the failing request came from), the peak of\n"
                "  each step or phase, and a diagnosis (OOM by shortage or fragmentation, leaks, the step-2\n"
                "  jump, the optimizer's step, the longest batch, a phase above training) with the fix to try\n"
                "  first and what the trace says it saves. Several traces (one per rank): a table of ranks\n"
                "  first. --json: \"diagnosis\" entries' \"rule\" is one of oom-fragmentation, oom-shortage, oom-cap,\n"
                "  oom-device-full, oom-chunk-granularity, oom-device-refused, oom-frees-waiting,\n"
                "  oom-driver-error, leak, step2-jump, optimizer-step, longest-batch, phase, phase-or-step.\n");
    else if (strcmp(cmd, "peak") == 0)
        fprintf(out, "usage: allocview peak [--at TIME|MARK] [--json] [--no-color] [--redact] [--top N] TRACE\n"
                     "  The peak of allocated bytes: when, in which step or phase, requested / allocated /\n"
                     "  reserved, and the call sites holding memory then. --at TIME (seconds after the first\n"
                     "  event, e.g. 1.5 or 1.5s) or --at MARK (a mark's label; its first, where several\n"
                     "  have it): the same at that moment.\n");
    else if (strcmp(cmd, "sites") == 0)
        fprintf(out, "usage: allocview sites [--json] [--no-color] [--redact] [--top N] TRACE\n"
                     "  Call sites (whole stacks, allocator and CUDA runtime frames folded) holding memory at\n"
                     "  the peak and at the end of the trace, largest first, with bytes, blocks and share.\n"
                     "  (sites --folded [--device N|all] TRACE: the peak as folded stacks, allocview folded)\n");
    else if (strcmp(cmd, "leaks") == 0)
        fprintf(out, "usage: allocview leaks [--json] [--no-color] [--redact] [--top N] TRACE\n"
                     "  Call sites whose live bytes grew step after step (3 \"step N\" marks or more; with none,\n"
                     "  over windows of allocations) and were never freed; the --top N holding most at the end.\n");
    else if (strcmp(cmd, "oom") == 0)
        fprintf(out, "usage: allocview oom [--json] [--no-color] [--redact] [--top N] TRACE\n"
                     "  The first OOM: the request, the heap's state, where the request came from, what was\n"
                     "  live, and whether it was a genuine shortage or fragmentation, with the first fix.\n");
    fprintf(out, "options: --json one JSON object; --no-color (colour only on a terminal, never with NO_COLOR set);\n"
                 "         --redact hide pids, host and directories (for comparing reports); --top N sites (10);\n"
                 "         --device N|all  one device of a trace with blocks on several (default: the first\n"
                 "         OOM's device, else the one with the highest peak of its own), or all summed\n");
}

bool report_is_command(const char *cmd)
{
    return strcmp(cmd, "report") == 0 || strcmp(cmd, "peak") == 0 || strcmp(cmd, "sites") == 0 ||
           strcmp(cmd, "leaks") == 0 || strcmp(cmd, "oom") == 0;
}

/* peak --at's time: decimal seconds, optionally followed by "s" ("12.5", "3s", "1e3", ".5"); no
 * sign, blank, hex, infinity or NaN. Anything else names a mark. *ns is the decimal's own value in
 * nanoseconds, rounded down, not a double's: 0.000065 s is 65000 ns, where 0.000065 * 1e9 in
 * doubles is 64999.99..., which would leave out the event the report prints at +0.000065 s. Past
 * INT64_MAX ns (292 years) *ns is INT64_MAX, past any trace's end. */
static bool parse_seconds_ns(const char *v, int64_t *ns)
{
    /* The value is m * 10^exp ns, m the first 19 significant digits (below 10^19: no overflow).
     * A fraction digit past them changes the value by less than one unit of m's last digit, so
     * leaving it out keeps the nanoseconds rounded down; an integer digit past them is a power of
     * ten more (and the value is past INT64_MAX ns by then). */
    const char *p = v;
    uint64_t m = 0;
    long exp = 9;
    int digits = 0, kept = 0;
    bool point = false;
    for (;; p++) {
        if (*p == '.' && !point) {
            point = true;
            continue;
        }
        if (*p < '0' || *p > '9')
            break;
        digits++;
        if (kept < 19 && (m || *p != '0')) {
            m = m * 10 + (uint64_t)(*p - '0');
            kept++;
            exp -= point;
        } else if (!m) {
            exp -= point; /* a leading zero: of the fraction, one place more */
        } else if (!point && exp < 1000000) {
            exp++;
        }
    }
    if (!digits)
        return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        bool neg = *p == '-';
        if (*p == '+' || *p == '-')
            p++;
        if (*p < '0' || *p > '9')
            return false;
        long e = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if (e < 1000000)
                e = e * 10 + (*p - '0');
        exp += neg ? -e : e;
    }
    if (!(*p == '\0' || strcmp(p, "s") == 0))
        return false;
    for (; exp < 0 && m; exp++)
        m /= 10;
    for (; exp > 0 && m && m <= (uint64_t)INT64_MAX; exp--)
        m = m > (uint64_t)INT64_MAX / 10 ? (uint64_t)INT64_MAX + 1 : m * 10;
    *ns = m > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)m;
    return true;
}

/* A trace with blocks on several devices (one process driving several GPUs) is analyzed again for
 * the device devices.h picks. Returns the analysis to report. */
static av_t *one_device_of_several(av_t *a, const char *path, const av_opts_t *opts)
{
    dv_scope_t scope = a->scope;
    if (!dv_pick(&scope, a->scope.peak, a->nooms ? &a->ooms[0].dev : NULL))
        return a;
    av_opts_t one = *opts;
    one.scope = scope;
    char err[512];
    av_t *b = av_analyze(path, &one, err, sizeof err);
    if (!b)
        return a; /* the file read a moment ago: keep the summed analysis */
    b->scope = scope; /* the whole trace's peaks, for the showing line */
    av_free(a);
    return b;
}

/* report_main with room for argc traces: paths named, and their analyses. */
static int report_traces(const char *cmd, int argc, char **argv, const char **paths, av_t **as)
{
    ropts_t o;
    memset(&o, 0, sizeof o);
    o.top = 10;
    o.av.at_time_ns = -1;
    bool no_color = getenv("NO_COLOR") != NULL;
    const char *at_arg = NULL; /* peak --at as given, for its error message */
    size_t np = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            help(cmd, stdout);
            return 0;
        } else if (strcmp(s, "--json") == 0) {
            o.json = true;
        } else if (strcmp(s, "--no-color") == 0 || strcmp(s, "--no-colour") == 0) {
            no_color = true;
        } else if (strcmp(s, "--redact") == 0) {
            o.redact = true;
        } else if (strcmp(s, "--verbose") == 0) {
            /* main.c handles it */
        } else if (strcmp(s, "--top") == 0) {
            unsigned long long top;
            if (i + 1 >= argc || !txt_parse_count(argv[i + 1], 1, REPORT_MAX_TOP, &top)) {
                fprintf(stderr, "allocview %s: --top wants a number from 1 to %d\n", cmd, REPORT_MAX_TOP);
                return EXIT_USAGE;
            }
            o.top = (int)top;
            i++;
        } else if (strcmp(s, "--device") == 0) {
            if (!dv_parse(cmd, i + 1 < argc ? argv[i + 1] : NULL, &o.av.scope))
                return EXIT_USAGE;
            i++;
        } else if (strcmp(cmd, "peak") == 0 && strcmp(s, "--at") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "allocview peak: --at needs a time in seconds or a mark's name\n");
                return EXIT_USAGE;
            }
            const char *v = at_arg = argv[++i];
            if (!parse_seconds_ns(v, &o.av.at_time_ns))
                o.av.at_mark = v;
        } else if (s[0] == '-' && s[1]) {
            fprintf(stderr, "allocview %s: unknown option %s (see allocview %s --help)\n", cmd, s, cmd);
            return EXIT_USAGE;
        } else {
            paths[np++] = s;
        }
    }
    if (!np) {
        fprintf(stderr, "allocview %s: which trace? (allocview %s --help)\n", cmd, cmd);
        return EXIT_USAGE;
    }
    if (np > 1 && strcmp(cmd, "report") != 0) {
        fprintf(stderr, "allocview %s: one trace at a time (several: the default report, allocview TRACE...)\n", cmd);
        return EXIT_USAGE;
    }
    color = !no_color && !o.json && isatty(STDOUT_FILENO);
    o.av.progress = isatty(STDERR_FILENO);
    int status = 0;
    size_t na = 0;
    for (size_t i = 0; i < np; i++) {
        char err[512];
        av_t *a = av_analyze(paths[i], &o.av, err, sizeof err);
        if (!a) {
            fprintf(stderr, "allocview: %s: %s\n", paths[i], err);
            status = EXIT_UNREADABLE;
            continue;
        }
        a = one_device_of_several(a, paths[i], &o.av);
        if (a->status == EXIT_CORRUPT) {
            fprintf(stderr, "allocview: %s: corrupt trace: %s; the report covers the readable prefix\n", paths[i],
                    a->error);
            if (status == 0)
                status = EXIT_CORRUPT;
        } else if (a->warning[0] && !o.json) {
            fprintf(stderr, "allocview: %s: %s\n", paths[i], a->warning);
        }
        if (strcmp(cmd, "peak") == 0 && (o.av.at_time_ns >= 0 || o.av.at_mark) && !a->have_peak) {
            /* --at names a moment the trace does not have: say which, and what it has. */
            if (o.av.at_mark)
                fprintf(stderr,
                        "allocview peak: %s: no mark '%s' in the trace (it has %u mark%s; `allocview dump %s | grep "
                        "' mark '` lists them)\n",
                        paths[i], o.av.at_mark, a->nmarks, a->nmarks == 1 ? "" : "s", paths[i]);
            else
                fprintf(stderr, "allocview peak: %s: --at %s is past the trace's end (its events span %.6f s)\n",
                        paths[i], at_arg,
                        a->acct.any_event ? (double)(a->acct.last_time - a->acct.first_time) / 1e9 : 0.0);
            av_free(a);
            status = EXIT_USAGE;
            continue;
        }
        if (strcmp(cmd, "peak") == 0 && o.av.at_mark && a->at_mark_count > 1)
            /* A label written at every step (PyTorch's optimizer annotations, a "train" mark after
             * each evaluation) names several moments: the first is shown, and said to be. */
            fprintf(stderr,
                    "allocview peak: %s: the trace has %u marks '%s'; this is the state at the first (another is "
                    "reached by its time: --at SECONDS after the first event)\n",
                    paths[i], a->at_mark_count, o.av.at_mark);
        as[na++] = a;
    }
    if (na > 1)
        report_many(stdout, as, na, &o);
    for (size_t i = 0; i < na; i++) {
        if (na > 1 && !o.json)
            fprintf(stdout, "%s\n", i ? "" : "");
        report_one(stdout, cmd, as[i], &o);
        av_free(as[i]);
    }
    return status;
}

int report_main(const char *cmd, int argc, char **argv)
{
    /* Every trace named is reported (one per rank: any number of ranks); at most argc of them. */
    size_t room = argc > 0 ? (size_t)argc : 1;
    const char **paths = xmalloc(room * sizeof *paths);
    av_t **as = xmalloc(room * sizeof *as);
    int st = report_traces(cmd, argc, argv, paths, as);
    free(paths);
    free(as);
    return st;
}
