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
 *   trace_sites_fixture W TRACE   A, but the activations enter the allocator through two of its
 *                                 functions (libcualloc.so+0x4321 and +0x4400): two stacks with
 *                                 the same frames once the allocator's are folded away, one site
 *   trace_sites_fixture L TRACE   A, but the activations come from model.py:42 called from two places
 *                                 (block, model.py:100 and model.py:200): two sites whose labels
 *                                 begin alike for 48 characters and differ at their end
 *   trace_sites_fixture U TRACE   A, with two more marks before "done": one in Latin-1 ("caf\xe9",
 *                                 not UTF-8), and one of 94 'x' then "\xc3\xa9\xc3\xa9 end" (UTF-8
 *                                 e-acute twice), whose first character straddles byte 95, and
 *                                 one of 62 'y' then "\xc3\xa9 end", whose e-acute straddles byte 63
 *   trace_sites_fixture J TRACE   200 call sites, each in its own module, whose files are
 *                                 SITES_JUNK_DIR/0 .. /199 (regular files, not ELF), and one
 *                                 smaller site in this program's own junk_sites_real(): the real
 *                                 site must be named however many of the others could not be read
 *   trace_sites_fixture K TRACE   MANY_LEAKS (40) call sites (leaks.py:1 .. 40, keep_1 .. keep_40),
 *                                 each keeping 1 MiB more every step over five steps: more leaks
 *                                 than the report makes room for beside its other diagnoses
 *   trace_sites_fixture M TRACE   a job without step marks: 20 steps of four 8 MiB activations
 *                                 (act.py:5, freed in the step) and 1 MiB more kept every step
 *                                 (losses.py:7, keep): 100 allocations in a file of two blocks
 *   trace_sites_fixture N TRACE   M with one "step 1" mark at its end
 *   trace_sites_fixture F TRACE   M's activations for 80 steps, and 1 MiB kept every step only in
 *                                 the last 20 (state.py:3, make_state): growth in the last quarter
 *   trace_sites_fixture E TRACE   M's activations for 80 steps, and 1 MiB kept every step only in
 *                                 the first 48 (losses.py:7): growth that stops before the last quarter
 *   trace_sites_fixture X TRACE   a device no sim device can be, for replay: device 0 with a
 *                                 granularity of 3 bytes, holding a block
 *   trace_sites_fixture Y TRACE   the same with device 70 (past cualloc's 64) and a granularity
 *                                 of 2 MiB
 * SITES_TORCH_PATH=FILE names the file recorded for libtorch_cuda.so (default a path that does not
 * exist here).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace_writer.h"

#define MIB (1ull << 20)

static tw_t w;
static uint64_t now = 1000000;
static uint64_t next_addr = 0x7e0000000000ull;
static uint64_t torch_base = 0x7f1000000000ull, cualloc_base = 0x7f0000000000ull;

static uint64_t tick(void) { return now += 1000; }

/* A call site: python frames (outermost first), then libtorch_cuda.so+off, then libcualloc.so at
 * cualloc_off. */
static uint32_t site_via(uint32_t parent_py, uint32_t pyf, uint64_t torch_off, uint64_t cualloc_off)
{
    uint32_t py = tw_stack(&w, parent_py, CUA_TRACE_FRAME_PYTHON, pyf);
    uint32_t nat = tw_stack(&w, py, CUA_TRACE_FRAME_NATIVE, torch_base + torch_off);
    return tw_stack(&w, nat, CUA_TRACE_FRAME_NATIVE, cualloc_base + cualloc_off);
}

static uint32_t site(uint32_t parent_py, uint32_t pyf, uint64_t torch_off)
{
    return site_via(parent_py, pyf, torch_off, 0x4321);
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

enum { JUNK_MODULES = 200 };

static __attribute__((noinline, used)) void junk_sites_real(void) { __asm__ volatile("" ::: "memory"); }

/* Variant J: a module per junk file, each holding 1 MiB from one frame in it, then 512 B from
 * junk_sites_real (at its address in this executable's file: the offset from the load base). */
static int junk_sites(const char *trace)
{
    const char *dir = getenv("SITES_JUNK_DIR");
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    Dl_info info;
    if (!dir || n <= 0 || !dladdr((void *)junk_sites_real, &info) || !info.dli_fbase) {
        fprintf(stderr, "trace_sites_fixture J: needs SITES_JUNK_DIR and its own path and load base\n");
        return 1;
    }
    exe[n] = 0;
    if (tw_open(&w, trace) != 0) {
        perror(trace);
        return 2;
    }
    tw_device(&w, 0, 16ull << 30, "sim device 0");
    tw_map(&w, tick(), 0, 0x7d0000000000ull, 512 * MIB, false);
    for (int i = 0; i < JUNK_MODULES; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d", dir, i);
        uint64_t base = 0x7f2000000000ull + (uint64_t)i * 0x1000000;
        tw_module(&w, base, base, base + 0x100000, path);
        alloc(MIB, tw_stack(&w, 0, CUA_TRACE_FRAME_NATIVE, base + 0x100));
    }
    uint64_t self_base = 0x7f6000000000ull;
    tw_module(&w, self_base, self_base, self_base + 0x10000000, exe);
    uint64_t off = (uint64_t)((char *)(void *)junk_sites_real - (char *)info.dli_fbase);
    alloc(512, tw_stack(&w, 0, CUA_TRACE_FRAME_NATIVE, self_base + off + 1));
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_sites_fixture: writing %s failed\n", trace);
        return 2;
    }
    return 0;
}

/* The start of the leak variants: device 0 of 16 GiB with 512 MiB mapped, and the Python frame
 * main (train.py:10) their sites are called from. False when the file cannot be written. */
static bool leaks_open(const char *trace, uint32_t *main_st)
{
    if (tw_open(&w, trace) != 0) {
        perror(trace);
        return false;
    }
    tw_device(&w, 0, 16ull << 30, "sim device 0");
    tw_map(&w, tick(), 0, 0x7d0000000000ull, 512 * MIB, false);
    *main_st = tw_stack(&w, 0, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 10, "main", "train.py"));
    return true;
}

enum { MANY_LEAKS = 40 };

/* Variant K: MANY_LEAKS call sites that each keep 1 MiB more every step. */
static int many_leaks(const char *trace)
{
    uint32_t main_st;
    if (!leaks_open(trace, &main_st))
        return 2;
    uint32_t sites[MANY_LEAKS];
    for (int i = 0; i < MANY_LEAKS; i++) {
        char fn[32];
        snprintf(fn, sizeof fn, "keep_%d", i + 1);
        sites[i] = tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, (uint64_t)i + 1, fn, "leaks.py"));
    }
    for (int step = 1; step <= 5; step++) {
        for (int i = 0; i < MANY_LEAKS; i++)
            alloc(MIB, sites[i]);
        char label[32];
        snprintf(label, sizeof label, "step %d", step);
        tw_mark(&w, tick(), label);
    }
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_sites_fixture: writing %s failed\n", trace);
        return 2;
    }
    return 0;
}

/* Variant M: a leak with no step mark to judge it by: only windows of allocations can show it.
 * N: the same, one step mark at its end. F: 80 steps, memory kept only in the last 20. E: 80 steps,
 * memory kept only in the first 48 (it stops growing well before the last quarter). */
static int leak_without_marks(const char *trace, char variant)
{
    uint32_t main_st;
    if (!leaks_open(trace, &main_st))
        return 2;
    uint32_t act = tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 5, "forward", "act.py"));
    uint32_t keep = variant == 'F' ? tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 3, "make_state", "state.py"))
                                   : tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 7, "keep", "losses.py"));
    int steps = variant == 'F' || variant == 'E' ? 80 : 20, keep_from = variant == 'F' ? 61 : 1;
    int keep_to = variant == 'E' ? 48 : steps;
    for (int step = 1; step <= steps; step++) {
        uint64_t a[4];
        for (int i = 0; i < 4; i++)
            a[i] = alloc(8 * MIB, act);
        if (step >= keep_from && step <= keep_to)
            alloc(MIB, keep);
        for (int i = 3; i >= 0; i--)
            tw_free(&w, tick(), 0, a[i], 8 * MIB);
    }
    if (variant == 'N')
        tw_mark(&w, tick(), "step 1");
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_sites_fixture: writing %s failed\n", trace);
        return 2;
    }
    return 0;
}

/* Variants X and Y: a device whose granularity is no power of two (device 0), or a device ordinal
 * past 63. */
static int odd_device(const char *trace, bool past_last)
{
    if (tw_open(&w, trace) != 0) {
        perror(trace);
        return 2;
    }
    uint32_t dev = past_last ? 70 : 0;
    tw_device_gran(&w, dev, 16ull << 30, past_last ? 2 * MIB : 3, "odd device");
    uint64_t st = tw_stack(&w, 0, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 1, "main", "train.py"));
    tw_alloc(&w, tick(), dev, 0x7e0000000000ull, MIB, MIB, (uint32_t)st);
    if (tw_close(&w, tick()) != 0) {
        fprintf(stderr, "trace_sites_fixture: writing %s failed\n", trace);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || strlen(argv[1]) != 1 || !strchr("ABGUJWLKMNFEXY", argv[1][0])) {
        fprintf(stderr, "usage: trace_sites_fixture A|B|G|U|J|W|L|K|M|N|F|E|X|Y TRACE\n");
        return 1;
    }
    if (argv[1][0] == 'X' || argv[1][0] == 'Y')
        return odd_device(argv[2], argv[1][0] == 'Y');
    if (argv[1][0] == 'J')
        return junk_sites(argv[2]);
    if (argv[1][0] == 'K')
        return many_leaks(argv[2]);
    if (argv[1][0] == 'M' || argv[1][0] == 'N' || argv[1][0] == 'F' || argv[1][0] == 'E')
        return leak_without_marks(argv[2], argv[1][0]);
    bool b = argv[1][0] == 'B', g = argv[1][0] == 'G', u = argv[1][0] == 'U', twins = argv[1][0] == 'W';
    bool callers = argv[1][0] == 'L';
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
    uint32_t f_forward = tw_pyframe(&w, 42, "forward", "model.py");
    uint32_t s_act = site(main_st, f_forward, 0x2000), s_act2 = s_act;
    if (twins)
        s_act2 = site_via(main_st, f_forward, 0x2000, 0x4400);
    if (callers) {
        uint32_t block1 = tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 100, "block", "model.py"));
        uint32_t block2 = tw_stack(&w, main_st, CUA_TRACE_FRAME_PYTHON, tw_pyframe(&w, 200, "block", "model.py"));
        s_act = site(block1, f_forward, 0x7000);
        s_act2 = site(block2, f_forward, 0x7000);
    }
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
