/* views.h — allocview's time and call-site views: `timeline` (timeline.c), `diff` (diff.c) and
 * `folded` (folded.c), plus what they share, implemented in folded.c:
 *
 *  - vw_replay_t: the live state replayed from the events (live blocks keyed by device and address,
 *    with the stack that allocated them; live bytes per stack id; allocated and reserved totals,
 *    summed over the devices fed, as tr_acct does; each device's own allocated peak and the first
 *    OOM's device, for devices.h's choice). Memory grows with live blocks and stacks only.
 *  - devices: like the reports, the views of a trace with blocks on several devices show one device
 *    (devices.h): each reads the trace whole, lets dv_pick choose, and reads it again for the device
 *    picked, skipping the other devices' records (dv_skips) before they reach the replay.
 *  - call-site naming: a call site is a whole stack (the stack id of the ALLOC record), named as
 *    the report names it (symbolize.h): the user's frames, the allocator's and the CUDA runtime's
 *    folded away; a native frame reads "function (file.c:12)" where the module file has debug
 *    information and matches the recorded build id, "module+0xOFFSET" otherwise; a Python frame
 *    "function (file:line)". Names and keys use only what is the same from run to run (no
 *    addresses where a module is known), so `diff` can match sites of two traces. Stacks with the
 *    same frames (they differ only in frames folded away) are one line of folded; timeline and
 *    diff make the stacks whose labels are the same one site, as the report makes them one row.
 *  - vw_peak_sites: each stack's live bytes at the moment of the allocated peak (two passes).
 *
 * It declares too the record-by-record commands, `dump` (dump.c) and `summary` (summary.c), which
 * share vw_open and the exit statuses but name no call sites.
 */
#ifndef CUALLOC_VIEWS_H
#define CUALLOC_VIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "devices.h"
#include "reader.h"
#include "symbolize.h"
#include "text.h"

/* allocview's exit statuses (main.c). */
enum { VW_EXIT_OK = 0, VW_EXIT_USAGE = 1, VW_EXIT_UNREADABLE = 2, VW_EXIT_CORRUPT = 3 };

/* Commands: argv[0] is the command's name; they parse their own options. */
int av_cmd_timeline(int argc, char **argv);
int av_cmd_diff(int argc, char **argv);
int av_cmd_folded(int argc, char **argv);
/* true when the arguments hold --folded (main.c sends `sites --folded` to av_cmd_folded). */
bool av_wants_folded(int argc, char **argv);
/* `dump` and `summary` of the trace at path. main.c parses their options, which the two share (a
 * --verbose among them is main.c's), and passes what they set: dump's flags are reader.h's
 * TR_FMT_*, summary's json its --json. They print the readable prefix of a damaged trace too and
 * return 0, VW_EXIT_UNREADABLE or VW_EXIT_CORRUPT, with a message on stderr for the last two. */
int av_cmd_dump(const char *path, unsigned flags);
int av_cmd_summary(const char *path, bool json);

/* ------------------------------------------------------------------------------ replay */

typedef struct vw_replay {
    uint64_t live, reserved;          /* allocated (rounded) and mapped bytes, all devices */
    uint64_t live_peak, reserved_peak;
    uint64_t live_peak_seq, live_peak_time; /* the record that first reached live_peak */
    uint64_t reserved_peak_time;
    uint64_t *site_bytes;             /* live bytes per stack id (index 0: no stack) */
    size_t site_cap;                  /* entries of site_bytes */
    devaddr_map_t blocks;             /* live blocks (struct vw_live in folded.c) */
    /* per device (a device past CUA_TRACE_MAX_DEVICES counts as 0, as tr_acct counts it) */
    uint64_t dev_live[CUA_TRACE_MAX_DEVICES], dev_peak[CUA_TRACE_MAX_DEVICES];
    bool have_oom;                    /* an OOM record was fed; oom_dev: the first one's device */
    uint32_t oom_dev;
    tr_lost_t lost;                   /* the LOST records fed */
} vw_replay_t;

void vw_replay_init(vw_replay_t *s);
void vw_replay_free(vw_replay_t *s);
/* Feeds one record (any type; only the events that change live or reserved bytes count).
 * Returns the stack id whose bytes changed (0 too), or -1 when live bytes did not change. */
int64_t vw_replay_add(vw_replay_t *s, const tr_record_t *rec);

/* ------------------------------------------------------------------------------ naming */

#define VW_MAX_FRAMES 512
#define VW_MAX_FRAMES_TEXT "512" /* the same, for messages */

/* A call site's user frames (sym_stack: the allocator's and the CUDA runtime's folded away),
 * innermost first, the first VW_SITE_FRAMES of them; `stack` its id. */
#define VW_SITE_FRAMES VW_MAX_FRAMES
typedef struct vw_site_frames {
    const char *f[VW_SITE_FRAMES]; /* the symbolizer's strings */
    size_t n;
    const char *label[VW_SITE_FRAMES]; /* what its label is made of (sym_stack_label) */
    size_t nlabel;
    uint32_t stack;
} vw_site_frames_t;
void vw_site_frames(sym_ctx_t *sym, uint32_t stack, vw_site_frames_t *out);
/* The label of v[i] among the n sites listed with it (sym_label: frames down to the one that
 * tells it apart; " [stack N]" when another site has the same frames). */
void vw_site_label(const vw_site_frames_t *v, size_t n, size_t i, char *buf, size_t len);
/* The site's frames, root first, separated by ';': the folded-stack line of flamegraph tools.
 * Returns the length written (the text is cut at len-1). */
size_t vw_site_folded(const vw_site_frames_t *s, char *buf, size_t len);
/* What stacks are matched by as call sites: the label at full depth (sym_label of all its label
 * frames). Stacks with the same key differ only where a label does not look (the allocator's
 * frames, the operators of one Python line) and are one site: the report's row, timeline's site,
 * diff's site between two traces. */
void vw_site_key(const vw_site_frames_t *s, char *buf, size_t len);

/* ------------------------------------------------------------------------- peak sites */

/* Live bytes of every stack at the allocated peak (replays the trace twice: the first pass finds
 * the peak, the second stops there; the first runs again, for one device, when dv_pick picks one
 * in *scope). On success returns 0 or VW_EXIT_CORRUPT (the figures cover the readable prefix) and
 * leaves *rp open (definitions read up to the peak at least — the whole trace is read) for naming;
 * VW_EXIT_UNREADABLE with a message printed otherwise. */
typedef struct vw_peak {
    uint64_t live_peak, reserved_peak, peak_time;
    uint64_t *bytes;     /* per stack id, at the peak */
    size_t nstacks;      /* entries of bytes */
    bool truncated;      /* no END record */
    tr_lost_t lost;      /* the recorder's LOST records: the call sites may lack frames */
} vw_peak_t;
int vw_peak_sites(const char *path, dv_scope_t *scope, tr_reader_t **rp, vw_peak_t *p);
void vw_peak_free(vw_peak_t *p);

/* Writes the folded stacks of the live bytes at the peak: `frame;frame;frame bytes` lines, root
 * first, one per site with live bytes, largest first. For `folded` and `sites --folded`. Of the
 * device *scope asks for or dv_pick picks; which one is said on stderr (the format has no room). */
int vw_write_folded(FILE *out, const char *path, dv_scope_t *scope);

/* `"recorder_lost": null` or `{"tables": ["stacks", ...], "time_ns": N}` (N counted from t0, below
 * 0 when the refusal came before a ring's window), after a comma: the JSON of tr_lost_text's warning, in every view that names call sites. */
void vw_lost_json(FILE *out, const tr_lost_t *l, uint64_t t0);

/* Opens a trace, printing "allocview: PATH: why" when it cannot. */
tr_reader_t *vw_open(const char *path);
/* Reports the end of a read: the corrupt message (VW_EXIT_CORRUPT) or the warning (0). */
int vw_finish(const char *cmd, const char *path, tr_reader_t *r, int k);

#endif
