/* sizeclass.c — the TLSF-style free index of expandable (VMM) pools: segregated bins with two
 * levels of bitmaps, O(1) insert, remove and search. It owns only the bin lists and bitmaps; the
 * blocks and their splitting and coalescing belong to heap.c.
 *
 * Sizes are multiples of 512 B, counted in units u = size / 512. Units below 32 each have an exact
 * bin (first level 0); above, each power of two [2^f, 2^(f+1)) is cut into 32 equal bins. The
 * mapping, insert, remove, resize and search are inline in internal.h (the heap's miss path calls
 * them often).
 */
#include <string.h>

#include "internal.h"

void sizeclass_init(sizeclass_t *sc) { memset(sc, 0, sizeof *sc); }

block_t *sizeclass_find_cut(const sizeclass_t *sc, unsigned fl, unsigned sl, size_t size) {
    unsigned above = sizeclass_above(sc, fl, sl);
    if (above == SC_BIN(fl, sl) + 1) return sc->bins[above];
    block_t *best = NULL;
    for (block_t *b = sc->bins[SC_BIN(fl, sl)]; b; b = b->link.list.next_free)
        if (b->size >= size && (!best || b->size < best->size)) best = b;
    return best ? best : above ? sc->bins[above] : NULL;
}

block_t *sizeclass_largest(const sizeclass_t *sc) {
    if (!sc->fl_bitmap) return NULL;
    unsigned fl = floor_log2(sc->fl_bitmap);
    unsigned sl = 31u - (unsigned)__builtin_clz(sc->sl_bitmap[fl]);
    block_t *best = NULL;
    for (block_t *b = sc->bins[SC_BIN(fl, sl)]; b; b = b->link.list.next_free)
        if (!best || b->size > best->size) best = b;
    return best;
}

void sizeclass_foreach(const sizeclass_t *sc, void (*fn)(block_t *, void *), void *arg) {
    for (unsigned fl = 0; fl < SC_FL_COUNT; fl++) {
        if (!(sc->fl_bitmap & (1ull << fl))) continue;
        for (unsigned sl = 0; sl < SC_SL_COUNT; sl++) {
            block_t *b = sc->bins[SC_BIN(fl, sl)];
            while (b) {
                block_t *next = b->link.list.next_free;
                fn(b, arg);
                b = next;
            }
        }
    }
}

int sizeclass_check(const sizeclass_t *sc, FILE *report) {
    int bad = 0;
    size_t count = 0, bytes = 0;
    for (unsigned fl = 0; fl < SC_FL_COUNT; fl++) {
        for (unsigned sl = 0; sl < SC_SL_COUNT; sl++) {
            block_t *head = sc->bins[SC_BIN(fl, sl)];
            bool bit = (sc->sl_bitmap[fl] >> sl) & 1u;
            if (bit != (head != NULL)) {
                bad++;
                if (report) fprintf(report, "sizeclass: bin (%u,%u) bitmap bit %d but list %s\n", fl, sl, bit, head ? "non-empty" : "empty");
            }
            block_t *prev = NULL;
            for (block_t *b = head; b; prev = b, b = b->link.list.next_free) {
                /* A list that loops comes back to a block whose back link names another: the walk
                 * stops there, so that a damaged index is reported, not walked for ever. */
                if (b->link.list.prev_free != prev) {
                    bad++;
                    if (report) fprintf(report, "sizeclass: block %#lx has a broken back link\n", (unsigned long)b->addr);
                    break;
                }
                unsigned bfl, bsl;
                sizeclass_mapping(b->size, &bfl, &bsl);
                if (bfl != fl || bsl != sl || b->bin != SC_BIN(fl, sl)) {
                    bad++;
                    if (report) fprintf(report, "sizeclass: block %#lx size %zu in bin (%u,%u), belongs in (%u,%u), records bin %u\n",
                                        (unsigned long)b->addr, b->size, fl, sl, bfl, bsl, (unsigned)b->bin);
                }
                count++;
                bytes += b->size;
            }
        }
        bool fbit = (sc->fl_bitmap >> fl) & 1u;
        if (fbit != (sc->sl_bitmap[fl] != 0)) {
            bad++;
            if (report) fprintf(report, "sizeclass: first-level bit %u is %d but second level is %#x\n", fl, fbit, sc->sl_bitmap[fl]);
        }
    }
    if (count != sc->count || bytes != sc->bytes) {
        bad++;
        if (report) fprintf(report, "sizeclass: lists hold %zu blocks / %zu B, counters say %zu / %zu\n", count, bytes, sc->count, sc->bytes);
    }
    return bad;
}
