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

FAULT_MESSAGES = (
    "illegal memory access",
    "device-side assert",
    "misaligned address",
    "unspecified launch failure",
    "illegal instruction",
    "hardware stack error",
    "uncorrectable ECC error",
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
    """Whether ``error`` is a GPU fault that leaves the device unusable (CUDA's sticky errors)."""
    if not isinstance(error, RuntimeError):  # torch.AcceleratorError and Triton's errors are RuntimeErrors
        return False
    text = str(error)
    return any(message in text for message in FAULT_MESSAGES)


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
