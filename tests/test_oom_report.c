/* test_oom_report.c — the OOM report (heap.c report_oom, DESIGN.md decision 10) against expected
 * text: a genuine shortage (VMM), a fragmentation case (classic segments, also on a device without
 * VMM and with the allocator's fixes set), a repeated OOM that produces no second report,
 * shortage at chunk granularity (also under a cap below the device's memory, and at a
 * chunk_size_mb above the granularity, or above the cap), a device that refuses memory, a device
 * full of memory held outside the heap, a configured cap reached while the device has room, and
 * the VMM pool's address space fragmented.
 * Messages are captured with error_set_callback; the sim device's addresses and sizes are
 * deterministic, so the text is too.
 *   test_oom_report EXPECTED_DIR            compare with EXPECTED_DIR/oom_*.txt
 *   UPDATE_EXPECTED=1 test_oom_report DIR   rewrite them */
#include "addrspace_sequence.h"
#include "internal.h"
#include "testutil.h"

static test_captured_t captured;

static heap_t *open_heap(const char *text) {
    conf_t c;
    return test_sim_heap(text, &c);
}

static int failures;

static void compare(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    /* Only UPDATE_EXPECTED=1 rewrites, as in the check_*.sh scripts: any other value (0 too)
     * compares. */
    const char *update = getenv("UPDATE_EXPECTED");
    if (update && strcmp(update, "1") == 0) {
        FILE *f = fopen(path, "w");
        EXPECT(f, "cannot write %s", path);
        fwrite(captured.text, 1, captured.len, f);
        fclose(f);
        printf("  wrote %s\n", path);
        return;
    }
    static char want[8192];
    FILE *f = fopen(path, "r");
    EXPECT(f, "cannot read %s", path);
    size_t n = fread(want, 1, sizeof want - 1, f);
    fclose(f);
    want[n] = '\0';
    if (n != captured.len || memcmp(want, captured.text, n) != 0) {
        fprintf(stderr, "test_oom_report: %s differs.\n--- expected\n%s--- got\n%s", name, want, captured.text);
        failures++;
    }
}

static void reset(void) {
    captured.len = 0;
    captured.text[0] = '\0';
}

/* Cases 10 and 10c: a known non-blocking stream captures while three 64 MiB blocks are freed
 * device-wide (they settle only by a device synchronize, which the capture forbids), and 128 MiB
 * is asked meanwhile: an OOM. The capture has ended on return; returns its stream. */
static cua_stream waiting_oom(heap_t *h) {
    cua_stream cap = sim_stream_create(0, true);
    heap_stream_created(h, cap, true);
    void *big[3] = {0}, *more = NULL;
    for (int i = 0; i < 3; i++) EXPECT(heap_alloc(h, 64 << 20, NULL, &big[i]) == CUA_SUCCESS, "64 MiB #%d", i);
    sim_stream_set_capturing(cap, true);
    for (int i = 0; i < 3; i++) EXPECT(heap_free_device_wide(h, big[i]), "device-wide free #%d", i);
    EXPECT(heap_alloc(h, 128 << 20, NULL, &more) == CUA_ERROR_OUT_OF_MEMORY, "128 MiB during the capture");
    sim_stream_set_capturing(cap, false);
    return cap;
}

/* A value for the rule's property test: small, near a power of two, or near UINT64_MAX, where the
 * sums of the rule would wrap. */
static uint64_t edgy(rng_t *r) {
    switch (rng_below(r, 4)) {
    case 0: return rng_below(r, 1024);
    case 1: return ((uint64_t)1 << rng_below(r, 64)) + rng_below(r, 5) - 2;
    case 2: return UINT64_MAX - rng_below(r, 1 << 20);
    default: return rng_next(r);
    }
}

/* oom_classify and oom_missing against the rule written in 128-bit arithmetic, which cannot wrap. */
static void check_rule(uint64_t seed) {
    rng_t r = {seed};
    for (int i = 0; i < 1000000; i++) {
        uint64_t req = edgy(&r), cap = edgy(&r), alloc = edgy(&r), resv = edgy(&r), dfree = edgy(&r);
        unsigned __int128 need = (unsigned __int128)alloc + req, room = (unsigned __int128)resv + dfree;
        oom_kind_t want = need > cap ? OOM_SHORTAGE : need > room ? OOM_DEVICE_FULL : OOM_FRAGMENTATION;
        oom_kind_t got = oom_classify(req, cap, alloc, resv, dfree);
        EXPECT(got == want, "oom_classify(%llu, %llu, %llu, %llu, %llu) = %d, want %d", (unsigned long long)req,
               (unsigned long long)cap, (unsigned long long)alloc, (unsigned long long)resv, (unsigned long long)dfree,
               (int)got, (int)want);
        unsigned __int128 miss = need > cap ? need - cap : 0;
        uint64_t want_miss = miss > UINT64_MAX ? UINT64_MAX : (uint64_t)miss;
        EXPECT(oom_missing(req, alloc, cap) == want_miss, "oom_missing(%llu, %llu, %llu)", (unsigned long long)req,
               (unsigned long long)alloc, (unsigned long long)cap);
    }
    /* oom_cap_reached: a shortage against a cap below the device, which had room then and in all. */
    for (int i = 0; i < 1000000; i++) {
        uint64_t req = edgy(&r), cap = edgy(&r), total = edgy(&r), alloc = edgy(&r), room = edgy(&r);
        unsigned __int128 need = (unsigned __int128)alloc + req;
        bool want = need > cap && cap < total && need <= total && need <= room;
        EXPECT(oom_cap_reached(req, cap, total, alloc, room) == want, "oom_cap_reached(%llu, %llu, %llu, %llu, %llu)",
               (unsigned long long)req, (unsigned long long)cap, (unsigned long long)total, (unsigned long long)alloc,
               (unsigned long long)room);
    }
    /* An unknown free reading (UINT64_MAX) never makes a full device. */
    EXPECT(oom_classify(1, 100, 99, 0, UINT64_MAX) == OOM_FRAGMENTATION, "unknown device_free");
}

int main(int argc, char **argv) {
    EXPECT(argc == 2, "usage: test_oom_report EXPECTED_DIR");
    check_rule(test_seed("test_oom_report"));
    error_set_callback(test_capture, &captured);
    void *p = NULL;

    /* 1. Genuine shortage: 40 MiB live on a 64 MiB device, 40 MiB more asked; then the same again
     *    (one line saying further ones are only counted) and a third time (nothing). */
    heap_t *h = open_heap("sim_memory_mb:64");
    void *live = NULL;
    EXPECT(heap_alloc(h, 40 << 20, NULL, &live) == CUA_SUCCESS, "40 MiB");
    reset();
    EXPECT(heap_alloc(h, 40 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY && !p, "shortage");
    compare(argv[1], "oom_shortage.txt");
    reset();
    EXPECT(heap_alloc(h, (40 << 20) + 4096, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "again");
    EXPECT(heap_alloc(h, 48 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "and again");
    compare(argv[1], "oom_repeated.txt");
    cualloc_stats s;
    heap_get_stats(h, &s);
    EXPECT(s.num_ooms == 3, "num_ooms %llu", (unsigned long long)s.num_ooms);
    EXPECT(heap_free(h, live, NULL), "free");
    heap_destroy(h);

    /* 2. Fragmentation, classic segments: six 8 MiB blocks fill three 20 MiB segments of a 64 MiB
     *    device; every other one freed leaves 24 MiB live, yet 12 MiB cannot be had. */
    h = open_heap("sim_memory_mb:64,expandable_segments:False");
    void *b[6];
    for (int i = 0; i < 6; i++) EXPECT(heap_alloc(h, 8 << 20, NULL, &b[i]) == CUA_SUCCESS, "8 MiB #%d", i);
    for (int i = 0; i < 6; i += 2) EXPECT(heap_free(h, b[i], NULL), "free #%d", i);
    reset();
    EXPECT(heap_alloc(h, 12 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "fragmentation");
    compare(argv[1], "oom_fragmentation.txt");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    for (int i = 1; i < 6; i += 2) EXPECT(heap_free(h, b[i], NULL), "free #%d", i);
    heap_destroy(h);

    /* 2b. The same on a device without VMM, where expandable_segments:True (the default) fell back to
     *     classic segments: the advice does not ask for what is set already. Nor, with
     *     max_split_size_mb:32 and a threshold set, does it suggest max_split_size_mb:128 (a raise)
     *     or the threshold again. */
    const char *frag_confs[] = {"sim_memory_mb:64,sim_vmm:False",
                                "sim_memory_mb:64,expandable_segments:False,max_split_size_mb:32,"
                                "garbage_collection_threshold:0.8"};
    for (int k = 0; k < 2; k++) {
        h = open_heap(frag_confs[k]);
        for (int i = 0; i < 6; i++) EXPECT(heap_alloc(h, 8 << 20, NULL, &b[i]) == CUA_SUCCESS, "8 MiB #%d", i);
        for (int i = 0; i < 6; i += 2) EXPECT(heap_free(h, b[i], NULL), "free #%d", i);
        reset();
        EXPECT(heap_alloc(h, 12 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "fragmentation (%s)", frag_confs[k]);
        if (k == 0) {
            compare(argv[1], "oom_fragmentation_novmm.txt");
        } else {
            EXPECT(strstr(captured.text, "diagnosis: fragmentation") &&
                       !strstr(captured.text, "max_split_size_mb:128") &&
                       !strstr(captured.text, "garbage_collection_threshold:0.8"),
                   "advice already in effect:\n%s", captured.text);
        }
        for (int i = 1; i < 6; i += 2) EXPECT(heap_free(h, b[i], NULL), "free #%d", i);
        heap_destroy(h);
    }

    /* 2c. A carved large segment, classic segments of a 128 MiB device: a 64 MiB buffer's cached
     *     segment is carved by 6 MiB blocks kept alive, and 64 MiB cannot be had again. The
     *     advice is expandable segments, else max_split_size_mb:64 (not 128, which leaves a
     *     64 MiB segment to be carved, nor garbage_collection_threshold, which frees only wholly
     *     free segments: the heap had freed them before it failed). Each advised setting serves
     *     the same sequence; 128 and the threshold do not. The 20 MiB segments of case 2 are
     *     carved too, but no max_split_size_mb (more than 20) governs them: none is advised there. */
    static const struct { const char *conf; bool fits; } carve_cases[] = {
        {"sim_memory_mb:128,expandable_segments:False", false},
        {"sim_memory_mb:128", true},
        {"sim_memory_mb:128,expandable_segments:False,max_split_size_mb:64", true},
        {"sim_memory_mb:128,expandable_segments:False,max_split_size_mb:128", false},
        {"sim_memory_mb:128,expandable_segments:False,garbage_collection_threshold:0.8", false},
    };
    for (size_t k = 0; k < sizeof carve_cases / sizeof carve_cases[0]; k++) {
        h = open_heap(carve_cases[k].conf);
        void *params[4], *big = NULL, *act[8];
        for (int i = 0; i < 4; i++) EXPECT(heap_alloc(h, 2 << 20, NULL, &params[i]) == CUA_SUCCESS, "2 MiB #%d", i);
        EXPECT(heap_alloc(h, 64 << 20, NULL, &big) == CUA_SUCCESS && heap_free(h, big, NULL), "64 MiB");
        for (int i = 0; i < 8; i++) EXPECT(heap_alloc(h, 6 << 20, NULL, &act[i]) == CUA_SUCCESS, "6 MiB #%d", i);
        for (int i = 1; i < 8; i += 2) EXPECT(heap_free(h, act[i], NULL), "free #%d", i);
        reset();
        cua_result r = heap_alloc(h, 64 << 20, NULL, &big);
        EXPECT((r == CUA_SUCCESS) == carve_cases[k].fits, "64 MiB again (%s): %d", carve_cases[k].conf, (int)r);
        if (k == 0)
            EXPECT(strstr(captured.text, "diagnosis: fragmentation") &&
                       strstr(captured.text, "First fix (free): expandable segments (CUALLOC_CONF=expandable_segments:True); "
                                             "else lower max_split_size_mb (CUALLOC_CONF=max_split_size_mb:64)") &&
                       !strstr(captured.text, "garbage_collection_threshold"),
                   "carved segment:\n%s", captured.text);
        if (r == CUA_SUCCESS) EXPECT(heap_free(h, big, NULL), "free 64 MiB");
        for (int i = 0; i < 8; i += 2) EXPECT(heap_free(h, act[i], NULL), "free #%d", i);
        for (int i = 0; i < 4; i++) EXPECT(heap_free(h, params[i], NULL), "free param #%d", i);
        EXPECT(heap_check(h, stderr) == 0, "heap_check (%s)", carve_cases[k].conf);
        heap_destroy(h);
    }

    /* 3. VMM, shortage at chunk granularity: one 512 B block pins a 2 MiB small-pool chunk of an
     *    8 MiB device; 7 MiB live + 512 B fit in 8 MiB, but 7 MiB needs four whole chunks.
     * 3b. The same under max_memory_mb:8 on a 64 MiB device: the cap, not the device, is what the
     *     new chunks exceed, so raising it comes before a smaller batch. */
    static const struct { const char *conf, *expected; } chunk_cases[] = {
        {"sim_memory_mb:8", "oom_vmm_chunks.txt"},
        {"sim_memory_mb:64,max_memory_mb:8", "oom_vmm_chunks_cap.txt"},
    };
    void *pin = NULL;
    for (size_t k = 0; k < sizeof chunk_cases / sizeof chunk_cases[0]; k++) {
        h = open_heap(chunk_cases[k].conf);
        EXPECT(heap_alloc(h, 512, NULL, &pin) == CUA_SUCCESS, "pin");
        reset();
        EXPECT(heap_alloc(h, 7 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "chunk granularity (%s)",
               chunk_cases[k].conf);
        compare(argv[1], chunk_cases[k].expected);
        EXPECT(heap_free(h, pin, NULL), "free pin");
        heap_destroy(h);
    }

    /* 4. VMM, the device refuses although the cap allows (another process holds the memory). */
    h = open_heap("sim_memory_mb:64");
    sim_fail(SIM_OP_PHYS_CREATE, 0, 1000, CUA_ERROR_OUT_OF_MEMORY);
    reset();
    EXPECT(heap_alloc(h, 4 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "device refuses");
    compare(argv[1], "oom_vmm_device.txt");
    sim_fail(SIM_OP_PHYS_CREATE, 0, 0, CUA_SUCCESS);
    heap_destroy(h);

    /* 5. The device is full: another allocator of the process (a ballast, here 40 MiB of the sim's
     *    own memory taken past the heap) leaves the heap 24 MiB; 16 MiB live + 16 MiB asked fit the
     *    64 MiB cap but not what the heap holds plus the device's free memory. Not fragmentation
     *    (on a GPU the exception under PyTorch and allocview called it that), and not a shortage of
     *    the cap. */
    h = open_heap("sim_memory_mb:64");
    cua_memhandle ballast;
    EXPECT(driver_sim_ops.phys_create(0, 40 << 20, &ballast) == CUA_SUCCESS, "ballast");
    EXPECT(heap_alloc(h, 16 << 20, NULL, &live) == CUA_SUCCESS, "16 MiB");
    reset();
    EXPECT(heap_alloc(h, 16 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY && !p, "device full");
    compare(argv[1], "oom_device_full.txt");
    EXPECT(heap_check(h, stderr) == 0, "heap_check");
    EXPECT(driver_sim_ops.phys_release(0, ballast) == CUA_SUCCESS, "ballast released");
    EXPECT(heap_alloc(h, 16 << 20, NULL, &p) == CUA_SUCCESS, "16 MiB once the ballast is gone");
    EXPECT(heap_free(h, p, NULL) && heap_free(h, live, NULL), "frees");
    heap_destroy(h);

    /* 6. Chunks larger than the granularity make the shortage: 10 MiB live holds two 8 MiB chunks
     *    of a 20 MiB device, and 9 MiB more needs a third, though 19 MiB would fit in 2 MiB chunks.
     *    The first fix names the chunk size, not the batch. */
    h = open_heap("sim_memory_mb:20,chunk_size_mb:8");
    EXPECT(heap_chunk_size(h, POOL_LARGE) == 8 * MiB, "8 MiB chunks");
    EXPECT(heap_alloc(h, 10 << 20, NULL, &live) == CUA_SUCCESS, "10 MiB");
    reset();
    EXPECT(heap_alloc(h, 9 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY, "chunk size");
    compare(argv[1], "oom_vmm_chunk_size.txt");
    EXPECT(heap_free(h, live, NULL), "free");
    heap_destroy(h);
    h = open_heap("sim_memory_mb:20");
    EXPECT(heap_alloc(h, 10 << 20, NULL, &live) == CUA_SUCCESS && heap_alloc(h, 9 << 20, NULL, &p) == CUA_SUCCESS,
           "the same two blocks in the device's 2 MiB chunks");
    EXPECT(heap_free(h, p, NULL) && heap_free(h, live, NULL), "frees");
    heap_destroy(h);

    /* 6b. The large pool's chunks fill the cap and a small request finds no room for a small-pool
     *     chunk: chunk_size_mb:16 on a 16 MiB device, 10 MiB live in the one 16 MiB chunk, then
     *     4 KiB. The first fix is smaller chunks, not a smaller batch (it said the batch, and that
     *     memory is mapped in chunks of 2 MiB, the small pool's). */
    h = open_heap("sim_memory_mb:16,chunk_size_mb:16");
    EXPECT(h && heap_chunk_size(h, POOL_LARGE) == 16 * MiB, "16 MiB chunks");
    EXPECT(heap_alloc(h, 10 << 20, NULL, &live) == CUA_SUCCESS, "10 MiB");
    reset();
    EXPECT(heap_alloc(h, 4096, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY && !p, "no room for a small-pool chunk");
    EXPECT(strstr(captured.text, "mapped in whole chunks of 16.00 MiB") &&
               strstr(captured.text, "First fix: use smaller chunks (CUALLOC_CONF=chunk_size_mb:0"),
           "a small request short of room by the large pool's chunks names the chunk size:\n%s", captured.text);
    EXPECT(heap_free(h, live, NULL), "free");
    heap_destroy(h);

    /* 7. A chunk larger than the cap could never be mapped: the heap says so at creation and uses
     *    the largest chunk that fits, and large blocks are served. */
    reset();
    h = open_heap("sim_memory_mb:24,chunk_size_mb:64");
    EXPECT(h && heap_chunk_size(h, POOL_LARGE) == 16 * MiB, "chunks of 16 MiB, not 64");
    compare(argv[1], "oom_chunk_over_cap.txt");
    EXPECT(heap_alloc(h, 10 << 20, NULL, &live) == CUA_SUCCESS, "10 MiB in a 16 MiB chunk");
    EXPECT(heap_free(h, live, NULL), "free");
    heap_destroy(h);

    /* 8. A cap configured below the device's memory is what the request exceeds: 20 MiB live under
     *    max_memory_mb:32 on a 64 MiB device, 20 MiB more asked. The device has room, so the first
     *    fix is the cap itself, not "no allocator setting can fix that"; per_process_memory_fraction
     *    is named when it set the cap. */
    const char *cap_confs[] = {"sim_memory_mb:64,max_memory_mb:32", "sim_memory_mb:64,per_process_memory_fraction:0.5"};
    for (int k = 0; k < 2; k++) {
        h = open_heap(cap_confs[k]);
        EXPECT(heap_alloc(h, 20 << 20, NULL, &live) == CUA_SUCCESS, "20 MiB");
        reset();
        EXPECT(heap_alloc(h, 20 << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY && !p, "cap reached (%s)", cap_confs[k]);
        if (k == 0)
            compare(argv[1], "oom_cap.txt");
        else
            EXPECT(strstr(captured.text, "raise per_process_memory_fraction"), "names the fraction:\n%s", captured.text);
        EXPECT(heap_free(h, live, NULL), "free");
        heap_destroy(h);
    }

    /* 9. VMM, fragmentation of the reserved address space: with va_factor:2 a 64 MiB device has
     *    128 MiB of it, and this sequence (found by a random search, then shrunk) leaves 40 MiB
     *    live and no free range of 21 MiB although the device has 20 MiB free and 4 MiB is cached.
     *    The fix names twice the factor in effect (it said va_factor:8 whatever the factor was). */
    h = open_heap("sim_memory_mb:64,va_factor:2");
    void *blk[ADDRSPACE_BLOCKS] = {0};
    for (size_t i = 0; i < sizeof addrspace_sequence / sizeof *addrspace_sequence; i++) {
        int id = addrspace_sequence[i].id, mib = addrspace_sequence[i].mib;
        if (mib)
            EXPECT(heap_alloc(h, (size_t)mib << 20, NULL, &blk[id]) == CUA_SUCCESS, "step %zu", i);
        else
            EXPECT(heap_free(h, blk[id], NULL), "step %zu", i);
        blk[id] = mib ? blk[id] : NULL;
    }
    reset();
    EXPECT(heap_alloc(h, (size_t)ADDRSPACE_REQUEST_MIB << 20, NULL, &p) == CUA_ERROR_OUT_OF_MEMORY && !p,
           "address space fragmented");
    compare(argv[1], "oom_vmm_address_space.txt");
    for (int i = 0; i < ADDRSPACE_BLOCKS; i++)
        if (blk[i]) EXPECT(heap_free(h, blk[i], NULL), "free %d", i);
    heap_destroy(h);

    /* 10. Frees the heap cannot yet reuse: while a stream the heap knows captures a CUDA graph, a
     *     device-wide free (cudaFree) settles only by a device synchronize, which the capture
     *     forbids, so its memory stays reserved and unusable until the capture ends. 3 x 64 MiB
     *     freed so on a 256 MiB device, then 128 MiB asked: no live block holds anything, and the
     *     report must say what does. */
    reset();
    h = open_heap("sim_memory_mb:256");
    {
        uint64_t broken = sim_captures_broken();
        cua_stream cap = waiting_oom(h);
        EXPECT(sim_captures_broken() == broken, "the capture was left alone");
        compare(argv[1], "oom_waiting_frees.txt");
        void *more = NULL;
        EXPECT(heap_alloc(h, 128 << 20, NULL, &more) == CUA_SUCCESS && heap_free(h, more, NULL),
               "128 MiB once the capture ended");
        heap_stream_destroyed(h, cap);
    }
    heap_destroy(h);

    /* 10c. A report is a repeat only of the same reason: after the waiting OOM of case 10, an OOM of
     *      the same size bucket that the device's refusal causes (every chunk created after the
     *      first 96, the three 64 MiB blocks', is refused) is reported too, not taken for a repeat. */
    reset();
    h = open_heap("sim_memory_mb:256,sim_fail:phys_create@96*1000");
    {
        cua_stream cap = waiting_oom(h);
        void *more = NULL;
        EXPECT(strstr(captured.text, "waiting for a CUDA graph capture"), "10c: first the waiting OOM: %s", captured.text);
        reset();
        EXPECT(heap_alloc(h, 200 << 20, NULL, &more) == CUA_ERROR_OUT_OF_MEMORY, "200 MiB, refused by the device");
        EXPECT(strstr(captured.text, "diagnosis: the device refused more memory") && !strstr(captured.text, "again"),
               "10c: the refusal was taken for a repeat of the waiting OOM: %s", captured.text);
        heap_stream_destroyed(h, cap);
    }
    heap_destroy(h);

    /* 10b. Waiting frees that could not serve the request even once the capture ends: small-pool
     *      blocks in a segment a live block shares, and a large request. The report must not blame
     *      the capture (it did, saying the memory would be reused once the capture ends). */
    for (int vmm = 0; vmm < 2; vmm++) {
        reset();
        h = open_heap(vmm ? "sim_memory_mb:64" : "sim_memory_mb:64,expandable_segments:0");
        cua_stream cap = sim_stream_create(0, true);
        heap_stream_created(h, cap, true);
        void *big = NULL, *small[3] = {0}, *more = NULL;
        EXPECT(heap_alloc(h, 50 << 20, NULL, &big) == CUA_SUCCESS, "50 MiB live");
        for (int i = 0; i < 3; i++) EXPECT(heap_alloc(h, 512 << 10, NULL, &small[i]) == CUA_SUCCESS, "512 KiB #%d", i);
        sim_stream_set_capturing(cap, true);
        for (int i = 0; i < 2; i++) EXPECT(heap_free_device_wide(h, small[i]), "device-wide free #%d", i);
        EXPECT(heap_alloc(h, 13 << 20, NULL, &more) == CUA_ERROR_OUT_OF_MEMORY, "13 MiB during the capture");
        EXPECT(strstr(captured.text, "diagnosis: ") && !strstr(captured.text, "waiting for a CUDA graph capture"),
               "%s: small-pool frees blamed for a large request: %s", vmm ? "vmm" : "classic", captured.text);
        sim_stream_set_capturing(cap, false);
        EXPECT(heap_alloc(h, 13 << 20, NULL, &more) == CUA_ERROR_OUT_OF_MEMORY, "13 MiB after the capture too");
        heap_free(h, small[2], NULL);
        heap_free(h, big, NULL);
        heap_stream_destroyed(h, cap);
        heap_destroy(h);
    }
    /* A driver error that is not out of memory (here CUDA_ERROR_ILLEGAL_ADDRESS, 700: a kernel's
     * fault leaves the context failing every call with it) fails the allocation with that error,
     * said once as a driver error and not diagnosed as a shortage; each op that creates or maps
     * memory, in both modes. The next failure for want of memory is an OOM again. */
    static const struct {
        const char *conf;
        sim_op_t op;
    } driver_cases[] = {
        {"sim_memory_mb:64", SIM_OP_PHYS_CREATE},
        {"sim_memory_mb:64", SIM_OP_MAP},
        {"sim_memory_mb:64", SIM_OP_SET_ACCESS},
        {"sim_memory_mb:64,expandable_segments:0", SIM_OP_MEM_ALLOC},
    };
    for (size_t k = 0; k < sizeof driver_cases / sizeof driver_cases[0]; k++) {
        h = open_heap(driver_cases[k].conf);
        sim_fail(driver_cases[k].op, 0, 1000, (cua_result)700);
        reset();
        p = NULL;
        EXPECT(heap_alloc(h, 4 << 20, NULL, &p) == (cua_result)700 && !p, "case %zu: not the driver's error", k);
        EXPECT(strstr(captured.text, "not a shortage of memory — the driver failed with CUDA_ERROR_ILLEGAL_ADDRESS (700)") &&
                   !strstr(captured.text, "diagnosis"),
               "case %zu: %s", k, captured.text);
        reset();
        EXPECT(heap_alloc(h, 8 << 20, NULL, &p) == (cua_result)700 && !p, "case %zu: again", k);
        EXPECT(captured.text[0] == 0, "case %zu: said twice: %s", k, captured.text);
        cualloc_stats st;
        heap_get_stats(h, &st);
        EXPECT(st.num_ooms == 2, "case %zu: num_ooms %llu", k, (unsigned long long)st.num_ooms);
        sim_fail(driver_cases[k].op, 0, 0, CUA_SUCCESS);
        EXPECT(heap_alloc(h, 4 << 20, NULL, &p) == CUA_SUCCESS && p, "case %zu: after the error", k);
        void *q = NULL;
        EXPECT(heap_alloc(h, 128 << 20, NULL, &q) == CUA_ERROR_OUT_OF_MEMORY && !q, "case %zu: a shortage after", k);
        EXPECT(heap_free(h, p, NULL), "free");
        EXPECT(heap_check(h, stderr) == 0, "heap_check");
        heap_destroy(h);
    }

    /* The advice: twice the factor, up to the key's maximum; none past it. */
    EXPECT(oom_va_factor_next(2) == 4 && oom_va_factor_next(4) == 8 && oom_va_factor_next(300) == 600,
           "va_factor doubles");
    EXPECT(oom_va_factor_next(600) == VA_FACTOR_MAX && oom_va_factor_next(VA_FACTOR_MAX) == 0,
           "va_factor stops at its maximum");
    /* The reason's order: new chunks that pass the cap are a shortage at chunk granularity even
     *    where no free range of address space could take them either (46 MiB reserved, 20 MiB of
     *    new chunks, a 64 MiB cap: more address space, the va_factor advised, would not serve
     *    them); under the cap, a missing range is the address space's, else the device refused. */
    EXPECT(oom_vmm_failure(20 * MiB, 46 * MiB, 64 * MiB, false) == OOM_VMM_CHUNKS, "past the cap, no address space");
    EXPECT(oom_vmm_failure(20 * MiB, 46 * MiB, 64 * MiB, true) == OOM_VMM_CHUNKS, "past the cap");
    EXPECT(oom_vmm_failure(20 * MiB, 44 * MiB, 64 * MiB, false) == OOM_VMM_ADDRESS_SPACE, "no address space");
    EXPECT(oom_vmm_failure(20 * MiB, 44 * MiB, 64 * MiB, true) == OOM_VMM_REFUSED, "refused");

    error_set_callback(NULL, NULL);
    if (failures) return 1;
    printf("test_oom_report: ok\n");
    return 0;
}
