/* dlsym_plugin.c — loaded RTLD_LOCAL by interpose_prog --dlsym-scope, linked to libdlsym_dep.so: the
 * look-ups a Python extension module or a malloc wrapper makes. Under LD_PRELOAD, every dlsym in the
 * process reaches cualloc's, which must answer as glibc would for this caller. Each look-up is
 * reported to the program: 1 found (and right), 0 not. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT, RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <stdlib.h>

int dlsym_dep_fn(void);
__attribute__((visibility("default"))) int plugin_lookups(int out[3]);

int plugin_lookups(int out[3])
{
    /* RTLD_DEFAULT: the caller's scope, its own dependencies included. */
    int (*dep)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "dlsym_dep_fn");
    out[0] = dep != NULL && dep() == 42;
    /* RTLD_NEXT: the objects after the caller in its scope: its dependency's definition... */
    dep = (int (*)(void))dlsym(RTLD_NEXT, "dlsym_dep_fn");
    out[1] = dep != NULL && dep() == 42;
    /* ...and libc's malloc (a wrapper calling it through this pointer crashed when it was NULL). */
    void *(*next_malloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    void *p = next_malloc ? next_malloc(64) : NULL;
    out[2] = p != NULL;
    free(p);
    return dlsym_dep_fn(); /* the link to the dependency is used */
}
