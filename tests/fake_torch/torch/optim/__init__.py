"""FAKE torch.optim — a test double (see tests/fake_torch/README.md)."""
from . import optimizer  # noqa: F401
from .optimizer import Optimizer  # noqa: F401
from .optimizer import AdamW  # noqa: F401
