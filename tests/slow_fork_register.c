/* Preloaded after libcualloc.so by the test interpose_runtime_fork_register: each fork-handler
 * registration libcualloc makes (__register_atfork, which pthread_atfork calls) takes 0.5 s (other
 * libraries' are left alone: the C library's own, at a first fork, would hold that fork back until
 * the registration ends), so that a process
 * that forks while another of its threads registers a handler does so inside the registration.
 * A library that registered its handler lazily, at the first stream, under pthread_once, had a
 * child forked then wait forever on the once where it is not fork-aware (ThreadSanitizer's). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef int (*register_atfork_fn)(void (*)(void), void (*)(void), void (*)(void), void *);

/* (exported: the project builds with hidden visibility) */
#define EXPORTED __attribute__((visibility("default")))

EXPORTED int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso);

/* Set as libcualloc's first registration starts: interpose_prog --fork-race waits for it before
 * its first fork, so that the fork lands inside a registration made at the first stream. */
EXPORTED int slow_fork_register_started;

EXPORTED int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso) {
    Dl_info where;
    if (child && dladdr((void *)(uintptr_t)child, &where) && where.dli_fname && strstr(where.dli_fname, "libcualloc")) {
        __atomic_store_n(&slow_fork_register_started, 1, __ATOMIC_RELEASE);
        usleep(500000);
    }
    void *f = dlsym(RTLD_NEXT, "__register_atfork");
    register_atfork_fn next;
    memcpy(&next, &f, sizeof next);
    return next ? next(prepare, parent, child, dso) : -1;
}
