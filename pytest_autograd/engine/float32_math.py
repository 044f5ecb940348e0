"""Full float32 arithmetic for a comparison: torch's TF32 switches off for a while, then restored.

On NVIDIA GPUs since Ampere, float32 matmuls and convolutions may run in
TF32 (a 10-bit mantissa): cuDNN convolutions do by default, matmuls when a
project sets ``torch.backends.cuda.matmul.allow_tf32`` or
``torch.set_float32_matmul_precision("high")``, as many training scripts do.
Their results then differ from the CPU's by about 1e-3 relatively, which no
float32 tolerance can tell from a bug. A check comparing a device with the
CPU runs the device in full float32 under :func:`full_float32`.

torch 2.9 and later set these through ``fp32_precision`` attributes and
refuse to read the older ``allow_tf32`` flags while the two disagree, so
the newer attributes are used where they exist, and each is put back to
the value it had.
"""

from contextlib import contextmanager

import torch

FULL = "ieee"  # the fp32_precision value of full float32 arithmetic


def _switches():
    """(object, attribute, value meaning full float32) of every TF32 switch this torch has."""
    backends = torch.backends
    newer = [(backends.cuda.matmul, "fp32_precision"), (getattr(backends.cudnn, "conv", None), "fp32_precision"),
             (getattr(backends.cudnn, "rnn", None), "fp32_precision")]
    if all(owner is not None and hasattr(owner, name) for owner, name in newer):
        return [(owner, name, FULL) for owner, name in newer]
    return [(backends.cuda.matmul, "allow_tf32", False), (backends.cudnn, "allow_tf32", False)]


@contextmanager
def full_float32():
    """Run the block with TF32 off for matmuls and convolutions; the switches are restored after it."""
    saved = []
    try:
        for owner, name, full in _switches():
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, full)
    except (AttributeError, RuntimeError):  # a torch whose switches cannot be read here: leave them as they are
        _restore(saved)
        saved = []
    try:
        yield
    finally:
        _restore(saved)


def _restore(saved):
    for owner, name, value in reversed(saved):
        setattr(owner, name, value)
