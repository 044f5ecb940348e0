"""What crosses to another process, and how it finds its way there.

* Tensors cross by value, in their exact layout: the span of storage they
  use, their sizes, strides and storage offset, dtype, device and whether
  they require grad (a leaf again on the other side). A row-strided view
  stays row-strided, so a trial run meets the layout the check will use.
  CUDA tensors cross through the CPU and are put back on their device by the
  child, never shared with it: a child that faults its GPU shares nothing
  with the session.
* ``torch.ops`` operators cross by name (they do not pickle).
* Classes and functions cross by reference, as pickle does; the child looks
  a module up on the parent's ``sys.path``, and failing that in the file the
  parent imported it from (a test module under pytest's ``importlib`` mode,
  a conftest). A module the child holds from another file of the same name
  (pytester writes ``test_ops.py`` anew for each test) is imported again.
"""

import ctypes
import importlib.util
import io
import os
import pickle
import sys
import sysconfig

_SYSTEM_PREFIXES = tuple({os.path.realpath(path) for path in (
    sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"])})
_SYSTEM = {}  # module name -> (id of the module, whether it lives with Python or its installed packages)


class RaisedElsewhere(Exception):
    """An exception raised in another process, by its type's name, message and traceback text."""

    def __init__(self, type_name, message, traceback_text=""):
        super().__init__(type_name, message, traceback_text)
        self.type_name, self.message, self.traceback_text = type_name, message, traceback_text

    def __str__(self):
        return f"{self.type_name}: {self.message}"


class Unresolvable(Exception):
    """The child could not rebuild an object the parent sent (its module cannot be imported there)."""


def parent_state():
    """What the child needs to import what the parent imported: its ``sys.path``, and the file (and its
    modification time) of each module that is not Python's own or an installed package's."""
    if _STATE and _STATE[0] == len(sys.modules) and _STATE[1] == list(sys.path):
        return _STATE[2]
    modules = {}
    for name, module in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__") or _is_system(name, module):  # a script is never run again there
            continue
        path = getattr(module, "__file__", None)
        try:
            modules[name] = (path, os.stat(path).st_mtime_ns)
        except (OSError, TypeError):
            continue
    state = (list(sys.path), modules)
    _STATE[:] = [len(sys.modules), list(sys.path), state]
    return state


_STATE = []  # [number of modules, sys.path, the state made then]: made again when either changes


def is_system_file(path):
    """Whether ``path`` belongs to Python or an installed package (not to the project under test)."""
    return not path or os.path.realpath(path).startswith(_SYSTEM_PREFIXES)


def _is_system(name, module):
    known = _SYSTEM.get(name)
    if known is not None and known[0] == id(module):
        return known[1]
    path = getattr(module, "__file__", None)
    system = is_system_file(path)
    _SYSTEM[name] = (id(module), system)
    return system


def apply_parent_state(state):
    """In the child: the parent's ``sys.path`` first; modules it holds from another file than the parent's
    forgotten, so that they are imported again from the right one."""
    paths, modules = state
    sys.path[:] = list(paths) + [path for path in sys.path if path not in paths]
    _FILES.clear()
    _FILES.update(modules)
    for name, (path, mtime) in modules.items():
        held = sys.modules.get(name)
        if held is None:
            continue
        mine = getattr(held, "__file__", None)
        if mine != path or _LOADED.get(name, mtime) != mtime:
            del sys.modules[name]
        _LOADED[name] = mtime


_FILES = {}  # in the child: module name -> (file, mtime) as the parent holds it
_LOADED = {}  # in the child: module name -> the mtime of the file it was imported from


def task_message(function, args, known_state=None):
    """(the bytes a task crosses as, the import state they carry): the parent's import state first (the child
    applies it before it unpickles the task, whose classes it may have to import), unless it is
    ``known_state``, the one the child has; then the task."""
    state = parent_state()
    sent = None if state == known_state else pickle.dumps(state)
    return pickle.dumps((sent, dumps((function, args)))), state


def dumps(value):
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def loads(data):
    return _Unpickler(io.BytesIO(data)).load()


class _Pickler(pickle.Pickler):
    def reducer_override(self, value):
        import torch

        if type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided:
            return _tensor_reduction(value)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return _on_device, (value.detach().cpu(), str(value.device), value.requires_grad)
        name = _operator_name(value)
        if name is not None:
            return _operator, name + (_registering_module(name[0]),)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError) as error:
            if module not in _FILES:
                raise Unresolvable(f"cannot import {module}.{name} in the sandbox: {error}") from error
        loaded = sys.modules.get(module) if getattr(sys.modules.get(module), "__file__", None) == _FILES[module][0] \
            else None
        loaded = loaded or _import_from_file(module)
        try:
            return _attribute(loaded, name)
        except AttributeError as error:
            raise Unresolvable(f"{module} has no {name} in the sandbox") from error


def _import_from_file(module):
    """``module`` imported from the file the parent imported it from."""
    path, mtime = _FILES[module]
    spec = importlib.util.spec_from_file_location(module, path)
    if spec is None or spec.loader is None:
        raise Unresolvable(f"cannot import {module} from {path} in the sandbox")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException as error:
        del sys.modules[module]
        raise Unresolvable(f"importing {path} in the sandbox raised {type(error).__name__}: {error}") from error
    _LOADED[module] = mtime
    return loaded


def _attribute(module, dotted):
    value = module
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _tensor_reduction(tensor):
    """(rebuild, arguments) for a strided tensor: the storage span its elements use, copied to the CPU."""
    import torch

    size, stride, offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
    span = 0 if tensor.numel() == 0 else sum((n - 1) * s for n, s in zip(size, stride)) + 1
    span_start = 0 if offset <= max(64, span) else offset  # a small offset crosses too: a kernel may ignore it
    flat = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    flat.set_(tensor.detach().untyped_storage(), span_start, (offset + span - span_start,), (1,))
    flat = flat.cpu().contiguous()
    data = ctypes.string_at(flat.data_ptr(), flat.nbytes) if flat.nbytes else b""
    return _tensor, (data, offset - span_start, size, stride, tensor.dtype, str(tensor.device), tensor.requires_grad)


def _tensor(data, offset, size, stride, dtype, device, requires_grad):
    import torch

    storage = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    storage = storage.to(device).untyped_storage()
    tensor = torch.empty(0, dtype=dtype, device=device)
    tensor.set_(storage, offset, size, stride)
    if requires_grad and (tensor.is_floating_point() or tensor.is_complex()):
        tensor.requires_grad_(True)
    return tensor


def _on_device(tensor, device, requires_grad):
    tensor = tensor.to(device)
    if requires_grad and (tensor.is_floating_point() or tensor.is_complex()):
        tensor.requires_grad_(True)
    return tensor


def _operator_name(value):
    """(qualified name, overload or None) of a ``torch.ops`` operator; None for anything else."""
    kind = type(value).__name__
    if kind == "OpOverloadPacket":
        return getattr(value, "_qualified_op_name", None), None
    if kind == "OpOverload":
        packet = getattr(value, "overloadpacket", None)
        return getattr(packet, "_qualified_op_name", None), getattr(value, "_overloadname", None)
    return None


def _operator(qualified, overload, module):
    import torch

    namespace, name = qualified.split("::", 1)
    if module and module not in sys.modules:
        _import(module)
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _registering_module(qualified):
    """The module that defined a ``torch.library.custom_op`` (the child imports it to register the op); None for
    other operators (torch's own, an extension's: the test module that loads it is imported on the way)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    return getattr(getattr(OPDEFS.get(qualified), "_init_fn", None), "__module__", None)


def import_module(module):
    """Import ``module`` by name, or from the file the parent imported it from."""
    _import(module)


def _import(module):
    try:
        importlib.import_module(module)
    except ImportError:
        if module not in _FILES:
            raise
        _import_from_file(module)


class FromTestMarker:
    """An object found, in the child, as the keyword of a test's marker: the op of a test marked
    ``autograd_op(op=lambda x: ...)`` cannot be pickled, but the child can import the test module and read it
    there. ``module``: the test module's name in the parent (its file crosses with the parent's import
    state); ``test``: the test function's qualified name; ``marker_index``: which of its markers of that name,
    innermost first, as pytest lists them."""

    def __init__(self, module, test, marker, marker_index, keyword="op"):
        self.module, self.test, self.marker, self.marker_index, self.keyword = \
            module, test, marker, marker_index, keyword

    def with_keyword(self, keyword):
        """The same marker's ``keyword=`` (the reference, an option) instead."""
        return FromTestMarker(self.module, self.test, self.marker, self.marker_index, keyword)

    def resolve(self):
        _import(self.module)
        module = sys.modules[self.module]
        owners = [module]
        for part in self.test.split("."):
            owners.append(getattr(owners[-1], part))
        marks = [mark for owner in reversed(owners) for mark in _marks_of(owner) if mark.name == self.marker]
        try:
            return marks[self.marker_index].kwargs[self.keyword]
        except (IndexError, KeyError) as error:
            raise Unresolvable(f"{self.module}.{self.test} has no {self.marker}({self.keyword}=...) in the "
                               "sandbox (a marker added at collection?)") from error


def _marks_of(owner):
    marks = getattr(owner, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]
