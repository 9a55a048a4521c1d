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
    /* A list that loops: the checker ends. */
    CORRUPT(h, b->next, b, "a block linked to itself");
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
    CORRUPT(h, *heap_test_live_slot(h, (void *)q->addr), NULL, "cached block missing from the live table");
    CORRUPT(h, q->tag, TAG_DW_A, "cached block tagged device-wide");
    CORRUPT(h, q->pool, POOL_LARGE, "a large-pool block on a quick list");
    bool *closed, *in_flight;
    uint16_t *partner;
    heap_test_tag_fields(h, q->tag, &closed, &in_flight, &partner);
    CORRUPT(h, *closed, true, "cached block of a closed tag");
    /* Its list: the count, the non-empty bit. */
    uint64_t *key, *word;
    uint32_t *count;
    unsigned bit;
    heap_test_quick(h, q->quick_hint, &key, &count, &word, &bit);
    EXPECT(*count > 0 && (*word >> bit & 1), "the cached block's list");
    CORRUPT(h, *count, *count + 1, "quick list count off by one");
    CORRUPT(h, *word, *word & ~((uint64_t)1 << bit), "a list with blocks whose non-empty bit is clear");
    /* An empty, never used list given that key: a key names the bucket it hashes to. */
    uint64_t *ekey, *eword;
    uint32_t *ecount;
    unsigned ebit, e = 0;
    do heap_test_quick(h, e++, &ekey, &ecount, &eword, &ebit);
    while (*ekey || *ecount);
    CORRUPT(h, *ekey, *key, "an empty list keyed for another bucket");
}

/* VMM: an UNMAPPED block (the end of the large pool's reservation): no chunk mapped under it,
 * chunk-aligned, never next to another one. */
static void corrupt_unmapped(heap_t *h, void **ptrs, int n) {
    block_t *u = NULL;
    for (int i = 0; i < n && !u; i++) {
        block_t *x = heap_test_find_block(h, ptrs[i]);
        for (; x && x->pool == POOL_LARGE && !u; x = x->next)
            if (x->state == BLOCK_UNMAPPED && x->prev) u = x;
    }
    EXPECT(u && u->size > heap_chunk_size(h, POOL_LARGE), "an unmapped block of more than a chunk after another block");
    CORRUPT(h, *heap_test_chunk(h, (void *)u->addr), (cua_memhandle)1, "a chunk mapped under an unmapped block");
    CORRUPT(h, u->state, BLOCK_FREE, "unmapped block marked free");
    /* The boundary moved by 512 B: the unmapped block no longer starts on a chunk. */
    u->prev->size += CUALLOC_ALIGN;
    u->addr += CUALLOC_ALIGN;
    u->size -= CUALLOC_ALIGN;
    EXPECT(heap_check(h, NULL) > 0, "corruption not caught: unmapped block off its chunk boundary");
    u->prev->size -= CUALLOC_ALIGN;
    u->addr -= CUALLOC_ALIGN;
    u->size += CUALLOC_ALIGN;
    EXPECT(heap_check(h, stderr) == 0, "restored heap not clean after: unmapped block off its chunk boundary");
    corruptions++;
    /* Cut in two unmapped blocks, the second a record of its own. */
    static block_t half;
    size_t chunk = heap_chunk_size(h, POOL_LARGE);
    half = *u;
    half.addr = u->addr + chunk;
    half.size = u->size - chunk;
    half.prev = u;
    if (half.next) half.next->prev = &half;
    u->next = &half;
    u->size = chunk;
    EXPECT(heap_check(h, NULL) > 0, "corruption not caught: two adjacent unmapped blocks");
    u->size += half.size;
    u->next = half.next;
    if (u->next) u->next->prev = u;
    EXPECT(heap_check(h, stderr) == 0, "restored heap not clean after: two adjacent unmapped blocks");
    corruptions++;
    /* The index entry swapped for a copy of the record, the same size (so the same count and bytes):
     * allocated, or unmapped but a record the block list does not hold. The grow path would map
     * chunks under what the index names. */
    sizeclass_t *ix = heap_test_unmapped_index(h, POOL_LARGE);
    unsigned fl, sl;
    sizeclass_mapping(u->size, &fl, &sl);
    block_t **head = &ix->bins[SC_BIN(fl, sl)];
    EXPECT(*head == u && !u->link.list.next_free, "the unmapped block alone in its bin");
    static block_t copy;
    copy = *u;
    copy.state = BLOCK_ALLOCATED;
    CORRUPT(h, *head, &copy, "an allocated block in the unmapped index");
    copy.state = BLOCK_UNMAPPED;
    CORRUPT(h, *head, &copy, "an unmapped record the block list does not hold in the unmapped index");
}

/* Records the slab hands out are the segments' blocks: one more is a leak. */
static void corrupt_records(heap_t *h) {
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    void *leaked = slab_alloc(f.records);
    EXPECT(leaked, "a record");
    EXPECT(heap_check(h, NULL) > 0, "corruption not caught: a block record handed out that no segment holds");
    slab_free(f.records, leaked);
    EXPECT(heap_check(h, stderr) == 0, "restored heap not clean after: a leaked block record");
    corruptions++;
    CORRUPT(h, f.records->live, f.records->live + 1, "the slab's count of records handed out off by one");
#ifndef CUALLOC_SLAB_MALLOC /* (sanitizer builds: records from calloc, no free list) */
    EXPECT(f.records->free_list, "merges returned records to the slab");
    CORRUPT(h, f.records->free_list, (void *)((char *)f.records->free_list + 16), "the slab's free list off a record");
#endif
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

/* Device-wide generations: device-wide frees while a held non-blocking stream exists. Every
 * DW_CHECK_EVERY (4) of them the open generation closes, with events that stay in flight (the stream
 * is held): the closed one holds blocks. (A large live block keeps them under the bound on waiting
 * device-wide bytes, 1/16 of what is mapped, past which the heap would wait for them.) Also the
 * stream cache and the tag records. */
static void corrupt_device_wide(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:512", &c);
    cua_stream nb = sim_stream_create(0, true);
    heap_stream_created(h, nb, true);
    void *p[11];
    EXPECT(heap_alloc(h, 256 << 20, NULL, &p[10]) == CUA_SUCCESS, "alloc");
    for (int i = 0; i < 10; i++) EXPECT(heap_alloc(h, 2 << 20, NULL, &p[i]) == CUA_SUCCESS, "alloc");
    for (int i = 0; i < 9; i += 2) EXPECT(heap_free_device_wide(h, p[i]), "device-wide free");
    bool *closed, *in_flight;
    uint16_t *partner;
    heap_test_tag_fields(h, TAG_DW_A, &closed, &in_flight, &partner);
    EXPECT(*in_flight, "the closed device-wide generation's events are in flight");
    EXPECT(heap_check(h, stderr) == 0, "consistent");
    CORRUPT(h, *in_flight, false, "the closed device-wide generation holds blocks no event covers");
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    CORRUPT(h, *f.dw_open, 5u, "the open device-wide generation is no device-wide tag");
    uint64_t *used;
    cua_stream *handle_b, *handle_1;
    heap_test_tag_owner(h, TAG_DW_B, &used, &handle_b);
    heap_test_tag_owner(h, 1, &used, &handle_1);
    EXPECT((*used >> 1 & 1) && *f.last_tag == 1, "the legacy stream has tag 1, in the stream cache");
    CORRUPT(h, *used, *used & ~(UINT64_C(1) << TAG_DW_B), "a device-wide tag record unused");
    CORRUPT(h, *used, *used & ~(UINT64_C(1) << 1), "the stream cache's tag unused");
    CORRUPT(h, *handle_1, *handle_b, "a stream tag naming the device-wide pseudo-stream");
    CORRUPT(h, *f.last_tag, 2u, "the stream cache naming an unused tag");
    heap_test_tag_fields(h, 30, &closed, &in_flight, &partner);
    CORRUPT(h, *closed, true, "an unused tag marked closed");
    CORRUPT(h, *partner, 1, "an unused tag partnered");
    sim_stream_complete(nb);
    for (int i = 1; i < 11; i += 2) EXPECT(heap_free(h, p[i], NULL), "free");
    heap_destroy(h);
    sim_stream_destroy(nb);
}

/* Classic mode: the segment list, the live map, and no closed generation. */
static void corrupt_classic(heap_t *h, void **ptrs) {
    block_t *b = heap_test_find_block(h, ptrs[1]), *head = b, *last = b;
    EXPECT(b, "live block");
    while (head->prev) head = head->prev;
    while (last->next) last = last->next;
    CORRUPT(h, head->seg_prev, head, "a segment's back link naming itself");
    CORRUPT(h, head->seg_next, head, "the segment list looping on itself");
    CORRUPT(h, last->next, head, "a segment's blocks looping back to its head");
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    CORRUPT(h, f.classic_live->count, f.classic_live->count + 1, "the live map's count off by one");
    bool *closed, *in_flight;
    uint16_t *partner;
    heap_test_tag_fields(h, 1, &closed, &in_flight, &partner);
    CORRUPT(h, *closed, true, "a closed tag in classic mode");
}

int main(void) {
    void *ptrs[24];
    heap_t *h = build("sim_memory_mb:512", ptrs, 24);
    corrupt_blocks(h, ptrs, 24);
    corrupt_cached(h, ptrs, 24);
    corrupt_live_tables(h, ptrs, 24);
    corrupt_unmapped(h, ptrs, 24);
    corrupt_records(h);
    corrupt_stats(h);
    cua_memhandle *chunk = heap_test_chunk(h, ptrs[1]);
    EXPECT(chunk && *chunk, "chunk under a live block is mapped");
    CORRUPT(h, *chunk, 0, "chunk under a live block forgotten");
    heap_destroy(h);

    corrupt_generations();
    corrupt_device_wide();

    h = build("sim_memory_mb:512,expandable_segments:0", ptrs, 24);
    corrupt_blocks(h, ptrs, 24);
    corrupt_classic(h, ptrs);
    corrupt_records(h);
    corrupt_stats(h);
    heap_destroy(h);
    printf("test_check: %d corruptions caught\n", corruptions);
    return 0;
}
