"""FAKE torch.cuda.memory — a test double (see tests/fake_torch/README.md)."""
import ctypes

from . import _state


class _CUDAAllocator:
    def allocator(self):
        return self


class CUDAPluggableAllocator(_CUDAAllocator):
    """As PyTorch 2.x: load the .so with ctypes and take both functions' addresses by name."""

    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        if not _state["built_with_cuda"]:  # torch._C has the binding only in a CUDA build
            raise AttributeError("module 'torch._C' has no attribute '_cuda_customAllocator'")
        self.path, self.alloc_fn_name, self.free_fn_name = path_to_so_file, alloc_fn_name, free_fn_name
        self.alloc_fn, self.free_fn = alloc_fn, free_fn
        # Call through the raw addresses, like c10's std::function over the dlsym'ed pointer.
        # (Only ever with requests that succeed: a C++ exception cannot cross ctypes.)
        self._malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(alloc_fn)
        self._free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(free_fn)
        _state["allocators"].append((path_to_so_file, alloc_fn_name, free_fn_name))


def change_current_allocator(allocator):
    """As PyTorch: refused once the allocator in use is initialized. The native one is by CUDA's
    initialization; a pluggable one always is (createCustomAllocator initializes it), so a second
    swap is refused even before CUDA is initialized."""
    _state["change_calls"] += 1
    if _state["native_used"] or (_state["initialized"] and _state["current"] is None) \
            or _state["current"] is not None:
        raise RuntimeError("Can't swap an already initialized allocator")
    _state["current"] = allocator.allocator()
    _state["changed_to"].append(allocator)


def get_allocator_backend():
    """As PyTorch (torch._C._cuda_getAllocatorBackend: c10::cuda::CUDACachingAllocator::name() of the
    allocator in use, without initializing CUDA): "native" for PyTorch's own, "pluggable" once a
    CUDAPluggableAllocator was swapped in (CUDAPluggableAllocator::name())."""
    return "native" if _state["current"] is None else "pluggable"


def _pluggable_unsupported(what):
    if _state["current"] is not None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support %s. If you need it, please file an issue "
                           "describing your use case." % what)


def memory_stats(device=None):
    _pluggable_unsupported("getDeviceStats")
    return {"allocated_bytes.all.current": -1, "allocated_bytes.all.peak": -1,
            "reserved_bytes.all.current": -1, "reserved_bytes.all.peak": -1}


def memory_stats_as_nested_dict(device=None):
    _pluggable_unsupported("getDeviceStats")
    return {}


def memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)


def memory_summary(device=None, abbreviated=False):
    memory_stats(device)
    return "native summary"


def reset_peak_memory_stats(device=None):
    _pluggable_unsupported("resetPeakStats")


def reset_max_memory_allocated(device=None):
    return reset_peak_memory_stats(device=device)


def reset_accumulated_memory_stats(device=None):
    _pluggable_unsupported("resetAccumulatedStats")


def empty_cache():
    _state["empty_cache_calls"] += 1
