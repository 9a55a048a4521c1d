/* symbolize.h — names the frames of recorded stacks offline, from the module map records:
 * function and file:line through elfutils' libdwfl where the module file is present, has
 * symbols and its build id matches the recorded one (with the functions inlined at the address,
 * from the debug information); module+offset otherwise (a file whose build id differs is named
 * on stderr, once per context). C++ names are demangled, without their
 * parameter lists. Frames of the allocator and the CUDA runtime (libcualloc.so, libcudart*,
 * libcuda*, libc10_cuda*, functions cudaMalloc*, cuMemAlloc*, cualloc_*, PyTorch's
 * CUDACachingAllocator and CUDAPluggableAllocator) are marked to fold, so the first frame shown
 * is the user's; the interpreter's, PyTorch dispatcher's and process start-up's frames (plumbing)
 * are left out of call sites too.
 * Without libdw (HAVE_LIBDW undefined) every native frame is module+offset. */
#ifndef ALLOCVIEW_SYMBOLIZE_H
#define ALLOCVIEW_SYMBOLIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reader.h"

typedef struct sym_ctx sym_ctx_t;

/* A context naming the stacks of `r` (which must outlive it). */
sym_ctx_t *sym_new(const tr_reader_t *r);
void sym_free(sym_ctx_t *c);

/* The user's frames of stack `id`, innermost first, as text ("fn (file.c:12)", "fn (libx.so)",
 * "libx.so+0x1a2b", "fn (script.py:7)"), inlined functions as frames of their own. Returns how
 * many (<= max); the strings belong to the context. 0 when the stack was not captured. */
size_t sym_stack(sym_ctx_t *c, uint32_t id, const char **out, size_t max);
/* The frames a label of stack `id` is made of: its innermost user frame, then, in a Python
 * program, only the Python source frames (the native frames between an allocation and the Python
 * line behind it are many and alike); otherwise the same as sym_stack. */
size_t sym_stack_label(sym_ctx_t *c, uint32_t id, const char **out, size_t max);

/* Labels of call sites listed together: a site's user frames (from sym_stack, innermost first),
 * joined by " <- ", down to the first frame that tells it apart from every other site listed (an
 * allocation helper shared by many sites is followed by its callers), at most SYM_LABEL_FRAMES.
 * sym_label_depth: how many frames of f tell it apart from g (one more than their common
 * prefix); the caller takes the largest over the other sites. sym_label writes the label;
 * `recorded`: the site has a stack (no frames then means only the allocator's frames). */
#define SYM_LABEL_FRAMES 6
size_t sym_label_depth(const char *const *f, size_t n, const char *const *g, size_t m);
void sym_label(const char *const *f, size_t n, size_t depth, bool recorded, char *buf, size_t len);

/* One native frame (module + offset: the return address as recorded; module NULL: offset is the
 * address) as source-level frames, innermost first: inside inlined code, each inlined function
 * and then the function it was inlined into, each with its source file and line at the call
 * (function NULL when unknown, file NULL, line 0). `fold`: the frame is the allocator's or the
 * CUDA runtime's (every one of a native frame in their modules or functions; in a user's function,
 * only an allocator's function inlined into it and what is inlined into that). Returns how many (at least 1 when max > 0); the strings
 * belong to the context. */
#define SYM_INLINE_MAX 16 /* source-level frames kept per native frame */
typedef struct sym_native {
    const char *function, *file;
    int line;
    bool fold;     /* the allocator's or the CUDA runtime's */
    bool plumbing; /* interpreter, dispatcher or process start-up: left out of call sites */
} sym_native_t;
size_t sym_native_frames(sym_ctx_t *c, const char *module, uint64_t offset, sym_native_t *out, size_t max);

#endif
