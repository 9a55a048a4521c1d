/* test_index.c — the free indexes (sizeclass TLSF bins, classic treap), the address map and the
 * slab, each driven by random operations against a brute-force model with the checker after every
 * operation; then each checker against its structure damaged one way at a time (loops included:
 * the checker must end). */
#include "internal.h"
#include "testutil.h"

#define N 2000

/* Sets lvalue to bad_value: the checker call `check` must report it; restored, it must report
 * nothing. */
#define CORRUPT(check, lvalue, bad_value, what)                                    \
    do {                                                                           \
        __typeof__(lvalue) saved_ = (lvalue);                                      \
        (lvalue) = (bad_value);                                                    \
        EXPECT((check) > 0, "corruption not caught: %s", (what));                  \
        (lvalue) = saved_;                                                         \
        EXPECT((check) == 0, "restored structure not clean after: %s", (what));    \
    } while (0)

static block_t blocks[N];
static bool in_index[N];

static void test_mapping(void) {
    unsigned pfl = 0, psl = 0;
    for (size_t size = 512; size < ((size_t)1 << 44); size += size / 7 / 512 * 512 + 512) {
        unsigned fl, sl;
        sizeclass_mapping(size, &fl, &sl);
        EXPECT(fl < SC_FL_COUNT && sl < SC_SL_COUNT, "size %zu maps to (%u,%u)", size, fl, sl);
        EXPECT(fl > pfl || (fl == pfl && sl >= psl), "mapping not monotone at %zu", size);
        pfl = fl;
        psl = sl;
    }
    unsigned fl, sl;
    sizeclass_mapping(512 * 31, &fl, &sl);
    EXPECT(fl == 0 && sl == 31, "small sizes have exact bins");
    sizeclass_mapping(512 * 32, &fl, &sl);
    EXPECT(fl == 1 && sl == 0, "first ranged bin");
    /* Every size a size_t holds has a bin, not only requests: a VMM pool's UNMAPPED blocks are as
     * large as its reservation (va_factor 1024 times a 1 PiB sim device is 2^60 B). */
    for (unsigned shift = 44; shift < 64; shift++) {
        size_t size = (size_t)1 << shift;
        sizeclass_mapping(size, &fl, &sl);
        EXPECT(fl < SC_FL_COUNT && sl < SC_SL_COUNT, "size 2^%u maps to (%u,%u)", shift, fl, sl);
    }
    sizeclass_mapping(SIZE_MAX & ~(size_t)511, &fl, &sl);
    EXPECT(fl < SC_FL_COUNT && sl < SC_SL_COUNT, "the largest size maps to (%u,%u)", fl, sl);
    EXPECT(fl > pfl, "mapping not monotone past 2^44");
    /* An index holding such a block: found, the largest, and consistent. */
    sizeclass_t sc;
    sizeclass_init(&sc);
    block_t huge = {.addr = (uintptr_t)1 << 40, .size = (size_t)1 << 60}, small = {.addr = 512, .size = 512};
    sizeclass_insert(&sc, &small);
    sizeclass_insert(&sc, &huge);
    EXPECT(sizeclass_check(&sc, stderr) == 0, "an index with a 2^60 B block is damaged");
    EXPECT(sizeclass_find(&sc, (size_t)1 << 59) == &huge && sizeclass_largest(&sc) == &huge, "2^60 B block not found");
    EXPECT(sizeclass_find(&sc, 512) == &small, "the small block is not found beside the huge one");
    sizeclass_remove(&sc, &huge);
    EXPECT(sizeclass_check(&sc, stderr) == 0 && sc.count == 1 && sc.bytes == 512, "removing the 2^60 B block");
}

static void test_sizeclass(rng_t *r) {
    sizeclass_t sc;
    sizeclass_init(&sc);
    memset(in_index, 0, sizeof in_index);
    for (int i = 0; i < N; i++) {
        blocks[i].addr = (uintptr_t)(i + 1) << 30;
        blocks[i].size = rng_below(r, 3) ? (rng_below(r, 64) + 1) * 512 : (rng_below(r, 1u << 20) + 1) * 512;
    }
    for (int step = 0; step < 20000; step++) {
        int i = (int)rng_below(r, N);
        if (in_index[i]) sizeclass_remove(&sc, &blocks[i]);
        else sizeclass_insert(&sc, &blocks[i]);
        in_index[i] = !in_index[i];
        size_t want = (rng_below(r, 2) ? rng_below(r, 64) + 1 : rng_below(r, 1u << 20) + 1) * 512;
        block_t *got = sizeclass_find(&sc, want);
        size_t best = SIZE_MAX, largest = 0;
        for (int j = 0; j < N; j++) {
            if (!in_index[j]) continue;
            if (blocks[j].size >= want && blocks[j].size < best) best = blocks[j].size;
            if (blocks[j].size > largest) largest = blocks[j].size;
        }
        if (best == SIZE_MAX) {
            EXPECT(!got, "found a block of %zu for %zu where none fits", got->size, want);
        } else {
            EXPECT(got && got->size >= want, "no fit for %zu though %zu exists", want, best);
            /* good fit: within the request's own bin width of the best */
            EXPECT(got->size <= best + best / 16 + 512 * 32, "fit %zu far from best %zu for %zu", got->size, best, want);
        }
        block_t *lg = sizeclass_largest(&sc);
        EXPECT(lg ? lg->size == largest : largest == 0, "largest wrong");
        EXPECT(sizeclass_check(&sc, stderr) == 0, "sizeclass_check failed at step %d", step);
    }
    /* The checker catches each kind of damage, and nothing once it is undone. A bin with two
     * blocks or more gives a middle link to break. */
    block_t *victim = NULL, *second = NULL;
    for (unsigned bin = 0; bin < SC_FL_COUNT * SC_SL_COUNT && !second; bin++)
        if (sc.bins[bin] && sc.bins[bin]->link.list.next_free) {
            victim = sc.bins[bin];
            second = victim->link.list.next_free;
        }
    EXPECT(second, "a bin with two blocks");
    unsigned vfl = victim->bin / SC_SL_COUNT, vsl = victim->bin % SC_SL_COUNT;
    unsigned empty_fl = SC_FL_COUNT - 1;
    while (sc.sl_bitmap[empty_fl]) empty_fl--;
    CORRUPT(sizeclass_check(&sc, NULL), victim->size, victim->size + 512 * 1024 * 64, "a block in the wrong bin");
    CORRUPT(sizeclass_check(&sc, NULL), victim->bin, (uint16_t)(victim->bin + 1), "a block recording another bin");
    CORRUPT(sizeclass_check(&sc, NULL), sc.bytes, sc.bytes + 1, "a wrong byte count");
    CORRUPT(sizeclass_check(&sc, NULL), sc.count, sc.count - 1, "a wrong block count");
    CORRUPT(sizeclass_check(&sc, NULL), sc.fl_bitmap, sc.fl_bitmap ^ (1ull << empty_fl), "a first-level bit without bins");
    CORRUPT(sizeclass_check(&sc, NULL), sc.fl_bitmap, sc.fl_bitmap ^ (1ull << vfl), "a first-level bit cleared");
    CORRUPT(sizeclass_check(&sc, NULL), sc.sl_bitmap[vfl], sc.sl_bitmap[vfl] ^ (1u << vsl), "a non-empty bin's bit cleared");
    CORRUPT(sizeclass_check(&sc, NULL), second->link.list.prev_free, NULL, "a broken back link");
    CORRUPT(sizeclass_check(&sc, NULL), victim->link.list.prev_free, second, "a head with a back link");
    /* Lists that loop: the checker ends. */
    CORRUPT(sizeclass_check(&sc, NULL), second->link.list.next_free, victim, "a list looping back to its head");
    CORRUPT(sizeclass_check(&sc, NULL), second->link.list.next_free, second, "a block linked to itself");
}

/* Resizing a block in place (sizeclass_resize, and sizeclass_resize_only while it is the index's
 * only block) leaves the index exactly as removing it and inserting it at the new size would: the
 * same blocks in the same order in every bin, the same bitmaps and totals. Two indexes over twin
 * blocks, one resized in place, the other removed and inserted, compared after every step; sizes
 * cross bins and first levels, and the index often holds a single block. */
static block_t twins[N];

static void expect_same_index(const sizeclass_t *a, const sizeclass_t *b, int step) {
    EXPECT(a->fl_bitmap == b->fl_bitmap && a->count == b->count && a->bytes == b->bytes,
           "step %d: bitmap, count or bytes differ from remove and insert", step);
    for (unsigned fl = 0; fl < SC_FL_COUNT; fl++) {
        EXPECT(a->sl_bitmap[fl] == b->sl_bitmap[fl], "step %d: level %u's bitmap differs", step, fl);
        for (unsigned sl = 0; sl < SC_SL_COUNT; sl++) {
            const block_t *x = a->bins[SC_BIN(fl, sl)], *y = b->bins[SC_BIN(fl, sl)];
            for (; x && y; x = x->link.list.next_free, y = y->link.list.next_free)
                EXPECT(x - blocks == y - twins, "step %d: bin (%u, %u) holds another block or order", step, fl, sl);
            EXPECT(!x && !y, "step %d: bin (%u, %u) has another length", step, fl, sl);
        }
    }
}

static void test_sizeclass_resize(rng_t *r) {
    enum { LIVE = 3 }; /* few blocks, so that one alone in the index is common */
    sizeclass_t a, b;
    sizeclass_init(&a);
    sizeclass_init(&b);
    memset(in_index, 0, sizeof in_index);
    memset(blocks, 0, sizeof blocks);
    memset(twins, 0, sizeof twins);
    int only_resizes = 0;
    for (int step = 0; step < 20000; step++) {
        int i = (int)rng_below(r, LIVE);
        /* Large and small sizes, and steps of a few MiB around a large remainder's size. */
        size_t size = rng_below(r, 4) == 0 ? (rng_below(r, 64) + 1) * 512
                      : rng_below(r, 2)    ? (rng_below(r, 1u << 20) + 1) * 512
                                           : ((size_t)64 << 20) + (rng_below(r, 48) + 1) * ((size_t)1 << 20);
        if (!in_index[i] && rng_below(r, 4) != 0) {
            /* nothing: blocks enter a quarter as often as they leave, so one is often alone */
        } else if (!in_index[i] || rng_below(r, 3) == 0) {
            if (in_index[i]) {
                sizeclass_remove(&a, &blocks[i]);
                sizeclass_remove(&b, &twins[i]);
            } else {
                blocks[i].addr = twins[i].addr = (uintptr_t)(i + 1) << 30;
                blocks[i].size = twins[i].size = size;
                sizeclass_insert(&a, &blocks[i]);
                sizeclass_insert(&b, &twins[i]);
            }
            in_index[i] = !in_index[i];
        } else {
            if (a.count == 1) {
                EXPECT(sizeclass_only(&a) == &blocks[i], "step %d: sizeclass_only is not the one block", step);
                sizeclass_resize_only(&a, &blocks[i], size);
                only_resizes++;
            } else {
                sizeclass_resize(&a, &blocks[i], size);
            }
            sizeclass_remove(&b, &twins[i]);
            twins[i].size = size;
            sizeclass_insert(&b, &twins[i]);
        }
        EXPECT(sizeclass_check(&a, stderr) == 0, "sizeclass_check after step %d", step);
        expect_same_index(&a, &b, step);
    }
    EXPECT(only_resizes > 1000, "the single-block case came up %d times", only_resizes);
}

/* The own bin's scan is cut short (more than SC_OWN_BIN_SCAN blocks too small, then the fit) and
 * the next non-empty bin is far above: the fit further down the own bin is found, not a block two
 * bins up. With the adjacent bin non-empty instead, its first block is good enough (one bin). */
static void test_sizeclass_cut_scan(void) {
    enum { SMALLER = SC_OWN_BIN_SCAN + 3 };
    block_t small[SMALLER], fit, far, near;
    sizeclass_t sc;
    sizeclass_init(&sc);
    size_t want = 283125760, bin_lo = 276824064; /* bin [264 MiB, 272 MiB) of [256 MiB, 512 MiB) */
    memset(&fit, 0, sizeof fit);
    fit.addr = 1u << 30;
    fit.size = want + 65536;
    sizeclass_insert(&sc, &fit); /* inserted first: the bin's list is newest first, so it is last */
    for (int i = 0; i < SMALLER; i++) {
        memset(&small[i], 0, sizeof small[i]);
        small[i].addr = (uintptr_t)(i + 2) << 30;
        small[i].size = bin_lo + (size_t)i * 512;
        sizeclass_insert(&sc, &small[i]);
    }
    memset(&far, 0, sizeof far);
    far.addr = (uintptr_t)40 << 30;
    far.size = 301271040;
    sizeclass_insert(&sc, &far);
    EXPECT(sizeclass_find(&sc, want) == &fit, "a cut scan took %zu B two bins up over the fit in its own bin",
           sizeclass_find(&sc, want)->size);
    memset(&near, 0, sizeof near);
    near.addr = (uintptr_t)41 << 30;
    near.size = bin_lo + 8 * 1048576; /* the adjacent bin */
    sizeclass_insert(&sc, &near);
    EXPECT(sizeclass_find(&sc, want) == &near, "with the adjacent bin non-empty, its block is taken");
    EXPECT(sizeclass_check(&sc, stderr) == 0, "sizeclass_check");
}

static void test_tree(rng_t *r) {
    tree_t t;
    tree_init(&t);
    memset(in_index, 0, sizeof in_index);
    for (int i = 0; i < N; i++) {
        blocks[i].addr = (uintptr_t)(rng_below(r, 1000) + 1) << 20 | (uintptr_t)i << 9;
        blocks[i].size = (rng_below(r, 200) + 1) * 512;
    }
    for (int step = 0; step < 20000; step++) {
        int i = (int)rng_below(r, N);
        if (in_index[i]) tree_remove(&t, &blocks[i]);
        else tree_insert(&t, &blocks[i]);
        in_index[i] = !in_index[i];
        size_t want = (rng_below(r, 210) + 1) * 512;
        const block_t *best = NULL, *largest = NULL;
        for (int j = 0; j < N; j++) {
            if (!in_index[j]) continue;
            if (!largest || blocks[j].size > largest->size || (blocks[j].size == largest->size && blocks[j].addr > largest->addr))
                largest = &blocks[j];
            if (blocks[j].size < want) continue;
            if (!best || blocks[j].size < best->size || (blocks[j].size == best->size && blocks[j].addr < best->addr))
                best = &blocks[j];
        }
        EXPECT(tree_lower_bound(&t, want) == best, "lower bound for %zu is not PyTorch's best fit", want);
        EXPECT(tree_largest(&t) == largest, "largest is not the last in (size, addr) order");
        EXPECT(tree_check(&t, stderr) == 0, "tree_check failed at step %d", step);
    }
    /* The checker catches each kind of damage, and nothing once it is undone. */
    block_t *root = t.root, *child = root->link.tree.left ? root->link.tree.left : root->link.tree.right;
    EXPECT(child, "a root with a child");
    CORRUPT(tree_check(&t, NULL), tree_largest(&t)->size, 0, "key order broken");
    CORRUPT(tree_check(&t, NULL), child->prio, root->prio + 1, "a child above its parent's priority");
    CORRUPT(tree_check(&t, NULL), t.count, t.count + 1, "a wrong block count");
    CORRUPT(tree_check(&t, NULL), t.bytes, t.bytes - 512, "a wrong byte count");
    /* Links that loop: the checker ends. */
    block_t *leaf = tree_largest(&t);
    CORRUPT(tree_check(&t, NULL), leaf->link.tree.right, leaf, "a node linked to itself");
    {
        /* Both links of the largest back to the root: a walk without a bound would branch at every
         * lap (2^laps paths). */
        block_t *saved_left = leaf->link.tree.left;
        leaf->link.tree.left = leaf->link.tree.right = root;
        EXPECT(tree_check(&t, NULL) > 0, "corruption not caught: both links of a node back to the root");
        leaf->link.tree.left = saved_left;
        leaf->link.tree.right = NULL;
        EXPECT(tree_check(&t, stderr) == 0, "restored tree not clean after: links back to the root");
    }
}

static void test_ptrmap(rng_t *r) {
    ptrmap_t m;
    EXPECT(ptrmap_init(&m), "init");
    memset(in_index, 0, sizeof in_index);
    /* Distinct addresses (i in the low bits), at random: sequential ones hash to distinct slots
     * (Fibonacci hashing spreads them evenly), which would leave probe runs and shifts untried. */
    for (int i = 0; i < N; i++) blocks[i].addr = 0x7f0000000000ull + ((uintptr_t)rng_below(r, 1u << 20) << 11 | (uintptr_t)i) * 512;
    size_t displaced = 0;
    for (int step = 0; step < 30000; step++) {
        int i = (int)rng_below(r, N);
        if (in_index[i]) EXPECT(ptrmap_remove(&m, blocks[i].addr) == &blocks[i], "remove returns the block");
        else EXPECT(ptrmap_insert(&m, blocks[i].addr, &blocks[i]), "insert");
        in_index[i] = !in_index[i];
        int k = (int)rng_below(r, N);
        EXPECT(ptrmap_get(&m, blocks[k].addr) == (in_index[k] ? &blocks[k] : NULL), "get disagrees with the model");
        EXPECT(ptrmap_check(&m, stderr) == 0, "ptrmap_check failed at step %d", step);
        size_t at = ptrmap_find(&m, blocks[i].addr);
        displaced += m.slots[at].key && at != ptrmap_home(&m, blocks[i].addr);
    }
    EXPECT(displaced > 1000, "only %zu operations met a displaced key: probe runs untried", displaced);
    EXPECT(ptrmap_remove(&m, 12345 * 512) == NULL, "removing an absent key");
    /* The checker catches each kind of damage, and nothing once it is undone. A displaced key (not
     * at its home slot) and the slot before it give a probe run to break. */
    size_t empty = 0, moved = 0;
    while (m.slots[empty].key) empty++;
    while (!m.slots[moved].key || ptrmap_home(&m, m.slots[moved].key) == moved) moved++;
    size_t before = (moved - 1) & m.mask;
    block_t *other = m.slots[moved].val == &blocks[0] ? &blocks[1] : &blocks[0];
    CORRUPT(ptrmap_check(&m, NULL), m.count, m.count + 1, "a wrong count");
    CORRUPT(ptrmap_check(&m, NULL), m.slots[empty].val, &blocks[0], "a block in an empty slot"); /* a missing key found */
    CORRUPT(ptrmap_check(&m, NULL), m.slots[moved].val, other, "a key mapping to a block at another address");
    CORRUPT(ptrmap_check(&m, NULL), m.slots[before], m.slots[moved], "a key twice in its probe run");
    {
        ptrmap_entry_t saved = m.slots[before];
        m.slots[before] = (ptrmap_entry_t){0, NULL};
        m.count--;
        EXPECT(ptrmap_check(&m, NULL) > 0, "corruption not caught: a key cut off from its home by an empty slot");
        m.slots[before] = saved;
        m.count++;
        EXPECT(ptrmap_check(&m, stderr) == 0, "restored map not clean after: a key cut off from its home");
    }
    CORRUPT(ptrmap_check(&m, NULL), m.shift, m.shift - 1, "a shift that does not match the capacity");
    CORRUPT(ptrmap_check(&m, NULL), m.mask, m.mask - 1, "a capacity not a power of two");
    {
        /* More than half full: keys placed where their home is, without growing. */
        size_t cap = m.mask + 1, added = 0;
        static block_t extra[4096];
        for (size_t e = 0; m.count * 2 <= cap && e < sizeof extra / sizeof extra[0]; e++) {
            extra[e].addr = 0x100000000000ull + e * 512;
            if (ptrmap_get(&m, extra[e].addr)) continue;
            ptrmap_place(&m, extra[e].addr, &extra[e]);
            m.count++;
            added++;
        }
        EXPECT(m.count * 2 > cap && ptrmap_check(&m, NULL) > 0, "corruption not caught: more than half full");
        for (size_t e = 0; added; e++)
            if (ptrmap_remove(&m, extra[e].addr)) added--;
        EXPECT(ptrmap_check(&m, stderr) == 0, "restored map not clean after: more than half full");
    }
    ptrmap_destroy(&m);
}

/* Random allocations and frees against the set of records handed out: each record zeroed (or, from
 * slab_alloc_uninit, any bytes) and apart from every other live one, whose bytes stay as written;
 * the live count the model's; the checker after every operation. */
#define SLAB_RECS 3000
static void test_slab(rng_t *r) {
    slab_t s;
    slab_init(&s, sizeof(block_t));
    static unsigned char *recs[SLAB_RECS];
    memset(recs, 0, sizeof recs);
    size_t live = 0;
    for (int step = 0; step < 20000; step++) {
        size_t i = (size_t)rng_below(r, SLAB_RECS);
        /* Phases that lean toward allocation, then toward freeing, so the free list fills and drains. */
        bool grow = (step / 4000) % 2 == 0;
        if (recs[i] && rng_below(r, 100) < (grow ? 30u : 80u)) {
            for (size_t j = 0; j < sizeof(block_t); j++)
                EXPECT(recs[i][j] == (unsigned char)i, "record %zu's byte %zu was overwritten", i, j);
            slab_free(&s, recs[i]);
            recs[i] = NULL;
            live--;
        } else if (!recs[i]) {
            bool zeroed = rng_below(r, 2);
            recs[i] = zeroed ? slab_alloc(&s) : slab_alloc_uninit(&s);
            EXPECT(recs[i], "slab_alloc");
            EXPECT((uintptr_t)recs[i] % 16 == 0, "record %p not 16-byte aligned", (void *)recs[i]);
            if (zeroed)
                for (size_t j = 0; j < sizeof(block_t); j++) EXPECT(recs[i][j] == 0, "record not zeroed");
            memset(recs[i], (int)(unsigned char)i, sizeof(block_t));
            live++;
        }
        EXPECT(s.live == live, "live count %zu, model %zu", s.live, live);
        EXPECT(slab_check(&s, stderr) == 0, "slab_check failed at step %d", step);
    }
#ifndef CUALLOC_SLAB_MALLOC
    /* The checker catches each kind of damage, and nothing once it is undone. */
    void *a = NULL, *b = NULL;
    for (size_t i = 0; i < SLAB_RECS && !b; i++)
        if (recs[i]) {
            if (a) b = recs[i];
            else a = recs[i];
        }
    EXPECT(b, "two live records");
    static block_t outside;
    for (size_t i = SLAB_RECS; i-- > 0 && !s.free_list;) /* a free record for the cases below */
        if (recs[i] && recs[i] != a && recs[i] != b) {
            slab_free(&s, recs[i]);
            recs[i] = NULL;
        }
    EXPECT(s.free_list, "free records");
    CORRUPT(slab_check(&s, NULL), s.live, s.live + 1, "a wrong live count");
    {
        /* A record freed twice: on the free list, and counted free twice. */
        void *saved_head = s.free_list;
        slab_free(&s, a);
        slab_free(&s, a);
        EXPECT(slab_check(&s, NULL) > 0, "corruption not caught: a record freed twice");
        s.free_list = saved_head;
        s.live += 2;
        EXPECT(slab_check(&s, stderr) == 0, "restored slab not clean after: a record freed twice");
    }
    {
        /* A record both handed out and free. */
        void *saved_head = s.free_list;
        *(void **)b = s.free_list;
        s.free_list = b;
        EXPECT(slab_check(&s, NULL) > 0, "corruption not caught: a live record on the free list");
        s.free_list = saved_head;
        EXPECT(slab_check(&s, stderr) == 0, "restored slab not clean after: a live record on the free list");
    }
    {
        /* In the place of the first free record, so that the counts still agree. */
        void *saved_head = s.free_list;
        *(void **)(void *)&outside = *(void **)s.free_list;
        s.free_list = &outside;
        EXPECT(slab_check(&s, NULL) > 0, "corruption not caught: a foreign record on the free list");
        s.free_list = saved_head;
        EXPECT(slab_check(&s, stderr) == 0, "restored slab not clean after: a foreign record on the free list");
    }
    CORRUPT(slab_check(&s, NULL), s.free_list, (void *)((char *)s.free_list + 8), "a free record off its start");
    CORRUPT(slab_check(&s, NULL), s.cur, s.cur + 8, "a carving point off a record boundary");
#endif
    for (size_t i = 0; i < SLAB_RECS; i++)
        if (recs[i]) slab_free(&s, recs[i]);
    EXPECT(s.live == 0 && slab_check(&s, stderr) == 0, "live count after frees");
    slab_destroy(&s);
}

int main(void) {
    rng_t r = {test_seed("test_index")};
    test_mapping();
    test_sizeclass(&r);
    test_sizeclass_resize(&r);
    test_sizeclass_cut_scan();
    test_tree(&r);
    test_ptrmap(&r);
    test_slab(&r);
    printf("test_index: ok\n");
    return 0;
}
