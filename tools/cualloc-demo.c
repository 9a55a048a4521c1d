/* cualloc-demo — the project's "main job": a transformer training loop (GPT-2-small-like shapes)
 * whose every tensor is allocated with cualloc_malloc and freed with cualloc_free, on the sim device
 * by default (no GPU needed) or on a real GPU with CUALLOC_CONF=driver:cuda. It is a black-box user
 * of include/cualloc.h: it never touches the memory and links only libcualloc.so.
 *
 * The workload (per step, batch B, sequence length T drawn uniformly from [128, 1024]):
 *   - parameters (bf16) allocated once before the first step;
 *   - forward: embeddings, then per layer LayerNorm, QKV, attention scores B*heads*T*T (scaled,
 *     masked, softmax, dropout — the intermediate copies freed as soon as the next exists), the
 *     output projection, LayerNorm, MLP 4*hidden with GELU, residuals; then the final LayerNorm,
 *     the logits B*T*vocab and an fp32 log-softmax for the loss;
 *   - backward in reverse, freeing each saved activation once its gradient is computed, with
 *     gradient temporaries allocated and freed on the way; parameter gradients are allocated when
 *     first produced (first backward) and kept (zero_grad(set_to_none=False)); later backwards
 *     allocate a temporary per gradient and accumulate it;
 *   - AdamW: two fp32 state tensors per parameter, created at the first optimizer step (every
 *     later step carries them: 0.93 GiB), plus an fp32 temporary per parameter during the update;
 *   - a "step N" mark after each step's update (cualloc_mark; recorded when tracing).
 *
 * --min-fit finds by bisection the smallest sim_memory_mb at which the whole run completes, by
 * re-executing itself (--quiet --json) per trial, for each configuration given with --conf.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cualloc.h"
#include "min_fit_search.h"

#define MIB ((size_t)1 << 20)
#define DEFAULT_SIM_MB 16384
#define MAX_CONFS 16

/* ------------------------------------------------------------------ model shape */

enum { N_LAYER = 12, N_HEAD = 12, HIDDEN = 768, VOCAB = 50257, MAX_T = 1024, MIN_T = 128 };
#define BF16 2u
#define FP32 4u

/* Parameter indices: global ones, then PER_LAYER per layer. */
enum { P_WTE, P_WPE, P_LNF_W, P_LNF_B, P_GLOBAL };
enum {
    L_LN1_W, L_LN1_B, L_ATTN_W, L_ATTN_B, L_APROJ_W, L_APROJ_B,
    L_LN2_W, L_LN2_B, L_FC_W, L_FC_B, L_MPROJ_W, L_MPROJ_B, PER_LAYER
};
#define N_PARAMS (P_GLOBAL + N_LAYER * PER_LAYER)
#define LP(l, i) (P_GLOBAL + (l) * PER_LAYER + (i))

static const char *const global_param_names[P_GLOBAL] = {"wte", "wpe", "ln_f.weight", "ln_f.bias"};
static const char *const layer_param_names[PER_LAYER] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias"};

static size_t param_numel(int p) {
    switch (p) {
    case P_WTE: return (size_t)VOCAB * HIDDEN;
    case P_WPE: return (size_t)MAX_T * HIDDEN;
    case P_LNF_W: case P_LNF_B: return HIDDEN;
    default: break;
    }
    switch ((p - P_GLOBAL) % PER_LAYER) {
    case L_ATTN_W: return (size_t)HIDDEN * 3 * HIDDEN;
    case L_ATTN_B: return 3 * HIDDEN;
    case L_APROJ_W: return (size_t)HIDDEN * HIDDEN;
    case L_FC_W: case L_MPROJ_W: return (size_t)HIDDEN * 4 * HIDDEN;
    case L_FC_B: return 4 * HIDDEN;
    default: return HIDDEN; /* LayerNorm weights and biases, c_proj biases */
    }
}

/* "<prefix> wte", "<prefix> h.3.mlp.c_fc.weight", ... */
static void param_name(const char *prefix, int p, char *buf, size_t len) {
    if (p < P_GLOBAL)
        snprintf(buf, len, "%s %s", prefix, global_param_names[p]);
    else
        snprintf(buf, len, "%s h.%d.%s", prefix, (p - P_GLOBAL) / PER_LAYER,
                 layer_param_names[(p - P_GLOBAL) % PER_LAYER]);
}

/* ------------------------------------------------------------------ options */

typedef struct opts_s {
    int steps, batch, device;
    uint64_t seed;
    size_t memory_mb;
    bool json, quiet, min_fit, verbose;
    const char *confs[MAX_CONFS];
    int nconfs;
    int scan;      /* min-fit: sizes above the minimum also tried */
    const char *min_fit_only; /* the last option given that only --min-fit uses, or NULL */
} opts_t;

static void usage(FILE *out) {
    fprintf(out,
            "usage: cualloc-demo [options]\n"
            "A GPT-2-small-like training loop (12 layers, hidden 768, 12 heads, vocab 50257, bf16\n"
            "parameters, AdamW) run through cualloc_malloc/cualloc_free.\n"
            "\n"
            "Runs on the sim device unless CUALLOC_CONF names a driver: when it has no driver: key,\n"
            "CUALLOC_CONF becomes driver:sim,sim_memory_mb:N followed by the user's keys (which win).\n"
            "Set CUALLOC_CONF=driver:cuda to run on a real GPU.\n"
            "\n"
            "options:\n"
            "  --steps N        training steps (default 20)\n"
            "  --batch B        batch size (default 8)\n"
            "  --seed S         seed of the sequence-length draws (default 1)\n"
            "  --device D       device ordinal (default 0)\n"
            "  --memory-mb N    sim device memory when the demo picks the sim (default %d)\n"
            "  --json           machine-readable output (one JSON object)\n"
            "  --quiet          no per-step lines, only the summary\n"
            "  --min-fit        find by bisection the smallest sim_memory_mb the run completes in,\n"
            "                   once per --conf configuration; prints min-fit / peak requested\n"
            "  --conf KEYS      (with --min-fit, repeatable) extra CUALLOC_CONF keys of one\n"
            "                   configuration; default: \"\" and \"expandable_segments:0\". One with a\n"
            "                   key cualloc does not take as written is refused (status 2)\n"
            "  --scan K         (with --min-fit) also try the K sizes just above the minimum, to\n"
            "                   show whether completion is monotone there (default 8)\n"
            "  --verbose        (with --min-fit) show the trials and the children's stderr\n"
            "  --help           this text\n"
            "\n"
            "exit status: 0 when the run completed, 1 when an allocation failed, 2 on usage errors.\n",
            DEFAULT_SIM_MB);
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    uint64_t v;
    if (!parse_u64(s, &v) || v < (uint64_t)lo || v > (uint64_t)hi) return false;
    *out = (int)v;
    return true;
}

/* Says that option `opt` needs `want` and got v (NULL: no value). */
static void say_bad_value(const char *opt, const char *want, const char *v) {
    if (v) fprintf(stderr, "cualloc-demo: %s needs %s, got '%s'\n", opt, want, v);
    else fprintf(stderr, "cualloc-demo: %s needs %s, got nothing\n", opt, want);
}

/* The option's value into *out; false (said) when it is missing or not lo .. hi. */
static bool parse_int_opt(const char *opt, const char *v, int lo, int hi, int *out) {
    if (parse_int(v, lo, hi, out)) return true;
    char want[64];
    snprintf(want, sizeof want, "a whole number from %d to %d", lo, hi);
    say_bad_value(opt, want, v);
    return false;
}

/* rc, or 2 when standard output could not be written (a full disk): said, not hidden behind 0. */
static int stdout_written(int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "cualloc-demo: writing standard output failed\n");
    return rc ? rc : 2;
}

static int parse_opts(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.steps = 20, .batch = 8, .device = 0, .seed = 1, .memory_mb = DEFAULT_SIM_MB, .scan = 8};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        uint64_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(stdout_written(0));
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            o->quiet = true;
        } else if (!strcmp(a, "--min-fit")) {
            o->min_fit = true;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            o->verbose = true;
            o->min_fit_only = a;
        } else if (!strcmp(a, "--steps")) {
            ok = parse_int_opt(a, v, 1, 1000000, &o->steps), i++;
        } else if (!strcmp(a, "--batch")) {
            ok = parse_int_opt(a, v, 1, 4096, &o->batch), i++;
        } else if (!strcmp(a, "--device")) {
            ok = parse_int_opt(a, v, 0, 63, &o->device), i++;
        } else if (!strcmp(a, "--scan")) {
            ok = parse_int_opt(a, v, 0, 1000, &o->scan), i++;
            o->min_fit_only = a;
        } else if (!strcmp(a, "--seed")) {
            ok = parse_u64(v, &o->seed), i++;
            if (!ok) say_bad_value(a, "a whole number from 0 to 2^64-1", v);
        } else if (!strcmp(a, "--memory-mb")) {
            ok = parse_u64(v, &u) && u >= 1 && u <= ((uint64_t)1 << 30), i++;
            if (ok) o->memory_mb = (size_t)u;
            else say_bad_value(a, "a whole number of MiB from 1 to 2^30", v);
        } else if (!strcmp(a, "--conf")) {
            ok = v != NULL && o->nconfs < MAX_CONFS, i++;
            if (ok) o->confs[o->nconfs++] = v;
            else if (v) fprintf(stderr, "cualloc-demo: at most %d --conf options\n", MAX_CONFS);
            else say_bad_value(a, "CUALLOC_CONF keys (\"\" for none)", v);
            o->min_fit_only = a;
        } else {
            fprintf(stderr, "cualloc-demo: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) return 2; /* (said) */
    }
    return 0;
}

/* ------------------------------------------------------------------ small helpers */

static const char *human(size_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%zu B", bytes);
        return buf;
    }
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

/* splitmix64 */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Calls fn(key, key_len, item, item_len) for each item of a CUALLOC_CONF string, splitting on
 * commas outside [...] lists (roundup_power2_divisions:[256:1,512:2]). */
typedef void (*conf_item_fn)(const char *key, size_t klen, const char *item, size_t ilen, void *arg);
static void conf_foreach(const char *s, conf_item_fn fn, void *arg) {
    if (!s) return;
    while (*s) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        const char *start = s;
        int depth = 0;
        while (*s && (depth > 0 || *s != ',')) {
            if (*s == '[') depth++;
            else if (*s == ']' && depth > 0) depth--;
            s++;
        }
        size_t ilen = (size_t)(s - start);
        while (ilen && start[ilen - 1] == ' ') ilen--;
        size_t klen = 0;
        while (klen < ilen && start[klen] != ':' && start[klen] != ' ') klen++;
        fn(start, klen, start, ilen, arg);
    }
}

static bool key_is(const char *key, size_t klen, const char *name) {
    return klen == strlen(name) && strncmp(key, name, klen) == 0;
}

static void find_driver(const char *key, size_t klen, const char *item, size_t ilen, void *arg) {
    (void)item, (void)ilen;
    if (key_is(key, klen, "driver")) *(bool *)arg = true;
}

typedef struct strbuf_s { char *buf; size_t len, cap; } strbuf_t;

static void sb_add(strbuf_t *b, const char *s, size_t n) {
    if (b->len + n + 2 > b->cap) {
        size_t ncap = (b->len + n + 2) * 2;
        char *p = realloc(b->buf, ncap);
        if (!p) {
            fprintf(stderr, "cualloc-demo: out of host memory\n");
            exit(2);
        }
        b->buf = p, b->cap = ncap;
    }
    if (b->len) b->buf[b->len++] = ',';
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

/* Copies items except driver and sim_memory_mb (the min-fit trial sets those). */
static void copy_user_item(const char *key, size_t klen, const char *item, size_t ilen, void *arg) {
    if (key_is(key, klen, "driver") || key_is(key, klen, "sim_memory_mb")) return;
    sb_add(arg, item, ilen);
}

/* ------------------------------------------------------------------ the training run */

typedef struct tensor_s { void *p; size_t bytes; } tensor_t;

typedef struct layer_act_s {
    tensor_t ln1_out, ln1_mean, ln1_rstd, qkv, probs, att_mask, att_drop, y, resid1;
    tensor_t ln2_out, ln2_mean, ln2_rstd, fc, gelu, mlp_mask, out;
} layer_act_t;

typedef struct run_s {
    const opts_t *o;
    int step;             /* 1-based; 0 = set-up */
    const char *phase;
    size_t B, T;
    tensor_t params[N_PARAMS], grads[N_PARAMS], exp_avg[N_PARAMS], exp_avg_sq[N_PARAMS];
    layer_act_t act[N_LAYER];
    /* failure */
    bool failed;
    char failed_tensor[96];
    size_t failed_bytes;
    int failed_step;
    /* the demo's own accounting, and per-step peaks sampled after every allocation */
    size_t live_requested;
    size_t step_peak_req, step_peak_alloc, step_peak_resv;
    uint64_t n_alloc_calls, n_free_calls;
    size_t max_T;
    unsigned accounting_mismatches;
} run_t;

static void json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20) fprintf(out, "\\u%04x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

static void get_stats(const run_t *r, cualloc_stats *s) {
    if (cualloc_get_stats(r->o->device, s) != 0) memset(s, 0, sizeof *s);
}

static void print_summary(run_t *r, int heap_violations, size_t leftover);

static tensor_t talloc(run_t *r, const char *what, int layer, size_t bytes) {
    tensor_t t = {cualloc_malloc(bytes, r->o->device, NULL), bytes};
    if (!t.p) {
        r->failed = true;
        r->failed_step = r->step;
        r->failed_bytes = bytes;
        if (layer >= 0)
            snprintf(r->failed_tensor, sizeof r->failed_tensor, "h.%d %s", layer, what);
        else
            snprintf(r->failed_tensor, sizeof r->failed_tensor, "%s", what);
        char hb[32];
        fprintf(stderr, "cualloc-demo: step %d (%s, T=%zu): allocation of %s (%s) failed\n", r->step, r->phase,
                r->T, r->failed_tensor, human(bytes, hb, sizeof hb));
        print_summary(r, -1, 0);
        exit(1);
    }
    r->n_alloc_calls++;
    r->live_requested += bytes;
    cualloc_stats s;
    get_stats(r, &s);
    if (r->live_requested > r->step_peak_req) r->step_peak_req = r->live_requested;
    if (s.allocated_bytes > r->step_peak_alloc) r->step_peak_alloc = s.allocated_bytes;
    if (s.reserved_bytes > r->step_peak_resv) r->step_peak_resv = s.reserved_bytes;
    return t;
}

static void tfree(run_t *r, tensor_t *t) {
    if (!t->p) return;
    cualloc_free(t->p, NULL);
    r->n_free_calls++;
    r->live_requested -= t->bytes;
    t->p = NULL;
    t->bytes = 0;
}

/* The gradient of parameter p has been computed: the first time it becomes .grad (kept); later
 * it is a temporary accumulated into .grad and freed. */
static void grad_produced(run_t *r, int p) {
    size_t bytes = param_numel(p) * BF16;
    char name[96];
    if (!r->grads[p].p) {
        param_name("grad", p, name, sizeof name);
        r->grads[p] = talloc(r, name, -1, bytes);
    } else {
        param_name("grad (to accumulate)", p, name, sizeof name);
        tensor_t tmp = talloc(r, name, -1, bytes);
        tfree(r, &tmp);
    }
}

static void alloc_params(run_t *r) {
    char name[96];
    r->phase = "parameters";
    for (int p = 0; p < N_PARAMS; p++) {
        param_name("param", p, name, sizeof name);
        r->params[p] = talloc(r, name, -1, param_numel(p) * BF16);
    }
}

/* Forward of one transformer block: x (the residual stream, B*T*H) -> act->out. */
static void block_forward(run_t *r, int l) {
    layer_act_t *a = &r->act[l];
    const size_t B = r->B, T = r->T, H = HIDDEN, NH = N_HEAD;
    const size_t BTH = B * T * H * BF16, BT4 = B * T * FP32, ATT = B * NH * T * T * BF16, ATT_MASK = B * NH * T * T;
    a->ln1_out = talloc(r, "ln_1 output", l, BTH);
    a->ln1_mean = talloc(r, "ln_1 mean", l, BT4);
    a->ln1_rstd = talloc(r, "ln_1 rstd", l, BT4);
    a->qkv = talloc(r, "attn qkv", l, 3 * BTH);
    tensor_t scores = talloc(r, "attn scores q@k^T", l, ATT);
    tensor_t scaled = talloc(r, "attn scores scaled", l, ATT);
    tfree(r, &scores);
    tensor_t masked = talloc(r, "attn scores masked", l, ATT);
    tfree(r, &scaled);
    a->probs = talloc(r, "attn softmax", l, ATT);
    tfree(r, &masked);
    a->att_mask = talloc(r, "attn dropout mask", l, ATT_MASK);
    a->att_drop = talloc(r, "attn dropout output", l, ATT);
    tensor_t yh = talloc(r, "attn probs@v", l, BTH);
    a->y = talloc(r, "attn output (contiguous)", l, BTH);
    tfree(r, &yh);
    tensor_t proj = talloc(r, "attn c_proj output", l, BTH);
    a->resid1 = talloc(r, "residual 1", l, BTH);
    tfree(r, &proj);
    a->ln2_out = talloc(r, "ln_2 output", l, BTH);
    a->ln2_mean = talloc(r, "ln_2 mean", l, BT4);
    a->ln2_rstd = talloc(r, "ln_2 rstd", l, BT4);
    a->fc = talloc(r, "mlp c_fc output", l, 4 * BTH);
    a->gelu = talloc(r, "mlp gelu output", l, 4 * BTH);
    tensor_t mproj = talloc(r, "mlp c_proj output", l, BTH);
    a->mlp_mask = talloc(r, "mlp dropout mask", l, B * T * H);
    a->out = talloc(r, "residual 2 (block output)", l, BTH);
    tfree(r, &mproj);
}

/* Backward of one block: takes the gradient of its output (*dx, freed) and returns the gradient of
 * its input; frees the block's saved activations and its input activation *x. */
static tensor_t block_backward(run_t *r, int l, tensor_t *dx, tensor_t *x) {
    layer_act_t *a = &r->act[l];
    const size_t B = r->B, T = r->T, H = HIDDEN, NH = N_HEAD;
    const size_t BTH = B * T * H * BF16, ATT = B * NH * T * T * BF16;
    /* out = resid1 + dropout(c_proj(gelu(c_fc(ln_2(resid1))))) */
    tensor_t d_mproj = talloc(r, "grad mlp c_proj output", l, BTH);
    tfree(r, &a->mlp_mask);
    tensor_t d_gelu = talloc(r, "grad mlp gelu output", l, 4 * BTH);
    grad_produced(r, LP(l, L_MPROJ_W));
    grad_produced(r, LP(l, L_MPROJ_B));
    tfree(r, &d_mproj);
    tfree(r, &a->gelu);
    tensor_t d_fc = talloc(r, "grad mlp c_fc output", l, 4 * BTH);
    tfree(r, &d_gelu);
    tensor_t d_ln2 = talloc(r, "grad ln_2 output", l, BTH);
    grad_produced(r, LP(l, L_FC_W));
    grad_produced(r, LP(l, L_FC_B));
    tfree(r, &d_fc);
    tfree(r, &a->fc);
    tensor_t part = talloc(r, "grad ln_2 input", l, BTH);
    grad_produced(r, LP(l, L_LN2_W));
    grad_produced(r, LP(l, L_LN2_B));
    tfree(r, &d_ln2);
    tfree(r, &a->ln2_out);
    tfree(r, &a->ln2_rstd);
    tfree(r, &a->ln2_mean);
    tensor_t d_resid1 = talloc(r, "grad residual 1", l, BTH);
    tfree(r, &part);
    tfree(r, dx);
    /* resid1 = x + dropout(c_proj(attention(ln_1(x)))) */
    tensor_t d_y = talloc(r, "grad attn output", l, BTH);
    grad_produced(r, LP(l, L_APROJ_W));
    grad_produced(r, LP(l, L_APROJ_B));
    tfree(r, &a->y);
    tensor_t d_yh = talloc(r, "grad attn probs@v", l, BTH);
    tfree(r, &d_y);
    tensor_t d_drop = talloc(r, "grad attn dropout output", l, ATT);
    tensor_t d_v = talloc(r, "grad v", l, BTH);
    tfree(r, &d_yh);
    tfree(r, &a->att_drop);
    tensor_t d_probs = talloc(r, "grad attn softmax", l, ATT);
    tfree(r, &d_drop);
    tfree(r, &a->att_mask);
    tensor_t d_scores = talloc(r, "grad attn scores", l, ATT);
    tfree(r, &d_probs);
    tfree(r, &a->probs);
    tensor_t d_q = talloc(r, "grad q", l, BTH);
    tensor_t d_k = talloc(r, "grad k", l, BTH);
    tfree(r, &d_scores);
    tensor_t d_qkv = talloc(r, "grad qkv", l, 3 * BTH);
    tfree(r, &d_q);
    tfree(r, &d_k);
    tfree(r, &d_v);
    tfree(r, &a->qkv);
    tensor_t d_ln1 = talloc(r, "grad ln_1 output", l, BTH);
    grad_produced(r, LP(l, L_ATTN_W));
    grad_produced(r, LP(l, L_ATTN_B));
    tfree(r, &d_qkv);
    tfree(r, &a->ln1_out);
    tensor_t part1 = talloc(r, "grad ln_1 input", l, BTH);
    grad_produced(r, LP(l, L_LN1_W));
    grad_produced(r, LP(l, L_LN1_B));
    tfree(r, &d_ln1);
    tfree(r, &a->ln1_rstd);
    tfree(r, &a->ln1_mean);
    tensor_t d_x = talloc(r, "grad block input", l, BTH);
    tfree(r, &part1);
    tfree(r, &d_resid1);
    tfree(r, &a->resid1);
    tfree(r, x);
    return d_x;
}

static void train_step(run_t *r) {
    const size_t B = r->B, T = r->T, H = HIDDEN, V = VOCAB;
    const size_t BTH = B * T * H * BF16, BT4 = B * T * FP32, BTV = B * T * V;
    /* ---- forward */
    r->phase = "forward";
    tensor_t idx = talloc(r, "input ids", -1, B * T * 8);
    tensor_t targets = talloc(r, "targets", -1, B * T * 8);
    tensor_t tok = talloc(r, "token embeddings", -1, BTH);
    tensor_t pos = talloc(r, "position embeddings", -1, T * H * BF16);
    tensor_t x0 = talloc(r, "embedding sum", -1, BTH);
    tfree(r, &tok);
    tfree(r, &pos);
    for (int l = 0; l < N_LAYER; l++) block_forward(r, l);
    tensor_t lnf = talloc(r, "ln_f output", -1, BTH);
    tensor_t lnf_mean = talloc(r, "ln_f mean", -1, BT4);
    tensor_t lnf_rstd = talloc(r, "ln_f rstd", -1, BT4);
    tensor_t logits = talloc(r, "logits", -1, BTV * BF16);
    tensor_t logits_f = talloc(r, "logits fp32", -1, BTV * FP32);
    tfree(r, &logits);
    tensor_t logp = talloc(r, "log_softmax", -1, BTV * FP32);
    tfree(r, &logits_f);
    tensor_t loss = talloc(r, "loss", -1, FP32);
    /* ---- backward */
    r->phase = "backward";
    tensor_t d_logp = talloc(r, "grad log_softmax", -1, BTV * FP32);
    tensor_t d_logits_f = talloc(r, "grad logits fp32", -1, BTV * FP32);
    tfree(r, &d_logp);
    tfree(r, &logp);
    tensor_t d_logits = talloc(r, "grad logits", -1, BTV * BF16);
    tfree(r, &d_logits_f);
    tensor_t d_lnf = talloc(r, "grad ln_f output", -1, BTH);
    grad_produced(r, P_WTE); /* lm_head is tied to wte */
    tfree(r, &d_logits);
    tfree(r, &lnf);
    tensor_t dx = talloc(r, "grad ln_f input", -1, BTH);
    grad_produced(r, P_LNF_W);
    grad_produced(r, P_LNF_B);
    tfree(r, &d_lnf);
    tfree(r, &lnf_rstd);
    tfree(r, &lnf_mean);
    tfree(r, &r->act[N_LAYER - 1].out); /* ln_f's input */
    /* A block's input is the previous block's output (or the embeddings): freed by its backward. */
    for (int l = N_LAYER - 1; l >= 0; l--) {
        tensor_t d_in = block_backward(r, l, &dx, l > 0 ? &r->act[l - 1].out : &x0);
        dx = d_in;
    }
    grad_produced(r, P_WTE);  /* embedding lookup: accumulated into the tied weight's grad */
    grad_produced(r, P_WPE);
    tfree(r, &dx);
    /* ---- AdamW */
    r->phase = "optimizer";
    char name[96];
    for (int p = 0; p < N_PARAMS; p++) {
        size_t n = param_numel(p);
        if (!r->exp_avg[p].p) {
            param_name("AdamW exp_avg", p, name, sizeof name);
            r->exp_avg[p] = talloc(r, name, -1, n * FP32);
            param_name("AdamW exp_avg_sq", p, name, sizeof name);
            r->exp_avg_sq[p] = talloc(r, name, -1, n * FP32);
        }
        param_name("AdamW fp32 update of", p, name, sizeof name);
        tensor_t upd = talloc(r, name, -1, n * FP32);
        tfree(r, &upd);
    }
    tfree(r, &loss);
    tfree(r, &targets);
    tfree(r, &idx);
}

/* ------------------------------------------------------------------ output */

static bool g_json_log_open; /* JSON: the step_log array is open */

static void print_header(const run_t *r, const char *conf) {
    const opts_t *o = r->o;
    size_t nparams = 0;
    for (int p = 0; p < N_PARAMS; p++) nparams += param_numel(p);
    if (o->json) {
        printf("{\"conf\":");
        json_string(stdout, conf);
        printf(",\"device\":%d,\"steps\":%d,\"batch\":%d,\"seed\":%" PRIu64 ",\"n_params\":%zu,\"param_bytes\":%zu",
               o->device, o->steps, o->batch, o->seed, nparams, nparams * BF16);
        if (!o->quiet) {
            printf(",\"step_log\":[");
            g_json_log_open = true;
        }
        fflush(stdout);
        return;
    }
    char b1[32];
    printf("cualloc-demo: GPT-2-small-like training, %zu parameters (%s bf16), %d layers, hidden %d, "
           "%d heads, vocab %d\n",
           nparams, human(nparams * BF16, b1, sizeof b1), N_LAYER, HIDDEN, N_HEAD, VOCAB);
    printf("  batch %d, seq len uniform in [%d, %d], %d steps, seed %" PRIu64 ", device %d\n", o->batch, MIN_T,
           MAX_T, o->steps, o->seed, o->device);
    printf("  CUALLOC_CONF=%s\n", conf ? conf : "");
    if (!o->quiet)
        printf("%5s %5s  %23s  %23s  %23s  %10s\n", "step", "T", "requested cur / peak", "allocated cur / peak",
               "reserved cur / peak", "step peak");
    fflush(stdout);
}

/* The library's gauges must agree with what the demo itself asked for and still holds. */
static void check_accounting(run_t *r, const cualloc_stats *s) {
    if (s->requested_bytes != r->live_requested || s->num_allocs != r->n_alloc_calls ||
        s->num_frees != r->n_free_calls) {
        r->accounting_mismatches++;
        if (r->accounting_mismatches <= 5)
            fprintf(stderr,
                    "cualloc-demo: step %d: statistics disagree with the demo's own accounting: requested %zu "
                    "(demo: %zu), num_allocs %" PRIu64 " (demo: %" PRIu64 "), num_frees %" PRIu64 " (demo: %" PRIu64 ")\n",
                    r->step, s->requested_bytes, r->live_requested, s->num_allocs, r->n_alloc_calls, s->num_frees,
                    r->n_free_calls);
    }
}

static void print_step(run_t *r) {
    cualloc_stats s;
    get_stats(r, &s);
    check_accounting(r, &s);
    if (r->o->quiet) return;
    if (r->o->json) {
        printf("%s{\"step\":%d,\"seq_len\":%zu,\"requested\":%zu,\"requested_peak\":%zu,\"allocated\":%zu,"
               "\"allocated_peak\":%zu,\"reserved\":%zu,\"reserved_peak\":%zu,\"step_peak_requested\":%zu,"
               "\"step_peak_allocated\":%zu,\"step_peak_reserved\":%zu,\"num_maps\":%" PRIu64
               ",\"num_unmaps\":%" PRIu64 "}",
               r->step > 1 ? "," : "", r->step, r->T, s.requested_bytes, s.requested_peak, s.allocated_bytes,
               s.allocated_peak, s.reserved_bytes, s.reserved_peak, r->step_peak_req, r->step_peak_alloc,
               r->step_peak_resv, s.num_maps, s.num_unmaps);
    } else {
        char a[6][32], sp[32];
        printf("%5d %5zu  %10s / %10s  %10s / %10s  %10s / %10s  %10s\n", r->step, r->T,
               human(s.requested_bytes, a[0], 32), human(s.requested_peak, a[1], 32),
               human(s.allocated_bytes, a[2], 32), human(s.allocated_peak, a[3], 32),
               human(s.reserved_bytes, a[4], 32), human(s.reserved_peak, a[5], 32),
               human(r->step_peak_req, sp, sizeof sp));
    }
    fflush(stdout);
}

/* heap_violations < 0: not checked (the run failed). */
static void print_summary(run_t *r, int heap_violations, size_t leftover) {
    cualloc_stats s;
    get_stats(r, &s);
    double util = s.reserved_peak ? (double)s.allocated_peak / (double)s.reserved_peak : 0.0;
    bool completed = !r->failed;
    int done = completed ? r->o->steps : r->failed_step - 1;
    if (done < 0) done = 0;
    if (r->o->json) {
        if (g_json_log_open) printf("]");
        g_json_log_open = false;
        printf(",\"completed\":%s,\"steps_completed\":%d,", completed ? "true" : "false", done);
        if (completed) {
            printf("\"failed_step\":null,\"failed_phase\":null,\"failed_tensor\":null,\"failed_bytes\":null,");
        } else {
            printf("\"failed_step\":%d,\"failed_phase\":", r->failed_step);
            json_string(stdout, r->phase);
            printf(",\"failed_tensor\":");
            json_string(stdout, r->failed_tensor);
            printf(",\"failed_bytes\":%zu,", r->failed_bytes);
        }
        printf("\"peak_requested\":%zu,\"peak_allocated\":%zu,\"peak_reserved\":%zu,\"utilisation\":%.6f,"
               "\"capacity\":%zu,\"num_allocs\":%" PRIu64 ",\"num_frees\":%" PRIu64 ",\"num_maps\":%" PRIu64
               ",\"num_unmaps\":%" PRIu64 ",\"num_alloc_retries\":%" PRIu64 ",\"num_ooms\":%" PRIu64
               ",\"num_syncs\":%" PRIu64 ",\"max_seq_len\":%zu",
               s.requested_peak, s.allocated_peak, s.reserved_peak, util, s.capacity_bytes, s.num_allocs,
               s.num_frees, s.num_maps, s.num_unmaps, s.num_alloc_retries, s.num_ooms, s.num_syncs, r->max_T);
        if (heap_violations >= 0)
            printf(",\"heap_check_violations\":%d,\"leftover_requested\":%zu,\"accounting_mismatches\":%u",
                   heap_violations, leftover, r->accounting_mismatches);
        printf("}\n");
        fflush(stdout);
        return;
    }
    char a[8][32];
    printf("summary:\n");
    printf("  peak requested   %12s (%zu B)\n", human(s.requested_peak, a[0], 32), s.requested_peak);
    printf("  peak allocated   %12s (%zu B)\n", human(s.allocated_peak, a[1], 32), s.allocated_peak);
    printf("  peak reserved    %12s (%zu B)\n", human(s.reserved_peak, a[2], 32), s.reserved_peak);
    printf("  utilisation      %11.2f%% (peak allocated / peak reserved)\n", util * 100.0);
    printf("  capacity         %12s\n", human(s.capacity_bytes, a[3], 32));
    printf("  allocs / frees   %" PRIu64 " / %" PRIu64 "\n", s.num_allocs, s.num_frees);
    printf("  maps / unmaps    %" PRIu64 " / %" PRIu64 "\n", s.num_maps, s.num_unmaps);
    printf("  retries / OOMs   %" PRIu64 " / %" PRIu64 "\n", s.num_alloc_retries, s.num_ooms);
    if (heap_violations >= 0)
        printf("  heap check       %s%s\n", heap_violations == 0 ? "consistent" : "VIOLATIONS (see stderr)",
               leftover ? " (requested bytes left after freeing everything!)" : "");
    if (heap_violations >= 0)
        printf("  accounting       %s\n", r->accounting_mismatches ? "MISMATCH with the demo's own counts (see stderr)"
                                                                   : "stats agree with the demo's own counts");
    if (completed)
        printf("  completed        yes (%d steps)\n", done);
    else
        printf("  completed        NO: step %d (%s, T=%zu): allocation of %s (%s) failed\n", r->failed_step, r->phase,
               r->T, r->failed_tensor, human(r->failed_bytes, a[4], 32));
    fflush(stdout);
}

static int run_training(const opts_t *o) {
    /* Pick the sim device unless the user named a driver: before the first cualloc call. */
    const char *user = getenv("CUALLOC_CONF");
    bool has_driver = false;
    conf_foreach(user, find_driver, &has_driver);
    if (!has_driver) {
        char head[128];
        if (o->device > 0)
            snprintf(head, sizeof head, "driver:sim,sim_memory_mb:%zu,sim_devices:%d", o->memory_mb, o->device + 1);
        else
            snprintf(head, sizeof head, "driver:sim,sim_memory_mb:%zu", o->memory_mb);
        strbuf_t sb = {0};
        sb_add(&sb, head, strlen(head));
        if (user && *user) sb_add(&sb, user, strlen(user));
        setenv("CUALLOC_CONF", sb.buf, 1);
        free(sb.buf);
    }
    static run_t run; /* large: keep it off the stack */
    run_t *r = &run;
    memset(r, 0, sizeof *r);
    r->o = o;
    r->phase = "set-up";
    cualloc_stats s0;
    if (cualloc_get_stats(o->device, &s0) != 0) {
        fprintf(stderr, "cualloc-demo: device %d is not valid (CUALLOC_CONF=%s)\n", o->device, getenv("CUALLOC_CONF"));
        return 2;
    }
    print_header(r, getenv("CUALLOC_CONF"));
    uint64_t rng = o->seed;
    alloc_params(r);
    r->B = (size_t)o->batch;
    for (int step = 1; step <= o->steps; step++) {
        r->step = step;
        r->T = MIN_T + (size_t)(rng_next(&rng) % (MAX_T - MIN_T + 1));
        if (r->T > r->max_T) r->max_T = r->T;
        r->step_peak_req = r->step_peak_alloc = r->step_peak_resv = 0;
        train_step(r);
        /* The convention of cualloc_torch.watch_optimizer: "step N" after step N's optimizer
         * update, so a trace of the demo is cut into steps (no-op when not tracing). */
        char mark[32];
        snprintf(mark, sizeof mark, "step %d", step);
        cualloc_mark(mark);
        print_step(r);
    }
    /* Tear down: free what the run kept, and check the heap is empty and consistent. */
    r->phase = "tear-down";
    for (int p = 0; p < N_PARAMS; p++) {
        tfree(r, &r->exp_avg_sq[p]);
        tfree(r, &r->exp_avg[p]);
        tfree(r, &r->grads[p]);
        tfree(r, &r->params[p]);
    }
    cualloc_stats s;
    get_stats(r, &s);
    check_accounting(r, &s);
    int violations = cualloc_check(o->device);
    print_summary(r, violations, s.requested_bytes);
    return violations || s.requested_bytes || r->accounting_mismatches ? 3 : 0;
}

/* ------------------------------------------------------------------ --min-fit */

typedef struct trial_s {
    size_t mb;
    int outcome;          /* 1 completed, 0 an allocation failed, -1 the child misbehaved */
    size_t peak_requested, peak_allocated, peak_reserved;
    long failed_step;
    char failed_tensor[96];
    char conf_said[1024];  /* the library's "cualloc: CUALLOC_CONF: ..." lines, if it complained */
} trial_t;

/* Finds "key": in a JSON text and parses the number after it (false when absent or null). */
static bool json_num(const char *text, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    if (!p) return false;
    p += strlen(pat);
    if (!strncmp(p, "null", 4)) return false;
    char *end;
    double v = strtod(p, &end);
    if (end == p) return false;
    *out = v;
    return true;
}

static size_t json_size(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    if (!p) return 0;
    return (size_t)strtoull(p + strlen(pat), NULL, 10);
}

static void json_str(const char *text, const char *key, char *out, size_t len) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    out[0] = '\0';
    const char *p = strstr(text, pat);
    if (!p) return;
    p += strlen(pat);
    size_t n = 0;
    while (*p && *p != '"' && n + 1 < len) {
        if (*p == '\\' && p[1]) p++;
        out[n++] = *p++;
    }
    out[n] = '\0';
}

/* Runs this program as a child: --quiet --json, CUALLOC_CONF = driver:sim,sim_memory_mb:M + keys. */
static void run_trial(const opts_t *o, const char *keys, size_t mb, trial_t *t) {
    memset(t, 0, sizeof *t);
    t->mb = mb;
    t->outcome = -1;
    char conf[4096];
    int n = snprintf(conf, sizeof conf, "driver:sim,sim_memory_mb:%zu", mb);
    if (o->device > 0) n += snprintf(conf + n, sizeof conf - (size_t)n, ",sim_devices:%d", o->device + 1);
    if (keys && *keys) snprintf(conf + n, sizeof conf - (size_t)n, ",%s", keys);
    char steps[24], batch[24], seed[32], dev[24];
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(batch, sizeof batch, "%d", o->batch);
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    snprintf(dev, sizeof dev, "%d", o->device);
    char *args[] = {"cualloc-demo", "--quiet", "--json", "--steps", steps, "--batch", batch, "--seed", seed,
                    "--device", dev, NULL};
    int pfd[2];
    if (pipe(pfd) != 0) {
        perror("cualloc-demo: pipe");
        return;
    }
    /* The child's stderr is kept (not shown unless --verbose: trials that fail print OOM reports)
     * and read after it ends, for the library's complaints about the configuration. */
    FILE *err = tmpfile();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("cualloc-demo: fork");
        close(pfd[0]), close(pfd[1]);
        if (err) fclose(err);
        return;
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]), close(pfd[1]);
        int dn = err ? fileno(err) : open("/dev/null", O_WRONLY);
        if (dn >= 0) dup2(dn, 2);
        if (dn > 2) close(dn);
        setenv("CUALLOC_CONF", conf, 1);
        execv("/proc/self/exe", args);
        perror("cualloc-demo: exec /proc/self/exe");
        _exit(127);
    }
    close(pfd[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = buf ? realloc(buf, cap * 2) : NULL;
            if (!nb) break;
            buf = nb, cap *= 2;
        }
        if (!buf) break;
        ssize_t k = read(pfd[0], buf + len, cap - len - 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(pfd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (err) {
        static const char said[] = "cualloc: CUALLOC_CONF:";
        char line[1024];
        size_t kept = 0;
        rewind(err);
        while (fgets(line, sizeof line, err)) {
            if (o->verbose) fputs(line, stderr);
            /* snprintf cuts what does not fit; kept then passes the end and the loop adds no more */
            if (strncmp(line, said, sizeof said - 1) == 0 && kept + 1 < sizeof t->conf_said)
                kept += (size_t)snprintf(t->conf_said + kept, sizeof t->conf_said - kept, "%s", line);
        }
        fclose(err);
    }
    if (!buf) return;
    buf[len] = '\0';
    bool parsed = strstr(buf, "\"completed\":") != NULL;
    bool completed = strstr(buf, "\"completed\":true") != NULL;
    t->peak_requested = json_size(buf, "peak_requested");
    t->peak_allocated = json_size(buf, "peak_allocated");
    t->peak_reserved = json_size(buf, "peak_reserved");
    double fs;
    t->failed_step = json_num(buf, "failed_step", &fs) ? (long)fs : 0;
    json_str(buf, "failed_tensor", t->failed_tensor, sizeof t->failed_tensor);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && parsed && completed)
        t->outcome = 1;
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 1 && parsed && !completed)
        t->outcome = 0;
    else {
        t->outcome = -1;
        fprintf(stderr, "cualloc-demo: trial at %zu MiB (CUALLOC_CONF=%s) ended badly: %s %d\n", mb, conf,
                WIFEXITED(status) ? "exit status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    }
    free(buf);
    if (o->verbose)
        fprintf(stderr, "  trial %6zu MiB: %s%s%s\n", mb,
                t->outcome == 1 ? "completed" : t->outcome == 0 ? "failed: " : "ERROR",
                t->outcome == 0 ? t->failed_tensor : "", "");
}

typedef struct fit_s {
    const char *keys;
    bool ok;                 /* a minimum was found */
    size_t min_mb;
    size_t peak_requested;
    trial_t at_min;          /* the confirming run */
    bool confirmed;
    int ntrials;
    size_t larger_failed[32]; /* tested sizes above min_mb at which the run failed */
    int nlarger_failed;
    size_t scanned_to;
    int nabove;              /* tested sizes above min_mb */
    int nbelow;              /* tested sizes below min_mb (all failed) */
} fit_t;

#define MAX_TRIALS 256

/* The keys of a configuration's trials: the user's CUALLOC_CONF keys (minus driver/sim_memory_mb),
 * then --conf's. The caller frees sb->buf. */
static const char *fit_keys(const char *extra, strbuf_t *sb) {
    conf_foreach(getenv("CUALLOC_CONF"), copy_user_item, sb);
    conf_foreach(extra, copy_user_item, sb);
    return sb->buf ? sb->buf : "";
}

/* The search's probe: the next trial, at `mb` MiB, into trials[*nt]; its outcome (1 completed, 0
 * failed, < 0 not run). */
struct demo_probe {
    const opts_t *o;
    const char *keys;
    trial_t *trials;
    int *nt;
};

static int demo_probe(void *ctx, uint64_t mb) {
    struct demo_probe *p = ctx;
    run_trial(p->o, p->keys, (size_t)mb, &p->trials[*p->nt]);
    return p->trials[(*p->nt)++].outcome;
}

static void min_fit_one(const opts_t *o, const char *extra, fit_t *f) {
    strbuf_t sb = {0};
    const char *keys = fit_keys(extra, &sb);
    memset(f, 0, sizeof *f);
    f->keys = extra;
    static trial_t trials[MAX_TRIALS];
    int nt = 0;
    /* An upper bound that completes: the default size, doubled until it does. */
    size_t hi = o->memory_mb;
    for (;;) {
        run_trial(o, keys, hi, &trials[nt]);
        if (trials[nt++].outcome == 1) break;
        if (trials[nt - 1].outcome < 0 || hi >= ((size_t)1 << 24) || nt >= MAX_TRIALS) {
            fprintf(stderr, "cualloc-demo: configuration \"%s\": no size up to %zu MiB completes the run\n", extra, hi);
            f->ntrials = nt;
            free(sb.buf);
            return;
        }
        hi *= 2;
    }
    size_t top = hi;
    f->peak_requested = trials[nt - 1].peak_requested;
    /* Below the peak requested nothing can fit: that is the known-failing lower bound. */
    size_t lo = (f->peak_requested + MIB - 1) / MIB - 1;
    const size_t sure_fail = lo;
    /* Bisection, then a few sizes below its answer (min_fit_search.h says why); the failing sizes
     * above a smaller one that completes show as not monotone below. */
    struct demo_probe ctx = {o, keys, trials, &nt};
    min_fit_search_t s;
    unsigned budget = nt < MAX_TRIALS - 2 ? (unsigned)(MAX_TRIALS - 2 - nt) : 0; /* room for the confirming run */
    min_fit_search(sure_fail, lo, hi, budget, demo_probe, &ctx, &s);
    if (!s.found) goto stopped;
    hi = s.units;
    f->min_mb = hi;
    /* Confirm at the minimum (the run is deterministic: it must complete again). */
    run_trial(o, keys, hi, &f->at_min);
    f->confirmed = f->at_min.outcome == 1;
    trials[nt++] = f->at_min;
    /* Sizes above the minimum: completion need not be monotone in capacity. The K sizes just
     * above it, then sizes at doubling distances up to the first size that completed. */
    for (int k = 1; k <= o->scan && nt < MAX_TRIALS; k++)
        run_trial(o, keys, hi + (size_t)k, &trials[nt++]);
    if (o->scan > 0)
        for (size_t d = 16; hi + d < top && nt < MAX_TRIALS; d *= 2) {
            if (d <= (size_t)o->scan) continue;
            run_trial(o, keys, hi + d, &trials[nt++]);
        }
    /* Every trial above the minimum counts, the bisection's too (the largest is the upper bound). */
    for (int i = 0; i < nt && i < MAX_TRIALS; i++) {
        f->nbelow += trials[i].mb < hi;
        if (trials[i].mb > hi) {
            f->nabove++;
            if (trials[i].mb > f->scanned_to) f->scanned_to = trials[i].mb;
        }
    }
    for (int i = 0; i < nt && i < MAX_TRIALS; i++)
        if (trials[i].outcome == 0 && trials[i].mb > hi && f->nlarger_failed < 32) {
            bool dup = false;
            for (int j = 0; j < f->nlarger_failed; j++) dup |= f->larger_failed[j] == trials[i].mb;
            if (!dup) f->larger_failed[f->nlarger_failed++] = trials[i].mb;
        }
    f->ntrials = nt;
    f->ok = true;
    free(sb.buf);
    return;
stopped: /* a trial that could not be run: no minimum */
    f->ntrials = nt;
    free(sb.buf);
}

static int run_min_fit(opts_t *o) {
    static const char *const defaults[] = {"", "expandable_segments:0"};
    if (o->nconfs == 0) {
        o->confs[0] = defaults[0];
        o->confs[1] = defaults[1];
        o->nconfs = 2;
    }
    const char *user = getenv("CUALLOC_CONF");
    /* Every configuration is tried once before any is measured: a key the library does not take as
     * written (unknown, or a bad value) keeps its default in the trials, so the table would name a
     * configuration it did not measure. A usage error (cualloc-conf names the same complaints). */
    bool refused = false;
    for (int c = 0; c < o->nconfs; c++) {
        strbuf_t sb = {0};
        trial_t t;
        run_trial(o, fit_keys(o->confs[c], &sb), o->memory_mb, &t);
        free(sb.buf);
        for (char *line = t.conf_said, *end; *line; line = end) {
            end = line + strcspn(line, "\n");
            fprintf(stderr, "cualloc-demo: configuration \"%s\" is not taken as written: %.*s\n", o->confs[c],
                    (int)(end - line), line);
            if (*end) end++;
            refused = true;
        }
    }
    if (refused) return 2;
    if (!o->json) {
        printf("cualloc-demo --min-fit: smallest sim_memory_mb at which all %d steps complete (batch %d, seed %" PRIu64
               ")\n",
               o->steps, o->batch, o->seed);
        if (user && *user) printf("  user keys from CUALLOC_CONF: %s (driver and sim_memory_mb are set per trial)\n", user);
        fflush(stdout);
    } else {
        printf("{\"steps\":%d,\"batch\":%d,\"seed\":%" PRIu64 ",\"configurations\":[", o->steps, o->batch, o->seed);
    }
    int rc = 0;
    for (int c = 0; c < o->nconfs; c++) {
        fit_t f;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        min_fit_one(o, o->confs[c], &f);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        double ratio = f.peak_requested ? (double)f.min_mb * (double)MIB / (double)f.peak_requested : 0;
        if (!f.ok || !f.confirmed || f.nlarger_failed) rc = 1;
        if (o->json) {
            printf("%s{\"conf\":", c ? "," : "");
            json_string(stdout, o->confs[c]);
            printf(",\"found\":%s", f.ok ? "true" : "false");
            if (f.ok) {
                printf(",\"min_fit_mb\":%zu,\"peak_requested\":%zu,\"ratio\":%.6f,\"peak_allocated_at_min\":%zu,"
                       "\"peak_reserved_at_min\":%zu,\"confirmed\":%s,\"scanned_to_mb\":%zu,\"larger_failed_mb\":[",
                       f.min_mb, f.peak_requested, ratio, f.at_min.peak_allocated, f.at_min.peak_reserved,
                       f.confirmed ? "true" : "false", f.scanned_to);
                for (int i = 0; i < f.nlarger_failed; i++) printf("%s%zu", i ? "," : "", f.larger_failed[i]);
                printf("]");
            }
            printf(",\"trials\":%d,\"seconds\":%.2f}", f.ntrials, secs);
            continue;
        }
        char a[4][32];
        printf("\nconfiguration \"%s\":\n", o->confs[c]);
        if (!f.ok) {
            printf("  no minimum found (%d trials)\n", f.ntrials);
            continue;
        }
        printf("  min-fit            %zu MiB\n", f.min_mb);
        printf("  peak requested     %s (%zu B)\n", human(f.peak_requested, a[0], 32), f.peak_requested);
        printf("  ratio              %.4f (min-fit / peak requested)\n", ratio);
        printf("  at min-fit         peak allocated %s, peak reserved %s, utilisation %.2f%%\n",
               human(f.at_min.peak_allocated, a[1], 32), human(f.at_min.peak_reserved, a[2], 32),
               f.at_min.peak_reserved ? 100.0 * (double)f.at_min.peak_allocated / (double)f.at_min.peak_reserved : 0);
        printf("  confirmed          %s\n", f.confirmed ? "yes (a second run at the minimum completed)"
                                                         : "NO: the run at the minimum failed this time");
        if (f.nlarger_failed) {
            printf("  NOT MONOTONE       the run failed at larger tested size(s):");
            for (int i = 0; i < f.nlarger_failed; i++) printf(" %zu", f.larger_failed[i]);
            printf(" MiB\n");
        } else {
            printf("  monotone           no larger tested size failed (%d sizes above the minimum tried, up to %zu MiB)\n",
                   f.nabove, f.scanned_to);
        }
        printf("  below              %d smaller size%s tried, all failed\n", f.nbelow, f.nbelow == 1 ? "" : "s");
        printf("  trials             %d (%.1f s)\n", f.ntrials, secs);
        fflush(stdout);
    }
    if (o->json) printf("]}\n");
    return rc;
}

int main(int argc, char **argv) {
    opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (o.min_fit) return stdout_written(run_min_fit(&o));
    if (o.min_fit_only) {
        /* Ignoring it would run something other than what was asked for, without a word. */
        fprintf(stderr, "cualloc-demo: %s is for --min-fit%s\n", o.min_fit_only,
                strcmp(o.min_fit_only, "--conf") ? "" : "; set CUALLOC_CONF for a single run");
        return 2;
    }
    return stdout_written(run_training(&o));
}
