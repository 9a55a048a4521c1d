/* softcheck.h — non-fatal checks for tests that list every failure before giving up (the parsers'
 * and formatters' tables of cases): each failed CHECK prints where and counts in `failures`; the
 * test's main reports the count and fails when it is not zero. The count is atomic: the interpose
 * programs check from several threads. */
#ifndef CUALLOC_SOFTCHECK_H
#define CUALLOC_SOFTCHECK_H

#include <stdatomic.h>
#include <stdio.h>

static atomic_int failures;
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);           \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                   \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

#endif
