"""FAKE torch.backends — a test double (see tests/fake_torch/README.md)."""
from . import cuda, cudnn  # noqa: F401
