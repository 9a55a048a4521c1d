/* cuda_decls_check.c — src/cuda_decls.h checked against the toolkit's <cuda.h> at compile time:
 * every CUA_ value equals its CUDA counterpart, and the structs and handle types have CUDA's sizes
 * and field offsets. If it compiles, it passes; running it only reports. Built with
 * -DCUALLOC_NO_CUDA_H where no cuda.h was found, and then it exits 77 (skipped). It does not check
 * behaviour (test_driver_cuda.c). */
#include <stddef.h>
#include <stdio.h>

#ifdef CUALLOC_NO_CUDA_H

int main(void) {
    printf("cuda_decls_check: no toolkit cuda.h found at configure time; skipped\n");
    return 77;
}

#else

#include <cuda.h>

#include "cuda_decls.h"

#define SAME_VALUE(ours, theirs) _Static_assert((ours) == (theirs), #ours " != " #theirs);
#define SAME_SIZE(ours, theirs) _Static_assert(sizeof(ours) == sizeof(theirs), "sizeof " #ours " != sizeof " #theirs);
#define SAME_FIELD(ours, of, theirs, tf) \
    _Static_assert(offsetof(ours, of) == offsetof(theirs, tf), "offsetof " #ours "." #of " != " #theirs "." #tf); \
    _Static_assert(sizeof(((ours *)0)->of) == sizeof(((theirs *)0)->tf), "sizeof " #ours "." #of " != " #theirs "." #tf);

/* CUresult */
SAME_VALUE(CUA_SUCCESS, CUDA_SUCCESS)
SAME_VALUE(CUA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
SAME_VALUE(CUA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
SAME_VALUE(CUA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)
SAME_VALUE(CUA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME_VALUE(CUA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE)
SAME_VALUE(CUA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT)
SAME_VALUE(CUA_ERROR_ALREADY_MAPPED, CUDA_ERROR_ALREADY_MAPPED)
SAME_VALUE(CUA_ERROR_NOT_MAPPED, CUDA_ERROR_NOT_MAPPED)
SAME_VALUE(CUA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND)
SAME_VALUE(CUA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)
SAME_VALUE(CUA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED)
SAME_VALUE(CUA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED)
SAME_VALUE(CUA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
SAME_VALUE(CUA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
SAME_VALUE(CUA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
SAME_VALUE(CUA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN)
/* the numbers driver_error_name (src/driver_cuda.c) names without a CUA_ constant */
SAME_VALUE(4, CUDA_ERROR_DEINITIALIZED)
SAME_VALUE(34, CUDA_ERROR_STUB_LIBRARY)
SAME_VALUE(46, CUDA_ERROR_DEVICE_UNAVAILABLE)
SAME_VALUE(214, CUDA_ERROR_ECC_UNCORRECTABLE)
SAME_VALUE(CUA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE)
SAME_VALUE(700, CUDA_ERROR_ILLEGAL_ADDRESS)
SAME_VALUE(719, CUDA_ERROR_LAUNCH_FAILED)
SAME_VALUE(803, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
SAME_VALUE(901, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)

/* CUdevice_attribute */
SAME_VALUE(CUA_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
SAME_VALUE(CUA_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
SAME_VALUE(CUA_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)

/* VMM, events, cuGetProcAddress */
SAME_VALUE(CUA_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED)
SAME_VALUE(CUA_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_NONE)
SAME_VALUE(CUA_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
SAME_VALUE(CUA_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE)
SAME_VALUE(CUA_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
SAME_VALUE(CUA_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
SAME_VALUE(CUA_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
SAME_VALUE(CUA_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_DEFAULT)
SAME_VALUE(CUA_GET_PROC_ADDRESS_LEGACY_STREAM, CU_GET_PROC_ADDRESS_LEGACY_STREAM)
SAME_VALUE(CUA_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
/* capture status, stream flags, peer access */
SAME_VALUE(CUA_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE)
SAME_VALUE(CUA_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_ACTIVE)
SAME_VALUE(CUA_STREAM_CAPTURE_STATUS_INVALIDATED, CU_STREAM_CAPTURE_STATUS_INVALIDATED)
SAME_SIZE(int, CUstreamCaptureStatus)
SAME_VALUE(CUA_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL)
SAME_VALUE(CUA_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED)
SAME_SIZE(int, CUstreamCaptureMode)
SAME_VALUE(CUA_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
SAME_VALUE(CUA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
/* literals the fake libcuda uses (tests/fakecuda/fake_libcuda.c) */
SAME_VALUE(0, CU_GET_PROC_ADDRESS_SUCCESS)
SAME_VALUE(1, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
SAME_VALUE(1, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)

/* handle and scalar types */
SAME_SIZE(cua_result, CUresult)
SAME_SIZE(cua_device, CUdevice)
SAME_SIZE(cua_devptr, CUdeviceptr)
SAME_SIZE(cua_memhandle, CUmemGenericAllocationHandle)
SAME_SIZE(cua_ctx, CUcontext)
SAME_SIZE(cua_stream, CUstream)
SAME_SIZE(cua_event, CUevent)
_Static_assert((cua_devptr)-1 > 0 && (CUdeviceptr)-1 > 0, "device pointers are unsigned");
_Static_assert((cua_memhandle)-1 > 0 && (CUmemGenericAllocationHandle)-1 > 0, "handles are unsigned");

/* structs */
SAME_SIZE(cua_mem_location, CUmemLocation)
SAME_FIELD(cua_mem_location, type, CUmemLocation, type)
SAME_FIELD(cua_mem_location, id, CUmemLocation, id)

SAME_SIZE(cua_mem_alloc_prop, CUmemAllocationProp)
SAME_FIELD(cua_mem_alloc_prop, type, CUmemAllocationProp, type)
SAME_FIELD(cua_mem_alloc_prop, requested_handle_types, CUmemAllocationProp, requestedHandleTypes)
SAME_FIELD(cua_mem_alloc_prop, location, CUmemAllocationProp, location)
SAME_FIELD(cua_mem_alloc_prop, win32_handle_meta_data, CUmemAllocationProp, win32HandleMetaData)
SAME_FIELD(cua_mem_alloc_prop, alloc_flags, CUmemAllocationProp, allocFlags)
SAME_FIELD(cua_mem_alloc_prop, alloc_flags.compression_type, CUmemAllocationProp, allocFlags.compressionType)
SAME_FIELD(cua_mem_alloc_prop, alloc_flags.gpu_direct_rdma_capable, CUmemAllocationProp,
           allocFlags.gpuDirectRDMACapable)
SAME_FIELD(cua_mem_alloc_prop, alloc_flags.usage, CUmemAllocationProp, allocFlags.usage)
SAME_FIELD(cua_mem_alloc_prop, alloc_flags.reserved, CUmemAllocationProp, allocFlags.reserved)

SAME_SIZE(cua_mem_access_desc, CUmemAccessDesc)
SAME_FIELD(cua_mem_access_desc, location, CUmemAccessDesc, location)
SAME_FIELD(cua_mem_access_desc, flags, CUmemAccessDesc, flags)

int main(void) {
    printf("cuda_decls_check: cuda_decls.h matches cuda.h (CUDA_VERSION %d)\n", CUDA_VERSION);
    return 0;
}

#endif
