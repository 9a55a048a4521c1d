/* ranges.c — sorted disjoint address ranges (ranges.h). */
#include "ranges.h"
#include "xalloc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

size_t ranges_after(const addr_ranges_t *m, uint64_t addr)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->v[mid].end <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool ranges_cover(const addr_ranges_t *m, uint64_t addr, uint64_t end)
{
    size_t i = ranges_after(m, addr);
    if (i == m->n || m->v[i].addr > addr)
        return false;
    uint64_t cur = m->v[i].end;
    while (cur < end) {
        if (++i == m->n || m->v[i].addr != cur)
            return false;
        cur = m->v[i].end;
    }
    return true;
}

bool ranges_overlap(const addr_ranges_t *m, uint64_t addr, uint64_t end)
{
    size_t i = ranges_after(m, addr);
    return i < m->n && m->v[i].addr < end;
}

static void insert_at(addr_ranges_t *m, size_t i, uint64_t addr, uint64_t end)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        m->v = xrealloc(m->v, cap * sizeof *m->v);
        m->cap = cap;
    }
    memmove(m->v + i + 1, m->v + i, (m->n - i) * sizeof *m->v);
    m->v[i] = (addr_range_t){addr, end};
    m->n++;
}

void ranges_add(addr_ranges_t *m, uint64_t addr, uint64_t end)
{
    insert_at(m, ranges_after(m, addr), addr, end);
}

void ranges_add_missing(addr_ranges_t *m, uint64_t addr, uint64_t end)
{
    size_t i = ranges_after(m, addr);
    uint64_t cur = addr;
    while (cur < end) {
        if (i < m->n && m->v[i].addr <= cur) {
            cur = m->v[i++].end;
            continue;
        }
        uint64_t gap_end = i < m->n && m->v[i].addr < end ? m->v[i].addr : end;
        insert_at(m, i++, cur, gap_end);
        cur = gap_end;
    }
}

void ranges_remove(addr_ranges_t *m, uint64_t addr, uint64_t end)
{
    size_t i = ranges_after(m, addr), j = i;
    while (j < m->n && m->v[j].addr < end)
        j++;
    if (i == j)
        return;
    addr_range_t first = m->v[i], last = m->v[j - 1];
    memmove(m->v + i, m->v + j, (m->n - j) * sizeof *m->v);
    m->n -= j - i;
    if (last.end > end)
        insert_at(m, i, end, last.end);
    if (first.addr < addr)
        insert_at(m, i, first.addr, addr);
}

void ranges_free(addr_ranges_t *m)
{
    free(m->v);
    *m = (addr_ranges_t){0};
}

int ranges_check(const addr_ranges_t *m, FILE *report)
{
    if (m->n > m->cap || (m->n && !m->v)) {
        if (report)
            fprintf(report, "ranges: %zu ranges in room for %zu\n", m->n, m->cap);
        return 1;
    }
    int bad = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->v[i].addr >= m->v[i].end) {
            bad++;
            if (report)
                fprintf(report, "ranges: range %zu [0x%" PRIx64 ", 0x%" PRIx64 ") is empty\n", i, m->v[i].addr,
                        m->v[i].end);
        }
        if (i + 1 < m->n && m->v[i].end > m->v[i + 1].addr) {
            bad++;
            if (report)
                fprintf(report, "ranges: range %zu ends at 0x%" PRIx64 ", past the start of the next at 0x%" PRIx64 "\n",
                        i, m->v[i].end, m->v[i + 1].addr);
        }
    }
    return bad;
}
