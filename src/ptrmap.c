/* ptrmap.c — the map from an allocated block's address to its record, used by every free in
 * classic mode (VMM pools index their blocks by address directly: heap.c, by_granule). Open
 * addressing, linear probing, backward-shift deletion (no tombstones, so probe runs stay short
 * under the alloc/free churn of training). It owns only its table; blocks belong to heap.c. The
 * operations every allocation and free make are inline in internal.h; this file holds the rest. */
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define PTRMAP_MIN_CAPACITY 1024

static ptrmap_entry_t *ptrmap_table(size_t capacity) {
    void *p = mmap(NULL, capacity * sizeof(ptrmap_entry_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

bool ptrmap_init(ptrmap_t *m) {
    memset(m, 0, sizeof *m);
    m->slots = ptrmap_table(PTRMAP_MIN_CAPACITY);
    if (!m->slots) return false;
    m->mask = PTRMAP_MIN_CAPACITY - 1;
    m->shift = 64 - (unsigned)__builtin_ctzll(PTRMAP_MIN_CAPACITY);
    return true;
}

void ptrmap_destroy(ptrmap_t *m) {
    if (m->slots) munmap(m->slots, (m->mask + 1) * sizeof(ptrmap_entry_t));
    memset(m, 0, sizeof *m);
}

bool ptrmap_grow(ptrmap_t *m) {
    size_t old_cap = m->mask + 1, cap = old_cap * 2;
    ptrmap_entry_t *old = m->slots, *fresh = ptrmap_table(cap);
    if (!fresh) return false;
    m->slots = fresh;
    m->mask = cap - 1;
    m->shift--;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key) ptrmap_place(m, old[i].key, old[i].val);
    munmap(old, old_cap * sizeof(ptrmap_entry_t));
    return true;
}

void ptrmap_foreach(const ptrmap_t *m, void (*fn)(block_t *, void *), void *arg) {
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key) fn(m->slots[i].val, arg);
}

int ptrmap_check(const ptrmap_t *m, FILE *report) {
    int bad = 0;
    size_t cap = m->mask + 1, count = 0;
    /* ptrmap_home's slot lies in the table only when the shift matches the capacity. */
    if (!m->slots || (cap & m->mask) || m->shift != 64 - (unsigned)__builtin_ctzll(cap)) {
        if (report) fprintf(report, "ptrmap: capacity %zu with shift %u is not a power of two and its shift\n", cap, m->shift);
        return 1;
    }
    for (size_t i = 0; i <= m->mask; i++) {
        uintptr_t key = m->slots[i].key;
        if (!key) {
            /* ptrmap_get answers a missing key with the val of the empty slot that ends its run. */
            if (m->slots[i].val) {
                bad++;
                if (report) fprintf(report, "ptrmap: empty slot %zu holds a block\n", i);
            }
            continue;
        }
        count++;
        /* Every slot from the key's home up to i must be occupied, by other keys, or lookups would
         * stop early (or find another entry first: removal would leave this one behind). */
        for (size_t j = ptrmap_home(m, key); j != i; j = (j + 1) & m->mask) {
            if (!m->slots[j].key || m->slots[j].key == key) {
                bad++;
                if (report)
                    fprintf(report, "ptrmap: key %#lx at slot %zu is %s slot %zu\n", (unsigned long)key, i,
                            m->slots[j].key ? "a duplicate of" : "unreachable from its home past empty", j);
                break;
            }
        }
        if (!m->slots[i].val || m->slots[i].val->addr != key) {
            bad++;
            if (report) fprintf(report, "ptrmap: key %#lx maps to a block at another address\n", (unsigned long)key);
        }
    }
    if (count != m->count) {
        bad++;
        if (report) fprintf(report, "ptrmap: %zu occupied slots, count says %zu\n", count, m->count);
    }
    /* Grown at half full (ptrmap_insert): probe runs stay short and always end at an empty slot. */
    if (count * 2 > cap) {
        bad++;
        if (report) fprintf(report, "ptrmap: %zu keys in %zu slots, more than half full\n", count, cap);
    }
    return bad;
}
