"""FAKE torch — a test double for tests/test_cualloc_torch.py, NOT PyTorch (see ../README.md)."""
import re as _re

__version__ = "2.0.0+fake"
IS_FAKE_TORCH = True


class device:
    """torch.device, just enough: device("cuda"), device("cuda:1"), device("cuda", 1)."""

    def __init__(self, spec, index=None):
        m = _re.fullmatch(r"(\w+)(?::(\d+))?", spec)
        self.type = m.group(1)
        self.index = int(m.group(2)) if m.group(2) is not None else index

    def __repr__(self):
        return "device(type=%r, index=%r)" % (self.type, self.index)


from . import accelerator, backends, cuda, optim, version  # noqa: E402,F401
