"""Complex tensors as pairs of real numbers, so every check differentiates them.

A complex input ``z`` of shape ``S`` becomes a real leaf of shape ``S + (2,)``
(real part at ``[..., 0]``, imaginary part at ``[..., 1]``), turned back into
``torch.complex(re, im)`` for each call; a complex output is seen as
``torch.view_as_real(out)``. The checks then compare the derivatives of a
real function of real variables, which is what torch.autograd.gradcheck does
for complex functions (the conjugate Wirtinger derivative is exactly the
pair of real partial derivatives), so a conjugation mistake in a complex
backward fails like any wrong gradient. Reports name the argument as
written; the last index of an element is 0 for the real part, 1 for the
imaginary part.
"""

import torch

REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def real_dtype(dtype):
    """float32 for complex64 and so on; other dtypes unchanged."""
    return REAL_OF.get(dtype, dtype)


def real_view_leaf(value, device, dtype=None):
    """A real copy of the complex ``value`` with a trailing (re, im) dimension, in ``dtype`` when given."""
    real = torch.view_as_real(value.resolve_conj().resolve_neg())
    return real.to(device=device, dtype=dtype or real.dtype, copy=True)


def as_complex(real_view):
    """``torch.complex(re, im)`` from a real view (any strides; differentiable, forward-mode too)."""
    if real_view.dtype not in COMPLEX_OF:
        from pytest_autograd.engine.outcomes import OpRaised

        name = {torch.float16: "Half", torch.bfloat16: "BFloat16"}.get(real_view.dtype, str(real_view.dtype))
        raise OpRaised("forward", NotImplementedError(
            f"complex arguments are not implemented for '{name}': no complex dtype holds {name} parts the checks "
            "can differentiate"))
    return torch.complex(real_view[..., 0], real_view[..., 1])


def real_output(output):
    """A complex output as its real view; any other tensor unchanged."""
    if output.is_complex():
        return torch.view_as_real(output.resolve_conj().resolve_neg())
    return output
