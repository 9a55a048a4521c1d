/* folded.c — what allocview's time and call-site views share (views.h): the live-state replay,
 * call-site naming, each site's live bytes at the peak; and `allocview folded`, the folded stacks
 * of the peak for flamegraph tools (also what `sites --folded` prints).
 */
#include "views.h"
#include "grow.h"
#include "xalloc.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------------------- helpers */

void vw_lost_json(FILE *out, const tr_lost_t *l, uint64_t t0)
{
    if (!l->tables) {
        fprintf(out, ", \"recorder_lost\": null");
        return;
    }
    fprintf(out, ", \"recorder_lost\": {\"tables\": [");
    for (unsigned t = 0, n = 0; t < 64; t++) {
        if (!(l->tables & (1ull << t)))
            continue;
        char name[32];
        tr_lost_tables_text(1ull << t, name, sizeof name);
        fprintf(out, "%s", n++ ? ", " : "");
        txt_json_string(out, name);
    }
    fprintf(out, "], \"time_ns\": %" PRId64 "}", (int64_t)(l->time - t0)); /* < 0: before a ring's window */
}

tr_reader_t *vw_open(const char *path)
{
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    if (!r)
        fprintf(stderr, "allocview: %s: %s\n", path, err);
    return r;
}

int vw_finish(const char *cmd, const char *path, tr_reader_t *r, int k)
{
    if (k < 0) {
        fprintf(stderr, "allocview %s: %s: corrupt trace: %s; the output covers the records before it\n", cmd, path,
                tr_error(r));
        return VW_EXIT_CORRUPT;
    }
    if (tr_warning(r)[0])
        fprintf(stderr, "allocview %s: %s: %s\n", cmd, path, tr_warning(r));
    return VW_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- replay */

struct vw_live {
    devaddr_entry_t key;
    uint64_t size;
    uint32_t stack;
};

void vw_replay_init(vw_replay_t *s)
{
    memset(s, 0, sizeof *s);
    devaddr_map_init(&s->blocks, sizeof(struct vw_live));
}

void vw_replay_free(vw_replay_t *s)
{
    devaddr_map_free(&s->blocks);
    free(s->site_bytes);
    memset(s, 0, sizeof *s);
}

/* Room in site_bytes for stack (a 32-bit id: the size cannot overflow). */
static void site_room(vw_replay_t *s, uint32_t stack)
{
    s->site_bytes = av_grow_zeroed(s->site_bytes, &s->site_cap, stack, sizeof *s->site_bytes);
}

int64_t vw_replay_add(vw_replay_t *s, const tr_record_t *rec)
{
    if (!rec->known)
        return -1;
    tr_lost_add(&s->lost, rec);
    switch (rec->type) {
    case CUA_TRACE_ALLOC:
    case CUA_TRACE_INIT_BLOCK: {
        if (devaddr_map_find(&s->blocks, rec->dev, rec->addr))
            return -1; /* a double alloc: tr_acct counts it; the first one stays */
        site_room(s, rec->stack);
        struct vw_live *e = devaddr_map_insert(&s->blocks, rec->dev, rec->addr);
        if (!e) /* out of host memory (allocview's lib_oom handler ends the process before this) */
            xalloc_out_of_memory(0);
        e->size = rec->size;
        e->stack = rec->stack;
        s->site_bytes[rec->stack] += rec->size;
        s->live += rec->size;
        uint32_t d = rec->dev < CUA_TRACE_MAX_DEVICES ? rec->dev : 0;
        s->dev_live[d] += rec->size;
        if (s->dev_live[d] > s->dev_peak[d])
            s->dev_peak[d] = s->dev_live[d];
        if (s->live > s->live_peak) {
            s->live_peak = s->live;
            s->live_peak_seq = rec->seq;
            s->live_peak_time = rec->time_ns;
        }
        return rec->stack;
    }
    case CUA_TRACE_FREE: {
        struct vw_live *e = devaddr_map_find(&s->blocks, rec->dev, rec->addr);
        if (!e)
            return -1; /* unmatched (a ring's overwritten start) */
        uint32_t st = e->stack;
        uint64_t sz = e->size;
        uint32_t d = rec->dev < CUA_TRACE_MAX_DEVICES ? rec->dev : 0;
        s->site_bytes[st] -= sz < s->site_bytes[st] ? sz : s->site_bytes[st];
        s->live -= sz < s->live ? sz : s->live;
        s->dev_live[d] -= sz < s->dev_live[d] ? sz : s->dev_live[d];
        devaddr_map_remove(&s->blocks, e);
        return st;
    }
    case CUA_TRACE_MAP:
    case CUA_TRACE_INIT_MAP:
        s->reserved += rec->size;
        if (s->reserved > s->reserved_peak) {
            s->reserved_peak = s->reserved;
            s->reserved_peak_time = rec->time_ns;
        }
        return -1;
    case CUA_TRACE_UNMAP:
        s->reserved -= rec->size < s->reserved ? rec->size : s->reserved;
        return -1;
    case CUA_TRACE_OOM:
        if (!s->have_oom) {
            s->have_oom = true;
            s->oom_dev = rec->dev;
        }
        return -1;
    default:
        return -1;
    }
}

/* ---------------------------------------------------------------------------------- naming */

void vw_site_frames(sym_ctx_t *sym, uint32_t stack, vw_site_frames_t *out)
{
    out->stack = stack;
    out->n = sym ? sym_stack(sym, stack, out->f, VW_SITE_FRAMES) : 0;
    out->nlabel = sym ? sym_stack_label(sym, stack, out->label, VW_SITE_FRAMES) : 0;
}

static bool same_site_frames(const vw_site_frames_t *a, const vw_site_frames_t *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->f[i], b->f[i]) != 0)
            return false;
    return true;
}

void vw_site_label(const vw_site_frames_t *v, size_t n, size_t i, char *buf, size_t len)
{
    size_t need = 1;
    bool twin = false;
    for (size_t j = 0; j < n; j++) {
        if (j == i)
            continue;
        size_t d = sym_label_depth(v[i].label, v[i].nlabel, v[j].label, v[j].nlabel);
        if (d > need)
            need = d;
        twin |= v[i].stack != v[j].stack && same_site_frames(&v[i], &v[j]);
    }
    sym_label(v[i].label, v[i].nlabel, need, v[i].stack != 0, buf, len);
    size_t k = strlen(buf);
    if (twin && k < len)
        snprintf(buf + k, len - k, " [stack %" PRIu32 "]", v[i].stack);
}

void vw_site_key(const vw_site_frames_t *s, char *buf, size_t len)
{
    sym_label(s->label, s->nlabel, SIZE_MAX, s->stack != 0, buf, len);
}

/* flamegraph.pl takes a line's count with (.*)\s+?(\d+(?:\.\d*)?)$ and then, when what is left
 * still ends so, takes that for a first count (a differential line): a leaf label ending in
 * whitespace and a number ("(k 17", a tab before "14") would lose its end and shift the counts.
 * Its whitespace becomes '_'. text[0..n) is the stack, without its count. */
static void folded_guard_end(char *text, size_t n)
{
    size_t j = n;
    while (j > 0 && isdigit((unsigned char)text[j - 1]))
        j--;
    if (j > 0 && text[j - 1] == '.') { /* "12." and "1.5" are numbers to it too */
        size_t d = j - 1;
        while (d > 0 && isdigit((unsigned char)text[d - 1]))
            d--;
        if (d < j - 1)
            j = d;
    }
    if (j < n && j > 0 && isdigit((unsigned char)text[j]) && isspace((unsigned char)text[j - 1]))
        text[j - 1] = '_';
}

size_t vw_site_folded(const vw_site_frames_t *s, char *buf, size_t len)
{
    if (len == 0)
        return 0;
    buf[0] = '\0';
    if (s->n == 0) {
        sym_label(s->f, 0, 1, s->stack != 0, buf, len);
        size_t n = strlen(buf);
        folded_guard_end(buf, n);
        return n;
    }
    size_t o = 0;
    for (size_t i = s->n; i-- > 0;) {
        char name[1024];
        snprintf(name, sizeof name, "%s", s->f[i]);
        for (char *p = name; *p; p++) /* the separators of the folded format */
            if (*p == ';')
                *p = ':';
            else if (*p == '\n' || *p == '\r')
                *p = ' ';
        int k = snprintf(buf + o, len - o, "%s%s", o ? ";" : "", name);
        if (k < 0 || (size_t)k >= len - o) {
            o = len - 1;
            break;
        }
        o += (size_t)k;
    }
    folded_guard_end(buf, o);
    return o;
}

/* ------------------------------------------------------------------------------ peak sites */

/* Replays all of r under scope into s (fresh); *end: an END record was read. Returns tr_next's last. */
static int replay_all(tr_reader_t *r, const dv_scope_t *scope, vw_replay_t *s, bool *end)
{
    tr_record_t rec;
    int k;
    *end = false;
    while ((k = tr_next(r, &rec)) > 0) {
        if (dv_skips(scope, &rec))
            continue;
        vw_replay_add(s, &rec);
        if (rec.known && rec.type == CUA_TRACE_END)
            *end = true;
    }
    return k;
}

int vw_peak_sites(const char *path, dv_scope_t *scope, tr_reader_t **rp, vw_peak_t *p)
{
    memset(p, 0, sizeof *p);
    *rp = NULL;
    tr_reader_t *r = vw_open(path);
    if (!r)
        return VW_EXIT_UNREADABLE;
    vw_replay_t s;
    vw_replay_init(&s);
    bool end;
    int k = replay_all(r, scope, &s, &end);
    if (dv_pick(scope, s.dev_peak, s.have_oom ? &s.oom_dev : NULL)) {
        /* Several devices' blocks: the peak is the device's own, found by reading it alone. (r,
         * which read everything, stays open for naming.) */
        tr_reader_t *one = vw_open(path);
        if (!one) {
            vw_replay_free(&s);
            tr_close(r);
            return VW_EXIT_UNREADABLE;
        }
        vw_replay_free(&s);
        vw_replay_init(&s);
        k = replay_all(one, scope, &s, &end);
        tr_close(one);
    }
    int status = k < 0 ? VW_EXIT_CORRUPT : VW_EXIT_OK;
    p->live_peak = s.live_peak;
    p->reserved_peak = s.reserved_peak;
    p->peak_time = s.live_peak_time;
    p->truncated = !end;
    p->lost = s.lost;
    uint64_t peak_seq = s.live_peak_seq;
    vw_replay_free(&s);
    /* Second pass: up to the record that reached the peak. */
    if (peak_seq) {
        tr_reader_t *r2 = vw_open(path);
        if (!r2) {
            tr_close(r);
            return VW_EXIT_UNREADABLE;
        }
        vw_replay_init(&s);
        tr_record_t rec;
        while (tr_next(r2, &rec) > 0) {
            if (!dv_skips(scope, &rec))
                vw_replay_add(&s, &rec);
            if (rec.seq >= peak_seq)
                break;
        }
        tr_close(r2);
        p->bytes = s.site_bytes;
        p->nstacks = s.site_cap;
        s.site_bytes = NULL;
        vw_replay_free(&s);
    }
    *rp = r;
    return status;
}

void vw_peak_free(vw_peak_t *p)
{
    free(p->bytes);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------------------- folded */

typedef struct fline { char *text; uint64_t bytes; } fline_t;

static int fline_cmp(const void *a, const void *b)
{
    const fline_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->text, y->text);
}

static int fline_text_cmp(const void *a, const void *b)
{
    return strcmp(((const fline_t *)a)->text, ((const fline_t *)b)->text);
}

int vw_write_folded(FILE *out, const char *path, dv_scope_t *scope)
{
    tr_reader_t *r;
    vw_peak_t p;
    int status = vw_peak_sites(path, scope, &r, &p);
    if (!r)
        return status;
    char showing[512];
    if (dv_showing(scope, "", "", showing, sizeof showing))
        fprintf(stderr, "allocview folded: %s: showing %s\n", path, showing);
    if (tr_info(r)->overwritten)
        fprintf(stderr, "allocview folded: %s: warning: " TR_RING_OVERWRITTEN ": the stacks "
                        "are those live at the peak of the newest events; blocks allocated before them are not counted\n",
                path);
    char lost[400];
    if (tr_lost_text(&p.lost, NULL, lost, sizeof lost))
        fprintf(stderr, "allocview folded: %s: warning: %s\n", path, lost);
    fline_t *lines = xcalloc(p.nstacks ? p.nstacks : 1, sizeof *lines);
    size_t n = 0;
    static char buf[65536];
    sym_ctx_t *sym = sym_new(r);
    for (size_t id = 0; id < p.nstacks; id++) {
        if (!p.bytes[id])
            continue;
        vw_site_frames_t f;
        vw_site_frames(sym, id, &f);
        vw_site_folded(&f, buf, sizeof buf);
        lines[n].text = xstrdup(buf);
        lines[n++].bytes = p.bytes[id];
    }
    /* Different stacks can fold to the same line (only the allocator's frames differ): merge
     * equal lines (sorted by text), then order by bytes. */
    qsort(lines, n, sizeof *lines, fline_text_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && strcmp(lines[m - 1].text, lines[i].text) == 0) {
            lines[m - 1].bytes += lines[i].bytes;
            free(lines[i].text);
        } else {
            lines[m++] = lines[i];
        }
    }
    n = m;
    qsort(lines, n, sizeof *lines, fline_cmp);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%s %" PRIu64 "\n", lines[i].text, lines[i].bytes);
    for (size_t i = 0; i < n; i++)
        free(lines[i].text);
    free(lines);
    sym_free(sym);
    int st2 = vw_finish("folded", path, r, status == VW_EXIT_CORRUPT ? -1 : 0);
    vw_peak_free(&p);
    tr_close(r);
    return st2;
}

bool av_wants_folded(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--folded") == 0)
            return true;
    return false;
}

static void folded_usage(FILE *out)
{
    fprintf(out, "usage: allocview folded [--device N|all] TRACE   (also: allocview sites --folded TRACE)\n"
                 "  the live bytes at the allocated peak as folded stacks, one line per call site:\n"
                 "  'frame;frame;frame BYTES', the outermost frame first, the allocator's and the CUDA\n"
                 "  runtime's innermost frames folded away — input for flamegraph.pl, inferno, speedscope.\n"
                 "  --device N|all  one device of a trace with blocks on several (default: the first OOM's\n"
                 "                  device, else the one with the highest peak of its own), or all summed;\n"
                 "                  which one is said on stderr, as the report's 'showing' line\n");
}

int av_cmd_folded(int argc, char **argv)
{
    const char *path = NULL;
    dv_scope_t scope = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            folded_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--folded") == 0) {
            continue; /* sites --folded */
        } else if (strcmp(argv[i], "--no-color") == 0 || strcmp(argv[i], "--no-colour") == 0) {
            continue; /* the other views take it; folded stacks have no colour anyway */
        } else if (strcmp(argv[i], "--device") == 0) {
            if (!dv_parse("folded", i + 1 < argc ? argv[i + 1] : NULL, &scope))
                return VW_EXIT_USAGE;
            i++;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            /* Named as typed: `sites --folded` reaches here with the sites options in mind. */
            bool sites = strcmp(argv[0], "sites") == 0;
            fprintf(stderr, "allocview %s: %s %s (see allocview folded --help)\n", sites ? "sites --folded" : "folded",
                    strcmp(argv[i], "--top") == 0 ? "folded stacks list every call site, so they take no"
                                                  : "unknown option",
                    argv[i]);
            return VW_EXIT_USAGE;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "allocview folded: one trace file at a time\n");
            return VW_EXIT_USAGE;
        }
    }
    if (!path) {
        folded_usage(stderr);
        return VW_EXIT_USAGE;
    }
    return vw_write_folded(stdout, path, &scope);
}
