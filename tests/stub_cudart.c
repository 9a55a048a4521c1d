/* stub_cudart.c — libstubcudart.so, a stand-in CUDA runtime for the interposition tests (suite
 * 'interpose'): the few runtime entry points cualloc interposes, served from host malloc, each
 * call counted so a test can tell what reached "the real runtime" past libcualloc.so's front door.
 * Not CUDA: no devices, no streams; device 0 is the only one. Includes no cualloc header. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define STUB_API __attribute__((visibility("default")))

enum { C_MALLOC, C_FREE, C_MALLOC_ASYNC, C_FREE_ASYNC, C_GET_DEVICE, C_MEM_GET_INFO, C_STREAM_DESTROY,
       C_STREAM_CREATE, C_SET_DEVICE, C_ENABLE_PEER, C_IPC_GET, C_COUNT };
static const char *const names[C_COUNT] = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                                           "cudaGetDevice", "cudaMemGetInfo", "cudaStreamDestroy",
                                           "cudaStreamCreate", "cudaSetDevice", "cudaDeviceEnablePeerAccess",
                                           "cudaIpcGetMemHandle"};
static __thread int current_device; /* cudaSetDevice / cudaGetDevice */
static __thread int last_error;     /* as CUDA's: set by a failing call, taken by cudaGetLastError */
static atomic_uintptr_t next_stream = 0x7000;
static atomic_ulong calls[C_COUNT];

#define STUB_FREE_BYTES ((size_t)100 << 20)
#define STUB_TOTAL_BYTES ((size_t)1 << 30)

STUB_API int cudaMalloc(void **p, size_t n);
STUB_API int cudaFree(void *p);
STUB_API int cudaMallocAsync(void **p, size_t n, void *stream);
STUB_API int cudaFreeAsync(void *p, void *stream);
STUB_API int cudaGetDevice(int *dev);
STUB_API int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
STUB_API int cudaStreamDestroy(void *stream);
STUB_API unsigned long stub_cudart_calls(const char *name);
STUB_API void *stub_cudart_malloc_direct(size_t n);

static int failed(int e) {
    last_error = e;
    return e;
}

STUB_API int cudaGetLastError(void);
STUB_API int cudaPeekAtLastError(void);
int cudaGetLastError(void) {
    int e = last_error;
    last_error = 0;
    return e;
}
int cudaPeekAtLastError(void) { return last_error; }

/* Capture, as the test sets it: cudaStreamIsCapturing answers `capture_error` for the legacy
 * stream (NULL) when it is set (cudaErrorStreamCaptureImplicit, 906, while a blocking stream
 * captures), else not capturing. */
static atomic_int capture_error;
STUB_API void stub_cudart_set_legacy_capture_error(int e);
void stub_cudart_set_legacy_capture_error(int e) { atomic_store(&capture_error, e); }

STUB_API int cudaStreamIsCapturing(void *stream, int *status);
int cudaStreamIsCapturing(void *stream, int *status) {
    if (!status) return failed(1);
    *status = 0;
    int e = atomic_load(&capture_error);
    return !stream && e ? failed(e) : 0;
}

int cudaMalloc(void **p, size_t n) {
    atomic_fetch_add(&calls[C_MALLOC], 1);
    if (!p) return failed(1);
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}

int cudaFree(void *p) {
    atomic_fetch_add(&calls[C_FREE], 1);
    free(p);
    return 0;
}

int cudaMallocAsync(void **p, size_t n, void *stream) {
    (void)stream;
    atomic_fetch_add(&calls[C_MALLOC_ASYNC], 1);
    if (!p) return 1;
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}

int cudaFreeAsync(void *p, void *stream) {
    (void)stream;
    atomic_fetch_add(&calls[C_FREE_ASYNC], 1);
    free(p);
    return 0;
}

int cudaGetDevice(int *dev) {
    atomic_fetch_add(&calls[C_GET_DEVICE], 1);
    if (!dev) return 1;
    *dev = current_device;
    return 0;
}

STUB_API int cudaSetDevice(int dev);
int cudaSetDevice(int dev) {
    atomic_fetch_add(&calls[C_SET_DEVICE], 1);
    if (dev < 0 || dev > 7) return failed(101);
    current_device = dev;
    return 0;
}

/* Streams are numbers (0x7000, 0x7010, ...): no work, nothing to wait for. All three creation
 * calls are counted as cudaStreamCreate. */
STUB_API int cudaStreamCreate(void **stream);
STUB_API int cudaStreamCreateWithFlags(void **stream, unsigned int flags);
STUB_API int cudaStreamCreateWithPriority(void **stream, unsigned int flags, int priority);
int cudaStreamCreateWithPriority(void **stream, unsigned int flags, int priority) {
    (void)flags;
    (void)priority;
    atomic_fetch_add(&calls[C_STREAM_CREATE], 1);
    if (!stream) return 1;
    *stream = (void *)atomic_fetch_add(&next_stream, 0x10);
    return 0;
}
int cudaStreamCreateWithFlags(void **stream, unsigned int flags) { return cudaStreamCreateWithPriority(stream, flags, 0); }
int cudaStreamCreate(void **stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

STUB_API int cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
int cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
    atomic_fetch_add(&calls[C_ENABLE_PEER], 1);
    return peer >= 0 && flags == 0 ? 0 : 1;
}

/* A 64-byte handle filled with a marker: "exported". */
STUB_API int cudaIpcGetMemHandle(void *handle, void *dev_ptr);
int cudaIpcGetMemHandle(void *handle, void *dev_ptr) {
    atomic_fetch_add(&calls[C_IPC_GET], 1);
    if (!handle || !dev_ptr) return 1;
    memset(handle, 0x5a, 64);
    return 0;
}

int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    atomic_fetch_add(&calls[C_MEM_GET_INFO], 1);
    if (!free_bytes || !total_bytes) return 1;
    *free_bytes = STUB_FREE_BYTES;
    *total_bytes = STUB_TOTAL_BYTES;
    return 0;
}

int cudaStreamDestroy(void *stream) {
    (void)stream;
    atomic_fetch_add(&calls[C_STREAM_DESTROY], 1);
    return 0;
}

unsigned long stub_cudart_calls(const char *name) {
    for (int i = 0; i < C_COUNT; i++)
        if (strcmp(name, names[i]) == 0) return atomic_load(&calls[i]);
    return (unsigned long)-1;
}

/* "Device" memory the stub hands out without any front door on the way (a foreign pointer). */
void *stub_cudart_malloc_direct(size_t n) { return malloc(n ? n : 1); }
