"""FAKE torch.backends.cuda — a test double (see tests/fake_torch/README.md)."""


def is_built():
    """Whether this PyTorch was built with CUDA (False for a CPU-only build); never initializes
    CUDA, as in PyTorch."""
    from ..cuda import _state
    return _state["built_with_cuda"]
