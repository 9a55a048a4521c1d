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
