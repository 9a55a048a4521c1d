/* test_host_oom.c — host memory running out under the heap. With the process's address space
 * capped (RLIMIT_AS) a little above what it uses, the heap's own tables cannot grow: the map of
 * live blocks, the slabs of block records, a new stream's free index. Every allocation must then
 * succeed or fail cleanly: heap_check is clean after every operation, a failure is reported as
 * host memory (not as the device running out, which would send the user to the wrong fix), and
 * once the cap is lifted the heap serves and frees everything again. Small requests drive it:
 * each is a new live block (the map and the slabs grow), many share a chunk (the device has room).
 * Both modes: VMM (expandable segments) and classic; and a stream first seen under the cap. And
 * the small pool's table of live blocks, whose pages open as chunks are mapped, under a cap on the
 * data size (RLIMIT_DATA, which writable private mappings count against).
 * Skipped (77) under sanitizers, whose shadow memory does not fit under such a cap. */
#include <sys/resource.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#define MAX_BLOCKS 400000

static void *ptrs[MAX_BLOCKS];
static test_captured_t messages;

/* Sets the soft limit on `resource`; RLIM_INFINITY lifts it to the hard limit. */
static void set_soft_limit(int resource, rlim_t bytes) {
    struct rlimit r;
    EXPECT(getrlimit(resource, &r) == 0, "getrlimit");
    r.rlim_cur = bytes == RLIM_INFINITY ? r.rlim_max : bytes;
    EXPECT(setrlimit(resource, &r) == 0, "setrlimit");
}

static cua_stream stream_of[64];

static cua_stream stream_for(size_t i, int streams) { return streams ? stream_of[i % (size_t)streams] : NULL; }

static void run(const char *text, int streams) {
    conf_t c;
    heap_t *h = test_sim_heap(text, &c);
    for (int i = 0; i < streams; i++) stream_of[i] = sim_stream_create(0, false);
    /* Warm-up: the small pool's device memory the run will use (128 MiB) is mapped now and stays
     * cached, so that under the cap only the heap's host tables need more memory (the sim's
     * bookkeeping none: its failures would be the device's). */
    for (size_t i = 0; i < 32768; i++)
        EXPECT(heap_alloc(h, 4096, stream_for(i, streams), &ptrs[i]) == CUA_SUCCESS, "warm-up allocation %zu", i);
    for (size_t i = 0; i < 32768; i++) EXPECT(heap_free(h, ptrs[i], stream_for(i, streams)), "warm-up free %zu", i);
    EXPECT(heap_check(h, stderr) == 0, "heap consistent before the cap");

    messages.len = 0;
    messages.text[0] = '\0';
    set_soft_limit(RLIMIT_AS, (rlim_t)(test_address_space_bytes() + (1u << 20)));
    size_t n = 0, failed = 0;
    for (; n < MAX_BLOCKS && failed < 50; n++) {
        if (heap_alloc(h, 512 + (n % 7) * 512, stream_for(n, streams), &ptrs[n]) != CUA_SUCCESS) {
            ptrs[n] = NULL;
            failed++;
        }
        if (n % 4096 == 0 || !ptrs[n]) EXPECT(heap_check(h, stderr) == 0, "heap inconsistent after allocation %zu", n);
    }
    EXPECT(failed > 0, "%s: %zu allocations under the cap and none failed: the cap did not bind", text, n);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent under the cap");
    EXPECT(strstr(messages.text, "host memory"), "%s: the failure was not reported as host memory:\n%s", text, messages.text);
    EXPECT(!strstr(messages.text, "out of memory"), "%s: a host-memory failure was reported as the device's:\n%s", text,
           messages.text);

    /* Frees never need memory: half of them under the cap. */
    for (size_t i = 0; i < n; i += 2)
        if (ptrs[i]) EXPECT(heap_free(h, ptrs[i], stream_for(i, streams)), "free %zu under the cap", i);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent after frees under the cap");

    set_soft_limit(RLIMIT_AS, RLIM_INFINITY);
    void *again = NULL;
    EXPECT(heap_alloc(h, 4096, NULL, &again) == CUA_SUCCESS, "allocation after the cap is lifted");
    EXPECT(heap_free(h, again, NULL), "free after the cap is lifted");
    for (size_t i = 1; i < n; i += 2)
        if (ptrs[i]) EXPECT(heap_free(h, ptrs[i], stream_for(i, streams)), "free %zu", i);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent at the end");
    cualloc_stats st;
    heap_get_stats(h, &st);
    EXPECT(st.allocated_bytes == 0, "%zu bytes still allocated", (size_t)st.allocated_bytes);
    printf("test_host_oom: %s: %zu allocations, %zu failed cleanly under the cap\n", text, n, failed);
    heap_destroy(h);
    for (int i = 0; i < streams; i++) sim_stream_destroy(stream_of[i]);
}

/* A stream first seen under the cap needs a free index for its tag (an mmap each pool): its first
 * allocation fails cleanly, reported as host memory, and once the cap is lifted it is served. */
static void run_new_stream(const char *text) {
    conf_t c;
    heap_t *h = test_sim_heap(text, &c);
    void *p = NULL;
    EXPECT(heap_alloc(h, 4096, NULL, &p) == CUA_SUCCESS && heap_free(h, p, NULL), "warm-up");
    cua_stream s = sim_stream_create(0, false);
    messages.len = 0;
    messages.text[0] = '\0';
    set_soft_limit(RLIMIT_AS, (rlim_t)test_address_space_bytes());
    p = NULL;
    cua_result r = heap_alloc(h, 4096, s, &p);
    set_soft_limit(RLIMIT_AS, RLIM_INFINITY);
    EXPECT(r != CUA_SUCCESS && !p, "%s: a new stream was served with no address space to spare", text);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent after the failed allocation");
    EXPECT(strstr(messages.text, "host memory") && strstr(messages.text, "a stream's free index") &&
               !strstr(messages.text, "out of memory"),
           "%s: the new stream's failure was not reported as host memory for its index:\n%s", text, messages.text);
    EXPECT(heap_alloc(h, 4096, s, &p) == CUA_SUCCESS, "%s: the new stream is not served once the cap is lifted", text);
    EXPECT(heap_free(h, p, s), "free on the new stream");
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent at the end");
    printf("test_host_oom: %s: a new stream's first allocation failed cleanly under the cap\n", text);
    heap_destroy(h);
    sim_stream_destroy(s);
}

/* The data size in use now (brk and private writable mappings: what RLIMIT_DATA caps), from
 * /proc/self/status. */
static size_t data_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    EXPECT(f, "cannot read /proc/self/status");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmData: %zu kB", &kib) == 1) break;
    if (f) fclose(f);
    EXPECT(kib > 0, "no VmData in /proc/self/status");
    return kib * 1024;
}

/* VMM: the small pool's table of live blocks opens its pages for each chunk mapped (writable,
 * so charged as data). With the data size capped at what is in use, a request that needs a new
 * small-pool chunk fails cleanly, reported as host memory for the map of live blocks; the chunk
 * is not left mapped, and once the cap is lifted the request is served. */
static void run_small_pool_slots(void) {
    conf_t c;
    heap_t *h = test_sim_heap("sim_memory_mb:1024", &c);
    void *warm[64];
    for (size_t i = 0; i < 64; i++) EXPECT(heap_alloc(h, 4096, NULL, &warm[i]) == CUA_SUCCESS, "warm-up %zu", i);
    for (size_t i = 0; i < 64; i++) EXPECT(heap_free(h, warm[i], NULL), "warm-up free %zu", i);
    cualloc_stats before;
    heap_get_stats(h, &before);
    messages.len = 0;
    messages.text[0] = '\0';
    set_soft_limit(RLIMIT_DATA, (rlim_t)data_bytes());
    /* 1 MiB blocks: the chunk mapped at warm-up holds one besides what is cached; the next needs
     * a chunk of its own. */
    void *big[4] = {0};
    size_t served = 0;
    for (; served < 4 && heap_alloc(h, 1 << 20, NULL, &big[served]) == CUA_SUCCESS; served++) {}
    set_soft_limit(RLIMIT_DATA, RLIM_INFINITY);
    EXPECT(served < 4, "four 1 MiB blocks were served with no data size to spare");
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent after the failed allocation");
    EXPECT(strstr(messages.text, "host memory") && strstr(messages.text, "the map of live blocks") &&
               !strstr(messages.text, "out of memory"),
           "the failure was not reported as host memory for the map of live blocks:\n%s", messages.text);
    cualloc_stats after;
    heap_get_stats(h, &after);
    /* The chunk was mapped, then given back when its slots could not open (heap_check above:
     * nothing is left mapped that no block uses). */
    EXPECT(after.num_maps > before.num_maps && after.num_unmaps > before.num_unmaps,
           "no chunk was mapped and given back (maps %llu -> %llu, unmaps %llu -> %llu)",
           (unsigned long long)before.num_maps, (unsigned long long)after.num_maps,
           (unsigned long long)before.num_unmaps, (unsigned long long)after.num_unmaps);
    EXPECT(heap_alloc(h, 1 << 20, NULL, &big[served]) == CUA_SUCCESS, "not served once the cap is lifted");
    for (size_t i = 0; i <= served; i++) EXPECT(heap_free(h, big[i], NULL), "free %zu", i);
    EXPECT(heap_check(h, stderr) == 0, "heap inconsistent at the end");
    printf("test_host_oom: small-pool slots: %zu of 4 new 1 MiB blocks served under the cap, then a clean failure\n",
           served);
    heap_destroy(h);
}

int main(void) {
#ifdef UNDER_SANITIZER
    printf("test_host_oom: skipped under a sanitizer\n");
    return 77;
#endif
    error_set_callback(test_capture, &messages);
    run("sim_memory_mb:1024", 0);
    run("sim_memory_mb:1024,expandable_segments:0", 0);
    run("sim_memory_mb:1024", 40); /* 40 streams: each a new tag and free index */
    run_new_stream("sim_memory_mb:1024");
    run_new_stream("sim_memory_mb:1024,expandable_segments:0");
    run_small_pool_slots();
    return 0;
}
