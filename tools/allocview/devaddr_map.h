/* devaddr_map.h — a hash table keyed by (device, address), for allocview's tables of blocks (the
 * accounting's live blocks, the analysis', the views' replay, the export's): open addressing,
 * linear probing, backward-shift deletion (no tombstones), doubling at half full.
 *
 * Any address is a key, 0 and UINT64_MAX included (a damaged trace may hold anything): a slot's
 * `used` flag, not a reserved key, tells whether it holds an entry.
 *
 * An entry is the caller's struct, elem_size bytes, whose first member is a devaddr_entry_t; the
 * members after it are the caller's payload. Insert and remove move entries: a pointer to an entry
 * stays valid only until the next insert or remove. */
#ifndef CUALLOC_ALLOCVIEW_DEVADDR_MAP_H
#define CUALLOC_ALLOCVIEW_DEVADDR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct devaddr_entry {
    uint64_t addr;
    uint32_t dev;
    bool used; /* the map's own: false in a free slot */
} devaddr_entry_t;

typedef struct devaddr_map {
    unsigned char *slots; /* mask + 1 entries of elem_size bytes; NULL until the first insert */
    size_t elem_size, mask, count;
} devaddr_map_t;

/* An empty map of entries of elem_size bytes (at least sizeof(devaddr_entry_t)); allocates
 * nothing. */
void devaddr_map_init(devaddr_map_t *m, size_t elem_size);
/* Frees the entries; the map is empty again, as init left it. */
void devaddr_map_free(devaddr_map_t *m);
/* The entry of (dev, addr), or NULL. */
void *devaddr_map_find(const devaddr_map_t *m, uint32_t dev, uint64_t addr);
/* A new entry for (dev, addr), which must not be in the map (find first): the header set, the
 * payload zeroed. NULL when out of memory; the map is unchanged then. */
void *devaddr_map_insert(devaddr_map_t *m, uint32_t dev, uint64_t addr);
/* The entry of (dev, addr), added as insert adds it when absent (*found says which), in one
 * probe. NULL when out of memory (*found false, the map unchanged). */
void *devaddr_map_get(devaddr_map_t *m, uint32_t dev, uint64_t addr, bool *found);
/* Removes an entry that find, insert or get returned (and no insert or remove has moved since). */
void devaddr_map_remove(devaddr_map_t *m, void *entry);
/* The entries in slot order, which follows the hash, not the keys: start with *pos = 0; NULL
 * after the last. The map must not change during the walk. */
void *devaddr_map_next(const devaddr_map_t *m, size_t *pos);
/* The number of broken invariants, each described on report (when not NULL): every entry is
 * found from its home slot (no free slot between, no other entry with its key before it), count
 * is the number of entries, the capacity is a power of two at least twice the count. */
int devaddr_map_check(const devaddr_map_t *m, FILE *report);

#endif
