/* devices.c — see devices.h. */
#include "devices.h"

#include <stdarg.h>
#include <string.h>

#include "text.h"

bool dv_parse(const char *cmd, const char *value, dv_scope_t *s)
{
    unsigned long long dev;
    if (value && strcmp(value, "all") == 0) {
        s->all = true;
        s->one = false;
        return true;
    }
    if (value && txt_parse_count(value, 0, CUA_TRACE_MAX_DEVICES - 1, &dev)) {
        s->one = true;
        s->all = false;
        s->device = (uint32_t)dev;
        snprintf(s->why, sizeof s->why, "as asked");
        return true;
    }
    fprintf(stderr, "allocview %s: --device wants a device ordinal from 0 to %d, or 'all'\n", cmd,
            CUA_TRACE_MAX_DEVICES - 1);
    return false;
}

size_t dv_with_blocks(const dv_scope_t *s, uint32_t *out, size_t max)
{
    size_t n = 0;
    for (uint32_t d = 0; d < CUA_TRACE_MAX_DEVICES; d++)
        if (s->peak[d]) {
            if (n < max)
                out[n] = d;
            n++;
        }
    return n;
}

bool dv_pick(dv_scope_t *s, const uint64_t peak[CUA_TRACE_MAX_DEVICES], const uint32_t *oom_dev)
{
    if (s->picked)
        return false;
    memcpy(s->peak, peak, sizeof s->peak);
    uint32_t devs[2];
    if (s->one || s->all || dv_with_blocks(s, devs, 2) < 2)
        return false;
    s->one = s->picked = true;
    if (oom_dev && *oom_dev < CUA_TRACE_MAX_DEVICES) {
        s->device = *oom_dev;
        snprintf(s->why, sizeof s->why, "the first OOM's");
    } else {
        s->device = 0;
        for (uint32_t d = 1; d < CUA_TRACE_MAX_DEVICES; d++)
            if (s->peak[d] > s->peak[s->device])
                s->device = d;
        snprintf(s->why, sizeof s->why, "the highest peak");
    }
    return true;
}

bool dv_skips(const dv_scope_t *s, const tr_record_t *rec)
{
    if (!s->one || !rec->known || rec->dev == s->device)
        return false;
    switch (rec->type) {
    case CUA_TRACE_ALLOC:
    case CUA_TRACE_FREE:
    case CUA_TRACE_FREE_DONE:
    case CUA_TRACE_MAP:
    case CUA_TRACE_UNMAP:
    case CUA_TRACE_TRIM:
    case CUA_TRACE_OOM:
    case CUA_TRACE_INIT_BLOCK:
    case CUA_TRACE_INIT_MAP:
        return true;
    default:
        return false; /* the process's: marks, the end */
    }
}

/* Appends printf-style text at buf[*o] (cut at the end of buf, NUL kept). */
static void put(char *buf, size_t len, size_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    if (k > 0)
        *o = *o + (size_t)k < len ? *o + (size_t)k : len - 1;
}

bool dv_showing(const dv_scope_t *s, const char *bold, const char *plain, char *buf, size_t len)
{
    uint32_t devs[8];
    size_t n = dv_with_blocks(s, devs, 8);
    if (len == 0 || (!s->one && n < 2))
        return false;
    size_t o = 0;
    buf[0] = '\0';
    if (s->one)
        put(buf, len, &o, "%sdevice %u%s (%s)%s", bold, s->device, plain, s->why,
            s->peak[s->device] ? "" : ": no blocks on it in this trace");
    else
        put(buf, len, &o, "%sall devices summed%s", bold, plain);
    if (n >= 2) {
        put(buf, len, &o, "; blocks on %zu devices, their own peaks:", n);
        for (size_t i = 0; i < n && i < 8; i++) {
            char h[32];
            put(buf, len, &o, "%s device %u %s", i ? "," : "", devs[i], txt_human(s->peak[devs[i]], h, sizeof h));
        }
        put(buf, len, &o, "%s (--device N for one)", n > 8 ? ", ..." : "");
    }
    return true;
}

void dv_json(FILE *out, const dv_scope_t *s)
{
    if (s->one)
        fprintf(out, "%u", s->device);
    else
        fprintf(out, "null");
}
