/* driver_costs.c — what the CUDA driver charges for the calls cualloc makes (bench/gpu/run.sh
 * driver-costs). Links only libdl: it dlopens libcuda.so.1 itself and calls it through the types of
 * src/cuda_decls.h, so it builds on machines without a CUDA toolkit and runs, with
 * LD_LIBRARY_PATH=build/tests/fakecuda, against the fake driver (the whole program path, with
 * meaningless times).
 *
 * Measured, on device 0, with the device's primary context current:
 *   - per chunk size (default 2, 20, 256 MiB, rounded up to the granularity), `--calls` times
 *     (default 100) after 3 unrecorded warm-ups, one chunk alive at a time: cuMemCreate, cuMemMap,
 *     cuMemSetAccess, cuMemUnmap, cuMemRelease, each timed alone, and their sum per iteration;
 *     then cuMemAlloc_v2 and cuMemFree_v2 of the same size;
 *   - building `--total-mb` (default 1024) of mapped, accessible memory in granule-sized chunks and
 *     in 20 MiB chunks: cuMemCreate + cuMemMap + cuMemSetAccess per chunk, and the same with one
 *     cuMemSetAccess over the whole range; and tearing it down (cuMemUnmap + cuMemRelease per
 *     chunk). Repeated `--reps` times (default 5); medians.
 *
 * Output: one JSON object per line into --json FILE (default stdout) and a human-readable table on
 * stdout (stderr when the JSON goes to stdout). Median, 10th and 90th percentile in microseconds.
 * Exit status: 0 done, 77 no driver or no device (nothing measured), 1 a driver call failed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_decls.h"

#define MiB ((size_t)1 << 20)
#define WARMUP 3
#define MAX_SIZES 8

static struct {
    cua_pfn_cuInit cuInit;
    cua_pfn_cuDriverGetVersion cuDriverGetVersion;
    cua_pfn_cuDeviceGet cuDeviceGet;
    cua_pfn_cuDeviceGetName cuDeviceGetName;
    cua_pfn_cuDeviceTotalMem_v2 cuDeviceTotalMem_v2;
    cua_pfn_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain;
    cua_pfn_cuCtxPushCurrent_v2 cuCtxPushCurrent_v2;
    cua_pfn_cuCtxSynchronize cuCtxSynchronize;
    cua_pfn_cuMemGetAllocationGranularity cuMemGetAllocationGranularity;
    cua_pfn_cuMemAddressReserve cuMemAddressReserve;
    cua_pfn_cuMemAddressFree cuMemAddressFree;
    cua_pfn_cuMemCreate cuMemCreate;
    cua_pfn_cuMemRelease cuMemRelease;
    cua_pfn_cuMemMap cuMemMap;
    cua_pfn_cuMemUnmap cuMemUnmap;
    cua_pfn_cuMemSetAccess cuMemSetAccess;
    cua_pfn_cuMemAlloc_v2 cuMemAlloc_v2;
    cua_pfn_cuMemFree_v2 cuMemFree_v2;
} cu;

static FILE *json;
static FILE *human;
static cua_mem_alloc_prop prop;
static cua_mem_access_desc access_desc;

static void die(const char *what, cua_result r) {
    fprintf(stderr, "driver_costs: %s failed: CUresult %d\n", what, r);
    exit(1);
}
#define CK(call)                                  \
    do {                                          \
        cua_result r_ = (call);                   \
        if (r_ != CUA_SUCCESS) die(#call, r_);    \
    } while (0)

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double median, p10, p90, mean;
} summary_t;

static summary_t summarize(double *v, int n) {
    summary_t s = {0, 0, 0, 0};
    if (n <= 0) return s;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    s.p10 = v[(n - 1) / 10];
    s.p90 = v[(n - 1) * 9 / 10];
    s.mean = sum / n;
    return s;
}

static void emit_calls(const char *op, size_t chunk, int n, double *samples) {
    summary_t s = summarize(samples, n);
    fprintf(json,
            "{\"part\":\"driver-costs\",\"op\":\"%s\",\"chunk_bytes\":%zu,\"calls\":%d,\"median_us\":%.3f,"
            "\"p10_us\":%.3f,\"p90_us\":%.3f,\"mean_us\":%.3f}\n",
            op, chunk, n, s.median, s.p10, s.p90, s.mean);
    fprintf(human, "  %-22s %9.1f MiB %6d calls  median %9.2f us  p10 %9.2f  p90 %9.2f\n", op,
            (double)chunk / (double)MiB, n, s.median, s.p10, s.p90);
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "driver_costs: libcuda.so.1 has no %s\n", name);
        exit(77);
    }
    return p;
}

static void load(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "driver_costs: no libcuda.so.1 (%s): no driver here; skipping\n", dlerror());
        exit(77);
    }
#define BIND(name) *(void **)&cu.name = sym(lib, #name)
    BIND(cuInit);
    BIND(cuDriverGetVersion);
    BIND(cuDeviceGet);
    BIND(cuDeviceGetName);
    BIND(cuDeviceTotalMem_v2);
    BIND(cuDevicePrimaryCtxRetain);
    BIND(cuCtxPushCurrent_v2);
    BIND(cuCtxSynchronize);
    BIND(cuMemGetAllocationGranularity);
    BIND(cuMemAddressReserve);
    BIND(cuMemAddressFree);
    BIND(cuMemCreate);
    BIND(cuMemRelease);
    BIND(cuMemMap);
    BIND(cuMemUnmap);
    BIND(cuMemSetAccess);
    BIND(cuMemAlloc_v2);
    BIND(cuMemFree_v2);
#undef BIND
}

/* The five VMM calls, one chunk alive at a time; then cuMemAlloc/cuMemFree of the same size. */
static void per_call(size_t chunk, int calls) {
    cua_devptr va;
    CK(cu.cuMemAddressReserve(&va, chunk, 0, 0, 0));
    int n = calls + WARMUP;
    double *t[7];
    for (int k = 0; k < 7; k++) t[k] = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) {
        cua_memhandle h;
        double a = now_us();
        CK(cu.cuMemCreate(&h, chunk, &prop, 0));
        double b = now_us();
        CK(cu.cuMemMap(va, chunk, 0, h, 0));
        double c = now_us();
        CK(cu.cuMemSetAccess(va, chunk, &access_desc, 1));
        double d = now_us();
        CK(cu.cuMemUnmap(va, chunk));
        double e = now_us();
        CK(cu.cuMemRelease(h));
        double f = now_us();
        t[0][i] = b - a, t[1][i] = c - b, t[2][i] = d - c, t[3][i] = e - d, t[4][i] = f - e, t[5][i] = f - a;
    }
    CK(cu.cuMemAddressFree(va, chunk));
    static const char *names[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                                  "vmm_all_five"};
    for (int k = 0; k < 6; k++) emit_calls(names[k], chunk, calls, t[k] + WARMUP);

    double *fr = t[6];
    double *al = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) {
        cua_devptr p;
        double a = now_us();
        CK(cu.cuMemAlloc_v2(&p, chunk));
        double b = now_us();
        CK(cu.cuMemFree_v2(p));
        double c = now_us();
        al[i] = b - a, fr[i] = c - b;
    }
    emit_calls("cuMemAlloc", chunk, calls, al + WARMUP);
    emit_calls("cuMemFree", chunk, calls, fr + WARMUP);
    free(al);
    for (int k = 0; k < 7; k++) free(t[k]);
}

/* `total` bytes made mapped and accessible in chunks of `chunk`: per-chunk cuMemSetAccess or one
 * call for the whole range; then torn down. */
static void build_total(size_t total, size_t chunk, int reps, bool one_access) {
    size_t nchunks = total / chunk;
    if (nchunks == 0) return;
    size_t span = nchunks * chunk;
    cua_memhandle *h = calloc(nchunks, sizeof *h);
    double *build = calloc((size_t)reps + 1, sizeof(double)), *teardown = calloc((size_t)reps + 1, sizeof(double));
    cua_devptr va;
    CK(cu.cuMemAddressReserve(&va, span, 0, 0, 0));
    for (int r = 0; r < reps + 1; r++) { /* rep 0 is a warm-up */
        double a = now_us();
        for (size_t i = 0; i < nchunks; i++) {
            CK(cu.cuMemCreate(&h[i], chunk, &prop, 0));
            CK(cu.cuMemMap(va + i * chunk, chunk, 0, h[i], 0));
            if (!one_access) CK(cu.cuMemSetAccess(va + i * chunk, chunk, &access_desc, 1));
        }
        if (one_access) CK(cu.cuMemSetAccess(va, span, &access_desc, 1));
        double b = now_us();
        for (size_t i = 0; i < nchunks; i++) {
            CK(cu.cuMemUnmap(va + i * chunk, chunk));
            CK(cu.cuMemRelease(h[i]));
        }
        double c = now_us();
        build[r] = b - a, teardown[r] = c - b;
    }
    CK(cu.cuMemAddressFree(va, span));
    summary_t sb = summarize(build + 1, reps), st = summarize(teardown + 1, reps);
    const char *acc = one_access ? "one-call" : "per-chunk";
    fprintf(json,
            "{\"part\":\"driver-costs\",\"op\":\"build_create_map_access\",\"access\":\"%s\",\"chunk_bytes\":%zu,"
            "\"total_bytes\":%zu,\"chunks\":%zu,\"reps\":%d,\"median_ms\":%.3f,\"per_chunk_us\":%.3f,"
            "\"per_gib_ms\":%.3f}\n",
            acc, chunk, span, nchunks, reps, sb.median / 1e3, sb.median / (double)nchunks,
            sb.median / 1e3 * (double)(1024 * MiB) / (double)span);
    fprintf(json,
            "{\"part\":\"driver-costs\",\"op\":\"teardown_unmap_release\",\"access\":\"%s\",\"chunk_bytes\":%zu,"
            "\"total_bytes\":%zu,\"chunks\":%zu,\"reps\":%d,\"median_ms\":%.3f,\"per_chunk_us\":%.3f}\n",
            acc, chunk, span, nchunks, reps, st.median / 1e3, st.median / (double)nchunks);
    fprintf(human,
            "  build %7.1f MiB in %5zu x %6.1f MiB, access %-9s: %9.3f ms (%8.2f us per chunk); "
            "teardown %9.3f ms (%8.2f us per chunk)\n",
            (double)span / (double)MiB, nchunks, (double)chunk / (double)MiB, acc, sb.median / 1e3,
            sb.median / (double)nchunks, st.median / 1e3, st.median / (double)nchunks);
    free(h);
    free(build);
    free(teardown);
}

#define USAGE "usage: driver_costs [--calls N] [--sizes-mb A,B,...] [--total-mb N] [--reps N] [--json FILE]\n"

// A bad command line: what was wrong, then the usage; exit 2.
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "driver_costs: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n" USAGE);
    exit(2);
}

// A whole number from 1 to max, else bad_usage naming the option and the text.
static unsigned long long positive_arg(const char *opt, const char *text, unsigned long long max) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || errno || v == 0 || v > max || text[0] == '-')
        bad_usage("%s takes a whole number from 1 to %llu, not '%s'", opt, max, text);
    return v;
}

int main(int argc, char **argv) {
    int calls = 100, reps = 5;
    size_t total_mb = 1024;
    size_t sizes_mb[MAX_SIZES] = {2, 20, 256};
    int nsizes = 3;
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf(USAGE "What the CUDA driver charges for the calls cualloc makes (see the top of driver_costs.c).\n");
            return 0;
        }
        if (strcmp(argv[i], "--calls") && strcmp(argv[i], "--reps") && strcmp(argv[i], "--total-mb") &&
            strcmp(argv[i], "--json") && strcmp(argv[i], "--sizes-mb"))
            bad_usage("unknown argument '%s'", argv[i]);
        if (i + 1 >= argc) bad_usage("%s needs a value", argv[i]);
        const char *opt = argv[i], *val = argv[++i];
        if (!strcmp(opt, "--calls")) calls = (int)positive_arg(opt, val, 1000000);
        else if (!strcmp(opt, "--reps")) reps = (int)positive_arg(opt, val, 1000);
        else if (!strcmp(opt, "--total-mb")) total_mb = positive_arg(opt, val, 1 << 24);
        else if (!strcmp(opt, "--json")) json_path = val;
        else {
            nsizes = 0;
            char item[32];
            for (const char *s = val; *s;) {
                size_t n = strcspn(s, ",");
                if (nsizes == MAX_SIZES) bad_usage("--sizes-mb takes at most %d sizes, not '%s'", MAX_SIZES, val);
                snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item - 1 ? n : sizeof item - 1), s);
                sizes_mb[nsizes++] = positive_arg("--sizes-mb", item, 1 << 20);
                s += n + (s[n] == ',');
            }
            if (nsizes == 0) bad_usage("--sizes-mb names no size ('%s')", val);
        }
    }
    json = stdout;
    human = stderr;
    if (json_path) {
        json = fopen(json_path, "w");
        if (!json) {
            perror(json_path);
            return 2;
        }
        human = stdout;
    }
    /* Every line out as soon as it is written: a run stopped by run.sh's timeout (a driver call
     * that hangs) keeps the figures measured before it, in the JSON file and in the log. */
    setvbuf(json, NULL, _IOLBF, 0);
    setvbuf(human, NULL, _IOLBF, 0);

    load();
    cua_result r = cu.cuInit(0);
    if (r != CUA_SUCCESS) {
        fprintf(stderr, "driver_costs: cuInit: CUresult %d: no usable device; skipping\n", r);
        return 77;
    }
    cua_device dev;
    if ((r = cu.cuDeviceGet(&dev, 0)) != CUA_SUCCESS) {
        fprintf(stderr, "driver_costs: cuDeviceGet(0): CUresult %d; skipping\n", r);
        return 77;
    }
    cua_ctx ctx;
    CK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cu.cuCtxPushCurrent_v2(ctx));
    char name[128] = "";
    CK(cu.cuDeviceGetName(name, (int)sizeof name, dev));
    size_t total = 0;
    CK(cu.cuDeviceTotalMem_v2(&total, dev));
    int version = 0;
    CK(cu.cuDriverGetVersion(&version));

    memset(&prop, 0, sizeof prop);
    prop.type = CUA_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = CUA_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CUA_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    access_desc.location = prop.location;
    access_desc.flags = CUA_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t gran = 0;
    CK(cu.cuMemGetAllocationGranularity(&gran, &prop, CUA_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (gran == 0) die("cuMemGetAllocationGranularity (0)", CUA_ERROR_UNKNOWN);

    for (const char *p = name; *p; p++) /* keep the JSON string plain */
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) name[p - name] = '_';
    fprintf(json,
            "{\"part\":\"driver-costs\",\"op\":\"device\",\"name\":\"%s\",\"total_bytes\":%zu,\"granularity\":%zu,"
            "\"driver_version\":%d,\"calls\":%d,\"reps\":%d}\n",
            name, total, gran, version, calls, reps);
    fprintf(human, "driver_costs: %s, %.2f GiB, granularity %zu KiB, driver API %d; %d calls per figure\n", name,
            (double)total / (double)(1024 * MiB), gran / 1024, version, calls);

    for (int i = 0; i < nsizes; i++) {
        size_t chunk = (sizes_mb[i] * MiB + gran - 1) / gran * gran;
        per_call(chunk, calls);
    }
    size_t tot = (total_mb * MiB + gran - 1) / gran * gran;
    size_t mid = (20 * MiB + gran - 1) / gran * gran;
    build_total(tot, gran, reps, false);
    build_total(tot, mid, reps, false);
    build_total(tot, gran, reps, true);
    build_total(tot, mid, reps, true);
    CK(cu.cuCtxSynchronize());
    if (json != stdout) fclose(json);
    fprintf(human, "driver_costs: done\n");
    return 0;
}
