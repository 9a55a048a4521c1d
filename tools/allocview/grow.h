/* grow.h — a table indexed by an id read from a trace, grown on demand to cover the id. */
#ifndef CUALLOC_ALLOCVIEW_GROW_H
#define CUALLOC_ALLOCVIEW_GROW_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xalloc.h"

/* `arr` (*count elements of elem bytes) grown so that `index` lies inside it: the count doubles
 * from 64 until it does, and the new elements are zeroed. Returns the new array, or NULL when the
 * size would overflow (arr and *count are then unchanged; an id no trace can hold). Out of host
 * memory ends the process (xalloc.h). */
static inline void *av_grow_zeroed(void *arr, size_t *count, size_t index, size_t elem)
{
    if (index < *count)
        return arr;
    size_t n = *count ? *count : 64;
    while (n <= index) {
        if (n > SIZE_MAX / 2 / elem)
            return NULL;
        n *= 2;
    }
    unsigned char *p = xrealloc(arr, n * elem);
    memset(p + *count * elem, 0, (n - *count) * elem);
    *count = n;
    return p;
}

#endif
