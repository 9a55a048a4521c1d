/* test_sim.c — the sim device (src/driver_sim.c) against the driver rules it must enforce: every
 * violation answered with the right CUDA error and no effect, capacity, injected failures and
 * latency, call counts, held streams and events, host-backed memory that can be read and written
 * through device pointers, deterministic addresses, several devices, a device reset, thread safety.
 * It does not test the heap or the fake libcuda (test_driver_cuda.c). */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#define G (2 * MiB)

static const driver_ops_t *const ops = &driver_sim_ops;

/* The last message the sim reported (expected ones are checked, not printed). */
static char last_message[1024];
static void capture_message(const char *line, void *arg) {
    (void)arg;
    snprintf(last_message, sizeof last_message, "%s", line);
}

#define EXPECT_R(call, want)                                                                  \
    do {                                                                                      \
        cua_result r_ = (call);                                                               \
        EXPECT(r_ == (want), "%s returned %s (%d), expected %s (%d)", #call, driver_error_name(r_), r_, \
               driver_error_name(want), (int)(want));                                         \
    } while (0)

/* Defaults with a small device, then overridden by the test. */
static conf_t base_conf(size_t memory, bool host_backed) {
    conf_t c;
    conf_defaults(&c);
    c.sim_memory = memory;
    c.sim_granularity = G;
    c.sim_host_backed = host_backed;
    c.sim_vmm = true;
    c.sim_devices = 1;
    c.sim_latency_us = 0;
    c.sim_fail_op = SIM_OP_COUNT;
    c.sim_fail_after = 0;
    c.sim_fail_count = 0;
    return c;
}

static void configure(const conf_t *c) {
    sim_configure(c);
    EXPECT_R(ops->init(), CUA_SUCCESS);
}

static void test_before_configure(void) {
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, G, 0, &va), CUA_ERROR_NOT_INITIALIZED);
    /* init configures from the defaults when sim_configure never ran */
    EXPECT_R(ops->init(), CUA_SUCCESS);
    int n = 0;
    EXPECT_R(ops->device_count(&n), CUA_SUCCESS);
    conf_t d;
    conf_defaults(&d);
    EXPECT(n == d.sim_devices, "%d devices", n);
    driver_device_info_t info;
    EXPECT_R(ops->device_info(0, &info), CUA_SUCCESS);
    EXPECT(info.total_bytes == d.sim_memory && info.granularity == d.sim_granularity, "defaults");
}

static void test_info(void) {
    conf_t c = base_conf(64 * MiB, false);
    configure(&c);
    int n = -1;
    EXPECT_R(ops->device_count(&n), CUA_SUCCESS);
    EXPECT(n == 1, "%d", n);
    EXPECT_R(ops->device_count(NULL), CUA_ERROR_INVALID_VALUE);
    driver_device_info_t info;
    EXPECT_R(ops->device_info(0, &info), CUA_SUCCESS);
    EXPECT(strcmp(info.name, "cualloc sim device") == 0, "%s", info.name);
    EXPECT(info.total_bytes == 64 * MiB && info.granularity == G && info.vmm_supported && !info.rdma_capable,
           "info");
    EXPECT_R(ops->device_info(1, &info), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->device_info(-1, &info), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->device_info(0, NULL), CUA_ERROR_INVALID_VALUE);
    size_t fr, tot;
    EXPECT_R(ops->mem_get_info(0, &fr, &tot), CUA_SUCCESS);
    EXPECT(fr == 64 * MiB && tot == 64 * MiB, "free %zu total %zu", fr, tot);
    EXPECT_R(ops->mem_get_info(0, NULL, &tot), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_get_info(3, &fr, &tot), CUA_ERROR_INVALID_DEVICE);
}

static void test_phys_create_and_capacity(void) {
    conf_t c = base_conf(64 * MiB, false);
    configure(&c);
    cua_memhandle h[40];
    EXPECT_R(ops->phys_create(0, 0, &h[0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(0, MiB, &h[0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(0, G + 4096, &h[0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(0, G, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(1, G, &h[0]), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->phys_create(0, 128 * MiB, &h[0]), CUA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < 32; i++) EXPECT_R(ops->phys_create(0, G, &h[i]), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 64 * MiB && sim_live_handles(0) == 32, "used %zu", sim_used_bytes(0));
    EXPECT_R(ops->phys_create(0, G, &h[32]), CUA_ERROR_OUT_OF_MEMORY);
    size_t fr, tot;
    EXPECT_R(ops->mem_get_info(0, &fr, &tot), CUA_SUCCESS);
    EXPECT(fr == 0 && tot == 64 * MiB, "free %zu", fr);
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, 1, &p), CUA_ERROR_OUT_OF_MEMORY);
    for (int i = 1; i < 32; i++) EXPECT(h[i] != h[i - 1], "unique handles");
    EXPECT_R(ops->phys_release(0, h[5]), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, h[5]), CUA_ERROR_INVALID_VALUE); /* twice */
    EXPECT_R(ops->phys_release(0, 0), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_release(0, 0xdeadbeefull), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_release(0, ~0ull), CUA_ERROR_INVALID_VALUE);
    EXPECT(sim_used_bytes(0) == 62 * MiB && sim_live_handles(0) == 31, "after release");
    cua_memhandle again;
    EXPECT_R(ops->phys_create(0, G, &again), CUA_SUCCESS);
    EXPECT(again != h[5], "a released handle's value is not reused as is");
    EXPECT_R(ops->phys_release(0, h[5]), CUA_ERROR_INVALID_VALUE); /* stale */
    EXPECT_R(ops->phys_release(0, again), CUA_SUCCESS);
    for (int i = 0; i < 32; i++)
        if (i != 5) EXPECT_R(ops->phys_release(0, h[i]), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0 && sim_live_handles(0) == 0, "all released");

    c.sim_vmm = false;
    configure(&c);
    EXPECT_R(ops->phys_create(0, G, &h[0]), CUA_ERROR_NOT_SUPPORTED);
    EXPECT_R(ops->va_reserve(0, G, 0, &p), CUA_ERROR_NOT_SUPPORTED);
    EXPECT_R(ops->mem_alloc(0, 100, &p), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
}

static void test_map_rules(void) {
    conf_t c = base_conf(64 * MiB, false);
    configure(&c);
    cua_devptr va, va2;
    EXPECT_R(ops->va_reserve(0, 0, 0, &va), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_reserve(0, MiB, 0, &va), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_reserve(0, G, 3 * G, &va), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_reserve(0, G, 0, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_reserve(0, 16 * MiB, 0, &va), CUA_SUCCESS);
    EXPECT(va % G == 0, "aligned");
    EXPECT_R(ops->va_reserve(0, 8 * MiB, 64 * MiB, &va2), CUA_SUCCESS);
    EXPECT(va2 % (64 * MiB) == 0 && (va2 >= va + 16 * MiB || va2 + 8 * MiB <= va), "aligned, disjoint");

    cua_memhandle a, b, big;
    EXPECT_R(ops->phys_create(0, G, &a), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, G, &b), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, 2 * G, &big), CUA_SUCCESS);

    /* map: alignment, size, handle, place */
    EXPECT_R(ops->map(0, va + 4096, G, a), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va, G / 2, a), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va, 2 * G, a), CUA_ERROR_INVALID_VALUE);   /* size != handle size */
    EXPECT_R(ops->map(0, va, G, big), CUA_ERROR_INVALID_VALUE);     /* part of a handle */
    EXPECT_R(ops->map(0, va, G, 12345), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va + 64 * G, G, a), CUA_ERROR_INVALID_VALUE); /* outside any reservation */
    EXPECT_R(ops->map(0, va + 16 * MiB - G, 2 * G, big), CUA_ERROR_INVALID_VALUE); /* crosses the end */
    EXPECT_R(ops->map(0, 0, G, a), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, ~0ull & ~(G - 1), G, a), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(1, va, G, a), CUA_ERROR_INVALID_DEVICE);
    EXPECT(sim_live_mappings(0) == 0, "no mapping from failed calls");
    EXPECT_R(ops->map(0, va, G, a), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va, G, b), CUA_ERROR_ALREADY_MAPPED);
    EXPECT_R(ops->map(0, va + G, 2 * G, big), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va + 2 * G, G, b), CUA_ERROR_ALREADY_MAPPED); /* inside big's mapping */
    EXPECT(sim_live_mappings(0) == 2, "%zu", sim_live_mappings(0));

    /* set_access: whole adjacent mappings only */
    EXPECT_R(ops->set_access(0, va, 3 * G), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va + G, 2 * G), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va, 2 * G), CUA_ERROR_INVALID_VALUE);   /* half of big */
    EXPECT_R(ops->set_access(0, va + 2 * G, G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->set_access(0, va, 4 * G), CUA_ERROR_INVALID_VALUE);   /* runs into nothing */
    EXPECT_R(ops->set_access(0, va + 4 * G, G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->set_access(0, va, 0), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va + 4 * G, G, b), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va, 5 * G), CUA_ERROR_INVALID_VALUE);   /* a gap at 3G */

    /* unmap: exactly one whole mapping */
    EXPECT_R(ops->unmap(0, va + G, G), CUA_ERROR_INVALID_VALUE);        /* front half of big */
    EXPECT_R(ops->unmap(0, va + 2 * G, G), CUA_ERROR_INVALID_VALUE);    /* back half of big */
    EXPECT_R(ops->unmap(0, va, 3 * G), CUA_ERROR_INVALID_VALUE);        /* spans two */
    EXPECT_R(ops->unmap(0, va + 3 * G, G), CUA_ERROR_INVALID_VALUE);    /* nothing there */
    EXPECT_R(ops->unmap(0, va + 4096, G), CUA_ERROR_INVALID_VALUE);
    EXPECT(sim_live_mappings(0) == 3, "%zu", sim_live_mappings(0));

    /* va_free: the exact reservation, empty */
    EXPECT_R(ops->va_free(0, va, 16 * MiB), CUA_ERROR_INVALID_VALUE);   /* mappings inside */
    EXPECT_R(ops->va_free(0, va, 8 * MiB), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_free(0, va + G, 14 * MiB), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_free(0, va2, 8 * MiB), CUA_SUCCESS);
    EXPECT_R(ops->va_free(0, va2, 8 * MiB), CUA_ERROR_INVALID_VALUE);   /* twice */

    /* releasing a mapped handle: allowed, memory stays until the unmap */
    EXPECT_R(ops->phys_release(0, big), CUA_SUCCESS);
    EXPECT(sim_live_handles(0) == 2 && sim_used_bytes(0) == 4 * G, "deferred: %zu", sim_used_bytes(0));
    EXPECT_R(ops->map(0, va + 6 * G, 2 * G, big), CUA_ERROR_INVALID_VALUE); /* released */
    EXPECT_R(ops->unmap(0, va + G, 2 * G), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 2 * G, "freed at unmap: %zu", sim_used_bytes(0));
    EXPECT_R(ops->unmap(0, va + G, 2 * G), CUA_ERROR_INVALID_VALUE);   /* twice */

    /* a handle may be mapped at two places, as CUDA allows */
    EXPECT_R(ops->map(0, va + 6 * G, G, a), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, a), CUA_SUCCESS);
    EXPECT_R(ops->unmap(0, va, G), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 2 * G, "still mapped once: %zu", sim_used_bytes(0));
    EXPECT_R(ops->unmap(0, va + 6 * G, G), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == G, "%zu", sim_used_bytes(0));

    EXPECT_R(ops->unmap(0, va + 4 * G, G), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, b), CUA_SUCCESS);
    EXPECT_R(ops->va_free(0, va, 16 * MiB), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0 && sim_live_handles(0) == 0 && sim_live_mappings(0) == 0, "all gone");
}

/* Random maps, unmaps and set_access calls over one reservation against a model of which granules
 * each mapping covers: the sim keeps its mappings in a gap buffer that moves with every insert and
 * removal, in whatever order they come. */
static void test_map_model(void) {
    enum { SLOTS = 256, STEPS = 20000 };
    conf_t c = base_conf((SLOTS + 8) * G, false);
    configure(&c);
    rng_t r = {test_seed("test_sim map model")};
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, SLOTS * G, 0, &va), CUA_SUCCESS);
    /* len[i]: granules of the mapping that starts at granule i (0: none starts there); owner[i]:
     * where the mapping covering granule i starts, or -1 */
    static unsigned len[SLOTS];
    static int owner[SLOTS];
    for (int i = 0; i < SLOTS; i++) owner[i] = -1, len[i] = 0;
    size_t live = 0;
    for (int step = 0; step < STEPS; step++) {
        int i = (int)rng_below(&r, SLOTS);
        unsigned want = 1 + (unsigned)rng_below(&r, 3);
        int op = (int)rng_below(&r, 3);
        if (op == 0) { /* map `want` granules at i */
            bool fits = i + (int)want <= SLOTS, free_run = fits;
            for (unsigned k = 0; fits && k < want; k++) free_run = free_run && owner[i + (int)k] < 0;
            cua_memhandle h;
            EXPECT_R(ops->phys_create(0, want * G, &h), CUA_SUCCESS);
            cua_result res = ops->map(0, va + (cua_devptr)i * G, want * G, h);
            if (!fits) EXPECT(res == CUA_ERROR_INVALID_VALUE, "map past the reservation: %d", res);
            else if (!free_run) EXPECT(res == CUA_ERROR_ALREADY_MAPPED, "map over a mapping: %d", res);
            else EXPECT(res == CUA_SUCCESS, "map into free granules: %d", res);
            EXPECT_R(ops->phys_release(0, h), CUA_SUCCESS); /* freed at its unmap, or now */
            if (res == CUA_SUCCESS) {
                len[i] = want;
                for (unsigned k = 0; k < want; k++) owner[i + (int)k] = i;
                live++;
            }
        } else if (op == 1) { /* unmap the mapping at i (or a wrong range) */
            int o = owner[i];
            if (o >= 0 && rng_below(&r, 8)) i = o; /* mostly whole mappings */
            bool whole = owner[i] == i; /* else one granule where no mapping starts: refused */
            cua_result res = ops->unmap(0, va + (cua_devptr)i * G, (whole ? len[i] : 1) * G);
            EXPECT(res == (whole ? CUA_SUCCESS : CUA_ERROR_INVALID_VALUE), "unmap at %d: %d", i, res);
            if (res == CUA_SUCCESS) {
                for (unsigned k = 0; k < len[i]; k++) owner[i + (int)k] = -1;
                len[i] = 0;
                live--;
            }
        } else { /* set_access over `want` granules from i: whole adjacent mappings only */
            bool ok = owner[i] == i && i + (int)want <= SLOTS;
            for (unsigned k = 0; ok && k < want; k++) ok = owner[i + (int)k] >= 0;
            if (ok) ok = owner[i + (int)want - 1] + (int)len[owner[i + (int)want - 1]] == i + (int)want;
            cua_result res = ops->set_access(0, va + (cua_devptr)i * G, want * G);
            EXPECT(res == (ok ? CUA_SUCCESS : CUA_ERROR_INVALID_VALUE), "set_access at %d x%u: %d", i, want, res);
        }
        EXPECT(sim_live_mappings(0) == live, "step %d: %zu mappings, the model has %zu", step, sim_live_mappings(0), live);
    }
    for (int i = 0; i < SLOTS; i++)
        if (owner[i] == i) EXPECT_R(ops->unmap(0, va + (cua_devptr)i * G, len[i] * G), CUA_SUCCESS);
    EXPECT_R(ops->va_free(0, va, SLOTS * G), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0 && sim_live_mappings(0) == 0, "all gone: %zu B, %zu mappings", sim_used_bytes(0),
           sim_live_mappings(0));
}

static void test_mem_alloc(void) {
    conf_t c = base_conf(16 * MiB, false);
    configure(&c);
    cua_devptr p, q, r;
    EXPECT_R(ops->mem_alloc(0, 0, &p), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_alloc(0, 10, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_alloc(0, SIZE_MAX, &p), CUA_ERROR_OUT_OF_MEMORY);
    EXPECT_R(ops->mem_alloc(0, 1, &p), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == G, "rounded to the granularity: %zu", sim_used_bytes(0));
    EXPECT_R(ops->mem_alloc(0, G + 1, &q), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 3 * G, "%zu", sim_used_bytes(0));
    EXPECT(p % 512 == 0 && q % 512 == 0 && q != p, "aligned, distinct");
    EXPECT_R(ops->mem_alloc(0, 6 * G, &r), CUA_ERROR_OUT_OF_MEMORY);
    EXPECT_R(ops->mem_alloc(0, 5 * G, &r), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p + 512), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_free(0, 0), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_free(1, p), CUA_ERROR_INVALID_DEVICE);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_free(0, q), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, r), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0, "%zu", sim_used_bytes(0));
    /* a cuMemAlloc'd range is no reservation */
    EXPECT_R(ops->mem_alloc(0, G, &p), CUA_SUCCESS);
    cua_memhandle h;
    EXPECT_R(ops->phys_create(0, G, &h), CUA_SUCCESS);
    EXPECT_R(ops->map(0, p, G, h), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_release(0, h), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
}

static void test_failures_and_counts(void) {
    conf_t c = base_conf(64 * MiB, false);
    configure(&c);
    for (int op = 0; op < SIM_OP_COUNT; op++) EXPECT(sim_calls((sim_op_t)op) == 0, "counts reset");
    EXPECT(sim_calls(SIM_OP_COUNT) == 0 && sim_calls((sim_op_t)-1) == 0, "bad op");
    sim_fail(SIM_OP_COUNT, 0, 1, 0); /* ignored */

    /* the 3rd and 4th creates fail with the default error for create ops */
    sim_fail(SIM_OP_PHYS_CREATE, 2, 2, 0);
    cua_memhandle h[5];
    cua_result want[5] = {0, 0, CUA_ERROR_OUT_OF_MEMORY, CUA_ERROR_OUT_OF_MEMORY, 0};
    for (int i = 0; i < 5; i++) EXPECT_R(ops->phys_create(0, G, &h[i]), want[i]);
    EXPECT(sim_calls(SIM_OP_PHYS_CREATE) == 5, "failed calls counted: %llu",
           (unsigned long long)sim_calls(SIM_OP_PHYS_CREATE));
    EXPECT(sim_live_handles(0) == 3 && sim_used_bytes(0) == 3 * G, "no effect from failures");

    /* a chosen error */
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, 8 * G, 0, &va), CUA_SUCCESS);
    sim_fail(SIM_OP_MAP, 0, 1, CUA_ERROR_NOT_PERMITTED);
    EXPECT_R(ops->map(0, va, G, h[0]), CUA_ERROR_NOT_PERMITTED);
    EXPECT(sim_live_mappings(0) == 0, "failed map has no effect");
    EXPECT_R(ops->map(0, va, G, h[0]), CUA_SUCCESS);
    sim_fail(SIM_OP_UNMAP, 0, 1, 0);
    EXPECT_R(ops->unmap(0, va, G), CUA_ERROR_UNKNOWN);
    EXPECT(sim_live_mappings(0) == 1, "failed unmap has no effect");
    EXPECT_R(ops->unmap(0, va, G), CUA_SUCCESS);
    EXPECT(sim_calls(SIM_OP_MAP) == 2 && sim_calls(SIM_OP_UNMAP) == 2 && sim_calls(SIM_OP_VA_RESERVE) == 1,
           "counts");
    /* rule violations count too */
    EXPECT_R(ops->unmap(0, va, G), CUA_ERROR_INVALID_VALUE);
    EXPECT(sim_calls(SIM_OP_UNMAP) == 3, "violations counted");

    sim_fail(SIM_OP_MEM_ALLOC, 0, 1, 0);
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, G, &p), CUA_ERROR_OUT_OF_MEMORY);
    sim_fail(SIM_OP_EVENT_QUERY, 1, 1, 0);
    cua_event e;
    EXPECT_R(ops->event_create(0, &e), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_ERROR_UNKNOWN);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT(sim_calls(SIM_OP_EVENT_QUERY) == 3 && sim_calls(SIM_OP_EVENT_CREATE) == 1, "event counts");

    /* from the configuration: the 2nd map fails, twice */
    c.sim_fail_op = SIM_OP_MAP;
    c.sim_fail_after = 1;
    c.sim_fail_count = 2;
    configure(&c);
    EXPECT(sim_calls(SIM_OP_PHYS_CREATE) == 0, "reset by sim_configure");
    EXPECT_R(ops->va_reserve(0, 8 * G, 0, &va), CUA_SUCCESS);
    for (int i = 0; i < 3; i++) EXPECT_R(ops->phys_create(0, G, &h[i]), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va, G, h[0]), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va + G, G, h[1]), CUA_ERROR_UNKNOWN);
    EXPECT_R(ops->map(0, va + G, G, h[1]), CUA_ERROR_UNKNOWN);
    EXPECT_R(ops->map(0, va + G, G, h[1]), CUA_SUCCESS);
    c.sim_fail_op = SIM_OP_PHYS_CREATE;
    c.sim_fail_after = 0;
    c.sim_fail_count = 1;
    configure(&c);
    EXPECT_R(ops->phys_create(0, G, &h[0]), CUA_ERROR_OUT_OF_MEMORY);
    EXPECT_R(ops->phys_create(0, G, &h[0]), CUA_SUCCESS);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_latency(void) {
    conf_t c = base_conf(64 * MiB, false);
    c.sim_latency_us = 3000;
    configure(&c);
    double t0 = now_s();
    cua_memhandle h;
    EXPECT_R(ops->phys_create(0, G, &h), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, h), CUA_SUCCESS);
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, G, &p), CUA_SUCCESS);
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
    double slow = now_s() - t0;
    EXPECT(slow >= 4 * 0.003, "4 slow calls took %.4f s", slow);
    t0 = now_s();
    cua_event e;
    EXPECT_R(ops->event_create(0, &e), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
    EXPECT_R(ops->event_destroy(0, e), CUA_SUCCESS);
    (void)(now_s() - t0); /* events have no injected latency; not timed (a loaded machine) */
}

static void test_streams_events(void) {
    conf_t c = base_conf(64 * MiB, false);
    c.sim_devices = 2;
    configure(&c);
    cua_stream held = sim_stream_create(0, true);
    cua_stream free_running = sim_stream_create(0, false);
    cua_stream other_dev = sim_stream_create(1, true);
    EXPECT(held && free_running && other_dev && held != free_running && held != other_dev, "unique streams");
    EXPECT(held != (cua_stream)1 && held != (cua_stream)2, "not the special handles");
    cua_event e1, e2, e_dev1;
    EXPECT_R(ops->event_create(0, &e1), CUA_SUCCESS);
    EXPECT_R(ops->event_create(0, &e2), CUA_SUCCESS);
    EXPECT_R(ops->event_create(1, &e_dev1), CUA_SUCCESS);
    EXPECT_R(ops->event_create(0, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_create(2, &e1), CUA_ERROR_INVALID_DEVICE);
    EXPECT(e1 != e2, "unique events");

    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS); /* never recorded */
    EXPECT_R(ops->event_record(0, e1, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_NOT_READY);
    sim_stream_complete(held);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);

    /* work after an event does not hold the event back */
    EXPECT_R(ops->event_record(0, e1, held), CUA_SUCCESS);
    sim_stream_complete(held);
    EXPECT_R(ops->event_record(0, e2, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->stream_synchronize(0, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_SUCCESS);

    /* event_synchronize completes the stream's work up to the event, not the work after it */
    EXPECT_R(ops->event_record(0, e1, held), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e2, held), CUA_SUCCESS);
    uint64_t waits = sim_calls(SIM_OP_EVENT_SYNC);
    EXPECT_R(ops->event_synchronize(0, e1), CUA_SUCCESS);
    EXPECT(sim_calls(SIM_OP_EVENT_SYNC) == waits + 1, "event waits are counted");
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->event_synchronize(0, e2), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_SUCCESS);
    EXPECT_R(ops->event_synchronize(0, e2), CUA_SUCCESS); /* already complete: returns at once */

    /* re-recording moves the event to the new point */
    EXPECT_R(ops->event_record(0, e2, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->event_record(0, e2, free_running), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_SUCCESS);

    /* device_synchronize completes every stream of that device only */
    EXPECT_R(ops->event_record(0, e1, held), CUA_SUCCESS);
    EXPECT_R(ops->event_record(1, e_dev1, other_dev), CUA_SUCCESS);
    EXPECT_R(ops->device_synchronize(0), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_query(1, e_dev1), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->device_synchronize(1), CUA_SUCCESS);
    EXPECT_R(ops->event_query(1, e_dev1), CUA_SUCCESS);

    /* the legacy stream, non-held streams and unknown handles complete at once */
    EXPECT_R(ops->event_record(0, e1, NULL), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e1, (cua_stream)0x1234), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->stream_synchronize(0, NULL), CUA_SUCCESS);
    EXPECT_R(ops->stream_synchronize(0, (cua_stream)0x1234), CUA_SUCCESS);

    /* the legacy stream's events wait for the held blocking streams of their device (not for a
     * held non-blocking one, nor another device's), and its synchronize completes them */
    cua_stream blocking = sim_stream_create(0, true), blocking_dev1 = sim_stream_create(1, true);
    sim_stream_set_blocking(blocking, true);
    sim_stream_set_blocking(blocking_dev1, true);
    EXPECT_R(ops->stream_synchronize(0, held), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e1, NULL), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->event_record(0, e2, (cua_stream)1), CUA_SUCCESS); /* CU_STREAM_LEGACY */
    EXPECT_R(ops->event_query(0, e2), CUA_ERROR_NOT_READY);
    sim_stream_complete(blocking);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e1, NULL), CUA_SUCCESS);
    EXPECT_R(ops->stream_synchronize(0, NULL), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e2, blocking), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e2), CUA_ERROR_NOT_READY);
    EXPECT_R(ops->event_synchronize(0, e2), CUA_SUCCESS);
    /* more held blocking streams than an event can wait for: refused (a simulator's bound), and
     * the event keeps its earlier record */
    cua_stream many[8];
    for (int i = 0; i < 8; i++) {
        many[i] = sim_stream_create(0, true);
        sim_stream_set_blocking(many[i], true);
    }
    EXPECT_R(ops->event_record(0, e1, many[0]), CUA_SUCCESS);
    EXPECT_R(ops->event_record(0, e1, NULL), CUA_ERROR_INVALID_VALUE); /* 9 of them */
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_NOT_READY);
    sim_stream_complete(many[0]);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    for (int i = 0; i < 8; i++) sim_stream_destroy(many[i]);
    sim_stream_destroy(blocking);
    sim_stream_destroy(blocking_dev1);

    /* objects of another device, bad handles */
    EXPECT_R(ops->event_record(0, e1, other_dev), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_record(0, e_dev1, held), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_query(0, e_dev1), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_query(0, (cua_event)0x5678), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_query(0, NULL), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->stream_synchronize(0, other_dev), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_destroy(0, e_dev1), CUA_ERROR_INVALID_VALUE);

    /* destroying a stream finishes its work; destroyed events are gone */
    EXPECT_R(ops->event_record(0, e1, held), CUA_SUCCESS);
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_NOT_READY);
    sim_stream_destroy(held);
    EXPECT_R(ops->event_query(0, e1), CUA_SUCCESS);
    sim_stream_destroy(held);             /* twice: ignored */
    sim_stream_complete((cua_stream)0x99); /* unknown: ignored */
    EXPECT_R(ops->event_destroy(0, e1), CUA_SUCCESS);
    EXPECT_R(ops->event_destroy(0, e1), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_query(0, e1), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->event_destroy(0, e2), CUA_SUCCESS);
    EXPECT_R(ops->event_destroy(1, e_dev1), CUA_SUCCESS);
    error_set_callback(capture_message, NULL);
    EXPECT(sim_stream_create(5, true) == NULL, "no stream on a device that does not exist");
    error_set_callback(NULL, NULL);
    EXPECT(strstr(last_message, "device 5") != NULL, "message: %s", last_message);
    sim_stream_destroy(free_running);
    sim_stream_destroy(other_dev);
    EXPECT(sim_calls(SIM_OP_DEVICE_SYNC) == 2 && sim_calls(SIM_OP_STREAM_SYNC) == 6, "sync counts");
}

/* The legacy stream (NULL or CU_STREAM_LEGACY) while a blocking stream of its device captures: its
 * work would wait for the capturing stream's, which CUDA refuses (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
 * and which invalidates that capture; a query only answers the error. A non-blocking stream's
 * capture, or another device's, leaves the legacy stream alone. */
static void test_legacy_during_capture(void) {
    conf_t c = base_conf(64 * MiB, false);
    c.sim_devices = 2;
    configure(&c);
    cua_stream blocking = sim_stream_create(0, false), nb = sim_stream_create(0, false);
    cua_stream other = sim_stream_create(1, false);
    sim_stream_set_blocking(blocking, true);
    sim_stream_set_blocking(other, true);
    cua_event e;
    EXPECT_R(ops->event_create(0, &e), CUA_SUCCESS);
    bool cap = true;
    sim_stream_set_capturing(nb, true);
    sim_stream_set_capturing(other, true);
    uint64_t broken = sim_captures_broken();
    EXPECT_R(ops->stream_is_capturing(0, NULL, &cap), CUA_SUCCESS);
    EXPECT(!cap, "a non-blocking stream's capture does not involve the legacy stream");
    EXPECT_R(ops->event_record(0, e, NULL), CUA_SUCCESS);
    EXPECT_R(ops->stream_synchronize(0, NULL), CUA_SUCCESS);
    EXPECT(sim_captures_broken() == broken, "no capture broken");
    for (int named = 0; named < 2; named++) {
        cua_stream legacy = named ? (cua_stream)1 : NULL;
        sim_stream_set_capturing(blocking, true);
        EXPECT_R(ops->stream_is_capturing(0, legacy, &cap), CUA_ERROR_STREAM_CAPTURE_IMPLICIT);
        EXPECT(sim_captures_broken() == broken, "a query breaks no capture");
        EXPECT_R(ops->event_record(0, e, legacy), CUA_ERROR_STREAM_CAPTURE_IMPLICIT);
        EXPECT(sim_captures_broken() == broken + 1, "an event on the legacy stream broke the capture");
        EXPECT_R(ops->stream_is_capturing(0, blocking, &cap), CUA_SUCCESS);
        EXPECT(!cap, "the capture was invalidated");
        sim_stream_set_capturing(blocking, true);
        EXPECT_R(ops->stream_synchronize(0, legacy), CUA_ERROR_STREAM_CAPTURE_IMPLICIT);
        EXPECT(sim_captures_broken() == broken + 2, "a legacy synchronize broke the capture");
        broken += 2;
    }
    EXPECT_R(ops->stream_is_capturing(1, other, &cap), CUA_SUCCESS);
    EXPECT(cap, "another device's capture was left alone");
    EXPECT_R(ops->event_destroy(0, e), CUA_SUCCESS);
    sim_stream_destroy(blocking);
    sim_stream_destroy(nb);
    sim_stream_destroy(other);
}

/* Runs fn in a child process; true when the child died of a signal (or failed). */
static bool crashes(void (*fn)(void *), void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        fn(arg);
        _exit(0);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

static void touch(void *p) { *(volatile char *)p = 1; }

static void test_host_backed(void) {
    conf_t c = base_conf(64 * MiB, true);
    configure(&c);
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, 16 * G, 0, &va), CUA_SUCCESS);
    cua_memhandle a, b;
    EXPECT_R(ops->phys_create(0, G, &a), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, 2 * G, &b), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va, G, a), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va + G, 2 * G, b), CUA_SUCCESS);
    EXPECT(!sim_range_accessible(va, G), "no access before set_access");
    EXPECT(crashes(touch, (void *)(uintptr_t)va), "mapped without access is not accessible");
    EXPECT_R(ops->set_access(0, va, 3 * G), CUA_SUCCESS);
    EXPECT(sim_range_accessible(va, 3 * G), "accessible");
    EXPECT(!sim_range_accessible(va, 4 * G), "not past the mappings");

    /* write through the device pointers, across the two mappings */
    uint32_t *w = (uint32_t *)(uintptr_t)va;
    size_t nwords = 3 * G / sizeof *w;
    for (size_t i = 0; i < nwords; i++) w[i] = (uint32_t)(i * 2654435761u);
    for (size_t i = 0; i < nwords; i++) EXPECT(w[i] == (uint32_t)(i * 2654435761u), "word %zu", i);

    /* the data lives in the handle: remapped elsewhere it is still there */
    EXPECT_R(ops->unmap(0, va + G, 2 * G), CUA_SUCCESS);
    EXPECT(!sim_range_accessible(va + G, G), "unmapped");
    EXPECT(crashes(touch, (void *)(uintptr_t)(va + G)), "unmapped memory is not accessible");
    EXPECT_R(ops->map(0, va + 8 * G, 2 * G, b), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va + 8 * G, 2 * G), CUA_SUCCESS);
    uint32_t *w2 = (uint32_t *)(uintptr_t)(va + 8 * G);
    for (size_t i = 0; i < 2 * G / sizeof *w; i++)
        EXPECT(w2[i] == (uint32_t)((i + G / sizeof *w) * 2654435761u), "remapped word %zu", i);

    /* a handle mapped twice shows the same memory at both places */
    EXPECT_R(ops->map(0, va + 4 * G, G, a), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va + 4 * G, G), CUA_SUCCESS);
    w[7] = 0xfeedf00d;
    EXPECT(((uint32_t *)(uintptr_t)(va + 4 * G))[7] == 0xfeedf00d, "aliased");
    EXPECT_R(ops->unmap(0, va + 4 * G, G), CUA_SUCCESS);

    /* released memory comes back zeroed (holes punched) */
    EXPECT_R(ops->unmap(0, va + 8 * G, 2 * G), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, b), CUA_SUCCESS);
    cua_memhandle fresh;
    EXPECT_R(ops->phys_create(0, 2 * G, &fresh), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va + 8 * G, 2 * G, fresh), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va + 8 * G, 2 * G), CUA_SUCCESS);
    for (size_t i = 0; i < 2 * G / sizeof *w; i++) EXPECT(w2[i] == 0, "fresh memory is zero at %zu", i);

    /* fill the device: the granule allocator hands out every granule */
    cua_memhandle rest[32];
    size_t n = 0;
    while (n < 32 && ops->phys_create(0, G, &rest[n]) == CUA_SUCCESS) n++;
    EXPECT(n == 32 - 3, "%zu more granules", n);
    for (size_t i = 0; i < n; i++) EXPECT_R(ops->phys_release(0, rest[i]), CUA_SUCCESS);

    /* mem_alloc returns writable host memory */
    cua_devptr p;
    EXPECT_R(ops->mem_alloc(0, 3 * MiB, &p), CUA_SUCCESS);
    memset((void *)(uintptr_t)p, 0xab, 3 * MiB);
    EXPECT(((unsigned char *)(uintptr_t)p)[3 * MiB - 1] == 0xab, "mem_alloc memory");
    EXPECT(sim_range_accessible(p + 4096, MiB), "mem_alloc range accessible");
    EXPECT(sim_address_device(p) == 0 && sim_address_device(va + 5) == 0, "address device");
    EXPECT_R(ops->mem_free(0, p), CUA_SUCCESS);
    EXPECT(!sim_range_accessible(p, 4096), "freed");

    EXPECT_R(ops->va_free(0, va, 16 * G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->unmap(0, va, G), CUA_SUCCESS);
    EXPECT_R(ops->unmap(0, va + 8 * G, 2 * G), CUA_SUCCESS);
    EXPECT_R(ops->va_free(0, va, 16 * G), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, a), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, fresh), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0, "%zu", sim_used_bytes(0));

    /* reconfiguring drops live host mappings without leaking or crashing */
    EXPECT_R(ops->va_reserve(0, 4 * G, 0, &va), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, G, &a), CUA_SUCCESS);
    EXPECT_R(ops->map(0, va, G, a), CUA_SUCCESS);
    configure(&c);

    /* host backing needs page-sized granules */
    conf_t bad = c;
    bad.sim_granularity = 1024;
    error_set_callback(capture_message, NULL);
    sim_configure(&bad);
    error_set_callback(NULL, NULL);
    EXPECT(strstr(last_message, "sim_granularity") != NULL, "message: %s", last_message);
    EXPECT_R(ops->init(), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_create(0, G, &a), CUA_ERROR_NOT_INITIALIZED);
}

/* The same calls after sim_configure give the same addresses and handles. */
static void address_sequence(const conf_t *c, cua_devptr out[4], cua_memhandle hout[2]) {
    configure(c);
    EXPECT_R(ops->va_reserve(0, 8 * G, 0, &out[0]), CUA_SUCCESS);
    EXPECT_R(ops->mem_alloc(0, 1000, &out[1]), CUA_SUCCESS);
    EXPECT_R(ops->va_reserve(0, 4 * G, 16 * G, &out[2]), CUA_SUCCESS);
    EXPECT_R(ops->mem_alloc(0, 3 * G, &out[3]), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, G, &hout[0]), CUA_SUCCESS);
    EXPECT_R(ops->phys_create(0, G, &hout[1]), CUA_SUCCESS);
}

static void test_deterministic(void) {
    conf_t c = base_conf(64 * MiB, false);
    c.sim_va_base = 0x600000000000ull;
    cua_devptr a[4], b[4];
    cua_memhandle ha[2], hb[2];
    address_sequence(&c, a, ha);
    address_sequence(&c, b, hb);
    EXPECT(memcmp(a, b, sizeof a) == 0 && memcmp(ha, hb, sizeof ha) == 0, "same sequence, same results");
    EXPECT(a[0] == c.sim_va_base, "first address is sim_va_base: %#llx", a[0]);
    EXPECT(a[1] == a[0] + 8 * G, "bump pointer: %#llx", a[1]);
    EXPECT(a[2] % (16 * G) == 0 && a[2] > a[1], "aligned reservation");
    EXPECT(a[3] == a[2] + 4 * G, "bump pointer: %#llx", a[3]);
    /* host-backed: the same addresses when nothing else occupies them */
    conf_t hc = base_conf(64 * MiB, true);
    hc.sim_va_base = 0x600000000000ull;
    address_sequence(&hc, b, hb);
    if (b[0] != a[0]) printf("note: host-backed reservation landed at %#llx (address taken)\n", b[0]);
    address_sequence(&hc, a, ha);
    EXPECT(a[0] % G == 0 && b[2] % (16 * G) == 0, "host-backed alignment");
    configure(&c); /* drop the host mappings */
}

static void test_devices(void) {
    conf_t c = base_conf(8 * MiB, false);
    c.sim_devices = 3;
    configure(&c);
    int n = 0;
    EXPECT_R(ops->device_count(&n), CUA_SUCCESS);
    EXPECT(n == 3, "%d", n);
    cua_memhandle h[3][4];
    cua_devptr va[3];
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < 4; i++) EXPECT_R(ops->phys_create(d, G, &h[d][i]), CUA_SUCCESS);
        EXPECT_R(ops->phys_create(d, G, &h[d][0]), CUA_ERROR_OUT_OF_MEMORY);
        EXPECT_R(ops->va_reserve(d, 8 * G, 0, &va[d]), CUA_SUCCESS);
        EXPECT(sim_handle_device(h[d][1]) == d && sim_address_device(va[d] + G) == d, "owner");
    }
    EXPECT(va[0] != va[1] && va[1] != va[2], "one address space");
    EXPECT_R(ops->phys_create(3, G, &h[0][0]), CUA_ERROR_INVALID_DEVICE);
    /* another device's handle or reservation */
    EXPECT_R(ops->map(0, va[0], G, h[1][0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(0, va[1], G, h[0][0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->phys_release(1, h[0][0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->va_free(0, va[1], 8 * G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->map(1, va[1], G, h[1][0]), CUA_SUCCESS);
    EXPECT_R(ops->set_access(1, va[1], G), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, va[1], G), CUA_ERROR_INVALID_VALUE);
    EXPECT(sim_live_mappings(1) == 1 && sim_live_mappings(0) == 0, "per device");
    EXPECT_R(ops->phys_release(2, h[2][3]), CUA_SUCCESS);
    EXPECT(sim_used_bytes(2) == 3 * G && sim_used_bytes(1) == 4 * G, "per device used");
    EXPECT(sim_live_handles(2) == 3 && sim_live_handles(7) == 0 && sim_used_bytes(-1) == 0, "counts");
    size_t fr, tot;
    EXPECT_R(ops->mem_get_info(2, &fr, &tot), CUA_SUCCESS);
    EXPECT(fr == G && tot == 8 * MiB, "free %zu", fr);
    EXPECT(sim_handle_device(12345) == -1 && sim_address_device(1) == -1, "unknown objects");
    cua_stream s = sim_stream_create(2, false);
    cua_event e;
    EXPECT_R(ops->event_create(1, &e), CUA_SUCCESS);
    EXPECT(sim_stream_device(s) == 2 && sim_event_device(e) == 1 && sim_stream_device(NULL) == -1, "devices");
}

/* sim_device_reset (a reset of the primary context, in the fake libcuda): everything of that
 * device is gone, host-backed memory unmapped, its names stale; the other device is untouched and
 * the reset device works afresh. */
static void test_device_reset(void) {
    conf_t c = base_conf(16 * MiB, true);
    c.sim_devices = 2;
    configure(&c);
    cua_memhandle h[2][2];
    cua_devptr va[2], m[2];
    cua_event e[2];
    cua_stream s[2];
    for (int d = 0; d < 2; d++) {
        EXPECT_R(ops->va_reserve(d, 4 * G, 0, &va[d]), CUA_SUCCESS);
        for (int i = 0; i < 2; i++) {
            EXPECT_R(ops->phys_create(d, G, &h[d][i]), CUA_SUCCESS);
            EXPECT_R(ops->map(d, va[d] + (size_t)i * G, G, h[d][i]), CUA_SUCCESS);
        }
        EXPECT_R(ops->phys_release(d, h[d][1]), CUA_SUCCESS); /* released, still mapped */
        EXPECT_R(ops->set_access(d, va[d], 2 * G), CUA_SUCCESS);
        EXPECT_R(ops->mem_alloc(d, G, &m[d]), CUA_SUCCESS);
        EXPECT_R(ops->event_create(d, &e[d]), CUA_SUCCESS);
        s[d] = sim_stream_create(d, true);
        memset((void *)(uintptr_t)va[d], 0x11, 2 * G);
    }
    sim_device_reset(0);
    EXPECT(sim_used_bytes(0) == 0 && sim_live_handles(0) == 0 && sim_live_mappings(0) == 0,
           "device 0 after its reset: %zu B used, %zu handles, %zu mappings", sim_used_bytes(0), sim_live_handles(0),
           sim_live_mappings(0));
    EXPECT(!sim_range_accessible(va[0], G) && !sim_range_accessible(m[0], G) && sim_address_device(va[0]) == -1,
           "device 0's memory is gone");
    EXPECT(sim_handle_device(h[0][0]) == -1 && sim_event_device(e[0]) == -1 && sim_stream_device(s[0]) == -1,
           "device 0's names are stale");
    EXPECT_R(ops->phys_release(0, h[0][0]), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->unmap(0, va[0], G), CUA_ERROR_INVALID_VALUE);
    EXPECT_R(ops->mem_free(0, m[0]), CUA_ERROR_INVALID_VALUE);
    EXPECT(sim_used_bytes(1) == 3 * G && sim_live_handles(1) == 1 && sim_live_mappings(1) == 2, "device 1 untouched");
    EXPECT(sim_range_accessible(va[1], 2 * G) && *(volatile unsigned char *)(uintptr_t)(va[1] + G) == 0x11,
           "device 1's memory");
    EXPECT(sim_event_device(e[1]) == 1 && sim_stream_device(s[1]) == 1, "device 1's names");
    /* device 0 afresh: all of its memory again */
    cua_memhandle big;
    cua_devptr v;
    EXPECT_R(ops->phys_create(0, 8 * G, &big), CUA_SUCCESS);
    EXPECT_R(ops->va_reserve(0, 8 * G, 0, &v), CUA_SUCCESS);
    EXPECT_R(ops->map(0, v, 8 * G, big), CUA_SUCCESS);
    EXPECT_R(ops->set_access(0, v, 8 * G), CUA_SUCCESS);
    memset((void *)(uintptr_t)v, 0x22, 8 * G);
    EXPECT_R(ops->unmap(0, v, 8 * G), CUA_SUCCESS);
    EXPECT_R(ops->phys_release(0, big), CUA_SUCCESS);
    EXPECT_R(ops->va_free(0, v, 8 * G), CUA_SUCCESS);
    EXPECT(sim_used_bytes(0) == 0, "device 0 at the end: %zu B", sim_used_bytes(0));
}

/* 80 GiB without host backing costs no host memory; many mappings stay fast. */
static void test_big_device(void) {
    conf_t c = base_conf(80 * GiB, false);
    configure(&c);
    cua_devptr va;
    EXPECT_R(ops->va_reserve(0, 160 * GiB, 0, &va), CUA_SUCCESS);
    size_t n = 80 * GiB / G;
    cua_memhandle *h = malloc(n * sizeof *h);
    EXPECT(h != NULL, "malloc");
    for (size_t i = 0; i < n; i++) {
        EXPECT_R(ops->phys_create(0, G, &h[i]), CUA_SUCCESS);
        EXPECT_R(ops->map(0, va + i * G, G, h[i]), CUA_SUCCESS);
    }
    EXPECT_R(ops->set_access(0, va, 80 * GiB), CUA_SUCCESS);
    cua_memhandle extra;
    EXPECT_R(ops->phys_create(0, G, &extra), CUA_ERROR_OUT_OF_MEMORY);
    EXPECT(sim_live_mappings(0) == n, "%zu", sim_live_mappings(0));
    for (size_t i = n; i-- > 0;) {
        EXPECT_R(ops->unmap(0, va + i * G, G), CUA_SUCCESS);
        EXPECT_R(ops->phys_release(0, h[i]), CUA_SUCCESS);
    }
    EXPECT_R(ops->va_free(0, va, 160 * GiB), CUA_SUCCESS);
    free(h);
}

typedef struct {
    int id;
    cua_devptr va;
} worker_arg_t;

static void *worker(void *p) {
    worker_arg_t *a = p;
    cua_event e;
    EXPECT_R(ops->event_create(0, &e), CUA_SUCCESS);
    for (int it = 0; it < 300; it++) {
        cua_memhandle h;
        cua_result r = ops->phys_create(0, G, &h);
        if (r == CUA_ERROR_OUT_OF_MEMORY) continue;
        EXPECT_R(r, CUA_SUCCESS);
        cua_devptr at = a->va + (size_t)(it % 4) * G;
        EXPECT_R(ops->map(0, at, G, h), CUA_SUCCESS);
        EXPECT_R(ops->set_access(0, at, G), CUA_SUCCESS);
        EXPECT_R(ops->event_record(0, e, NULL), CUA_SUCCESS);
        EXPECT_R(ops->event_query(0, e), CUA_SUCCESS);
        EXPECT_R(ops->unmap(0, at, G), CUA_SUCCESS);
        EXPECT_R(ops->phys_release(0, h), CUA_SUCCESS);
    }
    EXPECT_R(ops->event_destroy(0, e), CUA_SUCCESS);
    return NULL;
}

static void test_threads(void) {
    conf_t c = base_conf(8 * MiB, false);
    configure(&c);
    enum { N = 4 };
    pthread_t t[N];
    worker_arg_t args[N];
    for (int i = 0; i < N; i++) {
        args[i].id = i;
        EXPECT_R(ops->va_reserve(0, 4 * G, 0, &args[i].va), CUA_SUCCESS);
        EXPECT(pthread_create(&t[i], NULL, worker, &args[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    EXPECT(sim_used_bytes(0) == 0 && sim_live_mappings(0) == 0 && sim_live_handles(0) == 0, "all returned");
    EXPECT(sim_calls(SIM_OP_PHYS_CREATE) == N * 300, "%llu", (unsigned long long)sim_calls(SIM_OP_PHYS_CREATE));
}

int main(void) {
    test_before_configure();
    test_info();
    test_phys_create_and_capacity();
    test_map_rules();
    test_map_model();
    test_mem_alloc();
    test_failures_and_counts();
    test_latency();
    test_streams_events();
    test_legacy_during_capture();
    test_host_backed();
    test_deterministic();
    test_devices();
    test_device_reset();
    test_big_device();
    test_threads();
    conf_t c;
    conf_defaults(&c);
    sim_configure(&c); /* release everything (leak checkers) */
    printf("test_sim: ok\n");
    return 0;
}
