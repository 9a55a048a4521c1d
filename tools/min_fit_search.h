/* min_fit_search.h — the search for the smallest capacity on which a run completes, shared by
 * `allocview replay --min-fit` (capacities in granules) and `cualloc-demo --min-fit` (in MiB).
 *
 * Completion need not be monotone in capacity: a larger device changes when cache is released,
 * and so what is split afterwards. Bisection therefore finds a capacity one unit above a failing
 * one, not necessarily the smallest. So a few capacities below its answer are probed too (2, 3,
 * 4, 8, 16 and 64 units under it, smallest distance first); where one completes, the search goes
 * on under it, bisecting again from the capacity known to fail. The answer only decreases, so the
 * search ends. Invariant: `hi` completes; `lo` fails. */
#ifndef CUALLOC_MIN_FIT_SEARCH_H
#define CUALLOC_MIN_FIT_SEARCH_H

#include <stdbool.h>
#include <stdint.h>

/* Runs the job on a device of `units` units: 1 when it completes, 0 when it fails, < 0 when the
 * run could not be made (the search then stops without an answer). */
typedef int (*min_fit_probe_fn)(void *ctx, uint64_t units);

typedef struct min_fit_search {
    bool found;            /* false: a probe could not be run */
    uint64_t units;        /* the smallest capacity found to complete */
    bool monotone;         /* no probe below a bisection's answer completed */
    uint64_t failed_above; /* when !monotone: a failing capacity above `units` */
    unsigned probes;       /* probes made */
} min_fit_search_t;

/* Searches between `lo` (fails) and `hi` (completes), lo < hi; `sure_fail` <= lo fails for
 * certain (under the job's requests), and no probe goes to it or below. After `max_probes`
 * probes no more are made, and the answer is the smallest capacity seen to complete. */
void min_fit_search(uint64_t sure_fail, uint64_t lo, uint64_t hi, unsigned max_probes,
                    min_fit_probe_fn probe, void *ctx, min_fit_search_t *out);

#endif
