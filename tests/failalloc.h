/* failalloc.h — forced first (-include) into a test build of allocview (allocview_failalloc): each
 * malloc, calloc, realloc, strdup and strndup of allocview's own code is counted, and the Nth
 * (FAILALLOC_AT=N in the environment) fails as a host out of memory would: NULL, errno ENOMEM.
 * With FAILALLOC_REPORT set, the failure is said on stderr when it happens ("failalloc: failed at
 * N") and the count at a normal exit ("failalloc: K allocations, none failed"). The C library's own
 * allocations (stdio buffers, qsort) are not counted. tests/check_allocview_oom.sh sweeps N. */
#ifndef CUALLOC_FAILALLOC_H
#define CUALLOC_FAILALLOC_H

#include <stdlib.h>
#include <string.h>

void *failalloc_malloc(size_t n);
void *failalloc_calloc(size_t n, size_t size);
void *failalloc_realloc(void *p, size_t n);
char *failalloc_strdup(const char *s);
char *failalloc_strndup(const char *s, size_t n);

#define malloc(n) failalloc_malloc(n)
#define calloc(n, size) failalloc_calloc(n, size)
#define realloc(p, n) failalloc_realloc(p, n)
#define strdup(s) failalloc_strdup(s)
#define strndup(s, n) failalloc_strndup(s, n)

#endif
