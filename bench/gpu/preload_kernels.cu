// preload_kernels.cu — an ordinary CUDA runtime program for bench/gpu/run.sh ld-preload. It
// includes no cualloc header and knows nothing of cualloc: run.sh builds it with nvcc twice
// (-cudart static, -cudart shared) and runs each build with and without
// LD_PRELOAD=build/src/libcualloc.so.
//
// Every round allocates `--buffers` triplets (a, b: cudaMalloc; c: cudaMallocAsync on a stream),
// sizes log-uniform from 1 KiB to `--max-mb` MiB, fills a and b with a kernel, adds them into c
// with a kernel, reduces c with a checksum kernel, copies the checksum and a few elements of c
// back and checks them against values computed on the host (all exact: small integers in float);
// then frees the triplets (cudaFree, cudaFreeAsync), keeping a quarter of them alive into the
// next round so that allocation and free orders interleave across rounds.
//
// Then the cross-stream rounds (`--xs-rounds`, 0 skips them): two non-blocking streams S and T.
// Each round S gets a 4 or 8 MiB buffer X (cudaMallocAsync on S), fills it, launches a kernel that
// spins about a millisecond and then sums X, and frees X on S at once, and frees a temporary on S
// too, so S frees all the time; T then allocates the same size on T and overwrites it with a
// kernel, which runs beside S's. If T were handed X before S's kernel had read it, that sum would
// be wrong: every sum is checked. T's buffer overlapping an earlier X is counted as a cross-stream
// reuse (the allocator moved S's memory to T once S had passed its free). T frees its buffer at
// once, so an allocator that keeps per-stream caches hands T its own buffer back: these rounds
// show that nothing is handed over early, not that anything is handed over.
//
// The hand-over rounds (`--handover-rounds`, 0 skips them) run first, while the allocator holds
// no freed memory, so that T can be served only from S's memory or from new memory. S allocates R
// 4 MiB buffers A[r], each followed by a 2 MiB separator (no two freed buffers merge into one
// block), and allocates nothing after. Round r fills A[r] on S, launches the spinning reader of
// A[r] and frees A[r] on S; the host then waits for an event recorded on S at the end of round
// r-1 (S has passed A[r-1]'s reader and free, and is running A[r]'s), and T allocates 4 MiB,
// overwrites it with a kernel and keeps it. A correct allocator may give T A[r-1] (or any earlier
// A), never A[r] while its reader runs: every sum is checked, and T's buffers that overlap an
// earlier A are counted as hand-overs. An allocator that hands over once S is seen past the free
// does so in every round but the first.
//
// Prints one line `preload_kernels: RESULT {json}` (pass, counts, seconds, the cross-stream and
// hand-over rounds' reuses and mismatches, and — found with dlsym as any program could — cualloc's
// num_allocs and reserved peak when libcualloc.so is loaded, else -1). Exit status 0 when every
// check passed, 1 otherwise.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

struct stats_mirror { // struct cualloc_stats (include/cualloc.h)
    size_t requested_bytes, requested_peak, allocated_bytes, allocated_peak, active_bytes, active_peak,
        reserved_bytes, reserved_peak, inactive_split_bytes, inactive_split_peak;
    size_t largest_free_block, capacity_bytes;
    uint64_t num_allocs, num_frees, num_maps, num_unmaps, num_alloc_retries, num_ooms, num_syncs, num_trims;
};
typedef int (*get_stats_fn)(int, stats_mirror *);

static unsigned long long g_mallocs, g_async, g_frees, g_bytes, g_mismatches;
static unsigned long long g_xs_reuses, g_xs_mismatches;
static unsigned long long g_ho_reuses, g_ho_mismatches;
static int g_rounds, g_buffers, g_xs_rounds, g_ho_rounds;
static double g_t0;
static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void report(bool pass, const char *error) {
    long long num_allocs = -1, reserved_peak = -1;
    void *gs = dlsym(RTLD_DEFAULT, "cualloc_get_stats");
    get_stats_fn get_stats;
    memcpy(&get_stats, &gs, sizeof gs);
    stats_mirror s;
    memset(&s, 0, sizeof s);
    if (get_stats && get_stats(0, &s) == 0) {
        num_allocs = (long long)s.num_allocs;
        reserved_peak = (long long)s.reserved_peak;
    }
    printf("preload_kernels: RESULT {\"pass\":%s,\"rounds\":%d,\"buffers\":%d,\"cudaMalloc\":%llu,"
           "\"cudaMallocAsync\":%llu,\"frees\":%llu,\"bytes_allocated\":%llu,\"mismatches\":%llu,\"seconds\":%.3f,"
           "\"xs_rounds\":%d,\"xs_reuses\":%llu,\"xs_mismatches\":%llu,"
           "\"handover_rounds\":%d,\"handover_reuses\":%llu,\"handover_mismatches\":%llu,"
           "\"cualloc_num_allocs\":%lld,\"cualloc_reserved_peak\":%lld,\"error\":\"%s\"}\n",
           pass ? "true" : "false", g_rounds, g_buffers, g_mallocs, g_async, g_frees, g_bytes, g_mismatches,
           now_s() - g_t0, g_xs_rounds, g_xs_reuses, g_xs_mismatches, g_ho_rounds, g_ho_reuses, g_ho_mismatches, num_allocs, reserved_peak, error);
    fflush(stdout);
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            char msg_[256];                                                                       \
            snprintf(msg_, sizeof msg_, "%s: %s (line %d)", #call, cudaGetErrorName(e_), __LINE__); \
            for (char *p_ = msg_; *p_; p_++)                                                      \
                if (*p_ == '"' || *p_ == '\\') *p_ = '\'';                                        \
            fprintf(stderr, "preload_kernels: %s\n", msg_);                                       \
            report(false, msg_);                                                                  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

__global__ void fill(float *a, float *b, size_t n, unsigned tag) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        a[j] = (float)((j % 1000) + (tag % 64));
        b[j] = (float)((j % 777) * 2);
    }
}

__global__ void vadd(const float *a, const float *b, float *c, size_t n) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        c[j] = a[j] + b[j];
}

// Adds this block's part of the sum of c[0..n) to *out (blockDim.x at most 256, a power of two).
__device__ void block_sum_into(const float *c, size_t n, unsigned long long *out) {
    __shared__ unsigned long long part[256];
    unsigned long long s = 0;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        s += (unsigned long long)c[j];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

__global__ void checksum(const float *c, size_t n, unsigned long long *out) { block_sum_into(c, n, out); }

__global__ void fill_value(float *x, size_t n, float v) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) x[j] = v;
}

// Spins for `cycles` clock ticks, then sums x into *out: a reader that is still running when the
// host has long since freed x.
__global__ void spin_then_sum(const float *x, size_t n, long long cycles, unsigned long long *out) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    block_sum_into(x, n, out);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng() {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct triplet {
    float *a, *b, *c;
    size_t n;
    unsigned tag;
};

static unsigned long long expected_sum(size_t n, unsigned tag) {
    unsigned long long s = 0;
    for (size_t j = 0; j < n; j++) s += (j % 1000) + (tag % 64) + (j % 777) * 2;
    return s;
}

static void check(const triplet &t, cudaStream_t st, unsigned long long *dsum) {
    unsigned grid = (unsigned)((t.n + 255) / 256 < 1024 ? (t.n + 255) / 256 : 1024);
    CK(cudaMemsetAsync(dsum, 0, sizeof *dsum, st));
    checksum<<<grid, 256, 0, st>>>(t.c, t.n, dsum);
    CK(cudaGetLastError());
    unsigned long long got = 0;
    CK(cudaMemcpyAsync(&got, dsum, sizeof got, cudaMemcpyDeviceToHost, st));
    size_t idx[3] = {0, t.n / 2, t.n - 1};
    float v[3];
    for (int k = 0; k < 3; k++) CK(cudaMemcpyAsync(&v[k], t.c + idx[k], sizeof(float), cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    if (got != expected_sum(t.n, t.tag)) {
        fprintf(stderr, "preload_kernels: checksum of a %zu-element buffer: %llu, expected %llu\n", t.n, got,
                expected_sum(t.n, t.tag));
        g_mismatches++;
    }
    for (int k = 0; k < 3; k++) {
        size_t j = idx[k];
        float want = (float)((j % 1000) + (t.tag % 64) + (j % 777) * 2);
        if (v[k] != want) {
            fprintf(stderr, "preload_kernels: c[%zu] = %g, expected %g\n", j, v[k], want);
            g_mismatches++;
        }
    }
}

static void release(const triplet &t, cudaStream_t st) {
    CK(cudaFree(t.a));
    CK(cudaFree(t.b));
    CK(cudaFreeAsync(t.c, st));
    g_frees += 3;
}

// Does [p, p + n) overlap [q, q + m)?
static bool overlaps(const void *p, size_t n, const void *q, size_t m) {
    return (uintptr_t)p < (uintptr_t)q + m && (uintptr_t)q < (uintptr_t)p + n;
}

// What both kinds of cross-stream rounds work with: two non-blocking streams S and T, and one
// device sum per round, zeroed, which S's spinning reader of round r adds into.
struct stream_pair {
    cudaStream_t s, t;
    unsigned long long *sums;
    int rounds;
};

static stream_pair stream_pair_open(int rounds) {
    stream_pair p;
    p.rounds = rounds;
    CK(cudaStreamCreateWithFlags(&p.s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&p.t, cudaStreamNonBlocking));
    CK(cudaMalloc(&p.sums, (size_t)rounds * sizeof *p.sums));
    g_mallocs++;
    CK(cudaMemset(p.sums, 0, (size_t)rounds * sizeof *p.sums));
    CK(cudaDeviceSynchronize()); // the memset is on the legacy stream, which S does not wait for
    return p;
}

// Waits for both streams and checks round r's sum against lengths[r] * (r % 64 + 1) (its buffer
// was filled with r % 64 + 1): each wrong one counts in *mismatches, the first five are printed
// with `what` (the rounds) and `why` (what a wrong sum means). Then frees the sums and the streams.
static void stream_pair_close(stream_pair &p, const std::vector<size_t> &lengths, unsigned long long *mismatches,
                              const char *what, const char *why) {
    CK(cudaStreamSynchronize(p.s));
    CK(cudaStreamSynchronize(p.t));
    std::vector<unsigned long long> got((size_t)p.rounds);
    CK(cudaMemcpy(got.data(), p.sums, got.size() * sizeof got[0], cudaMemcpyDeviceToHost));
    for (int r = 0; r < p.rounds; r++) {
        unsigned long long want = (unsigned long long)lengths[(size_t)r] * (unsigned long long)(r % 64 + 1);
        if (got[(size_t)r] != want) {
            if (*mismatches < 5)
                fprintf(stderr, "preload_kernels: %s round %d: S read %llu, expected %llu (%s)\n", what, r,
                        got[(size_t)r], want, why);
            ++*mismatches;
        }
    }
    CK(cudaFree(p.sums));
    g_frees++;
    CK(cudaStreamDestroy(p.s));
    CK(cudaStreamDestroy(p.t));
}

// The cross-stream rounds (see the top of this file).
static void cross_stream_rounds() {
    stream_pair p = stream_pair_open(g_xs_rounds);
    cudaStream_t s = p.s, t = p.t;
    std::vector<float *> freed_on_s; // the X's, for counting T's reuses
    std::vector<size_t> lengths((size_t)g_xs_rounds);
    for (int r = 0; r < g_xs_rounds; r++) {
        size_t n = (rng() % 2 ? 1 : 2) * ((size_t)1 << 20); // 4 or 8 MiB of floats
        lengths[(size_t)r] = n;
        float *x, *tmp, *y;
        CK(cudaMallocAsync(&x, n * sizeof(float), s));
        fill_value<<<1024, 256, 0, s>>>(x, n, (float)(r % 64 + 1));
        // 64 blocks: the GPU keeps room for T's kernel to run while these spin.
        spin_then_sum<<<64, 256, 0, s>>>(x, n, 2000000, p.sums + r);
        CK(cudaGetLastError());
        CK(cudaFreeAsync(x, s));
        CK(cudaMallocAsync(&tmp, 256 << 10, s));
        CK(cudaFreeAsync(tmp, s));
        freed_on_s.push_back(x);
        CK(cudaMallocAsync(&y, n * sizeof(float), t));
        for (size_t k = 0; k < freed_on_s.size(); k++)
            if (overlaps(y, n * sizeof(float), freed_on_s[k], lengths[k] * sizeof(float))) {
                g_xs_reuses++;
                break;
            }
        fill_value<<<1024, 256, 0, t>>>(y, n, -1.0e6f);
        CK(cudaGetLastError());
        CK(cudaFreeAsync(y, t));
        g_async += 3;
        g_frees += 3;
        g_bytes += 2 * n * sizeof(float) + (256 << 10);
    }
    stream_pair_close(p, lengths, &g_xs_mismatches, "cross-stream", "its buffer was overwritten while S still read it");
}

// The hand-over rounds (see the top of this file).
static void handover_rounds() {
    const int R = g_ho_rounds;
    const size_t n = (size_t)1 << 20, bytes = n * sizeof(float), sep_bytes = (size_t)2 << 20;
    stream_pair p = stream_pair_open(R);
    cudaStream_t s = p.s, t = p.t;
    std::vector<float *> a((size_t)R), sep((size_t)R), y((size_t)R);
    std::vector<cudaEvent_t> passed((size_t)R);
    for (int r = 0; r < R; r++) {
        CK(cudaMallocAsync(&a[(size_t)r], bytes, s));
        CK(cudaMallocAsync(&sep[(size_t)r], sep_bytes, s));
        CK(cudaEventCreateWithFlags(&passed[(size_t)r], cudaEventDisableTiming));
        g_async += 2;
        g_bytes += bytes + sep_bytes;
    }
    for (int r = 0; r < R; r++) {
        fill_value<<<1024, 256, 0, s>>>(a[(size_t)r], n, (float)(r % 64 + 1));
        spin_then_sum<<<64, 256, 0, s>>>(a[(size_t)r], n, 2000000, p.sums + r);
        CK(cudaGetLastError());
        CK(cudaFreeAsync(a[(size_t)r], s));
        g_frees++;
        // S has passed round r-1 (its reader, its free, and whatever the allocator recorded on S
        // during T's allocation in that round) and is busy with round r's reader.
        if (r > 0) CK(cudaEventSynchronize(passed[(size_t)r - 1]));
        CK(cudaMallocAsync(&y[(size_t)r], bytes, t));
        g_async++;
        g_bytes += bytes;
        for (int k = 0; k < r; k++)
            if (overlaps(y[(size_t)r], bytes, a[(size_t)k], bytes)) {
                g_ho_reuses++;
                break;
            }
        fill_value<<<1024, 256, 0, t>>>(y[(size_t)r], n, -1.0e6f);
        CK(cudaGetLastError());
        CK(cudaEventRecord(passed[(size_t)r], s));
    }
    for (int r = 0; r < R; r++) {
        CK(cudaFreeAsync(y[(size_t)r], t));
        CK(cudaFreeAsync(sep[(size_t)r], s));
        g_frees += 2;
    }
    stream_pair_close(p, std::vector<size_t>((size_t)R, n), &g_ho_mismatches, "hand-over",
                      "T was given its buffer while S still read it");
    for (int r = 0; r < R; r++) CK(cudaEventDestroy(passed[(size_t)r]));
}

int main(int argc, char **argv) {
    g_rounds = 20;
    g_buffers = 64;
    g_xs_rounds = 200;
    g_ho_rounds = 200;
    double max_mb = 64;
    static const char usage[] =
        "usage: preload_kernels [--rounds N] [--buffers N] [--max-mb MB] [--xs-rounds N] [--handover-rounds N]\n";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%sKernels on memory from cudaMalloc / cudaMallocAsync under LD_PRELOAD (see the top of "
                   "preload_kernels.cu).\n", usage);
            return 0;
        }
    if (argc % 2 == 0) { // an option without its value
        fprintf(stderr, "preload_kernels: %s needs a value\n%s", argv[argc - 1], usage);
        return 2;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) g_rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--buffers")) g_buffers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-mb")) max_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--xs-rounds")) g_xs_rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--handover-rounds")) g_ho_rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "preload_kernels: unknown argument '%s'\n%s", argv[i], usage);
            return 2;
        }
    }
    g_t0 = now_s();
    // First, while the allocator holds no free memory that T could be served from instead.
    if (g_ho_rounds > 0) handover_rounds();
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    unsigned long long *dsum;
    CK(cudaMalloc(&dsum, sizeof *dsum));
    g_mallocs++;
    std::vector<triplet> kept;
    unsigned tag = 0;
    double lo = log(1024.0 / sizeof(float)), hi = log(max_mb * 1048576.0 / sizeof(float));
    for (int r = 0; r < g_rounds; r++) {
        std::vector<triplet> live;
        for (int i = 0; i < g_buffers; i++) {
            triplet t;
            double u = (double)(rng() >> 11) / 9007199254740992.0;
            t.n = (size_t)exp(lo + (hi - lo) * u);
            t.tag = tag++;
            size_t bytes = t.n * sizeof(float);
            CK(cudaMalloc(&t.a, bytes));
            CK(cudaMalloc(&t.b, bytes));
            CK(cudaMallocAsync(&t.c, bytes, st));
            g_mallocs += 2;
            g_async++;
            g_bytes += 3 * bytes;
            unsigned grid = (unsigned)((t.n + 255) / 256 < 4096 ? (t.n + 255) / 256 : 4096);
            fill<<<grid, 256, 0, st>>>(t.a, t.b, t.n, t.tag);
            vadd<<<grid, 256, 0, st>>>(t.a, t.b, t.c, t.n);
            CK(cudaGetLastError());
            live.push_back(t);
        }
        for (auto &t : live) check(t, st, dsum);
        for (auto &t : kept) check(t, st, dsum); // last round's survivors still hold their values
        for (auto &t : kept) release(t, st);
        kept.clear();
        for (size_t i = 0; i < live.size(); i++) {
            if (rng() % 4 == 0) kept.push_back(live[i]);
            else release(live[i], st);
        }
    }
    for (auto &t : kept) {
        check(t, st, dsum);
        release(t, st);
    }
    CK(cudaFree(dsum));
    g_frees++;
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamDestroy(st));
    if (g_xs_rounds > 0) cross_stream_rounds();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    // An allocation no device can serve: its error is also the thread's last error, peeked and
    // then taken once, with or without cualloc (under the shared runtime cualloc answers both).
    void *huge = nullptr;
    cudaError_t oom = cudaMalloc(&huge, (size_t)1 << 50);
    cudaError_t peeked = cudaPeekAtLastError(), taken = cudaGetLastError(), after = cudaGetLastError();
    bool last_error_ok = oom == cudaErrorMemoryAllocation && peeked == oom && taken == oom && after == cudaSuccess;
    if (!last_error_ok)
        fprintf(stderr, "preload_kernels: cudaMalloc(1 PiB) = %s, then peek %s, get %s, get %s\n", cudaGetErrorName(oom),
                cudaGetErrorName(peeked), cudaGetErrorName(taken), cudaGetErrorName(after));
    bool pass = g_mismatches == 0 && g_xs_mismatches == 0 && g_ho_mismatches == 0 && last_error_ok;
    report(pass, pass ? "" : !last_error_ok ? "last error after an OOM" : "mismatches");
    return pass ? 0 : 1;
}
