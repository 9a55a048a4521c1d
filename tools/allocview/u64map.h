/* u64map.h — a map from 64-bit keys to 64-bit values for allocview's import (pointers and
 * handles to ids, addresses to sizes): devaddr_map's table with every key on device 0, so any
 * key can be stored, 0 and UINT64_MAX included. */
#ifndef CUALLOC_ALLOCVIEW_U64MAP_H
#define CUALLOC_ALLOCVIEW_U64MAP_H

#include <stdbool.h>
#include <stdint.h>

#include "devaddr_map.h"

typedef struct u64map { devaddr_map_t map; } u64map_t;

/* An empty map; allocates nothing. */
void u64map_init(u64map_t *m);
void u64map_free(u64map_t *m);
/* The value of key, inserted as 0 when absent (*found says which); NULL when out of memory
 * (*found false, the map unchanged). Valid until the next insertion. */
uint64_t *u64map_slot(u64map_t *m, uint64_t key, bool *found);
bool u64map_has(const u64map_t *m, uint64_t key);
/* The value of key, or NULL when absent; inserts nothing (so it allocates nothing and cannot fail).
 * Valid until the next insertion. */
const uint64_t *u64map_find(const u64map_t *m, uint64_t key);

#endif
