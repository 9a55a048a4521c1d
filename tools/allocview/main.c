/* allocview — reads the trace files cualloc records (include/cualloc_trace.h). This file owns the
 * command line and the reports of the commands implemented so far: `dump` (one line per record)
 * and `summary` (counts, peaks, completeness; text or JSON). Decoding is reader.c's.
 *
 * Exit status: 0 success (a trace cut short by a crash is normal and succeeds), 1 usage error,
 * 2 the file cannot be read as a trace (missing, not a trace, newer format), 3 the trace is
 * corrupt after a readable prefix (the output covers that prefix, and a message says where).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "reader.h"
#include "views.h"
#include "replay.h"
#include "report.h"
#include "text.h"
#include "lib_oom.h"
#include "xalloc.h"

#ifndef CUALLOC_VERSION_STRING
#define CUALLOC_VERSION_STRING "unknown"
#endif

enum { EXIT_USAGE = 1, EXIT_UNREADABLE = 2, EXIT_CORRUPT = 3 };

static void usage(FILE *out)
{
    fprintf(out,
            "allocview — reads cualloc trace files (CUALLOC_CONF=trace:PATH, cualloc_trace_start).\n"
            "\n"
            "usage: allocview [--verbose] COMMAND [OPTIONS] TRACE\n"
            "       allocview [--verbose] [--json] [--no-color] TRACE [TRACE...]\n"
            "                            the after-a-crash report: what ran, the peak and its call sites,\n"
            "                            the OOM, steps, and a diagnosis with the fix to try first; several\n"
            "                            traces (one per rank): a table of ranks first\n"
            "\n"
            "commands:\n"
            "  dump [--redact] [--offsets] TRACE\n"
            "                            one line per record, in sequence order; --redact replaces what\n"
            "                            differs between runs (pids, host, times, addresses) with '*';\n"
            "                            --offsets starts each line with the record's file offset\n"
            "  report [OPTIONS] TRACE... the default report (above)\n"
            "  peak [--at TIME|MARK] TRACE   the peak (or the state at TIME / MARK) and its call sites\n"
            "  sites TRACE               call sites holding memory at the peak and at the end\n"
            "  leaks TRACE               call sites growing step after step, never freed\n"
            "  oom TRACE                 the OOM: request, state, failing call site, what was live, diagnosis\n"
            "                            (these five: --json, --no-color, --redact, --top N, --help, and\n"
            "                            --device N|all: a trace with blocks on several devices is reported\n"
            "                            for the first OOM's device, else the one with the highest peak)\n"
            "  summary [--json] TRACE    record counts, peak requested/allocated/reserved bytes, OOMs,\n"
            "                            whether the trace is complete; --json: one JSON object\n"
            "  timeline [--width N] [--top K] [--ascii] [--no-color] [--json] [--svg FILE] TRACE\n"
            "                            live and reserved memory over time: sparklines, the peak, marks,\n"
            "                            OOMs; --svg: a stacked-area chart by call site\n"
            "  diff [--json] [--all] A B what grew from trace A to B, per call site at each peak\n"
            "  folded TRACE              the live bytes at the peak as folded stacks (flamegraph input)\n"
            "                            (timeline, diff, folded and sites --folded take --device N|all\n"
            "                            too, and show the device the five reports above show; folded\n"
            "                            says which on stderr)\n"
            "  replay [--conf CONF]... [--memory SIZE] [--passes N] [--cudafree [--device-lag N]]\n"
            "         [--min-fit] [--json] TRACE\n"
            "                            the trace's requests on cualloc's heap (sim device) under each\n"
            "                            configuration: peaks, utilisation, OOMs, smallest capacity that fits;\n"
            "                            --cudafree: every free as cudaFree, the device N requests behind\n"
            "  import SNAPSHOT.pickle -o TRACE [--device-memory SIZE]\n"
            "                            a PyTorch memory snapshot (_dump_snapshot) as a cualloc trace, on a\n"
            "                            device of SIZE (default 80GiB: a snapshot records none)\n"
            "  export --pytorch OUT.pickle [--max-entries N] TRACE\n"
            "                            the trace as a PyTorch memory snapshot, for pytorch.org/memory_viz\n"
            "  (allocview COMMAND --help: a command's own options)\n"
            "\n"
            "options:\n"
            "  --verbose                 print the analyzer's own allocator statistics at exit\n"
            "  --help, --version\n"
            "\n"
            "exit status: 0 success (a trace cut short by a crash is normal), 1 usage error, 2 the file\n"
            "cannot be read as a trace (or an output file cannot be written), 3 the trace is corrupt\n"
            "after a readable prefix (the output covers the prefix).\n");
}

static tr_reader_t *open_trace(const char *path)
{
    char err[512];
    tr_reader_t *r = tr_open(path, err, sizeof err);
    if (!r)
        fprintf(stderr, "allocview: %s: %s\n", path, err);
    return r;
}

/* ----------------------------------------------------------------------------------- dump */

static int cmd_dump(const char *path, unsigned flags)
{
    tr_reader_t *r = open_trace(path);
    if (!r)
        return EXIT_UNREADABLE;
    tr_record_t rec;
    char line[16384];
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        tr_format(r, &rec, flags, line, sizeof line);
        puts(line);
    }
    int status = 0;
    if (k < 0) {
        fflush(stdout);
        fprintf(stderr, "allocview: %s: corrupt trace: %s; the records above are the readable prefix\n", path,
                tr_error(r));
        status = EXIT_CORRUPT;
    } else if (tr_warning(r)[0]) {
        fflush(stdout);
        fprintf(stderr, "allocview: %s: %s\n", path, tr_warning(r));
    }
    tr_close(r);
    return status;
}

/* -------------------------------------------------------------------------------- summary */

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
    if (status == EXIT_CORRUPT)
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
                a->end_reason == CUA_TRACE_END_ERROR ? " (the file could not grow: later events were not recorded)" :
                                                      " (complete)");
    else
        fprintf(out, "ended      TRUNCATED: no end record (the process died, or is still running); the last "
                     "complete record is #%" PRIu64 "\n",
                f->last_seq);
    if (a->end_dropped)
        fprintf(out, "dropped    %" PRIu64 " events (allocations from signal handlers inside the recorder)\n",
                a->end_dropped);
    if (a->unmatched_frees)
        fprintf(out, "unmatched  %" PRIu64 " frees of blocks the trace never saw allocated%s\n", a->unmatched_frees,
                in->overwritten ? " (overwritten by the ring)" : "");
    if (tr_warning(r)[0])
        fprintf(out, "warning    %s\n", tr_warning(r));
    if (status == EXIT_CORRUPT)
        fprintf(out, "CORRUPT    %s; the figures above cover the records before it\n", tr_error(r));
}

static int cmd_summary(const char *path, bool json)
{
    tr_reader_t *r = open_trace(path);
    if (!r)
        return EXIT_UNREADABLE;
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
    int status = k < 0 ? EXIT_CORRUPT : 0;
    if (json)
        summary_json(stdout, path, r, a, f, status);
    else
        summary_text(stdout, path, r, a, f, status);
    if (status == EXIT_CORRUPT)
        fprintf(stderr, "allocview: %s: corrupt trace: %s\n", path, tr_error(r));
    tr_acct_free(a);
    free(a);
    free(f);
    tr_close(r);
    return status;
}

/* ----------------------------------------------------------------------------------- main */

static bool verbose;

static void print_allocator_stats(void)
{
#ifdef HAVE_JEMALLOC
    fprintf(stderr, "allocview: jemalloc statistics:\n");
    malloc_stats_print(NULL, NULL, NULL);
#else
    fprintf(stderr, "allocview: built without jemalloc (the system malloc serves); no allocator statistics\n");
#endif
}

/* What every command ends with: its output flushed, and under --verbose the heap's statistics. A
 * full disk or a closed pipe means the answer did not reach its reader, which status 0 (or 3, "the
 * output covers the prefix") would hide: status 2, as for an output file that cannot be written. */
static int finish(int status)
{
    int err = fflush(stdout) != 0 ? errno : 0;
    if ((err || ferror(stdout)) && status != EXIT_USAGE) {
        fprintf(stderr, "allocview: writing standard output failed%s%s\n", err ? ": " : "", err ? strerror(err) : "");
        status = EXIT_UNREADABLE;
    }
    if (verbose)
        print_allocator_stats();
    return status;
}

int main(int argc, char **argv)
{
    /* The trace reader's tables, too, end the process when host memory runs out (xalloc.h). */
    lib_oom_set_handler(xalloc_out_of_memory);
    /* Into a file or a pipe, the output goes out in 1 MiB pieces: a report stopped by host memory
     * running out (xalloc.h drops what is buffered) leaves nothing half written unless it was
     * larger than that. A terminal keeps its line buffering. */
    static char stdout_buffer[1 << 20];
    if (!isatty(STDOUT_FILENO))
        setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return finish(0);
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("allocview (cualloc %s), trace format %d.%d\n", CUALLOC_VERSION_STRING, CUA_TRACE_MAJOR,
                   CUA_TRACE_MINOR);
            return finish(0);
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = true;
        } else if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--no-color") == 0 ||
                   strcmp(argv[i], "--no-colour") == 0 || strcmp(argv[i], "--redact") == 0 ||
                   strcmp(argv[i], "--top") == 0 || strcmp(argv[i], "--device") == 0) {
            /* allocview --no-color TRACE: the default report's options may come first too. */
            return finish(report_main("report", argc - i, argv + i));
        } else {
            fprintf(stderr, "allocview: unknown option %s (see allocview --help)\n", argv[i]);
            return EXIT_USAGE;
        }
    }
    if (i < argc && strcmp(argv[i], "-h") == 0) {
        usage(stdout);
        return finish(0);
    }
    if (i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[i++];
    int status;
    bool json = false, redact = false, offsets = false;
    const char *path = NULL;
    if (strcmp(cmd, "dump") == 0 || strcmp(cmd, "summary") == 0) {
        for (; i < argc; i++) {
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                if (strcmp(cmd, "dump") == 0)
                    fputs("usage: allocview dump [--redact] [--offsets] TRACE\n"
                          "  Every record of the trace, one line each, in sequence order: definitions\n"
                          "  (process, configuration, devices, modules, stacks) and events (alloc, free,\n"
                          "  map, unmap, mark, oom, ...), with their fields as recorded.\n"
                          "options: --redact replace what differs between runs (pids, host, times,\n"
                          "         addresses) with '*'; --offsets start each line with the record's file\n"
                          "         offset (to find it in a damaged file)\n"
                          "exit status: 0; 2 the file cannot be read as a trace; 3 it is damaged past the\n"
                          "         records printed (a trace cut short by a killed process reads as 0)\n",
                          stdout);
                else
                    fputs("usage: allocview summary [--json] TRACE\n"
                          "  Record counts, peak requested / allocated / reserved bytes, OOMs, devices, and\n"
                          "  whether the trace is complete (an end record) or was cut short.\n"
                          "options: --json one JSON object with fixed keys, for scripts\n"
                          "exit status: 0 (also for a trace cut short by a killed process); 2 the file\n"
                          "         cannot be read as a trace; 3 it is damaged (the summary of the records\n"
                          "         before the damage is still printed)\n",
                          stdout);
                return finish(0);
            } else if (strcmp(argv[i], "--no-color") == 0 || strcmp(argv[i], "--no-colour") == 0)
                continue; /* they print no colour */
            else if (strcmp(cmd, "summary") == 0 && strcmp(argv[i], "--json") == 0)
                json = true;
            else if (strcmp(cmd, "dump") == 0 && strcmp(argv[i], "--redact") == 0)
                redact = true;
            else if (strcmp(cmd, "dump") == 0 && strcmp(argv[i], "--offsets") == 0)
                offsets = true;
            else if (strcmp(argv[i], "--verbose") == 0)
                verbose = true;
            else if (argv[i][0] == '-' && argv[i][1]) {
                fprintf(stderr, "allocview %s: unknown option %s (see allocview %s --help)\n", cmd, argv[i], cmd);
                return EXIT_USAGE;
            } else if (!path)
                path = argv[i];
            else {
                fprintf(stderr, "allocview %s: one trace file at a time (got %s and %s)\n", cmd, path, argv[i]);
                return EXIT_USAGE;
            }
        }
        if (!path) {
            fprintf(stderr, "allocview %s: which trace? (allocview %s %sTRACE)\n", cmd, cmd,
                    strcmp(cmd, "dump") == 0 ? "[--redact] " : "[--json] ");
            return EXIT_USAGE;
        }
        unsigned fmt = (redact ? TR_FMT_REDACT : 0) | (offsets ? TR_FMT_OFFSETS : 0);
        status = strcmp(cmd, "dump") == 0 ? cmd_dump(path, fmt) : cmd_summary(path, json);
    } else if (strcmp(cmd, "timeline") == 0) {
        status = av_cmd_timeline(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "diff") == 0) {
        status = av_cmd_diff(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "folded") == 0) {
        status = av_cmd_folded(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "replay") == 0) {
        status = av_cmd_replay(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "import") == 0) {
        status = av_cmd_import(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "export") == 0) {
        status = av_cmd_export(argc - i + 1, argv + i - 1);
    } else if (strcmp(cmd, "sites") == 0 && av_wants_folded(argc - i, argv + i)) {
        status = av_cmd_folded(argc - i + 1, argv + i - 1); /* sites --folded: folded.c */
    } else if (report_is_command(cmd)) {
        status = report_main(cmd, argc - i, argv + i);
    } else if (i == argc || access(cmd, F_OK) == 0) {
        status = report_main("report", argc - i + 1, argv + i - 1); /* allocview TRACE [TRACE...] */
    } else {
        fprintf(stderr, "allocview: unknown command '%s' (see allocview --help)\n", cmd);
        return EXIT_USAGE;
    }
    return finish(status);
}
