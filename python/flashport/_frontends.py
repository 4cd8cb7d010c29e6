"""How flashport meets each array framework: where outputs are allocated, how a tensor is handed
to the extension (DLPack), and which stream the call runs on.

One frontend per input type, found once and cached. Outputs are allocated by the input's own
framework, so they come back in its type and, on a GPU, from its allocator. Known frameworks:
NumPy, torch, CuPy; any other type that implements the array API standard
(``__array_namespace__``) and DLPack works through that namespace.

Each frontend says:
- ``raw``: its tensors go to the extension as they are (``export`` is not called), which finds
  the stream itself unless ``names_stream``: then ``stream(q)`` is passed and the extension asks
  each tensor's ``__dlpack__`` for that stream;
- ``allocates``: the extension allocates the outputs through the framework's DLPack C exchange
  API (torch 2.15 has it), so ``empty_like`` and friends are not called for a plain call;
- ``fp8``: the framework's float8 dtypes, as flashport dtype codes;
- ``in_one_buffer``: a call's outputs are allocated in Python as views into one buffer
  (``new``, ``view``, ``float32``, ``uint8``) and go to the extension as their addresses
  (``address``), not through ``__dlpack__``.
"""
from . import _C

_frontends = {}


def frontend(x):
    fe = _frontends.get(type(x))
    if fe is None:
        fe = _make(x)
        _frontends[type(x)] = fe
    return fe


def _make(x):
    mod = type(x).__module__.split(".")[0]
    if mod == "numpy":
        return _NumPy()
    if mod == "torch":
        return _Torch()
    if mod == "cupy":
        return _CuPy()
    if hasattr(x, "__array_namespace__") and hasattr(x, "__dlpack__"):
        return _ArrayAPI(x.__array_namespace__())
    return _Unknown()


class _Frontend:
    """The answers of a frontend that says nothing else (the module's docstring lists them):
    tensors go through ``export``, no stream is named, outputs are allocated one by one through
    ``empty_like`` and friends, no float8 dtypes."""

    raw = False
    names_stream = False
    allocates = False
    fp8 = {}
    in_one_buffer = False


class _NumPy(_Frontend):
    """Host memory, no stream; the extension calls ``__dlpack__`` itself."""

    raw = True

    def __init__(self):
        import numpy

        self.np = numpy

    def empty_like(self, x):
        return self.np.empty_like(x)

    def empty_f32(self, shape, like):
        return self.np.empty(shape, self.np.float32)

    def empty_fp8_out(self, x):
        return self.np.empty(x.shape, self.np.float16)  # NumPy has no bfloat16

    def max_len(self, cu):
        cu = self.np.asarray(cu)
        return int((cu[1:] - cu[:-1]).max()) if cu.shape[0] > 1 else 0


class _Torch(_Frontend):
    """torch on any device. Where torch publishes DLPack's C exchange API (torch 2.15 does) the
    extension does everything through it: reads the tensors, allocates the outputs, asks for
    the current stream. Older torch: torch's own ``__dlpack__`` costs several microseconds in
    Python checks (requires_grad, conjugate bits, a stream handshake this call does not need,
    since it runs on the current stream); its C export, where it exists, is a fraction of that.
    """

    def __init__(self):
        import torch

        self.torch = torch
        self.raw = self.allocates = _C.use_exchange_api(torch.Tensor)
        self.fp8 = {getattr(torch, name): code for name, code in
                    (("float8_e4m3fn", 3), ("float8_e5m2", 4)) if hasattr(torch, name)}
        self._to_dlpack = getattr(torch._C, "_to_dlpack", None)
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def empty_like(self, x):
        return self.torch.empty_like(x)

    def empty_f32(self, shape, like):
        return like.new_empty(shape, dtype=self.torch.float32)

    def empty_fp8_out(self, x):
        return x.new_empty(x.shape, dtype=self.torch.bfloat16)

    def export(self, x):
        if not isinstance(x, self.torch.Tensor):
            return x
        if x.element_size() == 1 and x.dtype.is_floating_point:
            # float8: as a uint8 view, which every torch exports through DLPack; the call says
            # which fp8 format the codes are (attention(fp8=...), set from the dtype).
            x = x.view(self.torch.uint8)
        if self._to_dlpack is not None:
            return self._to_dlpack(x)
        return x.detach().__dlpack__()

    def stream(self, x):
        if not x.is_cuda:
            return None
        if self._raw_stream is not None:
            return self._raw_stream(x.get_device())
        return self.torch.cuda.current_stream(x.device).cuda_stream

    def max_len(self, cu):
        return int((cu[1:] - cu[:-1]).max()) if cu.shape[0] > 1 else 0


class _CuPy(_Frontend):
    """CuPy on its current stream: the extension asks each array's ``__dlpack__`` for that
    stream, so CuPy orders nothing extra, and flashport enqueues on the same stream. Where CuPy
    publishes DLPack's C exchange API, the extension meets it through that, as it does torch;
    elsewhere a call's outputs are views into one ``cupy.empty`` (CuPy's memory pool costs
    microseconds an allocation), handed to the extension as their device addresses."""

    def __init__(self):
        import cupy

        self.cp = cupy
        self.raw = True
        self.allocates = _C.use_exchange_api(cupy.ndarray)
        self.names_stream = self.in_one_buffer = not self.allocates
        self.float32, self.uint8 = cupy.dtype(cupy.float32), cupy.dtype(cupy.uint8)
        self._get_device = cupy.cuda.runtime.getDevice

    def new(self, shape, dtype, like):
        """A dense array on like's device (cupy.empty allocates on the current one)."""
        if like.data.device_id == self._get_device():
            return self.cp.empty(shape, dtype)
        with like.device:
            return self.cp.empty(shape, dtype)

    def address(self, x):
        return x.data.ptr

    def view(self, buf, offset, shape, dtype):
        return self.cp.ndarray(shape, dtype, buf.data + offset if offset else buf.data)

    def empty_like(self, x):
        return self.cp.empty_like(x)

    def empty_f32(self, shape, like):
        with like.device:
            return self.cp.empty(shape, self.cp.float32)

    def empty_fp8_out(self, x):
        with x.device:
            return self.cp.empty(x.shape, self.cp.float16)

    def stream(self, x):
        return self.cp.cuda.get_current_stream().ptr

    def max_len(self, cu):
        return int((cu[1:] - cu[:-1]).max()) if cu.shape[0] > 1 else 0


class _ArrayAPI(_Frontend):
    """Any array-API namespace (NumPy-like libraries, JAX, ...): outputs from ``xp.empty`` on the
    input's device; GPU data on the legacy default stream, which DLPack's stream=1 asks the
    producer to order its work before."""

    def __init__(self, xp):
        self.xp = xp

    def empty_like(self, x):
        return self.xp.empty_like(x)

    def empty_f32(self, shape, like):
        return self.xp.empty(shape, dtype=self.xp.float32, device=like.device)

    def empty_fp8_out(self, x):
        return self.xp.empty(x.shape, dtype=self.xp.float16, device=x.device)

    def export(self, x):
        dev_type, _ = x.__dlpack_device__()
        return x.__dlpack__(stream=1) if dev_type in (2, 10, 13) else x

    def stream(self, x):
        return None

    def max_len(self, cu):
        xp = self.xp
        return int(xp.max(cu[1:] - cu[:-1])) if cu.shape[0] > 1 else 0


class _Unknown(_Frontend):
    """Not a tensor flashport knows how to allocate for: the extension reports what is wrong
    (no ``__dlpack__``, or a DLPack tensor whose framework gives no way to allocate outputs)."""

    raw = True

    def empty_like(self, x):
        from ._errors import Error, status_code

        raise Error(status_code("FLASHPORT_ERR_INVALID_VALUE"),
                    "FLASHPORT_ERR_INVALID_VALUE",
                    f"a {type(x).__module__}.{type(x).__qualname__} is not a tensor flashport "
                    "can allocate outputs for (NumPy, torch, CuPy, or an array-API array with "
                    "__dlpack__)")

    def empty_f32(self, shape, like):
        return self.empty_like(like)

    def empty_fp8_out(self, x):
        return self.empty_like(x)
