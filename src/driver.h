/* driver.h — the table of device operations the heap is written against.
 *
 * Everything the CUDA driver does for cualloc goes through one `driver_ops_t`. There are two
 * implementations: driver_cuda.c (libcuda.so.1, dlopened) and driver_sim.c (a host-simulated
 * device for tests, replay and the demo). The heap never calls CUDA directly.
 *
 * Contract, for every operation: returns 0 (CUA_SUCCESS) on success, otherwise a CUDA error code
 * (CUA_ERROR_*) and leaves no partial effect behind. `dev` is a device ordinal in [0, device_count).
 * Operations are thread-safe; the backend makes the device's primary context current around each
 * call and restores the caller's context. Sizes and addresses of VMM operations are multiples of
 * the device's granularity. No stream or event operation is called on a capturing stream.
 */
#ifndef CUALLOC_DRIVER_H
#define CUALLOC_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_decls.h"

typedef struct driver_device_info_s {
    char name[96];
    size_t total_bytes;       /* physical memory of the device */
    size_t granularity;       /* minimum VMM granularity; a power of two */
    bool vmm_supported;       /* cuMemCreate/cuMemMap usable */
    bool rdma_capable;        /* chunks may be created gpuDirectRDMACapable */
} driver_device_info_t;

typedef struct driver_ops_s {
    const char *name; /* "cuda" or "sim" */

    /* Once, before anything else. Fails with CUA_ERROR_NO_DEVICE when no device is usable. */
    cua_result (*init)(void);
    cua_result (*device_count)(int *count);
    cua_result (*device_info)(int dev, driver_device_info_t *out);
    /* Free and total bytes as the device reports them (other processes included). */
    cua_result (*mem_get_info)(int dev, size_t *free_bytes, size_t *total_bytes);

    /* VMM. va_reserve: `size` bytes of address space aligned to `align`, no memory behind it. */
    cua_result (*va_reserve)(int dev, size_t size, size_t align, cua_devptr *out);
    /* va_free: a whole range returned by va_reserve, with nothing mapped in it. */
    cua_result (*va_free)(int dev, cua_devptr va, size_t size);
    /* phys_create: a physical handle of `size` bytes; CUA_ERROR_OUT_OF_MEMORY when the device is full. */
    cua_result (*phys_create)(int dev, size_t size, cua_memhandle *out);
    /* phys_release: a handle from phys_create that is no longer mapped anywhere. */
    cua_result (*phys_release)(int dev, cua_memhandle handle);
    /* map: the whole handle (offset 0, `size` == its size) at `va` inside a reservation, where
     * nothing is mapped. Access is not granted until set_access. */
    cua_result (*map)(int dev, cua_devptr va, size_t size, cua_memhandle handle);
    /* unmap: exactly one earlier mapping, whole. Work still in flight on it must be finished
     * (the heap synchronizes the streams concerned first). */
    cua_result (*unmap)(int dev, cua_devptr va, size_t size);
    /* set_access: read-write for `dev` (and its enabled peers) over mapped [va, va+size), which may
     * span several mappings. */
    cua_result (*set_access)(int dev, cua_devptr va, size_t size);

    /* Classic allocation (cuMemAlloc/cuMemFree), for the non-VMM mode. */
    cua_result (*mem_alloc)(int dev, size_t size, cua_devptr *out);
    cua_result (*mem_free)(int dev, cua_devptr ptr);

    /* Streams and events. Events are created without timing. event_query returns 0 when all work
     * recorded before the event has completed, CUA_ERROR_NOT_READY while it has not. */
    cua_result (*event_create)(int dev, cua_event *out);
    cua_result (*event_destroy)(int dev, cua_event event);
    cua_result (*event_record)(int dev, cua_event event, cua_stream stream);
    cua_result (*event_query)(int dev, cua_event event);
    /* Waits until all work recorded before the event has completed (NULL where the driver has no
     * such call: the heap then waits for the whole device instead). */
    cua_result (*event_synchronize)(int dev, cua_event event);
    cua_result (*stream_synchronize)(int dev, cua_stream stream);
    cua_result (*device_synchronize)(int dev);

    /* The device ordinal of the calling thread's current context (the interposed entry points'
     * notion of "the device a request is for"). Never creates or changes a context: CUDA answers
     * from cuCtxGetCurrent + cuCtxGetDevice (CUA_ERROR_INVALID_CONTEXT when none is current); the
     * sim answers the thread's device set with sim_set_current_device (default 0). */
    cua_result (*current_device)(int *dev);
    /* Is a usable context current on the calling thread? CUA_SUCCESS when one is,
     * CUA_ERROR_INVALID_CONTEXT (or the driver's error) when none is, or when the one current
     * cannot be used: its device's primary context was reset (context_reset) and not made anew.
     * Never creates or changes a context. For callers that need no device: cheaper than
     * current_device on every call but a thread's first with a given context after a reset. CUDA
     * answers from cuCtxGetCurrent, with cuCtxGetDevice to prove a context usable the first time
     * the thread finds it current (and again after any reset); the sim always has one. */
    cua_result (*context_current)(void);

    /* Is `s` capturing (CUDA graphs)? *capturing true while a capture is active or invalidated.
     * An error (e.g. the legacy stream while another stream captures, CUDA's
     * ..._STREAM_CAPTURE_IMPLICIT) means the caller must treat the stream as capturing. The heap
     * never records an event on, queries or synchronizes a capturing stream. */
    cua_result (*stream_is_capturing)(int dev, cua_stream s, bool *capturing);
    /* The device stream s was created on (a real stream: not NULL or a per-thread/legacy
     * constant). Never creates or changes a context. NULL op: unknown. */
    cua_result (*stream_device)(cua_stream s, int *dev);
    /* Adds `peer` to the devices set_access grants on dev's memory (dev's memory becomes readable
     * and writable from peer). CUA_ERROR_INVALID_DEVICE / CUA_ERROR_NOT_SUPPORTED when peer
     * cannot access dev. Does not touch existing mappings (heap_peer_enabled re-grants them). */
    cua_result (*peer_enable)(int dev, int peer);
    /* dev's primary context was reset (cuDevicePrimaryCtxReset, which cudaDeviceReset calls): it
     * and everything made in it are gone. The backend makes it anew (retains it again) at its next
     * operation on dev. NULL op: the backend has no contexts. */
    void (*context_reset)(int dev);
} driver_ops_t;

/* The backends (driver_cuda.c, driver_sim.c). */
extern const driver_ops_t driver_cuda_ops;
extern const driver_ops_t driver_sim_ops;

/* cualloc's own result, never a driver's: host memory ran out for cualloc's own tables. */
#define CUA_ERROR_HOST_MEMORY 0x40000001

/* A short name for a CUDA error code ("CUDA_ERROR_OUT_OF_MEMORY"), for messages. */
const char *driver_error_name(cua_result r);

#endif
