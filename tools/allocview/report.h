/* report.h — allocview's reports over analysis.c's pass: the default after-a-crash report
 * (`allocview TRACE [TRACE...]`), `peak [--at TIME|MARK]`, `sites`, `leaks`, `oom`; each with
 * --json, --no-color, --redact and --help. */
#ifndef ALLOCVIEW_REPORT_H
#define ALLOCVIEW_REPORT_H

#include <stdbool.h>

/* True for the commands this file serves ("report" is the default report). */
bool report_is_command(const char *cmd);
/* Runs `cmd` with its arguments (argv[0] is the first argument after the command). Exit status
 * as main.c's: 0, 1 usage, 2 unreadable, 3 corrupt after a readable prefix. */
int report_main(const char *cmd, int argc, char **argv);

#endif
