/* symbolize.c — see symbolize.h. */
#include "symbolize.h"

#include <dlfcn.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdwfl.h>
#endif

#include "grow.h"
#include "text.h"
#include "xalloc.h"

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
    uint8_t *flags;   /* per text: SF_* */
    sym_native_t *nf; /* native: the frames behind text (sym_native_frames), ntext of them */
    bool fold;        /* the allocator's or the CUDA runtime's frame: every text left out */
} sym_ent_t;

#define SF_PLUMBING 1u /* machinery between the user's code and the allocation: left out of sites */
#define SF_PYSRC 2u    /* a frame of Python source: what labels of Python programs are made of */
#define SF_FOLD 4u     /* the allocator's or the CUDA runtime's (an inlined one, in a user's function) */

/* A stack's user frames (texts of the ents, innermost first), and the frames its label is made of:
 * the innermost, then, in a Python program, only the Python source frames (the native frames
 * between an allocation and the Python line that caused it are many and alike). */
typedef struct sym_stk {
    const char **frames, **label;
    size_t nframes, nlabel;
    bool done;
} sym_stk_t;

struct sym_ctx {
    const tr_reader_t *r;
    sym_mod_t *mods;
    size_t nmods;
    sym_ent_t *ents;
    size_t cap, count;
    sym_stk_t *stk; /* per stack id (< nstk, grown on demand) */
    size_t nstk;
    char **names;   /* demangled function names (the frames point into them) */
    size_t nnames, names_cap;
};

static bool fold_module(const char *path)
{
    const char *b = txt_base_name(path);
    return fnmatch("libcualloc.so*", b, 0) == 0 || fnmatch("libcualloc_torch*", b, 0) == 0 ||
           fnmatch("libcudart*", b, 0) == 0 || fnmatch("libcuda.so*", b, 0) == 0 ||
           fnmatch("libc10_cuda*", b, 0) == 0 || fnmatch("libstubcudart*", b, 0) == 0;
}

static bool prefixed(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool suffixed(const char *s, const char *p)
{
    size_t n = strlen(s), k = strlen(p);
    return n >= k && strcmp(s + n - k, p) == 0;
}

/* The allocator's own functions: cualloc's, the CUDA runtime's and driver's allocation entry
 * points, PyTorch's caching allocator (in stacks imported from its snapshots) and its pluggable
 * allocator's wrapper around cualloc. */
static bool fold_function(const char *fn)
{
    return fn && (prefixed(fn, "cudaMalloc") || prefixed(fn, "cuMemAlloc") || prefixed(fn, "cualloc_") ||
                  strstr(fn, "c10::cuda::CUDACachingAllocator::") != NULL ||
                  strstr(fn, "torch::cuda::CUDAPluggableAllocator::") != NULL);
}

/* C++ symbol names as a reader knows them: "at::native::mm_out_cuda" for
 * _ZN2at6native11mm_out_cudaERKNS_6TensorES3_RS1_. Through the C++ runtime's __cxa_demangle
 * (libstdc++, loaded at the first mangled name; without it names stay mangled), and without the
 * parameter list, which says nothing of the call site and makes labels unreadable (an overload
 * is told apart by its file and line). The result belongs to the context; NULL: keep `name`. */
typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

static cxa_demangle_fn demangler(void)
{
    static int tried;
    static cxa_demangle_fn fn;
    if (!tried) {
        tried = 1;
        void *p = dlsym(RTLD_DEFAULT, "__cxa_demangle");
        if (!p) {
            void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
            p = lib ? dlsym(lib, "__cxa_demangle") : NULL; /* kept loaded while allocview runs */
        }
        memcpy(&fn, &p, sizeof p);
    }
    return fn;
}

/* Cuts a demangled function name's parameter list (and what follows it: " const", "&"):
 * "ns::f<int (*)(int)>(long) const" becomes "ns::f<int (*)(int)>". */
static void cut_parameters(char *name)
{
    size_t n = strlen(name);
    while (n > 0 && name[n - 1] != ')') /* " const", " &", " &&", " volatile" */
        n--;
    if (n == 0)
        return;
    int depth = 0;
    for (size_t i = n; i-- > 0;) {
        if (name[i] == ')')
            depth++;
        else if (name[i] == '(' && --depth == 0) {
            if (i > 0)
                name[i] = '\0';
            return;
        }
    }
}

static const char *demangled(sym_ctx_t *c, const char *name)
{
    if (!name || strncmp(name, "_Z", 2) != 0)
        return NULL;
    cxa_demangle_fn fn = demangler();
    if (!fn)
        return NULL;
    int status = -1;
    char *d = fn(name, NULL, NULL, &status);
    if (status != 0 || !d) {
        free(d);
        return NULL;
    }
    cut_parameters(d);
    char **grown = av_grow_zeroed(c->names, &c->names_cap, c->nnames, sizeof *c->names);
    if (!grown) {
        free(d);
        return NULL;
    }
    c->names = grown;
    c->names[c->nnames++] = d;
    return d;
}

/* Frames that only carry the call from the user's code to the allocation, and say nothing of which
 * site it is: the process's start, the Python interpreter's evaluation loop and call protocol (and
 * ctypes' foreign calls), PyTorch's operator dispatcher (its boxing wrappers and generated
 * Register*.cpp / Redispatch wrappers), its Python wrappers of module calls and optimizer steps,
 * and its own stack capture (in imported snapshots). Left out of call sites, as PyTorch's memory
 * viewer leaves them out; kept in export, whose viewer filters for itself. */
static bool plumbing_frame(const char *fn, const char *file)
{
    static const char *const fn_prefixes[] = {
        "__libc_start", "__libc_init_first",
        "Py_RunMain", "Py_BytesMain", "pymain_", "PyRun_", "_PyRun_", "pyrun_", "run_mod", "run_eval_code_obj",
        "PyEval_", "_PyEval_", "PyObject_", "_PyObject_", "PyFunction_", "_PyFunction_", "PyVectorcall_",
        "_PyVectorcall_", "method_vectorcall", "cfunction_call", "cfunction_vectorcall", "slot_tp_",
        "c10::impl::wrap_kernel_functor_unboxed_", "c10::impl::make_boxed_from_unboxed_functor",
        "c10::impl::BoxedKernelWrapper", "c10::Dispatcher::", "c10::KernelFunction::", "c10::BoxedKernel::",
        "at::_ops::",
        "PyCFuncPtr_call", "_ctypes_callproc", "_call_function_pointer", "ffi_call",
    };
    /* Also PyTorch's tensor factories (every tensor passes through them: they say "a tensor", not
     * which); demangled names may start with a return type, hence parts, not prefixes. */
    static const char *const fn_parts[] = {
        "unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp",
        "at::detail::empty_", "at::detail::_empty_", "at::native::empty_cuda(", "at::native::empty_strided_cuda(",
    };
    if (fn) {
        if (strcmp(fn, "_start") == 0)
            return true;
        for (size_t i = 0; i < sizeof fn_prefixes / sizeof fn_prefixes[0]; i++)
            if (prefixed(fn, fn_prefixes[i]))
                return true;
        for (size_t i = 0; i < sizeof fn_parts / sizeof fn_parts[0]; i++)
            if (strstr(fn, fn_parts[i]))
                return true;
    }
    if (file) {
        const char *b = txt_base_name(file);
        if (prefixed(b, "Register") || prefixed(b, "Redispatch") || strstr(file, "core/boxing"))
            return true;
    }
    /* PyTorch's Python wrappers around every module call, optimizer step and no_grad function. */
    static const char *const py_wrappers[][2] = {
        {"torch/nn/modules/module.py", "_call_impl"},
        {"torch/nn/modules/module.py", "_wrapped_call_impl"},
        {"torch/utils/_contextlib.py", "decorate_context"},
        {"torch/optim/optimizer.py", "wrapper"},
        {"torch/optim/optimizer.py", "_use_grad"},
    };
    if (fn && file)
        for (size_t i = 0; i < sizeof py_wrappers / sizeof py_wrappers[0]; i++)
            if (suffixed(file, py_wrappers[i][0]) && strcmp(fn, py_wrappers[i][1]) == 0)
                return true;
    return false;
}

/* A frame of Python source code (a .py file, or "<string>", "<frozen ...>"), as opposed to a
 * native frame: for imported snapshots, whose native frames come as (function, file, line) too. */
static bool python_source(const char *file)
{
    return file && (file[0] == '<' || (strcmp(file, ".py") != 0 && suffixed(file, ".py")));
}

/* A Python file as labels show it: an installed package's path from the package on
 * (".../site-packages/torch/nn/modules/module.py" -> "torch/nn/modules/module.py"). */
static const char *python_file_name(const char *file)
{
    static const char *const roots[] = {"/site-packages/", "/dist-packages/"};
    for (size_t i = 0; i < 2; i++) {
        const char *p = strstr(file, roots[i]);
        if (p)
            return p + strlen(roots[i]);
    }
    return file;
}

/* A function as labels show it: without its return type, parameter list, cv-qualifiers and the
 * suffix of a compiler's clone, long template arguments elided ("at::TensorBase
 * at::detail::_empty_generic<c10::ArrayRef<long> >(c10::ArrayRef<long>, ...) [clone .constprop.0]"
 * -> "at::detail::_empty_generic<...>"). Names that are not C++ (C, Python) come back unchanged. */
static void cxx_short_name(const char *fn, char *out, size_t len)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", fn);
    char *clone = strstr(buf, " [clone ");
    if (clone)
        *clone = '\0';
    /* The compiler's clones of a C function carry their kind in the symbol: "talloc.constprop.0". */
    static const char *const clone_kinds[] = {".constprop.", ".isra.", ".part.", ".lto_priv.", ".cold"};
    for (size_t i = 0; i < sizeof clone_kinds / sizeof clone_kinds[0]; i++)
        if ((clone = strstr(buf, clone_kinds[i])) && clone > buf)
            *clone = '\0';
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '&'))
        buf[--n] = '\0';
    if (n > 6 && suffixed(buf, " const"))
        buf[n -= 6] = '\0';
    /* The parameter list: the bracket group that ends the name. */
    if (n > 0 && buf[n - 1] == ')') {
        int depth = 0;
        for (size_t i = n; i-- > 0;) {
            if (buf[i] == ')' || buf[i] == '>')
                depth++;
            else if ((buf[i] == '(' || buf[i] == '<') && --depth == 0) {
                if (i > 0 && buf[i] == '(')
                    buf[i] = '\0';
                break;
            }
        }
    }
    /* The return type: everything before the last space outside brackets. */
    const char *name = buf;
    int depth = 0;
    for (const char *p = buf; *p; p++) {
        if (*p == '(' || *p == '<')
            depth++;
        else if ((*p == ')' || *p == '>') && depth > 0)
            depth--;
        else if (*p == ' ' && depth == 0)
            name = p + 1;
    }
    /* Template arguments longer than a few words: "<...>". */
    size_t o = 0;
    for (const char *p = name; *p && o + 6 < len; p++) {
        if (*p == '<' && strncmp(p, "<lambda", 7) != 0) {
            const char *q = p;
            int d = 0;
            do {
                d += *q == '<' ? 1 : *q == '>' ? -1 : 0;
                q++;
            } while (*q && d > 0);
            if (q - p > 24) {
                memcpy(out + o, "<...>", 5);
                o += 5;
                p = q - 1;
                continue;
            }
        }
        out[o++] = *p;
    }
    out[o] = '\0';
}

/* The text of a frame: "function (file:line)", or "function (file)" without a line, or only the
 * function when nothing is known of its place. */
static void frame_text(const char *fn, const char *file, uint64_t line, char *buf, size_t len)
{
    char name[1024];
    cxx_short_name(fn, name, sizeof name);
    bool nofile = !file || !file[0] || strcmp(file, "??") == 0;
    if (nofile && line == 0)
        snprintf(buf, len, "%s", name);
    else if (line == 0)
        snprintf(buf, len, "%s (%s)", name, file);
    else
        snprintf(buf, len, "%s (%s:%" PRIu64 ")", name, nofile ? "?" : file, line);
}

sym_ctx_t *sym_new(const tr_reader_t *r)
{
    sym_ctx_t *c = xcalloc(1, sizeof *c);
    c->r = r;
    c->cap = 1024;
    c->ents = xcalloc(c->cap, sizeof *c->ents);
    return c;
}

/* Room in the per-stack cache for stack `id`. */
static bool stk_room(sym_ctx_t *c, uint32_t id)
{
    sym_stk_t *stk = av_grow_zeroed(c->stk, &c->nstk, id, sizeof *stk);
    if (!stk)
        return false;
    c->stk = stk;
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
        free(c->ents[i].flags);
        free(c->ents[i].nf);
    }
    free(c->ents);
    for (size_t i = 0; i < c->nstk; i++) {
        free(c->stk[i].frames);
        free(c->stk[i].label);
    }
    free(c->stk);
    for (size_t i = 0; i < c->nnames; i++)
        free(c->names[i]);
    free(c->names);
    free(c);
}

static sym_mod_t *mod_get(sym_ctx_t *c, const char *path)
{
    for (size_t i = 0; i < c->nmods; i++)
        if (strcmp(c->mods[i].path, path) == 0)
            return &c->mods[i];
    c->mods = xrealloc(c->mods, (c->nmods + 1) * sizeof *c->mods);
    sym_mod_t *m = &c->mods[c->nmods++];
    memset(m, 0, sizeof *m);
    m->path = xstrdup(path);
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
    /* The path comes from the trace: only a regular file is read (a FIFO a trace names must not
     * make it wait for a writer). */
    struct stat st;
    int fd = tr_open_regular(m->path, &st);
    /* The executable's path as the kernel gives it once its file was deleted or replaced while
     * it ran (a rebuild, an install): "/path/prog (deleted)". The file now at /path/prog is read
     * when its build id is the recorded one (below); without a recorded build id it is not. */
    const unsigned char *want;
    size_t want_len = tr_module_build_id(c->r, m->path, &want);
    static const char deleted[] = " (deleted)";
    size_t plen = strlen(m->path), k = sizeof deleted - 1;
    if (fd == -1 && want_len && plen > k && strcmp(m->path + plen - k, deleted) == 0) {
        char *now = xstrdup(m->path);
        now[plen - k] = '\0';
        fd = tr_open_regular(now, &st);
        free(now);
    }
    if (fd < 0)
        return;
    m->dwfl = dwfl_begin(&callbacks);
    if (!m->dwfl) {
        close(fd);
        return;
    }
    /* Reported at bias 0: lookups use the file's own addresses (the recorded offset). The module
     * owns fd from here on (dwfl_end closes it); a file it refuses, e.g. one that is not ELF,
     * leaves fd with us. */
    m->mod = dwfl_report_elf(m->dwfl, txt_base_name(m->path), m->path, fd, 0, false);
    dwfl_report_end(m->dwfl, NULL, NULL);
    if (!m->mod) {
        close(fd);
        return;
    }
    /* The build id must match the recorded one: a rebuilt file would name the wrong code. */
    if (want_len) {
        const unsigned char *bits;
        GElf_Addr vaddr;
        int n = dwfl_module_build_id(m->mod, &bits, &vaddr);
        if (n <= 0 || (size_t)n != want_len || memcmp(bits, want, want_len) != 0) {
            /* Said once per module: otherwise its frames' module+offset would seem unexplained. */
            fprintf(stderr,
                    "allocview: %s is not the file the trace recorded (its build id differs: rebuilt since?); "
                    "its frames are shown as module+offset\n",
                    m->path);
            return;
        }
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
 * into imported units, which link-time optimization emits, at most `imports` deep: a damaged file
 * may import in a cycle). Returns the new depth. dwarf_getscopes is not used: it finds nothing in
 * the partial units of LTO builds. */
static int die_path(Dwarf_Die *die, Dwarf_Addr pc, Dwarf_Die *path, int depth, int max, int imports)
{
    Dwarf_Die child;
    if (depth >= max || dwarf_child(die, &child) != 0)
        return depth;
    do {
        int tag = dwarf_tag(&child);
        if (tag == DW_TAG_imported_unit) {
            Dwarf_Attribute at;
            Dwarf_Die unit;
            if (imports > 0 && dwarf_formref_die(dwarf_attr(&child, DW_AT_import, &at), &unit)) {
                int d = die_path(&unit, pc, path, depth, max, imports - 1);
                if (d > depth)
                    return d;
            }
        } else if ((tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block) &&
                   dwarf_haspc(&child, pc) == 1) {
            path[depth] = child;
            return die_path(&child, pc, path, depth + 1, max, imports);
        } else if (tag == DW_TAG_namespace || tag == DW_TAG_class_type || tag == DW_TAG_structure_type) {
            int d = die_path(&child, pc, path, depth, max, imports);
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
    int np = cu ? die_path(cu, pc - bias, path, 0, 64, 8) : 0;
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
            const char *readable = demangled(c, fn);
            if (readable)
                fn = readable;
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
    /* From the function the code lies in inwards: an allocator's function folds with everything
     * inlined into it, but not the user's function it was itself inlined into (cuda_runtime.h's
     * cudaMalloc<T> template, inlined where the user calls it). */
    for (size_t i = n; i-- > 0;) {
        fold |= fold_function(out[i].function);
        out[i].fold = fold;
    }
    /* libffi: the trampoline of ctypes and cffi calls, in every foreign call from Python. */
    bool ffi = module && fnmatch("libffi.so*", txt_base_name(module), 0) == 0;
    for (size_t i = 0; i < n; i++)
        out[i].plumbing = ffi || plumbing_frame(out[i].function, out[i].file);
    return n;
}

/* The texts of a native frame (module+off) into e: "fn (file.c:12)" per source-level frame. */
static void fmt_native(sym_ctx_t *c, const char *module, uint64_t off, sym_ent_t *e)
{
    sym_native_t nf[SYM_INLINE_MAX];
    size_t n = native_lookup(c, module, off, nf, SYM_INLINE_MAX);
    e->text = xcalloc(n, sizeof *e->text);
    e->flags = xcalloc(n, sizeof *e->flags);
    e->nf = xmalloc(n * sizeof *e->nf);
    e->fold = nf[n - 1].fold; /* the function the code lies in: every text folds */
    for (size_t i = 0; i < n; i++) {
        e->nf[i] = nf[i];
        e->flags[e->ntext] = (uint8_t)((nf[i].plumbing ? SF_PLUMBING : 0) | (nf[i].fold ? SF_FOLD : 0));
        char buf[1024];
        if (nf[i].function && nf[i].file && nf[i].line > 0)
            frame_text(nf[i].function, txt_base_name(nf[i].file), (uint64_t)nf[i].line, buf, sizeof buf);
        else if (nf[i].function)
            frame_text(nf[i].function, txt_base_name(module), 0, buf, sizeof buf);
        else if (module)
            snprintf(buf, sizeof buf, "%s+0x%" PRIx64, txt_base_name(module), off);
        else
            snprintf(buf, sizeof buf, "0x%" PRIx64, off);
        e->text[e->ntext++] = xstrdup(buf);
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
        c->ents = xcalloc(c->cap, sizeof *c->ents);
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
                frame_text(f->function ? f->function : "?", f->file ? python_file_name(f->file) : NULL, f->line,
                           buf, sizeof buf);
                e->text = xcalloc(1, sizeof *e->text);
                e->flags = xcalloc(1, sizeof *e->flags);
                e->text[0] = xstrdup(buf);
                e->ntext = 1;
                e->flags[0] = (uint8_t)((plumbing_frame(f->function, f->file) ? SF_PLUMBING : 0) |
                                        (python_source(f->file) ? SF_PYSRC : 0));
                e->fold = fold_function(f->function);
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

/* The cache entry of stack id, computed on first use; NULL when there is none. */
static const sym_stk_t *stk_get(sym_ctx_t *c, uint32_t id)
{
    if (id == 0 || id > tr_stack_count(c->r) || !stk_room(c, id))
        return NULL;
    sym_stk_t *st = &c->stk[id];
    if (st->done)
        return st;
    st->done = true;
    static tr_frame_t fr[SYM_MAX_FRAMES];
    /* Copies of the entries: a later ent_get may move them (the table grows), not their arrays. */
    static sym_ent_t ents[SYM_MAX_FRAMES];
    size_t n = tr_stack_frames(c->r, id, fr, SYM_MAX_FRAMES), total = 0;
    for (size_t i = 0; i < n; i++) {
        ents[i] = *ent_get(c, &fr[i]);
        total += ents[i].ntext;
    }
    st->frames = xcalloc(total ? total : 1, sizeof *st->frames);
    st->label = xcalloc(total ? total : 1, sizeof *st->label);
    static uint8_t flags[SYM_MAX_FRAMES * SYM_INLINE_MAX];
    for (size_t i = 0; i < n; i++) {
        if (ents[i].fold)
            continue;
        for (size_t k = 0; k < ents[i].ntext; k++) {
            if (ents[i].flags[k] & (SF_PLUMBING | SF_FOLD))
                continue;
            flags[st->nframes] = ents[i].flags[k];
            st->frames[st->nframes++] = ents[i].text[k];
        }
    }
    /* The label: the innermost frame (what allocated), then, when there are any, only the Python
     * lines that led there; otherwise every frame. */
    bool python = false;
    for (size_t j = 1; j < st->nframes; j++)
        python |= (flags[j] & SF_PYSRC) != 0;
    for (size_t j = 0; j < st->nframes; j++)
        if (j == 0 || !python || (flags[j] & SF_PYSRC))
            st->label[st->nlabel++] = st->frames[j];
    return st;
}

/* The first `max` of n frames into out; how many. */
static size_t frames_out(const char **frames, size_t n, const char **out, size_t max)
{
    if (n > max)
        n = max;
    for (size_t i = 0; i < n; i++)
        out[i] = frames[i];
    return n;
}

size_t sym_stack(sym_ctx_t *c, uint32_t id, const char **out, size_t max)
{
    const sym_stk_t *st = stk_get(c, id);
    return st ? frames_out(st->frames, st->nframes, out, max) : 0;
}

size_t sym_stack_label(sym_ctx_t *c, uint32_t id, const char **out, size_t max)
{
    const sym_stk_t *st = stk_get(c, id);
    return st ? frames_out(st->label, st->nlabel, out, max) : 0;
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
