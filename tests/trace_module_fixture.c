/* trace_module_fixture.c — allocations from modules whose recorded paths allocview must still
 * open (tests/check_allocview_modules.sh):
 *
 *   trace_module_fixture TRACE relative ./LIB.so   dlopen()s LIB by the relative name (the loader
 *                                                  records it as given) and allocates through it
 *   trace_module_fixture TRACE replaced            first replaces its own executable file with a
 *                                                  copy (as `cp` or an install over a running
 *                                                  program does: the running image is deleted),
 *                                                  then allocates
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cualloc.h"

static volatile int sink;

static __attribute__((noinline)) void *fixture_alloc(size_t bytes)
{
    void *p = cualloc_malloc(bytes, 0, NULL);
    sink = 1;
    return p;
}

/* Copies the executable to a new file and renames it over the old path. */
static int replace_self(void)
{
    char self[4096], tmp[4200];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return -1;
    self[k] = '\0';
    snprintf(tmp, sizeof tmp, "%s.new", self);
    FILE *in = fopen(self, "rb"), *out = fopen(tmp, "wb");
    if (!in || !out)
        return -1;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, out);
    fclose(in);
    if (fclose(out) != 0 || chmod(tmp, 0755) != 0)
        return -1;
    return rename(tmp, self);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: trace_module_fixture TRACE relative ./LIB.so | replaced\n");
        return 1;
    }
    void *p = NULL;
    if (strcmp(argv[2], "relative") == 0 && argc == 4) {
        void *lib = dlopen(argv[3], RTLD_NOW);
        void *sym = lib ? dlsym(lib, "module_lib_alloc") : NULL;
        if (!sym) {
            fprintf(stderr, "trace_module_fixture: %s\n", dlerror());
            return 1;
        }
        void *(*fn)(size_t);
        memcpy(&fn, &sym, sizeof sym);
        if (cualloc_trace_start(argv[1]) != 0)
            return 2;
        p = fn(1 << 20);
    } else if (strcmp(argv[2], "replaced") == 0) {
        if (replace_self() != 0) {
            perror("trace_module_fixture: replacing the executable");
            return 1;
        }
        if (cualloc_trace_start(argv[1]) != 0)
            return 2;
        p = fixture_alloc(1 << 20);
    } else {
        return 1;
    }
    cualloc_trace_stop();
    return p ? 0 : 3;
}
