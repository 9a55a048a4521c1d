/* cuda_decls.h — the few CUDA driver types, enum values and entry-point signatures cualloc uses.
 *
 * cualloc has no build-time CUDA dependency (DESIGN.md decision 1): it dlopens libcuda.so.1 and
 * calls it through the pointer types declared here. The names carry a `cua_`/`CUA_` prefix so that
 * tests/cuda_decls_check.c can include this header next to the toolkit's <cuda.h> and check every
 * value, size and field offset against it. Keep the two in step: add a declaration here, add its
 * check there.
 */
#ifndef CUALLOC_CUDA_DECLS_H
#define CUALLOC_CUDA_DECLS_H

#include <stddef.h>

typedef int cua_result;                 /* CUresult */
typedef int cua_device;                 /* CUdevice */
typedef unsigned long long cua_devptr;  /* CUdeviceptr (64-bit builds only) */
typedef unsigned long long cua_memhandle; /* CUmemGenericAllocationHandle */
typedef struct cua_ctx_s *cua_ctx;      /* CUcontext */
typedef struct cua_stream_s *cua_stream; /* CUstream; NULL is the legacy default stream */
typedef struct cua_event_s *cua_event;  /* CUevent */

/* CUresult values */
#define CUA_SUCCESS 0
#define CUA_ERROR_INVALID_VALUE 1
#define CUA_ERROR_OUT_OF_MEMORY 2
#define CUA_ERROR_NOT_INITIALIZED 3
#define CUA_ERROR_NO_DEVICE 100
#define CUA_ERROR_INVALID_DEVICE 101
#define CUA_ERROR_INVALID_CONTEXT 201
#define CUA_ERROR_ALREADY_MAPPED 208
#define CUA_ERROR_NOT_MAPPED 211
#define CUA_ERROR_INVALID_HANDLE 400
#define CUA_ERROR_NOT_FOUND 500
#define CUA_ERROR_NOT_READY 600
#define CUA_ERROR_NOT_PERMITTED 800
#define CUA_ERROR_NOT_SUPPORTED 801
#define CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define CUA_ERROR_UNKNOWN 999

/* CUdevice_attribute values */
#define CUA_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CUA_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CUA_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110

/* VMM enums */
#define CUA_MEM_ALLOCATION_TYPE_PINNED 1
#define CUA_MEM_HANDLE_TYPE_NONE 0
#define CUA_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CUA_MEM_LOCATION_TYPE_DEVICE 1
#define CUA_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CUA_MEM_ALLOC_GRANULARITY_MINIMUM 0
#define CUA_EVENT_DISABLE_TIMING 2
#define CUA_GET_PROC_ADDRESS_DEFAULT 0
#define CUA_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CUA_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
/* CUstreamCaptureStatus; stream creation flags */
#define CUA_STREAM_CAPTURE_STATUS_NONE 0
#define CUA_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CUA_STREAM_CAPTURE_STATUS_INVALIDATED 2
/* CUstreamCaptureMode */
#define CUA_STREAM_CAPTURE_MODE_GLOBAL 0
#define CUA_STREAM_CAPTURE_MODE_RELAXED 2
#define CUA_STREAM_NON_BLOCKING 1
#define CUA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704

/* CUmemLocation */
typedef struct cua_mem_location_s {
    int type; /* CUmemLocationType */
    int id;
} cua_mem_location;

/* CUmemAllocationProp */
typedef struct cua_mem_alloc_prop_s {
    int type;                 /* CUmemAllocationType */
    int requested_handle_types; /* CUmemAllocationHandleType */
    cua_mem_location location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} cua_mem_alloc_prop;

/* CUmemAccessDesc */
typedef struct cua_mem_access_desc_s {
    cua_mem_location location;
    int flags; /* CUmemAccess_flags */
} cua_mem_access_desc;

/* Entry points, as resolved through cuGetProcAddress (the _v2 names where CUDA renamed them). */
typedef cua_result (*cua_pfn_cuInit)(unsigned int flags);
typedef cua_result (*cua_pfn_cuDriverGetVersion)(int *version);
typedef cua_result (*cua_pfn_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cuda_version,
                                                   unsigned long long flags, int *symbol_status);
typedef cua_result (*cua_pfn_cuDeviceGet)(cua_device *dev, int ordinal);
typedef cua_result (*cua_pfn_cuDeviceGetCount)(int *count);
typedef cua_result (*cua_pfn_cuDeviceGetName)(char *name, int len, cua_device dev);
typedef cua_result (*cua_pfn_cuDeviceTotalMem_v2)(size_t *bytes, cua_device dev);
typedef cua_result (*cua_pfn_cuDeviceGetAttribute)(int *value, int attribute, cua_device dev);
typedef cua_result (*cua_pfn_cuDevicePrimaryCtxRetain)(cua_ctx *ctx, cua_device dev);
typedef cua_result (*cua_pfn_cuDevicePrimaryCtxRelease_v2)(cua_device dev);
typedef cua_result (*cua_pfn_cuDevicePrimaryCtxReset_v2)(cua_device dev);
typedef cua_result (*cua_pfn_cuCtxPushCurrent_v2)(cua_ctx ctx);
typedef cua_result (*cua_pfn_cuCtxPopCurrent_v2)(cua_ctx *ctx);
typedef cua_result (*cua_pfn_cuCtxSynchronize)(void);
typedef cua_result (*cua_pfn_cuMemGetInfo_v2)(size_t *free_bytes, size_t *total_bytes);
typedef cua_result (*cua_pfn_cuMemAlloc_v2)(cua_devptr *dptr, size_t bytes);
typedef cua_result (*cua_pfn_cuMemFree_v2)(cua_devptr dptr);
typedef cua_result (*cua_pfn_cuMemGetAllocationGranularity)(size_t *granularity,
                                                             const cua_mem_alloc_prop *prop, int option);
typedef cua_result (*cua_pfn_cuMemAddressReserve)(cua_devptr *ptr, size_t size, size_t alignment,
                                                   cua_devptr addr, unsigned long long flags);
typedef cua_result (*cua_pfn_cuMemAddressFree)(cua_devptr ptr, size_t size);
typedef cua_result (*cua_pfn_cuMemCreate)(cua_memhandle *handle, size_t size, const cua_mem_alloc_prop *prop,
                                           unsigned long long flags);
typedef cua_result (*cua_pfn_cuMemRelease)(cua_memhandle handle);
typedef cua_result (*cua_pfn_cuMemMap)(cua_devptr ptr, size_t size, size_t offset, cua_memhandle handle,
                                        unsigned long long flags);
typedef cua_result (*cua_pfn_cuMemUnmap)(cua_devptr ptr, size_t size);
typedef cua_result (*cua_pfn_cuMemSetAccess)(cua_devptr ptr, size_t size, const cua_mem_access_desc *desc,
                                              size_t count);
typedef cua_result (*cua_pfn_cuEventCreate)(cua_event *event, unsigned int flags);
typedef cua_result (*cua_pfn_cuEventDestroy_v2)(cua_event event);
typedef cua_result (*cua_pfn_cuEventRecord)(cua_event event, cua_stream stream);
typedef cua_result (*cua_pfn_cuEventQuery)(cua_event event);
typedef cua_result (*cua_pfn_cuEventSynchronize)(cua_event event);
typedef cua_result (*cua_pfn_cuStreamSynchronize)(cua_stream stream);
typedef cua_result (*cua_pfn_cuStreamIsCapturing)(cua_stream stream, int *status /* CUstreamCaptureStatus */);
typedef cua_result (*cua_pfn_cuThreadExchangeStreamCaptureMode)(int *mode /* CUstreamCaptureMode */);
typedef cua_result (*cua_pfn_cuDeviceCanAccessPeer)(int *can_access, cua_device dev, cua_device peer);
typedef cua_result (*cua_pfn_cuMemGetAddressRange_v2)(cua_devptr *base, size_t *size, cua_devptr dptr);
typedef cua_result (*cua_pfn_cuStreamGetCtx)(cua_stream stream, cua_ctx *ctx);
typedef cua_result (*cua_pfn_cuStreamCreate)(cua_stream *stream, unsigned int flags);
/* CUDA 12.4's green contexts: a stream in one (flags must include CU_STREAM_NON_BLOCKING). */
typedef struct cua_green_ctx_s *cua_green_ctx;
typedef cua_result (*cua_pfn_cuGreenCtxStreamCreate)(cua_stream *stream, cua_green_ctx green_ctx, unsigned int flags,
                                                      int priority);
typedef cua_result (*cua_pfn_cuStreamCreateWithPriority)(cua_stream *stream, unsigned int flags, int priority);
typedef cua_result (*cua_pfn_cuCtxEnablePeerAccess)(cua_ctx peer_ctx, unsigned int flags);

#endif
