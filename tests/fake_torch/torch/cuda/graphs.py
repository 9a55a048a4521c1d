"""FAKE torch.cuda.graphs — a test double: CUDAGraph's capture counts its captures in
torch.cuda._state["captures"]; torch.cuda.graph wraps it as PyTorch's context manager does,
making its capture stream current before capture_begin (and leaving it current when capture_begin
raises, since __exit__ is then not called)."""


class CUDAGraph:
    def capture_begin(self, pool=None, capture_error_mode="global"):
        from . import _state
        _state["captures"] = _state.get("captures", 0) + 1

    def capture_end(self):
        pass


class graph:
    default_capture_stream = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        from . import Stream, stream as stream_context
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = stream_context(self.capture_stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        self.stream_ctx.__enter__()
        self.cuda_graph.capture_begin(capture_error_mode=self.capture_error_mode)

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
        self.stream_ctx.__exit__(*exc)
        return False
