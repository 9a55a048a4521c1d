/* xalloc.c — see xalloc.h. */
#include "xalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* views.h's VW_EXIT_UNREADABLE, the status of "cannot read or write a file" (README); not included:
 * the benchmarks and unit tests that build text.c, ranges.c or the pickle code take this file alone. */
enum { EXIT_OUT_OF_MEMORY = 2 };

static const char *partial_output;

void xalloc_output(const char *partial_path)
{
    partial_output = partial_path;
}

void xalloc_out_of_memory(size_t bytes)
{
    if (partial_output)
        unlink(partial_output);
    char req[48] = "";
    if (bytes)
        snprintf(req, sizeof req, " (%zu bytes)", bytes);
    fprintf(stderr, "allocview: out of host memory%s%s\n", req, partial_output ? "; nothing written" : "");
    /* _exit, not exit: what standard output holds unflushed is part of an answer, dropped. */
    _exit(EXIT_OUT_OF_MEMORY);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        xalloc_out_of_memory(n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        xalloc_out_of_memory(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        xalloc_out_of_memory(n);
    return q;
}

char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        xalloc_out_of_memory(strlen(s) + 1);
    return p;
}

char *xstrndup(const char *s, size_t n)
{
    char *p = strndup(s, n);
    if (!p)
        xalloc_out_of_memory(n + 1);
    return p;
}
