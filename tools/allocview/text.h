/* text.h — text helpers every allocview command shares: human sizes, JSON strings, file names,
 * option values. */
#ifndef CUALLOC_ALLOCVIEW_TEXT_H
#define CUALLOC_ALLOCVIEW_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* "512 B", "1.50 KiB", "20.00 MiB", "3.25 GiB" (binary units) into buf; returns buf. */
const char *txt_human(uint64_t bytes, char *buf, size_t len);
/* s as a JSON string literal (quoted, escaped); NULL writes "". JSON text is UTF-8: a byte of s
 * that is not part of a UTF-8 character (a Latin-1 mark, a name cut inside a character) is written
 * as \ufffd, the replacement character. */
void txt_json_string(FILE *out, const char *s);
/* The length of the UTF-8 character at s (1 to 4 bytes; ASCII, NUL included, is 1), or 0 when the
 * bytes there are not one: a stray continuation byte, an overlong form, a surrogate, a code point
 * past U+10FFFF, or a character cut short. Reads no further than the first byte that decides. */
size_t txt_utf8_char(const char *s);
/* How many of the len bytes at s fit in max without cutting a UTF-8 character in two: len when
 * len <= max, else max less the start of a character straddling the cut. */
size_t txt_utf8_cut(const char *s, size_t len, size_t max);
/* The last component of a path ("libx.so" of "/usr/lib/libx.so"): a pointer into path. */
const char *txt_base_name(const char *path);
/* Whether the paths a and b name one file (the same device and inode: a link to it, or another
 * spelling of its path, too). False when either cannot be stat'ed: an output that is not there yet
 * is no input. Commands that write a file check it against what they read before they open the
 * output, which would otherwise truncate or replace the input. */
bool txt_same_file(const char *a, const char *b);
/* The path a command writes its output OUT through (malloc'd; txt_output_end frees it):
 * "OUT.partial.PID" beside OUT, renamed over OUT once complete, so that a failed write leaves no
 * half file and an existing OUT intact; or OUT itself where OUT is there and not a regular file (a
 * FIFO, /dev/stdout, /dev/null), which the rename would replace by a regular file. NULL with errno
 * EISDIR where OUT is a directory (the rename would fail only after all the work). */
char *txt_output_path(const char *out);
/* The end of a write through tmp (txt_output_path's, once written and closed): when ok, tmp is
 * renamed over out (nothing to do where tmp is out itself), else removed; either way the partial
 * file is no longer xalloc_output's, and tmp is freed. Returns ok, or false with the reason in err
 * when the rename failed (tmp is removed then too). */
bool txt_output_end(const char *out, char *tmp, bool ok, char *err, size_t errlen);
/* An option's whole-number value: s is all decimal digits (no sign, no blanks), from lo to hi.
 * False, *out untouched, for anything else ("", "-1", "+1", " 1", "12x", "1e3", overflow). */
bool txt_parse_count(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out);
/* A size: "123", "16GiB", "40G", "512MiB", "1.5GiB": K/M/G/T and KiB/MiB/GiB/TiB are powers of
 * 1024, KB/MB/GB/TB powers of 1000; a plain number (or B) is bytes. False on anything else (a
 * blank, a sign, hex, "inf"). */
bool txt_parse_size(const char *s, uint64_t *out);

#endif
