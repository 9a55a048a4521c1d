/* devaddr_map.c — see devaddr_map.h. */
#include "devaddr_map.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lib_oom.h"
#include "mix64.h"

/* The first capacity: small, so that a map used for a few blocks stays small. */
#define DEVADDR_MAP_MIN_CAP 16

/* A bijection of addr mixed with a multiple of dev: (dev, 0) keys of different devices, and
 * addresses differing only in high or low bits, land far apart. */
static uint64_t hash(uint32_t dev, uint64_t addr)
{
    return mix64(addr ^ ((uint64_t)dev * 0x9e3779b97f4a7c15ull));
}

static size_t capacity(const devaddr_map_t *m)
{
    return m->slots ? m->mask + 1 : 0;
}

static devaddr_entry_t *slot(const devaddr_map_t *m, size_t i)
{
    return (devaddr_entry_t *)(m->slots + i * m->elem_size);
}

static size_t home(const devaddr_map_t *m, const devaddr_entry_t *e)
{
    return hash(e->dev, e->addr) & m->mask;
}

void devaddr_map_init(devaddr_map_t *m, size_t elem_size)
{
    m->slots = NULL;
    m->elem_size = elem_size;
    m->mask = 0;
    m->count = 0;
}

void devaddr_map_free(devaddr_map_t *m)
{
    free(m->slots);
    devaddr_map_init(m, m->elem_size);
}

void *devaddr_map_find(const devaddr_map_t *m, uint32_t dev, uint64_t addr)
{
    if (!m->count)
        return NULL;
    for (size_t i = hash(dev, addr) & m->mask;; i = (i + 1) & m->mask) {
        devaddr_entry_t *e = slot(m, i);
        if (!e->used)
            return NULL; /* the end of the probe run: at most half the slots are used */
        if (e->addr == addr && e->dev == dev)
            return e;
    }
}

/* The slot where an entry with this key would go: the first free one of its probe run. */
static devaddr_entry_t *free_slot(const devaddr_map_t *m, uint32_t dev, uint64_t addr)
{
    size_t i = hash(dev, addr) & m->mask;
    while (slot(m, i)->used)
        i = (i + 1) & m->mask;
    return slot(m, i);
}

static bool grow(devaddr_map_t *m)
{
    size_t cap = capacity(m);
    devaddr_map_t n = *m;
    n.mask = (cap ? cap * 2 : DEVADDR_MAP_MIN_CAP) - 1;
    n.slots = lib_calloc(n.mask + 1, m->elem_size);
    if (!n.slots)
        return false;
    for (size_t i = 0; i < cap; i++) {
        const devaddr_entry_t *e = slot(m, i);
        if (e->used)
            memcpy(free_slot(&n, e->dev, e->addr), e, m->elem_size);
    }
    free(m->slots);
    *m = n;
    return true;
}

/* Makes free slot e the entry of (dev, addr), its payload zeroed. */
static void *occupy(devaddr_map_t *m, devaddr_entry_t *e, uint32_t dev, uint64_t addr)
{
    memset(e, 0, m->elem_size);
    e->addr = addr;
    e->dev = dev;
    e->used = true;
    m->count++;
    return e;
}

void *devaddr_map_insert(devaddr_map_t *m, uint32_t dev, uint64_t addr)
{
    if ((m->count + 1) * 2 > capacity(m) && !grow(m))
        return NULL;
    return occupy(m, free_slot(m, dev, addr), dev, addr);
}

void *devaddr_map_get(devaddr_map_t *m, uint32_t dev, uint64_t addr, bool *found)
{
    *found = false;
    /* Grown first, so that the probe below ends where the entry stays. */
    if ((m->count + 1) * 2 > capacity(m) && !grow(m))
        return NULL;
    devaddr_entry_t *e;
    for (size_t i = hash(dev, addr) & m->mask;; i = (i + 1) & m->mask) {
        e = slot(m, i);
        if (!e->used)
            break;
        if (e->addr == addr && e->dev == dev) {
            *found = true;
            return e;
        }
    }
    return occupy(m, e, dev, addr);
}

void devaddr_map_remove(devaddr_map_t *m, void *entry)
{
    size_t i = (size_t)((unsigned char *)entry - m->slots) / m->elem_size;
    /* Backward shift: slot i is the hole. An entry later in the run may move into it unless its
     * home lies cyclically in (i, j] — then it would sit before its home, out of its own run. */
    for (size_t j = (i + 1) & m->mask; slot(m, j)->used; j = (j + 1) & m->mask) {
        size_t h = home(m, slot(m, j));
        if (((j - h) & m->mask) >= ((j - i) & m->mask)) {
            memcpy(slot(m, i), slot(m, j), m->elem_size);
            i = j;
        }
    }
    slot(m, i)->used = false;
    m->count--;
}

void *devaddr_map_next(const devaddr_map_t *m, size_t *pos)
{
    for (size_t cap = capacity(m); *pos < cap;) {
        devaddr_entry_t *e = slot(m, (*pos)++);
        if (e->used)
            return e;
    }
    return NULL;
}

int devaddr_map_check(const devaddr_map_t *m, FILE *report)
{
    int bad = 0;
    size_t cap = capacity(m), count = 0;
    if (cap & (cap - 1)) {
        bad++;
        if (report)
            fprintf(report, "devaddr_map: capacity %zu is not a power of two\n", cap);
        return bad; /* homes mean nothing then */
    }
    for (size_t i = 0; i < cap; i++) {
        const devaddr_entry_t *e = slot(m, i);
        if (!e->used)
            continue;
        count++;
        /* Lookups walk from the home slot to the first free one and stop at the first match. */
        for (size_t j = home(m, e); j != i; j = (j + 1) & m->mask) {
            const devaddr_entry_t *o = slot(m, j);
            if (!o->used || (o->dev == e->dev && o->addr == e->addr)) {
                bad++;
                if (report)
                    fprintf(report, "devaddr_map: (%" PRIu32 ", 0x%" PRIx64 ") at slot %zu is %s slot %zu\n", e->dev,
                            e->addr, i, o->used ? "a duplicate of" : "cut off from its home by free", j);
                break;
            }
        }
    }
    if (count != m->count) {
        bad++;
        if (report)
            fprintf(report, "devaddr_map: %zu entries, count says %zu\n", count, m->count);
    }
    if (count * 2 > cap && count) {
        bad++;
        if (report)
            fprintf(report, "devaddr_map: %zu entries in %zu slots, more than half full\n", count, cap);
    }
    return bad;
}
