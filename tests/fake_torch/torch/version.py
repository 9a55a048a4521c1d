"""FAKE torch.version — a test double (see ../README.md): as PyTorch's generated torch/version.py,
`cuda` is the CUDA version of a CUDA build (None otherwise) and `hip` the HIP version of a ROCm
build (None otherwise)."""
__version__ = "2.0.0+fake"
cuda = "12.8"
hip = None
