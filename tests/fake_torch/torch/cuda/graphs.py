"""FAKE torch.cuda.graphs — a test double: CUDAGraph's capture counts its captures in
torch.cuda._state["captures"]; torch.cuda.graph wraps it as PyTorch's context manager does."""


class CUDAGraph:
    def capture_begin(self, pool=None, capture_error_mode="global"):
        from . import _state
        _state["captures"] = _state.get("captures", 0) + 1

    def capture_end(self):
        pass


class graph:
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        self.cuda_graph.capture_begin(capture_error_mode=self.capture_error_mode)

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
        return False
