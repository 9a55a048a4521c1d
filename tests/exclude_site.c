/* exclude_site.c — a library that allocates through the CUDA runtime, built twice under two names
 * (libexcl_site.so, matched by the test's exclude: pattern, and libincl_site.so, not matched):
 * the same code at page-aligned bases, so the two libraries' call sites share their low 12 address
 * bits (interpose_prog --exclude-race). */
#include <stddef.h>

#define SITE_API __attribute__((visibility("default")))
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
SITE_API int site_malloc(void **p, size_t n);
SITE_API int site_free(void *p);

/* Not tail calls: the runtime's caller (exclude:'s subject) must be this library. */
int site_malloc(void **p, size_t n)
{
    int r = cudaMalloc(p, n);
    __asm__ volatile("" ::: "memory");
    return r;
}

int site_free(void *p)
{
    int r = cudaFree(p);
    __asm__ volatile("" ::: "memory");
    return r;
}
