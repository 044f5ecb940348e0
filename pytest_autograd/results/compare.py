"""Tolerances by dtype and worst-element comparison of tensors.

Defaults are for comparing two implementations of the same maths (op vs
reference, CUDA vs CPU), whose reductions may sum in different orders: they
are looser than torch.testing's same-kernel defaults, and ``atol`` scales
with the magnitude of the expected tensor.
"""

import math
from dataclasses import dataclass

import torch

# (atol, rtol) per dtype for cross-implementation comparisons.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 5e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-4),
}


def tolerance_for(dtype, atol=None, rtol=None):
    """The (atol, rtol) to use for ``dtype``; explicit values win."""
    default_atol, default_rtol = TOLERANCES.get(dtype, (0.0, 0.0))
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


def dtype_label(dtype):
    """``float32`` rather than ``torch.float32``: how reports name a dtype."""
    return str(dtype).replace("torch.", "")


def fmt(value):
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.6g}"
    return str(value)


def fmt_index(index):
    return "[" + ", ".join(str(i) for i in index) + "]"


def unravel(flat, shape):
    """The index of element number ``flat`` of a row-major tensor of ``shape``.

    Plain arithmetic: ``torch.unravel_index`` imports torch's symbolic-shape
    machinery on its first call (about a second) and checks its arguments
    against abstract base classes on every call.
    """
    index = []
    for size in reversed(tuple(shape)):
        flat, position = divmod(int(flat), int(size)) if size else (flat, 0)
        index.append(position)
    return tuple(reversed(index))


@dataclass
class Mismatch:
    """The worst element of a failed comparison and the overall error."""

    index: tuple
    expected: float
    got: float
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    bad: int
    numel: int
    problem: str = None  # set when shapes/dtypes differ instead of values
    exact: bool = False  # integer/bool tensors: no tolerance, no relative error

    def worst(self, name="tensor"):
        if self.problem:
            return self.problem
        return f"{name}{fmt_index(self.index)}: expected {fmt(self.expected)}, got {fmt(self.got)}"

    def error_line(self):
        if self.problem:
            return None
        if self.exact:
            return f"compared exactly (integer/bool values); {self.bad} of {self.numel} elements differ"
        return (
            f"max abs error {fmt(self.max_abs)}, max rel error {fmt(self.max_rel)} "
            f"(atol {fmt(self.atol)}, rtol {fmt(self.rtol)}); {self.bad} of {self.numel} elements differ"
        )


def compare_tensors(expected, got, atol, rtol, scale_atol=True):
    """Return None when ``got`` matches ``expected``, else the worst Mismatch.

    Integer and bool tensors compare exactly. NaN matches NaN and an
    infinity matches the same infinity.
    """
    if tuple(expected.shape) != tuple(got.shape):
        return Mismatch((), math.nan, math.nan, math.inf, math.inf, atol, rtol, 1, 1,
                        problem=f"shape: expected {list(expected.shape)}, got {list(got.shape)}")
    exact = not (expected.is_floating_point() or expected.is_complex())
    expected = expected.detach().to("cpu")
    got = got.detach().to("cpu")
    if exact:
        differ = expected != got
        if not bool(differ.any()):
            return None
        index = tuple(int(i) for i in differ.nonzero()[0])
        return Mismatch(index, _item(expected[index]), _item(got[index]), math.nan, math.nan, 0.0, 0.0,
                        int(differ.sum()), expected.numel(), exact=True)
    expected = expected.to(torch.complex128 if expected.is_complex() else torch.float64)
    got = got.to(expected.dtype)
    if expected.numel() == 0:
        return None
    both_nan = expected.isnan() & got.isnan()
    same_inf = expected.isinf() & (expected == got)
    special = both_nan | same_inf
    finite_expected = torch.where(expected.isfinite(), expected.abs(), torch.zeros_like(expected.abs()))
    scale = max(1.0, float(finite_expected.max())) if scale_atol else 1.0
    abs_error = (expected - got).abs()
    abs_error = torch.where(special, torch.zeros_like(abs_error), abs_error)
    abs_error = torch.where(abs_error.isnan(), torch.full_like(abs_error, math.inf), abs_error)
    allowed = atol * scale + rtol * finite_expected
    excess = abs_error - allowed
    bad = excess > 0
    if not bool(bad.any()):
        return None
    flat = int(torch.argmax(torch.where(bad, abs_error / allowed.clamp_min(1e-300), torch.zeros_like(abs_error))))
    index = unravel(flat, expected.shape)
    rel_error = abs_error / finite_expected.clamp_min(1e-300)
    rel_error = torch.where(special, torch.zeros_like(rel_error), rel_error)
    return Mismatch(
        index=index,
        expected=_item(expected[index]),
        got=_item(got[index]),
        max_abs=float(abs_error.max()),
        max_rel=float(rel_error.max()),
        atol=atol * scale,
        rtol=rtol,
        bad=int(bad.sum()),
        numel=expected.numel(),
    )


def _item(value):
    value = value.item()
    return value if isinstance(value, (int, bool)) else (value if isinstance(value, complex) else float(value))
