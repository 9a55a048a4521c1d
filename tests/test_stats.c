/* test_stats.c — white-box tests of stats.c (the JSON object and the text table made from the
 * X-macros in cualloc.h) and of error.c's fmt_bytes. The JSON is checked by a small validator
 * here and, when python3 is on PATH, by Python's json module as well.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "softcheck.h"

/* ------------------------------------------------------------------------ a tiny JSON checker */

/* Recursive descent over RFC 8259 values; each function returns the position after the value or
 * NULL. Enough to tell valid from invalid; it builds nothing. */
static const char *json_value(const char *p, int depth);

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static const char *json_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    while (*p != '"') {
        if ((unsigned char)*p < 0x20)
            return NULL; /* includes the terminating NUL */
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
                        return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
        p++;
    }
    return p + 1;
}

static const char *json_number(const char *p)
{
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return NULL;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p;
}

static const char *json_value(const char *p, int depth)
{
    if (depth > 64)
        return NULL;
    p = json_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        bool object = *p == '{';
        p = json_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (object) {
                if (!(p = json_string(json_ws(p))))
                    return NULL;
                p = json_ws(p);
                if (*p++ != ':')
                    return NULL;
            }
            if (!(p = json_value(p, depth + 1)))
                return NULL;
            p = json_ws(p);
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    if (*p == '"')
        return json_string(p);
    if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))
        return p + 4;
    if (!strncmp(p, "false", 5))
        return p + 5;
    return json_number(p);
}

static bool json_valid(const char *text)
{
    const char *end = json_value(text, 0);
    return end && *json_ws(end) == '\0';
}

static void test_json_checker(void)
{
    CHECK(json_valid("{}"));
    CHECK(json_valid("{\"a\": 1, \"b\": [1, -2.5e3, \"x\\n\", true, null, {}]}"));
    CHECK(!json_valid("{"));
    CHECK(!json_valid("{\"a\": 1,}"));
    CHECK(!json_valid("{\"a\" 1}"));
    CHECK(!json_valid("{\"a\": 01}"));
    CHECK(!json_valid("{} x"));
    CHECK(!json_valid("{\"a\": 18446744073709551615"));
}

/* ------------------------------------------------------------------------ stats */

/* Reads all of f (rewound) into buf. */
static size_t slurp(FILE *f, char *buf, size_t len)
{
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    return n;
}

/* A stats struct with a distinct value in every field, some near the type's limits. */
static void sample_stats(cualloc_stats *s)
{
    uint64_t v = 1000;
    memset(s, 0, sizeof *s);
#define SAMPLE_GAUGE_(cur, peak) s->cur = (size_t)(v++); s->peak = (size_t)(v++) << 20;
    CUALLOC_STATS_GAUGES(SAMPLE_GAUGE_)
#undef SAMPLE_GAUGE_
    s->largest_free_block = 777;
    s->capacity_bytes = SIZE_MAX;
#define SAMPLE_COUNTER_(name) s->name = v++;
    CUALLOC_STATS_COUNTERS(SAMPLE_COUNTER_)
#undef SAMPLE_COUNTER_
    s->num_ooms = UINT64_MAX;
}

/* Does json hold "key": value exactly once? */
static bool has_pair(const char *json, const char *key, unsigned long long value)
{
    char want[128];
    snprintf(want, sizeof want, "\"%s\": %llu", key, value);
    const char *hit = strstr(json, want);
    if (!hit)
        return false;
    char next = hit[strlen(want)];
    return (next == ',' || next == '}') && strstr(hit + 1, want) == NULL;
}

static bool python3_available(void)
{
    return system("command -v python3 >/dev/null 2>&1") == 0;
}

static void test_json(void)
{
    cualloc_stats s;
    char buf[8192];
    sample_stats(&s);
    FILE *f = tmpfile();
    if (!f) {
        perror("tmpfile");
        failures++;
        return;
    }
    stats_write_json(&s, f);
    fflush(f);
    size_t n = slurp(f, buf, sizeof buf);
    fclose(f);
    CHECK(n > 0 && n < sizeof buf - 1);
    CHECK_MSG(json_valid(buf), "invalid JSON: %s", buf);
    CHECK(buf[0] == '{' && buf[n - 1] == '}'); /* one object, embeddable: no newline */

    /* Every field, with its value, exactly once; and nothing else (count the keys). */
    size_t keys = 0;
#define CHECK_GAUGE_(cur, peak)                                                                \
    CHECK_MSG(has_pair(buf, #cur, s.cur), "%s missing: %s", #cur, buf);                         \
    CHECK_MSG(has_pair(buf, #peak, s.peak), "%s missing: %s", #peak, buf);                      \
    keys += 2;
    CUALLOC_STATS_GAUGES(CHECK_GAUGE_)
#undef CHECK_GAUGE_
    CHECK(has_pair(buf, "largest_free_block", s.largest_free_block));
    CHECK(has_pair(buf, "capacity_bytes", s.capacity_bytes));
    keys += 2;
#define CHECK_COUNTER_(name)                                                                   \
    CHECK_MSG(has_pair(buf, #name, (unsigned long long)s.name), "%s missing: %s", #name, buf);  \
    keys++;
    CUALLOC_STATS_COUNTERS(CHECK_COUNTER_)
#undef CHECK_COUNTER_
    size_t colons = 0;
    for (const char *p = buf; *p; p++)
        colons += *p == ':';
    CHECK_MSG(colons == keys, "%zu keys written, %zu fields", colons, keys);
    /* The fields named in cualloc.h's comment, spelled out independently of the X-macros. */
    static const char *const named[] = {"requested_bytes", "allocated_peak", "active_bytes",
                                        "reserved_peak", "inactive_split_bytes", "num_allocs",
                                        "num_ooms", "num_trims"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"%s\": ", named[i]);
        CHECK_MSG(strstr(buf, want) != NULL, "%s missing", named[i]);
    }

    /* A second opinion from Python's json module, where there is one. */
    if (!python3_available()) {
        printf("test_stats: python3 not found; JSON checked by the built-in checker only\n");
        return;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; d=json.load(sys.stdin); "
             "assert isinstance(d, dict) and len(d) == %zu, d; "
             "assert all(isinstance(v, int) and v >= 0 for v in d.values())'",
             keys);
    FILE *py = popen(cmd, "w");
    CHECK(py != NULL);
    if (py) {
        fputs(buf, py);
        int status = pclose(py);
        CHECK_MSG(status == 0, "python3 json.load rejected: %s", buf);
    }
}

static void test_text(void)
{
    cualloc_stats s;
    char buf[8192];
    sample_stats(&s);
    FILE *f = tmpfile();
    if (!f) {
        perror("tmpfile");
        failures++;
        return;
    }
    stats_write_text(&s, 3, f);
    fflush(f);
    slurp(f, buf, sizeof buf);
    fclose(f);
    CHECK_MSG(strncmp(buf, "cualloc stats, device 3 (capacity 16.00 EiB)\n", 45) == 0, "%s", buf);
    /* A row per gauge, labelled without "_bytes", with current and peak in human units. */
    char row[128], a[32], b[32];
#define CHECK_ROW_(cur, peak)                                                                  \
    {                                                                                          \
        char label_[64];                                                                       \
        snprintf(label_, sizeof label_, "%s", #cur);                                           \
        char *suffix_ = strstr(label_, "_bytes");                                              \
        if (suffix_)                                                                           \
            *suffix_ = '\0';                                                                   \
        snprintf(row, sizeof row, "  %-22s %14s %14s\n", label_, fmt_bytes(s.cur, a, sizeof a), \
                 fmt_bytes(s.peak, b, sizeof b));                                              \
        CHECK_MSG(strstr(buf, row) != NULL, "row '%s' missing:\n%s", row, buf);                \
    }
    CUALLOC_STATS_GAUGES(CHECK_ROW_)
#undef CHECK_ROW_
#define CHECK_COUNTER_ROW_(name)                                                               \
    snprintf(row, sizeof row, "  %-22s %29llu\n", #name, (unsigned long long)s.name);          \
    CHECK_MSG(strstr(buf, row) != NULL, "row '%s' missing:\n%s", row, buf);
    CUALLOC_STATS_COUNTERS(CHECK_COUNTER_ROW_)
#undef CHECK_COUNTER_ROW_
    CHECK(strstr(buf, "largest_free_block") != NULL);

    /* Every line lines up: the value columns end at the same place. */
    size_t width = 0;
    for (char *line = strchr(buf, '\n') + 1; *line; line = strchr(line, '\n') + 1) {
        size_t len = (size_t)(strchr(line, '\n') - line);
        if (strstr(line, "fragmented") != NULL && strstr(line, "fragmented") < line + len)
            continue; /* the cached_free row carries a note after its value */
        if (width == 0)
            width = len;
        CHECK_MSG(len == width || len == width - 15, "ragged line: %.*s", (int)len, line);
    }

    /* Fragmentation on an ordinary heap: 60 MiB cached, largest block 15 MiB → 75%. */
    memset(&s, 0, sizeof s);
    s.reserved_bytes = 100 * MiB;
    s.allocated_bytes = 40 * MiB;
    s.largest_free_block = 15 * MiB;
    f = tmpfile();
    if (!f)
        return;
    stats_write_text(&s, 0, f);
    fflush(f);
    slurp(f, buf, sizeof buf);
    fclose(f);
    CHECK_MSG(strstr(buf, "60.00 MiB   (75.0% fragmented") != NULL, "%s", buf);
}

/* ------------------------------------------------------------------------ fmt_bytes */

static void test_fmt_bytes(void)
{
    static const struct { size_t bytes; const char *want; } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {512, "512 B"},
        {1023, "1023 B"},
        {1024, "1.00 KiB"},
        {1536, "1.50 KiB"},
        {1048575, "1.00 MiB"}, /* not "1024.00 KiB" */
        {20 * MiB, "20.00 MiB"},
        {(size_t)(3.25 * (double)GiB), "3.25 GiB"},
        {(size_t)(1.2 * 1099511627776.0), "1.20 TiB"},
        {(size_t)1 << 50, "1.00 PiB"},
        {SIZE_MAX, "16.00 EiB"},
    };
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = fmt_bytes(cases[i].bytes, buf, sizeof buf);
        CHECK(got == buf);
        CHECK_MSG(strcmp(got, cases[i].want) == 0, "%zu: got '%s', want '%s'", cases[i].bytes,
                  got, cases[i].want);
    }
    /* A short buffer is cut, still terminated; an empty one is left alone. */
    char tiny[4] = "zzz";
    CHECK(strcmp(fmt_bytes(1536, tiny, sizeof tiny), "1.5") == 0);
    CHECK(fmt_bytes(1536, tiny, 0) == tiny && tiny[0] == '1');
}

int main(void)
{
    test_json_checker();
    test_json();
    test_text();
    test_fmt_bytes();
    if (failures) {
        printf("test_stats: %d failures\n", failures);
        return 1;
    }
    printf("test_stats: all passed\n");
    return 0;
}
