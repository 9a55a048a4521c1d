/* pickle_writer.h — writes Python pickle data (protocol 4) in the subset that PyTorch's memory
 * viewer (torch/utils/viz/MemoryViz.js, behind pytorch.org/memory_viz and torch.cuda._memory_viz)
 * unpickles itself: PROTO, MARK, STOP, EMPTY_DICT, EMPTY_LIST, SETITEMS, APPENDS, TUPLE2,
 * BININT1/BININT2/BININT, LONG1, BINFLOAT, SHORT_BINUNICODE/BINUNICODE, NONE, NEWTRUE/NEWFALSE,
 * MEMOIZE and BINGET/LONG_BINGET. Nothing else is ever written (no FRAME: framing is optional, and
 * leaving it out keeps the writer streaming); Python's own pickle reads the result too.
 *
 * Containers are written open-ended: pkw_dict_begin, then for each entry pkw_key + a value, then
 * pkw_dict_end (lists: pkw_list_begin, pkw_item + a value each, pkw_list_end). Entries go out in
 * batches of PKW_BATCH between MARK and SETITEMS/APPENDS, as Python's pickler does, so no reader
 * needs an unbounded mark.
 *
 * The memo: pkw_memoize gives the value on top of the stack the next memo index (MEMOIZE — never
 * BINPUT, whose explicit index MemoryViz.js does not count) and returns it; pkw_get pushes a
 * memoized value again. A repeated value written once and fetched by index is shared in the
 * reader (one object), which is how snapshots keep repeated stacks small. pkw_str_memo memoizes
 * strings by content itself, pkw_get_keyed / pkw_memoize_keyed any value by a key of the caller's.
 *
 * Strings are written as UTF-8; invalid sequences are replaced by U+FFFD (a recorded module path
 * need not be UTF-8, and Python refuses to unpickle a string that is not). A failed write is
 * sticky: pkw_finish reports it. (Out of host memory ends the process: xalloc.h.)
 */
#ifndef ALLOCVIEW_PICKLE_WRITER_H
#define ALLOCVIEW_PICKLE_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PKW_BATCH 1000

typedef struct pkw pkw_t;

/* Starts a pickle on `out` (which stays the caller's). */
pkw_t *pkw_new(FILE *out);
/* Ends the pickle (STOP) and frees the writer; false when anything failed (message in err). */
bool pkw_finish(pkw_t *w, char *err, size_t errlen);

void pkw_none(pkw_t *w);
void pkw_bool(pkw_t *w, bool v);
void pkw_int(pkw_t *w, int64_t v);
void pkw_uint(pkw_t *w, uint64_t v);
void pkw_float(pkw_t *w, double v);
void pkw_str(pkw_t *w, const char *s, size_t len);
void pkw_cstr(pkw_t *w, const char *s);
/* A string written once and fetched from the memo afterwards (dict keys, repeated names). */
void pkw_str_memo(pkw_t *w, const char *s, size_t len);
/* Any value written once under a key of the caller's (apart from pkw_str_memo's strings) and
 * fetched after that: pkw_get_keyed pushes the value memoized under key and returns true, or
 * writes nothing and returns false; then write the value and call pkw_memoize_keyed(key). */
bool pkw_get_keyed(pkw_t *w, const char *key, size_t len);
void pkw_memoize_keyed(pkw_t *w, const char *key, size_t len);

void pkw_dict_begin(pkw_t *w);
void pkw_key(pkw_t *w, const char *key); /* the next entry's key (memoized) */
void pkw_dict_end(pkw_t *w);
void pkw_list_begin(pkw_t *w);
void pkw_item(pkw_t *w);                 /* before each list item */
void pkw_list_end(pkw_t *w);
/* The two values on top of the stack become a tuple. */
void pkw_tuple2(pkw_t *w);

uint64_t pkw_memoize(pkw_t *w);
void pkw_get(pkw_t *w, uint64_t index);

/* Bytes written so far. */
uint64_t pkw_bytes(const pkw_t *w);

#endif
