/* dump.c — `allocview dump`: every record of a trace, one line each (reader.c's tr_format), in
 * sequence order. main.c parses the options it shares with `summary`.
 *
 * A trace damaged after a readable prefix still prints that prefix, line for line as a whole
 * trace would, then says where it stopped (status 3): the records before the damage are what a
 * reader of a crashed run's trace wants. Standard output is flushed before each message so that
 * the message follows the last record printed when both go to one terminal or file.
 */
#include "views.h"

#include <stdio.h>

int av_cmd_dump(const char *path, unsigned flags)
{
    tr_reader_t *r = vw_open(path);
    if (!r)
        return VW_EXIT_UNREADABLE;
    tr_record_t rec;
    char line[16384];
    int k;
    while ((k = tr_next(r, &rec)) > 0) {
        tr_format(r, &rec, flags, line, sizeof line);
        puts(line);
    }
    int status = VW_EXIT_OK;
    if (k < 0) {
        fflush(stdout);
        fprintf(stderr, "allocview: %s: corrupt trace: %s; the records above are the readable prefix\n", path,
                tr_error(r));
        status = VW_EXIT_CORRUPT;
    } else if (tr_warning(r)[0]) {
        fflush(stdout);
        fprintf(stderr, "allocview: %s: %s\n", path, tr_warning(r));
    }
    tr_close(r);
    return status;
}
