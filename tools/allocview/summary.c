/* summary.c — `allocview summary [--json]`: a trace's record counts, peak requested / allocated /
 * reserved bytes (tr_acct, reader.c), OOMs, devices, the process that recorded it, and whether it
 * is complete (an END record) or was cut short; text, or one JSON object with fixed keys for
 * scripts. main.c parses the options it shares with `dump`.
 *
 * One pass over the records; memory grows with the blocks live at a time (tr_acct's table) and
 * the definitions the reader keeps, not with the trace's length. A trace damaged after a readable
 * prefix is still summarized: the figures cover the records before the damage, the output says so
 * (CORRUPT, or "error" in the JSON), and the status is 3.
 */
#include "views.h"
#include "xalloc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* What summary reports besides tr_acct. */
typedef struct facts {
    bool have_process;
    uint64_t pid, ppid;
    int64_t rank;
    char host[256], cmd[512], recorder[64];
    bool have_dev[CUA_TRACE_MAX_DEVICES];
    char dev_name[CUA_TRACE_MAX_DEVICES][96];
    uint64_t dev_capacity[CUA_TRACE_MAX_DEVICES];
    uint64_t last_seq, last_offset;
} facts_t;

static void copy_str(char *dst, size_t len, tr_str_t s)
{
    size_t n = s.len < len - 1 ? s.len : len - 1;
    memcpy(dst, s.p, n);
    dst[n] = '\0';
}

static void summary_json(FILE *out, const char *path, const tr_reader_t *r, const tr_acct_t *a, const facts_t *f,
                         int status)
{
    const tr_info_t *in = tr_info(r);
    fprintf(out, "{\"trace\": ");
    txt_json_string(out, path);
    fprintf(out, ", \"format_version\": \"%u.%u\", \"ring\": %s, \"overwritten\": %s", in->major, in->minor,
            in->ring ? "true" : "false", in->overwritten ? "true" : "false");
    fprintf(out,
            ", \"num_records\": %" PRIu64 ", \"num_allocs\": %" PRIu64 ", \"num_frees\": %" PRIu64
            ", \"num_maps\": %" PRIu64 ", \"num_unmaps\": %" PRIu64 ", \"num_trims\": %" PRIu64
            ", \"num_ooms\": %" PRIu64 ", \"num_marks\": %" PRIu64 ", \"num_init_blocks\": %" PRIu64
            ", \"num_stacks\": %u",
            a->num_records, a->num_allocs, a->num_frees, a->num_maps, a->num_unmaps, a->num_trims, a->num_ooms,
            a->num_marks, a->num_init_blocks, tr_stack_count(r));
    fprintf(out,
            ", \"peak_requested_bytes\": %" PRIu64 ", \"peak_allocated_bytes\": %" PRIu64
            ", \"peak_reserved_bytes\": %" PRIu64,
            a->requested_peak, a->allocated_peak, a->reserved_peak);
    fprintf(out,
            ", \"live_blocks_at_end\": %zu, \"requested_bytes_at_end\": %" PRIu64 ", \"allocated_bytes_at_end\": %" PRIu64
            ", \"reserved_bytes_at_end\": %" PRIu64,
            a->live.count, a->requested, a->allocated, a->reserved);
    fprintf(out, ", \"duration_ns\": %" PRIu64, a->any_event ? a->last_time - a->first_time : 0);
    fprintf(out, ", \"truncated\": %s, \"end_reason\": ", a->end_seen ? "false" : "true");
    if (a->end_seen)
        txt_json_string(out, tr_end_reason_name(a->end_reason));
    else
        fprintf(out, "null");
    fprintf(out, ", \"dropped_events\": %" PRIu64 ", \"unmatched_frees\": %" PRIu64, a->end_dropped, a->unmatched_frees);
    vw_lost_json(out, &a->lost, a->first_time);
    uint64_t events = a->num_allocs + a->num_frees;
    fprintf(out, ", \"event_bytes\": %" PRIu64 ", \"bytes_per_event\": %.2f", a->event_bytes,
            events ? (double)a->event_bytes / (double)events : 0.0);
    fprintf(out, ", \"process\": ");
    if (f->have_process) {
        fprintf(out, "{\"pid\": %" PRIu64 ", \"ppid\": %" PRIu64 ", \"rank\": %" PRId64 ", \"host\": ", f->pid, f->ppid,
                f->rank);
        txt_json_string(out, f->host);
        fprintf(out, ", \"command\": ");
        txt_json_string(out, f->cmd);
        fprintf(out, ", \"recorder\": ");
        txt_json_string(out, f->recorder);
        fprintf(out, "}");
    } else {
        fprintf(out, "null");
    }
    fprintf(out, ", \"error\": ");
    if (status == VW_EXIT_CORRUPT)
        txt_json_string(out, tr_error(r));
    else
        fprintf(out, "null");
    fprintf(out, ", \"warning\": ");
    if (tr_warning(r)[0])
        txt_json_string(out, tr_warning(r));
    else
        fprintf(out, "null");
    fprintf(out, ", \"devices\": [");
    const char *sep = "";
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++) {
        const tr_acct_dev_t *dv = &a->dev[d];
        if (!dv->seen && !f->have_dev[d])
            continue;
        fprintf(out, "%s{\"device\": %d, \"name\": ", sep, d);
        txt_json_string(out, f->have_dev[d] ? f->dev_name[d] : "");
        fprintf(out,
                ", \"capacity_bytes\": %" PRIu64 ", \"num_allocs\": %" PRIu64 ", \"num_frees\": %" PRIu64
                ", \"num_maps\": %" PRIu64 ", \"num_unmaps\": %" PRIu64 ", \"num_ooms\": %" PRIu64
                ", \"peak_requested_bytes\": %" PRIu64 ", \"peak_allocated_bytes\": %" PRIu64
                ", \"peak_reserved_bytes\": %" PRIu64 ", \"live_blocks_at_end\": %" PRIu64,
                f->dev_capacity[d], dv->num_allocs, dv->num_frees, dv->num_maps, dv->num_unmaps, dv->num_ooms,
                dv->requested_peak, dv->allocated_peak, dv->reserved_peak, dv->live_blocks);
        /* The process's own statistics from the END record, for comparison. */
        fprintf(out, ", \"reported\": ");
        const tr_end_dev_t *e = NULL;
        for (uint32_t i = 0; i < a->end_ndev; i++)
            if (a->end_devs[i].dev == (uint32_t)d)
                e = &a->end_devs[i];
        if (e) {
            fprintf(out,
                    "{\"requested_peak\": %" PRIu64 ", \"allocated_peak\": %" PRIu64 ", \"reserved_peak\": %" PRIu64
                    ", \"num_allocs\": %" PRIu64 ", \"num_frees\": %" PRIu64 ", \"num_ooms\": %" PRIu64 "}",
                    e->v[CUA_TRACE_STAT_REQUESTED_PEAK], e->v[CUA_TRACE_STAT_ALLOCATED_PEAK],
                    e->v[CUA_TRACE_STAT_RESERVED_PEAK], e->v[CUA_TRACE_STAT_NUM_ALLOCS], e->v[CUA_TRACE_STAT_NUM_FREES],
                    e->v[CUA_TRACE_STAT_NUM_OOMS]);
        } else {
            fprintf(out, "null");
        }
        fprintf(out, "}");
        sep = ", ";
    }
    fprintf(out, "]}\n");
}

static void summary_text(FILE *out, const char *path, const tr_reader_t *r, const tr_acct_t *a, const facts_t *f,
                         int status)
{
    const tr_info_t *in = tr_info(r);
    char b1[32], b2[32], b3[32];
    fprintf(out, "trace      %s (format %u.%u, %s)\n", path, in->major, in->minor,
            in->ring ? (in->overwritten ? "ring; the oldest events were overwritten" : "ring") : "linear");
    if (f->have_process) {
        fprintf(out, "process    pid %" PRIu64 " (parent %" PRIu64, f->pid, f->ppid);
        if (f->rank >= 0)
            fprintf(out, ", rank %" PRId64, f->rank);
        fprintf(out, ") on %s: %s\n", f->host, f->cmd);
        fprintf(out, "recorder   %s\n", f->recorder);
    }
    fprintf(out,
            "records    %" PRIu64 ": %" PRIu64 " allocs, %" PRIu64 " frees, %" PRIu64 " maps, %" PRIu64
            " unmaps, %" PRIu64 " trims, %" PRIu64 " OOMs, %" PRIu64 " marks; %u stack nodes\n",
            a->num_records, a->num_allocs, a->num_frees, a->num_maps, a->num_unmaps, a->num_trims, a->num_ooms,
            a->num_marks, tr_stack_count(r));
    if (a->num_init_blocks || a->num_init_maps)
        fprintf(out, "initial    %" PRIu64 " blocks and %" PRIu64 " mapped ranges were live when recording started\n",
                a->num_init_blocks, a->num_init_maps);
    if (a->any_event)
        fprintf(out, "duration   %.6f s\n", (double)(a->last_time - a->first_time) / 1e9);
    fprintf(out, "peaks      requested %s, allocated %s, reserved %s\n", txt_human(a->requested_peak, b1, sizeof b1),
            txt_human(a->allocated_peak, b2, sizeof b2), txt_human(a->reserved_peak, b3, sizeof b3));
    for (int d = 0; d < CUA_TRACE_MAX_DEVICES; d++) {
        const tr_acct_dev_t *dv = &a->dev[d];
        if (!dv->seen && !f->have_dev[d])
            continue;
        char cap[32];
        fprintf(out, "device %-3d %s, capacity %s: peaks requested %s, allocated %s, reserved %s; %" PRIu64
                     " blocks live at the end\n",
                d, f->have_dev[d] ? f->dev_name[d] : "?", txt_human(f->dev_capacity[d], cap, sizeof cap),
                txt_human(dv->requested_peak, b1, sizeof b1), txt_human(dv->allocated_peak, b2, sizeof b2),
                txt_human(dv->reserved_peak, b3, sizeof b3), dv->live_blocks);
    }
    if (a->end_seen)
        fprintf(out, "ended      %s%s\n", tr_end_reason_name(a->end_reason),
                a->end_reason == CUA_TRACE_END_LIMIT ? " (trace_max_mb reached: later events were not recorded)" :
                a->end_reason == CUA_TRACE_END_ERROR ? " (the file could not grow or be mapped: later events were not recorded)" :
                                                      " (complete)");
    else
        fprintf(out, "ended      TRUNCATED: no end record (the process died, or is still running); the last "
                     "complete record is #%" PRIu64 "\n",
                f->last_seq);
    if (a->end_dropped)
        fprintf(out, "dropped    %" PRIu64 " events (allocations from signal handlers inside the recorder)\n",
                a->end_dropped);
    char lost[400];
    if (tr_lost_text(&a->lost, &a->first_time, lost, sizeof lost))
        fprintf(out, "lost       %s\n", lost);
    if (a->unmatched_frees)
        fprintf(out, "unmatched  %" PRIu64 " frees of blocks the trace never saw allocated%s\n", a->unmatched_frees,
                in->overwritten ? " (overwritten by the ring)" : "");
    if (tr_warning(r)[0])
        fprintf(out, "warning    %s\n", tr_warning(r));
    if (status == VW_EXIT_CORRUPT)
        fprintf(out, "CORRUPT    %s; the figures above cover the records before it\n", tr_error(r));
}

int av_cmd_summary(const char *path, bool json)
{
    tr_reader_t *r = vw_open(path);
    if (!r)
        return VW_EXIT_UNREADABLE;
    tr_acct_t *a = xmalloc(sizeof *a);
    facts_t *f = xcalloc(1, sizeof *f);
    tr_acct_init(a);
    tr_record_t rec;
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        tr_acct_add(a, &rec);
        f->last_seq = rec.seq;
        if (!rec.known)
            continue;
        if (rec.type == CUA_TRACE_PROCESS) {
            f->have_process = true;
            f->pid = rec.u.process.pid;
            f->ppid = rec.u.process.ppid;
            f->rank = rec.u.process.rank;
            copy_str(f->host, sizeof f->host, rec.u.process.host);
            copy_str(f->cmd, sizeof f->cmd, rec.u.process.cmdline);
            copy_str(f->recorder, sizeof f->recorder, rec.u.process.recorder);
        } else if (rec.type == CUA_TRACE_DEVICE && rec.u.device.dev < CUA_TRACE_MAX_DEVICES) {
            int d = (int)rec.u.device.dev;
            f->have_dev[d] = true;
            copy_str(f->dev_name[d], sizeof f->dev_name[d], rec.u.device.name);
            f->dev_capacity[d] = rec.u.device.capacity;
        }
    }
    int status = k < 0 ? VW_EXIT_CORRUPT : VW_EXIT_OK;
    if (json)
        summary_json(stdout, path, r, a, f, status);
    else
        summary_text(stdout, path, r, a, f, status);
    if (status == VW_EXIT_CORRUPT)
        fprintf(stderr, "allocview: %s: corrupt trace: %s\n", path, tr_error(r));
    tr_acct_free(a);
    free(a);
    free(f);
    tr_close(r);
    return status;
}
