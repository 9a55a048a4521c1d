/* test_torch_abi.cc — black-box test of libcualloc_torch.so, the PyTorch pluggable-allocator shim
 * (src/torch_abi.cc), the way PyTorch uses it: dlopen the library by path and resolve the two
 * functions by name, as torch.cuda.memory.CUDAPluggableAllocator does. Runs on the sim device.
 *
 *   test_torch_abi LIB                 CUALLOC_CONF=driver:sim,sim_memory_mb:256: round trips on
 *                                      two streams, size 0, a 1 TiB request that must throw
 *                                      std::runtime_error("CUDA out of memory ... genuine
 *                                      shortage ..."), recovery, foreign and NULL frees.
 *   test_torch_abi LIB fragmentation   with expandable_segments:False: a heap of 2 MiB holes
 *                                      fails a 48 MiB request that fits the capacity, and the
 *                                      message must diagnose fragmentation.
 *   test_torch_abi LIB disabled        with CUALLOC_DISABLE=1: a refused request's message says
 *                                      the driver refused it, with no heap figures, and makes no heap.
 *   test_torch_abi LIB device-full     on the fake driver (driver:cuda): a ballast taken with the
 *                                      driver's own cuMemAlloc leaves too little; the message
 *                                      must say the device is full, not fragmented.
 *
 * Also prints sizeof(cualloc_stats), the figure the Python helper's ctypes mirror must match
 * (tests/test_cualloc_torch.py checks it against the compiler's answer).
 * What this cannot check: that libtorch catches the exception as RuntimeError — that is the GPU
 * check (a real PyTorch run on a GPU machine), see tools/cualloc_torch.py.
 */
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ballast.h"
#include "cualloc.h"

namespace {

typedef void *(*torch_malloc_fn)(size_t, int, void *);
typedef void (*torch_free_fn)(void *, size_t, int, void *);
typedef int (*get_stats_fn)(int, cualloc_stats *);
typedef int (*check_fn)(int);
typedef int (*oom_message_fn)(size_t, int, char *, size_t);

const size_t MiB = (size_t)1 << 20;
const int DEV = 0;
int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "%s:%d: expectation failed: %s\n  ", __FILE__, __LINE__, #cond);   \
            std::fprintf(stderr, __VA_ARGS__);                                                     \
            std::fputc('\n', stderr);                                                              \
            std::fflush(stderr);                                                                   \
            if (++failures > 20) std::abort();                                                     \
        }                                                                                          \
    } while (0)

struct lib_t {
    torch_malloc_fn tmalloc;
    torch_free_fn tfree;
    get_stats_fn get_stats;
    check_fn check;
    oom_message_fn oom_message;
};

/* Resolves a symbol from the handle: the torch functions from libcualloc_torch.so itself, the
 * cualloc_ ones through its dependency on libcualloc.so (dlsym searches the handle's load order),
 * i.e. the very copy the shim calls. */
void *must_sym(void *h, const char *name) {
    void *s = dlsym(h, name);
    if (!s) {
        std::fprintf(stderr, "test_torch_abi: dlsym(%s): %s\n", name, dlerror());
        std::exit(1);
    }
    return s;
}

cualloc_stats stats(const lib_t &L) {
    cualloc_stats s;
    int rc = L.get_stats(DEV, &s);
    EXPECT(rc == 0, "cualloc_get_stats(%d) returned %d", DEV, rc);
    return s;
}

void check_heap(const lib_t &L, const char *step) {
    int v = L.check(DEV);
    EXPECT(v == 0, "cualloc_check found %d violation(s) after %s", v, step);
}

bool starts_with(const std::string &s, const char *prefix) { return s.compare(0, std::strlen(prefix), prefix) == 0; }
bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

/* Calls the shim's malloc expecting it to throw; returns the message ("" and a failure if it did
 * not throw, or threw something else). */
std::string expect_oom(const lib_t &L, size_t size, void *stream) {
    try {
        void *p = L.tmalloc(size, DEV, stream);
        EXPECT(false, "a %zu-byte request returned %p instead of throwing", size, p);
        L.tfree(p, size, DEV, stream);
        return "";
    } catch (const std::runtime_error &e) {
        std::printf("test_torch_abi: caught std::runtime_error: %s\n", e.what());
        return e.what();
    } catch (const std::exception &e) {
        EXPECT(false, "threw a std::exception that is not std::runtime_error: %s", e.what());
    } catch (...) {
        EXPECT(false, "threw something that is not a std::exception");
    }
    return "";
}

void test_basic(const lib_t &L) {
    void *const streams[2] = {nullptr, (void *)(uintptr_t)0x5000}; /* legacy, and a handle the sim treats as unknown */
    const size_t sizes[] = {1, 511, 512, 4097, MiB, 3 * MiB + 7, 12 * MiB, 64 * MiB};
    struct live_t { void *p; size_t size; void *stream; };
    std::vector<live_t> live;

    cualloc_stats s0 = stats(L);
    size_t requested = 0;
    for (void *st : streams)
        for (size_t sz : sizes) {
            void *p = nullptr;
            try {
                p = L.tmalloc(sz, DEV, st);
            } catch (const std::exception &e) {
                EXPECT(false, "malloc(%zu) threw: %s", sz, e.what());
                continue;
            }
            EXPECT(p != nullptr, "malloc(%zu) returned NULL", sz);
            EXPECT(((uintptr_t)p & 255) == 0, "malloc(%zu) = %p is not 256-byte aligned", sz, p);
            for (const live_t &l : live)
                EXPECT(l.p != p, "malloc(%zu) returned %p, already live", sz, p);
            live.push_back({p, sz, st});
            requested += sz;
        }
    check_heap(L, "the round-trip allocations");
    cualloc_stats s1 = stats(L);
    EXPECT(s1.requested_bytes - s0.requested_bytes == requested, "requested moved by %zu, expected %zu",
           s1.requested_bytes - s0.requested_bytes, requested);
    EXPECT(s1.num_allocs - s0.num_allocs == live.size(), "num_allocs moved by %llu, expected %zu",
           (unsigned long long)(s1.num_allocs - s0.num_allocs), live.size());

    /* Size 0: a unique, non-NULL pointer each time (PyTorch keys its metadata map by pointer). */
    void *z1 = L.tmalloc(0, DEV, streams[1]);
    void *z2 = L.tmalloc(0, DEV, streams[1]);
    EXPECT(z1 && z2 && z1 != z2, "size 0 twice gave %p and %p: want two distinct non-NULL pointers", z1, z2);
    L.tfree(z1, 0, DEV, streams[1]);
    L.tfree(z2, 0, DEV, streams[1]);

    /* Free in a different order than allocated, each on its own stream, as PyTorch does. */
    for (size_t i = 0; i < live.size(); i += 2) L.tfree(live[i].p, live[i].size, DEV, live[i].stream);
    for (size_t i = 1; i < live.size(); i += 2) L.tfree(live[i].p, live[i].size, DEV, live[i].stream);
    check_heap(L, "freeing everything");
    cualloc_stats s2 = stats(L);
    EXPECT(s2.allocated_bytes == s0.allocated_bytes, "allocated %zu after freeing everything, %zu before",
           s2.allocated_bytes, s0.allocated_bytes);
    EXPECT(s2.num_frees - s0.num_frees == live.size() + 2, "num_frees moved by %llu, expected %zu",
           (unsigned long long)(s2.num_frees - s0.num_frees), live.size() + 2);

    /* A pointer cualloc does not own, and NULL: reported / ignored, never a crash. */
    int on_stack = 0;
    L.tfree(&on_stack, sizeof on_stack, DEV, nullptr);
    L.tfree(nullptr, 0, DEV, nullptr);
    check_heap(L, "foreign and NULL frees");

    /* The message asked for before any request has failed: the diagnosis the request would get now
     * (SIZE_MAX, whose rounding overflows, is a shortage); no buffer is refused. */
    {
        char buf[2048];
        EXPECT(L.oom_message(SIZE_MAX, DEV, buf, sizeof buf) == 0 && contains(buf, "genuine shortage") &&
                   starts_with(buf, "CUDA out of memory"),
               "cualloc_oom_message(SIZE_MAX) before any failure: %s", buf);
        EXPECT(L.oom_message(MiB, DEV, nullptr, 16) == -1 && L.oom_message(MiB, DEV, buf, 0) == -1,
               "cualloc_oom_message without a buffer");
        /* Sizes as c10's format_size writes them: each unit up to and including the next one's
         * first value, so an exact power of two reads as PyTorch's own message reads. */
        const struct { size_t size; const char *want; } sizes[] = {
            {1023, "Tried to allocate 1023 bytes "},       {1024, "Tried to allocate 1024 bytes "},
            {1025, "Tried to allocate 1.00 KiB "},         {MiB, "Tried to allocate 1024.00 KiB "},
            {MiB + 1, "Tried to allocate 1.00 MiB "},      {1024 * MiB, "Tried to allocate 1024.00 MiB "},
            {1024 * MiB + 1, "Tried to allocate 1.00 GiB "},
        };
        for (const auto &c : sizes)
            EXPECT(L.oom_message(c.size, DEV, buf, sizeof buf) == 0 && contains(buf, c.want),
                   "cualloc_oom_message(%zu) does not say \"%s\": %s", c.size, c.want, buf);
    }

    /* 1 TiB on a 256 MiB sim device: std::runtime_error, PyTorch's wording first, the size, the
     * heap's figures and the shortage diagnosis. */
    void *held = L.tmalloc(16 * MiB, DEV, nullptr);
    uint64_t ooms_before = stats(L).num_ooms;
    const size_t tib = (size_t)1 << 40;
    std::string msg = expect_oom(L, tib, streams[1]);
    /* PyTorch's own opening, period included: code that tells an OOM by its text looks for
     * "CUDA out of memory." (Accelerate's find_executable_batch_size, under Trainer's
     * auto_find_batch_size), and halves the batch instead of failing. */
    EXPECT(starts_with(msg, "CUDA out of memory. Tried to allocate "),
           "message does not start as PyTorch's does (\"CUDA out of memory. Tried to allocate \"): %s", msg.c_str());
    EXPECT(contains(msg, "Tried to allocate 1024.00 GiB"), "message does not name the size as PyTorch would: %s", msg.c_str());
    EXPECT(contains(msg, "1099511627776 bytes"), "message does not give the size in bytes: %s", msg.c_str());
    EXPECT(contains(msg, "device 0"), "message does not name the device: %s", msg.c_str());
    EXPECT(contains(msg, "capacity of 256.00 MiB"), "message does not give the capacity: %s", msg.c_str());
    EXPECT(contains(msg, "16.00 MiB is allocated"), "message does not give the allocated bytes: %s", msg.c_str());
    EXPECT(contains(msg, "reserved but unallocated"), "message lacks reserved-but-unallocated: %s", msg.c_str());
    EXPECT(contains(msg, "largest free block"), "message lacks the largest free block: %s", msg.c_str());
    EXPECT(contains(msg, "genuine shortage") && contains(msg, "reduce the batch size"),
           "message lacks the shortage diagnosis and its fix: %s", msg.c_str());
    EXPECT(!contains(msg, "fragmentation"), "a 1 TiB request on 256 MiB is not fragmentation: %s", msg.c_str());
    EXPECT(stats(L).num_ooms == ooms_before + 1, "num_ooms %llu, expected %llu",
           (unsigned long long)stats(L).num_ooms, (unsigned long long)(ooms_before + 1));
    /* SIZE_MAX must not overflow the fit test into a fragmentation diagnosis. */
    msg = expect_oom(L, SIZE_MAX, nullptr);
    EXPECT(starts_with(msg, "CUDA out of memory") && contains(msg, "genuine shortage"),
           "SIZE_MAX request: %s", msg.c_str());
    check_heap(L, "the failed requests");

    /* The allocator still works after the throws. */
    void *after = nullptr;
    try {
        after = L.tmalloc(100 * MiB, DEV, streams[1]);
    } catch (const std::exception &e) {
        EXPECT(false, "100 MiB after the OOM threw: %s", e.what());
    }
    EXPECT(after != nullptr, "100 MiB after the OOM failed");
    L.tfree(after, 100 * MiB, DEV, streams[1]);
    L.tfree(held, 16 * MiB, DEV, nullptr);
    check_heap(L, "recovery");
    EXPECT(stats(L).allocated_bytes == s0.allocated_bytes, "allocated %zu at the end", stats(L).allocated_bytes);

    /* An invalid device: still a std::runtime_error (PyTorch must not get NULL), saying why. */
    try {
        void *p = L.tmalloc(MiB, 7, nullptr);
        EXPECT(false, "device 7 of 1 returned %p instead of throwing", p);
    } catch (const std::runtime_error &e) {
        EXPECT(contains(e.what(), "device 7") && contains(e.what(), "not a device cualloc can use") &&
                   std::string(e.what()).rfind("CUDA error: ", 0) == 0,
               "invalid device message (not an OOM's): %s", e.what());
    }
}

/* Classic segments (expandable_segments:False): 2 MiB blocks fill 20 MiB segments, every other
 * one is freed, so half the memory is free but only in 2 MiB holes, and no segment is empty to
 * release. A 48 MiB request fits the capacity next to the live half but cannot be placed. */
void test_fragmentation(const lib_t &L) {
    std::vector<void *> blocks;
    for (;;) {
        void *p = nullptr;
        try {
            p = L.tmalloc(2 * MiB, DEV, nullptr);
        } catch (const std::runtime_error &) {
            break;
        }
        blocks.push_back(p);
        if (blocks.size() > 1000) break;
    }
    EXPECT(blocks.size() >= 64, "only %zu 2 MiB blocks fit a 256 MiB device", blocks.size());
    for (size_t i = 0; i < blocks.size(); i += 2) L.tfree(blocks[i], 2 * MiB, DEV, nullptr);
    check_heap(L, "the checkerboard");
    cualloc_stats s = stats(L);
    std::printf("test_torch_abi: checkerboard: %zu blocks, %zu MiB allocated, %zu MiB reserved, largest free %zu MiB\n",
                blocks.size(), s.allocated_bytes / MiB, s.reserved_bytes / MiB, s.largest_free_block / MiB);
    EXPECT(s.allocated_bytes + 48 * MiB <= s.capacity_bytes, "set-up: allocated %zu + 48 MiB exceeds capacity %zu",
           s.allocated_bytes, s.capacity_bytes);
    std::string msg = expect_oom(L, 48 * MiB, nullptr);
    EXPECT(starts_with(msg, "CUDA out of memory"), "message: %s", msg.c_str());
    EXPECT(contains(msg, "Tried to allocate 48.00 MiB"), "message does not name the size: %s", msg.c_str());
    /* Its fix is expandable segments; not max_split_size_mb, which (above 20 MiB) cannot keep the
     * 20 MiB segments whole, nor garbage_collection_threshold, which frees only empty segments. */
    EXPECT(contains(msg, "fragmentation") && contains(msg, "expandable_segments:True") &&
               !contains(msg, "max_split_size_mb:") && !contains(msg, "garbage_collection_threshold"),
           "message lacks the fragmentation diagnosis and its fix: %s", msg.c_str());
    EXPECT(!contains(msg, "genuine shortage"), "fragmentation misread as shortage: %s", msg.c_str());
    for (size_t i = 1; i < blocks.size(); i += 2) L.tfree(blocks[i], 2 * MiB, DEV, nullptr);
    check_heap(L, "freeing the checkerboard");
    void *p = L.tmalloc(48 * MiB, DEV, nullptr); /* releases the empty segments and fits now */
    EXPECT(p != nullptr, "48 MiB after freeing everything");
    L.tfree(p, 48 * MiB, DEV, nullptr);
}

/* The budget of bench/gpu/torch_train.py's capacity probes, on the fake driver (CUALLOC_CONF
 * driver:cuda, the fake libcuda.so.1 on LD_LIBRARY_PATH, 256 MiB): 160 MiB are taken past cualloc
 * with cuMemCreate before the job, as the probe's ballast is, and the job then asks for more than
 * is left. On an H100 the message said "fragmentation, not a shortage" here
 * and advised expandable segments; it must say the device is full and name the rest's holder. */
void test_device_full(const lib_t &L) {
    unsigned long long ballast = 0;
    EXPECT(ballast_take(160 * MiB, &ballast) == 0, "a 160 MiB ballast (run with the fake driver on LD_LIBRARY_PATH)");

    void *held = L.tmalloc(48 * MiB, DEV, nullptr);
    std::string msg = expect_oom(L, 64 * MiB, nullptr);
    EXPECT(starts_with(msg, "CUDA out of memory") && contains(msg, "Tried to allocate 64.00 MiB"), "message: %s",
           msg.c_str());
    EXPECT(contains(msg, "the device reports 48.00 MiB free"), "message lacks the device's free memory: %s", msg.c_str());
    EXPECT(contains(msg, "the device is full, not fragmented") && contains(msg, "160.00 MiB of the device's 256.00 MiB is held outside this heap"),
           "message lacks the full-device diagnosis and what holds the rest: %s", msg.c_str());
    EXPECT(contains(msg, "live memory must shrink by 16.00 MiB"), "message lacks how much must go: %s", msg.c_str());
    EXPECT(!contains(msg, "fragmentation") && !contains(msg, "expandable_segments") && !contains(msg, "genuine shortage"),
           "a full device misread: %s", msg.c_str());
    check_heap(L, "the failed request");

    EXPECT(ballast_release(ballast) == 0, "the ballast released");
    void *p = nullptr;
    try {
        p = L.tmalloc(64 * MiB, DEV, nullptr);
    } catch (const std::exception &e) {
        EXPECT(false, "64 MiB once the ballast is gone threw: %s", e.what());
    }
    L.tfree(p, 64 * MiB, DEV, nullptr);
    L.tfree(held, 48 * MiB, DEV, nullptr);
    check_heap(L, "recovery");
}

/* CUALLOC_DISABLE=1: every request goes to the driver, past the heap. A refused one still throws,
 * and its message says the driver refused it, not a heap's figures (which read 0 bytes allocated
 * next to live driver memory); asking for the message makes no heap either. */
void test_disabled(const lib_t &L) {
    void *held = L.tmalloc(16 * MiB, DEV, nullptr);
    EXPECT(held != nullptr, "16 MiB from the driver");
    std::string msg = expect_oom(L, (size_t)1 << 40, nullptr);
    EXPECT(starts_with(msg, "CUDA out of memory") && contains(msg, "Tried to allocate 1024.00 GiB"), "message: %s",
           msg.c_str());
    EXPECT(contains(msg, "cualloc is disabled (CUALLOC_DISABLE)") && contains(msg, "the device reports"),
           "message does not say that the driver refused it: %s", msg.c_str());
    EXPECT(!contains(msg, "heap") && !contains(msg, "Diagnosis"), "a heap's figures while disabled: %s", msg.c_str());
    cualloc_stats s = stats(L);
    EXPECT(s.capacity_bytes == 0 && s.num_ooms == 0, "a heap was made while disabled (capacity %zu, %llu OOMs)",
           s.capacity_bytes, (unsigned long long)s.num_ooms);
    L.tfree(held, 16 * MiB, DEV, nullptr);
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: test_torch_abi path/to/libcualloc_torch.so [fragmentation|device-full|disabled]\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        std::fprintf(stderr, "test_torch_abi: dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
    lib_t L;
    L.tmalloc = (torch_malloc_fn)must_sym(h, "cualloc_torch_malloc");
    L.tfree = (torch_free_fn)must_sym(h, "cualloc_torch_free");
    L.get_stats = (get_stats_fn)must_sym(h, "cualloc_get_stats");
    L.check = (check_fn)must_sym(h, "cualloc_check");
    L.oom_message = (oom_message_fn)must_sym(h, "cualloc_oom_message");
    std::printf("test_torch_abi: sizeof(cualloc_stats) = %zu\n", sizeof(cualloc_stats));

    if (argc > 2 && std::strcmp(argv[2], "fragmentation") == 0)
        test_fragmentation(L);
    else if (argc > 2 && std::strcmp(argv[2], "device-full") == 0)
        test_device_full(L);
    else if (argc > 2 && std::strcmp(argv[2], "disabled") == 0)
        test_disabled(L);
    else
        test_basic(L);

    if (failures) {
        std::fprintf(stderr, "test_torch_abi: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("test_torch_abi: ok\n");
    return 0;
}
