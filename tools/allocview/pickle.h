/* pickle.h — a reader for the subset of Python's pickle format that PyTorch's
 * torch.cuda.memory._dump_snapshot writes (protocols 2 to 5): dicts, lists, tuples, strings (and
 * bytes, read as strings), integers (BININT*, LONG1/LONG4 up to 64 bits), floats, booleans, None,
 * the memo (PUT/GET/MEMOIZE) and FRAME. It is an allow-list: every other opcode — above all
 * GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, which would name and call Python code —
 * is refused with an error naming the opcode and its offset. Nothing is ever executed.
 *
 * The input is untrusted: every length is checked against the bytes left, the nesting (MARK
 * depth), the value stack, the memo and the total memory are bounded (pk_limits_t), and an error
 * is a message, never a crash. Values live in an arena owned by the document; memo references
 * share values, so a document may contain cycles (a list that holds itself): walk it only along
 * the keys you expect, never recursively without a depth bound.
 */
#ifndef CUALLOC_PICKLE_H
#define CUALLOC_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PY_NONE = 0, PY_BOOL, PY_INT, PY_FLOAT, PY_STR, PY_BYTES, PY_LIST, PY_TUPLE, PY_DICT,
} py_kind_t;

typedef struct py py_t;
struct py {
    uint8_t kind;             /* py_kind_t (internally also the MARK sentinel) */
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t len; } s;   /* STR, BYTES: not NUL-terminated */
        struct { py_t **v; size_t n, cap; } seq;  /* LIST, TUPLE; DICT: keys and values alternate */
    } u;
};

typedef struct pk_limits {
    size_t max_depth;         /* MARKs open at once (default 256) */
    size_t max_stack;         /* values on the stack (default 1 << 22) */
    size_t max_memo;          /* memo slots (default 1 << 24) */
    size_t max_bytes;         /* arena + tables (default 1 GiB) */
} pk_limits_t;

typedef struct pk_doc pk_doc_t;

/* Parses data[0..len). NULL with a message in err ("offset 123: opcode GLOBAL (0x63) is not
 * allowed: ..."). limits may be NULL (defaults). */
pk_doc_t *pk_load(const void *data, size_t len, const pk_limits_t *limits, char *err, size_t errlen);
const py_t *pk_root(const pk_doc_t *doc);
size_t pk_bytes_used(const pk_doc_t *doc);
void pk_free(pk_doc_t *doc);

/* Accessors; all accept NULL and answer "absent" for the wrong kind. */
const py_t *py_dict_get(const py_t *dict, const char *key);       /* by string key; a repeated key: its last value */
size_t py_len(const py_t *seq);                                   /* LIST/TUPLE items, DICT pairs */
const py_t *py_item(const py_t *seq, size_t i);                   /* LIST/TUPLE item i */
bool py_as_int(const py_t *v, int64_t *out);                      /* INT or BOOL */
bool py_as_double(const py_t *v, double *out);                    /* FLOAT or INT */
bool py_str_eq(const py_t *v, const char *s);                     /* STR equal to s */
/* Copies a STR/BYTES into buf (cut to len-1, NUL-terminated); "" for anything else. */
const char *py_as_cstr(const py_t *v, char *buf, size_t len);
/* The name of an opcode ("GLOBAL"), or NULL when it is not a pickle opcode. */
const char *pk_opcode_name(uint8_t op);

#endif
