/* error.c — the one path for user-visible messages ("cualloc: <text>" on stderr, or to a callback)
 * and the human-readable byte sizes used in them. It does not decide what is worth reporting or
 * what to do about it; callers say that in the text.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* A line longer than this is cut and ends in "..." (the unknown-key message, the longest one we
 * write, is about 500 bytes). Under PIPE_BUF (4096), so one write(2) to a pipe is atomic. */
#define ERROR_LINE_MAX 1024

/* The callback and its argument. Set rarely (tests, embedders), read on every message: each is
 * loaded atomically, but the pair is not swapped as one, so set it before threads report. */
static cua_error_fn error_fn;
static void *error_arg;

void error_set_callback(cua_error_fn fn, void *arg)
{
    __atomic_store_n(&error_arg, arg, __ATOMIC_RELEASE);
    __atomic_store_n(&error_fn, fn, __ATOMIC_RELEASE);
}

/* Writes all of buf to fd, retrying on EINTR and short writes. Lines are below PIPE_BUF, so on a
 * pipe the first write takes the whole line and lines from several threads do not interleave. */
static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report to */
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* The attribute tells the compiler fmt is a format passed on with its va_list. */
__attribute__((format(printf, 1, 0))) void cua_verror(const char *fmt, va_list ap)
{
    int saved_errno = errno; /* callers often report right after a failed call */
    char line[ERROR_LINE_MAX];
    static const char prefix[] = "cualloc: ";
    size_t len = sizeof prefix - 1;

    memcpy(line, prefix, len);
    /* Leave room for the newline and the NUL. */
    size_t room = sizeof line - len - 1;
    int n = vsnprintf(line + len, room, fmt, ap);
    if (n < 0) {
        n = 0; /* an encoding error: report the prefix alone rather than nothing */
        line[len] = '\0';
    }
    if ((size_t)n >= room) {
        len = sizeof line - 2; /* cut: vsnprintf wrote room - 1 chars */
        memcpy(line + len - 3, "...", 3);
    } else {
        len += (size_t)n;
    }
    /* No newline inside a line: a message names user input, which may hold any byte. */
    for (size_t i = sizeof prefix - 1; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';

    cua_error_fn fn = __atomic_load_n(&error_fn, __ATOMIC_ACQUIRE);
    if (fn) {
        line[len] = '\0';
        fn(line, __atomic_load_n(&error_arg, __ATOMIC_ACQUIRE));
    } else {
        line[len++] = '\n';
        write_all(STDERR_FILENO, line, len);
    }
    errno = saved_errno;
}

void cua_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cua_verror(fmt, ap);
    va_end(ap);
}

const char *fmt_bytes(size_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    const size_t nunits = sizeof units / sizeof units[0];

    if (!buf || len == 0)
        return buf;
    if (bytes < 1024) {
        snprintf(buf, len, "%zu B", bytes);
        return buf;
    }
    double v = (double)bytes;
    size_t u = 0;
    /* Move up while the value would print as 1024.00 or more in this unit, so 1048575 B is
     * "1.00 MiB", never "1024.00 KiB". */
    while (u + 1 < nunits && v >= 1024.0 - 0.005) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}
