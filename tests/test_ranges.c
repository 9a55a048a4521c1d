/* test_ranges.c — allocview's set of address ranges (tools/allocview/ranges.c), which the export
 * and the import keep of what is mapped, against a plain model: one owner per address of a small
 * window (0: not in the set), a range being a run of one owner. Random adds, adds of the missing
 * parts, removals that cut ranges, and queries, low in the address space and near its top, with the
 * checker after every operation; then the checker against a set broken on purpose.
 */
#include <stdbool.h>
#include <stdint.h>

#include "../tools/allocview/ranges.h"
#include "testutil.h"

#define SPAN 160 /* addresses in the window */

typedef struct model {
    uint64_t base;
    unsigned owner[SPAN];
    unsigned next_id;
} model_t;

static bool model_any(const model_t *md, size_t a, size_t e, bool covered)
{
    for (size_t u = a; u < e; u++)
        if ((md->owner[u] != 0) == covered)
            return true;
    return false;
}

/* The model's ranges, in address order, into out (at most SPAN); returns how many. */
static size_t model_ranges(const model_t *md, addr_range_t *out)
{
    size_t n = 0;
    for (size_t u = 0; u < SPAN; u++) {
        if (!md->owner[u])
            continue;
        if (u == 0 || md->owner[u - 1] != md->owner[u])
            out[n++] = (addr_range_t){md->base + u, md->base + u + 1};
        else
            out[n - 1].end++;
    }
    return n;
}

static void compare(const addr_ranges_t *m, const model_t *md, rng_t *g)
{
    EXPECT(ranges_check(m, stderr) == 0, "ranges_check");
    addr_range_t want[SPAN];
    size_t n = model_ranges(md, want);
    EXPECT(m->n == n, "%zu ranges, model %zu", m->n, n);
    for (size_t i = 0; i < n; i++)
        EXPECT(m->v[i].addr == want[i].addr && m->v[i].end == want[i].end,
               "range %zu [0x%" PRIx64 ", 0x%" PRIx64 "), model [0x%" PRIx64 ", 0x%" PRIx64 ")", i, m->v[i].addr,
               m->v[i].end, want[i].addr, want[i].end);
    /* Queries on a few windows. */
    for (int q = 0; q < 4; q++) {
        size_t a = (size_t)rng_below(g, SPAN), e = a + 1 + (size_t)rng_below(g, SPAN - a);
        EXPECT(ranges_cover(m, md->base + a, md->base + e) == !model_any(md, a, e, false), "cover [%zu, %zu)", a, e);
        EXPECT(ranges_overlap(m, md->base + a, md->base + e) == model_any(md, a, e, true), "overlap [%zu, %zu)", a, e);
        size_t after = 0;
        while (after < n && want[after].end <= md->base + a)
            after++;
        EXPECT(ranges_after(m, md->base + a) == after, "after %zu: %zu, model %zu", a, ranges_after(m, md->base + a),
               after);
    }
}

static void run(rng_t *g, uint64_t base, int ops)
{
    model_t md = {.base = base, .next_id = 1};
    addr_ranges_t m = {0};
    compare(&m, &md, g);
    for (int op = 0; op < ops; op++) {
        /* Short ranges mostly, so that the set holds many; now and then a long one. */
        size_t len = 1 + (size_t)rng_below(g, rng_below(g, 8) ? 12 : SPAN);
        size_t a = (size_t)rng_below(g, SPAN), e = a + len > SPAN ? SPAN : a + len;
        unsigned what = (unsigned)rng_below(g, 100);
        /* Phases that lean toward adding, then toward removing, so the set fills and empties. */
        unsigned add_pct = (op / 500) % 2 ? 35 : 70;
        if (what < add_pct && !model_any(&md, a, e, true)) {
            ranges_add(&m, base + a, base + e);
            for (size_t u = a; u < e; u++)
                md.owner[u] = md.next_id;
            md.next_id++;
        } else if (what < add_pct) {
            ranges_add_missing(&m, base + a, base + e);
            for (size_t u = a; u < e; u++)
                if (!md.owner[u]) {
                    md.owner[u] = md.next_id;
                    if (u + 1 == e || md.owner[u + 1])
                        md.next_id++;
                }
        } else {
            ranges_remove(&m, base + a, base + e);
            unsigned cut = a > 0 && e < SPAN && md.owner[a - 1] && md.owner[a - 1] == md.owner[e] ? md.owner[e] : 0;
            for (size_t u = a; u < e; u++)
                md.owner[u] = 0;
            /* A range cut in the middle: its upper part is a range of its own. */
            for (size_t u = e; cut && u < SPAN && md.owner[u] == cut; u++)
                md.owner[u] = md.next_id;
            md.next_id += cut != 0;
        }
        compare(&m, &md, g);
    }
    ranges_free(&m);
    EXPECT(m.n == 0 && m.cap == 0 && !m.v && ranges_check(&m, stderr) == 0, "freed set");
}

/* The checker finds each kind of damage, and nothing once it is undone. */
static void check_the_checker(void)
{
    addr_ranges_t m = {0};
    ranges_add(&m, 100, 200);
    ranges_add(&m, 300, 400);
    ranges_add(&m, 400, 500);
    EXPECT(ranges_check(&m, NULL) == 0, "a sound set (adjacent ranges are two)");
#define BREAK(lvalue, bad_value, what)                                                         \
    do {                                                                                       \
        __typeof__(lvalue) saved_ = (lvalue);                                                  \
        (lvalue) = (bad_value);                                                                \
        EXPECT(ranges_check(&m, NULL) > 0, "corruption not caught: %s", (what));               \
        (lvalue) = saved_;                                                                     \
        EXPECT(ranges_check(&m, stderr) == 0, "restored set not clean after: %s", (what));     \
    } while (0)
    BREAK(m.v[0].end, 301, "a range overlapping the next");
    BREAK(m.v[1].end, 300, "an empty range");
    BREAK(m.v[2].end, 350, "a range ending before it starts");
    BREAK(m.v[0], m.v[2], "ranges out of order");
    BREAK(m.n, m.cap + 1, "more ranges than room");
#undef BREAK
    ranges_free(&m);
}

int main(void)
{
    rng_t g = {test_seed("test_ranges")};
    check_the_checker();
    run(&g, 0, 20000);
    run(&g, UINT64_MAX - SPAN - 4096, 20000); /* near the top of the address space */
    printf("test_ranges: ok\n");
    return 0;
}
