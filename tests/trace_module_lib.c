/* trace_module_lib.c — a library whose allocation allocview must name, loaded by
 * trace_module_fixture through a relative path (tests/check_allocview_modules.sh). */
#include <stddef.h>

#include "cualloc.h"

volatile int module_lib_sink;

__attribute__((visibility("default"))) void *module_lib_alloc(size_t bytes);

__attribute__((noinline)) void *module_lib_alloc(size_t bytes)
{
    void *p = cualloc_malloc(bytes, 0, NULL);
    module_lib_sink = 1;
    return p;
}
