/* grow_table.c — a table of fixed-size entries that doubles as entries come, in its own anonymous
 * mapping: never malloc, which the program under LD_PRELOAD may replace (and whose own hooks may
 * be what is being recorded). Used for the tables of non-blocking streams, the heap's and the
 * front door's (streams created before cualloc starts), which PyTorch's stream pools alone fill
 * past any fixed size, and for the list of blocks a device reset kills (api_device_reset). */
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

void *grow_table_reserve(void *table, size_t used, size_t *cap, size_t entry_size) {
    if (used < *cap) return table;
    size_t bytes = *cap ? 2 * *cap * entry_size : (size_t)4096;
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return NULL;
    if (table) {
        memcpy(mem, table, used * entry_size);
        munmap(table, *cap * entry_size);
    }
    *cap = bytes / entry_size;
    return mem;
}

void grow_table_free(void *table, size_t cap, size_t entry_size) {
    if (table) munmap(table, cap * entry_size);
}
