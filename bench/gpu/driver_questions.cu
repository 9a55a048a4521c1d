// driver_questions.cu — questions about the real CUDA driver that the fake driver and the sim cannot
// answer, for bench/gpu/run.sh driver-questions. An ordinary runtime program (nvcc -cudart shared)
// that includes no cualloc header: run.sh runs each check in a process of its own, without cualloc
// (the baseline: what CUDA itself does) and with LD_PRELOAD=build/src/libcualloc.so.
//
//   driver_questions --check NAME     NAME: capture_vs_misses | capture_vs_misses_thread_local |
//                                     capture_vs_misses_relaxed | capture_vs_misses_own_thread |
//                                     stream_get_ctx_under_capture | legacy_lookup_flags |
//                                     meminfo_counted_once | event_idle_at_once |
//                                     cudafree_blocking_streams | legacy_free_nonblocking |
//                                     device_reset
//
// Prints one line `driver_questions: RESULT {"check": NAME, "pass": true|false|null, ...}` (null:
// the question could not be decided here) and exits 0 once that line is printed, whatever the
// verdict; 2 for a bad argument. A crash or a hang (run.sh's timeout) leaves no RESULT line.
//
// The driver's own functions. libcualloc.so interposes dlsym (src/interpose.c): every dlsym of
// "cuGetProcAddress_v2" (and of the driver names it wraps, cuMemGetInfo_v2 among them) returns
// cualloc's wrapper, whatever the handle. So this program finds libc's dlsym the way cualloc does,
// with dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34") (else the older versions): dlvsym asks for a
// version, and cualloc's dlsym, unversioned in a library that has version records, never matches
// one. Through that dlsym it takes cuGetProcAddress_v2 from dlopen("libcuda.so.1"), and every other
// driver function from that cuGetProcAddress (version 12000, flags 0, as cualloc resolves its own),
// so that no driver call below goes through cualloc. Each check reports the file its
// cuGetProcAddress lies in (dladdr), to show it is the driver's.
#include <cuda.h> // types and constants only: every driver function is looked up, none is linked
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------ JSON output

// One RESULT line, built with jadd (printf-style fragments). 64 KiB holds every check's facts.
static char g_json[65536];
static size_t g_len;
static void jadd(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_json + g_len, sizeof g_json - g_len, fmt, ap);
    va_end(ap);
    if (n > 0) g_len += (size_t)n < sizeof g_json - g_len ? (size_t)n : sizeof g_json - g_len - 1;
}
// A JSON string: quotes and backslashes become apostrophes, control characters spaces (the texts
// are error names and file paths).
static void jstr(const char *s) {
    jadd("\"");
    for (; s && *s; s++) jadd("%c", *s == '"' || *s == '\\' ? '\'' : (unsigned char)*s < 32 ? ' ' : *s);
    jadd("\"");
}
static const char *verdict(int pass) { return pass > 0 ? "true" : pass == 0 ? "false" : "null"; }
static void result_print(const char *check, int pass) {
    printf("driver_questions: RESULT {\"check\":\"%s\",\"pass\":%s%s%s}\n", check, verdict(pass), g_len ? "," : "",
           g_json);
    fflush(stdout);
}

// ------------------------------------------------------------------ the driver, not through cualloc

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
    void *lib;                  // dlopen("libcuda.so.1")
    dlsym_fn real_dlsym;        // libc's
    get_proc_fn get_proc;       // the driver's cuGetProcAddress_v2
    char get_proc_file[512];    // where get_proc lies (dladdr)
    CUresult (*cuInit)(unsigned);
    CUresult (*cuGetErrorName)(CUresult, const char **);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} drv;

static dlsym_fn find_real_dlsym(void) {
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        void *p = dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
        if (p) {
            dlsym_fn f;
            memcpy(&f, &p, sizeof p);
            return f;
        }
    }
    return NULL;
}

static const char *file_of(const void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : "?";
}
static const char *symbol_of(const void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_sname ? info.dli_sname : "?";
}

// A driver function by its unversioned name, from the driver's cuGetProcAddress; NULL if absent.
static void *proc(const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    if (!drv.get_proc || drv.get_proc(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) return NULL;
    return p;
}
#define PROC(field, name) \
    do { \
        void *p_ = proc(name); \
        memcpy(&drv.field, &p_, sizeof p_); \
    } while (0)

// Opens the driver and resolves every function above; false (with why) when the driver or its
// cuGetProcAddress cannot be had.
static bool driver_open(char *why, size_t n) {
    drv.real_dlsym = find_real_dlsym();
    if (!drv.real_dlsym) {
        snprintf(why, n, "no versioned dlsym in the C library");
        return false;
    }
    drv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!drv.lib) {
        snprintf(why, n, "dlopen libcuda.so.1: %s", dlerror());
        return false;
    }
    void *gp = drv.real_dlsym(drv.lib, "cuGetProcAddress_v2");
    if (!gp) {
        snprintf(why, n, "libcuda.so.1 has no cuGetProcAddress_v2");
        return false;
    }
    memcpy(&drv.get_proc, &gp, sizeof gp);
    snprintf(drv.get_proc_file, sizeof drv.get_proc_file, "%s", file_of(gp));
    PROC(cuInit, "cuInit");
    PROC(cuGetErrorName, "cuGetErrorName");
    PROC(cuCtxGetCurrent, "cuCtxGetCurrent");
    PROC(cuCtxSynchronize, "cuCtxSynchronize");
    PROC(cuStreamGetCtx, "cuStreamGetCtx");
    PROC(cuStreamIsCapturing, "cuStreamIsCapturing");
    PROC(cuStreamSynchronize, "cuStreamSynchronize");
    PROC(cuMemGetInfo, "cuMemGetInfo");
    PROC(cuMemAlloc, "cuMemAlloc");
    PROC(cuMemFree, "cuMemFree");
    PROC(cuEventCreate, "cuEventCreate");
    PROC(cuEventRecord, "cuEventRecord");
    PROC(cuEventQuery, "cuEventQuery");
    PROC(cuEventDestroy, "cuEventDestroy");
    PROC(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    PROC(cuMemCreate, "cuMemCreate");
    PROC(cuMemRelease, "cuMemRelease");
    PROC(cuMemAddressReserve, "cuMemAddressReserve");
    PROC(cuMemAddressFree, "cuMemAddressFree");
    PROC(cuMemMap, "cuMemMap");
    PROC(cuMemUnmap, "cuMemUnmap");
    PROC(cuMemSetAccess, "cuMemSetAccess");
    if (!drv.cuInit) {
        snprintf(why, n, "cuGetProcAddress gave no cuInit");
        return false;
    }
    return true;
}

// The name of a driver result ("CUDA_SUCCESS", ...), or its number.
static const char *cu_name(CUresult r) {
    static __thread char buf[32];
    const char *s = NULL;
    if (drv.cuGetErrorName && drv.cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    snprintf(buf, sizeof buf, "CUresult %d", (int)r);
    return buf;
}
static const char *rt_name(cudaError_t e) { return cudaGetErrorName(e); }

// Setup: each call in turn until one fails, whose text and error go into `failed` (empty when all
// succeeded). Used as: SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) && ...
static bool setup_step(char *failed, size_t n, const char *call, cudaError_t e) {
    if (e == cudaSuccess) return true;
    snprintf(failed, n, "%s: %s", call, rt_name(e));
    return false;
}
#define SETUP(failed, call) setup_step(failed, sizeof failed, #call, (call))

// Facts every check reports: whether cualloc is loaded, where the driver's functions came from.
static void common_facts(void) {
    void *gs = dlsym(RTLD_DEFAULT, "cualloc_get_stats");
    jadd("\"cualloc\":%s,\"get_proc_file\":", gs ? "true" : "false");
    jstr(drv.get_proc_file);
}

// ------------------------------------------------------------------ cualloc's statistics

struct stats_mirror { // struct cualloc_stats (include/cualloc.h), as preload_kernels.cu reads it
    size_t requested_bytes, requested_peak, allocated_bytes, allocated_peak, active_bytes, active_peak,
        reserved_bytes, reserved_peak, inactive_split_bytes, inactive_split_peak;
    size_t largest_free_block, capacity_bytes;
    uint64_t num_allocs, num_frees, num_maps, num_unmaps, num_alloc_retries, num_ooms, num_syncs, num_trims;
};

// cualloc's statistics of device 0 when libcualloc.so is loaded (found with dlsym, which cualloc
// answers with the real definition for every name it does not interpose); false otherwise.
static bool cualloc_stats(stats_mirror *s) {
    typedef int (*get_stats_fn)(int, stats_mirror *);
    void *p = dlsym(RTLD_DEFAULT, "cualloc_get_stats");
    get_stats_fn f;
    memcpy(&f, &p, sizeof p);
    memset(s, 0, sizeof *s);
    return f && f(0, s) == 0;
}

// cualloc_trim(0) when loaded: releases every cached chunk (unmaps). False when not loaded.
static bool cualloc_trim0(void) {
    typedef void (*trim_fn)(int);
    void *p = dlsym(RTLD_DEFAULT, "cualloc_trim");
    trim_fn f;
    memcpy(&f, &p, sizeof p);
    if (!f) return false;
    f(0);
    return true;
}

// ------------------------------------------------------------------ kernels

__global__ void set_value(int *p, int v) { *p = v; }

__global__ void fill_pattern(unsigned *x, size_t n, unsigned seed) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        x[j] = (unsigned)j * 2654435761u + seed;
}

static const char *status_name(cudaStreamCaptureStatus s) {
    return s == cudaStreamCaptureStatusNone ? "none" : s == cudaStreamCaptureStatusActive ? "active"
         : s == cudaStreamCaptureStatusInvalidated ? "invalidated" : "?";
}

// ------------------------------------------------------------------ 1. capture_vs_misses

// Thread A captures (global mode, the default) a kernel on a non-blocking stream; between two
// barriers thread B makes one call at a time, and after each A asks its stream's capture status.
// When a step invalidated the capture, A ends it (recording the error) and begins a new one, so
// every step is judged on its own. Phase 1: the runtime calls an application makes, whose sizes
// miss cualloc's cache (each new and larger; under cualloc: maps, event records and queries on
// B's idle non-blocking streams, a trim's unmaps); then A ends the capture, instantiates the graph,
// launches it and checks the value the kernel wrote. Phase 2: the driver calls cualloc makes on a
// miss, one by one, straight to the driver (the same in both processes), and last a control that
// must invalidate (cuCtxSynchronize joins the capture).
//
// pass: no phase-1 step invalidated the capture and it ended, instantiated, launched and wrote its
// value. Without cualloc this is CUDA's own answer for an application's calls; run.sh compares the
// two processes step by step. null when cualloc is loaded but no step reached the driver (no map).
//
// Variants (capture_variant): the capture in thread-local or relaxed mode, B's steps unchanged (by
// CUDA's rules no other thread's call can invalidate those; the variants ask whether anything
// cualloc does can); and "own_thread", where the capturing thread makes the steps itself with its
// mode exchanged to relaxed around each, as PyTorch's allocator makes its cudaMalloc during a
// capture (B then makes none).

enum { N_PHASE1 = 9, N_PHASE2 = 12, N_STEPS = N_PHASE1 + N_PHASE2 };
static const char *const STEP_NAMES[N_STEPS] = {
    "cudaMalloc 4 MiB (kept)",
    "cudaMallocAsync+cudaFreeAsync 8 MiB on stream b1",
    "cudaMallocAsync+cudaFreeAsync 8 MiB on stream b2",
    "cudaFree the 4 MiB",
    "cudaMalloc+cudaFree 64 MiB",
    "cudaMalloc+cudaFree 256 MiB",
    "cualloc_trim(0)",
    "cudaMalloc+cudaFree 24 MiB",
    "cudaMemGetInfo",
    "cuEventRecord on idle stream b1",
    "cuEventQuery",
    "cuStreamSynchronize idle stream b1",
    "cuMemCreate 1 granule",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemAddressFree",
    "cuMemAlloc+cuMemFree 2 MiB",
    "cuCtxSynchronize (control)",
};

struct capture_variant {
    const char *name;
    cudaStreamCaptureMode mode; // A's capture
    bool own_thread;            // A makes the steps (in relaxed mode), not B
};
static const capture_variant CAPTURE_VARIANTS[] = {
    {"capture_vs_misses", cudaStreamCaptureModeGlobal, false},
    {"capture_vs_misses_thread_local", cudaStreamCaptureModeThreadLocal, false},
    {"capture_vs_misses_relaxed", cudaStreamCaptureModeRelaxed, false},
    {"capture_vs_misses_own_thread", cudaStreamCaptureModeGlobal, true},
};
enum { N_CAPTURE_VARIANTS = sizeof CAPTURE_VARIANTS / sizeof CAPTURE_VARIANTS[0] };

static const char *capture_mode_name(cudaStreamCaptureMode m) {
    return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread_local"
         : m == cudaStreamCaptureModeRelaxed ? "relaxed" : "?";
}

struct capture_state {
    const capture_variant *variant;
    pthread_barrier_t barrier;
    cudaStream_t a, b1, b2;
    int *out;                         // the captured kernel's target
    char error[N_STEPS][64];          // B's error per step ("-" when the step was not made)
    cudaStreamCaptureStatus after[N_STEPS]; // A's stream after the step
    char restart[N_STEPS][160];       // A's cudaStreamEndCapture of a lost capture and its new begin, "" if none
    // B's state between steps
    void *p4;
    CUevent ev;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t gran;
    // A's ends
    char begin[64], end[64], instantiate[64], graph_launch[64], sync[64], begin2[64], end2[64], a_last[64];
    int value;
};

// The first error of a runtime step of several calls.
static cudaError_t first_err(cudaError_t a, cudaError_t b) { return a != cudaSuccess ? a : b; }

// A driver function that this driver may lack: CUDA_ERROR_NOT_FOUND then, not a crash.
#define CALL(f, ...) (drv.f ? drv.f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

// B's step k; its error's name into st->error[k].
static void b_step(capture_state *st, int k) {
    const size_t MiB = (size_t)1 << 20;
    const char *e = "-";
    void *p = NULL;
    cudaError_t r = cudaSuccess;
    CUresult c = CUDA_SUCCESS;
    bool runtime = k < N_PHASE1;
    switch (k) {
    case 0: r = cudaMalloc(&st->p4, 4 * MiB); break;
    case 1:
        r = cudaMallocAsync(&p, 8 * MiB, st->b1);
        if (r == cudaSuccess) r = cudaFreeAsync(p, st->b1);
        break;
    case 2:
        r = cudaMallocAsync(&p, 8 * MiB, st->b2);
        if (r == cudaSuccess) r = cudaFreeAsync(p, st->b2);
        break;
    case 3: r = st->p4 ? cudaFree(st->p4) : cudaErrorInvalidValue; break;
    case 4:
    case 5:
    case 7:
        r = cudaMalloc(&p, (k == 4 ? 64 : k == 5 ? 256 : 24) * MiB);
        if (r == cudaSuccess) r = cudaFree(p);
        break;
    case 6:
        if (!cualloc_trim0()) e = "not loaded";
        else r = cudaSuccess;
        break;
    case 8: {
        size_t f = 0, t = 0;
        r = cudaMemGetInfo(&f, &t);
        break;
    }
    case 9: c = CALL(cuEventRecord, st->ev, (CUstream)st->b1); break;
    case 10: c = CALL(cuEventQuery, st->ev); break;
    case 11: c = CALL(cuStreamSynchronize, (CUstream)st->b1); break;
    case 12: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        c = CALL(cuMemGetAllocationGranularity, &st->gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (c == CUDA_SUCCESS) c = CALL(cuMemCreate, &st->handle, st->gran, &prop, 0);
        break;
    }
    case 13: c = CALL(cuMemAddressReserve, &st->va, st->gran, 0, 0, 0); break;
    case 14: c = CALL(cuMemMap, st->va, st->gran, 0, st->handle, 0); break;
    case 15: {
        CUmemAccessDesc d;
        memset(&d, 0, sizeof d);
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = 0;
        d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        c = CALL(cuMemSetAccess, st->va, st->gran, &d, 1);
        break;
    }
    case 16: c = CALL(cuMemUnmap, st->va, st->gran); break;
    case 17: c = CALL(cuMemRelease, st->handle); break;
    case 18: c = CALL(cuMemAddressFree, st->va, st->gran); break;
    case 19: {
        CUdeviceptr d = 0;
        c = CALL(cuMemAlloc, &d, 2 * MiB);
        if (c == CUDA_SUCCESS) c = CALL(cuMemFree, d);
        break;
    }
    case 20: c = drv.cuCtxSynchronize ? drv.cuCtxSynchronize() : CUDA_ERROR_NOT_FOUND; break;
    }
    if (strcmp(e, "-") == 0) e = runtime ? rt_name(r) : cu_name(c);
    if (runtime) cudaGetLastError(); // B's own last error must not leak into its next step
    snprintf(st->error[k], sizeof st->error[k], "%s", e);
}

// A: begins a capture on stream a and captures the kernel into it.
static void a_begin(capture_state *st, char *err, size_t n) {
    cudaError_t r = cudaStreamBeginCapture(st->a, st->variant->mode);
    if (r == cudaSuccess) {
        set_value<<<1, 1, 0, st->a>>>(st->out, 1234);
        r = cudaGetLastError();
    }
    snprintf(err, n, "%s", rt_name(r));
}

// A: after step k, the capture's status; an invalidated capture is ended and begun again.
static void a_after(capture_state *st, int k) {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st->a, &s) != cudaSuccess) s = cudaStreamCaptureStatusNone;
    st->after[k] = s;
    st->restart[k][0] = 0;
    // Progress on stderr: where a hang stopped, should the process be killed by its timeout.
    fprintf(stderr, "driver_questions: step %d (%s): %s; capture %s\n", k, STEP_NAMES[k], st->error[k], status_name(s));
    if (s != cudaStreamCaptureStatusActive) {
        cudaGraph_t g = NULL;
        cudaError_t r = cudaStreamEndCapture(st->a, &g);
        if (g) cudaGraphDestroy(g);
        cudaError_t last = cudaGetLastError();
        char again[64];
        a_begin(st, again, sizeof again);
        snprintf(st->restart[k], sizeof st->restart[k], "%s (last error %s); begun again: %s", rt_name(r),
                 rt_name(last), again);
    }
}

// Both threads make the device's primary context current (cudaSetDevice, cudaFree(0)) before the
// first barrier, so that nothing in the steps is a thread's first use of the runtime.
static void *thread_a(void *arg) {
    capture_state *st = (capture_state *)arg;
    cudaSetDevice(0);
    cudaFree(0);
    pthread_barrier_wait(&st->barrier); // both threads have the device
    a_begin(st, st->begin, sizeof st->begin);
    pthread_barrier_wait(&st->barrier); // the capture is under way
    for (int k = 0; k < N_STEPS; k++) {
        pthread_barrier_wait(&st->barrier); // B made step k (or, own_thread, made none)
        if (st->variant->own_thread) {
            cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
            cudaThreadExchangeStreamCaptureMode(&m);
            b_step(st, k);
            cudaThreadExchangeStreamCaptureMode(&m);
        }
        a_after(st, k);
        if (k == N_PHASE1 - 1) { // the end of phase 1: the capture must end, instantiate and run
            cudaGraph_t g = NULL;
            cudaGraphExec_t x = NULL;
            cudaError_t r = cudaStreamEndCapture(st->a, &g);
            snprintf(st->end, sizeof st->end, "%s", rt_name(r));
            r = r == cudaSuccess ? cudaGraphInstantiate(&x, g, 0) : cudaErrorUnknown;
            snprintf(st->instantiate, sizeof st->instantiate, "%s", x ? rt_name(r) : "-");
            if (x) {
                r = cudaGraphLaunch(x, st->a);
                snprintf(st->graph_launch, sizeof st->graph_launch, "%s", rt_name(r));
                r = cudaStreamSynchronize(st->a);
                snprintf(st->sync, sizeof st->sync, "%s", rt_name(r));
                if (cudaMemcpy(&st->value, st->out, sizeof st->value, cudaMemcpyDeviceToHost) != cudaSuccess)
                    st->value = -1;
                cudaGraphExecDestroy(x);
            }
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            a_begin(st, st->begin2, sizeof st->begin2); // phase 2 runs under a capture too
        }
        pthread_barrier_wait(&st->barrier); // A has looked
    }
    cudaGraph_t g = NULL;
    cudaError_t r = cudaStreamEndCapture(st->a, &g);
    snprintf(st->end2, sizeof st->end2, "%s", rt_name(r));
    if (g) cudaGraphDestroy(g);
    snprintf(st->a_last, sizeof st->a_last, "%s", rt_name(cudaGetLastError()));
    return NULL;
}

static void *thread_b(void *arg) {
    capture_state *st = (capture_state *)arg;
    cudaSetDevice(0);
    cudaFree(0);
    pthread_barrier_wait(&st->barrier);
    pthread_barrier_wait(&st->barrier);
    for (int k = 0; k < N_STEPS; k++) {
        if (!st->variant->own_thread) b_step(st, k);
        pthread_barrier_wait(&st->barrier);
        pthread_barrier_wait(&st->barrier);
    }
    return NULL;
}

static int check_capture_vs_misses(const capture_variant *variant) {
    static capture_state st; // large; zeroed
    st.variant = variant;
    char failed[160] = "";
    if (SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) &&
        SETUP(failed, cudaStreamCreateWithFlags(&st.a, cudaStreamNonBlocking)) &&
        SETUP(failed, cudaStreamCreateWithFlags(&st.b1, cudaStreamNonBlocking)) &&
        SETUP(failed, cudaStreamCreateWithFlags(&st.b2, cudaStreamNonBlocking)) &&
        SETUP(failed, cudaMalloc(&st.out, sizeof(int))) && SETUP(failed, cudaMemset(st.out, 0, sizeof(int))) &&
        SETUP(failed, cudaDeviceSynchronize()) &&
        (!drv.cuEventCreate || drv.cuEventCreate(&st.ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS))
        snprintf(failed, sizeof failed, "cuEventCreate failed");
    common_facts();
    jadd(",\"capture_mode\":\"%s\",\"steps_by\":\"%s\"", capture_mode_name(variant->mode),
         variant->own_thread ? "the capturing thread, in relaxed mode" : "another thread, in global mode");
    if (*failed) {
        jadd(",\"error\":");
        jstr(failed);
        result_print(variant->name, -1);
        return 0;
    }
    stats_mirror s0, s1;
    bool loaded = cualloc_stats(&s0);
    pthread_barrier_init(&st.barrier, NULL, 2);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, thread_a, &st);
    pthread_create(&tb, NULL, thread_b, &st);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cualloc_stats(&s1);
    int invalidated1 = 0, first = -1;
    for (int k = 0; k < N_PHASE1; k++)
        if (st.after[k] != cudaStreamCaptureStatusActive) {
            invalidated1++;
            if (first < 0) first = k;
        }
    bool ran = strcmp(st.begin, "cudaSuccess") == 0 && strcmp(st.end, "cudaSuccess") == 0 &&
               strcmp(st.instantiate, "cudaSuccess") == 0 && strcmp(st.graph_launch, "cudaSuccess") == 0 &&
               strcmp(st.sync, "cudaSuccess") == 0 && st.value == 1234;
    int pass = invalidated1 == 0 && ran;
    if (loaded && s1.num_maps == s0.num_maps) pass = -1; // no step reached the driver: nothing was asked
    jadd(",\"begin\":\"%s\",\"end\":\"%s\",\"instantiate\":\"%s\",\"graph_launch\":\"%s\",\"sync\":\"%s\","
         "\"value\":%d,\"phase1_invalidations\":%d,\"first_invalidating_step\":",
         st.begin, st.end, st.instantiate, st.graph_launch[0] ? st.graph_launch : "-", st.sync[0] ? st.sync : "-",
         st.value, invalidated1);
    if (first >= 0) jstr(STEP_NAMES[first]);
    else jadd("null");
    jadd(",\"begin_phase2\":\"%s\",\"end_phase2\":\"%s\",\"a_last_error\":\"%s\",\"steps\":[", st.begin2, st.end2,
         st.a_last);
    for (int k = 0; k < N_STEPS; k++) {
        jadd("%s{\"phase\":%d,\"op\":", k ? "," : "", k < N_PHASE1 ? 1 : 2);
        jstr(STEP_NAMES[k]);
        jadd(",\"error\":\"%s\",\"capture_after\":\"%s\"", st.error[k], status_name(st.after[k]));
        if (st.restart[k][0]) jadd(",\"restart\":\"%s\"", st.restart[k]);
        jadd("}");
    }
    jadd("]");
    if (loaded)
        jadd(",\"cualloc_maps\":%llu,\"cualloc_unmaps\":%llu,\"cualloc_syncs\":%llu,\"cualloc_allocs\":%llu",
             (unsigned long long)(s1.num_maps - s0.num_maps), (unsigned long long)(s1.num_unmaps - s0.num_unmaps),
             (unsigned long long)(s1.num_syncs - s0.num_syncs), (unsigned long long)(s1.num_allocs - s0.num_allocs));
    result_print(variant->name, pass);
    return 0;
}

// ------------------------------------------------------------------ 2. stream_get_ctx_under_capture

// cualloc asks cuStreamGetCtx for the device of a stream-ordered allocation, also on a capturing
// stream (where the allocation then passes through to CUDA as a graph node). pass: it answers
// CUDA_SUCCESS and the stream's context (the current one: the stream was made in it), the capture
// is still active afterwards, and it ends with success.
static int check_stream_get_ctx_under_capture(void) {
    cudaStream_t s = NULL;
    int *out = NULL;
    char failed[160] = "";
    common_facts();
    if (!drv.cuStreamGetCtx || !drv.cuStreamIsCapturing || !drv.cuCtxGetCurrent) {
        jadd(",\"error\":\"the driver lacks cuStreamGetCtx, cuStreamIsCapturing or cuCtxGetCurrent\"");
        result_print("stream_get_ctx_under_capture", -1);
        return 0;
    }
    if (!(SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) &&
          SETUP(failed, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) &&
          SETUP(failed, cudaMalloc(&out, sizeof(int))))) {
        jadd(",\"error\":");
        jstr(failed);
        result_print("stream_get_ctx_under_capture", -1);
        return 0;
    }
    CUcontext cur = NULL, got = NULL;
    drv.cuCtxGetCurrent(&cur);
    cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    set_value<<<1, 1, 0, s>>>(out, 7);
    cudaError_t l = cudaGetLastError();
    CUstreamCaptureStatus before = CU_STREAM_CAPTURE_STATUS_NONE, after = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult q0 = drv.cuStreamIsCapturing((CUstream)s, &before);
    CUresult r = drv.cuStreamGetCtx((CUstream)s, &got);
    CUresult q1 = drv.cuStreamIsCapturing((CUstream)s, &after);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    int pass = b == cudaSuccess && l == cudaSuccess && q0 == CUDA_SUCCESS && before == CU_STREAM_CAPTURE_STATUS_ACTIVE
        ? (r == CUDA_SUCCESS && got == cur && got != NULL && q1 == CUDA_SUCCESS &&
           after == CU_STREAM_CAPTURE_STATUS_ACTIVE && e == cudaSuccess)
        : -1; // the capture never started: nothing was asked
    jadd(",\"begin\":\"%s\",\"launch\":\"%s\",\"capturing_before\":\"%s/%d\",\"get_ctx\":\"%s\",\"ctx_is_current\":%s,"
         "\"ctx_null\":%s,\"capturing_after\":\"%s/%d\",\"end\":\"%s\"",
         rt_name(b), rt_name(l), cu_name(q0), (int)before, cu_name(r), got == cur ? "true" : "false",
         got ? "false" : "true", cu_name(q1), (int)after, rt_name(e));
    result_print("stream_get_ctx_under_capture", pass);
    return 0;
}

// ------------------------------------------------------------------ 3. legacy_lookup_flags

// The heap takes NULL for the legacy stream, trusting that the runtime's cuEventRecord and friends,
// looked up with flags 0, are the legacy-stream variants. pass: the driver's cuGetProcAddress
// ("cuEventRecord", 12000) answers flags 0 with the same pointer as flags
// CU_GET_PROC_ADDRESS_LEGACY_STREAM (1). Flags CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2)
// is reported beside them. Only the driver: runs against the fake driver too. Under cualloc, what
// cualloc's own cuGetProcAddress (dlsym's answer) gives is reported as well.
static int check_legacy_lookup_flags(void) {
    CUresult ri = drv.cuInit(0);
    void *p[3] = {NULL, NULL, NULL};
    CUdriverProcAddressQueryResult status[3];
    CUresult r[3];
    const cuuint64_t flags[3] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
    for (int i = 0; i < 3; i++) r[i] = drv.get_proc("cuEventRecord", &p[i], 12000, flags[i], &status[i]);
    common_facts();
    jadd(",\"cuInit\":\"%s\"", cu_name(ri));
    for (int i = 0; i < 3; i++) {
        jadd(",\"flags%d\":{\"result\":\"%s\",\"status\":%d,\"pointer\":\"%p\",\"symbol\":", (int)flags[i],
             cu_name(r[i]), (int)status[i], p[i]);
        jstr(symbol_of(p[i]));
        jadd("}");
    }
    // What a dlsym of cuGetProcAddress_v2 gives this process: cualloc's wrapper under the preload.
    void *w = dlsym(drv.lib, "cuGetProcAddress_v2");
    jadd(",\"dlsym_get_proc_is_driver\":%s", w == (void *)drv.get_proc ? "true" : "false");
    if (w && w != (void *)drv.get_proc) {
        get_proc_fn wf;
        memcpy(&wf, &w, sizeof w);
        void *q[2] = {NULL, NULL};
        CUdriverProcAddressQueryResult qs;
        wf("cuEventRecord", &q[0], 12000, 0, &qs);
        wf("cuEventRecord", &q[1], 12000, 1, &qs);
        jadd(",\"through_cualloc\":{\"flags0\":\"%p\",\"flags1\":\"%p\",\"same_as_driver\":%s}", q[0], q[1],
             q[0] == p[0] && q[1] == p[1] ? "true" : "false");
    }
    int pass = ri == CUDA_SUCCESS && r[0] == CUDA_SUCCESS && r[1] == CUDA_SUCCESS && p[0] && p[1] ? p[0] == p[1] : -1;
    result_print("legacy_lookup_flags", pass);
    return 0;
}

// ------------------------------------------------------------------ 4. meminfo_counted_once

// Under cualloc, cudaMemGetInfo's free figure is meant to be the driver's free memory plus
// cualloc's cached bytes (reserved - allocated) once; the shared runtime asks the driver through
// cualloc's cuMemGetInfo, which must not add them a second time. 64 MiB is allocated and freed
// (cualloc keeps it), then cudaMemGetInfo is compared with the driver's own cuMemGetInfo (not
// through cualloc) plus the cached bytes. pass: within 2 MiB (other processes' activity). Without
// cualloc nothing is cached: the two must agree within 2 MiB.
static int check_meminfo_counted_once(void) {
    const long long MiB = 1 << 20;
    void *p = NULL;
    char failed[160] = "";
    common_facts();
    if (!drv.cuMemGetInfo) snprintf(failed, sizeof failed, "the driver has no cuMemGetInfo");
    if (*failed || !(SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) &&
                     SETUP(failed, cudaMalloc(&p, 64 * MiB)) && SETUP(failed, cudaFree(p)) &&
                     SETUP(failed, cudaDeviceSynchronize()))) {
        jadd(",\"error\":");
        jstr(failed);
        result_print("meminfo_counted_once", -1);
        return 0;
    }
    stats_mirror s;
    bool loaded = cualloc_stats(&s);
    size_t rf = 0, rt = 0, df = 0, dt = 0;
    cudaError_t e = cudaMemGetInfo(&rf, &rt);
    CUresult c = drv.cuMemGetInfo(&df, &dt);
    long long cached = loaded ? (long long)s.reserved_bytes - (long long)s.allocated_bytes : 0;
    long long want = (long long)df + cached;
    if (want > (long long)dt) want = (long long)dt; // cualloc caps the sum at the total
    long long diff = (long long)rf - want;
    int pass = e == cudaSuccess && c == CUDA_SUCCESS ? (diff >= -2 * MiB && diff <= 2 * MiB) : -1;
    if (loaded && cached < 32 * MiB) pass = -1; // cualloc did not keep the 64 MiB: nothing to count
    jadd(",\"cudaMemGetInfo\":\"%s\",\"cuMemGetInfo\":\"%s\",\"runtime_free\":%zu,\"runtime_total\":%zu,"
         "\"driver_free\":%zu,\"driver_total\":%zu,\"cualloc_reserved\":%zu,\"cualloc_allocated\":%zu,"
         "\"cached\":%lld,\"expected_free\":%lld,\"diff\":%lld,\"counted_twice_diff\":%lld",
         rt_name(e), cu_name(c), rf, rt, df, dt, s.reserved_bytes, s.allocated_bytes, cached, want, diff,
         (long long)rf - ((long long)df + 2 * cached));
    result_print("meminfo_counted_once", pass);
    return 0;
}

// ------------------------------------------------------------------ 5. event_idle_at_once

__global__ void spin_kernel(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// cualloc lets one stream take another's freed memory without waiting when an event it records on
// the freeing stream is complete at the first query (src/heap.c: stream_idle_now, which hands an
// idle stream's parked blocks over whole, and stream_settle_completed's "the stream was idle"):
// the sim completes such an event at once; does the driver? Asked EVENT_IDLE_N times on an idle
// non-blocking stream: cudaEventRecord, then cudaEventQuery at once, and again until complete (the
// polls it took). Then the control: the same after a kernel of about 20 us on the stream, where
// the first query must say not ready. pass: at least 90% of the idle records complete at the
// first query, and at most 10% of the busy ones.
enum { EVENT_IDLE_N = 1000, EVENT_BUSY_N = 100 };
static int check_event_idle_at_once(void) {
    cudaStream_t st = NULL;
    cudaEvent_t ev = NULL;
    char failed[160] = "";
    common_facts();
    if (!(SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) &&
          SETUP(failed, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) &&
          SETUP(failed, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)))) {
        jadd(",\"error\":");
        jstr(failed);
        result_print("event_idle_at_once", -1);
        return 0;
    }
    int idle_at_once = 0, idle_done = 0, busy_at_once = 0, busy_done = 0;
    long long polls_total = 0, polls_max = 0;
    cudaError_t bad = cudaSuccess;
    for (int i = 0; i < EVENT_IDLE_N && bad == cudaSuccess; i++) {
        cudaError_t r = cudaEventRecord(ev, st), q = cudaErrorNotReady;
        long long polls = 0;
        while (r == cudaSuccess && (q = cudaEventQuery(ev)) == cudaErrorNotReady) polls++;
        bad = r != cudaSuccess ? r : q;
        if (bad != cudaSuccess) break;
        idle_done++;
        if (polls == 0) idle_at_once++;
        polls_total += polls;
        if (polls > polls_max) polls_max = polls;
    }
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)(khz > 0 ? khz : 1500000) * 20 / 1000; // about 20 us
    for (int i = 0; i < EVENT_BUSY_N && bad == cudaSuccess; i++) {
        spin_kernel<<<1, 1, 0, st>>>(cycles);
        cudaError_t r = first_err(cudaGetLastError(), cudaEventRecord(ev, st)), q = cudaErrorNotReady;
        if (r == cudaSuccess) q = cudaEventQuery(ev);
        bad = r != cudaSuccess ? r : (q == cudaErrorNotReady ? cudaSuccess : q);
        if (q == cudaSuccess) busy_at_once++;
        bad = first_err(bad, cudaStreamSynchronize(st));
        if (bad == cudaSuccess) busy_done++;
    }
    cudaEventDestroy(ev);
    cudaStreamDestroy(st);
    int pass = bad != cudaSuccess ? -1 : idle_at_once * 10 >= EVENT_IDLE_N * 9 && busy_at_once * 10 <= EVENT_BUSY_N;
    jadd(",\"idle_records\":%d,\"idle_complete_at_once\":%d,\"idle_polls_mean\":%.2f,\"idle_polls_max\":%lld,"
         "\"busy_records\":%d,\"busy_complete_at_once\":%d,\"kernel_cycles\":%lld,\"error\":\"%s\"",
         idle_done, idle_at_once, idle_done ? (double)polls_total / idle_done : 0.0, polls_max, busy_done, busy_at_once,
         cycles, bad == cudaSuccess ? "" : rt_name(bad));
    result_print("event_idle_at_once", pass);
    return 0;
}

// ------------------------------------------------------------------ 6. cudafree_blocking_streams, legacy_free_nonblocking

// A kernel that waits about `cycles` and then copies src to dst: it reads src late.
__global__ void late_copy(const unsigned *src, unsigned *dst, size_t n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        dst[j] = src[j];
}

// A buffer read late on one stream, freed at once and allocated again for a kernel on another
// stream that overwrites it: the late reader's copy must hold the old contents. `legacy_free`
// false (cudafree_blocking_streams): the reader is blocking stream A, the free is cudaFree, and the
// writer is another blocking stream B. The legacy stream orders A and B each against itself, not
// against each other: CUDA's cudaFree synchronizes, so A's kernel has read X before B's runs;
// cualloc must not hand X out again while A may still read it (it waits for an event on the legacy
// stream, which follows every blocking stream's earlier work). `legacy_free` true
// (legacy_free_nonblocking): the reader is the legacy stream, the free is cudaFreeAsync(X, 0), and
// the writer is a non-blocking stream, which does not wait for the legacy stream: cudaMalloc's
// block must not be one the legacy stream's work still reads (cualloc: the key of device-wide
// allocations in VMM mode; with classic segments, the free made device-wide). pass: the reader's
// copy holds X's contents, ROUNDS times; the facts say whether the address came back.
enum { LATE_READ_ROUNDS = 5 };
static int late_read_rounds(const char *check, bool legacy_free) {
    const size_t bytes = (size_t)16 << 20, n = bytes / sizeof(unsigned);
    cudaStream_t a = NULL, b = NULL;
    unsigned *out = NULL, *host = (unsigned *)malloc(bytes);
    char failed[160] = "";
    common_facts();
    if (!(host && SETUP(failed, cudaSetDevice(0)) && SETUP(failed, cudaFree(0)) &&
          (legacy_free || SETUP(failed, cudaStreamCreate(&a))) &&
          SETUP(failed, cudaStreamCreateWithFlags(&b, legacy_free ? cudaStreamNonBlocking : cudaStreamDefault)) &&
          SETUP(failed, cudaMalloc(&out, bytes)))) {
        jadd(",\"error\":");
        jstr(host ? failed : "host memory");
        result_print(check, -1);
        free(host);
        return 0;
    }
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)(khz > 0 ? khz : 1500000) * 50; // about 50 ms
    int intact = 0, same_address = 0;
    size_t wrong_max = 0;
    cudaError_t bad = cudaSuccess;
    for (int round = 0; round < LATE_READ_ROUNDS && bad == cudaSuccess; round++) {
        unsigned *x = NULL, *y = NULL, seed = 100u + (unsigned)round;
        bad = cudaMalloc(&x, bytes);
        if (bad != cudaSuccess) break;
        fill_pattern<<<256, 256>>>(x, n, seed);
        bad = first_err(cudaGetLastError(), cudaDeviceSynchronize());
        if (bad != cudaSuccess) break;
        late_copy<<<256, 256, 0, a>>>(x, out, n, cycles); // a: NULL (the legacy stream) when legacy_free
        bad = first_err(cudaGetLastError(), legacy_free ? cudaFreeAsync(x, 0) : cudaFree(x));
        if (bad == cudaSuccess) bad = cudaMalloc(&y, bytes);
        if (bad != cudaSuccess) break;
        if (y == x) same_address++;
        fill_pattern<<<256, 256, 0, b>>>(y, n, 0xdead0000u + (unsigned)round);
        bad = first_err(cudaGetLastError(), cudaDeviceSynchronize());
        if (bad == cudaSuccess) bad = cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost);
        if (bad != cudaSuccess) break;
        size_t wrong = 0;
        for (size_t j = 0; j < n; j++)
            if (host[j] != (unsigned)j * 2654435761u + seed) wrong++;
        if (wrong == 0) intact++;
        if (wrong > wrong_max) wrong_max = wrong;
        bad = cudaFree(y);
    }
    cudaFree(out);
    if (a) cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    free(host);
    int pass = bad != cudaSuccess ? -1 : intact == LATE_READ_ROUNDS;
    jadd(",\"rounds\":%d,\"intact\":%d,\"same_address\":%d,\"words_wrong_max\":%zu,\"kernel_cycles\":%lld,"
         "\"error\":\"%s\"",
         LATE_READ_ROUNDS, intact, same_address, wrong_max, cycles, bad == cudaSuccess ? "" : rt_name(bad));
    result_print(check, pass);
    return 0;
}

static int check_cudafree_blocking_streams(void) { return late_read_rounds("cudafree_blocking_streams", false); }
static int check_legacy_free_nonblocking(void) { return late_read_rounds("legacy_free_nonblocking", true); }

// ------------------------------------------------------------------ 7. device_reset

// One allocation after cudaDeviceReset, written by a kernel and read back. Under cualloc the heap
// holds chunks (and, in VMM mode, an address range and handles) made in the context the reset
// destroyed; an allocation served from them would fault. Two sizes: one cualloc has cached (1 MiB,
// as before the reset) and one it has not (96 MiB: a new map). pass: every call succeeds and both
// read back what the kernel wrote.
static bool write_read(size_t bytes, unsigned seed, char *err, size_t n, void **where) {
    unsigned *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes);
    *where = d;
    if (e != cudaSuccess) {
        snprintf(err, n, "cudaMalloc: %s", rt_name(e));
        return false;
    }
    size_t count = bytes / sizeof(unsigned);
    fill_pattern<<<256, 256>>>(d, count, seed);
    e = first_err(cudaGetLastError(), cudaDeviceSynchronize());
    if (e != cudaSuccess) {
        snprintf(err, n, "kernel: %s", rt_name(e));
        return false;
    }
    unsigned *h = (unsigned *)malloc(bytes);
    e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t j = 0; e == cudaSuccess && j < count; j++)
        if (h[j] != (unsigned)j * 2654435761u + seed) bad++;
    free(h);
    if (e != cudaSuccess) {
        snprintf(err, n, "cudaMemcpy: %s", rt_name(e));
        return false;
    }
    e = cudaFree(d);
    if (bad || e != cudaSuccess) {
        snprintf(err, n, "%zu words wrong; cudaFree: %s", bad, rt_name(e));
        return false;
    }
    snprintf(err, n, "cudaSuccess");
    return true;
}

static int check_device_reset(void) {
    const size_t MiB = (size_t)1 << 20;
    char before[128], small[128], big[128];
    void *p_before = NULL, *p_small = NULL, *p_big = NULL;
    common_facts();
    cudaSetDevice(0);
    bool ok0 = write_read(MiB, 1, before, sizeof before, &p_before);
    stats_mirror s0, s1;
    bool loaded = cualloc_stats(&s0);
    cudaError_t reset = cudaDeviceReset();
    cudaError_t set = cudaSetDevice(0);
    bool ok1 = write_read(MiB, 2, small, sizeof small, &p_small);
    bool ok2 = ok1 && write_read(96 * MiB, 3, big, sizeof big, &p_big);
    if (!ok1) snprintf(big, sizeof big, "-");
    cudaError_t last = cudaGetLastError();
    cualloc_stats(&s1);
    int pass = !ok0 ? -1 : ok1 && ok2 && reset == cudaSuccess && set == cudaSuccess;
    jadd(",\"before_reset\":\"%s\",\"reset\":\"%s\",\"set_device\":\"%s\",\"after_1MiB\":\"%s\",\"after_96MiB\":\"%s\","
         "\"same_address_as_before\":%s,\"last_error\":\"%s\"",
         before, rt_name(reset), rt_name(set), small, big, p_small && p_small == p_before ? "true" : "false",
         rt_name(last));
    if (loaded)
        jadd(",\"cualloc_reserved_before\":%zu,\"cualloc_reserved_after\":%zu,\"cualloc_maps_after_reset\":%llu",
             s0.reserved_bytes, s1.reserved_bytes, (unsigned long long)(s1.num_maps - s0.num_maps));
    result_print("device_reset", pass);
    return 0;
}

// ------------------------------------------------------------------ main

static const char *const CHECK_NAMES[] = {"stream_get_ctx_under_capture", "legacy_lookup_flags", "meminfo_counted_once",
                                          "event_idle_at_once", "cudafree_blocking_streams", "legacy_free_nonblocking",
                                          "device_reset"};
enum { N_CHECK_NAMES = sizeof CHECK_NAMES / sizeof CHECK_NAMES[0] };

// The usage line and every check's name (the capture variants first).
static void print_usage(FILE *out) {
    fprintf(out, "usage: driver_questions --check NAME\nNAME:");
    for (int i = 0; i < N_CAPTURE_VARIANTS; i++) fprintf(out, " %s", CAPTURE_VARIANTS[i].name);
    for (int i = 0; i < N_CHECK_NAMES; i++) fprintf(out, " %s", CHECK_NAMES[i]);
    fprintf(out, "\n");
}

int main(int argc, char **argv) {
    int (*const fns[N_CHECK_NAMES])(void) = {check_stream_get_ctx_under_capture, check_legacy_lookup_flags,
                                             check_meminfo_counted_once, check_event_idle_at_once,
                                             check_cudafree_blocking_streams, check_legacy_free_nonblocking,
                                             check_device_reset};
    const char *name = NULL;
    int which = -1;
    const capture_variant *variant = NULL;
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        print_usage(stdout);
        printf("Questions about the real CUDA driver (see the top of driver_questions.cu).\n");
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--check") == 0) {
        for (int i = 0; i < N_CHECK_NAMES; i++)
            if (strcmp(argv[2], CHECK_NAMES[i]) == 0) which = i, name = CHECK_NAMES[i];
        for (int i = 0; i < N_CAPTURE_VARIANTS; i++)
            if (strcmp(argv[2], CAPTURE_VARIANTS[i].name) == 0) variant = &CAPTURE_VARIANTS[i], name = variant->name;
    }
    if (!name) {
        print_usage(stderr);
        return 2;
    }
    char why[256];
    if (!driver_open(why, sizeof why)) {
        common_facts();
        jadd(",\"error\":");
        jstr(why);
        result_print(name, -1);
        return 0;
    }
    return variant ? check_capture_vs_misses(variant) : fns[which]();
}
