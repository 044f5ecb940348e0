"""Reference custom autograd Functions for pytest-autograd's tests and tutorial.

* :mod:`reference_ops.functions` -- correct classic examples (exported here).
* :mod:`reference_ops.buggy` -- planted-bug twins, one classic mistake each.
* :mod:`reference_ops.triton_ops` -- RMSNorm as Triton kernels with a
  hand-written backward, and its planted-bug twins (needs triton; imported
  only on use).
* :mod:`reference_ops.state` -- ops with state across calls, correct and buggy.
* :mod:`reference_ops.modules` -- ``nn.Module`` ops (a correct one and its buggy twin).
* :mod:`reference_ops.complex_ops` -- complex-valued Functions (a correct one and its buggy twin).
* :mod:`reference_ops.fused` -- ops written like fused training kernels (float32 compute, a backward
  with no graph), their planted-bug twin, and a block built from them.
* :mod:`reference_ops.model` -- a small transformer built from the ops above, for the model scan
  (with a planted bug behind a flag).
* :mod:`reference_ops.model_sizes` -- an attention layer whose rotary embedding is written for even head dims
  (the model fixes its head dim), and a running sum over the sequence with a twin whose backward drops the
  tail of a length that is not a multiple of its chunk, for the model scan's sizes.
* :mod:`reference_ops.sizes` -- tiled kernels right at power-of-two sizes and wrong at others (a last-block
  mask, a grid with floor division, a split boundary, a squeezed batch of one), with correct twins;
  :mod:`reference_ops.sizes_triton` -- a Triton kernel missing its last program (needs triton).
* :mod:`reference_ops.low_precision_reductions`, :mod:`reference_ops.triton_layer_norm` -- bfloat16
  layer norms whose weight gradients are summed in float32 or (the bug) bfloat16 partial buffers; the
  Triton one refuses every dtype but bfloat16, and has a twin that reads a row-strided grad_output wrongly.
* :mod:`reference_ops.mixed_precision` -- bfloat16 activations with float32 master weights, and a twin
  returning the weight's gradient in bfloat16.
* :mod:`reference_ops.scale` -- GELU, layer norm, softmax and attention written like kernels' wrappers, for
  checks at 0.25M to 4M elements, with twins whose backward uses intermediates saved in forward.
* :mod:`reference_ops.memory_saving` -- a backward that writes the gradients into the saved inputs
  (declared with ``mutates=``), and a twin with a wrong gradient.
* :mod:`reference_ops.statistics_outputs` -- an RMS norm that also returns ``rstd``, marked
  non-differentiable, and a twin with a wrong weight gradient.
* :mod:`reference_ops.sparse_gradients` -- an embedding lookup whose backward returns a sparse gradient for
  the weight, and twins writing it to the wrong row or reading the weight as if contiguous.
* :mod:`reference_ops.random_ops` -- dropout drawing from torch's global random generator (in the input's dtype
  and order, or in a fixed one), and twins with a wrong backward.
* :mod:`reference_ops.noise` -- noise injection, reparameterized samples and Gumbel noise, right when every
  evaluation draws alike, and twins whose backward draws the noise again.
* :mod:`reference_ops.training` -- ops right when called plainly and wrong only where a training step calls
  them (under autocast, checkpointing, saved-tensor hooks, an overflowing loss scale, gradient accumulation),
  with their correct twins.
* :mod:`reference_ops.selection` -- a top-k over integer votes (ties everywhere) and a twin with a wrong
  gradient away from ties.
* :mod:`reference_ops.flash_attention` -- attention as FlashAttention-2 computes it (backward from ``o`` and
  ``lse``), and a twin whose backward recomputes the probabilities from an unshifted ``exp``.
* :mod:`reference_ops.crashing` -- ops whose native code crashes the process (a gather with no bounds check,
  a backward reading a strided grad_output as contiguous, a forward reading address 0), for the checks that
  must report a crash and go on.
* :mod:`reference_ops.extension` -- a C++ extension op.  Its names
  (``load_extension``, ``ExtLinearFunction``, ``ExtLinear``,
  ``extension_available``, ``cuda_extension_available``) are available here
  too, but are resolved lazily: importing :mod:`reference_ops` never imports
  or builds the extension.  They are left out of ``__all__`` so that
  ``from reference_ops import *`` stays cheap as well.
"""

from __future__ import annotations

import importlib
from pathlib import Path as _Path

from ._installation import check_installation as _check_installation

_check_installation(_Path(__file__).resolve().parent)  # a clear error if another distribution shares the name

from . import functions  # noqa: E402
from .functions import *  # noqa: F401,F403,E402
from .functions import __all__ as _functions_all  # noqa: E402

_EXTENSION_EXPORTS = frozenset(
    {
        "load_extension",
        "ExtLinearFunction",
        "ExtLinear",
        "extension_available",
        "cuda_extension_available",
    }
)
_LAZY_SUBMODULES = frozenset({"buggy", "complex_ops", "crashing", "extension", "flash_attention", "fused",
                              "low_precision_reductions", "memory_saving", "mixed_precision", "model", "model_sizes",
                              "modules", "noise", "normalization", "scale", "training",
                              "selection", "sizes", "sizes_triton", "state", "statistics_outputs", "triton_layer_norm",
                              "triton_ops"})

__all__ = ["functions", *_functions_all]


def __getattr__(name: str):
    if name in _EXTENSION_EXPORTS:
        extension = importlib.import_module(f"{__name__}.extension")
        return getattr(extension, name)
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _EXTENSION_EXPORTS | _LAZY_SUBMODULES)
