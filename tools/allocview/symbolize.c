/* symbolize.c — see symbolize.h. */
#include "symbolize.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdwfl.h>
#endif

#include "text.h"

#define SYM_INLINE_MAX 16 /* source-level frames kept per native frame */
#define SYM_MAX_FRAMES 512 /* the recorder keeps at most 128 (64 native, 64 Python); imports may hold more */

/* One module file, opened on first use. */
typedef struct sym_mod {
    char *path;
#ifdef HAVE_LIBDW
    Dwfl *dwfl;
    Dwfl_Module *mod;
    GElf_Addr bias;
#endif
    bool tried, usable;
} sym_mod_t;

/* A symbolized frame, cached by (module, offset) or python frame: one text per source-level
 * frame (a native frame inside inlined code is several: the inlined functions, then the one the
 * code was inlined into), innermost first. */
typedef struct sym_ent {
    bool used;
    uint8_t kind;
    uint64_t key; /* module offset (native) or address when no module */
    const char *mod;
    char **text;
    size_t ntext;
    sym_native_t *nf; /* native: the frames behind text (sym_native_frames), ntext of them */
    bool fold;
} sym_ent_t;

struct sym_ctx {
    const tr_reader_t *r;
    sym_mod_t *mods;
    size_t nmods;
    sym_ent_t *ents;
    size_t cap, count;
    /* per stack id (< nstk, grown on demand): its user frames, once computed */
    char ***stk;
    size_t *stkn;
    bool *stkdone;
    size_t nstk;
};

static bool fold_module(const char *path)
{
    const char *b = txt_base_name(path);
    return fnmatch("libcualloc.so*", b, 0) == 0 || fnmatch("libcualloc_torch*", b, 0) == 0 ||
           fnmatch("libcudart*", b, 0) == 0 || fnmatch("libcuda.so*", b, 0) == 0 ||
           fnmatch("libc10_cuda*", b, 0) == 0 || fnmatch("libstubcudart*", b, 0) == 0;
}

static bool fold_function(const char *fn)
{
    return fn && (strncmp(fn, "cudaMalloc", 10) == 0 || strncmp(fn, "cuMemAlloc", 10) == 0 ||
                  strncmp(fn, "cualloc_", 8) == 0);
}

sym_ctx_t *sym_new(const tr_reader_t *r)
{
    sym_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->r = r;
    c->cap = 1024;
    c->ents = calloc(c->cap, sizeof *c->ents);
    if (!c->ents) {
        free(c);
        return NULL;
    }
    return c;
}

/* Room in the per-stack caches for stack `id`. */
static bool stk_room(sym_ctx_t *c, uint32_t id)
{
    if (id < c->nstk)
        return true;
    size_t n = c->nstk ? c->nstk : 64;
    while (n <= id)
        n *= 2;
    char ***stk = realloc(c->stk, n * sizeof *stk);
    if (stk)
        c->stk = stk;
    size_t *stkn = realloc(c->stkn, n * sizeof *stkn);
    if (stkn)
        c->stkn = stkn;
    bool *stkdone = realloc(c->stkdone, n * sizeof *stkdone);
    if (stkdone)
        c->stkdone = stkdone;
    if (!stk || !stkn || !stkdone)
        return false;
    memset(c->stk + c->nstk, 0, (n - c->nstk) * sizeof *stk);
    memset(c->stkn + c->nstk, 0, (n - c->nstk) * sizeof *stkn);
    memset(c->stkdone + c->nstk, 0, (n - c->nstk) * sizeof *stkdone);
    c->nstk = n;
    return true;
}

void sym_free(sym_ctx_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nmods; i++) {
#ifdef HAVE_LIBDW
        if (c->mods[i].dwfl)
            dwfl_end(c->mods[i].dwfl);
#endif
        free(c->mods[i].path);
    }
    free(c->mods);
    for (size_t i = 0; i < c->cap; i++) {
        for (size_t k = 0; k < c->ents[i].ntext; k++)
            free(c->ents[i].text[k]);
        free(c->ents[i].text);
        free(c->ents[i].nf);
    }
    free(c->ents);
    for (size_t i = 0; i < c->nstk; i++)
        free(c->stk[i]);
    free(c->stk);
    free(c->stkn);
    free(c->stkdone);
    free(c);
}

static sym_mod_t *mod_get(sym_ctx_t *c, const char *path)
{
    for (size_t i = 0; i < c->nmods; i++)
        if (strcmp(c->mods[i].path, path) == 0)
            return &c->mods[i];
    c->mods = realloc(c->mods, (c->nmods + 1) * sizeof *c->mods);
    sym_mod_t *m = &c->mods[c->nmods++];
    memset(m, 0, sizeof *m);
    m->path = strdup(path);
    return m;
}

#ifdef HAVE_LIBDW
static char *debuginfo_path = NULL;
static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .debuginfo_path = &debuginfo_path,
};

static void mod_open(sym_ctx_t *c, sym_mod_t *m)
{
    m->tried = true;
    if (m->path[0] != '/')
        return;
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    m->dwfl = dwfl_begin(&callbacks);
    if (!m->dwfl) {
        close(fd);
        return;
    }
    /* Reported at bias 0: lookups use the file's own addresses (the recorded offset). */
    m->mod = dwfl_report_elf(m->dwfl, txt_base_name(m->path), m->path, fd, 0, false);
    dwfl_report_end(m->dwfl, NULL, NULL);
    if (!m->mod)
        return;
    /* The build id must match the recorded one: a rebuilt file would name the wrong code. */
    const unsigned char *want;
    size_t want_len = tr_module_build_id(c->r, m->path, &want);
    if (want_len) {
        const unsigned char *bits;
        GElf_Addr vaddr;
        int n = dwfl_module_build_id(m->mod, &bits, &vaddr);
        if (n <= 0 || (size_t)n != want_len || memcmp(bits, want, want_len) != 0)
            return;
    }
    dwfl_module_info(m->mod, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    Dwarf_Addr bias = 0;
    dwfl_module_getelf(m->mod, &bias);
    m->bias = bias;
    m->usable = true;
}
#endif

#ifdef HAVE_LIBDW
/* The chain of DIEs of functions, inlined instances and blocks around DWARF address pc below
 * `die`, outermost first, into path[depth...]: descends into the child whose ranges hold pc (and
 * into imported units, which link-time optimization emits). Returns the new depth. dwarf_getscopes
 * is not used: it finds nothing in the partial units of LTO builds. */
static int die_path(Dwarf_Die *die, Dwarf_Addr pc, Dwarf_Die *path, int depth, int max)
{
    Dwarf_Die child;
    if (depth >= max || dwarf_child(die, &child) != 0)
        return depth;
    do {
        int tag = dwarf_tag(&child);
        if (tag == DW_TAG_imported_unit) {
            Dwarf_Attribute at;
            Dwarf_Die unit;
            if (dwarf_formref_die(dwarf_attr(&child, DW_AT_import, &at), &unit)) {
                int d = die_path(&unit, pc, path, depth, max);
                if (d > depth)
                    return d;
            }
        } else if ((tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block) &&
                   dwarf_haspc(&child, pc) == 1) {
            path[depth] = child;
            return die_path(&child, pc, path, depth + 1, max);
        } else if (tag == DW_TAG_namespace || tag == DW_TAG_class_type || tag == DW_TAG_structure_type) {
            int d = die_path(&child, pc, path, depth, max);
            if (d > depth)
                return d;
        }
    } while (dwarf_siblingof(&child, &child) == 0);
    return depth;
}

/* The source-level frames at pc (a file address of m): each inlined function around it,
 * innermost first, with its line (the innermost's from the line table, the others' from the call
 * site of the one inlined into them), then the function pc lies in (`symbol`, as the symbol table
 * names it) at the call site of the outermost inlined one. Returns how many (<= max, >= 1). */
static size_t inline_frames(sym_mod_t *m, GElf_Addr pc, const char *symbol, const char *src, int line,
                            sym_native_t *out, size_t max)
{
    size_t n = 0;
    Dwarf_Addr bias = 0;
    Dwarf_Die *cu = dwfl_module_addrdie(m->mod, pc, &bias);
    Dwarf_Die path[64];
    int np = cu ? die_path(cu, pc - bias, path, 0, 64) : 0;
    for (int i = np - 1; i >= 0 && n + 1 < max; i--) {
        if (dwarf_tag(&path[i]) != DW_TAG_inlined_subroutine)
            continue;
        const char *name = dwarf_diename(&path[i]);
        out[n++] = (sym_native_t){.function = name ? name : "??", .file = src, .line = line};
        /* Where it was inlined: the location in the next frame out (call_file indexes the file
         * table of the unit that holds the inlined instance). */
        Dwarf_Attribute at;
        Dwarf_Word w;
        Dwarf_Die unit;
        Dwarf_Files *files;
        size_t nfiles;
        src = NULL;
        line = 0;
        if (dwarf_formudata(dwarf_attr(&path[i], DW_AT_call_line, &at), &w) == 0 && w <= INT32_MAX)
            line = (int)w;
        if (dwarf_formudata(dwarf_attr(&path[i], DW_AT_call_file, &at), &w) == 0 &&
            dwarf_diecu(&path[i], &unit, NULL, NULL) && dwarf_getsrcfiles(&unit, &files, &nfiles) == 0 && w < nfiles)
            src = dwarf_filesrc(files, w, NULL, NULL);
    }
    out[n++] = (sym_native_t){.function = symbol, .file = src, .line = line};
    return n;
}
#endif

/* The source-level frames of the call before return address module+off (sym_native_frames). */
static size_t native_lookup(sym_ctx_t *c, const char *module, uint64_t off, sym_native_t *out, size_t max)
{
    bool fold = module && fold_module(module);
    size_t n = 0;
#ifdef HAVE_LIBDW
    if (module && max > 0) {
        sym_mod_t *m = mod_get(c, module);
        if (!m->tried)
            mod_open(c, m);
        if (m->usable) {
            GElf_Addr pc = off - 1 + m->bias; /* a return address: look up the call */
            const char *fn = dwfl_module_addrname(m->mod, pc);
            int line = 0;
            Dwfl_Line *ln = dwfl_module_getsrc(m->mod, pc);
            const char *src = ln ? dwfl_lineinfo(ln, NULL, &line, NULL, NULL, NULL) : NULL;
            if (!src || line < 0)
                line = 0;
            n = inline_frames(m, pc, fn, src, line, out, max);
        }
    }
#else
    (void)c;
    (void)off;
#endif
    if (n == 0 && max > 0)
        out[n++] = (sym_native_t){0};
    for (size_t i = 0; i < n; i++)
        fold |= fold_function(out[i].function);
    for (size_t i = 0; i < n; i++)
        out[i].fold = fold;
    return n;
}

/* The texts of a native frame (module+off) into e: "fn (file.c:12)" per source-level frame. */
static void fmt_native(sym_ctx_t *c, const char *module, uint64_t off, sym_ent_t *e)
{
    sym_native_t nf[SYM_INLINE_MAX];
    size_t n = native_lookup(c, module, off, nf, SYM_INLINE_MAX);
    e->text = calloc(n, sizeof *e->text);
    e->nf = malloc(n * sizeof *e->nf);
    e->fold = nf[0].fold;
    for (size_t i = 0; e->text && e->nf && i < n; i++) {
        e->nf[i] = nf[i];
        char buf[1024];
        if (nf[i].function && nf[i].file && nf[i].line > 0)
            snprintf(buf, sizeof buf, "%s (%s:%d)", nf[i].function, txt_base_name(nf[i].file), nf[i].line);
        else if (nf[i].function)
            snprintf(buf, sizeof buf, "%s (%s)", nf[i].function, txt_base_name(module));
        else if (module)
            snprintf(buf, sizeof buf, "%s+0x%" PRIx64, txt_base_name(module), off);
        else
            snprintf(buf, sizeof buf, "0x%" PRIx64, off);
        if ((e->text[e->ntext] = strdup(buf)))
            e->ntext++;
    }
}

static sym_ent_t *ent_get(sym_ctx_t *c, const tr_frame_t *f)
{
    bool py = f->kind == CUA_TRACE_FRAME_PYTHON;
    uint64_t key = py ? (uint64_t)(uintptr_t)f->function * 31 + f->line : f->module ? f->module_offset : f->addr;
    const char *modp = py ? f->file : f->module;
    uint64_t h = key * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)modp ^ f->kind;
    if ((c->count + 1) * 2 > c->cap) {
        sym_ent_t *old = c->ents;
        size_t oc = c->cap;
        c->cap *= 2;
        c->ents = calloc(c->cap, sizeof *c->ents);
        c->count = 0;
        for (size_t i = 0; i < oc; i++)
            if (old[i].used) {
                uint64_t hh = old[i].key * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)old[i].mod ^ old[i].kind;
                for (size_t j = hh & (c->cap - 1);; j = (j + 1) & (c->cap - 1))
                    if (!c->ents[j].used) {
                        c->ents[j] = old[i];
                        c->count++;
                        break;
                    }
            }
        free(old);
    }
    for (size_t j = h & (c->cap - 1);; j = (j + 1) & (c->cap - 1)) {
        sym_ent_t *e = &c->ents[j];
        if (!e->used) {
            e->used = true;
            e->kind = f->kind;
            e->key = key;
            e->mod = modp;
            c->count++;
            if (f->kind == CUA_TRACE_FRAME_PYTHON) {
                char buf[1024];
                snprintf(buf, sizeof buf, "%s (%s:%" PRIu64 ")", f->function ? f->function : "?",
                         f->file ? f->file : "?", f->line);
                e->text = calloc(1, sizeof *e->text);
                if (e->text && (e->text[0] = strdup(buf)))
                    e->ntext = 1;
                e->fold = false;
            } else {
                fmt_native(c, f->module, f->module ? f->module_offset : f->addr, e);
            }
            return e;
        }
        if (e->key == key && e->mod == modp && e->kind == f->kind)
            return e;
    }
}

size_t sym_native_frames(sym_ctx_t *c, const char *module, uint64_t offset, sym_native_t *out, size_t max)
{
    tr_frame_t f = {.kind = CUA_TRACE_FRAME_NATIVE, .addr = offset, .module = module, .module_offset = offset};
    const sym_ent_t *e = ent_get(c, &f);
    size_t n = e->ntext < max ? e->ntext : max;
    for (size_t i = 0; i < n; i++)
        out[i] = e->nf[i];
    if (n == 0 && max > 0) {
        out[0] = (sym_native_t){.fold = e->fold};
        n = 1;
    }
    return n;
}

size_t sym_stack(sym_ctx_t *c, uint32_t id, const char **out, size_t max)
{
    if (id == 0 || id > tr_stack_count(c->r) || !stk_room(c, id))
        return 0;
    if (!c->stkdone[id]) {
        c->stkdone[id] = true;
        tr_frame_t fr[SYM_MAX_FRAMES];
        size_t n = tr_stack_frames(c->r, id, fr, SYM_MAX_FRAMES);
        static sym_ent_t *ents[SYM_MAX_FRAMES];
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
            ents[i] = ent_get(c, &fr[i]);
            total += ents[i]->ntext;
        }
        c->stk[id] = calloc(total ? total : 1, sizeof(char *));
        size_t m = 0;
        for (size_t i = 0; c->stk[id] && i < n; i++) {
            if (ents[i]->fold)
                continue;
            for (size_t k = 0; k < ents[i]->ntext; k++) {
                const char *t = ents[i]->text[k];
                /* The C runtime's start-up frames are below every stack: not the user's. */
                if (strncmp(t, "__libc_start", 12) == 0 || strncmp(t, "_start ", 7) == 0)
                    continue;
                c->stk[id][m++] = ents[i]->text[k];
            }
        }
        c->stkn[id] = m;
    }
    size_t n = c->stkn[id] < max ? c->stkn[id] : max;
    for (size_t i = 0; i < n; i++)
        out[i] = c->stk[id][i];
    return n;
}

size_t sym_label_depth(const char *const *f, size_t n, const char *const *g, size_t m)
{
    size_t c = 0;
    while (c < n && c < m && strcmp(f[c], g[c]) == 0)
        c++;
    return c + 1;
}

void sym_label(const char *const *f, size_t n, size_t depth, bool recorded, char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    if (n == 0) {
        snprintf(buf, len, "%s", recorded ? "(allocator frames only)" : "(stack not recorded)");
        return;
    }
    if (depth > n)
        depth = n;
    if (depth > SYM_LABEL_FRAMES)
        depth = SYM_LABEL_FRAMES;
    size_t k = 0;
    for (size_t i = 0; i < depth && k + 8 < len; i++) {
        int w = snprintf(buf + k, len - k, "%s%s", i ? " <- " : "", f[i]);
        if (w < 0)
            break;
        k += (size_t)w;
    }
}
