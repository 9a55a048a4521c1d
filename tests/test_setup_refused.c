/* test_setup_refused.c — a heap whose set-up is refused host memory gives back everything it took.
 * Run with tests/failing_mmap.c preloaded (suite 'interpose'): for k = 1, 2, ... the k-th anonymous
 * mapping of heap_create is refused (failing_mmap_refuse_in), in both modes, until a set-up makes
 * fewer mappings than k. Each failed set-up must answer CUA_ERROR_HOST_MEMORY, say that host
 * memory ran out (not name the device), and leave nothing behind: every address range it reserved
 * on the device freed again (a front door that tries again at each allocation would otherwise
 * leak a device's worth of address space per try), no physical handle, and the process's address
 * space as it was (the tables it mapped unmapped). */
#include <dlfcn.h>

#include "internal.h"
#include "testutil.h"

static test_captured_t messages;

static unsigned sweep(const char *text, unsigned long *refuse_in) {
    conf_t c;
    conf_defaults(&c);
    c.driver = DRIVER_SIM;
    EXPECT(conf_parse(text, &c) == 0, "bad configuration %s", text);
    sim_configure(&c);
    EXPECT(driver_sim_ops.init() == CUA_SUCCESS, "sim init");
    bool said = false; /* the first failure of a device's set-up is said, later ones after a success */
    for (unsigned long k = 1; k < 200; k++) {
        messages.len = 0;
        messages.text[0] = '\0';
        size_t space0 = test_address_space_bytes();
        uint64_t reserved0 = sim_calls(SIM_OP_VA_RESERVE), freed0 = sim_calls(SIM_OP_VA_FREE);
        cua_result err = CUA_SUCCESS;
        __atomic_store_n(refuse_in, k, __ATOMIC_RELEASE);
        heap_t *h = heap_create(0, &c, &driver_sim_ops, &err);
        unsigned long left = __atomic_exchange_n(refuse_in, 0, __ATOMIC_ACQ_REL);
        said = said || strstr(messages.text, "cannot set up the heap: host memory ran out");
        if (h) {
            EXPECT(said, "%s: no failed set-up said that host memory ran out", text);
            EXPECT(left > 0, "%s: mapping %lu of the set-up was refused, yet it succeeded", text, k);
            EXPECT(heap_check(h, stderr) == 0, "%s: the heap set up after %lu refusals is inconsistent", text, k - 1);
            heap_destroy(h);
            printf("%s: %lu set-ups refused, each left nothing behind\n", text, k - 1);
            return (unsigned)(k - 1);
        }
        EXPECT(left == 0, "%s: the set-up failed with mapping %lu not yet refused", text, k);
        EXPECT(err == CUA_ERROR_HOST_MEMORY, "%s, mapping %lu refused: set-up answered %d, want CUA_ERROR_HOST_MEMORY",
               text, k, err);
        EXPECT(!strstr(messages.text, "CUDA_ERROR"), "%s, mapping %lu refused: the message names a device error: %s",
               text, k, messages.text);
        uint64_t reserved = sim_calls(SIM_OP_VA_RESERVE) - reserved0, freed = sim_calls(SIM_OP_VA_FREE) - freed0;
        EXPECT(reserved == freed, "%s, mapping %lu refused: %llu address ranges reserved, %llu freed", text, k,
               (unsigned long long)reserved, (unsigned long long)freed);
        EXPECT(sim_live_handles(0) == 0 && sim_live_mappings(0) == 0, "%s, mapping %lu refused: device memory left",
               text, k);
        EXPECT(test_address_space_bytes() == space0,
               "%s, mapping %lu refused: %zu bytes of address space before the set-up, %zu after", text, k, space0,
               test_address_space_bytes());
    }
    EXPECT(0, "%s: the set-up never succeeded", text);
    return 0;
}

int main(void) {
    void *p = dlsym(RTLD_DEFAULT, "failing_mmap_refuse_in");
    EXPECT(p, "tests/failing_mmap.c is not preloaded");
    error_set_callback(test_capture, &messages);
    unsigned vmm = sweep("sim_memory_mb:1024", p);
    unsigned classic = sweep("sim_memory_mb:1024,expandable_segments:0", p);
    EXPECT(vmm >= 8 && classic >= 4, "only %u and %u set-up mappings were refused: is the sweep reaching them?", vmm,
           classic);
    error_set_callback(NULL, NULL);
    printf("test_setup_refused: all checks passed\n");
    return 0;
}
