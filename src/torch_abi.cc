/* torch_abi.cc — the PyTorch pluggable-allocator ABI (libcualloc_torch.so): the two extern "C"
 * functions torch.cuda.memory.CUDAPluggableAllocator loads by name, over cualloc's public API.
 * It owns only the OOM exception; its message (cualloc_oom_message) and every allocation decision
 * are libcualloc.so's.
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
#include <cstddef>
#include <stdexcept>

#include "cualloc.h"

extern "C" {

/* Allocates `size` bytes on `device`, ordered on `stream` (a cudaStream_t). Throws
 * std::runtime_error("CUDA out of memory. Tried to allocate ...") when cualloc cannot serve the request
 * even after releasing its cache ("CUDA error: ..." when the driver failed it with an error that is
 * not out of memory: cualloc_oom_message). O(1) from cached memory. */
CUALLOC_API void *cualloc_torch_malloc(size_t size, int device, void *stream) {
    void *p = cualloc_malloc(size, device, stream);
    if (p) return p;
    char msg[2048];
    cualloc_oom_message(size, device, msg, sizeof msg);
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
