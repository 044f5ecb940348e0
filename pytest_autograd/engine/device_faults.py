"""A GPU kernel that faults: an illegal memory access, a device-side assert.

Such an error is not the op refusing an input (a size, a dtype, a domain),
which checks note and go on from: it leaves the device's context unusable for
the rest of the process, so every later call on that device raises the same
error, and CUDA reports it late, at some later call. Taken for a refusal, the
fault would be noted where it happened (a size variant "outside the op's
contract") and blamed on whatever ran next.

So an op's error that is such a fault becomes :class:`DeviceFault`, which is
no ``OpRaised``: no check's refusal handling catches it. The item where it
surfaces fails saying what it was, and the process remembers the device as
faulted: each later item on it fails at once, naming the first fault,
instead of running into the same error and reporting it as its own.
"""

from contextlib import contextmanager

FAULT_MESSAGES = (  # CUDA's wording of its sticky errors (torch and Triton quote it)
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "misaligned address",
    "unspecified launch failure",
    "an illegal instruction was encountered",
    "hardware stack error",
    "uncorrectable ECC error encountered",
    "invalid program counter",
    "operation not supported on global/shared address space",
)
LATE_REPORT_HINT = ("the GPU reports a faulting kernel late, at a later call: rerun this item alone with "
                    "CUDA_LAUNCH_BLOCKING=1 to stop at the launch that faulted, and under compute-sanitizer to name "
                    "the access; an access past the end of a tensor at a size the samples do not have (the last "
                    "partial block) is the usual cause")


class DeviceFault(Exception):
    """The op's kernel faulted on the device; the device cannot run anything more in this process."""

    def __init__(self, phase, error):
        self.phase = phase
        self.error = error
        self.situation = None  # where the check was, when it knows better than the sample (a size variant)
        super().__init__(f"{phase} faulted: {first_line(error)}")


def is_device_fault(error):
    """Whether ``error`` is a GPU fault that left the device unusable: CUDA's wording of a sticky error, and the
    device failing a trivial call now (an op's own message quoting the words, or an ordinary CUDA error such as a
    bad launch configuration, leaves it working)."""
    if not isinstance(error, RuntimeError):  # torch.AcceleratorError and Triton's errors are RuntimeErrors
        return False
    text = str(error)
    return any(message in text for message in FAULT_MESSAGES) and device_is_broken()


def device_is_broken():
    """Whether the item's CUDA device (else the current one) fails a synchronisation now, as every call does after
    a sticky error. False where CUDA was never used. (Other devices are not touched: that would give each a
    context.)"""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    device = _ITEM_DEVICE[-1] if _ITEM_DEVICE and _ITEM_DEVICE[-1].startswith("cuda") else None
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        return True
    return False


_ITEM_DEVICE = []  # the device of the item running now, innermost last


@contextmanager
def item_on(device):
    """Mark the block as an item on ``device``: the device a fault is confirmed on."""
    _ITEM_DEVICE.append(str(device))
    try:
        yield
    finally:
        _ITEM_DEVICE.pop()


def raise_if_fault(error, phase="a kernel it launched"):
    """Re-raise ``error`` as a DeviceFault when it is one: for code that catches every exception of an op run."""
    if isinstance(error, DeviceFault):
        raise error
    if is_device_fault(error):
        raise DeviceFault(phase, error) from error


def first_line(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


_FAULTED = {}  # device type -> what faulted there first, in this process


def remember(device, where, error):
    """Record that ``where`` faulted ``device``'s context; a CPU item that met a GPU's fault leaves CPU usable."""
    if _device_type(device) != "cpu":
        _FAULTED.setdefault(_device_type(device), f"{where} ({first_line(error)})")


def fault_on(device):
    """What faulted ``device`` earlier in this process, or None."""
    return _FAULTED.get(_device_type(device))


def forget_all():
    """For tests: no device has faulted."""
    _FAULTED.clear()


def _device_type(device):
    return str(device).split(":")[0]
