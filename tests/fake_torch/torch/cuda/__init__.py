"""FAKE torch.cuda — a test double (see tests/fake_torch/README.md). `_state` is what the tests
inspect and set; `_fake_empty` stands for creating a CUDA tensor."""
import ctypes

_state = {
    "initialized": False,      # torch.cuda.is_initialized()
    "device": 0,               # the current device
    "device_count": 1,
    "allocators": [],          # (path, alloc_fn_name, free_fn_name) of every CUDAPluggableAllocator made
    "changed_to": [],          # allocators passed to change_current_allocator that it accepted
    "change_calls": 0,
    "current": None,           # the pluggable allocator in use, or None for the native one
    "native_used": False,      # the native allocator was initialized (PyTorch then refuses a swap)
    "empty_cache_calls": 0,
    "built_with_cuda": True,   # torch.backends.cuda.is_built(); False: a CPU-only build
}


def is_available():
    return True


def is_initialized():
    return _state["initialized"]


def _lazy_init():
    # Like PyTorch: CUDA initialization initializes the current allocator.
    if not _state["initialized"]:
        _state["initialized"] = True
        if _state["current"] is None:
            _state["native_used"] = True


def current_device():
    _lazy_init()
    return _state["device"]


def device_count():
    return _state["device_count"]  # does not initialize CUDA, as in PyTorch


def set_device(device):
    """As PyTorch: initializes CUDA (torch._C._cuda_setDevice does), then makes `device` current."""
    _lazy_init()
    _state["device"] = int(device)


class device:
    """torch.cuda.device, the context manager: as PyTorch, it has the ordinal in `idx` (no `type`
    or `index` attribute), and entering it initializes CUDA and makes idx the current device."""

    def __init__(self, device):
        self.idx = device if isinstance(device, int) else device.index
        self.prev_idx = -1

    def __enter__(self):
        _lazy_init()
        self.prev_idx, _state["device"] = _state["device"], self.idx

    def __exit__(self, *exc):
        _state["device"] = self.prev_idx
        return False


class Stream:
    """torch.cuda.Stream, as an identity only."""


_DEFAULT_STREAM = Stream()


def current_stream(device=None):
    return _state.get("stream", _DEFAULT_STREAM)


class stream:
    """torch.cuda.stream: makes a stream current for the block, as PyTorch's context manager."""

    def __init__(self, s):
        self.s = s

    def __enter__(self):
        self.prev = current_stream()
        _state["stream"] = self.s

    def __exit__(self, *exc):
        _state["stream"] = self.prev
        return False


class _FakeTensor:
    def __init__(self, ptr, nbytes, free):
        self.ptr, self.nbytes, self._free = ptr, nbytes, free

    def free(self):
        if self._free:
            self._free()
            self._free = None


def _fake_empty(nbytes):
    """Creating a CUDA tensor: initializes CUDA, then allocates through the current allocator (a
    pluggable one is called through its function pointers, as c10 does)."""
    _lazy_init()
    alloc = _state["current"]
    if alloc is None:
        return _FakeTensor(None, nbytes, None)
    dev = _state["device"]
    ptr = alloc._malloc(nbytes, dev, None)
    return _FakeTensor(ptr, nbytes, lambda: alloc._free(ptr, nbytes, dev, None))


from . import graphs, memory  # noqa: E402
from .graphs import CUDAGraph, graph  # noqa: E402,F401
from .memory import (  # noqa: E402,F401  (PyTorch: `from .memory import *`)
    empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved,
    memory_stats, memory_stats_as_nested_dict, memory_summary, reset_peak_memory_stats, reset_max_memory_allocated,
    reset_accumulated_memory_stats,
)
