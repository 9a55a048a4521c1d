/* test_pickle_writer.c — allocview's pickle writer (tools/allocview/pickle_writer.c) against its
 * own reader (pickle.c): every integer encoding boundary (BININT1/2, BININT, LONG1 in every width,
 * negative values), strings short and long, invalid UTF-8 repaired to U+FFFD, floats, booleans,
 * None, tuples, lists and dicts past the batch size, memoized strings and values fetched with
 * BINGET and LONG_BINGET. With a path argument the same document is also written there, for
 * check_pickle_writer.py to load with Python's own pickle.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/allocview/pickle.h"
#include "../tools/allocview/pickle_writer.h"

static int failures;
#define CHECK(cond, ...)                                                                                    \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                   \
            printf(__VA_ARGS__);                                                                          \
            printf("\n");                                                                                 \
            failures++;                                                                                   \
        }                                                                                                 \
    } while (0)

static const int64_t ints[] = {
    0, 1, 255, 256, 65535, 65536, INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 32, ((int64_t)1 << 47) + 5,
    ((int64_t)1 << 55) - 1, (int64_t)1 << 55, INT64_MAX, -1, -128, -129, -32768, -32769, INT32_MIN,
    (int64_t)INT32_MIN - 1, -((int64_t)1 << 40), INT64_MIN,
};
#define NINTS (sizeof ints / sizeof ints[0])
#define BIG_LIST 2500 /* more than two batches */
#define GETS 300      /* memo indices past 255: LONG_BINGET */

static void write_doc(FILE *f)
{
    pkw_t *w = pkw_new(f);
    pkw_dict_begin(w);
    pkw_key(w, "ints");
    pkw_list_begin(w);
    for (size_t i = 0; i < NINTS; i++) {
        pkw_item(w);
        pkw_int(w, ints[i]);
    }
    pkw_list_end(w);
    pkw_key(w, "strings");
    pkw_list_begin(w);
    char long_str[300];
    memset(long_str, 'x', sizeof long_str);
    const char *strs[] = {"", "abc", "caf\xc3\xa9", "a\xff" "b", "\xed\xa0\x80", "\xf0\x9f\x98\x80", "\xc3"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        pkw_item(w);
        pkw_cstr(w, strs[i]);
    }
    pkw_item(w);
    pkw_str(w, long_str, sizeof long_str);
    pkw_list_end(w);
    pkw_key(w, "misc");
    pkw_list_begin(w);
    pkw_item(w);
    pkw_float(w, 1.5);
    pkw_item(w);
    pkw_float(w, -1e300);
    pkw_item(w);
    pkw_bool(w, true);
    pkw_item(w);
    pkw_bool(w, false);
    pkw_item(w);
    pkw_none(w);
    pkw_item(w);
    pkw_uint(w, 7);
    pkw_cstr(w, "seven");
    pkw_tuple2(w);
    pkw_list_end(w);
    pkw_key(w, "big");
    pkw_list_begin(w);
    for (int i = 0; i < BIG_LIST; i++) {
        pkw_item(w);
        pkw_int(w, i);
    }
    pkw_list_end(w);
    pkw_key(w, "bigdict");
    pkw_dict_begin(w);
    for (int i = 0; i < BIG_LIST; i++) {
        char k[32];
        snprintf(k, sizeof k, "k%d", i);
        pkw_key(w, k);
        pkw_int(w, -i);
    }
    pkw_dict_end(w);
    /* A shared value: written once, fetched GETS times, past 256 memo entries. */
    pkw_key(w, "shared");
    pkw_list_begin(w);
    pkw_item(w);
    pkw_dict_begin(w);
    pkw_key(w, "name");
    pkw_str_memo(w, "frame", 5);
    pkw_dict_end(w);
    uint64_t idx = pkw_memoize(w);
    for (int i = 0; i < GETS; i++) {
        pkw_item(w);
        pkw_get(w, idx);
        pkw_item(w);
        pkw_str_memo(w, "frame", 5);
    }
    pkw_list_end(w);
    /* A value memoized under a caller's key: written once, fetched after; the same bytes as a
     * memoized string stay a different value (the two kinds of key are kept apart). */
    pkw_key(w, "keyed");
    pkw_list_begin(w);
    for (int i = 0; i < 3; i++) {
        pkw_item(w);
        if (!pkw_get_keyed(w, "frame", 5)) {
            CHECK(i == 0, "keyed value %d not found", i);
            pkw_list_begin(w);
            pkw_item(w);
            pkw_int(w, 42);
            pkw_list_end(w);
            pkw_memoize_keyed(w, "frame", 5);
        }
    }
    pkw_item(w);
    pkw_str_memo(w, "frame", 5);
    pkw_list_end(w);
    pkw_dict_end(w);
    char err[128];
    CHECK(pkw_finish(w, err, sizeof err), "pkw_finish: %s", err);
}

static void check_str(const py_t *v, const char *want)
{
    char buf[400];
    CHECK(v && v->kind == PY_STR && strcmp(py_as_cstr(v, buf, sizeof buf), want) == 0, "string: got '%s', want '%s'",
          v ? py_as_cstr(v, buf, sizeof buf) : "(none)", want);
}

int main(int argc, char **argv)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    write_doc(f);
    fclose(f);

    /* Misuse is reported, not written out silently. */
    char *gbuf = NULL;
    size_t glen = 0;
    FILE *g = open_memstream(&gbuf, &glen);
    pkw_t *w = pkw_new(g);
    pkw_list_begin(w);
    pkw_key(w, "not in a dict");
    char err[128];
    CHECK(!pkw_finish(w, err, sizeof err) && strstr(err, "misuse"), "misuse not reported");
    fclose(g);
    free(gbuf);

    char perr[256];
    pk_doc_t *doc = pk_load(buf, len, NULL, perr, sizeof perr);
    CHECK(doc, "pk_load: %s", perr);
    if (doc) {
        const py_t *root = pk_root(doc);
        const py_t *l = py_dict_get(root, "ints");
        CHECK(py_len(l) == NINTS, "ints: %zu", py_len(l));
        for (size_t i = 0; i < NINTS && i < py_len(l); i++) {
            int64_t v = 0;
            CHECK(py_as_int(py_item(l, i), &v) && v == ints[i], "int %zu: got %" PRId64 ", want %" PRId64, i, v, ints[i]);
        }
        const py_t *s = py_dict_get(root, "strings");
        check_str(py_item(s, 0), "");
        check_str(py_item(s, 1), "abc");
        check_str(py_item(s, 2), "caf\xc3\xa9");
        check_str(py_item(s, 3), "a\xef\xbf\xbd" "b");
        check_str(py_item(s, 4), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
        check_str(py_item(s, 5), "\xf0\x9f\x98\x80");
        check_str(py_item(s, 6), "\xef\xbf\xbd");
        CHECK(py_item(s, 7) && py_item(s, 7)->u.s.len == 300, "long string");
        const py_t *m = py_dict_get(root, "misc");
        double d = 0;
        CHECK(py_as_double(py_item(m, 0), &d) && d == 1.5, "float 1.5: %g", d);
        CHECK(py_as_double(py_item(m, 1), &d) && d == -1e300, "float -1e300: %g", d);
        CHECK(py_item(m, 2) && py_item(m, 2)->kind == PY_BOOL && py_item(m, 2)->u.b, "true");
        CHECK(py_item(m, 3) && py_item(m, 3)->kind == PY_BOOL && !py_item(m, 3)->u.b, "false");
        CHECK(py_item(m, 4) && py_item(m, 4)->kind == PY_NONE, "None");
        CHECK(py_item(m, 5) && py_item(m, 5)->kind == PY_TUPLE && py_len(py_item(m, 5)) == 2, "tuple");
        const py_t *big = py_dict_get(root, "big");
        CHECK(py_len(big) == BIG_LIST, "big list: %zu items", py_len(big));
        int64_t v = -1;
        CHECK(py_as_int(py_item(big, BIG_LIST - 1), &v) && v == BIG_LIST - 1, "big list's last item %" PRId64, v);
        const py_t *bd = py_dict_get(root, "bigdict");
        CHECK(py_len(bd) == BIG_LIST, "big dict: %zu pairs", py_len(bd));
        CHECK(py_as_int(py_dict_get(bd, "k2499"), &v) && v == -2499, "big dict's last value");
        const py_t *sh = py_dict_get(root, "shared");
        CHECK(py_len(sh) == 1 + 2 * GETS, "shared: %zu", py_len(sh));
        CHECK(py_item(sh, 0) == py_item(sh, 2 * GETS - 1), "a fetched value is not the memoized one");
        check_str(py_dict_get(py_item(sh, 2 * GETS - 1), "name"), "frame");
        check_str(py_item(sh, 2 * GETS), "frame");
        const py_t *kd = py_dict_get(root, "keyed");
        CHECK(py_len(kd) == 4 && py_item(kd, 0) && py_item(kd, 0)->kind == PY_LIST &&
                  py_item(kd, 0) == py_item(kd, 2) && py_as_int(py_item(py_item(kd, 0), 0), &v) && v == 42,
              "keyed values are not the one memoized list");
        check_str(py_item(kd, 3), "frame");
        pk_free(doc);
    }
    if (argc > 1) {
        FILE *out = fopen(argv[1], "wb");
        CHECK(out && fwrite(buf, 1, len, out) == len && fclose(out) == 0, "cannot write %s", argv[1]);
    }
    free(buf);
    if (failures)
        printf("%d failures\n", failures);
    else
        printf("test_pickle_writer: all passed (%zu bytes)\n", len);
    return failures ? 1 : 0;
}
