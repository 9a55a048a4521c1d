/* conf.c — the configuration: one descriptor table of every CUALLOC_CONF key (its type, default,
 * documentation and conf_t field), and the parser, formatter and README table made from it.
 * It does not act on the values: the heap, the drivers and the sim device read conf_t.
 *
 * Syntax: "key:value,key:value", PyTorch's PYTORCH_CUDA_ALLOC_CONF spelling where the meaning is
 * the same. Commas inside [...] do not split entries; whitespace around keys and values is
 * ignored; empty entries are skipped; a later entry for a key wins. The parser never allocates:
 * it reads spans of the input in place, copying only into small fixed stack buffers (too-long
 * keys and values are errors), and it accepts any byte string (tests/fuzz/fuzz_conf.c).
 * One deliberate difference from PyTorch: a '>' item before any size in a roundup list sets
 * every interval (PyTorch leaves interval 0 alone).
 */
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

/* Longest key and value the parser reads; longer ones are reported and skipped. A value this
 * long holds any roundup_power2_divisions list that names each interval once. */
#define CONF_KEY_MAX 48
#define CONF_VALUE_MAX 320
/* What a message quotes of a bad key or value (longer ones are cut and end in "..."). */
#define CONF_SHOW_MAX 64
/* Highest sim_va_base accepted: leaves room above it for any reservation the sim device makes. */
#define VA_BASE_MAX (((uint64_t)1 << 56) - 1)

typedef enum {
    OPT_BOOL,     /* bool: 1/0, true/false, yes/no, on/off (any case) */
    OPT_MIB,      /* size_t bytes, written as a count of MiB */
    OPT_KIB,      /* size_t bytes, written as a count of KiB */
    OPT_SIZE,     /* size_t, a plain count */
    OPT_INT,      /* int */
    OPT_UINT,     /* unsigned */
    OPT_FRACTION, /* double in [lo, hi] (hi excluded with OPT_OPEN_HI) */
    OPT_ADDR,     /* uint64_t address, hex (0x...) or decimal */
    OPT_ROUNDUP,  /* unsigned[CONF_ROUNDUP_INTERVALS]: one N, or PyTorch's [size_mb:N,...,>:N] */
    OPT_DRIVER,   /* driver_kind_t: cuda | sim */
    OPT_SIM_FAIL, /* sim_fail_op/_after/_count/_error: none | OP@AFTER[*COUNT][=ERROR] */
    OPT_PATH,     /* char[CONF_PATH_MAX]: a file path, may be empty; no ',', '[', ']' or controls */
} opt_type_t;

/* flags */
#define OPT_ZERO_OK 1u   /* 0 is accepted besides [lo, hi] (it means "off" / "not set") */
#define OPT_POW2 2u      /* a nonzero value must be a power of two */
#define OPT_EVEN 4u      /* a nonzero value must be a multiple of 2 */
#define OPT_UNLIMITED 8u /* "unlimited" is accepted and stored as SIZE_MAX */
#define OPT_OPEN_HI 16u  /* fraction: hi itself is not accepted */
#define OPT_OMIT_EMPTY 32u /* conf_format leaves the key out while its value is empty (keys added
                            * later, so traces and summaries of unchanged settings stay as they were) */

typedef struct opt_s {
    const char *key;
    opt_type_t type;
    const char *def;  /* the default, written as conf_format writes it (conf_defaults parses it) */
    const char *doc;  /* one sentence or two for the README table; no '|' */
    size_t offset;    /* of the field in conf_t (OPT_SIM_FAIL: of sim_fail_op) */
    uint64_t lo, hi;  /* accepted numbers, in the unit the value is written in */
    unsigned flags;
} opt_t;

#define OFF(field) offsetof(conf_t, field)

/* The table. Its order is conf_t's, conf_format's and the README's. */
static const opt_t opts[] = {
    {"expandable_segments", OPT_BOOL, "True",
     "Back the large pool with virtual memory mapped in chunks on demand, so fragmented address "
     "space costs no physical memory. `False`: cuMemAlloc'd segments managed like PyTorch's native "
     "allocator (also the fallback where the driver has no VMM).",
     OFF(expandable_segments), 0, 1, 0},
    {"max_split_size_mb", OPT_MIB, "unlimited",
     "Classic segments: cached blocks larger than this many MiB are never split (PyTorch's option; "
     "at least 20, as in PyTorch 2.8 and later, where earlier versions wanted more than 20). "
     "`unlimited`: any block may be split.",
     OFF(max_split_size), 20, SIZE_MAX / MiB, OPT_UNLIMITED},
    {"garbage_collection_threshold", OPT_FRACTION, "0",
     "Release cached free memory once reserved memory exceeds this fraction of the cap, in [0, 1). "
     "`0`: off. The cap is the device's memory unless per_process_memory_fraction or max_memory_mb "
     "sets one; PyTorch's own allocator applies the key only after set_per_process_memory_fraction, "
     "so without one the same value that does nothing there releases memory here.",
     OFF(garbage_collection_threshold), 0, 1, OPT_OPEN_HI},
    {"roundup_power2_divisions", OPT_ROUNDUP, "0",
     "Round requests up to one of N steps per power of two. One N (a power of two) for all sizes, "
     "or PyTorch's list `[256:1,512:2,>:8]`: keys are sizes in MiB (powers of two) naming the "
     "interval [key, 2 key), `>` every interval after the last key named. `0`: plain 512 B "
     "rounding.",
     OFF(roundup_power2_divisions), 0, (uint64_t)1 << 20, OPT_ZERO_OK | OPT_POW2},
    {"per_process_memory_fraction", OPT_FRACTION, "0",
     "Cap reserved memory at this fraction of device memory, in (0, 1]. `0`: no cap.",
     OFF(per_process_memory_fraction), 0, 1, 0},
    {"max_memory_mb", OPT_MIB, "0",
     "Cap reserved memory at this many MiB. `0`: no cap.",
     OFF(max_memory), 1, SIZE_MAX / MiB, OPT_ZERO_OK},
    {"chunk_size_mb", OPT_MIB, "0",
     "Size in MiB of the large pool's VMM chunks (the unit of map and unmap), an even number, rounded "
     "up to a power-of-two multiple of the granularity. `0`: the device's granularity (2 MiB on "
     "current GPUs). A size above the heap's cap is cut to the largest that fits, with a warning.",
     OFF(chunk_size), 2, (uint64_t)1 << 20, OPT_ZERO_OK | OPT_EVEN},
    {"va_factor", OPT_SIZE, "4",
     "The large pool reserves this many times device memory of address space, once (2 to 1024).",
     OFF(va_factor), 2, VA_FACTOR_MAX, 0},
    {"summary", OPT_BOOL, "False",
     "At exit, print a statistics table for each device on stderr.",
     OFF(summary), 0, 1, 0},
    {"exclude", OPT_PATH, "",
     "LD_PRELOAD only: allocations whose caller is a library matching one of these globs (separated "
     "by `;` or a vertical bar, matched against the file name, e.g. `libnccl*;libmpi*`) go to CUDA unchanged "
     "(cudaMalloc memory: IPC, NCCL buffer registration and RDMA work as without cualloc); their "
     "frees follow as foreign pointers. Empty: none.",
     OFF(exclude), 0, CONF_PATH_MAX - 1, OPT_OMIT_EMPTY},
    {"trace", OPT_PATH, "",
     "Record every allocation event to this file (cualloc_trace.h; read it with allocview). `%p` "
     "is replaced by the pid, `%r` by the rank (RANK or LOCAL_RANK; 0 when unset), `%h` by the "
     "host name, `%%` by `%`. An existing file is never overwritten (`.1`, `.2` ... is appended) "
     "and a symlink, a directory or a device at the path is refused. After fork a child writes its "
     "own file when the path has `%p` (an escaped `%%p` is not the pid), else stops tracing. "
     "Empty: off.",
     OFF(trace), 0, CONF_PATH_MAX - 1, 0},
    {"trace_stack_depth", OPT_UINT, "16",
     "Native frames recorded per allocation call stack (0 to 64), plus the Python frames of a "
     "thread holding the GIL (through the C API, e.g. PyTorch's pluggable allocator, also of a "
     "thread that let the GIL go: it is taken back for the capture). `0`: no stacks.",
     OFF(trace_stack_depth), 0, 64, 0},
    {"trace_max_mb", OPT_MIB, "0",
     "Bound the trace file to this many MiB: tracing stops there (the trace ends with a record "
     "saying so), or with trace_ring keeps the newest events. `0`: unbounded.",
     OFF(trace_max), 1, (uint64_t)1 << 30, OPT_ZERO_OK},
    {"trace_ring", OPT_BOOL, "False",
     "With trace_max_mb: when the file is full, overwrite the oldest event blocks (a ring) instead "
     "of stopping. Definitions (stacks, threads, devices) are kept, in up to half the file (new ones "
     "take the oldest event blocks; past half, new call sites are recorded as unknown).",
     OFF(trace_ring), 0, 1, 0},
    {"driver", OPT_DRIVER, "cuda",
     "`cuda`: the CUDA driver (libcuda.so.1). `sim`: the host-simulated device, for tests, replay "
     "and demos without a GPU.",
     OFF(driver), 0, 0, 0},
    {"sim_memory_mb", OPT_MIB, "16384",
     "Memory of each sim device, in MiB.",
     OFF(sim_memory), 1, CONF_SIM_MEMORY_MAX_MB, 0},
    {"sim_host_backed", OPT_BOOL, "False",
     "Sim device memory is real host memory, so tests can read and write through the pointers.",
     OFF(sim_host_backed), 0, 1, 0},
    {"sim_granularity_kb", OPT_KIB, "2048",
     "VMM granularity of the sim device in KiB, a power of two, at least 4 (the small pool still maps 2 MiB chunks at least).",
     OFF(sim_granularity), 4, (uint64_t)1 << 20, OPT_POW2},
    {"sim_vmm", OPT_BOOL, "True",
     "The sim device supports virtual memory management. `False`: classic segments only.",
     OFF(sim_vmm), 0, 1, 0},
    {"sim_devices", OPT_INT, "1",
     "Number of sim devices (1 to 64).",
     OFF(sim_devices), 1, CUALLOC_MAX_DEVICES, 0},
    {"sim_latency_us", OPT_UINT, "0",
     "Microseconds added to every sim call that models a slow driver call: create, release, map, unmap and access (VMM), and a classic segment's allocation and free (at most 10000000).",
     OFF(sim_latency_us), 0, 10000000, 0},
    {"sim_va_base", OPT_ADDR, "0x7f0000000000",
     "First address the sim device hands out, hex or decimal: nonzero, below 2^56, a multiple of "
     "the sim granularity. Fixed, so reports are reproducible.",
     OFF(sim_va_base), 1, VA_BASE_MAX, 0},
    {"sim_fail", OPT_SIM_FAIL, "none",
     "Inject a failure: `OP@N` fails call N+1 of OP (counting from 0) once, `OP@N*K` fails it and "
     "the K-1 calls after it. OP is one of va_reserve, va_free, phys_create, phys_release, map, "
     "unmap, set_access, mem_alloc, mem_free, event_create, event_record, event_query, "
     "stream_sync, device_sync, event_sync. The failures return CUDA_ERROR_OUT_OF_MEMORY (2) for "
     "va_reserve, phys_create, mem_alloc and event_create, else CUDA_ERROR_UNKNOWN (999); "
     "`=E` after it returns the CUresult E (1 to 999) instead, e.g. `phys_create@0*1000=700`, a "
     "context a kernel's illegal address left failing. `none`: off.",
     OFF(sim_fail_op), 0, UINT_MAX, 0},
};
#define NOPTS (sizeof opts / sizeof opts[0])

static const char *const sim_op_names[SIM_OP_COUNT] = {
    [SIM_OP_VA_RESERVE] = "va_reserve",     [SIM_OP_VA_FREE] = "va_free",
    [SIM_OP_PHYS_CREATE] = "phys_create",   [SIM_OP_PHYS_RELEASE] = "phys_release",
    [SIM_OP_MAP] = "map",                   [SIM_OP_UNMAP] = "unmap",
    [SIM_OP_SET_ACCESS] = "set_access",     [SIM_OP_MEM_ALLOC] = "mem_alloc",
    [SIM_OP_MEM_FREE] = "mem_free",         [SIM_OP_EVENT_CREATE] = "event_create",
    [SIM_OP_EVENT_RECORD] = "event_record", [SIM_OP_EVENT_QUERY] = "event_query",
    [SIM_OP_STREAM_SYNC] = "stream_sync",   [SIM_OP_DEVICE_SYNC] = "device_sync",
    [SIM_OP_EVENT_SYNC] = "event_sync",
};

const char *sim_op_name(sim_op_t op)
{
    if (op == SIM_OP_COUNT)
        return "none";
    if ((unsigned)op >= SIM_OP_COUNT || !sim_op_names[op])
        return "?";
    return sim_op_names[op];
}

/* ------------------------------------------------------------------------ small helpers */

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* Trims whitespace off both ends of [*s, *s + *len). */
static void trim(const char **s, size_t *len)
{
    while (*len > 0 && is_space(**s)) {
        (*s)++;
        (*len)--;
    }
    while (*len > 0 && is_space((*s)[*len - 1]))
        (*len)--;
}

/* Does [s, s + len) spell `word` exactly (case-insensitive when nocase)? */
static bool span_is(const char *s, size_t len, const char *word, bool nocase)
{
    size_t wl = strlen(word);
    if (len != wl)
        return false;
    for (size_t i = 0; i < len; i++) {
        char a = s[i], b = word[i];
        if (nocase) {
            if (a >= 'A' && a <= 'Z')
                a = (char)(a - 'A' + 'a');
            if (b >= 'A' && b <= 'Z')
                b = (char)(b - 'A' + 'a');
        }
        if (a != b)
            return false;
    }
    return true;
}

/* Copies [s, s + len) into dst for a message: at most CONF_SHOW_MAX-ish characters, bytes that
 * are not printable ASCII shown as '?', "..." when cut. Always NUL-terminates (size >= 4). */
static void show(char *dst, size_t size, const char *s, size_t len)
{
    size_t n = len <= size - 1 ? len : size - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        dst[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n < len) {
        memcpy(dst + n, "...", 3);
        n += 3;
    }
    dst[n] = '\0';
}

static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* Parses all of [s, s + len) as a decimal integer (or hex after "0x" when hex_ok) into *out.
 * No sign, no whitespace, no overflow; NULL on success, else why not. */
static const char *parse_u64(const char *s, size_t len, bool hex_ok, uint64_t *out)
{
    unsigned base = 10;
    if (hex_ok && len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
        len -= 2;
    }
    if (len == 0)
        return "not a number";
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d;
        char ch = s[i];
        if (ch >= '0' && ch <= '9')
            d = (unsigned)(ch - '0');
        else if (base == 16 && ch >= 'a' && ch <= 'f')
            d = (unsigned)(ch - 'a' + 10);
        else if (base == 16 && ch >= 'A' && ch <= 'F')
            d = (unsigned)(ch - 'A' + 10);
        else
            return base == 16 ? "not a hexadecimal number" : "not a whole number";
        if (v > (UINT64_MAX - d) / base)
            return "too large";
        v = v * base + d;
    }
    *out = v;
    return NULL;
}

/* Checks a number against the descriptor's range and flags. NULL when it is accepted. The
 * reason is written into why[] (it names the bounds). */
static const char *check_number(const opt_t *o, uint64_t v, char *why, size_t why_len)
{
    if (v == 0 && (o->flags & OPT_ZERO_OK))
        return NULL;
    if (v < o->lo || v > o->hi) {
        snprintf(why, why_len, "%s: must be %llu to %llu%s%s",
                 v < o->lo ? "too small" : "too large", (unsigned long long)o->lo,
                 (unsigned long long)o->hi,
                 (o->flags & OPT_ZERO_OK) && o->lo > 0 ? ", or 0" : "",
                 (o->flags & OPT_UNLIMITED) ? ", or unlimited" : "");
        return why;
    }
    if ((o->flags & OPT_POW2) && !is_pow2(v))
        return "not a power of two";
    if ((o->flags & OPT_EVEN) && (v & 1))
        return "not a multiple of 2";
    return NULL;
}

/* The C library reads and writes doubles with the locale's decimal point, which may be more than
 * one byte (ps_AF's is two); CUALLOC_CONF always uses '.'. So numbers are read and written under
 * the "C" locale, whatever the process set with setlocale. */
static locale_t conf_c_locale;
static pthread_once_t conf_c_locale_once = PTHREAD_ONCE_INIT;
static void conf_c_locale_make(void) { conf_c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static locale_t c_locale(void)
{
    pthread_once(&conf_c_locale_once, conf_c_locale_make);
    return conf_c_locale ? conf_c_locale : LC_GLOBAL_LOCALE; /* (newlocale fails only without memory) */
}

/* Parses a plain decimal fraction ("0.25", "1", ".5", "2.5e-1"). No sign, no nan/inf/hex; a value
 * too small for a double (it would read as 0, which means "no cap" where 0 is allowed) or too large
 * is refused. */
static const char *parse_double(const char *s, size_t len, double *out)
{
    char buf[48];
    if (len == 0)
        return "not a number";
    if (len >= sizeof buf)
        return "too long for a number";
    bool digit = false, nonzero = false, exponent = false;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (ch == 'e' || ch == 'E')
            exponent = true;
        if (ch >= '0' && ch <= '9') {
            digit = true;
            nonzero |= !exponent && ch != '0';
        } else if (ch != '.' && ch != 'e' && ch != 'E' && ch != '+' && ch != '-')
            return "not a number";
    }
    if (!digit || !((s[0] >= '0' && s[0] <= '9') || s[0] == '.'))
        return "not a number";
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end = NULL;
    errno = 0;
    double v = strtod_l(buf, &end, c_locale());
    if (end != buf + len)
        return "not a number";
    if (errno == ERANGE || (v == 0 && nonzero) || isinf(v))
        return "out of range for a number";
    *out = v;
    return NULL;
}

/* Writes a double so that parse_double reads back the same value, as short as that allows. */
static void format_double(double v, char *buf, size_t len)
{
    locale_t old = uselocale(c_locale());
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    uselocale(old);
}

const char *conf_parse_bool(const char *s, size_t len, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (span_is(s, len, yes[i], true)) {
            *out = true;
            return NULL;
        }
        if (span_is(s, len, no[i], true)) {
            *out = false;
            return NULL;
        }
    }
    return "not a boolean (1/0, true/false, yes/no, on/off)";
}

bool conf_env_flag(const char *name)
{
    const char *v = getenv(name);
    if (!v || !v[0])
        return false;
    bool b;
    if (conf_parse_bool(v, strlen(v), &b) == NULL)
        return b;
    cua_error("%s='%s' is not a boolean (1/0, true/false, yes/no, on/off); taken as 1", name, v);
    return true;
}

bool conf_disabled(void)
{
    static _Atomic int state = -1; /* -1: not read yet */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (s < 0) {
        int expected = -1;
        s = conf_env_flag("CUALLOC_DISABLE");
        if (!atomic_compare_exchange_strong(&state, &expected, s))
            s = expected; /* another thread read it first: its answer stands */
    }
    return s != 0;
}

/* ------------------------------------------------------------------------ roundup lists */

/* Interval of a key in MiB: log2, clamped to the last interval. The key is a power of two. */
static unsigned roundup_index(uint64_t size_mb)
{
    unsigned idx = floor_log2(size_mb);
    return idx < CONF_ROUNDUP_INTERVALS ? idx : CONF_ROUNDUP_INTERVALS - 1;
}

/* Parses roundup_power2_divisions over div[] (a copy of the field; the caller applies it only
 * on success). Either "N" (every interval) or PyTorch's "[k:N,k:N,>:N]":
 *   - k is a size in MiB, a power of two; its interval is log2(k) clamped to [0, 15], covering
 *     sizes in [2^i MiB, 2^(i+1) MiB) (interval 0 also covers sizes below 1 MiB);
 *   - the first k named also sets every interval below its own, as PyTorch does;
 *   - ">" sets every interval after the last k named (all of them when none was named yet);
 *   - N is 0 (plain rounding) or a power of two.
 * Whitespace around items is ignored; an empty item (",,") is skipped. */
static const char *parse_roundup(const opt_t *o, const char *s, size_t len,
                                 unsigned div[CONF_ROUNDUP_INTERVALS], char *why, size_t why_len)
{
    uint64_t v;
    const char *err;

    if (len == 0 || s[0] != '[') {
        if ((err = parse_u64(s, len, false, &v)) != NULL && strcmp(err, "too large") != 0)
            return err;
        if ((err = check_number(o, err ? UINT64_MAX : v, why, why_len)) != NULL)
            return err;
        for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
            div[i] = (unsigned)v;
        return NULL;
    }
    if (s[len - 1] != ']')
        return "unbalanced '[': the list must end with ']'";
    const char *p = s + 1, *end = s + len - 1;
    bool first = true;
    unsigned last = 0;
    size_t items = 0;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        const char *item = p;
        size_t item_len = (size_t)(item_end - item);
        p = item_end + 1;
        trim(&item, &item_len);
        if (item_len == 0)
            continue;
        if (memchr(item, '[', item_len) || memchr(item, ']', item_len))
            return "unbalanced brackets in the list";
        const char *colon = memchr(item, ':', item_len);
        if (!colon)
            return "a list item is not size_mb:divisions";
        const char *k = item, *d = colon + 1;
        size_t k_len = (size_t)(colon - item), d_len = (size_t)(item + item_len - d);
        trim(&k, &k_len);
        trim(&d, &d_len);
        if ((err = parse_u64(d, d_len, false, &v)) != NULL)
            return "divisions is not a whole number";
        if ((err = check_number(o, v, why, why_len)) != NULL)
            return err;
        unsigned n = (unsigned)v;
        if (span_is(k, k_len, ">", false)) {
            for (unsigned i = first ? 0 : last + 1; i < CONF_ROUNDUP_INTERVALS; i++)
                div[i] = n;
        } else {
            uint64_t size_mb;
            if (parse_u64(k, k_len, false, &size_mb) != NULL)
                return "a list key is not a size in MiB or '>'";
            if (!is_pow2(size_mb))
                return "a list key (size in MiB) is not a power of two";
            unsigned idx = roundup_index(size_mb);
            if (first) {
                for (unsigned i = 0; i < idx; i++)
                    div[i] = n;
                first = false;
            }
            div[idx] = n;
            last = idx;
        }
        items++;
    }
    if (items == 0)
        return "empty list";
    return NULL;
}

/* ------------------------------------------------------------------------ one value */

/* Parses `val` for option o into *c. On failure returns why and leaves *c as it was (every
 * value is parsed into a local first). */
static const char *opt_parse(const opt_t *o, const char *val, size_t len, conf_t *c, char *why,
                             size_t why_len)
{
    char *field = (char *)c + o->offset;
    const char *err;
    uint64_t v;

    switch (o->type) {
    case OPT_BOOL: {
        bool b;
        if ((err = conf_parse_bool(val, len, &b)) != NULL)
            return err;
        *(bool *)field = b;
        return NULL;
    }
    case OPT_MIB:
    case OPT_KIB:
    case OPT_SIZE:
    case OPT_INT:
    case OPT_UINT:
    case OPT_ADDR:
        if ((o->flags & OPT_UNLIMITED) && span_is(val, len, "unlimited", true)) {
            *(size_t *)field = SIZE_MAX;
            return NULL;
        }
        /* A number past 2^64 - 1 is past every range: the range check names the bounds. */
        if ((err = parse_u64(val, len, o->type == OPT_ADDR, &v)) != NULL && strcmp(err, "too large") != 0)
            return err;
        if ((err = check_number(o, err ? UINT64_MAX : v, why, why_len)) != NULL)
            return err;
        switch (o->type) {
        case OPT_MIB: *(size_t *)field = (size_t)v * MiB; break; /* hi <= SIZE_MAX / MiB */
        case OPT_KIB: *(size_t *)field = (size_t)v * KiB; break;
        case OPT_SIZE: *(size_t *)field = (size_t)v; break;
        case OPT_INT: *(int *)field = (int)v; break;       /* hi <= INT_MAX */
        case OPT_UINT: *(unsigned *)field = (unsigned)v; break;
        case OPT_ADDR:
            /* Its multiple of sim_granularity_kb is checked by conf_parse at the end, against the
             * granularity the whole text leaves, whichever key comes first. */
            *(uint64_t *)field = v;
            break;
        default: break;
        }
        return NULL;
    case OPT_FRACTION: {
        double d;
        if ((err = parse_double(val, len, &d)) != NULL)
            return err;
        bool open = (o->flags & OPT_OPEN_HI) != 0;
        /* Written so that NaN (not producible by parse_double, but cheap to refuse) fails. */
        if (!(d >= (double)o->lo && (open ? d < (double)o->hi : d <= (double)o->hi))) {
            snprintf(why, why_len, "must be in [%llu, %llu%s", (unsigned long long)o->lo,
                     (unsigned long long)o->hi, open ? ")" : "]");
            return why;
        }
        *(double *)field = d;
        return NULL;
    }
    case OPT_ROUNDUP: {
        unsigned div[CONF_ROUNDUP_INTERVALS];
        memcpy(div, field, sizeof div);
        if ((err = parse_roundup(o, val, len, div, why, why_len)) != NULL)
            return err;
        memcpy(field, div, sizeof div);
        return NULL;
    }
    case OPT_PATH: {
        if (len > o->hi) {
            snprintf(why, why_len, "too long (at most %llu bytes)", (unsigned long long)o->hi);
            return why;
        }
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)val[i];
            if (ch < 0x20 || ch == 0x7f)
                return "a path may not hold control characters";
            if (ch == ',' || ch == '[' || ch == ']')
                return "a path may not hold ',', '[' or ']' (they separate CUALLOC_CONF entries)";
        }
        memcpy(field, val, len);
        field[len] = '\0';
        return NULL;
    }
    case OPT_DRIVER:
        if (span_is(val, len, "cuda", true))
            *(driver_kind_t *)field = DRIVER_CUDA;
        else if (span_is(val, len, "sim", true))
            *(driver_kind_t *)field = DRIVER_SIM;
        else
            return "must be cuda or sim";
        return NULL;
    case OPT_SIM_FAIL: {
        if (span_is(val, len, "none", true)) {
            c->sim_fail_op = SIM_OP_COUNT;
            c->sim_fail_after = 0;
            c->sim_fail_count = 0;
            c->sim_fail_error = 0;
            return NULL;
        }
        const char *at = memchr(val, '@', len);
        if (!at)
            return "expected OP@AFTER, OP@AFTER*COUNT or either with =ERROR (e.g. map@3, phys_create@0*9=700), or none";
        const char *eq = memchr(at, '=', (size_t)(val + len - at));
        uint64_t error = 0;
        if (eq) {
            if (parse_u64(eq + 1, (size_t)(val + len - eq - 1), false, &error) != NULL || error == 0 || error > 999)
                return "ERROR is not a CUresult from 1 to 999";
            len = (size_t)(eq - val);
        }
        size_t op_len = (size_t)(at - val);
        sim_op_t op = SIM_OP_COUNT;
        for (unsigned i = 0; i < SIM_OP_COUNT; i++)
            if (sim_op_names[i] && span_is(val, op_len, sim_op_names[i], false))
                op = (sim_op_t)i;
        if (op == SIM_OP_COUNT) {
            size_t n = (size_t)snprintf(why, why_len, "unknown operation (one of");
            for (unsigned i = 0; i < SIM_OP_COUNT && n < why_len; i++)
                n += (size_t)snprintf(why + n, why_len - n, "%s %s", i ? "," : "",
                                      sim_op_names[i]);
            if (n < why_len)
                snprintf(why + n, why_len - n, ")");
            return why;
        }
        const char *rest = at + 1, *star = memchr(rest, '*', (size_t)(val + len - rest));
        uint64_t after, count = 1;
        size_t after_len = (size_t)((star ? star : val + len) - rest);
        if (parse_u64(rest, after_len, false, &after) != NULL || after > o->hi)
            return "AFTER is not a whole number below 2^32";
        if (star) {
            if (parse_u64(star + 1, (size_t)(val + len - star - 1), false, &count) != NULL ||
                count == 0 || count > o->hi)
                return "COUNT is not a whole number from 1 to 2^32-1";
        }
        c->sim_fail_op = op;
        c->sim_fail_after = (unsigned)after;
        c->sim_fail_count = (unsigned)count;
        c->sim_fail_error = (unsigned)error;
        return NULL;
    }
    }
    return "internal error: unknown option type";
}

/* Writes option o's value in *c as conf_parse reads it. Returns snprintf's count. */
static int opt_format(const opt_t *o, const conf_t *c, char *buf, size_t len)
{
    const char *field = (const char *)c + o->offset;
    switch (o->type) {
    case OPT_BOOL:
        return snprintf(buf, len, "%s", *(const bool *)field ? "True" : "False");
    case OPT_MIB: {
        size_t v = *(const size_t *)field;
        if ((o->flags & OPT_UNLIMITED) && v == SIZE_MAX)
            return snprintf(buf, len, "unlimited");
        return snprintf(buf, len, "%zu", v / MiB);
    }
    case OPT_KIB:
        return snprintf(buf, len, "%zu", *(const size_t *)field / KiB);
    case OPT_SIZE:
        return snprintf(buf, len, "%zu", *(const size_t *)field);
    case OPT_INT:
        return snprintf(buf, len, "%d", *(const int *)field);
    case OPT_UINT:
        return snprintf(buf, len, "%u", *(const unsigned *)field);
    case OPT_ADDR:
        return snprintf(buf, len, "0x%llx", (unsigned long long)*(const uint64_t *)field);
    case OPT_FRACTION: {
        char tmp[48];
        format_double(*(const double *)field, tmp, sizeof tmp);
        return snprintf(buf, len, "%s", tmp);
    }
    case OPT_ROUNDUP: {
        const unsigned *div = (const unsigned *)field;
        bool same = true;
        for (unsigned i = 1; i < CONF_ROUNDUP_INTERVALS; i++)
            same = same && div[i] == div[0];
        if (same)
            return snprintf(buf, len, "%u", div[0]);
        /* Every interval named, by its lowest size in MiB: reads back exactly. */
        int n = 0;
        for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++) {
            size_t room = (size_t)n < len ? len - (size_t)n : 0;
            n += snprintf(room ? buf + n : NULL, room, "%s%llu:%u", i ? "," : "[",
                          1ull << i, div[i]);
        }
        size_t room = (size_t)n < len ? len - (size_t)n : 0;
        n += snprintf(room ? buf + n : NULL, room, "]");
        return n;
    }
    case OPT_PATH:
        return snprintf(buf, len, "%s", field);
    case OPT_DRIVER:
        return snprintf(buf, len, "%s", *(const driver_kind_t *)field == DRIVER_SIM ? "sim" : "cuda");
    case OPT_SIM_FAIL:
        if (c->sim_fail_op == SIM_OP_COUNT || (unsigned)c->sim_fail_op > SIM_OP_COUNT)
            return snprintf(buf, len, "none");
        if (c->sim_fail_error)
            return snprintf(buf, len, "%s@%u*%u=%u", sim_op_name(c->sim_fail_op), c->sim_fail_after,
                            c->sim_fail_count, c->sim_fail_error);
        return snprintf(buf, len, "%s@%u*%u", sim_op_name(c->sim_fail_op), c->sim_fail_after,
                        c->sim_fail_count);
    }
    return snprintf(buf, len, "?");
}

/* ------------------------------------------------------------------------ reporting */

static void report_bad(const opt_t *o, const conf_t *c, const char *val, size_t len,
                       const char *why)
{
    char shown[CONF_SHOW_MAX], cur[CONF_VALUE_MAX];
    show(shown, sizeof shown, val, len);
    opt_format(o, c, cur, sizeof cur);
    if (strcmp(cur, o->def) == 0 && !*o->def) /* a path whose default is none: the feature stays off */
        cua_error("CUALLOC_CONF: bad value '%s' for key '%s': %s; leaving it unset (off)", shown, o->key, why);
    else if (strcmp(cur, o->def) == 0)
        cua_error("CUALLOC_CONF: bad value '%s' for key '%s': %s; using the default %s", shown,
                  o->key, why, o->def);
    else
        cua_error("CUALLOC_CONF: bad value '%s' for key '%s': %s; keeping %s", shown, o->key,
                  why, cur);
}

static void report_unknown(const char *key, size_t len)
{
    char shown[CONF_SHOW_MAX], known[768];
    size_t n = 0;
    show(shown, sizeof shown, key, len);
    known[0] = '\0';
    for (size_t i = 0; i < NOPTS && n < sizeof known; i++)
        n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", opts[i].key);
    cua_error("CUALLOC_CONF: unknown key '%s' (known keys: %s)", shown, known);
}

/* PyTorch's PYTORCH_CUDA_ALLOC_CONF keys that cualloc has no use for, and why: a configuration
 * copied from PyTorch gets a message that says so instead of "unknown key". */
#define PINNED_WHY                                                                               \
    "it configures PyTorch's pinned host memory, which cualloc does not allocate: keep it in "   \
    "PYTORCH_CUDA_ALLOC_CONF"
static const struct { const char *key, *why; } torch_only_keys[] = {
    {"backend", "cualloc is the allocator; PyTorch's choice between its own and cudaMallocAsync "
                "does not apply"},
    {"release_lock_on_cudamalloc", "it concerns PyTorch's own allocator lock: keep it in "
                                   "PYTORCH_CUDA_ALLOC_CONF"},
    /* PyTorch's native policy lets an oversize cached block (max_split_size_mb) serve a request
     * less than this much smaller than itself; cualloc's classic segments keep its default
     * (heap.c's PT_LARGE_BUFFER). */
    {"max_non_split_rounding_mb", "cualloc's classic segments keep PyTorch's default: an oversize cached "
                                  "block serves only requests less than 20 MiB smaller than itself"},
    {"pinned_use_cuda_host_register", PINNED_WHY},
    {"pinned_num_register_threads", PINNED_WHY},
    {"pinned_use_background_threads", PINNED_WHY},
    {"pinned_reserve_segment_size_mb", PINNED_WHY},
};

static bool report_torch_only(const char *key, size_t len)
{
    for (size_t i = 0; i < sizeof torch_only_keys / sizeof torch_only_keys[0]; i++) {
        if (span_is(key, len, torch_only_keys[i].key, false)) {
            cua_error("CUALLOC_CONF: '%s' is a PYTORCH_CUDA_ALLOC_CONF key that cualloc does not take (%s); "
                      "ignored", torch_only_keys[i].key, torch_only_keys[i].why);
            return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------------------ entry points */

/* Applies one entry "key:value" (already trimmed, nonempty). Returns 1 for a problem, else 0. */
static int conf_apply(const char *s, size_t len, conf_t *c)
{
    const char *colon = memchr(s, ':', len);
    const char *key = s, *val = colon ? colon + 1 : s + len;
    size_t key_len = colon ? (size_t)(colon - s) : len;
    size_t val_len = (size_t)(s + len - val);
    char why[256];

    trim(&key, &key_len);
    trim(&val, &val_len);
    const opt_t *o = NULL;
    for (size_t i = 0; i < NOPTS && key_len <= CONF_KEY_MAX; i++)
        if (span_is(key, key_len, opts[i].key, false))
            o = &opts[i];
    if (!o) {
        if (!report_torch_only(key, key_len))
            report_unknown(key, key_len);
        return 1;
    }
    const char *err;
    if (!colon)
        err = "missing ':' and a value";
    else if (val_len == 0 && o->type != OPT_PATH) /* an empty path turns its feature off */
        err = "empty value";
    else if (val_len > CONF_VALUE_MAX) {
        snprintf(why, sizeof why, "too long (%zu characters, at most %d)", val_len, CONF_VALUE_MAX);
        err = why;
    }
    else
        err = opt_parse(o, val, val_len, c, why, sizeof why);
    if (err) {
        report_bad(o, c, val, val_len, err);
        return 1;
    }
    return 0;
}

int conf_parse(const char *text, conf_t *out)
{
    int problems = 0;
    uint64_t va_base_before = out->sim_va_base;
    if (!text)
        text = "";
    const char *p = text;
    while (*p) {
        /* One entry: up to a comma outside brackets. An unmatched ']' does not lower the depth
         * below zero; an unclosed '[' runs to the end (and the value parser says so). */
        const char *start = p;
        int depth = 0;
        for (; *p && !(*p == ',' && depth == 0); p++) {
            if (*p == '[')
                depth++;
            else if (*p == ']' && depth > 0)
                depth--;
        }
        const char *entry = start;
        size_t len = (size_t)(p - start);
        if (*p == ',')
            p++;
        trim(&entry, &len);
        if (len > 0)
            problems += conf_apply(entry, len, out);
    }
    /* sim_va_base must be a multiple of the granularity the text leaves. If not, go back to the
     * earlier address, rounded to the granularity if even that no longer fits (up, unless that
     * leaves the accepted range). */
    size_t g = out->sim_granularity;
    if (g && out->sim_va_base % g != 0) {
        uint64_t fixed = va_base_before;
        if (fixed % g != 0) {
            uint64_t down = fixed / g * g, up = down + g; /* both below 2^57: no overflow */
            fixed = up <= VA_BASE_MAX ? up : down;
        }
        cua_error("CUALLOC_CONF: sim_va_base 0x%llx is not a multiple of sim_granularity_kb %zu; "
                  "using 0x%llx",
                  (unsigned long long)out->sim_va_base, g / KiB, (unsigned long long)fixed);
        out->sim_va_base = fixed;
        problems++;
    }
    /* A ring needs a bound: an unbounded file never wraps, and trace_ring alone would do nothing
     * without a word. */
    if (out->trace_ring && out->trace_max == 0) {
        cua_error("CUALLOC_CONF: trace_ring has no effect without trace_max_mb (an unbounded trace file never "
                  "wraps); add trace_max_mb:N to keep the newest N MiB");
        problems++;
    }
    return problems;
}

void conf_defaults(conf_t *out)
{
    memset(out, 0, sizeof *out);
    /* The table's default texts are the defaults: parse each (a failure is a bug in the table,
     * caught by test_conf). */
    for (size_t i = 0; i < NOPTS; i++) {
        char why[256];
        const opt_t *o = &opts[i];
        if (opt_parse(o, o->def, strlen(o->def), out, why, sizeof why) != NULL)
            cua_error("internal error: bad default '%s' for key '%s'", o->def, o->key);
    }
}

void conf_load(conf_t *out)
{
    conf_defaults(out);
    conf_parse(getenv("CUALLOC_CONF"), out);
}

size_t conf_format(const conf_t *c, char *buf, size_t len)
{
    size_t n = 0;
    if (len > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < NOPTS; i++) {
        char val[CONF_VALUE_MAX];
        opt_format(&opts[i], c, val, sizeof val);
        if ((opts[i].flags & OPT_OMIT_EMPTY) && !val[0])
            continue;
        size_t room = n < len ? len - n : 0;
        n += (size_t)snprintf(room ? buf + n : NULL, room, "%s%s:%s", n ? "," : "", opts[i].key,
                              val);
    }
    return n;
}

void conf_write_markdown(FILE *out)
{
    fprintf(out, "| key | default | meaning |\n| --- | --- | --- |\n");
    for (size_t i = 0; i < NOPTS; i++)
        fprintf(out, "| `%s` | `%s` | %s |\n", opts[i].key, opts[i].def[0] ? opts[i].def : "\"\"",
                opts[i].doc);
}

size_t conf_capacity(const conf_t *c, size_t device_total) {
    size_t cap = device_total;
    if (c->per_process_memory_fraction > 0) {
        size_t f = (size_t)(c->per_process_memory_fraction * (double)device_total);
        if (f < cap) cap = f;
    }
    if (c->max_memory && c->max_memory < cap) cap = c->max_memory;
    return cap;
}
