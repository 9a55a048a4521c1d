/* test_index.c — the free indexes (sizeclass TLSF bins, classic treap), the address map and the
 * slab, each driven by random operations against a brute-force model with the checker after every
 * operation. */
#include "internal.h"
#include "testutil.h"

#define N 2000

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
        if (step % 64 == 0) EXPECT(sizeclass_check(&sc, stderr) == 0, "sizeclass_check failed at step %d", step);
    }
    /* The checker catches damage. */
    block_t *victim = NULL;
    for (int j = 0; j < N && !victim; j++) if (in_index[j]) victim = &blocks[j];
    size_t saved = victim->size;
    victim->size += 512 * 1024 * 64;
    EXPECT(sizeclass_check(&sc, NULL) > 0, "a block in the wrong bin goes unnoticed");
    victim->size = saved;
    sc.bytes++;
    EXPECT(sizeclass_check(&sc, NULL) > 0, "a wrong byte count goes unnoticed");
    sc.bytes--;
    sc.fl_bitmap ^= 1ull << 39;
    EXPECT(sizeclass_check(&sc, NULL) > 0, "a wrong bitmap goes unnoticed");
    sc.fl_bitmap ^= 1ull << 39;
    EXPECT(sizeclass_check(&sc, stderr) == 0, "restored index is clean");
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
        const block_t *best = NULL;
        for (int j = 0; j < N; j++) {
            if (!in_index[j] || blocks[j].size < want) continue;
            if (!best || blocks[j].size < best->size || (blocks[j].size == best->size && blocks[j].addr < best->addr))
                best = &blocks[j];
        }
        EXPECT(tree_lower_bound(&t, want) == best, "lower bound for %zu is not PyTorch's best fit", want);
        if (step % 128 == 0) EXPECT(tree_check(&t, stderr) == 0, "tree_check failed at step %d", step);
    }
    block_t *any = tree_largest(&t);
    size_t saved = any->size;
    any->size = 0;
    EXPECT(tree_check(&t, NULL) > 0, "order damage goes unnoticed");
    any->size = saved;
    EXPECT(tree_check(&t, stderr) == 0, "restored tree is clean");
}

static void test_ptrmap(rng_t *r) {
    ptrmap_t m;
    EXPECT(ptrmap_init(&m), "init");
    memset(in_index, 0, sizeof in_index);
    for (int i = 0; i < N; i++) blocks[i].addr = 0x7f0000000000ull + ((uintptr_t)i * 512 * (rng_below(r, 3) + 1));
    for (int i = 0; i < N; i++) blocks[i].addr = 0x7f0000000000ull + (uintptr_t)i * 1536;
    for (int step = 0; step < 50000; step++) {
        int i = (int)rng_below(r, N);
        if (in_index[i]) EXPECT(ptrmap_remove(&m, blocks[i].addr) == &blocks[i], "remove returns the block");
        else EXPECT(ptrmap_insert(&m, blocks[i].addr, &blocks[i]), "insert");
        in_index[i] = !in_index[i];
        int k = (int)rng_below(r, N);
        EXPECT(ptrmap_get(&m, blocks[k].addr) == (in_index[k] ? &blocks[k] : NULL), "get disagrees with the model");
        if (step % 500 == 0) EXPECT(ptrmap_check(&m, stderr) == 0, "ptrmap_check failed at step %d", step);
    }
    EXPECT(ptrmap_remove(&m, 12345 * 512) == NULL, "removing an absent key");
    m.count++;
    EXPECT(ptrmap_check(&m, NULL) > 0, "a wrong count goes unnoticed");
    m.count--;
    size_t empty = 0;
    while (m.slots[empty].key) empty++;
    m.slots[empty].val = &blocks[0]; /* a missing key would then be found */
    EXPECT(ptrmap_check(&m, NULL) > 0, "a block in an empty slot goes unnoticed");
    m.slots[empty].val = NULL;
    EXPECT(ptrmap_check(&m, stderr) == 0, "restored map is clean");
    ptrmap_destroy(&m);
}

static void test_slab(void) {
    slab_t s;
    slab_init(&s, sizeof(block_t));
    void *recs[5000];
    for (int i = 0; i < 5000; i++) {
        recs[i] = slab_alloc(&s);
        EXPECT(recs[i], "slab_alloc");
        for (size_t j = 0; j < sizeof(block_t); j++) EXPECT(((unsigned char *)recs[i])[j] == 0, "record not zeroed");
        memset(recs[i], 0xab, sizeof(block_t));
    }
    EXPECT(s.live == 5000, "live count");
    for (int i = 0; i < 5000; i += 2) slab_free(&s, recs[i]);
    for (int i = 0; i < 5000; i += 2) {
        recs[i] = slab_alloc(&s);
        for (size_t j = 0; j < sizeof(block_t); j++) EXPECT(((unsigned char *)recs[i])[j] == 0, "reused record not zeroed");
    }
    for (int i = 0; i < 5000; i++) slab_free(&s, recs[i]);
    EXPECT(s.live == 0, "live count after frees");
    slab_destroy(&s);
}

int main(void) {
    rng_t r = {test_seed("test_index")};
    test_mapping();
    test_sizeclass(&r);
    test_sizeclass_cut_scan();
    test_tree(&r);
    test_ptrmap(&r);
    test_slab();
    printf("test_index: ok\n");
    return 0;
}
