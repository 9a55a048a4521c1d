/* Preloaded after libcualloc.so by the tests interpose_driver_streams_lost_*: while the program
 * under test sets `failing_mmap_armed`, every anonymous mmap fails as the kernel's does when it
 * refuses memory (ENOMEM), so that the tables cualloc keeps in anonymous mappings (grow_table.c)
 * cannot grow at the moment the program chooses. File mappings (the recorder's) are left alone. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>

/* (exported: the project builds with hidden visibility) */
#define EXPORTED __attribute__((visibility("default")))

EXPORTED int failing_mmap_armed;
EXPORTED unsigned long failing_mmap_refused; /* the mappings refused while armed */

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

EXPORTED void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    if ((flags & MAP_ANONYMOUS) && __atomic_load_n(&failing_mmap_armed, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&failing_mmap_refused, 1, __ATOMIC_RELAXED);
        errno = ENOMEM;
        return MAP_FAILED;
    }
    static mmap_fn next;
    if (!next) {
        void *f = dlsym(RTLD_NEXT, "mmap");
        memcpy(&next, &f, sizeof next);
    }
    return next(addr, length, prot, flags, fd, offset);
}
