"""FAKE torch.accelerator — a test double (see tests/fake_torch/README.md): the device-agnostic
memory functions of PyTorch >= 2.9, re-exported from .memory as PyTorch does."""
from . import memory  # noqa: F401
from .memory import (  # noqa: F401
    empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved,
    memory_stats, reset_accumulated_memory_stats, reset_peak_memory_stats,
)
