"""Running a model once and recording every custom op it calls, with the arguments each call received.

Two kinds of custom op are recorded:

* ``torch.autograd.Function`` subclasses defined outside torch. Each one's
  ``forward`` is replaced on the class for the duration of the capture, so
  every call is seen however it is reached: ``MyFn.apply(...)``, an alias
  ``fused = MyFn.apply`` taken at import time, a library that patched a
  model class to call it. (Autograd's C++ ``apply`` looks ``forward`` up on
  the class at each call.) Classes created during the capture are patched as
  they are created.
* ``torch.ops`` operators outside torch's own namespaces (``custom_op``,
  ``torch.library``, ``TORCH_LIBRARY``), seen by a ``TorchFunctionMode`` at
  the call, above autograd, so composite ops are seen too.

Only top-level calls are recorded: a custom op called inside another's
forward (or its implementation) is part of that op. Calls during the
backward pass are recorded only where they run with grad enabled, which is a
checkpointed forward being recomputed; a backward's own ops are not.

Each recorded call keeps a detached clone of its arguments, taken before the
op runs (an in-place op would otherwise show its output), and which tensor
arguments required grad at the call: an argument that did not (a frozen
weight, a RoPE table, a mask, anything under ``torch.no_grad()``) is checked
as a constant.
"""

import dataclasses
import functools
import os
import sys
import sysconfig
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.autograd import Function
from torch.autograd.function import BackwardCFunction, FunctionMeta
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from pytest_autograd.engine.outcomes import UsageProblem

# Operator namespaces that torch itself defines: not custom ops.
TORCH_NAMESPACES = frozenset({
    "aten", "prim", "prims", "_c10d_functional", "_c10d_functional_autograd", "c10d", "c10d_functional",
    "_dtensor", "_inductor_test", "_native", "_quantized", "_test", "debug_mode_ops", "debugprims", "export",
    "flex_lib", "fsdp", "higher_order", "inductor", "inductor_prims", "mkl", "mkldnn", "mkldnn_prepacked",
    "onednn", "onnx", "onnx_symbolic", "profiler", "quantization", "quantized", "rngprims", "sparse",
    "static_runtime", "streams", "symm_mem",
})

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = sysconfig.get_paths().get("stdlib", "") + os.sep
_LOCK = threading.Lock()


class ModelRaised(UsageProblem):
    """The model's forward raised: the model's own error, where it was raised, and the op it was inside."""


@dataclass(eq=False)
class CapturedCall:
    """One top-level call of a custom op: the op, detached copies of its arguments, and where it was called."""

    op: object  # the Function subclass, or the torch.ops operator as it was called
    key: str  # the op's identity across calls
    args: tuple
    kwargs: dict
    grad_slots: frozenset  # positions (int) and keywords (str) of the tensor arguments that required grad
    site: str  # file:line of the code that called the op
    module: Optional[str] = None  # qualified name of the nn.Module whose forward was running, if known
    phase: str = "forward"
    outputs: list = field(default_factory=list, repr=False)  # a Function's outputs, until its call is resolved
    signature: tuple = None  # what tells its calls apart (see signature_of); args is None for a repeat

    @property
    def kept(self):
        """Whether this call's arguments were copied (repeats of a signature already kept are only counted)."""
        return self.args is not None


@dataclass
class Capture:
    """What one capture saw: the calls, in order, and what the backward pass did."""

    calls: list
    backward: str = "ran"  # "ran", "none" (nothing to differentiate), or the error the backward raised
    devices: tuple = ()  # the devices the calls' tensors were on


def capture_model(model, calls, seed=0, autocast=None):
    """Run ``model`` on each of ``calls`` (Samples) and a backward, recording top-level custom op calls.

    Raises ModelRaised when a forward raises. A backward that raises is
    recorded in ``Capture.backward``: the ops are still checked one by one,
    which names the op whose backward is wrong. ``autocast``: a dtype the
    forwards run under ``torch.autocast`` in (the backward after them, as a
    training step runs it), so the ops are recorded with what a
    mixed-precision step hands them.
    """
    if not _LOCK.acquire(blocking=False):
        raise UsageProblem("a model scan is already running (a model's forward started another scan); "
                           "scan one model at a time")
    try:
        recorder = _Recorder(model)
        with recorder.active():
            with _autocast(calls, autocast):
                outputs = [_forward(model, call, recorder) for call in calls]
            recorder.resolve()
            recorder.phase = "backward"
            backward = _backward(outputs, recorder, seed)
            recorder.resolve()
        return Capture(recorder.calls, backward, tuple(recorder.devices))
    finally:
        _LOCK.release()


def _autocast(calls, dtype):
    """``torch.autocast`` in ``dtype`` on the device of the calls' first tensor; nothing without a dtype."""
    from contextlib import nullcontext

    if dtype is None:
        return nullcontext()
    device = next((value.device.type for call in calls for value in pytree.tree_leaves((call.args, call.kwargs))
                   if isinstance(value, torch.Tensor)), "cpu")
    return torch.autocast(device, dtype=dtype)


def _forward(model, call, recorder):
    try:
        return model(*call.args, **call.kwargs)
    except Exception as error:
        raise ModelRaised(model_error_message(model, error)) from error


def model_error_message(model, error):
    from pytest_autograd.results.naming import display_name

    where = user_frame(error.__traceback__)
    inside = getattr(error, "_autograd_scan_inside", None)
    text = str(error).strip() or "(no message)"
    message = f"the model's forward raised {type(error).__name__}: {text}"
    if inside is not None:
        message += f"\n  inside {inside}"
    if where:
        message += f"\n  at {where}"
    return (f"{message}\n  The scan checks the custom ops a forward pass runs, so the model must run on the "
            f"inputs it is given: {display_name(model)} raised before the scan could record its ops. "
            "Fix the model or its inputs (run it once outside the scan to see the whole traceback).")


def user_frame(tb):
    """``file:line in function`` of the innermost traceback frame outside torch and this plugin; None if none."""
    import traceback

    frames = [f for f in traceback.extract_tb(tb) if _is_user_file(f.filename)]
    if not frames:
        return None
    frame = frames[-1]
    return f"{short_path(frame.filename)}:{frame.lineno} in {frame.name}"


def _is_user_file(filename):
    path = os.path.abspath(filename) if filename and not filename.startswith("<") else filename or ""
    return not (path.startswith(_TORCH_DIR) or path.startswith(_PACKAGE_DIR)
                or (_STDLIB_DIR != os.sep and path.startswith(_STDLIB_DIR) and "site-packages" not in path))


def short_path(filename):
    """A path relative to the working directory when it is under it, else the path as it is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if relative.startswith("..") else relative


def call_site(skip=1):
    """``file:line`` of the innermost frame of the running code outside torch and this plugin."""
    frame = sys._getframe(skip)
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def _backward(outputs, recorder, seed):
    """Differentiate the outputs once (random cotangents), without touching any ``.grad``."""
    flat = [t for t in tensors_in(outputs) if t.is_floating_point() and t.requires_grad]
    leaves = list(recorder.leaves.values())
    if not flat or not leaves:
        return "none"
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device, t.dtype) for t in flat]
    try:
        try:
            torch.autograd.grad(flat, leaves, cotangents, allow_unused=True, retain_graph=True)
        except RuntimeError as error:
            if "use_reentrant" not in str(error):
                raise
            _backward_keeping_grads(flat, cotangents, leaves)  # reentrant checkpointing refuses autograd.grad
    except Exception as error:
        where = user_frame(error.__traceback__)
        first = (str(error).strip().splitlines() or ["(no message)"])[0]
        return f"{type(error).__name__}: {first[:200]}" + (f" at {where}" if where else "")
    return "ran"


def tensors_in(value, depth=0):
    """The tensors in a model's output: nested tuples, lists, dicts (a ``ModelOutput``) and dataclasses."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 16:
        return []
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    else:
        return []
    return [tensor for item in items for tensor in tensors_in(item, depth + 1)]


def _backward_keeping_grads(outputs, cotangents, known_leaves):
    """``backward()`` on ``outputs``, the ``.grad`` of every leaf it can reach put back as it was afterwards.

    The leaves: those of the graph, and ``known_leaves`` (the model's
    parameters and the ops' leaf arguments), which a checkpoint's own
    backward reaches without the graph showing them.
    """
    leaves, seen, stack = {id(t): t for t in known_leaves}, set(), [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if isinstance(variable, torch.Tensor):
            leaves.setdefault(id(variable), variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    grads = [(leaf, leaf.grad) for leaf in leaves.values()]
    try:
        torch.autograd.backward(outputs, cotangents)
    finally:
        for leaf, grad in grads:
            leaf.grad = grad


# ---------------------------------------------------------------------------
# The recorder
# ---------------------------------------------------------------------------


class _Recorder:
    def __init__(self, model):
        self.calls = []
        self.pending = []  # Function calls whose outputs are not wrapped by autograd yet
        self.copied = set()  # (op key, signature, grad slots) whose arguments a recorded call holds
        self.depth = 0  # > 0 while a recorded op runs: calls inside it are its implementation
        self.phase = "forward"
        self.leaves = {}  # id -> leaf tensor requiring grad, seen as a model input or an op argument
        self.devices = {}
        self.modules = []  # stack of the running modules' names
        self.module_names = {}
        if isinstance(model, torch.nn.Module):
            self.module_names = {id(m): name for name, m in model.named_modules()}
            for parameter in model.parameters():
                if parameter.requires_grad:
                    self.leaves[id(parameter)] = parameter

    # -- switching capture on and off --------------------------------------------------

    def active(self):
        import contextlib

        recorder = self

        @contextlib.contextmanager
        def context():
            patched = _FunctionPatches(recorder)
            hooks = recorder._module_hooks()
            patched.apply()
            backward_apply = BackwardCFunction.apply
            BackwardCFunction.apply = _backward_seeing_custom_ops(backward_apply, recorder)
            try:
                with _CustomOpMode(recorder):
                    yield
            finally:
                BackwardCFunction.apply = backward_apply
                patched.restore()
                for hook in hooks:
                    hook.remove()
                recorder.pending.clear()

        return context()

    def _module_hooks(self):
        from torch.nn.modules import module as module_api

        names = self.module_names

        def enter(module, args):
            self.modules.append(names.get(id(module)))

        def leave(module, args, output):
            if self.modules:
                self.modules.pop()

        return [module_api.register_module_forward_pre_hook(enter),
                module_api.register_module_forward_hook(leave, always_call=True)]

    # -- recording ----------------------------------------------------------------------

    def wants(self):
        return self.depth == 0

    def record(self, op, key, args, kwargs, grad_enabled, pending):
        """Record one call (None when it is not the model's own: a backward's ops).

        A Function's call is pending until autograd has wrapped its outputs
        (whether the call was differentiable shows only then); an operator's
        is decided at once. Arguments are copied only for the first call of
        each signature and requires_grad pattern.
        """
        self.resolve()
        if not pending and self.phase == "backward" and not grad_enabled:
            return None
        slots = set()
        for slot, value in list(enumerate(args)) + list(kwargs.items()):
            if isinstance(value, torch.Tensor):
                self.devices.setdefault(str(value.device), None)
                if value.requires_grad:
                    slots.add(slot)
                    if value.grad_fn is None:
                        self.leaves.setdefault(id(value), value)
        slots = frozenset(slots if grad_enabled else ())
        signature = signature_of(args, kwargs)
        module = next((name for name in reversed(self.modules) if name is not None), None)
        call = CapturedCall(op, key, None, None, slots, call_site(), module or None, self.phase, signature=signature)
        if pending or (key, signature, slots) not in self.copied:
            with torch.no_grad():
                call.args = tuple(_copy(value) for value in args)
                call.kwargs = {name: _copy(value) for name, value in kwargs.items()}
        if pending:
            self.pending.append(call)
        else:
            self.copied.add((key, signature, slots))
            self.calls.append(call)
        return call

    def resolve(self):
        """Decide pending Function calls: autograd has wrapped their outputs now."""
        for call in self.pending:
            executable = any(isinstance(o, torch.Tensor) and o.requires_grad for o in call.outputs)
            call.outputs = []
            if not executable:
                call.grad_slots = frozenset()
                if call.phase == "backward":  # a backward's own Function calls: part of that backward
                    continue
            identity = (call.key, call.signature, call.grad_slots)
            if identity in self.copied:
                call.args = call.kwargs = None  # a repeat: counted, its copies dropped
            self.copied.add(identity)
            self.calls.append(call)
        self.pending = []

    def drop(self, call):
        self.pending = [c for c in self.pending if c is not call]


def signature_of(args, kwargs):
    """What changes an op's behaviour between calls: each tensor's shape, dtype and device, other values."""
    return tuple((slot, _value_key(value)) for slot, value in list(enumerate(args)) + list(kwargs.items()))


def _value_key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value_key(v) for v in value))
    return ("value", short_value(value))


def short_value(value, limit=24):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value)):
        return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), value)
    return value


def _mark_inside(error, description):
    """Remember on the exception the innermost recorded op it was raised in."""
    if getattr(error, "_autograd_scan_inside", None) is None:
        try:
            error._autograd_scan_inside = description
        except Exception:  # an exception type without a __dict__
            pass


# ---------------------------------------------------------------------------
# autograd.Function subclasses
# ---------------------------------------------------------------------------


def is_torch_internal(cls):
    module = getattr(cls, "__module__", "") or ""
    return module == "torch" or module.startswith(("torch.", "functorch"))


def function_classes():
    """Every live Function subclass defined outside torch."""
    found, stack, seen = [], list(Function.__subclasses__()), set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        if not is_torch_internal(cls):
            found.append(cls)
    return found


_MISSING = object()


class _FunctionPatches:
    """Each Function subclass's ``forward`` replaced by a recording one, and put back afterwards."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.saved = []  # (cls, the class's own forward attribute or _MISSING)
        self.meta_init = None

    def apply(self):
        classes = function_classes()
        resolved = [(cls, getattr(cls, "forward", None)) for cls in classes]  # before any class is patched
        for cls, forward in resolved:
            self._patch(cls, forward)
        self.meta_init = FunctionMeta.__init__
        original_init, patches = self.meta_init, self

        def init(cls, name, bases, attrs):  # a Function class created while the model runs
            original_init(cls, name, bases, attrs)
            if not is_torch_internal(cls):
                patches._patch(cls, getattr(cls, "forward", None))

        FunctionMeta.__init__ = init

    def _patch(self, cls, forward):
        if forward is None or forward is getattr(Function, "forward", None) or not callable(forward):
            return
        self.saved.append((cls, cls.__dict__.get("forward", _MISSING)))
        cls.forward = staticmethod(_recording_forward(cls, forward, self.recorder))

    def restore(self):
        if self.meta_init is not None:
            FunctionMeta.__init__ = self.meta_init
        for cls, original in reversed(self.saved):
            if original is _MISSING:
                try:
                    delattr(cls, "forward")
                except AttributeError:
                    pass
            else:
                setattr(cls, "forward", original)
        self.saved = []


def _recording_forward(cls, forward, recorder):
    from torch.autograd.function import _is_setup_context_defined

    takes_ctx = not _is_setup_context_defined(getattr(cls, "setup_context", None))

    @functools.wraps(forward)
    def recording(*args, **kwargs):
        if not recorder.wants():
            return forward(*args, **kwargs)
        inputs = args[1:] if takes_ctx else args
        call = recorder.record(cls, function_key(cls), inputs, kwargs, grad_enabled=True, pending=True)
        recorder.depth += 1
        try:
            result = forward(*args, **kwargs)
        except BaseException as error:
            _mark_inside(error, f"{_describe(cls)} called at {call.site}")
            recorder.drop(call)
            raise
        finally:
            recorder.depth -= 1
        call.outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        return result

    return recording


def function_key(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(op):
    from pytest_autograd.results.naming import display_name

    return f"`{display_name(op)}`"


# ---------------------------------------------------------------------------
# torch.ops operators
# ---------------------------------------------------------------------------


def operator_key(func):
    """``ns::name`` (``ns::name.overload`` for a non-default overload) of a custom torch.ops operator; else None."""
    qualified = getattr(func, "_qualified_op_name", None)  # OpOverloadPacket
    if not isinstance(qualified, str):
        schema = getattr(func, "_schema", None)
        overload = getattr(func, "_overloadname", None)
        if schema is None or not isinstance(overload, str) or type(func).__name__ != "OpOverload":
            return None
        qualified = schema.name + (f".{overload}" if overload not in ("", "default") else "")
    namespace = qualified.split("::", 1)[0]
    return None if namespace in TORCH_NAMESPACES else qualified


def _backward_seeing_custom_ops(apply, recorder):
    """``BackwardCFunction.apply`` (how autograd runs a Python Function's backward) with the capture's mode on.

    The autograd engine runs backward without the caller's torch function
    modes, so the custom ops a reentrant checkpoint recomputes in its backward
    would go unseen; they are recorded there like in the forward.
    """

    @functools.wraps(apply)
    def backward_apply(self, *args):
        if any(isinstance(mode, _CustomOpMode) for mode in _function_modes()):
            return apply(self, *args)
        with _CustomOpMode(recorder):
            return apply(self, *args)

    return backward_apply


def _function_modes():
    from torch.overrides import _get_current_function_mode_stack

    return _get_current_function_mode_stack()


class _CustomOpMode(TorchFunctionMode):
    """Sees every torch call; records the custom operators among them."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = operator_key(func) if self.recorder.wants() else None
        if key is None:
            return func(*args, **kwargs)
        call = self.recorder.record(func, key, args, kwargs, grad_enabled=torch.is_grad_enabled(), pending=False)
        if call is None:
            return func(*args, **kwargs)
        self.recorder.depth += 1
        try:
            return func(*args, **kwargs)
        except BaseException as error:
            _mark_inside(error, f"{_describe(func)} called at {call.site}")
            raise
        finally:
            self.recorder.depth -= 1
