/* test_conf.c — white-box tests of conf.c (CUALLOC_CONF parsing, formatting, the README table)
 * and of error.c's callback path. Messages are captured with error_set_callback and counted:
 * every problem conf_parse reports is exactly one message and one in its return value.
 * Random parts print their seed; rerun one with TEST_SEED=<seed>.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "softcheck.h"

/* ------------------------------------------------------------------------ message capture */

static int msg_count;
static char msg_last[2048];
static bool msg_well_formed = true; /* every message starts "cualloc: " and has no newline */

static void capture(const char *line, void *arg)
{
    (void)arg;
    msg_count++;
    snprintf(msg_last, sizeof msg_last, "%s", line);
    if (strncmp(line, "cualloc: ", 9) != 0 || strchr(line, '\n') || strlen(line) >= 1024)
        msg_well_formed = false;
}

static void msg_reset(void)
{
    msg_count = 0;
    msg_last[0] = '\0';
}

/* Parses text over *c, checking that the return value equals the number of messages. */
static int parse_counted(const char *text, conf_t *c)
{
    msg_reset();
    int problems = conf_parse(text, c);
    CHECK_MSG(problems == msg_count, "'%.80s': returned %d, %d messages", text, problems,
              msg_count);
    return problems;
}

/* ------------------------------------------------------------------------ comparison */

static bool conf_equal(const conf_t *a, const conf_t *b, const char **which)
{
#define SAME(f)                                                                                \
    if (a->f != b->f) {                                                                        \
        *which = #f;                                                                           \
        return false;                                                                          \
    }
    SAME(expandable_segments) SAME(max_split_size) SAME(garbage_collection_threshold)
    for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++) {
        SAME(roundup_power2_divisions[i])
    }
    SAME(per_process_memory_fraction) SAME(max_memory) SAME(chunk_size) SAME(va_factor)
    SAME(summary) SAME(driver) SAME(sim_memory) SAME(sim_host_backed) SAME(sim_granularity)
    SAME(sim_vmm) SAME(sim_devices) SAME(sim_latency_us) SAME(sim_va_base) SAME(sim_fail_op)
    SAME(sim_fail_after) SAME(sim_fail_count) SAME(sim_fail_error)
    SAME(trace_stack_depth) SAME(trace_max) SAME(trace_ring)
    if (strcmp(a->trace, b->trace) != 0) {
        *which = "trace";
        return false;
    }
#undef SAME
    *which = NULL;
    return true;
}

#define CHECK_CONF_EQ(a, b, ctx)                                                               \
    do {                                                                                       \
        const char *which_;                                                                    \
        CHECK_MSG(conf_equal((a), (b), &which_), "%s: field %s differs", (ctx), which_);       \
    } while (0)

/* The keys, written out independently of conf.c's table. */
static const char *const all_keys[] = {
    "expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "per_process_memory_fraction", "max_memory_mb",
    "chunk_size_mb", "va_factor", "summary", "exclude", "trace", "trace_stack_depth", "trace_max_mb",
    "trace_ring", "driver", "sim_memory_mb", "sim_host_backed",
    "sim_granularity_kb", "sim_vmm", "sim_devices", "sim_latency_us", "sim_va_base", "sim_fail",
};
#define NKEYS (sizeof all_keys / sizeof all_keys[0])

/* ------------------------------------------------------------------------ tests */

static void test_defaults(void)
{
    conf_t c;
    msg_reset();
    conf_defaults(&c);
    CHECK(msg_count == 0);
    CHECK(c.expandable_segments == true);
    CHECK(c.max_split_size == SIZE_MAX);
    CHECK(c.garbage_collection_threshold == 0.0);
    for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
        CHECK(c.roundup_power2_divisions[i] == 0);
    CHECK(c.per_process_memory_fraction == 0.0);
    CHECK(c.max_memory == 0);
    CHECK(c.chunk_size == 0);
    CHECK(c.va_factor == 4);
    CHECK(c.summary == false);
    CHECK(c.trace[0] == '\0');
    CHECK(c.trace_stack_depth == 16);
    CHECK(c.trace_max == 0);
    CHECK(c.trace_ring == false);
    CHECK(c.driver == DRIVER_CUDA);
    CHECK(c.sim_memory == 16384 * MiB);
    CHECK(c.sim_host_backed == false);
    CHECK(c.sim_granularity == 2 * MiB);
    CHECK(c.sim_vmm == true);
    CHECK(c.sim_devices == 1);
    CHECK(c.sim_latency_us == 0);
    CHECK(c.sim_va_base == 0x7f0000000000ull);
    CHECK(c.sim_fail_op == SIM_OP_COUNT);
    CHECK(c.sim_fail_after == 0);
    CHECK(c.sim_fail_count == 0);

    /* The defaults as conf_format writes them (also the README's default column). */
    char buf[2048];
    size_t n = conf_format(&c, buf, sizeof buf);
    const char *want =
        "expandable_segments:True,max_split_size_mb:unlimited,garbage_collection_threshold:0,"
        "roundup_power2_divisions:0,per_process_memory_fraction:0,max_memory_mb:0,"
        "chunk_size_mb:0,va_factor:4,summary:False,trace:,trace_stack_depth:16,trace_max_mb:0,"
        "trace_ring:False,driver:cuda,sim_memory_mb:16384,"
        "sim_host_backed:False,sim_granularity_kb:2048,sim_vmm:True,sim_devices:1,"
        "sim_latency_us:0,sim_va_base:0x7f0000000000,sim_fail:none";
    CHECK_MSG(strcmp(buf, want) == 0, "got %s", buf);
    CHECK(n == strlen(buf));

    /* NULL and empty text change nothing and report nothing. */
    conf_t d = c;
    CHECK(parse_counted(NULL, &d) == 0);
    CHECK(parse_counted("", &d) == 0);
    CHECK(parse_counted(" , ,,\t,", &d) == 0);
    CHECK_CONF_EQ(&c, &d, "empty input");
}

/* Parses one good text over the defaults: no problem, no message. */
static conf_t good(const char *text)
{
    conf_t c;
    conf_defaults(&c);
    int p = parse_counted(text, &c);
    CHECK_MSG(p == 0, "'%s' should parse cleanly; got: %s", text, msg_last);
    return c;
}

static void test_good_values(void)
{
    for (unsigned i = 0; i < 2; i++) {
        static const char *const yes[] = {"1", "true", "True", "TRUE", "yes", "Yes", "on"};
        static const char *const no[] = {"0", "false", "False", "no", "NO", "off"};
        char text[64];
        for (size_t j = 0; j < sizeof yes / sizeof yes[0]; j++) {
            snprintf(text, sizeof text, "%s:%s", i ? "summary" : "sim_host_backed", yes[j]);
            conf_t c = good(text);
            CHECK(i ? c.summary : c.sim_host_backed);
        }
        for (size_t j = 0; j < sizeof no / sizeof no[0]; j++) {
            snprintf(text, sizeof text, "%s:%s", i ? "sim_vmm" : "expandable_segments", no[j]);
            conf_t c = good(text);
            CHECK(!(i ? c.sim_vmm : c.expandable_segments));
        }
    }
    CHECK(good("max_split_size_mb:20").max_split_size == 20 * MiB); /* PyTorch 2.8 on: at least 20 */
    CHECK(good("max_split_size_mb:21").max_split_size == 21 * MiB);
    CHECK(good("max_split_size_mb:128").max_split_size == 128 * MiB);
    CHECK(good("max_split_size_mb:128,max_split_size_mb:unlimited").max_split_size == SIZE_MAX);
    CHECK(good("garbage_collection_threshold:0.6").garbage_collection_threshold == 0.6);
    CHECK(good("garbage_collection_threshold:0").garbage_collection_threshold == 0.0);
    CHECK(good("garbage_collection_threshold:.25").garbage_collection_threshold == 0.25);
    CHECK(good("garbage_collection_threshold:5e-1").garbage_collection_threshold == 0.5);
    CHECK(good("per_process_memory_fraction:1").per_process_memory_fraction == 1.0);
    CHECK(good("per_process_memory_fraction:0.5").per_process_memory_fraction == 0.5);
    CHECK(good("per_process_memory_fraction:0e9").per_process_memory_fraction == 0.0); /* a zero, written so */
    CHECK(good("per_process_memory_fraction:1e-20").per_process_memory_fraction == 1e-20);
    CHECK(good("max_memory_mb:4096").max_memory == 4096 * MiB);
    CHECK(good("max_memory_mb:0").max_memory == 0);
    CHECK(good("chunk_size_mb:2").chunk_size == 2 * MiB);
    CHECK(good("chunk_size_mb:6").chunk_size == 6 * MiB);
    CHECK(good("chunk_size_mb:64").chunk_size == 64 * MiB);
    CHECK(good("va_factor:2").va_factor == 2);
    CHECK(good("va_factor:1024").va_factor == 1024);
    CHECK(good("driver:sim").driver == DRIVER_SIM);
    CHECK(good("driver:sim,driver:cuda").driver == DRIVER_CUDA);
    CHECK(good("sim_memory_mb:1").sim_memory == MiB);
    CHECK(good("sim_memory_mb:81920").sim_memory == 81920 * MiB);
    CHECK(good("sim_granularity_kb:4").sim_granularity == 4 * KiB);
    CHECK(good("sim_granularity_kb:65536").sim_granularity == 64 * MiB);
    CHECK(good("sim_devices:64").sim_devices == 64);
    CHECK(good("sim_latency_us:250").sim_latency_us == 250);
    CHECK(good("sim_va_base:0x100000000").sim_va_base == 0x100000000ull);
    CHECK(strcmp(good("trace:/tmp/t-%p-%r-%h.bin").trace, "/tmp/t-%p-%r-%h.bin") == 0);
    CHECK(strcmp(good("trace:/tmp/x.bin,trace:").trace, "") == 0); /* empty: off */
    CHECK(strcmp(good("trace: rel/a b:c ").trace, "rel/a b:c") == 0);
    CHECK(good("trace_stack_depth:0").trace_stack_depth == 0);
    CHECK(good("trace_stack_depth:64").trace_stack_depth == 64);
    CHECK(good("trace_max_mb:1").trace_max == MiB);
    CHECK(good("trace_max_mb:0").trace_max == 0);
    CHECK(good("trace_ring:1,trace_max_mb:8").trace_ring);
    CHECK(good("sim_va_base:4294967296").sim_va_base == 0x100000000ull);
    CHECK(good("sim_va_base:0X7F0000200000").sim_va_base == 0x7f0000200000ull);
    /* The granularity set first allows a finer base. */
    CHECK(good("sim_granularity_kb:4,sim_va_base:0x7f0000001000").sim_va_base ==
          0x7f0000001000ull);

    conf_t c = good("sim_fail:map@3");
    CHECK(c.sim_fail_op == SIM_OP_MAP && c.sim_fail_after == 3 && c.sim_fail_count == 1);
    c = good("sim_fail:phys_create@0*5");
    CHECK(c.sim_fail_op == SIM_OP_PHYS_CREATE && c.sim_fail_after == 0 && c.sim_fail_count == 5);
    c = good("sim_fail:phys_create@0*5=700");
    CHECK(c.sim_fail_op == SIM_OP_PHYS_CREATE && c.sim_fail_after == 0 && c.sim_fail_count == 5 &&
          c.sim_fail_error == 700);
    c = good("sim_fail:map@2=999");
    CHECK(c.sim_fail_op == SIM_OP_MAP && c.sim_fail_after == 2 && c.sim_fail_count == 1 && c.sim_fail_error == 999);
    c = good("sim_fail:map@3,sim_fail:none");
    CHECK(c.sim_fail_error == 0);
    CHECK(c.sim_fail_op == SIM_OP_COUNT && c.sim_fail_after == 0 && c.sim_fail_count == 0);
    for (int op = 0; op < SIM_OP_COUNT; op++) {
        char text[64];
        snprintf(text, sizeof text, "sim_fail:%s@7*2", sim_op_name((sim_op_t)op));
        c = good(text);
        CHECK_MSG(c.sim_fail_op == (sim_op_t)op && c.sim_fail_after == 7 && c.sim_fail_count == 2,
                  "%s", text);
    }
    CHECK(strcmp(sim_op_name(SIM_OP_COUNT), "none") == 0);
    CHECK(strcmp(sim_op_name(SIM_OP_DEVICE_SYNC), "device_sync") == 0);

    /* Whitespace around keys and values, empty entries. */
    c = good("  expandable_segments : False ,, , max_split_size_mb:\t64 ,");
    CHECK(!c.expandable_segments && c.max_split_size == 64 * MiB);
}

/* One bad entry over the defaults: one problem, one message naming key and value, and the
 * configuration stays the defaults. */
static void bad(const char *text, const char *key)
{
    conf_t def, c;
    conf_defaults(&def);
    c = def;
    int p = parse_counted(text, &c);
    CHECK_MSG(p == 1, "'%s': %d problems", text, p);
    CHECK_MSG(msg_count == 1, "'%s': %d messages", text, msg_count);
    char want[128];
    snprintf(want, sizeof want, "cualloc: CUALLOC_CONF: bad value '");
    CHECK_MSG(strncmp(msg_last, want, strlen(want)) == 0, "'%s': %s", text, msg_last);
    snprintf(want, sizeof want, "' for key '%s': ", key);
    CHECK_MSG(strstr(msg_last, want) != NULL, "'%s': %s", text, msg_last);
    CHECK_MSG(strstr(msg_last, "; using the default ") != NULL || strstr(msg_last, "; leaving it unset (off)") != NULL,
              "'%s': %s", text, msg_last);
    CHECK_CONF_EQ(&def, &c, text);
}

static void test_bad_values(void)
{
    static const struct { const char *text, *key; } cases[] = {
        {"expandable_segments:maybe", "expandable_segments"},
        {"expandable_segments:2", "expandable_segments"},
        {"expandable_segments:", "expandable_segments"},
        {"expandable_segments", "expandable_segments"},
        {"max_split_size_mb:19", "max_split_size_mb"},
        {"max_split_size_mb:0", "max_split_size_mb"},
        {"max_split_size_mb:-5", "max_split_size_mb"},
        {"max_split_size_mb:12x", "max_split_size_mb"},
        {"max_split_size_mb:99999999999999999999999", "max_split_size_mb"},
        {"max_split_size_mb:17592186044416", "max_split_size_mb"}, /* SIZE_MAX / MiB + 1 */
        {"garbage_collection_threshold:1", "garbage_collection_threshold"},
        {"garbage_collection_threshold:1.5", "garbage_collection_threshold"},
        {"garbage_collection_threshold:-0.1", "garbage_collection_threshold"},
        {"garbage_collection_threshold:nan", "garbage_collection_threshold"},
        {"garbage_collection_threshold:inf", "garbage_collection_threshold"},
        {"garbage_collection_threshold:1e999", "garbage_collection_threshold"},
        {"garbage_collection_threshold:0x0.8p0", "garbage_collection_threshold"},
        {"garbage_collection_threshold:0.5.5", "garbage_collection_threshold"},
        {"garbage_collection_threshold:.", "garbage_collection_threshold"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions"},
        {"roundup_power2_divisions:x", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256:3]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[300:2]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[0:2]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256:1", "roundup_power2_divisions"},
        {"roundup_power2_divisions:256:1]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256:1]x", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[[256:1]]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[<:2]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256:1,512:x]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[256:2097152]", "roundup_power2_divisions"},
        {"per_process_memory_fraction:1.01", "per_process_memory_fraction"},
        {"per_process_memory_fraction:-1", "per_process_memory_fraction"},
        {"per_process_memory_fraction:1e-400", "per_process_memory_fraction"}, /* read as 0: no cap */
        {"per_process_memory_fraction:0.5e-330", "per_process_memory_fraction"},
        {"garbage_collection_threshold:1e400", "garbage_collection_threshold"},
        {"max_memory_mb:lots", "max_memory_mb"},
        {"max_memory_mb:18446744073709551616", "max_memory_mb"},
        {"chunk_size_mb:3", "chunk_size_mb"},
        {"chunk_size_mb:1", "chunk_size_mb"},
        {"chunk_size_mb:2097152", "chunk_size_mb"},
        {"va_factor:1", "va_factor"},
        {"va_factor:0", "va_factor"},
        {"va_factor:1025", "va_factor"},
        {"summary:summary", "summary"},
        {"driver:hip", "driver"},
        {"driver:", "driver"},
        {"sim_memory_mb:0", "sim_memory_mb"},
        {"sim_memory_mb:1073741825", "sim_memory_mb"},
        {"sim_host_backed:2", "sim_host_backed"},
        {"sim_granularity_kb:3", "sim_granularity_kb"},
        {"sim_granularity_kb:2", "sim_granularity_kb"},
        {"sim_granularity_kb:0", "sim_granularity_kb"},
        {"sim_granularity_kb:3000", "sim_granularity_kb"},
        {"sim_granularity_kb:2097152", "sim_granularity_kb"},
        {"sim_vmm:-1", "sim_vmm"},
        {"sim_devices:0", "sim_devices"},
        {"sim_devices:65", "sim_devices"},
        {"sim_devices:4294967297", "sim_devices"},
        {"sim_latency_us:10000001", "sim_latency_us"},
        {"sim_latency_us:1.5", "sim_latency_us"},
        {"sim_va_base:0", "sim_va_base"},
        {"sim_va_base:0x", "sim_va_base"},
        {"sim_va_base:0xg000", "sim_va_base"},
        {"sim_va_base:0x100000000000000", "sim_va_base"}, /* 2^56 */
        {"sim_va_base:0x7f000000000000000000", "sim_va_base"},
        {"sim_fail:map", "sim_fail"},
        {"sim_fail:mapp@1", "sim_fail"},
        {"sim_fail:@1", "sim_fail"},
        {"sim_fail:map@", "sim_fail"},
        {"sim_fail:map@x", "sim_fail"},
        {"sim_fail:map@1=0", "sim_fail"},
        {"sim_fail:map@1*2=1000", "sim_fail"},
        {"sim_fail:map@1=x", "sim_fail"},
        {"sim_fail:map@1=", "sim_fail"},
        {"sim_fail:map@-1", "sim_fail"},
        {"sim_fail:map@1*0", "sim_fail"},
        {"sim_fail:map@1*", "sim_fail"},
        {"sim_fail:map@1*2*3", "sim_fail"},
        {"sim_fail:map@4294967296", "sim_fail"},
        {"sim_fail:MAP@1", "sim_fail"},
        {"trace:/tmp/a[1]", "trace"},
        {"trace:/tmp/\x01x", "trace"},
        {"trace_stack_depth:65", "trace_stack_depth"},
        {"trace_stack_depth:-1", "trace_stack_depth"},
        {"trace_stack_depth:", "trace_stack_depth"},
        {"trace_max_mb:lots", "trace_max_mb"},
        {"trace_max_mb:1073741825", "trace_max_mb"},
        {"trace_ring:ring", "trace_ring"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        bad(cases[i].text, cases[i].key);

    /* As PyTorch's own message: max_split_size_mb must be at least 20. */
    conf_t c;
    conf_defaults(&c);
    parse_counted("max_split_size_mb:19", &c);
    CHECK_MSG(strstr(msg_last, "too small") && strstr(msg_last, "20"), "%s", msg_last);
    CHECK_MSG(strstr(msg_last, "using the default unlimited"), "%s", msg_last);

    /* A number past 2^64 - 1 says the accepted range, as one just past the range does; a range
     * from 0 does not add "or 0". */
    conf_defaults(&c);
    parse_counted("max_memory_mb:99999999999999999999", &c);
    CHECK_MSG(strstr(msg_last, "too large: must be 1 to 17592186044415, or 0; using the default 0"), "%s", msg_last);
    parse_counted("sim_va_base:0x7f000000000000000000", &c);
    CHECK_MSG(strstr(msg_last, "too large: must be 1 to 72057594037927935;"), "%s", msg_last);
    parse_counted("roundup_power2_divisions:99999999999999999999", &c);
    CHECK_MSG(strstr(msg_last, "too large: must be 0 to 1048576; using the default 0"), "%s", msg_last);

    /* A bad value after a good one keeps the good one and says so. */
    conf_defaults(&c);
    CHECK(parse_counted("max_split_size_mb:64,max_split_size_mb:7", &c) == 1);
    CHECK(c.max_split_size == 64 * MiB);
    CHECK_MSG(strstr(msg_last, "; keeping 64"), "%s", msg_last);

    /* One bad entry does not stop the others. */
    conf_defaults(&c);
    CHECK(parse_counted("va_factor:0,driver:sim,chunk_size_mb:5,summary:1", &c) == 2);
    CHECK(c.driver == DRIVER_SIM && c.summary && c.va_factor == 4 && c.chunk_size == 0);

    /* A value quoted in a message is cut and cleaned of unprintable bytes. */
    char text[600];
    snprintf(text, sizeof text, "driver:\x01\x7f%0500d", 7);
    conf_defaults(&c);
    CHECK(parse_counted(text, &c) == 1);
    CHECK_MSG(strstr(msg_last, "bad value '??000") && strstr(msg_last, "...'"), "%s", msg_last);
    CHECK(msg_well_formed);

    /* A value over the length limit says the limit; a path with no default says it stays off. */
    snprintf(text, sizeof text, "trace:/tmp/%0500d", 7);
    conf_defaults(&c);
    CHECK(parse_counted(text, &c) == 1 && c.trace[0] == '\0');
    CHECK_MSG(strstr(msg_last, "too long (505 characters, at most 320); leaving it unset (off)"), "%s", msg_last);
}

static void test_va_base_granularity_order(void)
{
    conf_t c, def;
    conf_defaults(&def);
    /* 0x7f0000200000 is 2 MiB aligned (accepted when read) but not 4 MiB aligned. */
    c = def;
    CHECK(parse_counted("sim_va_base:0x7f0000200000,sim_granularity_kb:4096", &c) == 1);
    CHECK(c.sim_granularity == 4 * MiB);
    CHECK(c.sim_va_base == 0x7f0000000000ull); /* back to the address before this parse */
    CHECK_MSG(strstr(msg_last, "sim_va_base") != NULL, "%s", msg_last);
    /* Not a multiple of the default 2 MiB: the address before. */
    c = def;
    CHECK(parse_counted("sim_va_base:0x7f0000001000", &c) == 1);
    CHECK(c.sim_va_base == 0x7f0000000000ull);
    CHECK_MSG(strstr(msg_last, "sim_va_base 0x7f0000001000 is not a multiple of sim_granularity_kb 2048") != NULL, "%s",
              msg_last);
    /* A granularity lowered after the address: judged by the final granularity, in either order. */
    c = def;
    CHECK(parse_counted("sim_va_base:0x7f0000001000,sim_granularity_kb:4", &c) == 0);
    CHECK(c.sim_va_base == 0x7f0000001000ull && c.sim_granularity == 4 * KiB);
    c = def;
    CHECK(parse_counted("sim_granularity_kb:4,sim_va_base:0x7f0000001000", &c) == 0);
    CHECK(c.sim_va_base == 0x7f0000001000ull);
    /* Both before: fine. */
    c = def;
    CHECK(parse_counted("sim_granularity_kb:4096,sim_va_base:0x7f0000400000", &c) == 0);
    CHECK(c.sim_va_base == 0x7f0000400000ull);
    /* The address before does not fit the new granularity either: rounded up. */
    c = def;
    c.sim_granularity = 4 * KiB;
    c.sim_va_base = 0x7f0000001000ull;
    CHECK(parse_counted("sim_granularity_kb:2048", &c) == 1);
    CHECK(c.sim_va_base == 0x7f0000200000ull);
    /* trace_ring needs trace_max_mb, in either order; alone it is reported (and stays set). */
    c = def;
    CHECK(parse_counted("trace_ring:1", &c) == 1 && c.trace_ring);
    CHECK_MSG(strstr(msg_last, "trace_ring has no effect without trace_max_mb") != NULL, "%s", msg_last);
    c = def;
    CHECK(parse_counted("trace_ring:1,trace_max_mb:64", &c) == 0);
    c = def;
    CHECK(parse_counted("trace_max_mb:64,trace_ring:1", &c) == 0);
}

static void check_divs(const char *text, const unsigned want[CONF_ROUNDUP_INTERVALS])
{
    conf_t c = good(text);
    for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
        CHECK_MSG(c.roundup_power2_divisions[i] == want[i], "'%s': interval %u is %u, want %u",
                  text, i, c.roundup_power2_divisions[i], want[i]);
}

static void test_pytorch_syntax(void)
{
    /* PyTorch's documented example: 256 MiB is interval 8 (and the first key also sets every
     * interval below), 512 MiB interval 9, '>' every interval after 9. */
    static const unsigned ex1[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8};
    check_divs("expandable_segments:True,max_split_size_mb:128,"
               "roundup_power2_divisions:[256:1,512:2,>:8]",
               ex1);
    conf_t c = good("expandable_segments:True,max_split_size_mb:128,"
                    "roundup_power2_divisions:[256:1,512:2,>:8]");
    CHECK(c.expandable_segments && c.max_split_size == 128 * MiB);
    /* Spaces inside the list. */
    check_divs("roundup_power2_divisions: [ 256 : 1 , 512 : 2 , > : 8 ]", ex1);
    /* The single-integer form applies to all 16 intervals. */
    static const unsigned all4[16] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    check_divs("roundup_power2_divisions:4", all4);
    /* Gaps between keys keep their previous value (the default 0). */
    static const unsigned gaps[16] = {2, 0, 0, 0, 0, 0, 4, 16, 16, 16, 16, 16, 16, 16, 16, 16};
    check_divs("roundup_power2_divisions:[1:2,64:4,>:16]", gaps);
    /* Keys beyond 32 GiB clamp to the last interval; the first key fills everything below. */
    static const unsigned big[16] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    check_divs("roundup_power2_divisions:[1048576:8]", big);
    /* '>' with no key before it: every interval. */
    check_divs("roundup_power2_divisions:[>:4]", all4);
    /* 0 disables rounding in one interval. */
    static const unsigned zero[16] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2};
    check_divs("roundup_power2_divisions:[1024:2,1024:0,>:2]", zero);
    /* A list is applied over the values already there. */
    static const unsigned over[16] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1};
    check_divs("roundup_power2_divisions:4,roundup_power2_divisions:[1:4,32768:1]", over);
    /* ... but the first key named still fills every interval below it, as PyTorch does (a '>'
     * before it does not count as a key). */
    static const unsigned all1[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    check_divs("roundup_power2_divisions:4,roundup_power2_divisions:[32768:1]", all1);
    check_divs("roundup_power2_divisions:[>:4,32768:1]", all1);
    /* Trailing and doubled commas inside the list are skipped. */
    check_divs("roundup_power2_divisions:[256:1,,512:2,>:8,]", ex1);
    /* A list followed by more keys: the comma inside brackets does not split. */
    c = good("roundup_power2_divisions:[256:1,512:2,>:8],summary:1");
    CHECK(c.summary && c.roundup_power2_divisions[9] == 2);
    /* A bad list leaves the intervals as they were. */
    conf_defaults(&c);
    CHECK(parse_counted("roundup_power2_divisions:4,roundup_power2_divisions:[256:1,512:3]", &c) ==
          1);
    for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
        CHECK(c.roundup_power2_divisions[i] == 4);
}

static void test_unknown_keys(void)
{
    conf_t c, def;
    conf_defaults(&def);
    c = def;
    CHECK(parse_counted("foo:1", &c) == 1);
    CHECK_CONF_EQ(&def, &c, "unknown key");
    const char *want = "cualloc: CUALLOC_CONF: unknown key 'foo' (known keys: ";
    CHECK_MSG(strncmp(msg_last, want, strlen(want)) == 0, "%s", msg_last);
    for (size_t i = 0; i < NKEYS; i++)
        CHECK_MSG(strstr(msg_last, all_keys[i]) != NULL, "key %s not listed: %s", all_keys[i],
                  msg_last);
    CHECK(msg_last[strlen(msg_last) - 1] == ')');

    /* Unknown keys are skipped, the rest applies. PyTorch keys cualloc has no use for too. */
    c = def;
    CHECK(parse_counted("foo:1,max_split_size_mb:64,backend:native,bar", &c) == 3);
    CHECK(c.max_split_size == 64 * MiB);
    /* PyTorch's keys that cualloc does not take are named as such, with the reason. */
    c = def;
    CHECK(parse_counted("backend:cudaMallocAsync", &c) == 1);
    CHECK_MSG(strstr(msg_last, "'backend' is a PYTORCH_CUDA_ALLOC_CONF key that cualloc does not take (") &&
                  strstr(msg_last, "); ignored"),
              "%s", msg_last);
    CHECK(parse_counted("pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:True", &c) == 2);
    CHECK_MSG(strstr(msg_last, "'release_lock_on_cudamalloc' is a PYTORCH_CUDA_ALLOC_CONF key"), "%s", msg_last);
    /* PyTorch's max_non_split_rounding_mb (how much larger than a request an oversize cached block
     * may be and still serve it) is PyTorch's too, not an unknown key: the message says cualloc keeps
     * PyTorch's default. */
    CHECK(parse_counted("max_non_split_rounding_mb:64", &c) == 1);
    CHECK_MSG(strstr(msg_last, "'max_non_split_rounding_mb' is a PYTORCH_CUDA_ALLOC_CONF key that cualloc does not "
                               "take (") && strstr(msg_last, "20 MiB") && strstr(msg_last, "); ignored"),
              "%s", msg_last);
    CHECK_CONF_EQ(&def, &c, "PyTorch-only keys");
    /* Keys are case-sensitive, as PyTorch's. */
    c = def;
    CHECK(parse_counted("Expandable_Segments:False", &c) == 1);
    CHECK(c.expandable_segments);
    /* An overlong key is an unknown key, quoted cut. */
    char text[400];
    memset(text, 'k', 300);
    strcpy(text + 300, ":1");
    c = def;
    CHECK(parse_counted(text, &c) == 1);
    CHECK(strstr(msg_last, "unknown key 'kkkk") && strstr(msg_last, "...'"));
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }
static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; } /* [0, 1) */

/* A random configuration that conf_parse would accept. */
static void random_conf(conf_t *c)
{
    conf_defaults(c);
    c->expandable_segments = rnd() & 1;
    c->max_split_size = (rnd() & 1) ? SIZE_MAX : (size_t)(21 + rnd_below(SIZE_MAX / MiB - 20)) * MiB;
    c->garbage_collection_threshold = (rnd() & 1) ? 0.0 : rnd_unit();
    if (rnd() & 1) {
        unsigned v = (rnd() & 3) == 0 ? 0 : 1u << rnd_below(21);
        for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
            c->roundup_power2_divisions[i] = v;
    } else {
        for (unsigned i = 0; i < CONF_ROUNDUP_INTERVALS; i++)
            c->roundup_power2_divisions[i] = (rnd() & 3) == 0 ? 0 : 1u << rnd_below(21);
    }
    switch (rnd_below(3)) {
    case 0: c->per_process_memory_fraction = 0.0; break;
    case 1: c->per_process_memory_fraction = 1.0; break;
    default: c->per_process_memory_fraction = 1.0 - rnd_unit(); break; /* (0, 1] */
    }
    c->max_memory = (rnd() & 1) ? 0 : (size_t)(1 + rnd_below(SIZE_MAX / MiB)) * MiB;
    c->chunk_size = (rnd() & 1) ? 0 : (size_t)(2 * (1 + rnd_below(1u << 19))) * MiB;
    c->va_factor = 2 + rnd_below(1023);
    c->summary = rnd() & 1;
    static const char *const paths[] = {"", "/tmp/trace.bin", "t-%p-%r-%h.bin", "a b:c/%%d"};
    snprintf(c->trace, sizeof c->trace, "%s", paths[rnd_below(4)]);
    c->trace_stack_depth = (unsigned)rnd_below(65);
    c->trace_max = (rnd() & 1) ? 0 : (size_t)(1 + rnd_below(1u << 30)) * MiB;
    c->trace_ring = c->trace_max && (rnd() & 1); /* a ring without a bound is reported */
    c->driver = (rnd() & 1) ? DRIVER_SIM : DRIVER_CUDA;
    c->sim_memory = (size_t)(1 + rnd_below(1u << 30)) * MiB;
    c->sim_host_backed = rnd() & 1;
    c->sim_granularity = ((size_t)4 << rnd_below(19)) * KiB;
    c->sim_vmm = rnd() & 1;
    c->sim_devices = 1 + (int)rnd_below(64);
    c->sim_latency_us = (unsigned)rnd_below(10000001);
    uint64_t limit = ((uint64_t)1 << 56) - 1;
    c->sim_va_base = (1 + rnd_below(limit / c->sim_granularity)) * c->sim_granularity;
    if (rnd() & 1) {
        c->sim_fail_op = SIM_OP_COUNT;
        c->sim_fail_after = 0;
        c->sim_fail_count = 0;
    } else {
        c->sim_fail_op = (sim_op_t)rnd_below(SIM_OP_COUNT);
        c->sim_fail_after = (unsigned)rnd();
        c->sim_fail_count = 1 + (unsigned)rnd_below(UINT32_MAX);
    }
}

static void test_round_trip(uint64_t seed)
{
    rng_state = seed | 1;
    for (int iter = 0; iter < 20000; iter++) {
        conf_t c, d;
        char buf[2048], small[64];
        random_conf(&c);
        random_conf(&d); /* parse over other values: format writes every key */
        size_t n = conf_format(&c, buf, sizeof buf);
        CHECK(n == strlen(buf) && n < sizeof buf);
        int p = parse_counted(buf, &d);
        CHECK_MSG(p == 0, "seed %llu iter %d: '%s': %s", (unsigned long long)seed, iter, buf,
                  msg_last);
        char ctx[64];
        snprintf(ctx, sizeof ctx, "round trip, seed %llu iter %d", (unsigned long long)seed, iter);
        CHECK_CONF_EQ(&c, &d, ctx);
        /* Truncated output is a prefix and the length is still the full one. */
        size_t cut = (size_t)rnd_below(sizeof small) + 1;
        CHECK(conf_format(&c, small, cut) == n);
        CHECK(strlen(small) == cut - 1 && strncmp(small, buf, cut - 1) == 0);
        if (failures > 20)
            return;
    }
    conf_t c;
    conf_defaults(&c);
    CHECK(conf_format(&c, NULL, 0) > 0);
}

static void test_garbage(uint64_t seed)
{
    rng_state = seed | 1;
    conf_t c;
    static char big[1 << 20];
    static const char alphabet[] = "[]:,> @*0123456789abcdefxX.-+e\t\n" "sim_fail" "map";

    /* Random bytes, random bytes from the syntax's own characters, and random real key names
     * followed by junk. The only checks: no crash, one message per problem, well formed. */
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)rnd_below(200);
        char text[256];
        int mode = (int)rnd_below(3);
        size_t i = 0;
        if (mode == 2) {
            const char *k = all_keys[rnd_below(NKEYS)];
            i = (size_t)snprintf(text, sizeof text, "%s:", k);
        }
        for (; i < len; i++)
            text[i] = mode == 0 ? (char)(1 + rnd_below(255))
                                : alphabet[rnd_below(sizeof alphabet - 1)];
        text[i] = '\0'; /* i = max(len, the key's length) < sizeof text */
        random_conf(&c);
        parse_counted(text, &c);
    }
    /* Huge inputs: one key, one value, nothing but brackets, nothing but commas, a long list. */
    memset(big, 'a', sizeof big - 1);
    conf_defaults(&c);
    parse_counted(big, &c);
    memcpy(big, "driver:", 7);
    parse_counted(big, &c);
    memset(big, '[', sizeof big - 1);
    parse_counted(big, &c);
    memset(big, ']', sizeof big - 1);
    parse_counted(big, &c);
    memset(big, ',', sizeof big - 1);
    CHECK(parse_counted(big, &c) == 0);
    size_t n = (size_t)snprintf(big, sizeof big, "roundup_power2_divisions:[");
    while (n < sizeof big - 16)
        n += (size_t)snprintf(big + n, sizeof big - n, "256:1,");
    snprintf(big + n, sizeof big - n, "]");
    CHECK(parse_counted(big, &c) == 1); /* too long */
    static const char *const odd[] = {
        "[", "]", "[[[[", "]]]]", "][", ":", "::::", ",:,", "summary:[1,2]", "driver:[sim",
        "roundup_power2_divisions:[", "roundup_power2_divisions:]", "roundup_power2_divisions:[:]",
        "roundup_power2_divisions:[>]", "roundup_power2_divisions:[,]",
        "roundup_power2_divisions:[>:]", "roundup_power2_divisions:[:8]", "sim_fail:@",
        "sim_fail:*@", "sim_fail:map@*", "sim_fail:map@1*1*", "roundup_power2_divisions:[256:1]]",
        "a[b,c]d:e", "sim_va_base:0x0", "garbage_collection_threshold:e5",
        "garbage_collection_threshold:0.1e", "\xff\xfe:\x80",
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        conf_defaults(&c);
        int p = parse_counted(odd[i], &c);
        CHECK_MSG(p >= 1, "'%s' should be a problem", odd[i]);
    }
    CHECK(msg_well_formed);
}

static void test_load(void)
{
    conf_t c;
    setenv("CUALLOC_CONF", "driver:sim,sim_memory_mb:1024,sim_devices:2", 1);
    msg_reset();
    conf_load(&c);
    CHECK(msg_count == 0);
    CHECK(c.driver == DRIVER_SIM && c.sim_memory == 1024 * MiB && c.sim_devices == 2);
    CHECK(c.expandable_segments && c.va_factor == 4); /* the rest are defaults */
    unsetenv("CUALLOC_CONF");
    conf_load(&c);
    conf_t def;
    conf_defaults(&def);
    CHECK_CONF_EQ(&def, &c, "conf_load without CUALLOC_CONF");
}

/* CUALLOC_DISABLE and the like: a boolean as CUALLOC_CONF reads one ("false" once meant on). */
static void test_env_flag(void)
{
    static const struct { const char *v; bool on; int msgs; } cases[] = {
        {NULL, false, 0}, {"", false, 0}, {"0", false, 0}, {"false", false, 0}, {"No", false, 0},
        {"off", false, 0}, {"1", true, 0}, {"TRUE", true, 0}, {"yes", true, 0}, {"on", true, 0},
        {"please", true, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].v)
            setenv("CUALLOC_TEST_FLAG", cases[i].v, 1);
        else
            unsetenv("CUALLOC_TEST_FLAG");
        msg_reset();
        bool on = conf_env_flag("CUALLOC_TEST_FLAG");
        CHECK_MSG(on == cases[i].on && msg_count == cases[i].msgs, "CUALLOC_TEST_FLAG='%s': %d, %d messages",
                  cases[i].v ? cases[i].v : "(unset)", on, msg_count);
    }
    CHECK(strstr(msg_last, "CUALLOC_TEST_FLAG='please' is not a boolean") != NULL);
    unsetenv("CUALLOC_TEST_FLAG");
}

static void test_markdown(void)
{
    FILE *f = tmpfile();
    if (!f) {
        perror("tmpfile");
        failures++;
        return;
    }
    conf_write_markdown(f);
    rewind(f);
    char line[2048];
    size_t rows = 0;
    CHECK(fgets(line, sizeof line, f) && strcmp(line, "| key | default | meaning |\n") == 0);
    CHECK(fgets(line, sizeof line, f) && strcmp(line, "| --- | --- | --- |\n") == 0);
    while (fgets(line, sizeof line, f)) {
        CHECK(rows < NKEYS);
        if (rows >= NKEYS)
            break;
        char want[128];
        snprintf(want, sizeof want, "| `%s` | `", all_keys[rows]);
        CHECK_MSG(strncmp(line, want, strlen(want)) == 0, "row %zu: %s", rows, line);
        /* Exactly four '|': no cell may break the table. */
        int bars = 0;
        for (const char *p = line; *p; p++)
            bars += *p == '|';
        CHECK_MSG(bars == 4, "row %zu: %s", rows, line);
        if (strcmp(all_keys[rows], "sim_fail") == 0)
            for (int op = 0; op < SIM_OP_COUNT; op++)
                CHECK_MSG(strstr(line, sim_op_name((sim_op_t)op)) != NULL, "%s not documented",
                          sim_op_name((sim_op_t)op));
        rows++;
    }
    CHECK(rows == NKEYS);
    fclose(f);
}

static void test_error_path(void)
{
    /* Long messages are cut to one line of at most 1023 characters, ending in "...". */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    msg_reset();
    cua_error("%s", big);
    CHECK(msg_count == 1 && strlen(msg_last) == 1022);
    CHECK(strcmp(msg_last + strlen(msg_last) - 3, "...") == 0);
    cua_error("two\nlines");
    CHECK(strcmp(msg_last, "cualloc: two lines") == 0);
    CHECK(msg_well_formed);
}

int main(void)
{
    uint64_t seed = (uint64_t)time(NULL);
    const char *env = getenv("TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 0);
    printf("test_conf: seed %llu (TEST_SEED=%llu to repeat)\n", (unsigned long long)seed,
           (unsigned long long)seed);

    error_set_callback(capture, NULL);
    test_defaults();
    test_good_values();
    test_bad_values();
    test_va_base_granularity_order();
    test_pytorch_syntax();
    test_unknown_keys();
    test_round_trip(seed);
    test_garbage(seed);
    test_load();
    test_env_flag();
    test_markdown();
    test_error_path();
    error_set_callback(NULL, NULL);

    if (failures) {
        printf("test_conf: %d failures\n", failures);
        return 1;
    }
    printf("test_conf: all passed\n");
    return 0;
}
