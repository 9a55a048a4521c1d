/* text.c — text helpers every allocview command shares (text.h). Sizes come from the library's
 * own formatter (fmt_bytes in src/error.c), so allocview and cualloc's messages print a size alike. */
#include "text.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "xalloc.h"

const char *txt_human(uint64_t bytes, char *buf, size_t len) { return fmt_bytes((size_t)bytes, buf, len); }

size_t txt_utf8_char(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char ch = p[0];
    if (ch < 0x80)
        return 1;
    size_t n = (ch & 0xe0) == 0xc0 ? 2 : (ch & 0xf0) == 0xe0 ? 3 : (ch & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || ch == 0xc0 || ch == 0xc1 || ch >= 0xf5)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0; /* a NUL stops here too */
    if (n == 3 && ch == 0xe0 && p[1] < 0xa0)
        return 0; /* overlong */
    if (n == 3 && ch == 0xed && p[1] >= 0xa0)
        return 0; /* surrogates */
    if (n == 4 && ((ch == 0xf0 && p[1] < 0x90) || (ch == 0xf4 && p[1] >= 0x90)))
        return 0; /* overlong, or past U+10FFFF */
    return n;
}

size_t txt_utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t c = max;
    while (c > 0 && ((unsigned char)s[c] & 0xc0) == 0x80)
        c--; /* s[c], the first byte left out, continues a character: leave out its start too */
    return c;
}

void txt_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    while (s && *s) {
        unsigned char ch = (unsigned char)*s;
        size_t n = ch < 0x80 ? 1 : txt_utf8_char(s);
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(out, "\\u%04x", ch);
        else if (n == 0)
            fputs("\\ufffd", out);
        else
            fwrite(s, 1, n, out);
        s += n ? n : 1;
    }
    fputc('"', out);
}

bool txt_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

char *txt_output_path(const char *out)
{
    struct stat st;
    bool there = stat(out, &st) == 0;
    if (there && S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        return NULL;
    }
    size_t len = strlen(out) + 32;
    char *p = xmalloc(len);
    if (there && !S_ISREG(st.st_mode))
        snprintf(p, len, "%s", out);
    else
        snprintf(p, len, "%s.partial.%ld", out, (long)getpid());
    return p;
}

bool txt_output_end(const char *out, char *tmp, bool ok, char *err, size_t errlen)
{
    bool direct = strcmp(tmp, out) == 0;
    if (ok && !direct && rename(tmp, out) != 0) {
        snprintf(err, errlen, "cannot rename into place: %s", strerror(errno));
        ok = false;
    }
    if (!ok && !direct)
        unlink(tmp);
    xalloc_output(NULL);
    free(tmp);
    return ok;
}

const char *txt_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

bool txt_parse_count(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out)
{
    if (!s || *s < '0' || *s > '9')
        return false; /* strtoull would skip blanks and take a sign */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno == ERANGE || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool txt_parse_size(const char *s, uint64_t *out)
{
    /* strtod would also skip blanks and take a sign, hex ("0x10" as 16 bytes), "inf" and "nan" */
    if (!s || !((*s >= '0' && *s <= '9') || *s == '.') || strpbrk(s, "xX"))
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || isinf(v))
        return false;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1},          {"B", 1},         {"K", 0x1p10},    {"KiB", 0x1p10}, {"KB", 1e3},
        {"M", 0x1p20},    {"MiB", 0x1p20},  {"MB", 1e6},      {"G", 0x1p30},   {"GiB", 0x1p30},
        {"GB", 1e9},      {"T", 0x1p40},    {"TiB", 0x1p40},  {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 0x1p62)
                return false;
            *out = (uint64_t)(b + 0.5);
            return true;
        }
    }
    return false;
}
