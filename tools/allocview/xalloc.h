/* xalloc.h — allocview's own host allocations. allocview is a command-line analysis: a figure
 * computed from part of a trace because a table could not grow would be wrong without saying so.
 * So each allocation of its own either succeeds or ends the process: "allocview: out of host memory
 * (N bytes)" on stderr and exit status 2, after removing the partial output file being written, if
 * any (xalloc_output), and without flushing standard output (main.c buffers it in 1 MiB pieces).
 * The trace reader (reader.c, devaddr_map.c), which the tests, fuzzers and benchmarks share as a
 * library, reports its failures to its caller unless a handler is set (lib_oom.h): allocview sets
 * xalloc_out_of_memory. */
#ifndef CUALLOC_ALLOCVIEW_XALLOC_H
#define CUALLOC_ALLOCVIEW_XALLOC_H

#include <stddef.h>

void *xmalloc(size_t n) __attribute__((malloc, returns_nonnull));
void *xcalloc(size_t n, size_t size) __attribute__((malloc, returns_nonnull));
void *xrealloc(void *p, size_t n) __attribute__((returns_nonnull));
char *xstrdup(const char *s) __attribute__((malloc, returns_nonnull));
char *xstrndup(const char *s, size_t n) __attribute__((malloc, returns_nonnull));

/* Ends the process as the functions above do when they fail; also the handler allocview gives the
 * trace reader library (lib_oom.h). bytes: the request, 0 where not known. */
__attribute__((noreturn)) void xalloc_out_of_memory(size_t bytes);

/* The partial output file (txt_output_path's OUT.partial.PID) being written, removed if host
 * memory runs out before it is complete; NULL once it is renamed into place or removed. Not
 * copied: the string must live until then. */
void xalloc_output(const char *partial_path);

#endif
