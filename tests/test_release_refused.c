/* test_release_refused.c — a cache release refused host memory fails the allocation as host
 * memory, not as a full device, and leaves the heap whole. Run with tests/failing_mmap.c preloaded
 * (suite 'interpose'). Expandable segments release cached memory by unmapping the chunk-aligned
 * interior of a free block, which splits its record in three: two new block records, taken before
 * anything is unmapped. Whether taking them maps a new slab depends on the slab's free list, so the
 * test steers it: the heap's records are drained (the free list emptied, the newest slab's tail
 * used up), so that each release's first record maps a slab, and every such mapping is refused
 * while the allocation runs (failing_mmap_armed). The allocation that needed the release must fail saying that host
 * memory ran out for the block records, count it in heap_host_refusals (and, as every failed
 * allocation, in num_ooms), leave every block as it was (heap_check, the cached bytes), and succeed once the
 * records are back. A trim refused them leaves no trace that a later failure for another reason is told
 * as. And when the driver also failed the growth with an error that is not out of memory (a context a
 * faulting kernel left unusable), that error is what the failure says and returns: host memory would
 * not have helped. */
#include <dlfcn.h>

#include "internal.h"
#include "testutil.h"

static test_captured_t messages;

/* Takes every record the slab can give without mapping a slab; returns how many (in held). */
static size_t drain(slab_t *s, void **held, size_t max) {
    size_t n = 0;
    while (n < max && (s->free_list || (size_t)(s->end - s->cur) >= s->rec_size)) held[n++] = slab_alloc_uninit(s);
    EXPECT(!s->free_list && (size_t)(s->end - s->cur) < s->rec_size, "the slab still has records after %zu", n);
    return n;
}

/* heap_alloc of `size` on the legacy stream while the driver fails every chunk with
 * CUDA_ERROR_ILLEGAL_ADDRESS (700) and every new slab mapping is refused; messages cleared first. */
static cua_result alloc_driver_failing(heap_t *h, int *armed, size_t size, void **q) {
    messages.len = 0;
    messages.text[0] = '\0';
    sim_fail(SIM_OP_PHYS_CREATE, 0, 1000000, (cua_result)700);
    __atomic_store_n(armed, 1, __ATOMIC_RELEASE);
    cua_result r = heap_alloc(h, size, NULL, q);
    __atomic_store_n(armed, 0, __ATOMIC_RELEASE);
    sim_fail(SIM_OP_PHYS_CREATE, 0, 0, CUA_SUCCESS);
    return r;
}

/* Five 90 MiB blocks, the second and fourth freed: a 300 MiB request fits the 1 GiB device but no
 * cached piece, so the heap tries to grow, and the driver fails every chunk with
 * CUDA_ERROR_ILLEGAL_ADDRESS; the release of the cache between the two growths is refused its
 * records. */
static void driver_error_and_refused_release(const conf_t *c, int *armed) {
    cua_result err = CUA_SUCCESS;
    heap_t *h = heap_create(0, c, &driver_sim_ops, &err);
    EXPECT(h && heap_is_vmm(h), "second heap: %d", err);
    void *p[5];
    for (int i = 0; i < 5; i++) {
        p[i] = heap_malloc(h, 90 * MiB, NULL);
        EXPECT(p[i], "block %d", i);
    }
    EXPECT(heap_free(h, p[1], NULL) && heap_free(h, p[3], NULL), "frees");
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    static void *held[1 << 16];
    size_t nheld = drain(f.records, held, sizeof held / sizeof *held);
    /* One record back: enough for the growth (it splits the unmapped range once, and gives the
     * record back when the driver fails), one short of a release (two, taken first). */
    slab_free(f.records, held[--nheld]);
    unsigned long long refusals = heap_host_refusals(h);
    void *q = NULL;
    cua_result r = alloc_driver_failing(h, armed, 300 * MiB, &q);
    EXPECT(!q && r == 700, "heap_alloc returned %d (%p), want CUDA_ERROR_ILLEGAL_ADDRESS: %s",
           (int)r, q, messages.text);
    EXPECT(strstr(messages.text, "CUDA_ERROR_ILLEGAL_ADDRESS") && !strstr(messages.text, "host memory ran out"),
           "a driver error with a refused release is told as host memory: %s", messages.text);
    EXPECT(heap_host_refusals(h) == refusals, "counted as a host refusal");
    for (size_t i = 0; i < nheld; i++)
        slab_free(f.records, held[i]);
    EXPECT(heap_check(h, stderr) == 0, "heap after the driver error");
    q = heap_malloc(h, 300 * MiB, NULL);
    EXPECT(q, "the request failed with the driver working again: %s", messages.text);
    heap_free(h, q, NULL);
    for (int i = 0; i < 5; i += 2)
        heap_free(h, p[i], NULL);
    EXPECT(heap_check(h, stderr) == 0, "second heap at the end");
    heap_destroy(h);
}

/* A growth the driver fails (CUDA_ERROR_ILLEGAL_ADDRESS), after which the search finds a block
 * (another stream's, settled by the synchronize that follows) that no record can be had to split:
 * the memory was there, host memory was not, so the failure is host memory's, not the driver's.
 * Chunk-sized blocks A, B, C on the legacy stream and a larger D on a held stream; B freed and
 * trimmed leaves an unmapped hole between live blocks that a request of B's size fills exactly
 * (its growth splits no record), and D, freed on its stream, is what the search finds after it. */
static void driver_error_then_split_refused(const conf_t *c, int *armed) {
    cua_result err = CUA_SUCCESS;
    heap_t *h = heap_create(0, c, &driver_sim_ops, &err);
    EXPECT(h && heap_is_vmm(h), "third heap: %d", err);
    size_t chunk = heap_chunk_size(h, POOL_LARGE);
    cua_stream s = sim_stream_create(0, true);
    void *a = heap_malloc(h, chunk, NULL), *b = heap_malloc(h, 2 * chunk, NULL), *k = heap_malloc(h, chunk, NULL);
    void *d = heap_malloc(h, 4 * chunk, s);
    EXPECT(a && b && k && d, "blocks of %zu bytes", chunk);
    EXPECT(heap_free(h, b, NULL), "free B");
    heap_trim(h);
    EXPECT(heap_free(h, d, s), "free D");
    heap_test_fields_t f;
    heap_test_fields(h, &f);
    static void *held[1 << 16];
    size_t nheld = drain(f.records, held, sizeof held / sizeof *held);
    unsigned long long refusals = heap_host_refusals(h);
    void *q = NULL;
    cua_result r = alloc_driver_failing(h, armed, 2 * chunk, &q);
    EXPECT(!q && r == CUA_ERROR_OUT_OF_MEMORY, "heap_alloc returned %d (%p), want out of memory: %s", (int)r, q,
           messages.text);
    EXPECT(strstr(messages.text, "host memory ran out") && !strstr(messages.text, "CUDA_ERROR"),
           "a block found but not split for want of a record is told as the driver's error: %s", messages.text);
    EXPECT(heap_host_refusals(h) == refusals + 1, "not counted as a host refusal");
    for (size_t i = 0; i < nheld; i++)
        slab_free(f.records, held[i]);
    EXPECT(heap_check(h, stderr) == 0, "third heap after the refusal");
    q = heap_malloc(h, 2 * chunk, NULL);
    EXPECT(q, "the request failed with its records back: %s", messages.text);
    heap_free(h, q, NULL);
    heap_free(h, a, NULL);
    heap_free(h, k, NULL);
    EXPECT(heap_check(h, stderr) == 0, "third heap at the end");
    heap_destroy(h);
    sim_stream_destroy(s);
}

int main(void) {
    int *armed = dlsym(RTLD_DEFAULT, "failing_mmap_armed");
    unsigned long *refused = dlsym(RTLD_DEFAULT, "failing_mmap_refused");
    EXPECT(armed && refused, "tests/failing_mmap.c is not preloaded");
    error_set_callback(test_capture, &messages);
    conf_t c;
    conf_defaults(&c);
    c.driver = DRIVER_SIM;
    EXPECT(conf_parse("sim_memory_mb:1024", &c) == 0, "configuration");
    sim_configure(&c);
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    cua_result err = CUA_SUCCESS;
    heap_t *h = heap_create(0, &c, &driver_sim_ops, &err);
    EXPECT(h && heap_is_vmm(h), "heap with expandable segments: %d", err);

    /* Ten 90 MiB blocks, every other one freed: 900 MiB mapped, 450 MiB of it cached in five
     * pieces no 300 MiB request fits, and the 1 GiB device has no room to map 300 MiB more. */
    void *p[10];
    for (int i = 0; i < 10; i++) {
        p[i] = heap_malloc(h, 90 * MiB, NULL);
        EXPECT(p[i], "block %d", i);
    }
    for (int i = 1; i < 10; i += 2)
        EXPECT(heap_free(h, p[i], NULL), "free %d", i);
    EXPECT(heap_check(h, stderr) == 0, "heap before");
    cualloc_stats before;
    heap_get_stats(h, &before);

    heap_test_fields_t f;
    heap_test_fields(h, &f);
    static void *held[1 << 16];
    size_t nheld = drain(f.records, held, sizeof held / sizeof *held);
    messages.len = 0;
    messages.text[0] = '\0';
    unsigned long refused0 = __atomic_load_n(refused, __ATOMIC_ACQUIRE);
    __atomic_store_n(armed, 1, __ATOMIC_RELEASE);
    void *q = heap_malloc(h, 300 * MiB, NULL);
    __atomic_store_n(armed, 0, __ATOMIC_RELEASE);
    EXPECT(__atomic_load_n(refused, __ATOMIC_ACQUIRE) > refused0,
           "no mapping was asked for: the release did not need a new slab");
    EXPECT(!q, "the allocation succeeded without the records its release needed");
    EXPECT(strstr(messages.text, "host memory ran out") && strstr(messages.text, "block records"),
           "the failure does not say that host memory ran out for the block records: %s", messages.text);
    EXPECT(!strstr(messages.text, "CUDA_ERROR") && !strstr(messages.text, "device is full") &&
               !strstr(messages.text, "fragmented"),
           "the failure is told as the device's: %s", messages.text);
    EXPECT(heap_host_refusals(h) == 1, "heap_host_refusals %llu, want 1", (unsigned long long)heap_host_refusals(h));

    /* A trim refused the same records releases nothing; a later request that no heap could serve
     * (SIZE_MAX) fails as a shortage, not as the trim's host memory. */
    refused0 = __atomic_load_n(refused, __ATOMIC_ACQUIRE);
    __atomic_store_n(armed, 1, __ATOMIC_RELEASE);
    heap_trim(h);
    __atomic_store_n(armed, 0, __ATOMIC_RELEASE);
    EXPECT(__atomic_load_n(refused, __ATOMIC_ACQUIRE) > refused0, "the trim asked for no mapping");
    messages.len = 0;
    messages.text[0] = '\0';
    EXPECT(!heap_malloc(h, SIZE_MAX, NULL), "a request of SIZE_MAX bytes succeeded");
    EXPECT(heap_host_refusals(h) == 1 && !strstr(messages.text, "host memory"),
           "a request too large for any device is told as host memory (heap_host_refusals %llu): %s",
           (unsigned long long)heap_host_refusals(h), messages.text);
    for (size_t i = 0; i < nheld; i++)
        slab_free(f.records, held[i]);
    EXPECT(heap_check(h, stderr) == 0, "heap after the refused release");
    cualloc_stats after;
    heap_get_stats(h, &after);
    EXPECT(after.reserved_bytes == before.reserved_bytes && after.allocated_bytes == before.allocated_bytes &&
               after.num_ooms == before.num_ooms + 2,
           "the refused release changed the heap: reserved %llu -> %llu, allocated %llu -> %llu, OOMs %llu -> %llu",
           (unsigned long long)before.reserved_bytes, (unsigned long long)after.reserved_bytes,
           (unsigned long long)before.allocated_bytes, (unsigned long long)after.allocated_bytes,
           (unsigned long long)before.num_ooms, (unsigned long long)after.num_ooms);

    /* With its records, the same request releases the cache and fits. */
    q = heap_malloc(h, 300 * MiB, NULL);
    EXPECT(q, "the allocation failed with the records back: %s", messages.text);
    EXPECT(heap_check(h, stderr) == 0, "heap after the release");
    heap_free(h, q, NULL);
    for (int i = 0; i < 10; i += 2)
        heap_free(h, p[i], NULL);
    EXPECT(heap_check(h, stderr) == 0, "heap at the end");
    heap_destroy(h);
    driver_error_and_refused_release(&c, armed);
    driver_error_then_split_refused(&c, armed);
    error_set_callback(NULL, NULL);
    printf("test_release_refused: a release refused its records failed as host memory (%zu records drained), "
           "and succeeded with them back\n",
           nheld);
    return 0;
}
