"""Keeping torch's own noise out of the user's run while a check runs.

Warnings that torch's machinery raises inside a check (``torch.jit.script``
deprecations while forward-mode AD or inductor load, UserWarnings inside
opcheck) are not the op's fault, yet under ``-W error`` or
``filterwarnings = error`` they fail a correct op. They are ignored when
their origin, the module the warning is attributed to, is inside torch, and
deprecation warnings are also ignored when torch attributes them to the
plugin's own calls. Every warning attributed to the user's code (the op, its
backward, the reference) still reaches the user's filters, and so do the
plugin's own notes (HygieneWarning, GraphBreakWarning).

torch.compile also emits hundreds of empty DEBUG records on its structured
trace logger (``torch.__trace``, read by tlparse). pytest attaches its
capture handlers to every non-propagating logger, so they would fill the
"Captured log" section of a failing report; handlers that are not torch's
are detached from that logger meanwhile.
"""

import contextlib
import logging
import warnings

TORCH_MODULES = r"torch(\.|$)"
PLUGIN_MODULES = r"pytest_autograd(\.|$)"
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
TRACE_LOGGER = "torch.__trace"


@contextlib.contextmanager
def quiet_torch_machinery():
    """Ignore warnings that originate inside torch (or torch deprecations met by the plugin), detach trace logs."""
    logger = logging.getLogger(TRACE_LOGGER)
    foreign = [handler for handler in logger.handlers if not type(handler).__module__.startswith("torch")]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=TORCH_MODULES)
        for category in DEPRECATIONS:
            warnings.filterwarnings("ignore", category=category, module=PLUGIN_MODULES)
        for handler in foreign:
            logger.removeHandler(handler)
        try:
            yield
        finally:
            for handler in foreign:
                logger.addHandler(handler)
