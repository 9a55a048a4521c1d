/* failalloc.c — the counter behind tests/failalloc.h (compiled without it). */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The replacements tests/failalloc.h names (declared here too: this file is built without it), and
 * the link-time wrappers of malloc, calloc and realloc (-Wl,--wrap=malloc & co.: every reference to
 * malloc in the program reaches __wrap_malloc, and __real_malloc is the C library's). */
char *failalloc_strdup(const char *s);
char *failalloc_strndup(const char *s, size_t n);
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static atomic_ulong count;
static unsigned long fail_at;
static atomic_bool failed;
static bool started;

static void report(void)
{
    if (getenv("FAILALLOC_REPORT"))
        fprintf(stderr, "failalloc: %lu allocations%s\n", (unsigned long)atomic_load(&count),
                atomic_load(&failed) ? ", one failed" : ", none failed");
}

/* True when this allocation is the one to fail. */
static bool fail_now(void)
{
    if (!started) { /* the first call: read the setting (single-threaded then: allocview starts alone) */
        started = true;
        const char *s = getenv("FAILALLOC_AT");
        fail_at = s ? strtoul(s, NULL, 10) : 0;
        atexit(report);
    }
    unsigned long n = atomic_fetch_add(&count, 1) + 1;
    if (fail_at && n == fail_at) {
        atomic_store(&failed, true);
        /* said now: a program may end without running atexit (allocview's _exit when out of memory) */
        if (getenv("FAILALLOC_REPORT"))
            fprintf(stderr, "failalloc: failed at %lu\n", n);
        errno = ENOMEM;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return fail_now() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *failalloc_strdup(const char *s) { return fail_now() ? NULL : strdup(s); }
char *failalloc_strndup(const char *s, size_t n) { return fail_now() ? NULL : strndup(s, n); }
