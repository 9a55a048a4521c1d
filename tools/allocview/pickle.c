/* pickle.c — the allow-list pickle reader (pickle.h). A stack machine over the opcodes of
 * Lib/pickletools.py; no recursion, so input nesting cannot exhaust the C stack. */
#include "pickle.h"
#include "xalloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PY_MARK 0xff /* the MARK sentinel on the value stack (internal) */

typedef struct chunk { struct chunk *next; size_t used, size; } chunk_t;

struct pk_doc {
    chunk_t *chunks;
    size_t bytes, max_bytes;
    py_t *root;
};

static const struct { uint8_t op; const char *name; } op_names[] = {
    {'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"}, {'F', "FLOAT"},
    {'I', "INT"}, {'J', "BININT"}, {'K', "BININT1"}, {'L', "LONG"}, {'M', "BININT2"}, {'N', "NONE"},
    {'P', "PERSID"}, {'Q', "BINPERSID"}, {'R', "REDUCE"}, {'S', "STRING"}, {'T', "BINSTRING"},
    {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"}, {'X', "BINUNICODE"}, {'a', "APPEND"}, {'b', "BUILD"},
    {'c', "GLOBAL"}, {'d', "DICT"}, {'}', "EMPTY_DICT"}, {'e', "APPENDS"}, {'g', "GET"}, {'h', "BINGET"},
    {'i', "INST"}, {'j', "LONG_BINGET"}, {'l', "LIST"}, {']', "EMPTY_LIST"}, {'o', "OBJ"}, {'p', "PUT"},
    {'q', "BINPUT"}, {'r', "LONG_BINPUT"}, {'s', "SETITEM"}, {'t', "TUPLE"}, {')', "EMPTY_TUPLE"},
    {'u', "SETITEMS"}, {'G', "BINFLOAT"}, {0x80, "PROTO"}, {0x81, "NEWOBJ"}, {0x82, "EXT1"},
    {0x83, "EXT2"}, {0x84, "EXT4"}, {0x85, "TUPLE1"}, {0x86, "TUPLE2"}, {0x87, "TUPLE3"},
    {0x88, "NEWTRUE"}, {0x89, "NEWFALSE"}, {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"}, {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"}, {0x8e, "BINBYTES8"},
    {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x92, "NEWOBJ_EX"},
    {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"}, {0x95, "FRAME"}, {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"},
};

const char *pk_opcode_name(uint8_t op)
{
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
        if (op_names[i].op == op)
            return op_names[i].name;
    return NULL;
}

/* ------------------------------------------------------------------------------ arena */

static void *arena_alloc(pk_doc_t *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n > d->max_bytes || d->bytes > d->max_bytes - n)
        return NULL;
    chunk_t *c = d->chunks;
    if (!c || c->size - c->used < n) {
        size_t sz = n + sizeof(chunk_t) > 1u << 20 ? n + sizeof(chunk_t) : 1u << 20;
        size_t hdr = (sizeof(chunk_t) + 15) & ~(size_t)15;
        c = xmalloc(hdr + sz);
        c->next = d->chunks;
        c->used = hdr;
        c->size = hdr + sz;
        d->chunks = c;
    }
    void *p = (char *)c + c->used;
    c->used += n;
    d->bytes += n;
    return p;
}

void pk_free(pk_doc_t *d)
{
    if (!d)
        return;
    chunk_t *c = d->chunks;
    while (c) {
        chunk_t *n = c->next;
        free(c);
        c = n;
    }
    free(d);
}

const py_t *pk_root(const pk_doc_t *d) { return d ? d->root : NULL; }
size_t pk_bytes_used(const pk_doc_t *d) { return d ? d->bytes : 0; }

/* ------------------------------------------------------------------------------ parser */

typedef struct parser {
    pk_doc_t *doc;
    const uint8_t *p;
    size_t len, pos;
    size_t op_at;          /* offset of the opcode being run */
    py_t **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    py_t **memo;
    size_t memo_cap;       /* slots allocated */
    size_t memo_next;      /* MEMOIZE's next index: the number of memo entries */
    pk_limits_t lim;
    char *err;
    size_t errlen;
    bool failed;
} parser_t;

static bool fail(parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(parser_t *ps, const char *fmt, ...)
{
    if (ps->failed)
        return false;
    ps->failed = true;
    if (ps->err && ps->errlen) {
        int n = snprintf(ps->err, ps->errlen, "offset %zu: ", ps->op_at);
        if (n >= 0 && (size_t)n < ps->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return false;
}

static bool need(parser_t *ps, size_t n)
{
    if (ps->len - ps->pos < n)
        return fail(ps, "truncated: %s needs %zu more bytes, %zu left", pk_opcode_name(ps->p[ps->op_at]), n,
                    ps->len - ps->pos);
    return true;
}

static uint64_t rd_le(parser_t *ps, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)ps->p[ps->pos + i] << (8 * i);
    ps->pos += n;
    return v;
}

static py_t *new_val(parser_t *ps, uint8_t kind)
{
    py_t *v = arena_alloc(ps->doc, sizeof *v);
    if (!v) {
        fail(ps, "memory limit (%zu bytes) reached", ps->lim.max_bytes);
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->kind = kind;
    return v;
}

/* Host-side tables count against the same budget as the arena. */
static bool grow(parser_t *ps, void **arr, size_t *cap, size_t elem, size_t want, size_t limit, const char *what)
{
    if (want <= *cap)
        return true;
    if (want > limit)
        return fail(ps, "%s limit (%zu) exceeded", what, limit);
    size_t nc = *cap ? *cap : 64;
    while (nc < want)
        nc *= 2;
    if (nc > limit)
        nc = limit;
    size_t add = (nc - *cap) * elem;
    if (add > ps->doc->max_bytes || ps->doc->bytes > ps->doc->max_bytes - add)
        return fail(ps, "memory limit (%zu bytes) reached", ps->lim.max_bytes);
    void *n = xrealloc(*arr, nc * elem);
    memset((char *)n + *cap * elem, 0, (nc - *cap) * elem);
    ps->doc->bytes += add;
    *arr = n;
    *cap = nc;
    return true;
}

static bool push(parser_t *ps, py_t *v)
{
    if (!v)
        return false;
    if (!grow(ps, (void **)&ps->stack, &ps->stack_cap, sizeof *ps->stack, ps->sp + 1, ps->lim.max_stack, "stack"))
        return false;
    ps->stack[ps->sp++] = v;
    return true;
}

/* The stack's items from index i on (none yet pushed: the stack may not exist, and NULL + 0 is
 * undefined behaviour in C). */
static py_t *const *stack_from(const parser_t *ps, size_t i)
{
    return ps->stack ? ps->stack + i : NULL;
}

static py_t *pop(parser_t *ps)
{
    if (ps->sp == 0 || (ps->nmarks && ps->sp <= ps->marks[ps->nmarks - 1])) {
        fail(ps, "%s on an empty stack", pk_opcode_name(ps->p[ps->op_at]));
        return NULL;
    }
    return ps->stack[--ps->sp];
}

static py_t *top(parser_t *ps)
{
    if (ps->sp == 0 || (ps->nmarks && ps->sp <= ps->marks[ps->nmarks - 1])) {
        fail(ps, "%s on an empty stack", pk_opcode_name(ps->p[ps->op_at]));
        return NULL;
    }
    return ps->stack[ps->sp - 1];
}

/* Pops to the last MARK: the items are stack[*first .. sp). */
static bool pop_mark(parser_t *ps, size_t *first)
{
    if (ps->nmarks == 0)
        return fail(ps, "%s without a MARK", pk_opcode_name(ps->p[ps->op_at]));
    *first = ps->marks[--ps->nmarks];
    return true;
}

static bool seq_append(parser_t *ps, py_t *seq, py_t *const *items, size_t n)
{
    if (n == 0)
        return true;
    if (seq->u.seq.n + n > seq->u.seq.cap) {
        size_t nc = seq->u.seq.cap ? seq->u.seq.cap * 2 : 4;
        while (nc < seq->u.seq.n + n)
            nc *= 2;
        py_t **v = arena_alloc(ps->doc, nc * sizeof *v);
        if (!v)
            return fail(ps, "memory limit (%zu bytes) reached", ps->lim.max_bytes);
        if (seq->u.seq.n)
            memcpy(v, seq->u.seq.v, seq->u.seq.n * sizeof *v);
        seq->u.seq.v = v;
        seq->u.seq.cap = nc;
    }
    memcpy(seq->u.seq.v + seq->u.seq.n, items, n * sizeof *items);
    seq->u.seq.n += n;
    return true;
}

static py_t *make_seq(parser_t *ps, uint8_t kind, py_t *const *items, size_t n)
{
    py_t *v = new_val(ps, kind);
    if (v && !seq_append(ps, v, items, n))
        return NULL;
    return v;
}

static bool memo_put(parser_t *ps, uint64_t idx)
{
    py_t *v = top(ps);
    if (!v)
        return false;
    if (idx >= ps->lim.max_memo)
        return fail(ps, "memo index %llu over the limit (%zu)", (unsigned long long)idx, ps->lim.max_memo);
    if (!grow(ps, (void **)&ps->memo, &ps->memo_cap, sizeof *ps->memo, (size_t)idx + 1, ps->lim.max_memo, "memo"))
        return false;
    if (!ps->memo[idx])
        ps->memo_next++; /* MEMOIZE stores at len(memo), as CPython */
    ps->memo[idx] = v;
    return true;
}

static bool memo_get(parser_t *ps, uint64_t idx)
{
    if (idx >= ps->memo_cap || !ps->memo[idx])
        return fail(ps, "memo entry %llu was never stored", (unsigned long long)idx);
    return push(ps, ps->memo[idx]);
}

static bool str_val(parser_t *ps, uint8_t kind, size_t n)
{
    if (!need(ps, n))
        return false;
    py_t *v = new_val(ps, kind);
    if (!v)
        return false;
    v->u.s.p = (const char *)ps->p + ps->pos; /* points into the input: it outlives nothing */
    v->u.s.len = n;
    ps->pos += n;
    /* copy: the caller's buffer need not outlive the document */
    char *c = arena_alloc(ps->doc, n + 1);
    if (!c)
        return fail(ps, "memory limit (%zu bytes) reached", ps->lim.max_bytes);
    memcpy(c, v->u.s.p, n);
    c[n] = '\0';
    v->u.s.p = c;
    return push(ps, v);
}

static bool setitems(parser_t *ps, py_t *dict, size_t first)
{
    if (dict->kind != PY_DICT)
        return fail(ps, "%s on a value that is not a dict", pk_opcode_name(ps->p[ps->op_at]));
    size_t n = ps->sp - first;
    if (n % 2)
        return fail(ps, "%s with an odd number of items", pk_opcode_name(ps->p[ps->op_at]));
    bool ok = seq_append(ps, dict, stack_from(ps, first), n);
    ps->sp = first;
    return ok;
}

static bool run(parser_t *ps)
{
    for (;;) {
        if (ps->pos >= ps->len) {
            ps->op_at = ps->pos;
            return fail(ps, "truncated: the pickle ends without STOP");
        }
        ps->op_at = ps->pos;
        uint8_t op = ps->p[ps->pos++];
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(ps, 1))
                return false;
            if (ps->p[ps->pos] > 5)
                return fail(ps, "pickle protocol %u is not supported (2 to 5 are)", ps->p[ps->pos]);
            ps->pos++;
            break;
        case 0x95: /* FRAME: an 8-byte length; the frame's opcodes follow inline */
            if (!need(ps, 8))
                return false;
            ps->pos += 8;
            break;
        case '.': { /* STOP */
            py_t *v = pop(ps);
            if (!v)
                return false;
            ps->doc->root = v;
            return true;
        }
        case '(': /* MARK */
            if (!grow(ps, (void **)&ps->marks, &ps->marks_cap, sizeof *ps->marks, ps->nmarks + 1, ps->lim.max_depth,
                      "nesting depth"))
                return false;
            ps->marks[ps->nmarks++] = ps->sp;
            break;
        case '0': /* POP */
            if (!pop(ps))
                return false;
            break;
        case '1': { /* POP_MARK */
            size_t first;
            if (!pop_mark(ps, &first))
                return false;
            ps->sp = first;
            break;
        }
        case '2': { /* DUP */
            py_t *v = top(ps);
            if (!v || !push(ps, v))
                return false;
            break;
        }
        case 'N':
            if (!push(ps, new_val(ps, PY_NONE)))
                return false;
            break;
        case 0x88: case 0x89: { /* NEWTRUE, NEWFALSE */
            py_t *v = new_val(ps, PY_BOOL);
            if (!v)
                return false;
            v->u.b = op == 0x88;
            if (!push(ps, v))
                return false;
            break;
        }
        case 'J': case 'K': case 'M': { /* BININT (s32), BININT1 (u8), BININT2 (u16) */
            size_t n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
            if (!need(ps, n))
                return false;
            uint64_t raw = rd_le(ps, n);
            py_t *v = new_val(ps, PY_INT);
            if (!v)
                return false;
            v->u.i = op == 'J' ? (int64_t)(int32_t)(uint32_t)raw : (int64_t)raw;
            if (!push(ps, v))
                return false;
            break;
        }
        case 0x8a: case 0x8b: { /* LONG1, LONG4: little-endian two's complement */
            size_t hdr = op == 0x8a ? 1 : 4;
            if (!need(ps, hdr))
                return false;
            uint64_t n = rd_le(ps, hdr);
            if (n > 8) {
                /* Accept redundant sign bytes (0x00 / 0xff) beyond 8 that do not change the value. */
                if (n > ps->len - ps->pos)
                    return fail(ps, "truncated: %s of %llu bytes, %zu left", pk_opcode_name(op),
                                (unsigned long long)n, ps->len - ps->pos);
                for (uint64_t i = 8; i < n; i++) {
                    uint8_t b = ps->p[ps->pos + i];
                    uint8_t sign = (ps->p[ps->pos + 7] & 0x80) ? 0xff : 0x00;
                    if (b != sign)
                        return fail(ps, "integer of %llu bytes does not fit in 64 bits", (unsigned long long)n);
                }
            } else if (n > ps->len - ps->pos) {
                return fail(ps, "truncated: %s of %llu bytes, %zu left", pk_opcode_name(op), (unsigned long long)n,
                            ps->len - ps->pos);
            } else if (0) {
                return false;
            }
            uint64_t raw = 0;
            size_t k = n > 8 ? 8 : (size_t)n;
            for (size_t i = 0; i < k; i++)
                raw |= (uint64_t)ps->p[ps->pos + i] << (8 * i);
            if (k > 0 && k < 8 && (ps->p[ps->pos + k - 1] & 0x80))
                raw |= ~(uint64_t)0 << (8 * k); /* sign-extend */
            ps->pos += (size_t)n;
            py_t *v = new_val(ps, PY_INT);
            if (!v)
                return false;
            v->u.i = (int64_t)raw;
            if (!push(ps, v))
                return false;
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE double */
            if (!need(ps, 8))
                return false;
            uint64_t raw = 0;
            for (int i = 0; i < 8; i++)
                raw = raw << 8 | ps->p[ps->pos + (size_t)i];
            ps->pos += 8;
            py_t *v = new_val(ps, PY_FLOAT);
            if (!v)
                return false;
            memcpy(&v->u.f, &raw, sizeof raw);
            if (!push(ps, v))
                return false;
            break;
        }
        case 0x8c: case 'U': case 'C': { /* SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES */
            if (!need(ps, 1))
                return false;
            size_t n = (size_t)rd_le(ps, 1);
            if (!str_val(ps, op == 'C' ? PY_BYTES : PY_STR, n))
                return false;
            break;
        }
        case 'X': case 'T': case 'B': { /* BINUNICODE, BINSTRING, BINBYTES: 4-byte length */
            if (!need(ps, 4))
                return false;
            uint64_t n = rd_le(ps, 4);
            if (op == 'T' && n >= 0x80000000u)
                return fail(ps, "BINSTRING with a negative length");
            if (!str_val(ps, op == 'B' ? PY_BYTES : PY_STR, (size_t)n))
                return false;
            break;
        }
        case 0x8d: case 0x8e: { /* BINUNICODE8, BINBYTES8 */
            if (!need(ps, 8))
                return false;
            uint64_t n = rd_le(ps, 8);
            if (n > ps->len)
                return fail(ps, "truncated: a string of %llu bytes, %zu left", (unsigned long long)n,
                            ps->len - ps->pos);
            if (!str_val(ps, op == 0x8e ? PY_BYTES : PY_STR, (size_t)n))
                return false;
            break;
        }
        case ']': case '}': case ')': /* EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE */
            if (!push(ps, new_val(ps, op == ']' ? PY_LIST : op == '}' ? PY_DICT : PY_TUPLE)))
                return false;
            break;
        case 'l': case 't': case 'd': { /* LIST, TUPLE, DICT from the items since MARK */
            size_t first;
            if (!pop_mark(ps, &first))
                return false;
            size_t n = ps->sp - first;
            if (op == 'd' && n % 2)
                return fail(ps, "DICT with an odd number of items");
            py_t *v = make_seq(ps, op == 'l' ? PY_LIST : op == 't' ? PY_TUPLE : PY_DICT, stack_from(ps, first), n);
            ps->sp = first;
            if (!push(ps, v))
                return false;
            break;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t n = (size_t)(op - 0x84);
            if (ps->sp < n || (ps->nmarks && ps->sp - n < ps->marks[ps->nmarks - 1]))
                return fail(ps, "%s needs %zu items on the stack", pk_opcode_name(op), n);
            py_t *v = make_seq(ps, PY_TUPLE, stack_from(ps, ps->sp - n), n);
            ps->sp -= n;
            if (!push(ps, v))
                return false;
            break;
        }
        case 'a': { /* APPEND */
            py_t *item = pop(ps);
            py_t *list = item ? top(ps) : NULL;
            if (!list)
                return false;
            if (list->kind != PY_LIST)
                return fail(ps, "APPEND to a value that is not a list");
            if (!seq_append(ps, list, &item, 1))
                return false;
            break;
        }
        case 'e': { /* APPENDS */
            size_t first;
            if (!pop_mark(ps, &first))
                return false;
            if (first == 0 || (ps->nmarks && first <= ps->marks[ps->nmarks - 1]))
                return fail(ps, "APPENDS without a list below its MARK");
            py_t *list = ps->stack[first - 1];
            if (list->kind != PY_LIST)
                return fail(ps, "APPENDS to a value that is not a list");
            if (!seq_append(ps, list, stack_from(ps, first), ps->sp - first))
                return false;
            ps->sp = first;
            break;
        }
        case 's': { /* SETITEM */
            if (ps->sp < 3 || (ps->nmarks && ps->sp - 3 < ps->marks[ps->nmarks - 1]))
                return fail(ps, "SETITEM needs a dict, a key and a value on the stack");
            if (!setitems(ps, ps->stack[ps->sp - 3], ps->sp - 2))
                return false;
            break;
        }
        case 'u': { /* SETITEMS */
            size_t first;
            if (!pop_mark(ps, &first))
                return false;
            if (first == 0 || (ps->nmarks && first <= ps->marks[ps->nmarks - 1]))
                return fail(ps, "SETITEMS without a dict below its MARK");
            if (!setitems(ps, ps->stack[first - 1], first))
                return false;
            break;
        }
        case 'q': case 'r': { /* BINPUT (u8), LONG_BINPUT (u32) */
            size_t n = op == 'q' ? 1 : 4;
            if (!need(ps, n) || !memo_put(ps, rd_le(ps, n)))
                return false;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (!memo_put(ps, ps->memo_next))
                return false;
            break;
        case 'h': case 'j': { /* BINGET (u8), LONG_BINGET (u32) */
            size_t n = op == 'h' ? 1 : 4;
            if (!need(ps, n) || !memo_get(ps, rd_le(ps, n)))
                return false;
            break;
        }
        default: {
            const char *name = pk_opcode_name(op);
            if (name)
                return fail(ps, "opcode %s (0x%02x) is not allowed: this reader takes plain data only (dicts, "
                                "lists, tuples, strings, numbers, booleans, None), never objects or code",
                            name, op);
            return fail(ps, "byte 0x%02x is not a pickle opcode", op);
        }
        }
    }
}

pk_doc_t *pk_load(const void *data, size_t len, const pk_limits_t *limits, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    parser_t ps;
    memset(&ps, 0, sizeof ps);
    ps.lim.max_depth = 256;
    ps.lim.max_stack = (size_t)1 << 22;
    ps.lim.max_memo = (size_t)1 << 24;
    ps.lim.max_bytes = (size_t)1 << 30;
    if (limits) {
        if (limits->max_depth) ps.lim.max_depth = limits->max_depth;
        if (limits->max_stack) ps.lim.max_stack = limits->max_stack;
        if (limits->max_memo) ps.lim.max_memo = limits->max_memo;
        if (limits->max_bytes) ps.lim.max_bytes = limits->max_bytes;
    }
    ps.doc = xcalloc(1, sizeof *ps.doc);
    ps.doc->max_bytes = ps.lim.max_bytes;
    ps.p = data;
    ps.len = len;
    ps.err = err;
    ps.errlen = errlen;
    bool ok = len > 0 ? run(&ps) : fail(&ps, "empty input");
    free(ps.stack);
    free(ps.marks);
    free(ps.memo);
    if (!ok) {
        pk_free(ps.doc);
        return NULL;
    }
    return ps.doc;
}

/* ------------------------------------------------------------------------------ access */

const py_t *py_dict_get(const py_t *d, const char *key)
{
    if (!d || d->kind != PY_DICT)
        return NULL;
    size_t kl = strlen(key);
    /* From the last pair back: a key set twice (SETITEMS may repeat one) holds its last value, as
     * in Python's dict. */
    for (size_t i = d->u.seq.n & ~(size_t)1; i >= 2;) {
        i -= 2;
        const py_t *k = d->u.seq.v[i];
        if (k->kind == PY_STR && k->u.s.len == kl && memcmp(k->u.s.p, key, kl) == 0)
            return d->u.seq.v[i + 1];
    }
    return NULL;
}

size_t py_len(const py_t *s)
{
    if (!s)
        return 0;
    if (s->kind == PY_LIST || s->kind == PY_TUPLE)
        return s->u.seq.n;
    if (s->kind == PY_DICT)
        return s->u.seq.n / 2;
    return 0;
}

const py_t *py_item(const py_t *s, size_t i)
{
    if (!s || (s->kind != PY_LIST && s->kind != PY_TUPLE) || i >= s->u.seq.n)
        return NULL;
    return s->u.seq.v[i];
}

bool py_as_int(const py_t *v, int64_t *out)
{
    if (!v)
        return false;
    if (v->kind == PY_INT) {
        *out = v->u.i;
        return true;
    }
    if (v->kind == PY_BOOL) {
        *out = v->u.b;
        return true;
    }
    return false;
}

bool py_as_double(const py_t *v, double *out)
{
    if (!v)
        return false;
    if (v->kind == PY_FLOAT) {
        *out = v->u.f;
        return true;
    }
    if (v->kind == PY_INT) {
        *out = (double)v->u.i;
        return true;
    }
    return false;
}

bool py_str_eq(const py_t *v, const char *s)
{
    return v && v->kind == PY_STR && v->u.s.len == strlen(s) && memcmp(v->u.s.p, s, v->u.s.len) == 0;
}

const char *py_as_cstr(const py_t *v, char *buf, size_t len)
{
    if (!len)
        return buf;
    buf[0] = '\0';
    if (!v || (v->kind != PY_STR && v->kind != PY_BYTES))
        return buf;
    size_t n = v->u.s.len < len - 1 ? v->u.s.len : len - 1;
    memcpy(buf, v->u.s.p, n);
    buf[n] = '\0';
    return buf;
}
