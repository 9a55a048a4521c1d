/* fuzz_pickle.c — libFuzzer target for allocview's pickle reader (tools/allocview/pickle.c): any
 * byte string must be parsed or refused with a message — never a crash, an out-of-bounds read or
 * unbounded memory (small limits here) — and a parsed document's values must be walkable.
 * Build: see tools/run-tests.sh (the sources line below).
 */
// sources: tools/allocview/pickle.c tools/allocview/xalloc.c
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../tools/allocview/pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Visits values to a bounded depth and a bounded number of visits: documents may share values
 * (and hold cycles) through the memo, so an unbounded walk of the expanded tree is exponential. */
static size_t visits_left;

static size_t walk(const py_t *v, int depth)
{
    if (!v || depth > 16 || visits_left == 0)
        return 0;
    visits_left--;
    size_t n = 1;
    char buf[64];
    int64_t i;
    double d;
    py_as_int(v, &i);
    py_as_double(v, &d);
    py_as_cstr(v, buf, sizeof buf);
    if (v->kind == PY_LIST || v->kind == PY_TUPLE || v->kind == PY_DICT)
        for (size_t k = 0; k < v->u.seq.n && k < 64; k++)
            n += walk(v->u.seq.v[k], depth + 1);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    pk_limits_t lim = {.max_depth = 64, .max_stack = 1 << 16, .max_memo = 1 << 16, .max_bytes = 64u << 20};
    pk_doc_t *doc = pk_load(data, size, &lim, err, sizeof err);
    if (!doc) {
        if (!err[0] || !memchr(err, '\0', sizeof err))
            __builtin_trap(); /* a refusal always says why */
        return 0;
    }
    visits_left = 100000;
    walk(pk_root(doc), 0);
    py_dict_get(pk_root(doc), "segments");
    pk_free(doc);
    return 0;
}
