/* stats.c — writes a cualloc_stats as JSON or as an aligned text table. The fields come from the
 * X-macros in include/cualloc.h, so a field added there appears here without an edit. It does
 * not gather the numbers (heap.c does) nor decide when to print them (api.c: summary:1).
 */
#include <string.h>

#include "internal.h"

void stats_write_json(const cualloc_stats *s, FILE *out)
{
    /* One object on one line, no trailing newline, so callers can embed it (e.g. in an array of
     * devices). Keys in struct order: gauges (current, peak), the two sizes, then counters. */
    const char *sep = "";
    fputc('{', out);
#define STATS_JSON_GAUGE_(cur, peak)                                                           \
    fprintf(out, "%s\"" #cur "\": %zu, \"" #peak "\": %zu", sep, s->cur, s->peak);           \
    sep = ", ";
    CUALLOC_STATS_GAUGES(STATS_JSON_GAUGE_)
#undef STATS_JSON_GAUGE_
    fprintf(out, "%s\"largest_free_block\": %zu, \"capacity_bytes\": %zu", sep,
            s->largest_free_block, s->capacity_bytes);
#define STATS_JSON_COUNTER_(name)                                                              \
    fprintf(out, ", \"" #name "\": %llu", (unsigned long long)s->name);
    CUALLOC_STATS_COUNTERS(STATS_JSON_COUNTER_)
#undef STATS_JSON_COUNTER_
    fputc('}', out);
}

/* The row label of a gauge: its field name without the "_bytes" suffix. */
static void gauge_label(const char *name, char *buf, size_t len)
{
    size_t n = strlen(name);
    static const char suffix[] = "_bytes";
    if (n > sizeof suffix - 1 && strcmp(name + n - (sizeof suffix - 1), suffix) == 0)
        n -= sizeof suffix - 1;
    snprintf(buf, len, "%.*s", (int)n, name);
}

void stats_write_text(const cualloc_stats *s, int device, FILE *out)
{
    char a[32], b[32], label[48];

    fprintf(out, "cualloc stats, device %d (capacity %s)\n", device,
            fmt_bytes(s->capacity_bytes, a, sizeof a));
    fprintf(out, "  %-22s %14s %14s\n", "bytes", "current", "peak");
#define STATS_TEXT_GAUGE_(cur, peak)                                                           \
    gauge_label(#cur, label, sizeof label);                                                    \
    fprintf(out, "  %-22s %14s %14s\n", label, fmt_bytes(s->cur, a, sizeof a),                 \
            fmt_bytes(s->peak, b, sizeof b));
    CUALLOC_STATS_GAUGES(STATS_TEXT_GAUGE_)
#undef STATS_TEXT_GAUGE_
    fprintf(out, "  %-22s %14s\n", "largest_free_block", fmt_bytes(s->largest_free_block, a,
                                                                     sizeof a));
    /* Fragmentation as DESIGN.md defines it: cached free = reserved - allocated (the heap's
     * invariant), and how much of it the largest free block is. */
    size_t cached = s->reserved_bytes > s->allocated_bytes ? s->reserved_bytes - s->allocated_bytes
                                                           : 0;
    fprintf(out, "  %-22s %14s", "cached_free", fmt_bytes(cached, a, sizeof a));
    if (cached > 0 && s->largest_free_block <= cached)
        fprintf(out, "   (%.1f%% fragmented: 1 - largest free / cached free)",
                100.0 * (1.0 - (double)s->largest_free_block / (double)cached));
    fputc('\n', out);
    /* Counters right-aligned with the peak column: 29 = 14 + 1 + 14 holds any uint64_t. */
    fprintf(out, "  %-22s %29s\n", "counters", "count");
#define STATS_TEXT_COUNTER_(name)                                                              \
    fprintf(out, "  %-22s %29llu\n", #name, (unsigned long long)s->name);
    CUALLOC_STATS_COUNTERS(STATS_TEXT_COUNTER_)
#undef STATS_TEXT_COUNTER_
}
