"""Full float32 arithmetic for a check: torch's reduced-precision float32 switches off for a while, then restored.

On NVIDIA GPUs since Ampere, float32 matmuls and convolutions may run in
TF32 (a 10-bit mantissa): cuDNN convolutions do by default, matmuls when a
project sets ``torch.backends.cuda.matmul.allow_tf32`` or
``torch.set_float32_matmul_precision("high")``, as many training scripts do;
"medium" lets CPU matmuls (oneDNN) run in bfloat16. Results then differ from
full float32 by about 1e-3 relatively, which no float32 tolerance can tell
from a bug. Checks that judge numbers run under :func:`full_float32`.

The switches are turned off through the older ``allow_tf32`` flags, which
leave every getter readable (an op's backward may read
``torch.backends.cudnn.allow_tf32``; torch 2.9 and later refuse to read it
while the newer ``fp32_precision`` attributes disagree with one another),
and oneDNN's matmul is set to full float32. Afterwards every attribute is
put back exactly as it was: the newer attributes where torch has them, else
the older flags and the matmul precision ("medium" included).
"""

from contextlib import contextmanager
from functools import partial

import torch

FULL = "ieee"  # the fp32_precision value of full float32 arithmetic


def _precision_attributes():
    """(owner, name) of every ``fp32_precision`` attribute, parents before children; [] on a torch without them."""
    backends = torch.backends
    mkldnn = getattr(backends, "mkldnn", None)
    owners = [backends, backends.cuda.matmul, backends.cudnn, getattr(backends.cudnn, "conv", None),
              getattr(backends.cudnn, "rnn", None), mkldnn]
    owners += [getattr(mkldnn, part, None) for part in ("matmul", "conv", "rnn")] if mkldnn is not None else []
    found = [(owner, "fp32_precision") for owner in owners if owner is not None and hasattr(owner, "fp32_precision")]
    return found if (backends.cuda.matmul, "fp32_precision") in found else []


def _switches():
    """(read, write) of each switch: the older flags first (torch keeps them beside the newer attributes), then
    the newer attributes; written back in this order, each ends as it was."""
    cudnn = torch.backends.cudnn
    older = [(lambda: cudnn.allow_tf32, partial(setattr, cudnn, "allow_tf32")),
             (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision)]
    return older + [(partial(getattr, owner, name), partial(setattr, owner, name))
                    for owner, name in _precision_attributes()]


def _save():
    """(write, value) of each switch torch can read now."""
    saved = []
    for read, write in _switches():
        try:
            saved.append((write, read()))
        except RuntimeError:  # torch 2.9+ refuses the older flags while the newer attributes disagree: those are saved
            pass
    return saved


def _restore(saved):
    for write, value in saved:
        write(value)


def _turn_off():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if matmul is not None and hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = FULL


def switches_state():
    """The values :func:`full_float32` saves and restores, in order: for comparing before and after."""
    return [value for _, value in _save()]


@contextmanager
def full_float32():
    """Run the block with float32 matmuls and convolutions in full float32; every switch is restored after it."""
    saved = _save()
    try:
        _turn_off()
        yield
    finally:
        _restore(saved)
