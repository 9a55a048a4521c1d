/* test_devaddr_map.c — allocview's (device, address) hash table (tools/allocview/devaddr_map.c)
 * against a plain array: random inserts, gets, finds, removes and walks over key pools small (dense
 * probe runs, wrap-around, backward shifts at every position) and large (growth), with addresses
 * 0 and UINT64_MAX and many devices; the checker after every operation. Then the checker itself
 * against a map broken on purpose, and u64map (import's key-to-value map, built on it) with the
 * extreme keys.
 */
#include <stdbool.h>
#include <stdint.h>

#include "../tools/allocview/devaddr_map.h"
#include "../tools/allocview/u64map.h"
#include "testutil.h"

typedef struct ent {
    devaddr_entry_t key;
    uint64_t val;
    uint32_t idx; /* the key's index in the pool */
} ent_t;

typedef struct model {
    size_t n, live;
    uint32_t *dev;
    uint64_t *addr, *val;
    bool *present;
} model_t;

static bool pool_has(const model_t *r, size_t n, uint32_t dev, uint64_t addr)
{
    for (size_t i = 0; i < n; i++)
        if (r->dev[i] == dev && r->addr[i] == addr)
            return true;
    return false;
}

/* n distinct keys: the extreme addresses on many devices first, then addresses like a heap's
 * (aligned, close together) and arbitrary ones. */
static void pool_make(model_t *r, rng_t *g, size_t n)
{
    static const uint64_t special[] = {0, UINT64_MAX, 1, UINT64_MAX - 1, (uint64_t)1 << 63, 512};
    r->n = n;
    r->live = 0;
    r->dev = calloc(n, sizeof *r->dev);
    r->addr = calloc(n, sizeof *r->addr);
    r->val = calloc(n, sizeof *r->val);
    r->present = calloc(n, sizeof *r->present);
    EXPECT(r->dev && r->addr && r->val && r->present, "out of memory");
    for (size_t i = 0; i < n;) {
        uint32_t dev;
        uint64_t addr;
        switch (rng_below(g, 4)) {
        case 0:
            dev = rng_below(g, 4) ? (uint32_t)rng_below(g, 64) : UINT32_MAX;
            addr = special[rng_below(g, sizeof special / sizeof special[0])];
            break;
        case 1:
        case 2:
            dev = (uint32_t)rng_below(g, 8);
            addr = 0x7f0000000000ull + rng_below(g, 4096) * 512;
            break;
        default:
            dev = (uint32_t)rng_next(g);
            addr = rng_next(g);
            break;
        }
        if (pool_has(r, i, dev, addr))
            continue;
        r->dev[i] = dev;
        r->addr[i] = addr;
        i++;
    }
}

static void pool_free(model_t *r)
{
    free(r->dev);
    free(r->addr);
    free(r->val);
    free(r->present);
}

static void check_map(const devaddr_map_t *m, const model_t *r)
{
    EXPECT(devaddr_map_check(m, stderr) == 0, "checker");
    EXPECT(m->count == r->live, "count %zu, model %zu", m->count, r->live);
}

/* Every key of the pool: found with its value when present, not found otherwise. */
static void check_all(const devaddr_map_t *m, const model_t *r, bool payload)
{
    for (size_t i = 0; i < r->n; i++) {
        const ent_t *e = devaddr_map_find(m, r->dev[i], r->addr[i]);
        EXPECT(!e == !r->present[i], "key %zu (%" PRIu32 ", 0x%" PRIx64 "): found %d, model %d", i, r->dev[i],
               r->addr[i], e != NULL, r->present[i]);
        if (e) {
            EXPECT(e->key.dev == r->dev[i] && e->key.addr == r->addr[i] && e->key.used, "key %zu: header", i);
            if (payload)
                EXPECT(e->idx == i && e->val == r->val[i], "key %zu: payload", i);
        }
    }
}

/* The walk visits each entry once: as many as the model holds, each present in it. */
static void check_walk(const devaddr_map_t *m, const model_t *r, bool payload)
{
    size_t pos = 0, seen = 0;
    const ent_t *e;
    while ((e = devaddr_map_next(m, &pos))) {
        seen++;
        EXPECT(e->key.used, "walk: a free slot");
        if (payload) {
            EXPECT(e->idx < r->n && r->present[e->idx] && r->val[e->idx] == e->val, "walk: entry not in the model");
            EXPECT(r->dev[e->idx] == e->key.dev && r->addr[e->idx] == e->key.addr, "walk: key");
        }
    }
    EXPECT(seen == r->live, "walk saw %zu, model %zu", seen, r->live);
}

static void run(rng_t *g, size_t nkeys, size_t ops, bool payload)
{
    model_t r;
    pool_make(&r, g, nkeys);
    devaddr_map_t m;
    devaddr_map_init(&m, payload ? sizeof(ent_t) : sizeof(devaddr_entry_t));
    check_map(&m, &r);
    EXPECT(!devaddr_map_find(&m, 0, 0) && !devaddr_map_find(&m, UINT32_MAX, UINT64_MAX), "empty map finds");
    /* Phases lean toward inserts, then removes, so the map fills and drains more than once. */
    for (size_t op = 0; op < ops; op++) {
        unsigned insert_pct = (op / (ops / 6 + 1)) % 2 ? 35 : 65;
        size_t k = rng_below(g, r.n);
        unsigned what = (unsigned)rng_below(g, 100);
        ent_t *e = devaddr_map_find(&m, r.dev[k], r.addr[k]);
        EXPECT(!e == !r.present[k], "key %zu: found %d, model %d", k, e != NULL, r.present[k]);
        if (what < insert_pct) {
            if (!e) {
                /* Half the time through get, which must say the key was absent. */
                bool found = false;
                e = what % 2 ? devaddr_map_insert(&m, r.dev[k], r.addr[k])
                             : devaddr_map_get(&m, r.dev[k], r.addr[k], &found);
                EXPECT(e, "insert: out of memory");
                EXPECT(!found, "get: an absent key reported found");
                EXPECT(e->key.used && e->key.dev == r.dev[k] && e->key.addr == r.addr[k], "insert: header");
                if (payload) {
                    EXPECT(e->val == 0 && e->idx == 0, "insert: payload not zeroed");
                    e->val = rng_next(g);
                    e->idx = (uint32_t)k;
                    r.val[k] = e->val;
                }
                r.present[k] = true;
                r.live++;
            } else {
                /* get of a present key: that entry (it may have moved: get grows first). */
                bool found = false;
                e = devaddr_map_get(&m, r.dev[k], r.addr[k], &found);
                EXPECT(e && found && e->key.used && e->key.dev == r.dev[k] && e->key.addr == r.addr[k] &&
                           (!payload || e->val == r.val[k]),
                       "get of present key %zu: not its entry", k);
            }
        } else if (what < 95) {
            if (e) {
                devaddr_map_remove(&m, e);
                r.present[k] = false;
                r.live--;
                EXPECT(!devaddr_map_find(&m, r.dev[k], r.addr[k]), "found after remove");
            }
        } else if (payload && e) {
            /* The payload is the caller's: a change through find stays. */
            e->val = rng_next(g);
            r.val[k] = e->val;
        }
        check_map(&m, &r);
        if (op % 64 == 0 || r.n <= 64)
            check_all(&m, &r, payload);
        if (op % 512 == 0)
            check_walk(&m, &r, payload);
    }
    check_all(&m, &r, payload);
    check_walk(&m, &r, payload);

    /* Drain, then use again after free. */
    for (size_t i = 0; i < r.n; i++)
        if (r.present[i]) {
            devaddr_map_remove(&m, devaddr_map_find(&m, r.dev[i], r.addr[i]));
            r.present[i] = false;
            r.live--;
            check_map(&m, &r);
        }
    check_walk(&m, &r, payload);
    devaddr_map_free(&m);
    check_map(&m, &r);
    EXPECT(devaddr_map_insert(&m, UINT32_MAX, UINT64_MAX) && m.count == 1, "insert after free");
    EXPECT(devaddr_map_find(&m, UINT32_MAX, UINT64_MAX) && !devaddr_map_find(&m, UINT32_MAX, 0), "find after free");
    devaddr_map_free(&m);
    pool_free(&r);
}

static size_t slot_of(const devaddr_map_t *m, const void *e)
{
    return (size_t)((const unsigned char *)e - m->slots) / m->elem_size;
}

/* The home slot of (dev, addr) in a map of the first capacity: where it lands alone. */
static size_t home_alone(uint32_t dev, uint64_t addr)
{
    devaddr_map_t m;
    devaddr_map_init(&m, sizeof(ent_t));
    void *e = devaddr_map_insert(&m, dev, addr);
    EXPECT(e, "out of memory");
    size_t h = slot_of(&m, e);
    devaddr_map_free(&m);
    return h;
}

/* The checker finds what a broken map would get wrong. */
static void check_the_checker(void)
{
    /* Two keys with one home slot: the second lands right after the first, displaced. */
    uint64_t a = 0, b = 1;
    size_t h = home_alone(7, a);
    while (home_alone(7, b) != h)
        b++;
    devaddr_map_t m;
    devaddr_map_init(&m, sizeof(ent_t));
    ent_t *ea = devaddr_map_insert(&m, 7, a), *eb = devaddr_map_insert(&m, 7, b);
    EXPECT(ea && eb, "out of memory");
    EXPECT(slot_of(&m, ea) == h && slot_of(&m, eb) == ((h + 1) & m.mask), "the second key is not displaced");
    EXPECT(devaddr_map_check(&m, NULL) == 0, "a sound map");

    m.count++;
    EXPECT(devaddr_map_check(&m, NULL) == 1, "count off by one not found");
    m.count--;

    /* A free slot between b's home and b: lookups of b would stop there. */
    ea->key.used = false;
    m.count--;
    EXPECT(devaddr_map_check(&m, NULL) == 1, "entry cut off from its home not found");
    EXPECT(!devaddr_map_find(&m, 7, b), "the cut-off entry is found after all");
    ea->key.used = true;
    m.count++;

    /* b given a's key: two entries with one key. */
    eb->key.addr = a;
    EXPECT(devaddr_map_check(&m, NULL) == 1, "duplicate key not found");
    eb->key.addr = b;
    EXPECT(devaddr_map_check(&m, stderr) == 0, "restored");

    /* A capacity that is no power of two: homes mean nothing then. */
    m.mask--;
    EXPECT(devaddr_map_check(&m, NULL) == 1, "a capacity not a power of two not found");
    m.mask++;

    /* Half full (8 of 16 slots), then one entry more put at its own home without growing. */
    for (uint64_t k = 100; m.count < 8; k++)
        EXPECT(devaddr_map_insert(&m, 7, k), "out of memory");
    EXPECT(m.mask == 15 && devaddr_map_check(&m, stderr) == 0, "half full, not grown");
    size_t f = 0;
    while (((ent_t *)(void *)(m.slots + f * m.elem_size))->key.used)
        f++;
    uint64_t x = 1000;
    while (home_alone(7, x) != f || devaddr_map_find(&m, 7, x))
        x++;
    ent_t *ex = (ent_t *)(void *)(m.slots + f * m.elem_size);
    ex->key = (devaddr_entry_t){x, 7, true};
    m.count++;
    EXPECT(devaddr_map_check(&m, NULL) == 1, "more than half full not found");
    ex->key.used = false;
    m.count--;
    EXPECT(devaddr_map_check(&m, stderr) == 0, "restored");
    devaddr_map_free(&m);
}

/* u64map: every key storable, 0 and UINT64_MAX included (they are no empty-slot markers); a slot
 * of a new key starts at 0, and keeps its value. */
static void check_u64map(void)
{
    static const uint64_t keys[] = {0, UINT64_MAX, 1, UINT64_MAX - 1, (uint64_t)1 << 63, 512};
    const size_t n = sizeof keys / sizeof keys[0];
    u64map_t m;
    u64map_init(&m);
    for (size_t i = 0; i < n; i++) {
        EXPECT(!u64map_has(&m, keys[i]), "key %#llx present before insertion", (unsigned long long)keys[i]);
        bool found = true;
        uint64_t *v = u64map_slot(&m, keys[i], &found);
        EXPECT(v && !found && *v == 0, "key %#llx: a new slot", (unsigned long long)keys[i]);
        *v = i + 100;
    }
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        uint64_t *v = u64map_slot(&m, keys[i], &found);
        EXPECT(v && found && *v == i + 100 && u64map_has(&m, keys[i]), "key %#llx lost its value",
               (unsigned long long)keys[i]);
    }
    EXPECT(!u64map_has(&m, 2), "a key never inserted is present");
    EXPECT(devaddr_map_check(&m.map, stderr) == 0, "u64map's table is unsound");
    u64map_free(&m);
}

int main(void)
{
    rng_t g = {test_seed("test_devaddr_map")};
    check_the_checker();
    run(&g, 12, 20000, true);     /* a handful of keys: 16 to 32 slots, dense, wrapping */
    run(&g, 40, 20000, false);    /* header-only entries: a set */
    run(&g, 700, 40000, true);    /* growth to 2048 slots and back down to empty */
    check_u64map();
    printf("test_devaddr_map: ok\n");
    return 0;
}
