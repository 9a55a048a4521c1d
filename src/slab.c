/* slab.c — fixed-size records for the heap's metadata (block records), carved from 64 KiB
 * mmap'd slabs with a free list threaded through returned records. It owns no locking (each slab
 * belongs to one heap and is used under that heap's lock) and never touches malloc, so the
 * preloaded library does not bring a second general-purpose allocator into the host process.
 * Sanitizer builds (CUALLOC_SLAB_MALLOC) take each record from calloc so misuse is reported. */
#include <string.h>
#include <sys/mman.h>
#include <stdlib.h>

#include "internal.h"

#define SLAB_BYTES (64 * 1024)

/* Every slab starts with this header; slabs form a list for slab_destroy. */
typedef struct slab_page_s {
    struct slab_page_s *next;
    max_align_t pad_;
} slab_page_t;

void slab_init(slab_t *s, size_t rec_size) {
    memset(s, 0, sizeof *s);
    /* A free record stores the next-free pointer in its first word. */
    if (rec_size < sizeof(void *)) rec_size = sizeof(void *);
    s->rec_size = (rec_size + 15) & ~(size_t)15;
}

#ifdef CUALLOC_SLAB_MALLOC

void *slab_alloc(slab_t *s) {
    void *r = calloc(1, s->rec_size);
    if (r) s->live++;
    return r;
}

void *slab_alloc_uninit(slab_t *s) {
    void *r = malloc(s->rec_size);
    if (r) s->live++;
    return r;
}

void slab_free(slab_t *s, void *rec) {
    if (!rec) return;
    s->live--;
    free(rec);
}

void slab_destroy(slab_t *s) { s->live = 0; }

#else

/* A record from the unused tail of the newest slab, mapping a new slab when it is used up. Out of
 * line: most records come from the free list, and this keeps that path free of a stack frame. */
static __attribute__((noinline, cold)) void *slab_carve(slab_t *s) {
    if ((size_t)(s->end - s->cur) < s->rec_size) {
        void *p = mmap(NULL, SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        slab_page_t *page = p;
        page->next = s->slabs;
        s->slabs = page;
        s->cur = (char *)p + sizeof(slab_page_t);
        s->end = (char *)p + SLAB_BYTES;
    }
    void *r = s->cur;
    s->cur += s->rec_size;
    s->live++;
    return r;
}

void *slab_alloc_uninit(slab_t *s) {
    void *r = s->free_list;
    if (__builtin_expect(!r, 0)) return slab_carve(s);
    s->free_list = *(void **)r;
    s->live++;
    return r;
}

void *slab_alloc(slab_t *s) {
    void *r = slab_alloc_uninit(s);
    if (r) memset(r, 0, s->rec_size);
    return r;
}

void slab_free(slab_t *s, void *rec) {
    if (!rec) return;
    *(void **)rec = s->free_list;
    s->free_list = rec;
    s->live--;
}

void slab_destroy(slab_t *s) {
    slab_page_t *p = s->slabs;
    while (p) {
        slab_page_t *next = p->next;
        munmap(p, SLAB_BYTES);
        p = next;
    }
    s->slabs = NULL;
    s->free_list = NULL;
    s->cur = s->end = NULL;
    s->live = 0;
}

#endif
