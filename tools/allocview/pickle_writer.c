/* pickle_writer.c — see pickle_writer.h. */
#include "pickle_writer.h"
#include "xalloc.h"

#include <stdlib.h>
#include <string.h>

/* Opcodes (Python's Lib/pickle.py names). */
enum {
    OP_MARK = '(', OP_STOP = '.', OP_BININT = 'J', OP_BININT1 = 'K', OP_BININT2 = 'M', OP_NONE = 'N',
    OP_BINFLOAT = 'G', OP_BINUNICODE = 'X', OP_APPENDS = 'e', OP_BINGET = 'h', OP_LONG_BINGET = 'j',
    OP_EMPTY_LIST = ']', OP_SETITEMS = 'u', OP_EMPTY_DICT = '}', OP_PROTO = 0x80, OP_TUPLE2 = 0x86,
    OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89, OP_LONG1 = 0x8a, OP_SHORT_BINUNICODE = 0x8c, OP_MEMOIZE = 0x94,
};

/* A memoized value by key: the key's bytes live in the arena at off. Keys of pkw_str_memo (the
 * string itself) and of pkw_memoize_keyed (the caller's) are kept apart by ns. */
typedef struct pkw_sym { uint64_t hash, memo; size_t off, len; uint8_t ns; bool used; } pkw_sym_t;
enum { SYM_STRING = 0, SYM_CALLER = 1 };

/* An open container: entries written in the current batch, whether it is a dict. */
typedef struct pkw_open { uint32_t count; bool dict; } pkw_open_t;

struct pkw {
    FILE *out;
    uint64_t bytes, memo_next;
    bool failed;
    const char *why;
    pkw_open_t *open;
    size_t nopen, capopen;
    pkw_sym_t *syms;
    size_t symcap, symcount;
    char *arena;
    size_t arena_len, arena_cap;
    char *scratch; /* UTF-8 repair */
    size_t scratch_cap;
};

static void fail(pkw_t *w, const char *why)
{
    if (!w->failed) {
        w->failed = true;
        w->why = why;
    }
}

static void put(pkw_t *w, const void *p, size_t n)
{
    if (w->failed)
        return;
    if (fwrite(p, 1, n, w->out) != n)
        fail(w, "write failed");
    w->bytes += n;
}

static void op(pkw_t *w, uint8_t code)
{
    put(w, &code, 1);
}

static void put_u32(pkw_t *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

pkw_t *pkw_new(FILE *out)
{
    pkw_t *w = xcalloc(1, sizeof *w);
    w->out = out;
    w->symcap = 1024;
    w->syms = xcalloc(w->symcap, sizeof *w->syms);
    uint8_t proto[2] = {OP_PROTO, 4};
    put(w, proto, 2);
    return w;
}

bool pkw_finish(pkw_t *w, char *err, size_t errlen)
{
    if (w->nopen)
        fail(w, "a container was left open (writer misuse)");
    op(w, OP_STOP);
    if (!w->failed && fflush(w->out) != 0)
        fail(w, "write failed");
    bool ok = !w->failed;
    if (!ok && err && errlen)
        snprintf(err, errlen, "%s", w->why);
    free(w->open);
    free(w->syms);
    free(w->arena);
    free(w->scratch);
    free(w);
    return ok;
}

uint64_t pkw_bytes(const pkw_t *w)
{
    return w->bytes;
}

void pkw_none(pkw_t *w)
{
    op(w, OP_NONE);
}

void pkw_bool(pkw_t *w, bool v)
{
    op(w, v ? OP_NEWTRUE : OP_NEWFALSE);
}

/* LONG1: the fewest little-endian two's-complement bytes that keep the sign (Python's encoding).
 * `negative` says how to read bits: as an int64 below zero, or as a uint64. */
static void long1(pkw_t *w, uint64_t bits, bool negative)
{
    size_t n = 1;
    if (negative) {
        int64_t x = (int64_t)bits;
        while (n < 8 && x < -((int64_t)1 << (8 * n - 1)))
            n++;
    } else {
        while (n < 8 && bits >= (uint64_t)1 << (8 * n - 1))
            n++;
    }
    uint8_t b[9];
    for (size_t i = 0; i < 8; i++)
        b[i] = (uint8_t)(bits >> (8 * i));
    if (!negative && n == 8 && bits >= (uint64_t)1 << 63) {
        b[8] = 0; /* 2^63 and above: a ninth byte keeps it positive */
        n = 9;
    }
    uint8_t hdr[2] = {OP_LONG1, (uint8_t)n};
    put(w, hdr, 2);
    put(w, b, n);
}

void pkw_uint(pkw_t *w, uint64_t v)
{
    if (v < 0x100) {
        uint8_t b[2] = {OP_BININT1, (uint8_t)v};
        put(w, b, 2);
    } else if (v < 0x10000) {
        uint8_t b[3] = {OP_BININT2, (uint8_t)v, (uint8_t)(v >> 8)};
        put(w, b, 3);
    } else if (v < 0x80000000u) {
        op(w, OP_BININT);
        put_u32(w, (uint32_t)v);
    } else {
        long1(w, v, false);
    }
}

void pkw_int(pkw_t *w, int64_t v)
{
    if (v >= 0)
        pkw_uint(w, (uint64_t)v);
    else if (v >= INT32_MIN) {
        op(w, OP_BININT);
        put_u32(w, (uint32_t)(int32_t)v);
    } else {
        long1(w, (uint64_t)v, true);
    }
}

void pkw_float(pkw_t *w, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t b[9] = {OP_BINFLOAT};
    for (int i = 0; i < 8; i++)
        b[1 + i] = (uint8_t)(bits >> (56 - 8 * i)); /* big-endian */
    put(w, b, 9);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one (overlong forms,
 * surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/* s as valid UTF-8: s itself when it is, else a repaired copy in w->scratch. */
static const char *valid_utf8(pkw_t *w, const char *s, size_t len, size_t *outlen)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t k = utf8_seq(u + i, len - i);
        if (!k)
            break;
        i += k;
    }
    *outlen = len;
    if (i == len)
        return s;
    size_t need = len * 3 + 1; /* each bad byte becomes three */
    if (need > w->scratch_cap) {
        w->scratch = xrealloc(w->scratch, need);
        w->scratch_cap = need;
    }
    size_t o = 0;
    for (i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        if (k) {
            memcpy(w->scratch + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(w->scratch + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *outlen = o;
    return w->scratch;
}

void pkw_str(pkw_t *w, const char *s, size_t len)
{
    size_t n;
    const char *v = valid_utf8(w, s, len, &n);
    if (n < 0x100) {
        uint8_t b[2] = {OP_SHORT_BINUNICODE, (uint8_t)n};
        put(w, b, 2);
    } else {
        if (n > 0xffffffffu) {
            fail(w, "string longer than 4 GiB");
            return;
        }
        op(w, OP_BINUNICODE);
        put_u32(w, (uint32_t)n);
    }
    put(w, v, n);
}

void pkw_cstr(pkw_t *w, const char *s)
{
    pkw_str(w, s, strlen(s));
}

uint64_t pkw_memoize(pkw_t *w)
{
    op(w, OP_MEMOIZE);
    return w->memo_next++;
}

void pkw_get(pkw_t *w, uint64_t index)
{
    if (index < 0x100) {
        uint8_t b[2] = {OP_BINGET, (uint8_t)index};
        put(w, b, 2);
    } else if (index <= 0xffffffffu) {
        op(w, OP_LONG_BINGET);
        put_u32(w, (uint32_t)index);
    } else {
        fail(w, "more than 2^32 memoized values");
    }
}

static uint64_t str_hash(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static void sym_grow(pkw_t *w)
{
    size_t cap = w->symcap * 2;
    pkw_sym_t *n = xcalloc(cap, sizeof *n);
    for (size_t i = 0; i < w->symcap; i++)
        if (w->syms[i].used)
            for (size_t j = w->syms[i].hash & (cap - 1);; j = (j + 1) & (cap - 1))
                if (!n[j].used) {
                    n[j] = w->syms[i];
                    break;
                }
    free(w->syms);
    w->syms = n;
    w->symcap = cap;
}

/* The slot of (ns, key): *found when it holds that key's memo index, else the empty slot where
 * sym_add puts it (valid until the table next grows). */
static pkw_sym_t *sym_slot(pkw_t *w, uint8_t ns, const char *key, size_t len, bool *found)
{
    if ((w->symcount + 1) * 2 > w->symcap)
        sym_grow(w);
    uint64_t h = str_hash(key, len) ^ ns;
    for (size_t j = h & (w->symcap - 1);; j = (j + 1) & (w->symcap - 1)) {
        pkw_sym_t *e = &w->syms[j];
        *found = e->used;
        if (!e->used || (e->hash == h && e->ns == ns && e->len == len && memcmp(w->arena + e->off, key, len) == 0))
            return e;
    }
}

/* Fills the empty slot e (from sym_slot) with (ns, key) -> memo. */
static void sym_add(pkw_t *w, pkw_sym_t *e, uint8_t ns, const char *key, size_t len, uint64_t memo)
{
    if (w->arena_len + len > w->arena_cap) {
        size_t cap = (w->arena_cap ? w->arena_cap * 2 : 65536);
        while (cap < w->arena_len + len)
            cap *= 2;
        w->arena = xrealloc(w->arena, cap);
        w->arena_cap = cap;
    }
    memcpy(w->arena + w->arena_len, key, len);
    *e = (pkw_sym_t){.hash = str_hash(key, len) ^ ns, .memo = memo, .off = w->arena_len, .len = len, .ns = ns,
                     .used = true};
    w->arena_len += len;
    w->symcount++;
}

void pkw_str_memo(pkw_t *w, const char *s, size_t len)
{
    bool found;
    pkw_sym_t *e = sym_slot(w, SYM_STRING, s, len, &found);
    if (found) {
        pkw_get(w, e->memo);
        return;
    }
    pkw_str(w, s, len);
    sym_add(w, e, SYM_STRING, s, len, pkw_memoize(w));
}

bool pkw_get_keyed(pkw_t *w, const char *key, size_t len)
{
    bool found;
    pkw_sym_t *e = sym_slot(w, SYM_CALLER, key, len, &found);
    if (found)
        pkw_get(w, e->memo);
    return found;
}

void pkw_memoize_keyed(pkw_t *w, const char *key, size_t len)
{
    uint64_t memo = pkw_memoize(w);
    bool found;
    pkw_sym_t *e = sym_slot(w, SYM_CALLER, key, len, &found); /* again: writing the value may have grown the table */
    if (!found)
        sym_add(w, e, SYM_CALLER, key, len, memo);
}

static void open_push(pkw_t *w, bool dict)
{
    if (w->nopen == w->capopen) {
        size_t cap = w->capopen ? w->capopen * 2 : 16;
        w->open = xrealloc(w->open, cap * sizeof *w->open);
        w->capopen = cap;
    }
    w->open[w->nopen++] = (pkw_open_t){.count = 0, .dict = dict};
    op(w, dict ? OP_EMPTY_DICT : OP_EMPTY_LIST);
    op(w, OP_MARK);
}

/* Before an entry: a full batch is closed and a new one opened. */
static void entry(pkw_t *w, bool dict)
{
    if (!w->nopen || w->open[w->nopen - 1].dict != dict) {
        fail(w, dict ? "a dict key outside a dict (writer misuse)" : "a list item outside a list (writer misuse)");
        return;
    }
    pkw_open_t *o = &w->open[w->nopen - 1];
    if (o->count == PKW_BATCH) {
        op(w, dict ? OP_SETITEMS : OP_APPENDS);
        op(w, OP_MARK);
        o->count = 0;
    }
    o->count++;
}

static void open_pop(pkw_t *w, bool dict)
{
    if (!w->nopen || w->open[w->nopen - 1].dict != dict) {
        fail(w, "containers closed out of order (writer misuse)");
        return;
    }
    w->nopen--;
    op(w, dict ? OP_SETITEMS : OP_APPENDS);
}

void pkw_dict_begin(pkw_t *w)
{
    open_push(w, true);
}

void pkw_key(pkw_t *w, const char *key)
{
    entry(w, true);
    pkw_str_memo(w, key, strlen(key));
}

void pkw_dict_end(pkw_t *w)
{
    open_pop(w, true);
}

void pkw_list_begin(pkw_t *w)
{
    open_push(w, false);
}

void pkw_item(pkw_t *w)
{
    entry(w, false);
}

void pkw_list_end(pkw_t *w)
{
    open_pop(w, false);
}

void pkw_tuple2(pkw_t *w)
{
    op(w, OP_TUPLE2);
}
