"""FAKE torch.backends.cudnn — a test double (see tests/fake_torch/README.md). As in PyTorch, the module
is replaced in sys.modules by an instance of CudnnModule, whose settings are descriptors on the
class reading and writing flags kept elsewhere (PyTorch's: torch._C's)."""
import sys
import types

_flags = {"benchmark": False, "enabled": True, "deterministic": False}


class ContextProp:
    def __init__(self, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        return _flags[self.name]

    def __set__(self, obj, value):
        _flags[self.name] = bool(value)


class CudnnModule(types.ModuleType):
    benchmark = ContextProp("benchmark")
    enabled = ContextProp("enabled")
    deterministic = ContextProp("deterministic")

    def __init__(self, m, name):
        super().__init__(name)
        self._module = m

    def __getattr__(self, name):
        return getattr(self._module, name)


sys.modules[__name__] = CudnnModule(sys.modules[__name__], __name__)
