/* devices.h — which device a report of a trace with blocks on several devices (one process
 * driving several GPUs) is of: the --device option, the default choice, the records a one-device
 * report leaves out, and the "showing" line that says which device it shows. The reports
 * (analysis.c, report.c) and the views (timeline.c, diff.c, folded.c) all follow it, so every
 * command of allocview shows the same device of the same trace.
 *
 * A peak summed over devices is no card's, and an OOM is one card's: unless --device asks for one
 * (or `all`, summed), a trace with blocks on several devices is reported for the first OOM's
 * device, else for the one with the highest peak of allocated bytes of its own. A command reads
 * the trace once whole, calls dv_pick, and reads it again for the device picked when it picks one.
 */
#ifndef CUALLOC_ALLOCVIEW_DEVICES_H
#define CUALLOC_ALLOCVIEW_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "reader.h"

typedef struct dv_scope {
    bool one;        /* only `device`'s blocks, maps and OOMs count (marks and the clock stay the trace's) */
    bool all;        /* --device all: every device's blocks summed, as asked */
    uint32_t device; /* with one */
    char why[64];    /* with one: "as asked", "the first OOM's", "the highest peak" */
    bool picked;     /* dv_pick picked `device`: peak[] holds the whole trace's, and stays */
    /* each device's own peak of allocated bytes (0: no blocks there), as the last whole read saw them */
    uint64_t peak[CUA_TRACE_MAX_DEVICES];
} dv_scope_t;

/* Parses the value of `cmd --device VALUE` (VALUE NULL: none given): a device ordinal (one, "as
 * asked") or "all". False, with a message naming cmd on stderr, for anything else. */
bool dv_parse(const char *cmd, const char *value, dv_scope_t *s);

/* After a read of the trace under s: keeps each device's own peak (peak[d]) for the showing line
 * and, when --device asked for neither one device nor all and several devices had blocks, picks the
 * device (oom_dev: the first OOM's device, NULL when there was no OOM). True when it picked one:
 * the caller reads the trace again for that device alone. Once it has picked, later calls (after
 * that read) change nothing: the peaks kept are the whole trace's. */
bool dv_pick(dv_scope_t *s, const uint64_t peak[CUA_TRACE_MAX_DEVICES], const uint32_t *oom_dev);

/* Devices with blocks (peak > 0), the first `max` of them into out; returns how many there are. */
size_t dv_with_blocks(const dv_scope_t *s, uint32_t *out, size_t max);

/* True for a record a report of s leaves out: another device's block, map, trim or OOM. (Such a
 * record still moves the trace's clock, so that times read as in the whole trace.) */
bool dv_skips(const dv_scope_t *s, const tr_record_t *rec);

/* What the report shows, for the text after its "showing" label: "device 1 (the first OOM's);
 * blocks on 2 devices, their own peaks: device 0 192.00 MiB, device 1 32.00 MiB (--device N for
 * one)", the device between `bold` and `plain` (colour escapes, or ""). False, and nothing
 * written, when there is nothing to say: a trace with one device's blocks and no --device N. */
bool dv_showing(const dv_scope_t *s, const char *bold, const char *plain, char *buf, size_t len);

/* The device shown, as a JSON value: its ordinal, or null when every device's blocks are summed. */
void dv_json(FILE *out, const dv_scope_t *s);

#endif
