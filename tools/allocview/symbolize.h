/* symbolize.h — names the frames of recorded stacks offline, from the module map records:
 * function and file:line through elfutils' libdwfl where the module file is present, has
 * symbols and its build id matches the recorded one; module+offset otherwise. Frames of the
 * allocator and the CUDA runtime (libcualloc.so, libcudart*, libcuda*, libc10_cuda*, functions
 * cudaMalloc*, cuMemAlloc*, cualloc_*) are marked to fold, so the first frame shown is the user's.
 * Without libdw (HAVE_LIBDW undefined) every native frame is module+offset. */
#ifndef ALLOCVIEW_SYMBOLIZE_H
#define ALLOCVIEW_SYMBOLIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reader.h"

typedef struct sym_ctx sym_ctx_t;

/* A context naming the stacks of `r` (which must outlive it); NULL when out of memory. */
sym_ctx_t *sym_new(const tr_reader_t *r);
void sym_free(sym_ctx_t *c);

/* The user's frames of stack `id`, innermost first, as text ("fn (file.c:12)", "fn (libx.so)",
 * "libx.so+0x1a2b", "fn (script.py:7)"). Returns how many (<= max); the strings belong to the
 * context. 0 when the stack was not captured. */
size_t sym_stack(sym_ctx_t *c, uint32_t id, const char **out, size_t max);

/* One native frame (module + offset: the return address as recorded; module NULL: offset is the
 * address): its function (NULL when unknown), source file (NULL when unknown) and line (0), and
 * whether it is the allocator's or the CUDA runtime's (fold). Strings belong to the context. */
typedef struct sym_native {
    const char *function, *file;
    int line;
    bool fold;
} sym_native_t;
void sym_native_frame(sym_ctx_t *c, const char *module, uint64_t offset, sym_native_t *out);

#endif
