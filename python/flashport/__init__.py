"""flashport: portable IO-aware exact attention (FlashAttention) on any DLPack tensor.

    import numpy as np, flashport
    q = k = v = np.random.randn(1, 128, 8, 64).astype(np.float32)   # [B, N, heads, D]
    o = flashport.attention(q, k, v, causal=True)                   # a NumPy array

flashport.attention / flashport.attention_backward take NumPy, torch (CPU, CUDA), CuPy or any
array-API tensor with DLPack, run on the backend where the data lives and return the input's own
type. flashport.torch adds a torch.library op with autograd and torch.compile support, and
flash_attn_func-compatible wrappers. Failures raise flashport.Error.

The shared library and the GPU plugins this package was built with live in this folder; the
library finds its plugins here by itself (FLASHPORT_PLUGIN_PATH is searched first when set).
"""
from . import _C
from ._api import attention, attention_backward
from ._errors import Error

__all__ = ["Error", "attention", "attention_backward", "available_backends", "library_path",
           "version"]
__version__ = _C.version()


def version():
    """The C library's version, "major.minor.patch"."""
    return _C.version()


def available_backends():
    """The backends that open on this machine right now, e.g. ["cpu", "reference", "cuda"]."""
    return [b.strip() for b in _C.available_backends().split(",") if b.strip()]


def library_path():
    """The libflashport file this package loaded (plugins are searched in its folder)."""
    return _C.library_path()
