/* cualloc-conf — prints cualloc's configuration keys from the one descriptor table in conf.c:
 *   cualloc-conf --markdown     the README's table
 *   cualloc-conf [CONF]         the configuration CONF (default: $CUALLOC_CONF) resolves to
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* rc, or 2 when standard output could not be written (a full disk): said, not hidden behind 0. */
static int stdout_written(int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "cualloc-conf: writing standard output failed\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: cualloc-conf --markdown | cualloc-conf [CONF]\n"
               "  --markdown  print every configuration key as a Markdown table\n"
               "  CONF        print the full configuration that CONF (default $CUALLOC_CONF) resolves to\n");
        return stdout_written(0);
    }
    /* One CONF string: a second word (keys given as separate words, "a:1 b:2") was left out of
     * the configuration printed, without a word. */
    if (argc > 2) {
        fprintf(stderr, "cualloc-conf: one CONF at most, its keys joined by commas (got '%s' after '%s')\n", argv[2],
                argv[1]);
        return 2;
    }
    if (argc > 1 && strcmp(argv[1], "--markdown") == 0) {
        conf_write_markdown(stdout);
        return stdout_written(0);
    }
    conf_t c;
    conf_defaults(&c);
    int problems = conf_parse(argc > 1 ? argv[1] : getenv("CUALLOC_CONF"), &c);
    char buf[4096];
    conf_format(&c, buf, sizeof buf);
    printf("%s\n", buf);
    return stdout_written(problems ? 1 : 0);
}
