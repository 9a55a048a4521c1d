/* u64map.c — see u64map.h. */
#include "u64map.h"

#include <stdlib.h>
#include <string.h>

#include "mix64.h"

bool u64map_init(u64map_t *m, size_t cap)
{
    m->k = malloc(cap * sizeof *m->k);
    m->v = malloc(cap * sizeof *m->v);
    if (!m->k || !m->v) {
        free(m->k);
        free(m->v);
        m->k = m->v = NULL;
        return false;
    }
    memset(m->k, 0xff, cap * sizeof *m->k);
    m->mask = cap - 1;
    m->count = 0;
    return true;
}

void u64map_free(u64map_t *m)
{
    free(m->k);
    free(m->v);
    m->k = m->v = NULL;
}

static bool grow(u64map_t *m)
{
    u64map_t n;
    if (!u64map_init(&n, (m->mask + 1) * 2))
        return false;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->k[i] != UINT64_MAX) {
            size_t j = mix64(m->k[i]) & n.mask;
            while (n.k[j] != UINT64_MAX)
                j = (j + 1) & n.mask;
            n.k[j] = m->k[i];
            n.v[j] = m->v[i];
        }
    n.count = m->count;
    u64map_free(m);
    *m = n;
    return true;
}

uint64_t *u64map_slot(u64map_t *m, uint64_t key, bool *found)
{
    if ((m->count + 1) * 2 > m->mask + 1 && !grow(m))
        return NULL;
    size_t i = mix64(key) & m->mask;
    while (m->k[i] != UINT64_MAX && m->k[i] != key)
        i = (i + 1) & m->mask;
    *found = m->k[i] == key;
    if (!*found) {
        m->k[i] = key;
        m->v[i] = 0;
        m->count++;
    }
    return &m->v[i];
}

bool u64map_has(const u64map_t *m, uint64_t key)
{
    for (size_t i = mix64(key) & m->mask; m->k[i] != UINT64_MAX; i = (i + 1) & m->mask)
        if (m->k[i] == key)
            return true;
    return false;
}

bool u64map_put(u64map_t *m, uint64_t key, uint64_t val)
{
    bool found;
    uint64_t *v = u64map_slot(m, key, &found);
    if (v)
        *v = val;
    return v != NULL;
}

bool u64map_take(u64map_t *m, uint64_t key, uint64_t *val)
{
    size_t i = mix64(key) & m->mask;
    while (m->k[i] != key) {
        if (m->k[i] == UINT64_MAX)
            return false;
        i = (i + 1) & m->mask;
    }
    *val = m->v[i];
    m->count--;
    /* Backward shift: a later member of the probe run moves into the hole unless its home slot
     * lies cyclically in (hole, its slot]. */
    for (size_t j = (i + 1) & m->mask; m->k[j] != UINT64_MAX; j = (j + 1) & m->mask) {
        size_t home = mix64(m->k[j]) & m->mask;
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            m->k[i] = m->k[j];
            m->v[i] = m->v[j];
            i = j;
        }
    }
    m->k[i] = UINT64_MAX;
    return true;
}
