/* torch_abi.cc — the PyTorch pluggable-allocator ABI (libcualloc_torch.so): the two extern "C"
 * functions torch.cuda.memory.CUDAPluggableAllocator loads by name, over cualloc's public API.
 * It owns only the OOM exception and its message; every allocation decision is libcualloc.so's.
 *
 * Why C++: PyTorch calls the malloc function through a std::function and never checks for NULL,
 * so a failed allocation must be reported by throwing. A std::runtime_error thrown here crosses
 * into libtorch and surfaces in Python as RuntimeError with our message (verified on a GPU,
 * ../shared/GPU-FACTS.md). That only works if this library and libtorch share one libstdc++ and
 * its type_info for std::runtime_error: link libstdc++ dynamically, never -static-libstdc++.
 *
 * Contract with PyTorch (torch/csrc/cuda/CUDAPluggableAllocator.cpp):
 *   - malloc(size, device, stream) is called with the current device and its current stream; the
 *     returned pointer keys PyTorch's metadata map, so size 0 must still give a unique pointer
 *     (cualloc_malloc(0) does).
 *   - free(ptr, size, device, stream) gets back the size, device and stream of the allocation.
 *     cualloc orders the free on that stream: the memory is reusable by that stream at once and by
 *     others once its work has completed. record_stream is not forwarded by PyTorch, so a tensor
 *     also used on another stream is not protected (see README).
 * Thread-safety: both functions may be called from any thread (cualloc's API is thread-safe).
 */
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <stdexcept>

#include "cualloc.h"

namespace {

/* PyTorch's own size format (c10 format_size): bytes below 1 KiB, then KiB, MiB, and GiB for
 * everything larger (a 1 TiB request reads "1024.00 GiB", as PyTorch would print it). */
const char *torch_fmt_size(size_t bytes, char *buf, size_t len) {
    if (bytes < ((size_t)1 << 10))
        std::snprintf(buf, len, "%zu bytes", bytes);
    else if (bytes < ((size_t)1 << 20))
        std::snprintf(buf, len, "%.2f KiB", (double)bytes / (double)((size_t)1 << 10));
    else if (bytes < ((size_t)1 << 30))
        std::snprintf(buf, len, "%.2f MiB", (double)bytes / (double)((size_t)1 << 20));
    else
        std::snprintf(buf, len, "%.2f GiB", (double)bytes / (double)((size_t)1 << 30));
    return buf;
}

/* Builds the message for a request cualloc_malloc could not serve. It starts with "CUDA out of
 * memory", like PyTorch's OutOfMemoryError, so code that greps for that text keeps working. The
 * diagnosis follows the rule heap.c applies: if the live blocks plus the request fit in the
 * capacity, what failed was finding a free range (fragmentation); otherwise memory really ran out.
 * The fuller report (device free memory, the heap's mode) is on stderr from libcualloc.so. */
void torch_oom_message(size_t size, int device, char *msg, size_t len) {
    char req[32];
    torch_fmt_size(size, req, sizeof req);
    cualloc_stats s;
    if (cualloc_get_stats(device, &s) != 0) {
        std::snprintf(msg, len,
                      "CUDA out of memory (cualloc). Tried to allocate %s (%zu bytes) on device %d, "
                      "but device %d is not a device cualloc can use (no such device, or the CUDA "
                      "driver is not usable; see the \"cualloc:\" messages on stderr).",
                      req, size, device, device);
        return;
    }
    if (s.capacity_bytes == 0) {
        std::snprintf(msg, len,
                      "CUDA out of memory (cualloc). Tried to allocate %s (%zu bytes) on device %d, "
                      "but cualloc could not set up a heap on this device (see the \"cualloc:\" "
                      "messages on stderr).",
                      req, size, device);
        return;
    }
    char cap[32], alloc[32], resv[32], cached[32], largest[32];
    size_t unallocated = s.reserved_bytes > s.allocated_bytes ? s.reserved_bytes - s.allocated_bytes : 0;
    torch_fmt_size(s.capacity_bytes, cap, sizeof cap);
    torch_fmt_size(s.allocated_bytes, alloc, sizeof alloc);
    torch_fmt_size(s.reserved_bytes, resv, sizeof resv);
    torch_fmt_size(unallocated, cached, sizeof cached);
    torch_fmt_size(s.largest_free_block, largest, sizeof largest);
    /* Compare without overflow: a request near SIZE_MAX must read as a shortage. */
    bool fits = s.allocated_bytes <= s.capacity_bytes && size <= s.capacity_bytes - s.allocated_bytes;
    const char *diagnosis =
        fits ? "Diagnosis: fragmentation, not a shortage: the allocated memory plus this request fit in "
               "the capacity, but no free range is large enough. Set "
               "CUALLOC_CONF=expandable_segments:True (the default) or lower max_split_size_mb (with "
               "expandable segments already on, the reserved address space is exhausted: raise "
               "va_factor)."
             : "Diagnosis: genuine shortage: the allocated memory plus this request exceed the "
               "capacity. Reduce the batch size or sequence length, use activation checkpointing, "
               "or mixed precision.";
    std::snprintf(msg, len,
                  "CUDA out of memory (cualloc). Tried to allocate %s (%zu bytes) on device %d. "
                  "cualloc's heap on device %d has a capacity of %s; %s is allocated, %s reserved, of "
                  "which %s is reserved but unallocated; the largest free block is %s. %s "
                  "(%" PRIu64 " out-of-memory failure%s on this device so far.)",
                  req, size, device, device, cap, alloc, resv, cached, largest, diagnosis, s.num_ooms,
                  s.num_ooms == 1 ? "" : "s");
}

} // namespace

extern "C" {

/* Allocates `size` bytes on `device`, ordered on `stream` (a cudaStream_t). Throws
 * std::runtime_error("CUDA out of memory (cualloc). ...") when cualloc cannot serve the request
 * even after releasing its cache. O(1) from cached memory. */
CUALLOC_API void *cualloc_torch_malloc(size_t size, int device, void *stream) {
    void *p = cualloc_malloc(size, device, stream);
    if (p) return p;
    char msg[1536];
    torch_oom_message(size, device, msg, sizeof msg);
    throw std::runtime_error(msg);
}

/* Frees `ptr`, ordered on `stream` (the stream it was allocated on, as PyTorch passes it). `size`
 * and `device` are not needed: cualloc finds the block from the pointer. A pointer cualloc does
 * not own is reported on stderr and ignored, never a crash. Never throws. O(1). */
CUALLOC_API void cualloc_torch_free(void *ptr, size_t size, int device, void *stream) noexcept {
    (void)size;
    (void)device;
    cualloc_free(ptr, stream);
}

} // extern "C"
