/* tree.c — the classic-mode free index: a treap of free blocks ordered by (size, addr), which is
 * PyTorch's BlockComparatorSize order within one stream. It gives the exact best fit PyTorch's
 * native allocator makes (smallest size not below the request, lowest address among equals), so a
 * replay in classic mode reproduces its choices. It owns only the tree links and priorities.
 * Invariants (tree_check): in-order keys strictly ascend; each parent's priority >= its children's;
 * count and bytes equal the tree's totals. O(log n) expected per operation.
 */
#include "internal.h"

static inline int key_cmp(const block_t *a, const block_t *b) {
    if (a->size != b->size) return a->size < b->size ? -1 : 1;
    if (a->addr != b->addr) return a->addr < b->addr ? -1 : 1;
    return 0;
}

void tree_init(tree_t *t) {
    t->root = NULL;
    t->count = t->bytes = 0;
    t->rng = 0x9e3779b9u;
}

static uint32_t tree_next_prio(tree_t *t) {
    /* xorshift32: priorities only need to look random to keep the expected depth logarithmic. */
    uint32_t x = t->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t->rng = x;
    return x;
}

/* Splits `root` into keys < pivot (*lo) and keys >= pivot (*hi). */
static void tree_split(block_t *root, const block_t *pivot, block_t **lo, block_t **hi) {
    if (!root) { *lo = *hi = NULL; return; }
    if (key_cmp(root, pivot) < 0) {
        tree_split(root->link.tree.right, pivot, &root->link.tree.right, hi);
        *lo = root;
    } else {
        tree_split(root->link.tree.left, pivot, lo, &root->link.tree.left);
        *hi = root;
    }
}

/* Joins two treaps where every key of a is below every key of b. */
static block_t *tree_merge(block_t *a, block_t *b) {
    if (!a) return b;
    if (!b) return a;
    if (a->prio >= b->prio) {
        a->link.tree.right = tree_merge(a->link.tree.right, b);
        return a;
    }
    b->link.tree.left = tree_merge(a, b->link.tree.left);
    return b;
}

void tree_insert(tree_t *t, block_t *b) {
    b->prio = tree_next_prio(t);
    b->link.tree.left = b->link.tree.right = NULL;
    block_t *lo, *hi;
    tree_split(t->root, b, &lo, &hi);
    t->root = tree_merge(tree_merge(lo, b), hi);
    t->count++;
    t->bytes += b->size;
}

void tree_remove(tree_t *t, block_t *b) {
    block_t **link = &t->root;
    while (*link && *link != b) {
        int c = key_cmp(b, *link);
        link = c < 0 ? &(*link)->link.tree.left : &(*link)->link.tree.right;
    }
    if (!*link) return; /* not in this tree: tree_check reports the damage elsewhere */
    *link = tree_merge(b->link.tree.left, b->link.tree.right);
    b->link.tree.left = b->link.tree.right = NULL;
    t->count--;
    t->bytes -= b->size;
}

block_t *tree_lower_bound(const tree_t *t, size_t size) {
    block_t *best = NULL;
    for (block_t *n = t->root; n;) {
        if (n->size >= size) { /* candidate; an equal size at a lower address lies to the left */
            best = n;
            n = n->link.tree.left;
        } else {
            n = n->link.tree.right;
        }
    }
    return best;
}

block_t *tree_largest(const tree_t *t) {
    block_t *n = t->root;
    while (n && n->link.tree.right) n = n->link.tree.right;
    return n;
}

static void tree_walk(block_t *n, void (*fn)(block_t *, void *), void *arg) {
    while (n) {
        tree_walk(n->link.tree.left, fn, arg);
        block_t *right = n->link.tree.right;
        fn(n, arg);
        n = right;
    }
}

void tree_foreach(const tree_t *t, void (*fn)(block_t *, void *), void *arg) { tree_walk(t->root, fn, arg); }

typedef struct { block_t **out; size_t max, n; } collect_t;
static void collect_one(block_t *b, void *arg) {
    collect_t *c = arg;
    if (c->n < c->max) c->out[c->n] = b;
    c->n++;
}

size_t tree_collect(const tree_t *t, block_t **out, size_t max) {
    collect_t c = {out, max, 0};
    tree_walk(t->root, collect_one, &c);
    return c.n < max ? c.n : max;
}

typedef struct { const block_t *prev; size_t count, bytes, visits, limit; int bad; FILE *report; } check_t;

static void check_node(const block_t *n, check_t *c, int depth) {
    if (!n) return;
    if (depth > 10000) { c->bad++; return; }
    /* Links that loop back would be walked again and again: a walk that meets more nodes than the
     * count stops there (the count check below says the rest). */
    if (++c->visits > c->limit) {
        if (c->visits == c->limit + 1) {
            c->bad++;
            if (c->report) fprintf(c->report, "tree: more nodes than its count of %zu (links loop?)\n", c->limit - 1);
        }
        return;
    }
    const block_t *l = n->link.tree.left, *r = n->link.tree.right;
    if ((l && l->prio > n->prio) || (r && r->prio > n->prio)) {
        c->bad++;
        if (c->report) fprintf(c->report, "tree: heap order broken at block %#lx\n", (unsigned long)n->addr);
    }
    check_node(l, c, depth + 1);
    if (c->prev && key_cmp(c->prev, n) >= 0) {
        c->bad++;
        if (c->report) fprintf(c->report, "tree: key order broken at block %#lx size %zu\n", (unsigned long)n->addr, n->size);
    }
    c->prev = n;
    c->count++;
    c->bytes += n->size;
    check_node(r, c, depth + 1);
}

int tree_check(const tree_t *t, FILE *report) {
    check_t c = {NULL, 0, 0, 0, t->count + 1, 0, report};
    check_node(t->root, &c, 0);
    if (c.count != t->count || c.bytes != t->bytes) {
        c.bad++;
        if (report) fprintf(report, "tree: holds %zu blocks / %zu B, counters say %zu / %zu\n", c.count, c.bytes, t->count, t->bytes);
    }
    return c.bad;
}
