/* min_fit_search.c — bisection, then probes below its answer (min_fit_search.h says why). */
#include "min_fit_search.h"

#include <string.h>

void min_fit_search(uint64_t sure_fail, uint64_t lo, uint64_t hi, unsigned max_probes,
                    min_fit_probe_fn probe, void *ctx, min_fit_search_t *out)
{
    static const unsigned below[] = {2, 3, 4, 8, 16, 64};
    memset(out, 0, sizeof *out);
    out->monotone = true;
    for (;;) {
        while (hi - lo > 1 && out->probes < max_probes) {
            uint64_t mid = lo + (hi - lo) / 2;
            out->probes++;
            int r = probe(ctx, mid);
            if (r < 0)
                return;
            if (r > 0)
                hi = mid;
            else
                lo = mid;
        }
        uint64_t lower = 0;
        for (size_t i = 0; i < sizeof below / sizeof below[0]; i++) {
            if (hi - sure_fail <= below[i] || out->probes >= max_probes)
                break; /* at or under a capacity smaller than the requests */
            out->probes++;
            int r = probe(ctx, hi - below[i]);
            if (r < 0)
                return;
            if (r > 0) {
                lower = hi - below[i];
                break;
            }
        }
        if (!lower)
            break;
        out->monotone = false;
        out->failed_above = lo; /* fails, above `lower`, which completes */
        hi = lower;
        lo = sure_fail;
    }
    out->found = true;
    out->units = hi;
}
