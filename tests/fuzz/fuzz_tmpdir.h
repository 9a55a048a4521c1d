/* fuzz_tmpdir.h — a private scratch directory for the fuzz targets whose code under test reads and
 * writes files by name: made on first use (mkdtemp), emptied and removed when the fuzzer exits
 * normally. A crash leaves it, beside libFuzzer's artifact of the input. Flat: files only. Also
 * the input written there, as any file or as the trace the allocview commands are given. */
#ifndef CUALLOC_FUZZ_TMPDIR_H
#define CUALLOC_FUZZ_TMPDIR_H

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[64];

static void fuzz_tmpdir_remove(void)
{
    DIR *d = opendir(fuzz_dir);
    if (d) {
        struct dirent *e;
        char path[sizeof fuzz_dir + 260];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", fuzz_dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(fuzz_dir);
}

/* The directory's path (aborts when none can be made: the target could test nothing). */
static const char *fuzz_tmpdir(void)
{
    if (!fuzz_dir[0]) {
        strcpy(fuzz_dir, "/tmp/cualloc-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir))
            abort();
        atexit(fuzz_tmpdir_remove);
    }
    return fuzz_dir;
}

/* The fuzzer's bytes as the file at `path`, for code under test that reads by name. False when it
 * could not be written (the run then tests nothing). */
static bool fuzz_write_input(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

/* For the targets that hand the input to allocview commands as a trace: the fuzzer's bytes as
 * DIR/in.trace, whose path it returns (NULL when it could not be written). The first call sends
 * standard output to /dev/null: what the commands print is not checked (their statuses are), and
 * millions of reports would bury libFuzzer's own lines, which go to stderr. */
static inline char *fuzz_trace_input(const uint8_t *data, size_t size)
{
    static char path[96];
    if (!path[0]) {
        snprintf(path, sizeof path, "%s/in.trace", fuzz_tmpdir());
        if (!freopen("/dev/null", "w", stdout))
            return NULL;
    }
    return fuzz_write_input(path, data, size) ? path : NULL;
}

#endif
