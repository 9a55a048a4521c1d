/* u64map.c — see u64map.h. */
#include "u64map.h"

typedef struct u64map_entry {
    devaddr_entry_t key; /* device 0, address: the key */
    uint64_t val;
} u64map_entry_t;

void u64map_init(u64map_t *m)
{
    devaddr_map_init(&m->map, sizeof(u64map_entry_t));
}

void u64map_free(u64map_t *m)
{
    devaddr_map_free(&m->map);
}

uint64_t *u64map_slot(u64map_t *m, uint64_t key, bool *found)
{
    u64map_entry_t *e = devaddr_map_get(&m->map, 0, key, found); /* a new one's value zeroed */
    return e ? &e->val : NULL;
}

bool u64map_has(const u64map_t *m, uint64_t key)
{
    return devaddr_map_find(&m->map, 0, key) != NULL;
}

const uint64_t *u64map_find(const u64map_t *m, uint64_t key)
{
    const u64map_entry_t *e = devaddr_map_find(&m->map, 0, key);
    return e ? &e->val : NULL;
}
