"""A linear layer implemented as a C++/CUDA extension, built just in time.

The sources in ``csrc/`` define two operators in the ``autograd_ext``
namespace::

    autograd_ext::linear_forward(Tensor input, Tensor weight, Tensor? bias) -> Tensor
    autograd_ext::linear_backward(Tensor grad_out, Tensor input, Tensor weight,
                                  bool[3] output_mask)
        -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)

:func:`load_extension` compiles them with ``torch.utils.cpp_extension.load``
(C++ only on machines without CUDA, C++ and CUDA otherwise), loads the shared
library into the process and registers, from Python, what the C++ side does
not provide:

* fake (meta) kernels, so FakeTensor, ``torch.compile`` and AOTAutograd can
  propagate shapes without running the real kernels;
* autograd formulas for both operators. The formula of ``linear_backward`` is
  itself written with the two operators, so double backward works.

On top of the operators this module offers the two usual front ends:
:class:`ExtLinearFunction` (a ``torch.autograd.Function``, the classic
extension tutorial pattern) and :class:`ExtLinear` (an ``nn.Module`` that calls
the registered operator directly, which is what ``torch.compile`` traces best).
"""

from __future__ import annotations

import functools
import math
import operator
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "ExtLinear",
    "ExtLinearFunction",
    "cuda_extension_available",
    "ext_linear",
    "ext_linear_backward",
    "extension_available",
    "load_extension",
]

NAMESPACE = "autograd_ext"
FORWARD_OP = f"{NAMESPACE}::linear_forward"
BACKWARD_OP = f"{NAMESPACE}::linear_backward"

# Where the sources are: inside the package in an installed wheel (the build
# maps the repository's csrc/ there), next to the package in a source checkout.
CSRC_CANDIDATES = (
    Path(__file__).resolve().parent / "csrc",
    Path(__file__).resolve().parent.parent / "csrc",
)
CPU_SOURCES = ("register.cpp", "linear_cpu.cpp")
CUDA_SOURCES = ("linear_cuda.cu",)

_lock = threading.Lock()
_ops = None  # torch.ops.autograd_ext once loaded; checked on every call, so kept cheap
_available: Optional[bool] = None


# ---------------------------------------------------------------------------
# Building and loading
# ---------------------------------------------------------------------------


def _cuda_build_requested() -> bool:
    """Build the CUDA kernels only where they can run: a CUDA (not ROCm) torch with a GPU."""
    return torch.cuda.is_available() and torch.version.cuda is not None


def _check_toolchain(with_cuda: bool = False) -> None:
    """Fail early, with an actionable message, if the build tools are missing.

    Without this check a missing compiler shows up as a long ninja log.
    """
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"Building the {NAMESPACE} extension needs a C++ compiler, but {cxx!r} "
            "was not found on PATH. Install one (e.g. `apt-get install g++`, "
            "`conda install -c conda-forge cxx-compiler`, or Xcode command line "
            "tools on macOS) or point the CXX environment variable at it."
        )
    try:
        if shutil.which("ninja") is None:
            raise RuntimeError("ninja not found on PATH")
        cpp_extension.verify_ninja_availability()
    except RuntimeError as exc:
        raise RuntimeError(
            f"Building the {NAMESPACE} extension needs the ninja build tool: "
            "`pip install ninja` (or install it with your system package manager)."
        ) from exc
    if with_cuda and cpp_extension.CUDA_HOME is None:
        raise RuntimeError(
            f"Building the CUDA kernels of {NAMESPACE} needs the CUDA toolkit (nvcc), "
            "but CUDA_HOME could not be determined. Install the CUDA toolkit matching "
            f"torch.version.cuda={torch.version.cuda} or set CUDA_HOME."
        )


def _csrc_dir() -> Path:
    """The first of :data:`CSRC_CANDIDATES` that holds the sources (the last one if none does)."""
    for candidate in CSRC_CANDIDATES:
        if (candidate / CPU_SOURCES[0]).is_file():
            return candidate
    return CSRC_CANDIDATES[-1]


def _source_paths(with_cuda: bool) -> list[str]:
    """Absolute source paths, from the installed package or the source checkout."""
    names = CPU_SOURCES + (CUDA_SOURCES if with_cuda else ())
    csrc = _csrc_dir()
    paths = [csrc / name for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        looked = " and ".join(str(c) for c in CSRC_CANDIDATES)
        raise RuntimeError(
            f"The {NAMESPACE} extension sources were not found: {', '.join(missing)} "
            f"(looked in {looked}). Reinstall pytest-autograd from a wheel built with its "
            "csrc/ directory (`pip install .` in a checkout), or use a source checkout."
        )
    return [str(p) for p in paths]


def _build(with_cuda: bool, verbose: bool) -> None:
    """Compile (or reuse from torch's extension cache) and load the library.

    Separate names for the two variants keep their build directories apart,
    so switching between a CPU-only and a CUDA machine does not force rebuilds.
    """
    from torch.utils import cpp_extension

    cpp_extension.load(
        name=f"{NAMESPACE}_{'cuda' if with_cuda else 'cpu'}",
        sources=_source_paths(with_cuda),
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"] if with_cuda else None,
        extra_include_paths=[str(_csrc_dir())],
        extra_ldflags=_libstdcxx_link_flags(os.environ.get("CXX", "c++")),
        with_cuda=with_cuda,
        is_python_module=False,  # operators register themselves via TORCH_LIBRARY
        verbose=verbose,
    )


def _libstdcxx_link_flags(cxx: str) -> list[str]:
    """Link flags that make the library use the libstdc++ this process already has loaded.

    A compiler installed without a shared libstdc++ (only ``libstdc++.a`` in
    its library path) links a private copy of it into the extension. That
    copy's locale state is never set up when torch's libstdc++ is already in
    the process, so the first error message that formats a number (any
    TORCH_CHECK with a size in it) crashes the interpreter with SIGSEGV.
    Where ``cxx -print-file-name=libstdc++.so`` finds no shared library, link
    the one loaded here by its exact file name; elsewhere change nothing.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    if os.path.isabs(found) and os.path.exists(found):
        return []  # the compiler links libstdc++ dynamically, as usual
    loaded = _loaded_libstdcxx()
    return [f"-L{os.path.dirname(loaded)}", f"-l:{os.path.basename(loaded)}"] if loaded else []


def _loaded_libstdcxx() -> Optional[str]:
    """The path of the libstdc++ shared library mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libstdc++.so") and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def load_extension(verbose: bool = False):
    """Build (first call only) and load the extension; return ``torch.ops.autograd_ext``.

    Thread-safe and cached for the life of the process: a C++ operator library
    can be loaded only once, and the Python registrations must happen once.
    Compiled artefacts are cached by torch (``TORCH_EXTENSIONS_DIR``, default
    ``~/.cache/torch_extensions``) and rebuilt only when a source changes.

    Raises ``RuntimeError`` naming what to install if the compiler, ninja or
    (on CUDA machines) nvcc is missing.
    """
    global _ops
    if _ops is not None:
        return _ops
    with _lock:
        if _ops is not None:
            return _ops
        with_cuda = _cuda_build_requested()
        _check_toolchain(with_cuda=False)
        if with_cuda:
            try:
                _check_toolchain(with_cuda=True)
            except RuntimeError as exc:
                warnings.warn(f"{exc} Falling back to the CPU-only build.", stacklevel=2)
                with_cuda = False
        _build(with_cuda, verbose)
        _register_python_impls()
        _ops = getattr(torch.ops, NAMESPACE)
        return _ops


def extension_available() -> bool:
    """Whether the extension can be used here. Builds it on the first call.

    Never raises: a missing toolchain or a failed build give ``False`` (the
    result is remembered, so a failing build is not retried on every call).
    """
    global _available
    if _available is None:
        try:
            load_extension()
            _available = True
        except Exception:  # noqa: BLE001 - availability probe, the reason is in load_extension()
            _available = False
    return _available


def cuda_extension_available() -> bool:
    """Whether the CUDA kernels were built and a GPU is present."""
    return (
        torch.cuda.is_available()
        and extension_available()
        and torch._C._dispatch_has_kernel_for_dispatch_key(FORWARD_OP, "CUDA")
    )


def _ensure_loaded() -> None:
    # A plain global check: torch.compile can trace through it (it becomes a guard).
    if _ops is None:
        load_extension()


# ---------------------------------------------------------------------------
# Fake kernels and autograd formulas for the operators
# ---------------------------------------------------------------------------


def _linear_forward_fake(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """Shape/dtype propagation mirroring linear_forward's C++ checks."""
    torch._check(input.dim() >= 1, lambda: "linear_forward: input must have at least 1 dim")
    torch._check(weight.dim() == 2, lambda: "linear_forward: weight must be 2-D")
    torch._check(
        input.shape[-1] == weight.shape[1],
        lambda: f"linear_forward: input.size(-1)={input.shape[-1]} != weight.size(1)={weight.shape[1]}",
    )
    if bias is not None:
        torch._check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            lambda: "linear_forward: bias must have shape (out_features,)",
        )
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def _linear_backward_fake(
    grad_out: Tensor, input: Tensor, weight: Tensor, output_mask: Sequence[bool]
) -> tuple[Tensor, Tensor, Tensor]:
    """Skipped gradients are empty (0,) tensors, exactly like the C++ kernels."""
    torch._check(
        grad_out.shape[-1] == weight.shape[0],
        lambda: "linear_backward: grad_out.size(-1) must equal out_features",
    )
    grad_input = input.new_empty(input.shape) if output_mask[0] else input.new_empty((0,))
    grad_weight = input.new_empty(weight.shape) if output_mask[1] else input.new_empty((0,))
    grad_bias = input.new_empty((weight.shape[0],)) if output_mask[2] else input.new_empty((0,))
    return grad_input, grad_weight, grad_bias


def _forward_setup_context(ctx, inputs, output) -> None:
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None


def _forward_backward(ctx, grad_out: Tensor):
    """d(input @ W.T + b) -> (grad_out @ W, grad_out.T @ input, grad_out.sum(0))."""
    input, weight = ctx.saved_tensors
    return _linear_grads(ctx, grad_out, input, weight)


def _linear_grads(ctx, grad_out: Tensor, input: Tensor, weight: Tensor):
    """Shared by the registered formula and ExtLinearFunction: only compute what is needed. Under
    torch.autocast the forward's matmul returns a 16-bit output while input and weight stay float32:
    grad_out is brought to their dtype, as the backward kernel takes one dtype."""
    mask = [
        ctx.needs_input_grad[0],
        ctx.needs_input_grad[1],
        ctx.has_bias and ctx.needs_input_grad[2],
    ]
    grads = torch.ops.autograd_ext.linear_backward(grad_out.to(input.dtype), input, weight, mask)
    return tuple(g if needed else None for g, needed in zip(grads, mask))


def _backward_setup_context(ctx, inputs, output) -> None:
    grad_out, input, weight, output_mask = inputs
    ctx.save_for_backward(grad_out, input, weight)
    ctx.output_mask = tuple(output_mask)


def _backward_backward(ctx, gg_input: Tensor, gg_weight: Tensor, gg_bias: Tensor):
    """Gradient of linear_backward, written with the same two operators.

    With gI = go @ W, gW = go.T @ x, gb = go.sum(0) and incoming gradients
    (ggI, ggW, ggb) the chain rule gives
        d go = ggI @ W.T + x @ ggW.T + ggb  = linear_forward(ggI, W) + linear_forward(x, ggW, ggb)
        d x  = go @ ggW                     = linear_backward(go, x, ggW)[0]
        d W  = go.T @ ggI                   = linear_backward(go, ggI, W)[1]
    Outputs that were masked off contribute nothing.
    """
    grad_out, input, weight = ctx.saved_tensors
    ops = torch.ops.autograd_ext
    gg_input, gg_weight, gg_bias = (
        g if (wanted and g is not None) else None
        for g, wanted in zip((gg_input, gg_weight, gg_bias), ctx.output_mask)
    )
    need_grad_out, need_input, need_weight = ctx.needs_input_grad[:3]

    d_grad_out = d_input = d_weight = None
    if need_grad_out:
        terms = []
        if gg_input is not None:
            terms.append(ops.linear_forward(gg_input, weight, None))
        if gg_weight is not None:
            terms.append(ops.linear_forward(input, gg_weight, gg_bias))
        elif gg_bias is not None:
            terms.append(gg_bias.expand(grad_out.shape))
        if terms:
            d_grad_out = functools.reduce(operator.add, terms)
    if need_input and gg_weight is not None:
        d_input = ops.linear_backward(grad_out, input, gg_weight, [True, False, False])[0]
    if need_weight and gg_input is not None:
        d_weight = ops.linear_backward(grad_out, gg_input, weight, [False, True, False])[1]
    return d_grad_out, d_input, d_weight, None


def _register_python_impls() -> None:
    """Attach fake kernels and autograd formulas to the freshly loaded operators."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(FORWARD_OP, "Autograd"):
        return  # done by an earlier import of this module (e.g. after importlib.reload)
    torch.library.register_fake(FORWARD_OP)(_linear_forward_fake)
    torch.library.register_fake(BACKWARD_OP)(_linear_backward_fake)
    torch.library.register_autograd(FORWARD_OP, _forward_backward, setup_context=_forward_setup_context)
    torch.library.register_autograd(BACKWARD_OP, _backward_backward, setup_context=_backward_setup_context)


# ---------------------------------------------------------------------------
# Public front ends
# ---------------------------------------------------------------------------


def ext_linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``input @ weight.T + bias`` through ``torch.ops.autograd_ext.linear_forward``.

    Differentiable through the registered autograd formula and traceable by
    ``torch.compile`` through the registered fake kernel.
    """
    _ensure_loaded()
    return torch.ops.autograd_ext.linear_forward(input, weight, bias)


def ext_linear_backward(
    grad_out: Tensor, input: Tensor, weight: Tensor, output_mask: Sequence[bool] = (True, True, True)
) -> tuple[Tensor, Tensor, Tensor]:
    """``(grad_out @ W, grad_out.T @ input, grad_out.sum(0))``; masked-off entries are empty."""
    _ensure_loaded()
    return torch.ops.autograd_ext.linear_backward(grad_out, input, weight, list(output_mask))


class ExtLinearFunction(torch.autograd.Function):
    """Linear layer as a ``torch.autograd.Function`` over the extension's kernels.

    This is the explicit pattern from the custom C++/CUDA extension tutorial:
    forward saves what backward needs, backward calls the backward kernel and
    returns ``None`` for inputs that do not require a gradient. Because
    backward is built from differentiable operators, double backward works.
    """

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        _ensure_loaded()
        output = torch.ops.autograd_ext.linear_forward(input, weight, bias)
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight = ctx.saved_tensors
        return _linear_grads(ctx, grad_output, input, weight)


class ExtLinear(nn.Module):
    """Drop-in counterpart of ``nn.Linear`` backed by the extension.

    Parameters are created and initialised exactly like ``nn.Linear`` so the
    two can be compared weight-for-weight. ``forward`` calls the registered
    operator rather than :class:`ExtLinearFunction`, so ``torch.compile`` sees
    a single opaque op with known shapes and a known backward.
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        load_extension()

    def reset_parameters(self) -> None:
        """Kaiming-uniform weight and uniform bias, matching ``nn.Linear``."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        return ext_linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
