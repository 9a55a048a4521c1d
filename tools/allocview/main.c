/* allocview — reads the trace files cualloc records (include/cualloc_trace.h). This file owns the
 * command line: the global options, the choice of command, and the options `dump` (dump.c) and
 * `summary` (summary.c) share, which it parses for them; every other command parses its own.
 * Decoding is reader.c's.
 *
 * Exit status: 0 success (a trace cut short by a crash is normal and succeeds), 1 usage error,
 * 2 the file cannot be read as a trace (missing, not a trace, newer format), 3 the trace is
 * corrupt after a readable prefix (the output covers that prefix, and a message says where).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "reader.h"
#include "views.h"
#include "replay.h"
#include "report.h"
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
            "                            differs between runs on the sim device (pids, host, wall-clock\n"
            "                            times, thread ids, code addresses and module paths) with '*';\n"
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
                          "options: --redact replace what differs between runs on the sim device (pids,\n"
                          "         host, wall-clock times, thread ids, code addresses and module paths)\n"
                          "         with '*' (event times and device addresses stay); --offsets start each\n"
                          "         line with the record's file offset (to find it in a damaged file)\n"
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
        status = strcmp(cmd, "dump") == 0 ? av_cmd_dump(path, fmt) : av_cmd_summary(path, json);
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
