/* fuzz_conf.c — libFuzzer target for conf.c's parser: any byte string given to conf_parse must
 * neither crash nor read out of bounds, must report exactly one message per problem it counts,
 * and whatever configuration results must survive conf_format -> conf_parse unchanged.
 * Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc
 *        tests/fuzz/fuzz_conf.c src/conf.c src/error.c -o fuzz_conf -lm
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t messages;

static void count_message(const char *line, void *arg)
{
    (void)arg;
    messages++;
    /* One line, prefixed, bounded (error.c's contract). */
    if (strncmp(line, "cualloc: ", 9) != 0 || strchr(line, '\n') || strlen(line) >= 1024)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* conf_parse takes a C string: copy the input and terminate it (an embedded NUL simply ends
     * the text early, as it would in the environment). */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    error_set_callback(count_message, NULL);
    conf_t c;
    conf_defaults(&c);
    messages = 0;
    int problems = conf_parse(text, &c);
    if (problems < 0 || (size_t)problems != messages)
        abort();

    /* Round trip of whatever was accepted. */
    char buf[2048], again[2048];
    size_t n = conf_format(&c, buf, sizeof buf);
    if (n >= sizeof buf)
        abort();
    conf_t d;
    conf_defaults(&d);
    messages = 0;
    if (conf_parse(buf, &d) != 0 || messages != 0)
        abort();
    conf_format(&d, again, sizeof again);
    if (strcmp(buf, again) != 0)
        abort();

    free(text);
    return 0;
}
