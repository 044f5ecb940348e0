"""The base of the plugin's ``TorchDispatchMode``s, which watch or steer the aten calls of code run under them."""

import sys

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` that imports no dynamo in a process that never compiles."""

    @classmethod
    def _should_skip_dynamo(cls):
        """torch wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable``, whose first call imports
        dynamo (about a second, nine hundred modules) in a process that never compiles. The wrapping only
        matters where dynamo runs: asked when a subclass is made, it is done only once dynamo is imported."""
        return "torch._dynamo" in sys.modules
