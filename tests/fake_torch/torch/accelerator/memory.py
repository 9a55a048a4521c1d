"""FAKE torch.accelerator.memory — a test double (see tests/fake_torch/README.md). As in PyTorch,
these functions ask the device allocator itself (torch._C._accelerator_getDeviceStats and co.), not
torch.cuda.memory_stats: under a pluggable allocator they cannot give its figures (here they raise
as torch.cuda's do)."""
from ..cuda import _state
from ..cuda.memory import _pluggable_unsupported


def empty_cache():
    _state["empty_cache_calls"] += 1


def memory_stats(device_index=None, /):
    _pluggable_unsupported("getDeviceStats")
    return {}


def memory_allocated(device_index=None, /):
    return memory_stats(device_index).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device_index=None, /):
    return memory_stats(device_index).get("allocated_bytes.all.peak", 0)


def memory_reserved(device_index=None, /):
    return memory_stats(device_index).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device_index=None, /):
    return memory_stats(device_index).get("reserved_bytes.all.peak", 0)


def reset_accumulated_memory_stats(device_index=None, /):
    _pluggable_unsupported("resetAccumulatedStats")


def reset_peak_memory_stats(device_index=None, /):
    _pluggable_unsupported("resetPeakStats")
