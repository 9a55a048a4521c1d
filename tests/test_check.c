/* test_check.c — the checker is tested too: starting from a consistent heap with allocated, free
 * and unmapped blocks, each field that an invariant binds is corrupted in turn, heap_check must
 * report it, and once the field is restored it must report nothing. */
#include "internal.h"
#include "testutil.h"

static int corruptions;

#define CORRUPT(h, lvalue, bad_value, what)                                              \
    do {                                                                                 \
        __typeof__(lvalue) saved_ = (lvalue);                                            \
        (lvalue) = (bad_value);                                                          \
        EXPECT(heap_check((h), NULL) > 0, "corruption not caught: %s", (what));          \
        (lvalue) = saved_;                                                               \
        EXPECT(heap_check((h), stderr) == 0, "restored heap not clean after: %s", (what)); \
        corruptions++;                                                                   \
    } while (0)

static heap_t *build(const char *text, void **ptrs, int n) {
    conf_t c;
    heap_t *h = test_sim_heap(text, &c);
    size_t sizes[] = {3 << 20, 512, 6 << 20, 100 << 10, 5 << 20, 2 << 20, 40 << 20, 7000};
    for (int i = 0; i < n; i++) EXPECT(heap_alloc(h, sizes[i % 8], NULL, &ptrs[i]) == CUA_SUCCESS, "alloc");
    for (int i = 0; i < n; i += 3) EXPECT(heap_free(h, ptrs[i], NULL), "free");
    EXPECT(heap_check(h, stderr) == 0, "built heap is consistent");
    return h;
}

static void corrupt_blocks(heap_t *h, void **ptrs, int n) {
    block_t *b = heap_test_find_block(h, ptrs[1]);
    EXPECT(b, "live block");
    CORRUPT(h, b->size, b->size + 512, "allocated block grown into its neighbour");
    CORRUPT(h, b->addr, b->addr + 512, "allocated block moved");
    CORRUPT(h, b->state, BLOCK_FREE, "allocated block marked free");
    CORRUPT(h, b->pool, (uint8_t)(b->pool ^ 1), "block claims the other pool");
    if (b->next) CORRUPT(h, b->next->prev, NULL, "broken back link");
    CORRUPT(h, b->next, NULL, "segment cut short");
    /* A free neighbour: its tag and state. */
    block_t *f = NULL;
    for (int i = 1; i < n && !f; i++) {
        if (i % 3 == 0) continue;
        block_t *x = heap_test_find_block(h, ptrs[i]);
        if (x && x->next && x->next->state == BLOCK_FREE) f = x->next;
    }
    EXPECT(f, "a free block next to a live one");
    CORRUPT(h, f->tag, (uint16_t)(f->tag + 7), "free block with a tag it is not indexed under");
    CORRUPT(h, f->state, BLOCK_ALLOCATED, "free block marked allocated");
    CORRUPT(h, f->size, f->size - 512, "free block shrunk");
    CORRUPT(h, f->releasable, f->releasable + 2 * MiB, "free block's releasable bytes stale");
}

/* VMM mode parks freed blocks on quick lists: their fields are bound too. */
static void corrupt_cached(heap_t *h, void **ptrs, int n) {
    block_t *q = NULL;
    for (int i = 0; i < n && !q; i++) {
        block_t *x = heap_test_find_block(h, ptrs[i]);
        if (!x) continue;
        if (x->next && x->next->state == BLOCK_CACHED) q = x->next;
        else if (x->prev && x->prev->state == BLOCK_CACHED) q = x->prev;
    }
    EXPECT(q, "a cached block next to a live one");
    CORRUPT(h, q->tag, (uint16_t)(q->tag + 3), "cached block on the list of another tag");
    CORRUPT(h, q->state, BLOCK_FREE, "cached block marked free but not indexed");
    CORRUPT(h, q->link.list.next_free, q, "quick list looping on itself");
}

/* VMM: the pools' tables of live blocks (by address), which every free looks in. */
static void corrupt_live_tables(heap_t *h, void **ptrs, int n) {
    block_t *small = NULL, *large = NULL, *free_small = NULL;
    for (int i = 0; i < n; i++) {
        block_t *x = heap_test_find_block(h, ptrs[i]);
        if (!x) continue;
        if (x->pool == POOL_SMALL && !small) small = x;
        if (x->pool == POOL_LARGE && !large) large = x;
        if (x->pool == POOL_SMALL && x->next && x->next->state == BLOCK_FREE) free_small = x->next;
    }
    EXPECT(small && large && free_small, "a live block in each pool, and a free small one");
    block_t **slot = heap_test_live_slot(h, (void *)small->addr);
    EXPECT(slot && *slot == small, "the small block is in its slot");
    CORRUPT(h, *slot, NULL, "allocated small block missing from the live table");
    slot = heap_test_live_slot(h, (void *)large->addr);
    EXPECT(slot && *slot == large, "the large block is in its slot");
    CORRUPT(h, *slot, NULL, "allocated large block missing from the live table");
    slot = heap_test_live_slot(h, (void *)free_small->addr);
    CORRUPT(h, *slot, free_small, "free small block in the live table");
    /* A stray entry where no block starts: inside a live block, and in a mapped chunk's free space. */
    block_t *wide = NULL;
    for (int i = 0; i < n && !wide; i++) {
        block_t *x = heap_test_find_block(h, ptrs[i]);
        if (x && x->pool == POOL_SMALL && x->size > CUALLOC_ALIGN) wide = x;
    }
    EXPECT(wide, "a small block wider than 512 B");
    CORRUPT(h, *heap_test_live_slot(h, (void *)(wide->addr + CUALLOC_ALIGN)), wide, "stray entry inside a live block");
    CORRUPT(h, *heap_test_live_slot(h, (void *)(free_small->addr + CUALLOC_ALIGN)), small, "stray entry in free space");
}

static void corrupt_stats(heap_t *h) {
    cualloc_stats *s = heap_test_stats(h);
    CORRUPT(h, s->allocated_bytes, s->allocated_bytes + 512, "allocated_bytes off by 512");
    CORRUPT(h, s->reserved_bytes, s->reserved_bytes - 2 * MiB, "reserved_bytes off by a chunk");
    CORRUPT(h, s->requested_bytes, s->allocated_bytes + 1, "requested above allocated");
    CORRUPT(h, s->num_frees, s->num_frees + 1, "free count off by one");
    CORRUPT(h, s->inactive_split_bytes, s->inactive_split_bytes + 512, "inactive split stale");
}

/* Stream generations: S's open tag closed by T's miss. Tags are handed out lowest first: S gets
 * 1, T 2, and closing S's tag 1 gives S the open tag 3. */
static void corrupt_generations(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:256", &c);
    cua_stream s = sim_stream_create(0, true), t = sim_stream_create(0, true);
    void *a = NULL, *sep = NULL, *b = NULL;
    EXPECT(heap_alloc(h, 4 << 20, s, &a) == CUA_SUCCESS && heap_alloc(h, 2 << 20, s, &sep) == CUA_SUCCESS, "alloc");
    EXPECT(heap_free(h, a, s), "free");
    EXPECT(heap_alloc(h, 4 << 20, t, &b) == CUA_SUCCESS && b != a, "T's miss");
    bool *closed1, *flight1, *closed2, *flight2, *closed3, *flight3;
    uint16_t *partner1, *partner2, *partner3;
    heap_test_tag_fields(h, 1, &closed1, &flight1, &partner1);
    heap_test_tag_fields(h, 2, &closed2, &flight2, &partner2);
    heap_test_tag_fields(h, 3, &closed3, &flight3, &partner3);
    EXPECT(*closed1 && *flight1 && *partner1 == 3 && !*closed3 && *partner3 == 1 && !*closed2 && !*partner2,
           "S's first tag closed, its partner the open tag 3");
    EXPECT(heap_check(h, stderr) == 0, "consistent");
    CORRUPT(h, *closed1, false, "a closed tag marked open (two open tags of one stream)");
    CORRUPT(h, *flight1, false, "a closed tag whose event is not in flight");
    CORRUPT(h, *partner1, 2, "a closed tag partnered with another stream's tag");
    CORRUPT(h, *partner3, 0, "an open tag that forgot its closed partner");
    CORRUPT(h, *closed2, true, "an open tag marked closed without a partner");
    CORRUPT(h, *flight2, true, "an open tag with an event in flight");
    EXPECT(heap_free(h, sep, s) && heap_free(h, b, t), "free");
    heap_destroy(h);
    sim_stream_destroy(s);
    sim_stream_destroy(t);
}

int main(void) {
    void *ptrs[24];
    heap_t *h = build("sim_memory_mb:512", ptrs, 24);
    corrupt_blocks(h, ptrs, 24);
    corrupt_cached(h, ptrs, 24);
    corrupt_live_tables(h, ptrs, 24);
    corrupt_stats(h);
    cua_memhandle *chunk = heap_test_chunk(h, ptrs[1]);
    EXPECT(chunk && *chunk, "chunk under a live block is mapped");
    CORRUPT(h, *chunk, 0, "chunk under a live block forgotten");
    heap_destroy(h);

    corrupt_generations();

    h = build("sim_memory_mb:512,expandable_segments:0", ptrs, 24);
    corrupt_blocks(h, ptrs, 24);
    corrupt_stats(h);
    heap_destroy(h);
    printf("test_check: %d corruptions caught\n", corruptions);
    return 0;
}
