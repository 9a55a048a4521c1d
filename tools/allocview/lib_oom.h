/* lib_oom.h — what the trace reader library (reader.c, devaddr_map.c) does when host memory runs
 * out. By default the call that needed the memory fails: tr_next reports a corrupt-trace error
 * "out of memory", a map insert returns NULL; the tests, fuzzers and benchmarks that share the
 * library see it so. A program that would rather stop sets a handler that does not return
 * (allocview: xalloc_out_of_memory, which exits with its message), so that no caller can take
 * "out of memory" for a damaged trace or go on with a table short of an entry. */
#ifndef CUALLOC_ALLOCVIEW_LIB_OOM_H
#define CUALLOC_ALLOCVIEW_LIB_OOM_H

#include <stddef.h>

void lib_oom_set_handler(void (*handler)(size_t bytes));
/* The library's allocations (malloc, calloc, realloc): a failure goes to the handler, if one is
 * set, and then the call returns NULL. */
void *lib_malloc(size_t n);
void *lib_calloc(size_t n, size_t size);
void *lib_realloc(void *p, size_t n);

#endif
