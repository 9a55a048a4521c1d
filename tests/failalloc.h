/* failalloc.h — forced first (-include) into a test build of allocview (allocview_failalloc): each
 * host allocation of allocview's own code and of the cualloc library it links (the replayed heaps,
 * the sim device's bookkeeping) is counted, and the Nth (FAILALLOC_AT=N in the environment) fails
 * as a host out of memory would: NULL, errno ENOMEM. malloc, calloc and realloc are wrapped at link
 * time (-Wl,--wrap=..., tests/failalloc.c's __wrap_malloc & co.), which reaches the library's
 * objects too; strdup and strndup, whose allocation the C library makes, by the macros below.
 * With FAILALLOC_REPORT set, the failure is said on stderr when it happens ("failalloc: failed at
 * N") and the count at a normal exit ("failalloc: K allocations, none failed"). The C library's own
 * allocations (stdio buffers, qsort) are not counted. tests/check_allocview_oom.sh sweeps N. */
#ifndef CUALLOC_FAILALLOC_H
#define CUALLOC_FAILALLOC_H

#include <stdlib.h>
#include <string.h>

char *failalloc_strdup(const char *s);
char *failalloc_strndup(const char *s, size_t n);

#define strdup(s) failalloc_strdup(s)
#define strndup(s, n) failalloc_strndup(s, n)

#endif
