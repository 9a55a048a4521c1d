/* trace_sites_fixture.c — writes a small deterministic trace with chosen call sites (Python frames
 * over native frames of libtorch_cuda.so over the allocator's own frames in libcualloc.so), by
 * encoding records directly (tests/trace_writer.h), for allocview's call-site views: timeline,
 * folded, diff (tests/check_allocview_views.sh).
 *
 *   trace_sites_fixture A TRACE   three training steps: parameters, activations, gradients,
 *                                 optimizer state, a workspace
 *   trace_sites_fixture B TRACE   the same, plus one more call site (cache.py:remember) that keeps
 *                                 8 MiB per step; its stack ids and addresses differ from A's
 *   trace_sites_fixture G TRACE   A, but the activations come from one Python line (act.py:66,
 *                                 gelu) through two operators that allocate through one shared
 *                                 innermost frame, as PyTorch's operators do through create_out:
 *                                 two stacks that a call-site label cannot tell apart
 *   trace_sites_fixture U TRACE   A, with two more marks before "done": one in Latin-1 ("caf\xe9",
 *                                 not UTF-8), and one of 94 'x' then "\xc3\xa9\xc3\xa9 end" (UTF-8
 *                                 e-acute twice), whose first character straddles byte 95, and
 *                                 one of 62 'y' then "\xc3\xa9 end", whose e-acute straddles byte 63
 * SITES_TORCH_PATH=FILE names the file recorded for libtorch_cuda.so (default a path that does not
 * exist here).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_writer.h"

#define MIB (1ull << 20)

static tw_t w;
static uint64_t now = 1000000;
static uint64_t next_addr = 0x7e0000000000ull;
static uint64_t torch_base = 0x7f1000000000ull, cualloc_base = 0x7f0000000000ull;

static uint64_t tick(void) { return now += 1000; }

/* A call site: python frames (outermost first), then libtorch_cuda.so+off, then libcualloc.so. */
static uint32_t site(uint32_t parent_py, uint32_t pyf, uint64_t torch_off)
{
    uint32_t py = tw_stack(&w, parent_py, CUA_TRACE_FRAME_PYTHON, pyf);
    uint32_t nat = tw_stack(&w, py, CUA_TRACE_FRAME_NATIVE, torch_base + torch_off);
    return tw_stack(&w, nat, CUA_TRACE_FRAME_NATIVE, cualloc_base + 0x4321);
}

/* A call site of Python frame py through the operator at torch_off, which allocates through a
 * frame every operator shares (libtorch_cuda.so+0x7000). */
static uint32_t op_site(uint32_t py, uint64_t torch_off)
{
    uint32_t op = tw_stack(&w, py, CUA_TRACE_FRAME_NATIVE, torch_base + torch_off);
    uint32_t out = tw_stack(&w, op, CUA_TRACE_FRAME_NATIVE, torch_base + 0x7000);
    return tw_stack(&w, out, CUA_TRACE_FRAME_NATIVE, cualloc_base + 0x4321);
}

static uint64_t alloc(uint64_t size, uint32_t stack)
{
    uint64_t a = next_addr;
    next_addr += size;
    tw_alloc(&w, tick(), 0, a, size, size - 100, stack);
    return a;
}

int main(int argc, char **argv)
{
    if (argc != 3 || strlen(argv[1]) != 1 || !strchr("ABGU", argv[1][0])) {
        fprintf(stderr, "usage: trace_sites_fixture A|B|G|U TRACE\n");
        return 1;
    }
    bool b = argv[1][0] == 'B', g = argv[1][0] == 'G', u = argv[1][0] == 'U';
    if (tw_open(&w, argv[2]) != 0) {
        perror(argv[2]);
        return 2;
    }
    if (b) { /* other addresses and load addresses than A's: only module+offset is the same */
        next_addr += 0x10000000ull;
        torch_base += 0x2000000000ull;
        cualloc_base += 0x5000000000ull;
    }
    tw_device(&w, 0, 16ull << 30, "sim device 0");
    tw_module(&w, cualloc_base, cualloc_base, cualloc_base + 0x100000, "/opt/cualloc/lib/libcualloc.so");
    /* SITES_TORCH_PATH: the file the trace says libtorch_cuda.so was (a test of what allocview
     * opens: a FIFO there must not make it wait). */
    const char *torch_path = getenv("SITES_TORCH_PATH");
    tw_module(&w, torch_base, torch_base, torch_base + 0x1000000,
              torch_path ? torch_path : "/venv/torch/lib/libtorch_cuda.so");
    uint32_t f_main = tw_pyframe(&w, 10, "main", "train.py");
    uint32_t main_st = tw_stack(&w, 0, CUA_TRACE_FRAME_PYTHON, f_main);
    if (b) /* an unrelated stack first: B's stack ids are all shifted */
        tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 3, "warmup", "train.py"));
    uint32_t s_param = site(main_st, tw_pyframe(&w, 21, "__init__", "model.py"), 0x1000);
    uint32_t s_act = site(main_st, tw_pyframe(&w, 42, "forward", "model.py"), 0x2000), s_act2 = s_act;
    if (g) {
        uint32_t gelu = tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 66, "gelu", "act.py"));
        s_act = op_site(gelu, 0x2100);  /* mul */
        s_act2 = op_site(gelu, 0x2200); /* tanh */
    }
    uint32_t s_grad = site(main_st, tw_pyframe(&w, 57, "backward", "model.py"), 0x3000);
    uint32_t s_opt = site(main_st, tw_pyframe(&w, 120, "step", "optim.py"), 0x4000);
    uint32_t s_ws = site(main_st, tw_pyframe(&w, 7, "workspace", "kernels.py"), 0x5000);
    uint32_t s_cache = b ? site(main_st, tw_pyframe(&w, 9, "remember", "cache.py"), 0x6000) : 0;

    tw_map(&w, tick(), 0, 0x7d0000000000ull, 512 * MIB, false);
    uint64_t params[4];
    for (int i = 0; i < 4; i++)
        params[i] = alloc(16 * MIB, s_param);
    uint64_t opt[4] = {0};
    for (int step = 1; step <= 3; step++) {
        char label[32];
        snprintf(label, sizeof label, "step %d", step);
        tw_mark(&w, tick(), label);
        uint64_t act[6], grad[4];
        for (int i = 0; i < 6; i++)
            act[i] = alloc((4 + (uint64_t)i) * MIB, i % 2 ? s_act2 : s_act);
        uint64_t ws = alloc(2 * MIB, s_ws);
        if (s_cache)
            alloc(8 * MIB, s_cache); /* kept: grows step by step */
        for (int i = 0; i < 4; i++)
            grad[i] = alloc(16 * MIB, s_grad);
        for (int i = 5; i >= 0; i--)
            tw_free(&w, tick(), 0, act[i], (4 + (uint64_t)i) * MIB);
        tw_free(&w, tick(), 0, ws, 2 * MIB);
        if (step == 1)
            for (int i = 0; i < 4; i++)
                opt[i] = alloc(32 * MIB, s_opt);
        for (int i = 0; i < 4; i++)
            tw_free(&w, tick(), 0, grad[i], 16 * MIB);
    }
    if (u) {
        char label[128];
        memset(label, 'x', 94);
        snprintf(label + 94, sizeof label - 94, "\xc3\xa9\xc3\xa9 end");
        tw_mark(&w, tick(), "caf\xe9");
        tw_mark(&w, tick(), label);
        memset(label, 'y', 62);
        snprintf(label + 62, sizeof label - 62, "\xc3\xa9 end");
        tw_mark(&w, tick(), label);
    }
    tw_mark(&w, tick(), "done");
    for (int i = 0; i < 4; i++) {
        tw_free(&w, tick(), 0, opt[i], 32 * MIB);
        tw_free(&w, tick(), 0, params[i], 16 * MIB);
    }
    tw_map(&w, tick(), 0, 0x7d0000000000ull, 512 * MIB, true);
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_sites_fixture: writing %s failed\n", argv[2]);
        return 2;
    }
    return 0;
}
