/* u64map.h — a map from 64-bit keys to 64-bit values for allocview's commands (addresses to
 * sizes, handles and pointers to ids): open addressing, linear probing, backward-shift deletion
 * (no tombstones), doubling at half full. The key UINT64_MAX marks an empty slot and cannot be
 * stored. */
#ifndef CUALLOC_ALLOCVIEW_U64MAP_H
#define CUALLOC_ALLOCVIEW_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct u64map { uint64_t *k, *v; size_t mask, count; } u64map_t;

/* cap: a power of two. False when out of memory (nothing to free then). */
bool u64map_init(u64map_t *m, size_t cap);
void u64map_free(u64map_t *m);
/* The value of key, inserted as 0 when absent (*found says which); NULL when out of memory. */
uint64_t *u64map_slot(u64map_t *m, uint64_t key, bool *found);
bool u64map_has(const u64map_t *m, uint64_t key);
bool u64map_put(u64map_t *m, uint64_t key, uint64_t val);
/* Removes key; true with *val when it was there. */
bool u64map_take(u64map_t *m, uint64_t key, uint64_t *val);

#endif
