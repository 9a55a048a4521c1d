/* test_driver_cuda.c — driver_cuda_ops (src/driver_cuda.c) run against the fake libcuda.so.1
 * (tests/fakecuda, found through LD_LIBRARY_PATH, host-backed via CUALLOC_CONF): every op, errors
 * passed through, the caller's context restored. With the argument `missing` (LD_LIBRARY_PATH with
 * no libcuda.so.1): init fails cleanly, with an error code and a message naming the library. It
 * does not test the sim's rules (test_sim.c). */
#include <dlfcn.h>
#include <stdint.h>

#include "internal.h"
#include "testutil.h"

#define G (2 * MiB)

static const driver_ops_t *const ops = &driver_cuda_ops;

#define EXPECT_R(call, want)                                                                  \
    do {                                                                                      \
        cua_result r_ = (call);                                                               \
        EXPECT(r_ == (want), "%s returned %s (%d), expected %s (%d)", #call, driver_error_name(r_), r_, \
               driver_error_name(want), (int)(want));                                         \
    } while (0)

/* The fake's helpers and the few CUDA entry points the test calls itself. */
static struct {
    uint64_t (*calls)(int op);
    size_t (*used_bytes)(int dev);
    size_t (*live_handles)(int dev);
    size_t (*live_mappings)(int dev);
    void (*fail)(int op, unsigned after, unsigned count, int err);
    cua_stream (*stream_create)(int dev, int held);
    int (*ctx_depth)(void);
    unsigned (*ctx_retains)(int dev);
    cua_result (*ctx_get_current)(cua_ctx *ctx);
    cua_pfn_cuCtxPushCurrent_v2 ctx_push;
    cua_pfn_cuCtxPopCurrent_v2 ctx_pop;
    cua_pfn_cuDevicePrimaryCtxRetain ctx_retain;
    cua_pfn_cuGetProcAddress_v2 get_proc;
    cua_pfn_cuDevicePrimaryCtxReset_v2 ctx_reset;
    uint64_t (*entry_calls)(const char *name);
    cua_pfn_cuStreamCreate stream_create_cuda;
    void (*set_capturing)(cua_stream s, int capturing);
} fake;

static void *fake_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p != NULL, "the loaded libcuda.so.1 has no %s: not the fake (LD_LIBRARY_PATH?)", name);
    return p;
}

static void fake_bind(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(lib != NULL, "libcuda.so.1 is not loaded after init");
    void *p;
#define BIND(field, name) p = fake_sym(lib, name); memcpy(&fake.field, &p, sizeof p);
    BIND(calls, "fakecuda_calls")
    BIND(used_bytes, "fakecuda_used_bytes")
    BIND(live_handles, "fakecuda_live_handles")
    BIND(live_mappings, "fakecuda_live_mappings")
    BIND(fail, "fakecuda_fail")
    BIND(stream_create, "fakecuda_stream_create")
    BIND(ctx_depth, "fakecuda_ctx_depth")
    BIND(ctx_retains, "fakecuda_ctx_retains")
    BIND(ctx_get_current, "cuCtxGetCurrent")
    BIND(ctx_push, "cuCtxPushCurrent_v2")
    BIND(ctx_pop, "cuCtxPopCurrent_v2")
    BIND(ctx_retain, "cuDevicePrimaryCtxRetain")
    BIND(get_proc, "cuGetProcAddress_v2")
    BIND(ctx_reset, "cuDevicePrimaryCtxReset_v2")
    BIND(entry_calls, "fakecuda_entry_calls")
    BIND(stream_create_cuda, "cuStreamCreate")
    BIND(set_capturing, "fakecuda_stream_set_capturing")
#undef BIND
    dlclose(lib); /* drops only the reference taken here */
}

/* After every op: no context left pushed by the backend. */
static void expect_no_ctx(void) { EXPECT(fake.ctx_depth() == 0, "context stack depth %d", fake.ctx_depth()); }

static void test_init_and_info(void) {
    EXPECT_R(ops->va_reserve(0, G, 0, &(cua_devptr){0}), CUA_ERROR_NOT_INITIALIZED);
    EXPECT_R(ops->init(), CUA_SUCCESS);
    EXPECT_R(ops->init(), CUA_SUCCESS); /* idempotent */
    fake_bind();
    int n = 0;
    EXPECT_R(ops->device_count(&n), CUA_SUCCESS);
    EXPECT(n == 1, "%d devices", n);
    driver_device_info_t info;
    EXPECT_R(ops->device_info(0, &info), CUA_SUCCESS);
    EXPECT(strcmp(info.name, "cualloc sim device") == 0, "name %s", info.name);
    EXPECT(info.total_bytes == 256 * MiB && info.granularity == G && info.vmm_supported && !info.rdma_capable,
           "info: total %zu granularity %zu", info.total_bytes, info.granularity);
    EXPECT_R(ops->device_info(1, &info), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->device_info(0, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT(fake.ctx_retains(0) == 0, "describing a device creates no context");
    size_t fr = 0, tot = 0;
    EXPECT_R(ops->mem_get_info(0, &fr, &tot), CUA_SUCCESS);
    EXPECT(fr == 256 * MiB && tot == 256 * MiB, "free %zu total %zu", fr, tot);
    EXPECT(fake.ctx_retains(0) == 1, "primary context retained once: %u", fake.ctx_retains(0));
    expect_no_ctx();
}

static void test_vmm(void) {
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, 16 * G, 0, &va), CUA_SUCCESS);
    cua_memhandle a, b;
    EXPECT_R(ops->phys_create(0, G, &a), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, 2 * G, &b), CUA_SUCCESS);
    EXPECT(fake.live_handles(0) == 2 && fake.used_bytes(0) == 3 * G, "handles");
    EXPECT_R(ops->map(0, va, G, a), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va + G, 2 * G, b), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va, 3 * G), CUA_SUCCESS);
    expect_no_ctx();

    unsigned char *p = (unsigned char *)(uintptr_t)va;
    for (size_t i = 0; i < 3 * G; i += 4096) p[i] = (unsigned char)(i >> 12);
    for (size_t i = 0; i < 3 * G; i += 4096) EXPECT(p[i] == (unsigned char)(i >> 12), "byte %zu", i);

    /* the driver's errors come back unchanged */
    EXPECT_R(ops->unmap(0, va, 2 * G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va, G, b), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(0, 512 * MiB, &(cua_memhandle){0}), CUA_ERROR_OUT_OF_MEMORY);
    EXPECT_R(ops->va_free(0, va, 16 * G), CUA_ERROR_INVALID_VALUE);
    fake.fail(SIM_OP_PHYS_CREATE, 0, 1, 0);
    EXPECT_R(ops->phys_create(0, G, &(cua_memhandle){0}), CUA_ERROR_OUT_OF_MEMORY);
    expect_no_ctx();
    /* devices it does not have are refused before the driver */
    EXPECT_R(ops->map(3, va, G, a), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->map(-1, va, G, a), CUA_ERROR_INVALID_DEVICE);

    EXPECT(fake.live_mappings(0) == 2, "%zu mappings", fake.live_mappings(0));
    EXPECT(fake.calls(SIM_OP_MAP) == 3 && fake.calls(SIM_OP_PHYS_CREATE) == 4 && fake.calls(SIM_OP_SET_ACCESS) == 1,
           "each call reaches the driver once, failed ones too");
    EXPECT_R(ops->unmap(0, va, G), CUA_SUCCESS);
    EXPECT_R(ops->unmap(0, va + G, 2 * G), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, a), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, b), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, b), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_free(0, va, 16 * G), CUA_SUCCESS);
    EXPECT(fake.live_mappings(0) == 0 && fake.live_handles(0) == 0 && fake.used_bytes(0) == 0, "all returned");
    expect_no_ctx();
}

static void test_classic(void) {
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, 1000, &p), CUA_SUCCESS);
    memset((void *)(uintptr_t)p, 0x5a, 1000);
    EXPECT(((unsigned char *)(uintptr_t)p)[999] == 0x5a, "write through a cuMemAlloc pointer");
    EXPECT(fake.used_bytes(0) == G, "%zu", fake.used_bytes(0));
    size_t fr, tot;
    EXPECT_R(ops->mem_get_info(0, &fr, &tot), CUA_SUCCESS);
    EXPECT(fr == 256 * MiB - G, "free %zu", fr);
    EXPECT_R(ops->mem_free(0, p + 512), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
    EXPECT_R(ops->mem_alloc(0, 0, &p), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_alloc(0, 1, NULL), CUA_ERROR_INVALID_VALUE);
    expect_no_ctx();
}

static void test_events(void) {
    cua_event e;
    EXPECT_R(ops->event_create(0, &e), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e, NULL), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    cua_stream held = fake.stream_create(0, 1);
    EXPECT(held != NULL, "held stream");
    EXPECT_R(ops->event_record(0, e, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->stream_synchronize(0, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->device_synchronize(0), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e, held), CUA_SUCCESS);
    EXPECT(ops->event_synchronize, "cuEventSynchronize was found");
    EXPECT_R(ops->event_synchronize(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_destroy(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_ERROR_INVALID_VALUE);
    EXPECT(fake.calls(SIM_OP_EVENT_RECORD) == 4 && fake.calls(SIM_OP_DEVICE_SYNC) == 1 && fake.calls(SIM_OP_EVENT_SYNC) == 1,
           "event calls");
    expect_no_ctx();
}

/* Captures: a stream made by cuStreamCreate without CU_STREAM_NON_BLOCKING synchronizes with the
 * legacy stream, so while it captures, the legacy stream's query answers
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (the heap then takes the legacy stream for capturing); a
 * non-blocking stream's capture leaves the legacy stream alone. */
static void test_capture_query(void) {
    cua_ctx primary, cur;
    EXPECT_R(fake.ctx_retain(&primary, 0), CUA_SUCCESS);
    EXPECT_R(fake.ctx_push(primary), CUA_SUCCESS);
    cua_stream blocking = NULL, nb = NULL;
    EXPECT_R(fake.stream_create_cuda(&blocking, 0), CUA_SUCCESS);
    EXPECT_R(fake.stream_create_cuda(&nb, CUA_STREAM_NON_BLOCKING), CUA_SUCCESS);
    EXPECT_R(fake.ctx_pop(&cur), CUA_SUCCESS);
    bool cap = true;
    fake.set_capturing(nb, 1);
    EXPECT_R(ops->stream_is_capturing(0, nb, &cap), CUA_SUCCESS);
    EXPECT(cap, "the non-blocking stream captures");
    EXPECT_R(ops->stream_is_capturing(0, NULL, &cap), CUA_SUCCESS);
    EXPECT(!cap, "the legacy stream does not");
    fake.set_capturing(nb, 0);
    fake.set_capturing(blocking, 1);
    EXPECT_R(ops->stream_is_capturing(0, NULL, &cap), CUA_ERROR_STREAM_CAPTURE_IMPLICIT);
    fake.set_capturing(blocking, 0);
    EXPECT_R(ops->stream_is_capturing(0, NULL, &cap), CUA_SUCCESS);
    EXPECT(!cap, "the capture ended");
    expect_no_ctx();
}

/* The backend pushes its context and pops it: a context the caller made current stays current. */
static void test_caller_context(void) {
    cua_ctx mine, cur = NULL;
    EXPECT_R(fake.ctx_retain(&mine, 0), CUA_SUCCESS);
    EXPECT_R(fake.ctx_push(mine), CUA_SUCCESS);
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, G, &p), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
    EXPECT(fake.ctx_depth() == 1, "depth %d", fake.ctx_depth());
    EXPECT_R(fake.ctx_get_current(&cur), CUA_SUCCESS);
    EXPECT(cur == mine, "the caller's context is current again");
    EXPECT_R(fake.ctx_pop(&cur), CUA_SUCCESS);
    EXPECT(fake.ctx_depth() == 0, "depth %d", fake.ctx_depth());
}

/* The fake answers cuGetProcAddress as the driver does: unversioned names only. */
static void test_get_proc(void) {
    void *p = NULL;
    int status = -1;
    EXPECT_R(fake.get_proc("cuMemAlloc", &p, 12000, CUA_GET_PROC_ADDRESS_DEFAULT, &status), CUA_SUCCESS);
    EXPECT(p != NULL && status == 0, "cuMemAlloc");
    EXPECT_R(fake.get_proc("cuMemAlloc_v2", &p, 12000, CUA_GET_PROC_ADDRESS_DEFAULT, &status), CUA_ERROR_NOT_FOUND);
    EXPECT(p == NULL && status == 1, "versioned names are not found");
    EXPECT_R(fake.get_proc(NULL, &p, 12000, 0, &status), CUA_ERROR_INVALID_VALUE);
}

/* context_current: none current, one current (proved usable once with cuCtxGetDevice, then
 * answered from cuCtxGetCurrent alone), and one current whose primary context was reset, which
 * is unusable until retained anew. Resets the device: runs last. */
static void test_context_current(void) {
    EXPECT_R(ops->context_current(), CUA_ERROR_INVALID_CONTEXT);
    cua_ctx primary, cur;
    EXPECT_R(fake.ctx_retain(&primary, 0), CUA_SUCCESS);
    EXPECT_R(fake.ctx_push(primary), CUA_SUCCESS);
    uint64_t get_device0 = fake.entry_calls("cuCtxGetDevice");
    EXPECT_R(ops->context_current(), CUA_SUCCESS);
    EXPECT(fake.entry_calls("cuCtxGetDevice") == get_device0 + 1, "the first query proves the context usable");
    uint64_t all0 = fake.entry_calls(NULL);
    for (int i = 0; i < 10; i++) EXPECT_R(ops->context_current(), CUA_SUCCESS);
    EXPECT(fake.entry_calls(NULL) == all0 + 10, "%llu driver calls for 10 queries of a proved context, want 10",
           (unsigned long long)(fake.entry_calls(NULL) - all0));
    /* The reset context stays current and cannot be used until it is retained anew. */
    EXPECT_R(fake.ctx_reset(0), CUA_SUCCESS);
    ops->context_reset(0);
    EXPECT_R(ops->context_current(), CUA_ERROR_INVALID_CONTEXT);
    EXPECT_R(ops->context_current(), CUA_ERROR_INVALID_CONTEXT);
    EXPECT_R(fake.ctx_retain(&primary, 0), CUA_SUCCESS);
    EXPECT_R(ops->context_current(), CUA_SUCCESS);
    EXPECT_R(fake.ctx_pop(&cur), CUA_SUCCESS);
    EXPECT_R(ops->context_current(), CUA_ERROR_INVALID_CONTEXT);
    expect_no_ctx();
}

static char captured[1024];
static void capture(const char *line, void *arg) {
    (void)arg;
    snprintf(captured, sizeof captured, "%s", line);
}

static int test_missing(void) {
    void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (real) {
        printf("test_driver_cuda missing: a libcuda.so.1 is installed here; skipped\n");
        dlclose(real);
        return 77;
    }
    error_set_callback(capture, NULL);
    EXPECT_R(ops->init(), CUA_ERROR_NO_DEVICE);
    EXPECT(strstr(captured, "libcuda.so.1") != NULL, "message names the library: %s", captured);
    captured[0] = '\0';
    EXPECT_R(ops->init(), CUA_ERROR_NO_DEVICE); /* again, still cleanly */
    EXPECT(strstr(captured, "libcuda.so.1") != NULL, "message again: %s", captured);
    error_set_callback(NULL, NULL);
    int n = -1;
    EXPECT_R(ops->device_count(&n), CUA_ERROR_NOT_INITIALIZED);
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, G, 0, &va), CUA_ERROR_NOT_INITIALIZED);
    EXPECT_R(ops->mem_alloc(0, G, &va), CUA_ERROR_NOT_INITIALIZED);
    EXPECT_R(ops->event_query(0, NULL), CUA_ERROR_NOT_INITIALIZED);
    driver_device_info_t info;
    EXPECT_R(ops->device_info(0, &info), CUA_ERROR_NOT_INITIALIZED);
    printf("test_driver_cuda missing: ok (%s)\n", driver_error_name(CUA_ERROR_NO_DEVICE));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "missing") == 0) return test_missing();
    test_init_and_info();
    test_vmm();
    test_classic();
    test_events();
    test_caller_context();
    test_capture_query();
    test_get_proc();
    test_context_current();
    printf("test_driver_cuda: ok\n");
    return 0;
}
