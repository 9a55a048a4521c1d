/* lib_oom.c — see lib_oom.h. */
#include "lib_oom.h"

static void (*oom_handler)(size_t bytes);

void lib_oom_set_handler(void (*handler)(size_t bytes))
{
    oom_handler = handler;
}

void lib_oom(size_t bytes)
{
    if (oom_handler)
        oom_handler(bytes);
}
