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

/* The records are calloc's: nothing of the slab's own to check but what the caller counts. */
int slab_check(const slab_t *s, FILE *report) {
    (void)s;
    (void)report;
    return 0;
}

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

/* Is rec the start of a record carved from slab `page`, which is carved up to `cur`? */
static bool slab_holds(const slab_t *s, const slab_page_t *page, const char *cur, const void *rec) {
    const char *first = (const char *)page + sizeof(slab_page_t), *r = rec;
    return r >= first && r < cur && (size_t)(r - first) % s->rec_size == 0;
}

int slab_check(const slab_t *s, FILE *report) {
    int bad = 0;
    if (s->rec_size < sizeof(void *) || s->rec_size % 16) {
        if (report) fprintf(report, "slab: record size %zu\n", s->rec_size);
        return 1;
    }
    /* Records carved so far: every older slab was carved until less than a record was left. */
    const size_t per_slab = (SLAB_BYTES - sizeof(slab_page_t)) / s->rec_size;
    size_t carved = 0, slabs = 0;
    const slab_page_t *newest = s->slabs;
    if (!newest) {
        if (s->cur || s->end || s->free_list) {
            bad++;
            if (report) fprintf(report, "slab: no slab, but a carving point or free records\n");
        }
    } else {
        const char *first = (const char *)newest + sizeof(slab_page_t);
        if (s->end != (const char *)newest + SLAB_BYTES || s->cur < first || s->cur > s->end ||
            (size_t)(s->cur - first) % s->rec_size) {
            if (report) fprintf(report, "slab: carving point %p is not a record boundary of the newest slab\n", (void *)s->cur);
            return bad + 1;
        }
        carved = (size_t)(s->cur - first) / s->rec_size;
        for (const slab_page_t *p = newest->next; p; p = p->next) {
            if (++slabs > ((size_t)1 << 32)) break;
            carved += per_slab;
        }
    }
    /* The free list: carved records, each once. A list that loops is longer than the records
     * carved: the walk stops there. */
    size_t free_len = 0;
    for (void *r = s->free_list; r; r = *(void **)r) {
        if (++free_len > carved) {
            bad++;
            if (report) fprintf(report, "slab: free list longer than the %zu records carved (it loops)\n", carved);
            break;
        }
        bool found = slab_holds(s, newest, s->cur, r);
        for (const slab_page_t *p = newest ? newest->next : NULL; p && !found; p = p->next)
            found = slab_holds(s, p, (const char *)p + sizeof(slab_page_t) + per_slab * s->rec_size, r);
        if (!found) {
            bad++;
            if (report) fprintf(report, "slab: free record %p is no record of the slabs\n", r);
            break; /* its link cannot be trusted */
        }
    }
    if (free_len <= carved && carved != s->live + free_len) {
        bad++;
        if (report) fprintf(report, "slab: %zu records carved, %zu handed out and %zu free\n", carved, s->live, free_len);
    }
    return bad;
}

#endif
