/* mix64.h — a 64-bit finalizer (MurmurHash3's fmix64): every input bit moves every output bit, and
 * it is a bijection, so distinct keys stay distinct. Shared by the recorder's stack hashing and
 * allocview's hash tables; header-only, so each user inlines it. */
#ifndef CUALLOC_MIX64_H
#define CUALLOC_MIX64_H

#include <stdint.h>

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

#endif
