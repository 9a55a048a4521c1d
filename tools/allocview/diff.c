/* diff.c — `allocview diff A B`: what grew between two traces. Each trace's live bytes at its own
 * allocated peak are taken per call site (vw_peak_sites); sites are matched between the traces by
 * their label at full depth (vw_site_key, of the frames labels show: function and file:line, or
 * module+offset without debug information, and Python function/file/line), never by stack id or
 * address, which differ from run to run; stacks whose labels are the same (they differ only where
 * a label does not look) are one site, as the report makes them one row. Largest growth first;
 * each site labelled as the report labels it. A
 * trace with blocks on several devices is taken for one device, as the reports take it
 * (devices.h): each trace for its own unless --device names one for both.
 */
#include "views.h"
#include "xalloc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A site: its key (the label at full depth), its bytes at each trace's peak, and where its frames
 * come from: the side and stack of its largest stack (part: that stack's bytes), whose frames, root
 * first and separated by ';' (vw_site_folded), are `folded`. */
typedef struct dsite {
    char *key, *folded;
    uint64_t a, b, part;
    int side;
    uint32_t stack;
} dsite_t;

typedef struct side {
    tr_reader_t *r;
    sym_ctx_t *sym;
    vw_peak_t p;
    dv_scope_t scope; /* which device of the trace */
    int status;
} side_t;

static int key_cmp(const void *x, const void *y)
{
    return strcmp(((const dsite_t *)x)->key, ((const dsite_t *)y)->key);
}

static int growth_cmp(const void *x, const void *y)
{
    const dsite_t *p = x, *q = y;
    int64_t gp = (int64_t)(p->b - p->a), gq = (int64_t)(q->b - q->a);
    if (gp != gq)
        return gp > gq ? -1 : 1;
    uint64_t mp = p->a > p->b ? p->a : p->b, mq = q->a > q->b ? q->a : q->b;
    if (mp != mq)
        return mp > mq ? -1 : 1;
    return strcmp(p->key, q->key);
}

/* Appends side's sites (bytes at its peak) to *v, into field a (which = 0) or b (which = 1). */
static void collect(side_t *s, int which, dsite_t **v, size_t *n, size_t *cap)
{
    static char buf[65536];
    static vw_site_frames_t f;
    for (size_t id = 0; id < s->p.nstacks; id++) {
        if (!s->p.bytes[id])
            continue;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            *v = xrealloc(*v, nc * sizeof **v);
            *cap = nc;
        }
        dsite_t *d = &(*v)[*n];
        vw_site_frames(s->sym, id, &f);
        vw_site_folded(&f, buf, sizeof buf);
        d->folded = xstrdup(buf);
        vw_site_key(&f, buf, sizeof buf);
        d->key = xstrdup(buf);
        d->side = which;
        d->stack = id;
        d->a = which == 0 ? s->p.bytes[id] : 0;
        d->b = which == 1 ? s->p.bytes[id] : 0;
        d->part = s->p.bytes[id];
        (*n)++;
    }
}

static void signed_human(int64_t d, char *buf, size_t len)
{
    char h[32];
    uint64_t m = d < 0 ? (uint64_t)0 - (uint64_t)d : (uint64_t)d;
    snprintf(buf, len, "%s%s", d < 0 ? "-" : d > 0 ? "+" : " ", txt_human(m, h, sizeof h));
}

static void diff_usage(FILE *out)
{
    fprintf(out, "usage: allocview diff [--json] [--all] [--device N|all] A B\n"
                 "  what grew from trace A to trace B: each call site's live bytes at its trace's peak of\n"
                 "  allocated memory, A against B, largest growth first; and the two peaks. Sites are\n"
                 "  matched by their labels (function and file:line, or module+offset; Python function and\n"
                 "  line), not by address; stacks whose labels are the same are one site, as in the report.\n"
                 "  Sites that did not change are left out unless --all.\n"
                 "  --device N|all  one device of traces with blocks on several (default: each trace's first\n"
                 "                  OOM's device, else its device with the highest peak of its own), or all\n"
                 "                  summed; a 'showing' line under each trace says which\n");
}

int av_cmd_diff(int argc, char **argv)
{
    const char *pa = NULL, *pb = NULL;
    bool json = false, all = false;
    dv_scope_t scope = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            diff_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--all") == 0) {
            all = true;
        } else if (strcmp(argv[i], "--device") == 0) {
            if (!dv_parse("diff", i + 1 < argc ? argv[i + 1] : NULL, &scope))
                return VW_EXIT_USAGE;
            i++;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "allocview diff: unknown option %s (see allocview diff --help)\n", argv[i]);
            return VW_EXIT_USAGE;
        } else if (!pa) {
            pa = argv[i];
        } else if (!pb) {
            pb = argv[i];
        } else {
            fprintf(stderr, "allocview diff: two traces, A and B\n");
            return VW_EXIT_USAGE;
        }
    }
    if (!pb) {
        diff_usage(stderr);
        return VW_EXIT_USAGE;
    }
    side_t s[2];
    memset(s, 0, sizeof s);
    s[0].scope = s[1].scope = scope;
    s[0].status = vw_peak_sites(pa, &s[0].scope, &s[0].r, &s[0].p);
    if (!s[0].r)
        return s[0].status;
    s[1].status = vw_peak_sites(pb, &s[1].scope, &s[1].r, &s[1].p);
    if (!s[1].r) {
        vw_peak_free(&s[0].p);
        tr_close(s[0].r);
        return s[1].status;
    }
    dsite_t *v = NULL;
    size_t n = 0, cap = 0;
    int status = VW_EXIT_OK;
    s[0].sym = sym_new(s[0].r);
    s[1].sym = sym_new(s[1].r);
    collect(&s[0], 0, &v, &n, &cap);
    collect(&s[1], 1, &v, &n, &cap);
    /* Merge equal keys (the same site in both traces, or stacks with one label). No site at all
     * (a --device without blocks) leaves v NULL, which qsort must not be given. */
    if (n)
        qsort(v, n, sizeof *v, key_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && strcmp(v[m - 1].key, v[i].key) == 0) {
            dsite_t *d = &v[m - 1];
            if (v[i].part > d->part) { /* the largest stack gives the frames */
                char *t = d->folded;
                d->folded = v[i].folded;
                v[i].folded = t;
                d->part = v[i].part;
                d->side = v[i].side;
                d->stack = v[i].stack;
            }
            d->a += v[i].a;
            d->b += v[i].b;
            free(v[i].key);
            free(v[i].folded);
        } else {
            v[m++] = v[i];
        }
    }
    n = m;
    if (n)
        qsort(v, n, sizeof *v, growth_cmp);
    /* The sites listed (changed ones, or all), labelled among themselves. */
    size_t nshown = 0;
    for (size_t i = 0; i < n; i++) {
        if (all || v[i].a != v[i].b) {
            v[nshown++] = v[i];
        } else {
            free(v[i].key);
            free(v[i].folded);
        }
    }
    size_t same = n - nshown;
    n = nshown;
    vw_site_frames_t *frames = xcalloc(n ? n : 1, sizeof *frames);
    char (*names)[1024] = xcalloc(n ? n : 1, sizeof *names);
    for (size_t i = 0; i < n; i++)
        vw_site_frames(s[v[i].side].sym, v[i].stack, &frames[i]);
    for (size_t i = 0; i < n; i++)
        vw_site_label(frames, n, i, names[i], sizeof names[i]);

    char h1[32], h2[32], h3[32];
    if (json) {
        printf("{\"a\": ");
        txt_json_string(stdout, pa);
        printf(", \"b\": ");
        txt_json_string(stdout, pb);
        printf(", \"device\": {\"a\": ");
        dv_json(stdout, &s[0].scope);
        printf(", \"b\": ");
        dv_json(stdout, &s[1].scope);
        printf("}, \"overwritten\": {\"a\": %s, \"b\": %s}", tr_info(s[0].r)->overwritten ? "true" : "false",
               tr_info(s[1].r)->overwritten ? "true" : "false");
        /* the recorder's LOST records, per trace: its call sites may lack frames */
        printf(", \"recorder_lost\": {\"a\": %s, \"b\": %s}", s[0].p.lost.tables ? "true" : "false",
               s[1].p.lost.tables ? "true" : "false");
        printf(", \"peak_live_bytes\": {\"a\": %" PRIu64 ", \"b\": %" PRIu64 ", \"diff\": %" PRId64 "}",
               s[0].p.live_peak, s[1].p.live_peak, (int64_t)(s[1].p.live_peak - s[0].p.live_peak));
        printf(", \"peak_reserved_bytes\": {\"a\": %" PRIu64 ", \"b\": %" PRIu64 ", \"diff\": %" PRId64 "}",
               s[0].p.reserved_peak, s[1].p.reserved_peak, (int64_t)(s[1].p.reserved_peak - s[0].p.reserved_peak));
        printf(", \"sites\": [");
        const char *sep = "";
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"name\": ", sep);
            txt_json_string(stdout, names[i]);
            printf(", \"stack\": ");
            txt_json_string(stdout, v[i].folded);
            printf(", \"a_bytes\": %" PRIu64 ", \"b_bytes\": %" PRIu64 ", \"diff_bytes\": %" PRId64 "}", v[i].a,
                   v[i].b, (int64_t)(v[i].b - v[i].a));
            sep = ", ";
        }
        printf("]}\n");
    } else {
        for (int i = 0; i < 2; i++) {
            char showing[512];
            printf("%s  %s\n", i ? "B" : "A", i ? pb : pa);
            if (dv_showing(&s[i].scope, "", "", showing, sizeof showing))
                printf("   showing   %s\n", showing);
            if (tr_info(s[i].r)->overwritten)
                printf("   warning   " TR_RING_OVERWRITTEN ": its peak and call sites are of "
                       "the newest events, and blocks allocated or memory mapped before them are not counted\n");
            char lost[400];
            if (tr_lost_text(&s[i].p.lost, NULL, lost, sizeof lost))
                printf("   warning   %s\n", lost);
        }
        signed_human((int64_t)(s[1].p.live_peak - s[0].p.live_peak), h3, sizeof h3);
        printf("peak allocated  %s -> %s  (%s)\n", txt_human(s[0].p.live_peak, h1, sizeof h1),
               txt_human(s[1].p.live_peak, h2, sizeof h2), h3);
        signed_human((int64_t)(s[1].p.reserved_peak - s[0].p.reserved_peak), h3, sizeof h3);
        printf("peak reserved   %s -> %s  (%s)\n", txt_human(s[0].p.reserved_peak, h1, sizeof h1),
               txt_human(s[1].p.reserved_peak, h2, sizeof h2), h3);
        printf("live at each trace's peak, by call site (largest growth first):\n");
        printf("  %12s  %12s  %12s  %s\n", "change", "A", "B", "site");
        for (size_t i = 0; i < n; i++) {
            signed_human((int64_t)(v[i].b - v[i].a), h3, sizeof h3);
            printf("  %12s  %12s  %12s  %s%s\n", h3, txt_human(v[i].a, h1, sizeof h1), txt_human(v[i].b, h2, sizeof h2),
                   names[i], !v[i].a ? "  (new in B)" : !v[i].b ? "  (gone in B)" : "");
        }
        if (!n)
            printf("  (no call site changed)\n");
        if (same)
            printf("  %zu site%s unchanged (--all shows them)\n", same, same == 1 ? "" : "s");
        if (s[0].p.truncated || s[1].p.truncated)
            printf("note: %s has no end record (cut short, or the process died)\n",
                   s[0].p.truncated && s[1].p.truncated ? "each trace" : s[0].p.truncated ? "A" : "B");
    }
    fflush(stdout);
    /* v[0..n) own their strings here: the merges and the filter above freed the rest. */
    for (size_t i = 0; i < n; i++) {
        free(v[i].key);
        free(v[i].folded);
    }
    free(v);
    free(frames);
    free(names);
    for (int i = 0; i < 2; i++) {
        int st = vw_finish("diff", i ? pb : pa, s[i].r, s[i].status == VW_EXIT_CORRUPT ? -1 : 0);
        if (st && !status)
            status = st;
        vw_peak_free(&s[i].p);
        sym_free(s[i].sym);
        tr_close(s[i].r);
    }
    return status;
}
