/* ranges.h — a set of disjoint address ranges [addr, end), sorted by address: what is mapped, for
 * the exporter's checks and the import's starting state. Adjacent ranges are not merged (each is a
 * mapping or a segment of its own). Invariant: v[i].addr < v[i].end <= v[i + 1].addr. */
#ifndef CUALLOC_ALLOCVIEW_RANGES_H
#define CUALLOC_ALLOCVIEW_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct addr_range { uint64_t addr, end; } addr_range_t;
typedef struct addr_ranges { addr_range_t *v; size_t n, cap; } addr_ranges_t; /* {0}: empty */

/* Index of the first range ending after addr. */
size_t ranges_after(const addr_ranges_t *m, uint64_t addr);
/* True when [addr, end) lies in the set (possibly across adjacent ranges). */
bool ranges_cover(const addr_ranges_t *m, uint64_t addr, uint64_t end);
/* True when [addr, end) meets the set. */
bool ranges_overlap(const addr_ranges_t *m, uint64_t addr, uint64_t end);
/* Adds [addr, end), which must not overlap the set. (Out of host memory ends the process: xalloc.h.) */
void ranges_add(addr_ranges_t *m, uint64_t addr, uint64_t end);
/* Adds the parts of [addr, end) not in the set yet, each as a range of its own. */
void ranges_add_missing(addr_ranges_t *m, uint64_t addr, uint64_t end);
/* Removes [addr, end) from the set, cutting the ranges it overlaps. */
void ranges_remove(addr_ranges_t *m, uint64_t addr, uint64_t end);
void ranges_free(addr_ranges_t *m);
/* The number of broken invariants, each described on report (when not NULL): every range is
 * non-empty and ends at or before the next one starts; n <= cap, with an array when n > 0. */
int ranges_check(const addr_ranges_t *m, FILE *report);

#endif
