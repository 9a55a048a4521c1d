/* text.c — text helpers every allocview command shares (text.h). Sizes come from the library's
 * own formatter (fmt_bytes in src/error.c), so allocview and cualloc's messages print a size alike. */
#include "text.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *txt_human(uint64_t bytes, char *buf, size_t len) { return fmt_bytes((size_t)bytes, buf, len); }

void txt_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
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
