"""The name a person knows an op by, for reports, tables and JSON records.

Objects reach the plugin in many shapes: an autograd.Function class, a
``torch.ops`` operator (whose ``__qualname__`` is pybind11's internal
record type), a ``custom_op``, a lambda, a ``functools.partial``, a bound
method, an ``nn.Module`` instance. Each gets the name its author wrote.
Imports no torch: it runs while the plugin validates markers.
"""

import functools
import inspect
import os

MAX_LENGTH = 80


def display_name(obj):
    """A short name for ``obj``: ``autograd_ext::linear_forward``, ``MyReLU.apply``, ``lambda at t.py:12``."""
    name = _operator_name(obj)
    if name is None:
        name = _python_name(obj)
    return name if len(name) <= MAX_LENGTH else name[: MAX_LENGTH - 3] + "..."


def _operator_name(obj):
    """``ns::op`` (``ns::op.overload`` for a non-default overload) for torch operators and custom ops."""
    qualified = getattr(obj, "_qualified_op_name", None)  # OpOverloadPacket
    if isinstance(qualified, str):
        return qualified
    schema_name = getattr(obj, "_name", None)
    overload = getattr(obj, "_overloadname", None)
    if isinstance(schema_name, str) and isinstance(overload, str) and "::" in schema_name:  # OpOverload
        return schema_name  # already ``ns::op.overload`` for a non-default overload
    custom = getattr(obj, "_qualname", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(custom, str) and "::" in custom:
        return custom
    return None


def _python_name(obj):
    if isinstance(obj, functools.partial):
        return _partial_name(obj)
    if _is_module_instance(obj):
        extra = _safe(lambda: obj.extra_repr()) or ""
        return f"{type(obj).__name__}({extra})"
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", None)
    if isinstance(owner, type) and isinstance(name, str):  # a classmethod such as Function.apply
        return f"{owner.__name__}.{name}"
    if name == "<lambda>":
        return _lambda_name(obj)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(qualname, str) and qualname.startswith("_VariableFunctionsClass."):
        return f"torch.{name}"  # torch.exp & co., not the binding's class
    if isinstance(qualname, str) and qualname.startswith("pybind11_"):
        return name if isinstance(name, str) else qualname
    if isinstance(qualname, str):
        return qualname.replace(".<locals>.", ".") if "<locals>" in qualname else qualname
    if isinstance(name, str):
        return name
    for attr in ("_name", "name"):
        value = getattr(obj, attr, None)
        if isinstance(value, str):
            return value
    return type(obj).__name__


def _partial_name(obj):
    parts = [display_name(obj.func)]
    parts += [_short(arg) for arg in obj.args]
    parts += [f"{key}={_short(value)}" for key, value in obj.keywords.items()]
    return f"partial({', '.join(parts)})"


def _lambda_name(obj):
    code = getattr(obj, "__code__", None)
    if code is None:
        return "lambda"
    return f"lambda at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _short(value):
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"tensor{list(shape)}"
    text = repr(value)
    return text if len(text) <= 20 else text[:17] + "..."


def _is_module_instance(obj):
    if inspect.isclass(obj):
        return False
    return any(cls.__name__ == "Module" and cls.__module__ == "torch.nn.modules.module" for cls in type(obj).__mro__)


def _safe(call):
    try:
        return call()
    except Exception:
        return None


def did_you_mean(unknown, known):
    """' (did you mean X?)' for the closest known names, or ''."""
    import difflib

    lowered = {name.lower(): name for name in known}
    guesses = []
    for name in unknown:
        match = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.7)
        if match:
            guesses.append(lowered[match[0]])
    return f" (did you mean {', '.join(dict.fromkeys(guesses))}?)" if guesses else ""
