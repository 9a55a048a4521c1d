/* oom.c — what a request that found no device memory was. One rule, shared by the heap's report
 * on stderr (heap.c), the message of cualloc_oom_message (the exception PyTorch raises through
 * enable()) and allocview's diagnosis of a recorded OOM, so that the three never disagree:
 *
 *   shortage       the live blocks plus the request exceed the heap's capacity (the device's
 *                  memory, or the cap configured): no allocator could have served it.
 *   device full    they fit in the capacity, but not in what the heap holds plus what the device
 *                  reports free. Memory outside the heap holds the rest: other processes, other
 *                  allocators in this process (a ballast, a second caching allocator), the CUDA
 *                  context's and libraries' own allocations. No setting of this heap could have
 *                  served it either; the capacity overstates what this process can have.
 *   fragmentation  they fit in what the heap holds plus the device's free memory: an allocator
 *                  that placed every block perfectly would have served it.
 * A shortage against a cap configured below the device's memory, where the device itself had room,
 * is a setting (oom_cap_reached): raising the cap fixes it.
 *
 * The figures are the ones at the failure, after the heap has released what it could: the free
 * memory is the device's own reading (cuMemGetInfo), taken then.
 */
#include <stdio.h>

#include "internal.h"

oom_kind_t oom_classify(uint64_t request, uint64_t capacity, uint64_t allocated, uint64_t reserved,
                        uint64_t device_free) {
    /* The sums are compared without wrap-around: a request near UINT64_MAX is a shortage. */
    if (request > capacity || allocated > capacity - request) return OOM_SHORTAGE;
    uint64_t room = oom_room(reserved, device_free);
    if (allocated > room || request > room - allocated) return OOM_DEVICE_FULL;
    return OOM_FRAGMENTATION;
}

uint64_t oom_room(uint64_t reserved, uint64_t device_free) {
    return reserved > UINT64_MAX - device_free ? UINT64_MAX : reserved + device_free;
}

uint64_t oom_missing(uint64_t request, uint64_t allocated, uint64_t limit) {
    uint64_t sum = allocated + request;
    if (sum >= allocated) return sum > limit ? sum - limit : 0;
    /* The sum wrapped: it is 2^64 + sum, and the excess 2^64 + sum - limit, which the unsigned
     * subtraction gives exactly when it is below 2^64 (sum < limit). */
    return sum < limit ? sum - limit : UINT64_MAX;
}

bool oom_cap_reached(uint64_t request, uint64_t capacity, uint64_t device_total, uint64_t allocated,
                     uint64_t device_room) {
    return oom_missing(request, allocated, capacity) != 0 && capacity < device_total &&
           oom_missing(request, allocated, device_total) == 0 && oom_missing(request, allocated, device_room) == 0;
}

uint64_t oom_va_factor_next(uint64_t current) {
    if (current >= VA_FACTOR_MAX) return 0;
    if (current < 2) current = 4; /* not a setting the key accepts: read as the default */
    return current > VA_FACTOR_MAX / 2 ? VA_FACTOR_MAX : current * 2;
}

uint64_t oom_vmm_large_chunk(uint64_t granularity, uint64_t chunk_size, uint64_t cap, uint64_t *wanted) {
    uint64_t chunk = granularity;
    while (chunk < chunk_size && chunk <= UINT64_MAX / 2) chunk <<= 1;
    if (wanted) *wanted = chunk;
    while (chunk > cap && chunk > granularity) chunk >>= 1;
    return chunk;
}

uint64_t oom_vmm_small_chunk(uint64_t granularity) {
    uint64_t chunk = granularity ? granularity : 1;
    while (chunk <= CUALLOC_SMALL_MAX) chunk <<= 1;
    return chunk;
}

oom_vmm_failure_t oom_vmm_failure(uint64_t need, uint64_t reserved, uint64_t cap, bool address_space_fits) {
    /* The cap first: where it refuses the new chunks, no free range of address space would have
     * served them, and raising va_factor would not fix the OOM. */
    if (oom_missing(need, reserved, cap) != 0) return OOM_VMM_CHUNKS;
    return address_space_fits ? OOM_VMM_REFUSED : OOM_VMM_ADDRESS_SPACE;
}

const char *oom_cap_key(uint64_t max_memory, uint64_t cap) {
    return max_memory && max_memory == cap ? "max_memory_mb" : "per_process_memory_fraction";
}

void oom_chunks_fix(char *buf, size_t len, uint64_t large_chunk, uint64_t granularity, const char *cap_key,
                    bool device_has_room, const char *devfree) {
    char gran[32];
    if (large_chunk > granularity)
        snprintf(buf, len,
                 "use smaller chunks (CUALLOC_CONF=chunk_size_mb:0, the device's %s); or reduce the batch size "
                 "slightly",
                 fmt_bytes(granularity, gran, sizeof gran));
    else if (cap_key && device_has_room)
        /* The cap is a setting, and the device has room for the new chunks. */
        snprintf(buf, len,
                 "raise %s, which sets the cap, if this process may use more of the device (it reports %s free); "
                 "else reduce the batch size slightly",
                 cap_key, devfree);
    else
        snprintf(buf, len, "reduce the batch size slightly (or keep it with gradient accumulation)");
}

uint64_t oom_max_split_mb(uint64_t request, uint64_t split_segment, uint64_t max_split) {
    uint64_t limit_mb = (request < split_segment ? request : split_segment) >> 20;
    uint64_t mb = 1;
    while (mb <= limit_mb / 2) mb <<= 1;
    if (mb <= 20) mb = limit_mb; /* 21..31 MiB: no power of two above 20 fits */
    if (mb <= 20 || (mb << 20) >= max_split) return 0;
    return mb;
}

int oom_classic_fixes(char *buf, size_t len, uint64_t request, uint64_t split_segment, uint64_t max_split,
                      bool expandable_asked, bool torch_too) {
    uint64_t mb = oom_max_split_mb(request, split_segment, max_split);
    char seg[32], req[32];
    int n = 0;
    size_t used = 0;
    buf[0] = '\0';
    if (!expandable_asked) {
        used += (size_t)snprintf(buf, len, "expandable segments (CUALLOC_CONF=expandable_segments:True%s)",
                                 torch_too ? ", or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" : "");
        n++;
    }
    if (mb && used < len) {
        char torch[80] = "";
        if (torch_too)
            snprintf(torch, sizeof torch, ", or PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:%llu", (unsigned long long)mb);
        snprintf(buf + used, len - used,
                 "%slower max_split_size_mb (CUALLOC_CONF=max_split_size_mb:%llu%s): smaller requests carved a segment "
                 "of %s, and under that setting they leave segments of %llu MiB and more whole",
                 n ? "; else " : "", (unsigned long long)mb, torch, fmt_bytes(split_segment, seg, sizeof seg),
                 (unsigned long long)mb);
        n++;
    }
    if (n) return n;
    /* Why not max_split_size_mb: the first condition of oom_max_split_mb's that fails. */
    if (split_segment <= 20 * MiB)
        snprintf(buf, len,
                 "max_split_size_mb, more than 20, cannot help: no segment larger than 20 MiB was carved by smaller "
                 "requests%s%s",
                 split_segment ? "; the largest carved is " : "", split_segment ? fmt_bytes(split_segment, seg, sizeof seg) : "");
    else if (request <= 20 * MiB)
        snprintf(buf, len,
                 "max_split_size_mb, more than 20, cannot help: it keeps segments whole for requests larger than 20 MiB, "
                 "and this one is %s",
                 fmt_bytes(request, req, sizeof req));
    else
        snprintf(buf, len, "max_split_size_mb is %llu already, no more than this request and the segments it carved",
                 (unsigned long long)(max_split >> 20));
    return 0;
}

void oom_address_space_fix(char *buf, size_t len, uint64_t va_factor) {
    uint64_t next = oom_va_factor_next(va_factor);
    if (next)
        snprintf(buf, len, "raise va_factor (CUALLOC_CONF=va_factor:%llu; it is %llu)", (unsigned long long)next,
                 (unsigned long long)va_factor);
    else
        snprintf(buf, len, "none in the address space (va_factor is at its maximum, %d); reduce the batch size slightly",
                 VA_FACTOR_MAX);
}
