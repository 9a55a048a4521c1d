/* test_min_fit_search.c — the min-fit search (tools/min_fit_search.c) against random completion
 * functions whose smallest completing capacity is known: a threshold above which every capacity
 * completes, with random capacities above it that fail (completion need not be monotone), and
 * random capacities below it that complete (the ones bisection can miss). Checked on every draw:
 * the answer completes; no probe is at or under the sure-failing capacity; the answer's probes
 * below (2, 3, 4, 8, 16, 64 units) fail; a monotone function's answer is its threshold; a
 * search is said not monotone exactly when a capacity seen to fail is above the answer, and then
 * names one; the budget is kept; a probe that cannot run ends the search without an answer.
 */
#include <stdbool.h>
#include <stdint.h>

#include "../tools/min_fit_search.h"
#include "testutil.h"

#define SPAN 4096 /* capacities 0..SPAN-1 */

typedef struct job {
    bool completes[SPAN];
    uint64_t sure_fail;
    unsigned probes;
    int error_at; /* the probe number that cannot run (1 = the first), 0: none */
    uint64_t top_failed; /* the largest capacity seen to fail */
} job_t;

static int probe(void *ctx, uint64_t units)
{
    job_t *j = ctx;
    EXPECT(units > j->sure_fail && units < SPAN, "probe at %" PRIu64 " (sure fail %" PRIu64 ")", units,
           j->sure_fail);
    j->probes++;
    if (j->error_at && (int)j->probes == j->error_at)
        return -1;
    if (!j->completes[units] && units > j->top_failed)
        j->top_failed = units;
    return j->completes[units];
}

static void one(rng_t *g)
{
    job_t j = {0};
    uint64_t threshold = 1 + rng_below(g, SPAN - 2);
    for (uint64_t u = threshold; u < SPAN; u++)
        j.completes[u] = true;
    bool monotone = rng_below(g, 2);
    if (!monotone) {
        unsigned holes = (unsigned)rng_below(g, 40), islands = (unsigned)rng_below(g, 40);
        for (unsigned i = 0; i < holes; i++)
            j.completes[threshold + 1 + rng_below(g, SPAN - threshold - 1)] = false;
        for (unsigned i = 0; i < islands && threshold > 1; i++)
            j.completes[1 + rng_below(g, threshold - 1)] = true;
    }
    /* The sure-failing capacity: under every completing one. */
    uint64_t first = 0;
    while (!j.completes[first])
        first++;
    j.sure_fail = rng_below(g, first);
    /* hi: a completing capacity; lo: a failing one between sure_fail and hi. */
    uint64_t hi;
    do
        hi = first + rng_below(g, SPAN - first);
    while (!j.completes[hi]);
    uint64_t lo = j.sure_fail;
    for (int k = 0; k < 4; k++) {
        uint64_t c = j.sure_fail + rng_below(g, hi - j.sure_fail);
        if (!j.completes[c] && c > lo)
            lo = c;
    }
    unsigned budget = rng_below(g, 4) ? UINT32_MAX : (unsigned)rng_below(g, 30);
    if (rng_below(g, 8) == 0)
        j.error_at = 1 + (int)rng_below(g, 12);
    j.top_failed = lo; /* the caller saw lo fail */
    min_fit_search_t s;
    min_fit_search(j.sure_fail, lo, hi, budget, probe, &j, &s);
    EXPECT(s.probes == j.probes, "%u probes said, %u made", s.probes, j.probes);
    EXPECT(s.probes <= budget, "%u probes over a budget of %u", s.probes, budget);
    if (!s.found) {
        EXPECT(j.error_at && (int)j.probes == j.error_at, "no answer without a failed probe");
        return;
    }
    EXPECT(!j.error_at || (int)j.probes < j.error_at, "an answer after a probe that could not run");
    EXPECT(s.units > j.sure_fail && s.units <= hi, "answer %" PRIu64 " outside (%" PRIu64 ", %" PRIu64 "]",
           s.units, j.sure_fail, hi);
    EXPECT(j.completes[s.units], "the answer %" PRIu64 " fails", s.units);
    EXPECT(s.monotone == (j.top_failed < s.units), "monotone %d, yet %" PRIu64 " failed (answer %" PRIu64 ")",
           s.monotone, j.top_failed, s.units);
    if (!s.monotone)
        EXPECT(s.failed_above > s.units && !j.completes[s.failed_above], "failed_above %" PRIu64
               " (answer %" PRIu64 ")", s.failed_above, s.units);
    if (budget != UINT32_MAX)
        return; /* a budget can end the search anywhere */
    EXPECT(!j.completes[s.units - 1] || s.units - 1 == j.sure_fail,
           "the answer %" PRIu64 " has a completing capacity just under it", s.units);
    static const unsigned below[] = {2, 3, 4, 8, 16, 64};
    for (size_t i = 0; i < sizeof below / sizeof below[0]; i++)
        if (s.units > j.sure_fail + below[i])
            EXPECT(!j.completes[s.units - below[i]], "%" PRIu64 " completes, %u under the answer %" PRIu64,
                   s.units - below[i], below[i], s.units);
    if (monotone) {
        EXPECT(s.units == threshold, "monotone: answer %" PRIu64 ", threshold %" PRIu64, s.units, threshold);
        EXPECT(s.monotone, "a monotone job reported not monotone");
    }
}

int main(void)
{
    rng_t g = {test_seed("test_min_fit_search")};
    for (int i = 0; i < 200000; i++)
        one(&g);
    printf("test_min_fit_search: ok\n");
    return 0;
}
