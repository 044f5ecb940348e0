"""``op=`` an ``nn.Module`` instance: its parameters are checked like the op's other inputs.

A module hides its parameters from the call: ``linear(x)`` differentiates
``weight`` and ``bias`` without taking them as arguments, and checks that
cast inputs to float64 or move them to a device would leave the parameters
behind (dtype errors) and never see their gradients. So the module becomes a
function of ``(*inputs, **parameters)`` through ``torch.func.functional_call``,
and every sample gets a copy of each parameter as a keyword argument named
by its parameter name (``weight``, ``bias``, ``0.weight``). Every check then
casts, moves, differentiates and names them like any input; the user's
module itself is never changed. Frozen parameters (``requires_grad=False``)
are declared constants. Buffers (running statistics) are module state, not
inputs: each call gets copies, on the inputs' device and in the parameters'
floating dtype, so an update of them in training mode touches neither the
user's module nor the samples.

A ``reference=`` that is itself a module is called the same way with the
same parameter names; any other reference receives the parameters as
keyword arguments (``torch.nn.functional.linear(x, weight=..., bias=...)``).
"""


def is_module(op):
    """True for an ``nn.Module`` instance (found without importing torch when torch is not loaded)."""
    import sys

    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(op, nn.Module)


class ModuleFunction:
    """``module`` as a function of ``(*inputs, **parameters)``; buffers are copied in on each call."""

    def __init__(self, module):
        self.module = module
        self.parameter_names = [name for name, _ in module.named_parameters()]
        self.__name__ = self.__qualname__ = type(module).__name__
        self.__doc__ = type(module).__doc__
        try:
            import inspect

            signature = inspect.signature(module.forward)  # names the inputs in reports
            parameters = list(signature.parameters.values())
            if not any(p.kind == p.VAR_KEYWORD for p in parameters):
                parameters.append(inspect.Parameter("parameters", inspect.Parameter.VAR_KEYWORD))
            self.__signature__ = signature.replace(parameters=parameters)
        except (TypeError, ValueError):
            pass

    def __call__(self, *args, **kwargs):
        from torch.func import functional_call

        parameters = {name: kwargs.pop(name) for name in self.parameter_names if name in kwargs}
        state = {**parameters, **self._buffers_like(parameters, args)}
        return functional_call(self.module, state, args, kwargs)

    def _buffers_like(self, parameters, args):
        import torch

        tensors = list(parameters.values()) + [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors:
            return {}
        device = tensors[0].device
        floating = next((t.dtype for t in tensors if t.is_floating_point()), None)
        buffers = {}
        for name, buffer in self.module.named_buffers():
            if buffer is None:
                continue
            dtype = floating if buffer.is_floating_point() and floating is not None else buffer.dtype
            buffers[name] = buffer.detach().to(device=device, dtype=dtype, copy=True)
        return buffers

    def __repr__(self):
        return f"{type(self.module).__name__} (an nn.Module, called with its parameters as keyword arguments)"


def module_options(options):
    """Marker options for a module ``op=``: op (and a module reference) as functions, frozen parameters constant."""
    op = options["op"]
    if not is_module(op):
        return options
    options = dict(options)
    options["op"] = ModuleFunction(op)
    if is_module(options.get("reference")):
        options["reference"] = ModuleFunction(options["reference"])
    frozen = [name for name, parameter in op.named_parameters() if not parameter.requires_grad]
    if frozen:
        declared = options.get("constants")
        declared = [] if declared is None else [declared] if isinstance(declared, (str, int)) else list(declared)
        options["constants"] = declared + frozen
    return options


def with_parameters(op, samples):
    """``samples`` with a copy of each of the module's parameters as keyword arguments (unchanged for others)."""
    if not isinstance(op, ModuleFunction):
        return samples
    parameters = dict(op.module.named_parameters())
    extended = []
    for sample in samples:
        clash = sorted(set(sample.kwargs) & set(parameters))
        if clash:
            from pytest_autograd.engine.outcomes import UsageProblem

            raise UsageProblem(
                f"sample keyword argument(s) {', '.join(clash)} have the name of a parameter of the module "
                f"{op.__name__}; the module's parameters are passed by their names, so give the sample's "
                "arguments other names."
            )
        dtype = _floating_dtype(sample)
        copies = {name: parameter.detach().to(dtype=dtype if parameter.is_floating_point() and dtype else None,
                                              copy=True)
                  for name, parameter in parameters.items()}
        extended.append(sample.replace(kwargs={**sample.kwargs, **copies}))
    return extended


def _floating_dtype(sample):
    """The dtype of the sample's first floating tensor: parameters follow their inputs' precision."""
    import torch

    for value in sample.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
    return None
