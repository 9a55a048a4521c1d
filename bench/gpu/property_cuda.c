/* property_cuda.c — the heap property test (tests/test_heap_property.c) on the CUDA backend, with
 * every block written and read back by the device (bench/gpu/run.sh property-cuda; meson test
 * suite 'gpu').
 *
 * A heap over driver_cuda_ops (libcuda.so.1, dlopened) on device 0 serves random allocations and
 * frees — request sizes drawn like a training job's tensors from 512 B to 64 MiB, on the legacy
 * stream and on a created stream, in VMM and classic modes, with and without a memory cap
 * (max_memory_mb) small enough that the heap must release its cache and retry, and fail. Every
 * block is filled on the device with cuMemsetD8_v2 with a byte of its own, and a few bytes at its
 * start, middle, end and one random place are copied back with cuMemcpyDtoH_v2 and checked, when
 * allocated and again when freed (so a block another block overlapped, or memory unmapped under a
 * live block, is caught). After every operation: heap_check, and the statistics against a model of
 * the live blocks (requested and allocated bytes, alloc and free counts, reserved within the cap);
 * after an out-of-memory in VMM mode, that the cap was truly reached. Every variant ends with
 * everything freed and trimmed: nothing reserved.
 *
 * Usage: property_cuda [--ops N] [--json FILE] [--variant SUBSTRING]
 *   --ops N   operations per variant (default: each variant's own, 2000-4000)
 * Configuration: CUALLOC_CONF (read first; each variant's keys are parsed over it). Against the
 * fake driver: LD_LIBRARY_PATH=build/tests/fakecuda CUALLOC_CONF=driver:cuda,sim_host_backed:1,...
 * Seed: CUALLOC_SEED (printed). Exit status: 0 pass, 77 no driver or device (skip), abort on a
 * failed expectation.
 */
#include <dlfcn.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"
#include "text.h"

#define MAX_LIVE 256
#define NSTREAMS 2
#define PROBE 16

typedef cua_result (*pfn_memset_d8)(cua_devptr dst, unsigned char value, size_t n);
typedef cua_result (*pfn_memcpy_dtoh)(void *dst, cua_devptr src, size_t n);
typedef cua_result (*pfn_stream_destroy)(cua_stream s);

static struct {
    pfn_memset_d8 memset_d8;
    pfn_memcpy_dtoh memcpy_dtoh;
    cua_pfn_cuStreamCreate stream_create;
    pfn_stream_destroy stream_destroy;
    cua_pfn_cuDevicePrimaryCtxRetain ctx_retain;
    cua_pfn_cuCtxPushCurrent_v2 ctx_push;
    cua_pfn_cuDeviceGet device_get;
} cu;

typedef struct {
    uintptr_t ptr;
    size_t size;  /* requested */
    size_t block; /* the block's size */
    int stream;
    unsigned char value;
    size_t extra; /* a random probe offset */
} live_t;

typedef struct {
    const char *name;
    const char *conf; /* over CUALLOC_CONF */
    size_t max_request;
    int ops;
} variant_t;

static const variant_t variants[] = {
    {"vmm", "", 64 << 20, 4000},
    {"vmm cap 192 MiB", "max_memory_mb:192", 64 << 20, 4000},
    {"vmm 20 MiB chunks, cap 320 MiB", "chunk_size_mb:20,max_memory_mb:320", 64 << 20, 3000},
    {"vmm pow2 rounding, gc", "roundup_power2_divisions:4,garbage_collection_threshold:0.5,max_memory_mb:512",
     64 << 20, 3000},
    {"classic", "expandable_segments:False", 64 << 20, 3000},
    {"classic cap 192 MiB", "expandable_segments:False,max_memory_mb:192", 64 << 20, 4000},
    {"classic max_split gc cap 512 MiB",
     "expandable_segments:False,max_split_size_mb:40,garbage_collection_threshold:0.6,max_memory_mb:512", 64 << 20,
     3000},
};

typedef struct {
    heap_t *h;
    conf_t conf;
    cua_stream streams[NSTREAMS];
    live_t live[MAX_LIVE];
    int nlive;
    size_t requested, allocated;
    uint64_t allocs, frees, serial;
    uint64_t bytes_written, probes, checks;
} world_t;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p, "libcuda.so.1 has no %s", name);
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads PROBE bytes (fewer near the end) at `off` of the block and checks every one. */
static void probe(world_t *w, const live_t *l, size_t off, const char *when) {
    if (off >= l->size) return;
    size_t n = l->size - off < PROBE ? l->size - off : PROBE;
    unsigned char buf[PROBE];
    memset(buf, (unsigned char)~l->value, sizeof buf);
    cua_result r = cu.memcpy_dtoh(buf, (cua_devptr)(l->ptr + off), n);
    EXPECT(r == CUA_SUCCESS, "cuMemcpyDtoH_v2 of %zu B at %#lx+%zu (%s): %s", n, (unsigned long)l->ptr, off, when,
           driver_error_name(r));
    for (size_t i = 0; i < n; i++)
        EXPECT(buf[i] == l->value, "block %#lx (%zu B) byte %zu is %#x, expected %#x (%s)", (unsigned long)l->ptr,
               l->size, off + i, buf[i], l->value, when);
    w->probes++;
}

static void probe_all(world_t *w, const live_t *l, const char *when) {
    if (!l->size) return;
    probe(w, l, 0, when);
    probe(w, l, l->size / 2, when);
    probe(w, l, l->size > PROBE ? l->size - PROBE : 0, when);
    probe(w, l, l->extra, when);
}

static void verify(world_t *w, const char *what) {
    int bad = heap_check(w->h, stderr);
    EXPECT(bad == 0, "heap_check found %d violations after %s", bad, what);
    w->checks++;
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    EXPECT(s.requested_bytes == w->requested, "requested %zu, model %zu", s.requested_bytes, w->requested);
    EXPECT(s.allocated_bytes == w->allocated, "allocated %zu, model %zu", s.allocated_bytes, w->allocated);
    EXPECT(s.num_allocs == w->allocs && s.num_frees == w->frees, "counts %llu/%llu, model %llu/%llu",
           (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees, (unsigned long long)w->allocs,
           (unsigned long long)w->frees);
    EXPECT(s.reserved_bytes <= s.capacity_bytes, "reserved %zu over the cap %zu", s.reserved_bytes, s.capacity_bytes);
    EXPECT(s.reserved_bytes >= s.allocated_bytes, "reserved below allocated");
}

static bool world_alloc(world_t *w, rng_t *r, size_t size, int stream) {
    void *p = NULL;
    cua_result res = heap_alloc(w->h, size, w->streams[stream], &p);
    if (res != CUA_SUCCESS) {
        EXPECT(res == CUA_ERROR_OUT_OF_MEMORY, "allocation of %zu B failed with %s", size, driver_error_name(res));
        EXPECT(p == NULL, "failed allocation returned a pointer");
        return false;
    }
    EXPECT(p && ((uintptr_t)p % 512) == 0, "pointer %p not 512-aligned", p);
    block_t *b = heap_test_find_block(w->h, p);
    size_t rsize = heap_round_size(&w->conf, size);
    EXPECT(b && b->size >= rsize, "block of %zu for a rounded request of %zu", b ? b->size : 0, rsize);
    for (int i = 0; i < w->nlive; i++) {
        const live_t *o = &w->live[i];
        EXPECT((uintptr_t)p + b->size <= o->ptr || o->ptr + o->block <= (uintptr_t)p,
               "new block %p+%zu overlaps live %#lx+%zu", p, b->size, (unsigned long)o->ptr, o->block);
    }
    live_t *l = &w->live[w->nlive++];
    w->serial++;
    *l = (live_t){(uintptr_t)p, size, b->size, stream, (unsigned char)(w->serial * 131u + 7u),
                  size ? (size_t)rng_below(r, size) : 0};
    if (size) {
        cua_result m = cu.memset_d8((cua_devptr)l->ptr, l->value, size);
        EXPECT(m == CUA_SUCCESS, "cuMemsetD8_v2 of %zu B at %p: %s", size, p, driver_error_name(m));
        w->bytes_written += size;
        probe_all(w, l, "after writing it");
    }
    w->requested += size;
    w->allocated += b->size;
    w->allocs++;
    return true;
}

static void world_free(world_t *w, int i, int stream) {
    live_t l = w->live[i];
    probe_all(w, &l, "before freeing it");
    EXPECT(heap_free(w->h, (void *)l.ptr, w->streams[stream]), "free of a live block refused");
    w->live[i] = w->live[--w->nlive];
    w->requested -= l.size;
    w->allocated -= l.block;
    w->frees++;
}

/* After an OOM in VMM mode the heap released every cached chunk it could and the request still
 * did not fit: only partial chunks around live blocks may remain. */
static void check_vmm_oom(world_t *w, size_t size) {
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    size_t chunk = heap_chunk_size(w->h, POOL_LARGE);
    if (heap_chunk_size(w->h, POOL_SMALL) > chunk) chunk = heap_chunk_size(w->h, POOL_SMALL);
    size_t slack = 2 * chunk * (size_t)(w->nlive + 2);
    size_t rsize = heap_round_size(&w->conf, size);
    EXPECT(s.reserved_bytes - s.allocated_bytes <= slack, "OOM with %zu B cached beyond live blocks (slack %zu)",
           s.reserved_bytes - s.allocated_bytes, slack);
    EXPECT(w->allocated + rsize + slack > s.capacity_bytes, "OOM for %zu B with %zu B live of %zu", rsize,
           w->allocated, s.capacity_bytes);
}

static void run_variant(const variant_t *v, int ops, rng_t *r, FILE *json, uint64_t seed) {
    world_t *w = calloc(1, sizeof *w);
    EXPECT(w, "out of host memory");
    conf_load(&w->conf);
    EXPECT(conf_parse(v->conf, &w->conf) == 0, "bad variant configuration '%s'", v->conf);
    cua_result err;
    w->h = heap_create(0, &w->conf, &driver_cuda_ops, &err);
    EXPECT(w->h, "heap_create on the CUDA backend failed: %s", driver_error_name(err));
    w->streams[0] = NULL;
    for (int i = 1; i < NSTREAMS; i++) {
        cua_result sr = cu.stream_create(&w->streams[i], 0);
        EXPECT(sr == CUA_SUCCESS, "cuStreamCreate: %s", driver_error_name(sr));
        heap_stream_created(w->h, w->streams[i], false);
    }
    bool vmm = heap_is_vmm(w->h);
    int ooms = 0;
    double t0 = now_s();
    for (int op = 0; op < ops; op++) {
        uint64_t dice = rng_below(r, 100);
        if (w->nlive < MAX_LIVE && (dice < 55 || w->nlive == 0)) {
            size_t size = rng_below(r, 50) == 0 ? 0 : rng_tensor_size(r, v->max_request);
            if (size && size < 512) size = 512; /* 512 B ... 64 MiB, and a few of 0 B */
            int stream = (int)rng_below(r, NSTREAMS);
            if (!world_alloc(w, r, size, stream)) {
                ooms++;
                if (vmm) check_vmm_oom(w, size);
            }
        } else if (dice < 98) {
            int i = (int)rng_below(r, (uint64_t)w->nlive);
            int stream = rng_below(r, 10) ? w->live[i].stream : (int)rng_below(r, NSTREAMS);
            world_free(w, i, stream);
        } else {
            heap_trim(w->h);
        }
        verify(w, "an operation");
    }
    while (w->nlive) world_free(w, w->nlive - 1, w->live[w->nlive - 1].stream);
    heap_trim(w->h);
    verify(w, "freeing everything and trimming");
    cualloc_stats s;
    heap_get_stats(w->h, &s);
    if (s.reserved_bytes) heap_dump(w->h, stderr);
    EXPECT(s.reserved_bytes == 0, "%zu B still reserved after trim", s.reserved_bytes);
    double secs = now_s() - t0;
    printf("  %-36s %-7s %5d ops %5llu allocs %4d OOMs %4llu retries %5llu maps %5llu unmaps %8.1f MiB written "
           "%6llu probes  %.2f s\n",
           v->name, vmm ? "vmm" : "classic", ops, (unsigned long long)w->allocs, ooms,
           (unsigned long long)s.num_alloc_retries, (unsigned long long)s.num_maps, (unsigned long long)s.num_unmaps,
           (double)w->bytes_written / (double)MiB, (unsigned long long)w->probes, secs);
    fflush(stdout);
    if (json) {
        fprintf(json,
                "{\"part\":\"property-cuda\",\"variant\":\"%s\",\"conf\":\"%s\",\"mode\":\"%s\",\"pass\":true,"
                "\"ops\":%d,\"allocs\":%llu,\"frees\":%llu,\"ooms\":%d,\"retries\":%llu,\"maps\":%llu,"
                "\"unmaps\":%llu,\"syncs\":%llu,\"reserved_peak\":%zu,\"capacity_bytes\":%zu,\"bytes_written\":%llu,"
                "\"probes\":%llu,\"heap_checks\":%llu,\"seconds\":%.3f,\"seed\":%llu}\n",
                v->name, v->conf, vmm ? "vmm" : "classic", ops, (unsigned long long)w->allocs,
                (unsigned long long)w->frees, ooms, (unsigned long long)s.num_alloc_retries,
                (unsigned long long)s.num_maps, (unsigned long long)s.num_unmaps, (unsigned long long)s.num_syncs,
                s.reserved_peak, s.capacity_bytes, (unsigned long long)w->bytes_written,
                (unsigned long long)w->probes, (unsigned long long)w->checks, secs, (unsigned long long)seed);
        fflush(json);
    }
    heap_destroy(w->h);
    for (int i = 1; i < NSTREAMS; i++) cu.stream_destroy(w->streams[i]);
    free(w);
}

int main(int argc, char **argv) {
    int ops = 0;
    const char *json_path = NULL, *only = NULL;
    static const char usage[] = "usage: property_cuda [--ops N] [--json FILE] [--variant SUBSTRING]\n";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%sThe heap's property test on the real CUDA driver (see the top of property_cuda.c).\n", usage);
            return 0;
        }
        const char *opt = argv[i];
        if (strcmp(opt, "--ops") && strcmp(opt, "--json") && strcmp(opt, "--variant")) {
            fprintf(stderr, "property_cuda: unknown argument '%s'\n%s", opt, usage);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "property_cuda: %s needs a value\n%s", opt, usage);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(opt, "--ops")) {
            unsigned long long v;
            if (!txt_parse_count(val, 1, 100000000, &v)) {
                fprintf(stderr, "property_cuda: --ops takes a whole number from 1 to 100000000, not '%s'\n%s", val,
                        usage);
                return 2;
            }
            ops = (int)v;
        } else if (!strcmp(opt, "--json")) json_path = val;
        else only = val;
    }
    cua_result r = driver_cuda_ops.init();
    if (r != CUA_SUCCESS) {
        printf("property_cuda: no usable CUDA driver or device (%s); skipping\n", driver_error_name(r));
        return 77;
    }
    int n = 0;
    if (driver_cuda_ops.device_count(&n) != CUA_SUCCESS || n < 1) {
        printf("property_cuda: no CUDA device; skipping\n");
        return 77;
    }
    driver_device_info_t info;
    EXPECT(driver_cuda_ops.device_info(0, &info) == CUA_SUCCESS, "device_info(0)");
    /* The backend holds libcuda.so.1 open; this finds the same copy. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib, "dlopen libcuda.so.1: %s", dlerror());
    *(void **)&cu.memset_d8 = sym(lib, "cuMemsetD8_v2");
    *(void **)&cu.memcpy_dtoh = sym(lib, "cuMemcpyDtoH_v2");
    *(void **)&cu.stream_create = sym(lib, "cuStreamCreate");
    *(void **)&cu.stream_destroy = sym(lib, "cuStreamDestroy_v2");
    *(void **)&cu.ctx_retain = sym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.ctx_push = sym(lib, "cuCtxPushCurrent_v2");
    *(void **)&cu.device_get = sym(lib, "cuDeviceGet");
    /* The memset, copy and stream calls run in device 0's primary context (the backend pushes the
     * same context around its own calls and restores this one). */
    cua_device d;
    cua_ctx ctx;
    EXPECT(cu.device_get(&d, 0) == CUA_SUCCESS, "cuDeviceGet");
    EXPECT(cu.ctx_retain(&ctx, d) == CUA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT(cu.ctx_push(ctx) == CUA_SUCCESS, "cuCtxPushCurrent_v2");

    FILE *json = NULL;
    if (json_path) {
        json = fopen(json_path, "w");
        EXPECT(json, "cannot write %s", json_path);
        fprintf(json,
                "{\"part\":\"property-cuda\",\"variant\":\"device\",\"name\":\"%s\",\"total_bytes\":%zu,"
                "\"granularity\":%zu,\"vmm_supported\":%s}\n",
                info.name, info.total_bytes, info.granularity, info.vmm_supported ? "true" : "false");
    }
    printf("property_cuda: %s, %.2f GiB, granularity %zu KiB, VMM %s\n", info.name,
           (double)info.total_bytes / (double)GiB, info.granularity / 1024, info.vmm_supported ? "yes" : "no");
    uint64_t seed = test_seed("property_cuda");
    rng_t rng = {seed};
    int ran = 0;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        if (only && !strstr(variants[i].name, only)) continue;
        run_variant(&variants[i], ops > 0 ? ops : variants[i].ops, &rng, json, seed);
        ran++;
    }
    if (json) fclose(json);
    EXPECT(ran > 0, "no variant matches '%s'", only ? only : "");
    printf("property_cuda: ok (%d variants)\n", ran);
    return 0;
}
