/* timeline.c — `allocview timeline`: live (allocated) and reserved memory over time.
 *
 * Two streaming passes over the trace. The first finds the time range, every call site's largest
 * live bytes (to pick the top K), the marks and the OOMs (the first MAX_MARKS / MAX_OOMS kept),
 * and runs again for one device when the trace has blocks on several (devices.h: the other
 * devices' records then move the clock only, and the OOMs are the device's), and again when
 * several stacks turn out to be one call site (the same label: they differ only where a label
 * does not look), whose largest live bytes are those of its stacks together;
 * the second replays the events into a fixed number of time buckets, each holding the largest
 * live and reserved bytes seen in it and, at the moment of its largest live bytes, the share of
 * each top site. Memory: live blocks, one counter per stack, and the buckets.
 *
 * Text: two sparklines (block characters, or ASCII with --ascii) scaled to the same maximum, and
 * a marker line under them: '^' the peak of live bytes, '!' an OOM, 1-9/a-z the marks ('*' when a
 * column holds several). --svg FILE: a stacked-area chart of live bytes by top site, reserved
 * bytes as a line, marks and OOMs as vertical rules — SVG 1.1, self-contained.
 */
#include "views.h"
#include "grow.h"
#include "xalloc.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_MARKS 256
#define MAX_OOMS 64
#define MAX_TOP 32
#define MAX_WIDTH 4096

typedef struct tl_mark { uint64_t time; char label[96]; } tl_mark_t;
typedef struct tl_oom { uint64_t time, requested; uint32_t dev; } tl_oom_t;

typedef struct bucket {
    uint64_t live, reserved;   /* the largest in the bucket */
    uint64_t site[MAX_TOP + 1];/* at the moment of the largest live bytes; [k] = the rest */
} bucket_t;

typedef struct tl {
    const char *path;
    unsigned width, top;
    bool ascii, color, json;
    const char *svg;
    dv_scope_t scope;          /* which device (devices.h); pass 1 may pick one */
    /* Call sites: stacks with the same key (vw_site_key: they differ only where a label does not
     * look, such as the allocator's frames or the operators of one Python line) are one site, as
     * the report makes them one row; named by its smallest stack id. site_of[id] is stack id's site; NULL while every stack is a site of its
     * own. site_max and top_id are indexed by site. */
    uint32_t *site_of;
    size_t site_of_cap;
    /* pass 1 */
    bool any_event, truncated;
    bool overwritten;          /* a ring that lost its oldest events: the figures are of the window */
    tr_lost_t lost;            /* the recorder's LOST records: the sites may lack frames */
    uint64_t t0, t1;
    uint64_t live_peak, live_peak_time, reserved_peak, reserved_peak_time;
    uint64_t *site_max;
    size_t site_max_cap;
    tl_mark_t marks[MAX_MARKS];
    size_t nmarks, marks_total;
    tl_oom_t ooms[MAX_OOMS];
    size_t nooms, ooms_total;
    /* the top sites */
    uint32_t top_id[MAX_TOP];
    char top_name[MAX_TOP][1024];
    uint64_t top_max[MAX_TOP];
    unsigned ntop;
    bool have_other;
    /* pass 2 */
    bucket_t *b;
} tl_t;

/* ----------------------------------------------------------------------------- formatting */

static const char *fmt_time(uint64_t ns, bool ascii, char *buf, size_t len)
{
    if (ns >= 1000000000ull)
        snprintf(buf, len, "%.3f s", (double)ns / 1e9);
    else if (ns >= 1000000ull)
        snprintf(buf, len, "%.3f ms", (double)ns / 1e6);
    else if (ns >= 1000ull)
        snprintf(buf, len, "%.3f %s", (double)ns / 1e3, ascii ? "us" : "\xc2\xb5s");
    else
        snprintf(buf, len, "%" PRIu64 " ns", ns);
    return buf;
}

static unsigned bucket_of(const tl_t *t, uint64_t time)
{
    if (time <= t->t0)
        return 0;
    double f = (double)(time - t->t0) / (double)(t->t1 - t->t0 + 1);
    unsigned b = (unsigned)(f * t->width);
    return b < t->width ? b : t->width - 1;
}

/* ---------------------------------------------------------------------------------- passes */

/* A pass's live bytes per call site where sites group several stacks (t->site_of): each site's
 * sum, kept up to date from the change of its stacks' own bytes (what each was when last seen). */
typedef struct tl_sites {
    uint64_t *bytes, *stack_bytes; /* per site, per stack id */
    size_t cap, stack_cap;
} tl_sites_t;

/* After vw_replay_add changed stack id's live bytes: its site in *site, and the site's live bytes
 * in *bytes. False when out of memory. */
static bool site_changed(const tl_t *t, tl_sites_t *g, const vw_replay_t *s, uint32_t id, uint32_t *site,
                         uint64_t *bytes)
{
    uint64_t now = s->site_bytes[id];
    *site = t->site_of && id < t->site_of_cap ? t->site_of[id] : id;
    if (!t->site_of) {
        *bytes = now;
        return true;
    }
    uint64_t *sb = av_grow_zeroed(g->stack_bytes, &g->stack_cap, id, sizeof *sb);
    if (!sb)
        return false;
    g->stack_bytes = sb;
    uint64_t *b = av_grow_zeroed(g->bytes, &g->cap, *site, sizeof *b);
    if (!b)
        return false;
    g->bytes = b;
    b[*site] = b[*site] - sb[id] + now; /* (the site's sum holds the stack's old bytes) */
    sb[id] = now;
    *bytes = b[*site];
    return true;
}

static void sites_free(tl_sites_t *g)
{
    free(g->bytes);
    free(g->stack_bytes);
}

/* Pass 1. *again: it picked a device of several (dv_pick), and must run again for it alone. */
static int pass1(tl_t *t, tr_reader_t **rp, bool *again)
{
    *again = false;
    tr_reader_t *r = vw_open(t->path);
    if (!r)
        return VW_EXIT_UNREADABLE;
    t->overwritten = tr_info(r)->overwritten;
    /* What pass 1 finds starts empty: it may run a second time. */
    t->any_event = t->truncated = false;
    t->t0 = t->t1 = 0;
    t->live_peak = t->live_peak_time = t->reserved_peak = t->reserved_peak_time = 0;
    if (t->site_max)
        memset(t->site_max, 0, t->site_max_cap * sizeof *t->site_max);
    t->nmarks = t->marks_total = t->nooms = t->ooms_total = 0;
    t->lost = (tr_lost_t){0};
    vw_replay_t s;
    vw_replay_init(&s);
    tl_sites_t g = {0};
    tr_record_t rec;
    int k;
    bool end = false;
    while ((k = tr_next(r, &rec)) > 0) {
        if (!rec.known || rec.type < CUA_TRACE_FIRST_EVENT)
            continue;
        if (!t->any_event)
            t->t0 = rec.time_ns;
        t->any_event = true;
        t->t1 = rec.time_ns;
        tr_lost_add(&t->lost, &rec);
        if (dv_skips(&t->scope, &rec))
            continue;
        int64_t st = vw_replay_add(&s, &rec);
        if (st >= 0) {
            uint32_t id;
            uint64_t bytes;
            uint64_t *n = site_changed(t, &g, &s, (uint32_t)st, &id, &bytes)
                              ? av_grow_zeroed(t->site_max, &t->site_max_cap, id, sizeof *n)
                              : NULL;
            if (!n) {
                fprintf(stderr, "allocview timeline: out of memory\n");
                break;
            }
            t->site_max = n;
            if (bytes > t->site_max[id])
                t->site_max[id] = bytes;
        }
        if (rec.type == CUA_TRACE_MARK) {
            if (t->nmarks < MAX_MARKS) {
                tl_mark_t *m = &t->marks[t->nmarks++];
                m->time = rec.time_ns;
                size_t n = txt_utf8_cut(rec.u.text.p, rec.u.text.len, sizeof m->label - 1);
                memcpy(m->label, rec.u.text.p, n);
                m->label[n] = '\0';
            }
            t->marks_total++;
        } else if (rec.type == CUA_TRACE_OOM) {
            if (t->nooms < MAX_OOMS)
                t->ooms[t->nooms++] = (tl_oom_t){rec.time_ns, rec.u.oom.requested, rec.dev};
            t->ooms_total++;
        } else if (rec.type == CUA_TRACE_END) {
            end = true;
        }
    }
    t->truncated = !end;
    t->live_peak = s.live_peak;
    t->live_peak_time = s.live_peak_time;
    t->reserved_peak = s.reserved_peak;
    t->reserved_peak_time = s.reserved_peak_time;
    *again = dv_pick(&t->scope, s.dev_peak, s.have_oom ? &s.oom_dev : NULL);
    vw_replay_free(&s);
    sites_free(&g);
    *rp = r;
    return k < 0 ? VW_EXIT_CORRUPT : VW_EXIT_OK;
}

typedef struct tl_key { char *text; uint32_t id; } tl_key_t;

static int key_cmp(const void *a, const void *b)
{
    const tl_key_t *x = a, *y = b;
    int c = strcmp(x->text, y->text);
    return c ? c : x->id < y->id ? -1 : x->id > y->id;
}

/* Finds the stacks of pass 1 (r: the trace read whole, for naming) that are one call site, and
 * sets t->site_of when some are. Returns true when it did: pass 1 must run again, as a site's
 * largest live bytes are its stacks' together, not the largest of any one of them. */
static bool group_sites(tl_t *t, const tr_reader_t *r)
{
    size_t n = 0;
    for (size_t id = 0; id < t->site_max_cap; id++)
        n += t->site_max[id] != 0;
    if (n < 2)
        return false;
    tl_key_t *keys = xcalloc(n, sizeof *keys);
    sym_ctx_t *sym = sym_new(r);
    bool merged = false;
    size_t m = 0;
    static char buf[65536];
    static vw_site_frames_t f;
    for (size_t id = 0; id < t->site_max_cap; id++) {
        if (!t->site_max[id])
            continue;
        vw_site_frames(sym, (uint32_t)id, &f);
        vw_site_key(&f, buf, sizeof buf);
        keys[m++] = (tl_key_t){xstrdup(buf), (uint32_t)id};
    }
    qsort(keys, m, sizeof *keys, key_cmp);
    for (size_t i = 1; i < m; i++)
        merged |= strcmp(keys[i - 1].text, keys[i].text) == 0;
    if (merged) {
        t->site_of = xcalloc(t->site_max_cap, sizeof *t->site_of);
        t->site_of_cap = t->site_max_cap;
        for (size_t id = 0; id < t->site_of_cap; id++)
            t->site_of[id] = (uint32_t)id;
        /* sorted by text, then id: a run of one text starts with its smallest id */
        for (size_t i = 0, first = 0; i < m; i++) {
            if (strcmp(keys[first].text, keys[i].text) != 0)
                first = i;
            t->site_of[keys[i].id] = keys[first].id;
        }
    }
    for (size_t i = 0; i < m; i++)
        free(keys[i].text);
    free(keys);
    sym_free(sym);
    return merged;
}

static void pick_top(tl_t *t, const tr_reader_t *r)
{
    t->ntop = 0;
    for (size_t id = 0; id < t->site_max_cap; id++) {
        uint64_t v = t->site_max[id];
        if (!v)
            continue;
        /* insertion into the sorted top list (largest first, then the smaller id) */
        unsigned pos = t->ntop;
        while (pos > 0 && t->top_max[pos - 1] < v)
            pos--;
        if (pos >= t->top) {
            t->have_other = true;
            continue;
        }
        if (t->ntop == t->top)
            t->have_other = true; /* the last one drops out */
        unsigned last = t->ntop < t->top ? t->ntop : t->top - 1;
        memmove(&t->top_id[pos + 1], &t->top_id[pos], (last - pos) * sizeof t->top_id[0]);
        memmove(&t->top_max[pos + 1], &t->top_max[pos], (last - pos) * sizeof t->top_max[0]);
        t->top_id[pos] = id;
        t->top_max[pos] = v;
        if (t->ntop < t->top)
            t->ntop++;
    }
    /* Named as the report names them: frames down to the one that tells the top sites apart. */
    static vw_site_frames_t f[MAX_TOP];
    sym_ctx_t *sym = sym_new(r);
    for (unsigned i = 0; i < t->ntop; i++)
        vw_site_frames(sym, t->top_id[i], &f[i]);
    for (unsigned i = 0; i < t->ntop; i++)
        vw_site_label(f, t->ntop, i, t->top_name[i], sizeof t->top_name[i]);
    sym_free(sym);
}

static void snapshot(const tl_t *t, const vw_replay_t *s, const tl_sites_t *g, bucket_t *b)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < t->ntop; i++) {
        uint32_t id = t->top_id[i];
        if (t->site_of)
            b->site[i] = id < g->cap ? g->bytes[id] : 0;
        else
            b->site[i] = id < s->site_cap ? s->site_bytes[id] : 0;
        sum += b->site[i];
    }
    b->site[t->ntop] = s->live > sum ? s->live - sum : 0;
}

static int pass2(tl_t *t)
{
    tr_reader_t *r = vw_open(t->path);
    if (!r)
        return VW_EXIT_UNREADABLE;
    vw_replay_t s;
    vw_replay_init(&s);
    tl_sites_t g = {0};
    tr_record_t rec;
    unsigned cur = 0;
    bool started = false;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        if (!rec.known || rec.type < CUA_TRACE_FIRST_EVENT || dv_skips(&t->scope, &rec))
            continue;
        unsigned bi = bucket_of(t, rec.time_ns);
        if (!started || bi != cur) {
            /* Columns without events hold the state as it was; a new column starts from it. */
            for (unsigned i = started ? cur + 1 : 0; i <= bi && i < t->width; i++) {
                t->b[i].live = s.live;
                t->b[i].reserved = s.reserved;
                snapshot(t, &s, &g, &t->b[i]);
            }
            started = true;
            cur = bi;
        }
        int64_t st = vw_replay_add(&s, &rec);
        uint32_t site;
        uint64_t bytes;
        if (st >= 0 && !site_changed(t, &g, &s, (uint32_t)st, &site, &bytes)) {
            fprintf(stderr, "allocview timeline: out of memory\n");
            break;
        }
        bucket_t *b = &t->b[cur];
        if (s.live > b->live) {
            b->live = s.live;
            snapshot(t, &s, &g, b);
        }
        if (s.reserved > b->reserved)
            b->reserved = s.reserved;
    }
    for (unsigned i = started ? cur + 1 : 0; i < t->width; i++) {
        t->b[i].live = s.live;
        t->b[i].reserved = s.reserved;
        snapshot(t, &s, &g, &t->b[i]);
    }
    vw_replay_free(&s);
    sites_free(&g);
    tr_close(r);
    return k < 0 ? VW_EXIT_CORRUPT : VW_EXIT_OK;
}

/* ------------------------------------------------------------------------------------ text */

static const char *const BLOCKS[9] = {" ", "\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83", "\xe2\x96\x84",
                                      "\xe2\x96\x85", "\xe2\x96\x86", "\xe2\x96\x87", "\xe2\x96\x88"};
static const char ASCII_LEVELS[] = " ._-=+*#@";

static unsigned level(uint64_t v, uint64_t scale)
{
    if (!v || !scale)
        return 0;
    unsigned l = (unsigned)(((unsigned __int128)v * 8 + scale - 1) / scale);
    return l < 1 ? 1 : l > 8 ? 8 : l;
}

static void sparkline(const tl_t *t, FILE *out, const char *label, bool live, uint64_t scale, const char *color)
{
    fprintf(out, "%-10s", label);
    if (t->color)
        fputs(color, out);
    for (unsigned i = 0; i < t->width; i++) {
        unsigned l = level(live ? t->b[i].live : t->b[i].reserved, scale);
        if (t->ascii)
            fputc(ASCII_LEVELS[l], out);
        else
            fputs(BLOCKS[l], out);
    }
    if (t->color)
        fputs("\033[0m", out);
    char h[32];
    fprintf(out, "  peak %s\n", txt_human(live ? t->live_peak : t->reserved_peak, h, sizeof h));
}

static char mark_char(size_t i) { return i < 9 ? (char)('1' + i) : i < 35 ? (char)('a' + i - 9) : '+'; }

static void text_report(const tl_t *t, FILE *out)
{
    char a[48], b[48], c[48], d[48];
    uint64_t span = t->t1 - t->t0;
    fprintf(out, "timeline  %s: %s, %u columns of %s\n", t->path, fmt_time(span, t->ascii, a, sizeof a), t->width,
            fmt_time((span + t->width) / t->width, t->ascii, b, sizeof b));
    char showing[512];
    if (dv_showing(&t->scope, t->color ? "\033[1m" : "", t->color ? "\033[0m" : "", showing, sizeof showing))
        fprintf(out, "%-10s%s\n", "showing", showing);
    if (t->overwritten)
        fprintf(out, "%-10s" TR_RING_OVERWRITTEN ": the timeline covers only the newest "
                     "events, and blocks allocated or memory mapped before them are not counted\n", "warning");
    char lost[400];
    if (tr_lost_text(&t->lost, &t->t0, lost, sizeof lost))
        fprintf(out, "%-10s%s\n", "warning", lost);
    uint64_t scale = t->live_peak > t->reserved_peak ? t->live_peak : t->reserved_peak;
    sparkline(t, out, "live", true, scale, "\033[32m");
    sparkline(t, out, "reserved", false, scale, "\033[34m");
    /* The marker line. */
    char *line = xmalloc(t->width + 1);
    memset(line, ' ', t->width);
    line[t->width] = '\0';
    for (size_t i = 0; i < t->nmarks; i++) {
        unsigned x = bucket_of(t, t->marks[i].time);
        line[x] = line[x] == ' ' ? mark_char(i) : '*';
    }
    if (t->live_peak)
        line[bucket_of(t, t->live_peak_time)] = '^';
    for (size_t i = 0; i < t->nooms; i++)
        line[bucket_of(t, t->ooms[i].time)] = '!';
    /* An OOM often comes just after the peak, in its column: the '!' is drawn, and the legend says
     * where the '^' is. */
    bool peak_hidden = t->live_peak && line[bucket_of(t, t->live_peak_time)] != '^';
    size_t end = t->width;
    while (end > 0 && line[end - 1] == ' ')
        end--;
    line[end] = '\0';
    fprintf(out, "%-10s", "");
    for (const char *p = line; *p; p++) {
        if (t->color && (*p == '^' || *p == '!'))
            fprintf(out, "%s%c\033[0m", *p == '!' ? "\033[1;31m" : "\033[1;33m", *p);
        else
            fputc(*p, out);
    }
    fputc('\n', out);
    free(line);
    /* The end under the last column's end; one column still has a blank between "0" and it. */
    fprintf(out, "%-10s%s%*s%s\n", "time", "0", (int)(t->width > 1 ? t->width - 1 : 1), "",
            fmt_time(span, t->ascii, a, sizeof a));
    /* The legend. */
    if (t->live_peak)
        fprintf(out, "^ peak    %s live at %s%s; reserved peak %s at %s\n", txt_human(t->live_peak, a, sizeof a),
                fmt_time(t->live_peak_time - t->t0, t->ascii, b, sizeof b),
                peak_hidden ? " (in the column of the OOM's '!')" : "", txt_human(t->reserved_peak, c, sizeof c),
                fmt_time(t->reserved_peak_time > t->t0 ? t->reserved_peak_time - t->t0 : 0, t->ascii, d, sizeof d));
    for (size_t i = 0; i < t->nooms; i++)
        fprintf(out, "! OOM     at %s: %s requested on device %" PRIu32 "\n",
                fmt_time(t->ooms[i].time - t->t0, t->ascii, a, sizeof a), txt_human(t->ooms[i].requested, b, sizeof b),
                t->ooms[i].dev);
    if (t->ooms_total > t->nooms)
        fprintf(out, "! OOM     ... and %zu more\n", t->ooms_total - t->nooms);
    size_t shown = t->nmarks < 35 ? t->nmarks : 35;
    for (size_t i = 0; i < shown; i++)
        fprintf(out, "%c mark    \"%s\" at %s\n", mark_char(i), t->marks[i].label,
                fmt_time(t->marks[i].time - t->t0, t->ascii, a, sizeof a));
    if (t->marks_total > shown)
        fprintf(out, "+ mark    ... and %zu more marks\n", t->marks_total - shown);
    if (t->ntop) {
        fprintf(out, "top sites (largest live bytes):\n");
        for (unsigned i = 0; i < t->ntop; i++)
            fprintf(out, "  %12s  %s\n", txt_human(t->top_max[i], a, sizeof a), t->top_name[i]);
    }
    if (t->truncated)
        fprintf(out, "(the trace has no end record: it was cut short, or the process died)\n");
}

/* The first time (ns after the first event) that bucket_of puts in column i: its start, exact
 * where a rounded-down span * i / width could name a time the column before holds. */
static uint64_t column_start(const tl_t *t, unsigned i)
{
    if (i == 0)
        return 0;
    uint64_t span = t->t1 - t->t0 + 1;
    uint64_t s = (uint64_t)((double)span * i / t->width);
    while (s < span && bucket_of(t, t->t0 + s) < i)
        s++;
    while (s > 0 && bucket_of(t, t->t0 + s - 1) >= i)
        s--;
    return s;
}

/* Times count from the first event (its clock reading is first_event_ns), as in every other
 * view's --json. */
static void json_report(const tl_t *t, FILE *out)
{
    fprintf(out, "{\"trace\": ");
    txt_json_string(out, t->path);
    fprintf(out, ", \"first_event_ns\": %" PRIu64 ", \"duration_ns\": %" PRIu64 ", \"width\": %u, \"truncated\": %s",
            t->t0, t->t1 - t->t0, t->width, t->truncated ? "true" : "false");
    fprintf(out, ", \"overwritten\": %s", t->overwritten ? "true" : "false");
    vw_lost_json(out, &t->lost, t->t0);
    fprintf(out, ", \"device\": ");
    dv_json(out, &t->scope);
    fprintf(out, ", \"peak_live_bytes\": %" PRIu64 ", \"peak_live_time_ns\": %" PRIu64
                 ", \"peak_reserved_bytes\": %" PRIu64 ", \"peak_reserved_time_ns\": %" PRIu64,
            t->live_peak, t->live_peak_time > t->t0 ? t->live_peak_time - t->t0 : 0, t->reserved_peak,
            t->reserved_peak_time > t->t0 ? t->reserved_peak_time - t->t0 : 0);
    fprintf(out, ", \"sites\": [");
    for (unsigned i = 0; i < t->ntop; i++) {
        fprintf(out, "%s{\"stack\": %" PRIu32 ", \"name\": ", i ? ", " : "", t->top_id[i]);
        txt_json_string(out, t->top_name[i]);
        fprintf(out, ", \"max_live_bytes\": %" PRIu64 "}", t->top_max[i]);
    }
    fprintf(out, "], \"columns\": [");
    for (unsigned i = 0; t->b && i < t->width; i++) {
        fprintf(out, "%s{\"start_ns\": %" PRIu64 ", \"live_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64
                     ", \"sites\": [",
                i ? ", " : "", column_start(t, i), t->b[i].live, t->b[i].reserved);
        for (unsigned j = 0; j <= t->ntop; j++)
            fprintf(out, "%s%" PRIu64, j ? ", " : "", t->b[i].site[j]);
        fprintf(out, "]}");
    }
    fprintf(out, "], \"marks\": [");
    for (size_t i = 0; i < t->nmarks; i++) {
        fprintf(out, "%s{\"time_ns\": %" PRIu64 ", \"label\": ", i ? ", " : "",
                t->marks[i].time > t->t0 ? t->marks[i].time - t->t0 : 0);
        txt_json_string(out, t->marks[i].label);
        fprintf(out, "}");
    }
    fprintf(out, "], \"num_marks\": %zu, \"ooms\": [", t->marks_total);
    for (size_t i = 0; i < t->nooms; i++)
        fprintf(out, "%s{\"time_ns\": %" PRIu64 ", \"requested_bytes\": %" PRIu64 ", \"device\": %" PRIu32 "}",
                i ? ", " : "", t->ooms[i].time > t->t0 ? t->ooms[i].time - t->t0 : 0, t->ooms[i].requested,
                t->ooms[i].dev);
    fprintf(out, "], \"num_ooms\": %zu}\n", t->ooms_total);
}

/* ------------------------------------------------------------------------------------- SVG */

/* XML text: escapes markup, replaces control characters and bytes that are not UTF-8 by '?'. */
static void xml_text(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char ch = *p;
        if (ch < 0x80) {
            if (ch == '&')
                fputs("&amp;", out);
            else if (ch == '<')
                fputs("&lt;", out);
            else if (ch == '>')
                fputs("&gt;", out);
            else if (ch == '"')
                fputs("&quot;", out);
            else if (ch == '\'')
                fputs("&apos;", out);
            else if (ch < 0x20 || ch == 0x7f)
                fputc('?', out);
            else
                fputc(ch, out);
            p++;
            continue;
        }
        size_t n = txt_utf8_char((const char *)p);
        if (n == 0) {
            fputc('?', out);
            p++;
        } else {
            fwrite(p, 1, n, out);
            p += n;
        }
    }
}

/* A "nice" step (1, 2 or 5 times a power of ten) giving about n ticks over range. */
static double nice_step(double range, int n)
{
    if (range <= 0)
        return 1;
    double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* One colour per top site: MAX_TOP of them, none grey ("other" is). */
static const char *const PALETTE[MAX_TOP] = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#86bcb6", "#8cd17d", "#d4a6c8", "#a0cbe8", "#ffbe7d", "#f1ce63", "#499894",
    "#ff9d9a", "#d37295", "#fabfd2", "#d7b5a6", "#b6992d", "#393b79", "#6b6ecf", "#637939",
    "#b5cf6b", "#8c6d31", "#e7ba52", "#843c39", "#d6616b", "#7b4173", "#ce6dbd", "#17becf"};

static int svg_report(const tl_t *t, const char *file)
{
    /* Written beside the destination and renamed at the end (txt_output_path), as import and
     * export write theirs: a failed write leaves no half chart, and an existing file intact. */
    char *tmp = txt_output_path(file);
    bool direct = tmp && strcmp(tmp, file) == 0;
    FILE *out = tmp ? fopen(tmp, direct ? "w" : "wx") : NULL;
    if (!out) {
        fprintf(stderr, "allocview timeline: cannot write %s: %s\n", file, strerror(errno));
        free(tmp);
        return VW_EXIT_UNREADABLE; /* a file that cannot be written, as import and export say */
    }
    if (!direct)
        xalloc_output(tmp); /* removed should host memory run out before the rename */
    const double W = 1000, L = 80, R = 300, T = 50, B = 60;
    const double pw = W - L - R, ph = 520 - T - B;
    /* The legend (reserved, then a row of 16 pixels per layer, from T + 20) may run past the
     * plot's 520 pixels with many top sites: the chart grows to hold it. */
    unsigned nlayers = t->ntop + (t->have_other ? 1 : 0);
    const double H = T + 20 + 16.0 * nlayers + 10 > 520 ? T + 20 + 16.0 * nlayers + 10 : 520;
    uint64_t maxv = t->live_peak > t->reserved_peak ? t->live_peak : t->reserved_peak;
    if (!maxv)
        maxv = 1;
    /* y unit */
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    double div = 1;
    while (u < 4 && (double)maxv / div >= 1024) {
        div *= 1024;
        u++;
    }
    double ystep = nice_step((double)maxv / div, 5);
    double ymax = ceil((double)maxv / div / ystep) * ystep;
    if (ymax <= 0)
        ymax = 1;
#define Y(v) (T + ph - ph * ((double)(v) / div) / ymax)
#define X(i) (L + pw * (double)(i) / t->width)
    uint64_t span = t->t1 - t->t0 + 1;
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
                 "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
            W, H, W, H);
    fprintf(out, "<title>allocview timeline: ");
    xml_text(out, t->path);
    fprintf(out, "</title>\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    fprintf(out, "<text x=\"%.1f\" y=\"24\" font-size=\"14\">Memory over time: ", L);
    xml_text(out, t->path);
    if (t->scope.one)
        fprintf(out, ", device %u", t->scope.device);
    fprintf(out, "</text>\n");
    /* Axes and grid. */
    fprintf(out, "<g class=\"axes\" stroke=\"#cccccc\" stroke-width=\"0.5\">\n");
    for (double v = 0; v <= ymax + ystep / 2; v += ystep)
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", L, Y(v * div), L + pw, Y(v * div));
    fprintf(out, "</g>\n<g class=\"labels\" fill=\"#333333\">\n");
    for (double v = 0; v <= ymax + ystep / 2; v += ystep)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n", L - 6, Y(v * div) + 4, v,
                units[u]);
    /* time axis, relative to the first event */
    double tdiv = span >= 1000000000ull ? 1e9 : span >= 1000000ull ? 1e6 : span >= 1000ull ? 1e3 : 1;
    const char *tunit = tdiv == 1e9 ? "s" : tdiv == 1e6 ? "ms" : tdiv == 1e3 ? "\xc2\xb5s" : "ns";
    double tstep = nice_step((double)span / tdiv, 8);
    for (double v = 0; v * tdiv <= (double)span; v += tstep) {
        double x = L + pw * v * tdiv / (double)span;
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g %s</text>\n", x, T + ph + 16, v, tunit);
    }
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time since the first event</text>\n",
            L + pw / 2, T + ph + 36);
    fprintf(out, "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 14 %.1f)\">"
                 "memory (%s)</text>\n</g>\n",
            T + ph / 2, T + ph / 2, units[u]);
    /* Stacked areas: one path per top site, then the rest. */
    uint64_t *base = xcalloc(t->width, sizeof *base);
    fprintf(out, "<g class=\"sites\">\n");
    for (unsigned l = 0; l < nlayers; l++) {
        unsigned slot = l < t->ntop ? l : t->ntop;
        const char *color = l < t->ntop ? PALETTE[l] : "#bab0ac";
        fprintf(out, "<path class=\"area\" fill=\"%s\" fill-opacity=\"0.85\" stroke=\"none\" d=\"", color);
        for (unsigned i = 0; i < t->width; i++) {
            double y = Y(base[i] + t->b[i].site[slot]);
            fprintf(out, "%s%.1f %.1f L%.1f %.1f ", i ? "L" : "M", X(i), y, X(i + 1), y);
        }
        for (unsigned i = t->width; i-- > 0;) {
            double y = Y(base[i]);
            fprintf(out, "L%.1f %.1f L%.1f %.1f ", X(i + 1), y, X(i), y);
            base[i] += t->b[i].site[slot];
        }
        fprintf(out, "Z\"><title>");
        xml_text(out, l < t->ntop ? t->top_name[l] : "other");
        fprintf(out, "</title></path>\n");
    }
    fprintf(out, "</g>\n");
    free(base);
    /* Reserved memory as a line. */
    fprintf(out, "<path class=\"reserved\" fill=\"none\" stroke=\"#222222\" stroke-width=\"1.5\" d=\"");
    for (unsigned i = 0; i < t->width; i++) {
        double y = Y(t->b[i].reserved);
        fprintf(out, "%s%.1f %.1f L%.1f %.1f ", i ? "L" : "M", X(i), y, X(i + 1), y);
    }
    fprintf(out, "\"><title>reserved</title></path>\n");
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333333\"/>\n", L, T + ph, L + pw,
            T + ph);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333333\"/>\n", L, T, L, T + ph);
    /* Marks, the OOMs, the peak. */
    fprintf(out, "<g class=\"marks\" font-size=\"10\">\n");
    size_t label_every = t->nmarks > 40 ? (t->nmarks + 39) / 40 : 1;
    for (size_t i = 0; i < t->nmarks; i++) {
        double x = L + pw * (double)(t->marks[i].time - t->t0) / (double)span;
        fprintf(out, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#777777\" "
                     "stroke-dasharray=\"3,3\"/>\n",
                x, T, x, T + ph);
        if (i % label_every == 0) {
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" transform=\"rotate(-90 %.1f %.1f)\" fill=\"#555555\">", x - 2,
                    T + 4, x - 2, T + 4);
            xml_text(out, t->marks[i].label);
            fprintf(out, "</text>\n");
        }
    }
    for (size_t i = 0; i < t->nooms; i++) {
        double x = L + pw * (double)(t->ooms[i].time - t->t0) / (double)span;
        char h[32];
        fprintf(out, "<line class=\"oom\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
                     "stroke-width=\"2\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" font-weight=\"bold\">"
                     "OOM (%s)</text>\n",
                x, T, x, T + ph, x + 3, T + 12, txt_human(t->ooms[i].requested, h, sizeof h));
    }
    if (t->live_peak) {
        double x = L + pw * (double)(t->live_peak_time - t->t0) / (double)span;
        char h[32];
        fprintf(out, "<circle class=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#d62728\"/>\n"
                     "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">peak %s</text>\n",
                x, Y(t->live_peak), x + 5, Y(t->live_peak) - 5, txt_human(t->live_peak, h, sizeof h));
    }
    fprintf(out, "</g>\n");
    /* The legend. */
    double lx = L + pw + 16, ly = T;
    fprintf(out, "<g class=\"legend\">\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222222\" "
                 "stroke-width=\"1.5\"/>\n<text x=\"%.1f\" y=\"%.1f\">reserved (peak ",
            lx, ly + 6, lx + 14, ly + 6, lx + 20, ly + 10);
    char h[32];
    fprintf(out, "%s)</text>\n", txt_human(t->reserved_peak, h, sizeof h));
    for (unsigned l = 0; l < nlayers; l++) {
        double y = ly + 20 + 16 * l;
        const char *color = l < t->ntop ? PALETTE[l] : "#bab0ac";
        fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"10\" fill=\"%s\"/>\n<text x=\"%.1f\" "
                     "y=\"%.1f\">",
                lx, y, color, lx + 20, y + 9);
        char name[72];
        const char *full = l < t->ntop ? t->top_name[l] : "other";
        /* Long names lose their middle, on character boundaries: a label names frames down to the
         * one that tells the site from the others shown, so labels that begin alike differ at
         * their end. (The area's title holds the whole name.) */
        size_t n = strlen(full);
        if (n > 48) {
            const char *tail = full + n - 26;
            while ((*tail & 0xc0) == 0x80) /* a continuation byte: start at the next character */
                tail++;
            snprintf(name, sizeof name, "%.*s...%s", (int)txt_utf8_cut(full, n, 19), full, tail);
        } else {
            memcpy(name, full, n + 1); /* (n <= 48 < sizeof name) */
        }
        xml_text(out, name);
        fprintf(out, "</text>\n");
    }
    fprintf(out, "</g>\n</svg>\n");
#undef X
#undef Y
    bool ok = !ferror(out);
    ok = fclose(out) == 0 && ok;
    if (!ok)
        fprintf(stderr, "allocview timeline: writing %s failed\n", file);
    char why[256];
    if (!txt_output_end(file, tmp, ok, why, sizeof why) && ok) {
        fprintf(stderr, "allocview timeline: %s: %s\n", file, why);
        ok = false;
    }
    return ok ? VW_EXIT_OK : VW_EXIT_UNREADABLE;
}

/* ---------------------------------------------------------------------------------- command */

static void timeline_usage(FILE *out)
{
    fprintf(out,
            "usage: allocview timeline [--width N] [--top K] [--ascii] [--no-color] [--json] [--svg FILE]\n"
            "                          [--device N|all] TRACE\n"
            "  live (allocated) and reserved memory over time, in N columns (default 72):\n"
            "  sparklines of block characters (--ascii: \" ._-=+*#@\"), scaled to the same maximum, and\n"
            "  under them '^' the peak of live memory, '!' an OOM, 1-9 a-z the marks ('*' several).\n"
            "  Colour only on a terminal (--no-color, or NO_COLOR set, turns it off).\n"
            "  --top K     the K call sites with the most live memory (default 8, at most %d)\n"
            "  --svg FILE  also write a stacked-area chart (SVG 1.1) of live memory by top site, the rest\n"
            "              as \"other\", reserved memory as a line, marks and OOMs as vertical rules\n"
            "  --json      the columns, peaks, marks, OOMs and top sites as one JSON object\n"
            "  --device N|all  one device of a trace with blocks on several (default: the first OOM's\n"
            "              device, else the one with the highest peak of its own), or all summed; a\n"
            "              'showing' line (--json: \"device\") says which\n",
            MAX_TOP);
}

int av_cmd_timeline(int argc, char **argv)
{
    tl_t *t = xcalloc(1, sizeof *t);
    t->width = 72;
    t->top = 8;
    bool no_color = false;
    int status = VW_EXIT_OK;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            timeline_usage(stdout);
            free(t);
            return 0;
        } else if (strcmp(a, "--width") == 0 || strcmp(a, "--top") == 0) {
            unsigned long long v;
            bool width = strcmp(a, "--width") == 0;
            if (i + 1 >= argc || !txt_parse_count(argv[i + 1], 1, width ? MAX_WIDTH : MAX_TOP, &v)) {
                fprintf(stderr, "allocview timeline: %s wants a number from 1 to %d\n", a, width ? MAX_WIDTH : MAX_TOP);
                free(t);
                return VW_EXIT_USAGE;
            }
            if (width)
                t->width = (unsigned)v;
            else
                t->top = (unsigned)v;
            i++;
        } else if (strcmp(a, "--svg") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "allocview timeline: --svg wants a file name\n");
                free(t);
                return VW_EXIT_USAGE;
            }
            t->svg = argv[++i];
        } else if (strcmp(a, "--device") == 0) {
            if (!dv_parse("timeline", i + 1 < argc ? argv[i + 1] : NULL, &t->scope)) {
                free(t);
                return VW_EXIT_USAGE;
            }
            i++;
        } else if (strcmp(a, "--ascii") == 0) {
            t->ascii = true;
        } else if (strcmp(a, "--no-color") == 0 || strcmp(a, "--no-colour") == 0) {
            no_color = true;
        } else if (strcmp(a, "--json") == 0) {
            t->json = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "allocview timeline: unknown option %s (see allocview timeline --help)\n", a);
            free(t);
            return VW_EXIT_USAGE;
        } else if (!t->path) {
            t->path = a;
        } else {
            fprintf(stderr, "allocview timeline: one trace file at a time (got %s and %s)\n", t->path, a);
            free(t);
            return VW_EXIT_USAGE;
        }
    }
    if (!t->path) {
        timeline_usage(stderr);
        free(t);
        return VW_EXIT_USAGE;
    }
    /* Refused before the trace is read: the chart renamed into place would replace the trace it
     * is drawn from. */
    if (t->svg && txt_same_file(t->svg, t->path)) {
        fprintf(stderr, "allocview timeline: --svg %s is the trace itself; name another file for the chart\n", t->svg);
        free(t);
        return VW_EXIT_USAGE;
    }
    const char *term = getenv("TERM");
    t->color = !no_color && !t->json && isatty(STDOUT_FILENO) && !getenv("NO_COLOR") && !(term && strcmp(term, "dumb") == 0);

    tr_reader_t *r = NULL;
    bool again;
    status = pass1(t, &r, &again);
    if (r && again) {
        tr_close(r);
        r = NULL;
        status = pass1(t, &r, &again);
    }
    if (r && group_sites(t, r)) {
        tr_close(r);
        r = NULL;
        status = pass1(t, &r, &again);
    }
    if (!r) {
        free(t->site_of);
        free(t->site_max);
        free(t);
        return status;
    }
    pick_top(t, r);
    int k = status == VW_EXIT_CORRUPT ? -1 : 0;
    /* The columns: empty (nothing live, nothing reserved) when the trace holds no event, so that
     * --json has its `width` columns and --svg writes the file asked for, an empty chart. */
    t->b = xcalloc(t->width, sizeof *t->b);
    int s2 = t->any_event ? pass2(t) : VW_EXIT_OK;
    if (s2 == VW_EXIT_UNREADABLE)
        status = s2;
    if (status != VW_EXIT_UNREADABLE) {
        if (t->json)
            json_report(t, stdout);
        else if (!t->any_event)
            printf("timeline  %s: no events\n", t->path);
        else
            text_report(t, stdout);
        if (t->svg) {
            int s3 = svg_report(t, t->svg);
            if (s3)
                status = s3;
        }
    }
    fflush(stdout);
    if (status != VW_EXIT_UNREADABLE && status != VW_EXIT_USAGE)
        status = vw_finish("timeline", t->path, r, k);
    tr_close(r);
    free(t->b);
    free(t->site_of);
    free(t->site_max);
    free(t);
    return status;
}
