/* lib_oom.c — see lib_oom.h. */
#include "lib_oom.h"

#include <stdlib.h>

static void (*oom_handler)(size_t bytes);

void lib_oom_set_handler(void (*handler)(size_t bytes))
{
    oom_handler = handler;
}

/* p, or the handler's turn when p is NULL (an allocation of `bytes` failed). */
static void *checked(void *p, size_t bytes)
{
    if (!p && oom_handler)
        oom_handler(bytes);
    return p;
}

void *lib_malloc(size_t n)
{
    return checked(malloc(n ? n : 1), n);
}

void *lib_calloc(size_t n, size_t size)
{
    return checked(calloc(n ? n : 1, size ? size : 1), n * size);
}

void *lib_realloc(void *p, size_t n)
{
    return checked(realloc(p, n ? n : 1), n);
}
