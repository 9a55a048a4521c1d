/* cualloc.h — the public API of libcualloc.so, a CUDA caching allocator.
 *
 * Device memory comes from expandable virtual-memory segments (CUDA VMM) or, where VMM is off or
 * unsupported, from cuMemAlloc'd segments managed like PyTorch's native allocator. Configuration
 * comes from the environment variable CUALLOC_CONF (see README.md); nothing here needs a CUDA header.
 *
 * Thread-safety: every function may be called from any thread. Each device's heap has one lock;
 * calls on different devices do not contend.
 */
#ifndef CUALLOC_H
#define CUALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CUALLOC_API __attribute__((visibility("default")))
#else
#define CUALLOC_API
#endif

/* Statistics, per device. Gauges (bytes; each with its peak since start, or since the last
 * cualloc_reset_peaks) and counters that only
 * grow. Listed once, as X-macros, so the struct, the JSON writer and the text table agree.
 *   requested  : sizes callers asked for, of live allocations
 *   allocated  : the same allocations after rounding (512 B multiples)
 *   active     : equal to allocated (PyTorch's name kept for its stats): a freed block is never
 *                held back as active; one that must wait for other streams' work before others may
 *                reuse it waits in its stream's free index, counted in reserved, not here
 *   reserved   : bytes backed by physical memory (mapped chunks, or cuMemAlloc'd segments)
 *   inactive_split : free bytes that cannot be released as they lie: in a chunk a live block shares
 *                    (VMM) or a segment it shares (classic), or parked on a small-pool quick list
 *                    for reuse at its exact size (VMM; cualloc_trim merges those back first, and
 *                    releases what is then wholly free)
 *   largest_free_block : the largest request servable now from reserved memory without mapping more
 * Invariant (after every operation): allocated + cached free == reserved, where cached free are the
 * free blocks backed by physical memory; inactive_split <= cached free.
 */
#define CUALLOC_STATS_GAUGES(X) \
    X(requested_bytes, requested_peak) \
    X(allocated_bytes, allocated_peak) \
    X(active_bytes, active_peak) \
    X(reserved_bytes, reserved_peak) \
    X(inactive_split_bytes, inactive_split_peak)

#define CUALLOC_STATS_COUNTERS(X) \
    X(num_allocs)        /* successful allocations */ \
    X(num_frees)         /* frees of cualloc-owned pointers */ \
    X(num_maps)          /* chunks mapped (VMM) or segments cuMemAlloc'd (classic) */ \
    X(num_unmaps)        /* chunks unmapped or segments freed */ \
    X(num_alloc_retries) /* allocations that released cache and tried again */ \
    X(num_ooms)          /* allocations that failed */ \
    X(num_syncs)         /* stream or device synchronizations the allocator performed */ \
    X(num_trims)         /* explicit cache releases (cualloc_trim) */

#define CUALLOC_STATS_GAUGE_FIELDS_(cur, peak) size_t cur; size_t peak;
#define CUALLOC_STATS_COUNTER_FIELDS_(name) uint64_t name;

typedef struct cualloc_stats {
    CUALLOC_STATS_GAUGES(CUALLOC_STATS_GAUGE_FIELDS_)
    size_t largest_free_block;
    size_t capacity_bytes; /* what the heap may reserve: the device, or the cap configured; 0 until
                              the device's heap exists (its first allocation) */
    CUALLOC_STATS_COUNTERS(CUALLOC_STATS_COUNTER_FIELDS_)
} cualloc_stats;

/* Allocates `size` bytes of device memory on `device` (an ordinal), ordered on `stream` (a
 * CUstream / cudaStream_t; NULL is the legacy default stream; cudaStreamPerThread, a different
 * stream in each thread, orders the block by the calling thread's). The pointer is 256-byte aligned.
 * size 0 returns a unique pointer. Returns NULL when the request cannot be served even after
 * releasing cached memory; the failure is counted in num_ooms and reported on stderr.
 * Cost: O(1) when served from cached memory; driver calls when the heap grows. */
CUALLOC_API void *cualloc_malloc(size_t size, int device, void *stream);

/* Frees `ptr` (from cualloc_malloc), ordered on `stream`: the memory is reusable at once by work on
 * that stream, by other streams only once the stream's work up to this free has completed. A free
 * on cudaStreamPerThread (a different stream in each thread) waits for the whole device instead, as
 * cudaFree does. NULL ptr is ignored; a pointer cualloc does not own is reported on stderr and
 * ignored. O(1). */
CUALLOC_API void cualloc_free(void *ptr, void *stream);

/* Copies `device`'s statistics into *out (all zero before the device's first allocation, which
 * creates its heap). Returns 0, or -1 for a device that is not valid. */
CUALLOC_API int cualloc_get_stats(int device, cualloc_stats *out);

/* The message for a request of `size` bytes on `device` that cualloc_malloc could not serve, as
 * one paragraph in buf (at most len bytes, NUL-terminated): it starts "CUDA out of memory. Tried to
 * allocate", as PyTorch's OutOfMemoryError does (code that recognizes an OOM by that text, such as
 * Accelerate's find_executable_batch_size, recognizes this one), gives the heap's figures and the device's free memory, and ends with
 * the diagnosis of the device's last failed request and its first fix, the same as the report on
 * stderr and allocview's: a genuine shortage, a device full of memory held outside cualloc, or
 * fragmentation (before any request has failed: what this one would be diagnosed as now, or "none yet"
 * when the heap would serve it). Under
 * CUALLOC_DISABLE it says that the driver refused the request and gives the device's free memory.
 * The exception cualloc_torch_malloc throws carries it. Where the device's last failed request failed
 * because the driver refused memory with an error that is not out of memory (a context a kernel's
 * fault left unusable), the paragraph begins "CUDA error: " and that error's name instead, as
 * PyTorch's own CUDA errors do, so that code retrying a smaller batch on an OOM does not take it for
 * one. Returns 0, or -1 when buf is NULL or len 0. */
CUALLOC_API int cualloc_oom_message(size_t size, int device, char *buf, size_t len);

/* Sets every gauge's peak of `device` to the gauge's current value, so that later peaks are
 * measured from now: what torch.cuda.reset_peak_memory_stats() does for PyTorch's allocator. The
 * counters are left alone, and the exit summary then reports the peaks since the last reset.
 * Returns 0, or -1 for a device that is not valid. O(1); takes the device's heap lock. */
CUALLOC_API int cualloc_reset_peaks(int device);

/* Unmaps every cached free chunk (VMM) or frees every unused segment (classic) of `device`,
 * synchronizing only the streams whose work may still touch them. Like torch.cuda.empty_cache().
 * A device that is not valid is reported on stderr. */
CUALLOC_API void cualloc_trim(int device);

/* Checks every invariant of `device`'s heap and returns the number of violations (0 =
 * consistent; also for a device without a heap yet), printing each on stderr; -1 for a device that
 * is not valid, reported on stderr. O(heap size); for tests and debugging. */
CUALLOC_API int cualloc_check(int device);

/* Pluggable mode (which never sees cudaDeviceEnablePeerAccess): lets every device reach every other
 * device's cualloc memory where the hardware allows it — for each ordered pair (owner, accessor)
 * the driver reports cuDeviceCanAccessPeer for, existing mappings are re-granted and later ones
 * granted to the accessor too (cuMemSetAccess; no effect on classic segments, whose peer access is
 * CUDA's cudaDeviceEnablePeerAccess). Returns the number of pairs enabled (0 with one device or no
 * peer-capable pair), or -1 when cualloc has no usable driver. Cost: one cuMemSetAccess per run of
 * mapped chunks per device, under each heap's lock, so call it once at start-up. Thread-safe; may
 * be called again (idempotent). */
CUALLOC_API int cualloc_enable_peer_access_all(void);

/* ---- Tracing: every allocation event to a binary file (format: cualloc_trace.h; read it with
 * allocview). Also started by `trace:PATH` in CUALLOC_CONF, at the first call into cualloc. */

/* Starts recording to `path`, in which %p is replaced by the process id, %r by the rank (RANK or
 * LOCAL_RANK; 0 when unset), %h by the host name and %% by %. The file is created mode 0600; it
 * is never written through a symbolic link (refused) nor over an existing file (PATH.1, PATH.2
 * ... is used instead, and a message says so). Blocks already allocated and memory already
 * mapped are recorded first, as the trace's initial state. Returns 0, or -1 with a message when
 * tracing is already on, the path is empty or refused, or the file cannot be created.
 * Cost: O(live blocks) once; afterwards, per allocation, a stack capture of trace_stack_depth
 * frames and one small record. Thread-safe; at most one trace at a time. */
CUALLOC_API int cualloc_trace_start(const char *path);

/* Writes the final statistics (the END record) and closes the trace. Called at exit too; a
 * process that dies without it leaves a trace whose complete records are all readable. No-op
 * when not tracing. Thread-safe: other threads' allocations and frees wait while it runs, so the
 * END states exactly what the trace's events add up to. O(devices) plus the file's last write. */
CUALLOC_API void cualloc_trace_stop(void);

/* Records a mark named `label` (a training step, a phase: "step 3", "optimizer") into the trace,
 * with the time and thread, so reports can be cut by it. Labels longer than 1024 bytes are cut.
 * No-op when not tracing; never fails. Thread-safe; O(length of label). */
CUALLOC_API void cualloc_mark(const char *label);

#ifdef __cplusplus
}
#endif
#endif
