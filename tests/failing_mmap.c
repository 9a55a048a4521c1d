/* Preloaded after libcualloc.so, it refuses anonymous memory as the kernel does when it has none
 * (mmap and mremap fail with ENOMEM). File mappings (the recorder's) are left alone. Two ways to
 * choose when:
 *   - the program under test sets `failing_mmap_armed` while every anonymous mapping must fail
 *     (tests interpose_driver_streams_lost_*: the tables cualloc keeps in anonymous mappings
 *     cannot grow at the moment the program chooses);
 *   - the program sets `failing_mmap_refuse_in` to k: the k-th anonymous mapping from then on is
 *     refused, once (tests/test_setup_refused.c, which refuses each of a heap's set-up mappings);
 *   - FAILING_MMAP_NTH=k refuses the k-th anonymous mmap or mremap of the process, and with
 *     FAILING_MMAP_PERSIST=1 every one after it too (tests/check_library_host_oom.sh, which fails
 *     each of cualloc's host allocations in turn). FAILING_MMAP_REPORT=1 writes, at exit, how many
 *     there were and how many were refused, and which module asked for the first refused one:
 *     "failing_mmap: N calls, R refused, the first by PATH" on stderr (the sweep tells cualloc's own
 *     tables from the fake driver's device memory by it).
 * libcualloc's own host memory is all anonymous mappings; the sim device's bookkeeping is malloc's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/* (exported: the project builds with hidden visibility) */
#define EXPORTED __attribute__((visibility("default")))

EXPORTED int failing_mmap_armed;
EXPORTED unsigned long failing_mmap_refused; /* the mappings refused */
EXPORTED unsigned long failing_mmap_refuse_in; /* counts down to the one refused (0: none) */

static unsigned long fail_nth;      /* FAILING_MMAP_NTH; 0: not set */
static int fail_persist;            /* FAILING_MMAP_PERSIST */
static unsigned long calls;         /* anonymous mmaps and mremaps so far */
static const void *first_refused_by; /* the caller of the first refused mapping */

__attribute__((constructor)) static void failing_mmap_init(void) {
    const char *nth = getenv("FAILING_MMAP_NTH");
    if (nth) fail_nth = strtoul(nth, NULL, 10);
    const char *persist = getenv("FAILING_MMAP_PERSIST");
    fail_persist = persist && strcmp(persist, "1") == 0;
}

__attribute__((destructor)) static void failing_mmap_report(void) {
    if (!getenv("FAILING_MMAP_REPORT")) return;
    char line[600];
    Dl_info info;
    const void *by = __atomic_load_n(&first_refused_by, __ATOMIC_RELAXED);
    const char *module = by && dladdr(by, &info) && info.dli_fname ? info.dli_fname : "-";
    int n = snprintf(line, sizeof line, "failing_mmap: %lu calls, %lu refused, the first by %s\n",
                     __atomic_load_n(&calls, __ATOMIC_RELAXED),
                     __atomic_load_n(&failing_mmap_refused, __ATOMIC_RELAXED), module);
    if (n > 0 && write(2, line, (size_t)n) < 0) return;
}

/* Counts one anonymous mapping call, made from `caller`; true when it must fail. */
static int refuse(const void *caller) {
    unsigned long k = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    int fail = __atomic_load_n(&failing_mmap_armed, __ATOMIC_ACQUIRE) ||
               (fail_nth && (k == fail_nth || (fail_persist && k > fail_nth)));
    if (__atomic_load_n(&failing_mmap_refuse_in, __ATOMIC_ACQUIRE) &&
        __atomic_sub_fetch(&failing_mmap_refuse_in, 1, __ATOMIC_ACQ_REL) == 0)
        fail = 1;
    if (fail) {
        const void *none = NULL;
        __atomic_compare_exchange_n(&first_refused_by, &none, caller, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        __atomic_add_fetch(&failing_mmap_refused, 1, __ATOMIC_RELAXED);
        errno = ENOMEM;
    }
    return fail;
}

static void *next_symbol(const char *name) { return dlsym(RTLD_NEXT, name); }

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);

/* (with _FILE_OFFSET_BITS=64, as the project builds, glibc's header makes this definition mmap64) */
EXPORTED void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    if ((flags & MAP_ANONYMOUS) && refuse(__builtin_return_address(0))) return MAP_FAILED;
    static mmap_fn next;
    if (!next) {
        void *f = next_symbol("mmap");
        memcpy(&next, &f, sizeof next);
    }
    return next(addr, length, prot, flags, fd, offset);
}

/* Only the recorder's tables are remapped, and they are anonymous. */
EXPORTED void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...) {
    void *new_address = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        new_address = va_arg(ap, void *);
        va_end(ap);
    }
    if (refuse(__builtin_return_address(0))) return MAP_FAILED;
    static mremap_fn next;
    if (!next) {
        void *f = next_symbol("mremap");
        memcpy(&next, &f, sizeof next);
    }
    return next(old, old_size, new_size, flags, new_address);
}
