"""A stand-alone script that reproduces a failure: torch and the user's op, no pytest, no plugin.

Whoever fixes the kernel may not have the test suite, its fixtures or this
plugin. ``write_repro`` writes ``DIR/<item>.py`` and the sample tensors it
needs beside it (``DIR/<item>.pt``, ``torch.save``). The script imports the
op by its qualified name (a lambda or a local class cannot be imported: the
script says what to paste), recomputes the two numbers the report compared
at the element it names (the analytical derivative and a float64 central
difference; or the op's value and the reference's, with the finite
difference beside them), prints them and exits with status 1 while they
disagree. What it recomputes comes from the failure's locus
(``checks/_loci.py``).
"""

import functools
import importlib
import inspect
import io
import sys
from pathlib import Path

import torch

from pytest_autograd.engine.modules import ModuleFunction

_TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")


def write_repro(directory, stem, case, sample, locus, report, device, title):
    """Write the script and its tensors for ``report``'s failure, recomputed on ``sample`` where ``locus`` says
    (see checks/_loci.py); return (the script's path, None), or (None, a sentence saying why there is none)."""
    if locus is None:
        if any(isinstance(v, torch.Tensor) and v.is_complex() for v in sample.values()):
            return None, "complex arguments: the check differentiates their real views, which a script does not replay"
        return None, "no script for this kind of failure (it holds no single element to recompute)"
    if locus["kind"] == "compare" and locus.get("expected_fn") is None:
        return None, "no script for this comparison"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    script, data = directory / f"{stem}.py", directory / f"{stem}.pt"
    saved, unsaved = _saveable(sample)
    payload = {"args": saved.args, "kwargs": saved.kwargs, **_tensors_of(locus)}
    modules = {}  # nn.Modules, pickled whole in a file of their own: the sample's file stays weights-only
    imports, op_lines = _callable_lines("op", case.op, modules)
    if _uses_reference(locus):
        more, reference_lines = _callable_lines("reference", case.reference, modules)
        imports += [line for line in more if line not in imports]
        op_lines += reference_lines
    torch.save(payload, data)
    if modules:
        torch.save(modules, directory / f"{stem}.modules.pt")
    text = _HEADER.format(title=title, summary=report.summary, check=report.check, shapes=_shapes(case, sample),
                          script=script)
    text += "\n".join(["import sys", "from pathlib import Path", "", "import torch", ""] + imports)
    if any(isinstance(fn, ModuleFunction) for fn in (case.op, case.reference)):
        text += _MODULE
    text += "\n\n" + "\n".join(op_lines)
    text += "\n\n" + "\n".join(f"# {line}" for line in unsaved) + ("\n" if unsaved else "")
    text += _SETTINGS.format(device=device, locus=_plain(locus))
    text += _COMMON + _BODIES[locus["kind"]]
    script.write_text(text)
    return script, None


def _uses_reference(locus):
    if locus["kind"] == "compare":
        return locus["expected_fn"][0] == "reference"
    return locus["kind"] == "precision" and locus["truth"] == "reference"


# -- what the script calls -----------------------------------------------------------------------------------


def _callable_lines(name, fn, modules):
    """(import lines, definition lines) binding ``name`` to ``fn`` in the script; modules go into ``modules``."""
    if isinstance(fn, ModuleFunction):
        modules[name] = fn.module
        cls = type(fn.module)
        imports = _path_line(cls.__module__)
        return imports, [
            f"# {name}: an nn.Module ({cls.__qualname__}), pickled whole beside this script (.modules.pt); loading it",
            f"# imports its class {cls.__module__}.{cls.__qualname__}, whose module must be importable.",
            f"_{name}_module = torch.load(Path(__file__).with_suffix('.modules.pt'), weights_only=False)[{name!r}]",
            f"{name} = module_as_function(_{name}_module)",
        ]
    found = importable(fn)
    if found is None:
        return [], _paste_note(name, fn)
    module, qualname, expression = found
    imports = _path_line(module) + ([f"import {module}"] if module else [])
    return imports, [f"{name} = {expression}"]


def importable(fn):
    """(module, qualified name, expression binding it) when a fresh interpreter can import ``fn``; else None."""
    if _is_op_overload(fn):
        return "", "", _ops_expression(fn)
    cls_apply = inspect.isclass(fn) and issubclass(fn, torch.autograd.Function)
    name = getattr(fn, "__name__", None)
    candidates = [(getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))]
    candidates += [(namespace, name) for namespace in _TORCH_NAMESPACES]
    for module, qualname in candidates:
        if not module or not qualname or "<" in qualname or module == "__main__":
            continue
        if _resolve(module, qualname) is fn:
            expression = f"{module}.{qualname}" + (".apply" if cls_apply else "")
            return module, qualname, expression
    return None


def _resolve(module, qualname):
    try:
        value = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
        return value
    except Exception:  # noqa: BLE001 - not importable that way
        return None


def _is_op_overload(fn):
    return type(fn).__name__ in ("OpOverload", "OpOverloadPacket")


def _ops_expression(fn):
    namespace, _, name = getattr(fn, "_qualified_op_name", None).partition("::") if type(fn).__name__ == \
        "OpOverloadPacket" else fn._schema.name.partition("::")
    overload = getattr(fn, "_overloadname", None)
    return f"torch.ops.{namespace}.{name}" + (f".{overload}" if overload and type(fn).__name__ == "OpOverload" else "")


def _path_line(module):
    """``sys.path.insert`` of the directory the module is imported from, when it is not torch's."""
    if not module or module.split(".")[0] in ("torch", "builtins"):
        return []
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if not path:
        return []
    root = Path(path).resolve().parent
    depth = module.count(".") + (1 if Path(path).name == "__init__.py" else 0)
    for _ in range(depth):
        root = root.parent
    return [f"sys.path.insert(0, {str(root)!r})  # where `{module}` is imported from"]


def _paste_note(name, fn):
    what = _kind_of(fn)
    where = _defined_at(fn)
    source = _source_lines(fn)
    binding = (f"then bind `{name} = {fn.__name__}.apply`" if inspect.isclass(fn) and issubclass(fn, torch.autograd.Function)
               else f"binding it to the name `{name}`")
    lines = [f"# `{name}` is {what}{where}, which a script cannot import: paste its definition here,",
             f"# {binding} (and the imports it needs)."]
    if source:
        lines.append("# Its source:")
        lines += [f"#     {line}" for line in source]
    lines += [f"{name} = None", f"if {name} is None:",
              f"    print('paste the definition of `{name}` into ' + __file__ + ' (see the note above)', file=sys.stderr)",
              "    sys.exit(2)  # not 1: that status means the bug is still there"]
    return lines


def _kind_of(fn):
    if isinstance(fn, functools.partial):
        return f"a functools.partial of {getattr(fn.func, '__qualname__', fn.func)!r}"
    qualname = getattr(fn, "__qualname__", "") or ""
    if "<lambda>" in qualname:
        return "a lambda"
    if "<locals>" in qualname:
        return f"`{qualname}`, defined inside a function"
    if getattr(fn, "__module__", None) == "__main__":
        return f"`{qualname}`, defined in the script that ran the checks"
    return f"{type(fn).__name__} {fn!r:.60}"


def _defined_at(fn):
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    if code is None and inspect.isclass(fn):
        try:
            return f" (defined at {inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
        except (OSError, TypeError):
            return ""
    return f" (defined at {code.co_filename}:{code.co_firstlineno})" if code is not None else ""


def _source_lines(fn, most=30):
    try:
        lines = inspect.getsource(getattr(fn, "func", fn)).rstrip().splitlines()
    except (OSError, TypeError):
        return []
    return lines[:most] + (["..."] if len(lines) > most else [])


# -- the tensors ---------------------------------------------------------------------------------------------


def _saveable(sample):
    """The sample with every argument ``torch.load(weights_only=True)`` can read back, and notes on the others."""
    notes = []

    def keep(slot, value):
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().clone()
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
            return value
        except Exception:  # noqa: BLE001 - not plain data
            place = f"SAMPLE['args'][{slot}]" if isinstance(slot, int) else f"SAMPLE['kwargs'][{slot!r}]"
            notes.append(f"argument {slot!r} ({type(value).__name__}) could not be saved: set {place} = ... "
                         "below `SAMPLE = ...`")
            return None

    args = [keep(i, value) for i, value in enumerate(sample.args)]
    kwargs = {key: keep(key, value) for key, value in sample.kwargs.items()}
    return sample.replace(args=args, kwargs=kwargs), notes


def _tensors_of(locus):
    keys = ("cotangents", "direction", "first_cotangents")  # saved in the .pt file, not written into the script
    return {key: [None if t is None else t.detach().cpu().clone() for t in locus[key]]
            for key in keys if locus.get(key) is not None}


def _plain(locus):
    """The locus without its tensors (they are in the .pt file), as a Python literal."""
    keep = {key: value for key, value in locus.items() if key not in ("cotangents", "direction", "first_cotangents")}
    lines = ["{"] + [f"    {key!r}: {_literal(value)}," for key, value in keep.items()] + ["}"]
    return "\n".join(lines)


def _literal(value):
    """``repr``, except that NaN and infinities become expressions Python can read back."""
    if isinstance(value, float) and value != value:
        return "float('nan')"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return f"float({str(value)!r})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(item) for item in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _shapes(case, sample):
    parts = []
    for slot, value in list(enumerate(sample.args)) + list(sample.kwargs.items()):
        if isinstance(value, torch.Tensor):
            parts.append(f"{case.arg_name(slot)} {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
    return ", ".join(parts)


# -- the script's text ---------------------------------------------------------------------------------------

_HEADER = '''"""Reproduces a {check} failure without pytest or pytest-autograd: only torch and the op.

{summary}
item: {title}
sample: {shapes}  (the tensors are in the .pt file beside this script)

Run: python {script}
It prints the two numbers the report compared at the element it names and exits with status 1 while they
disagree (status 0 once the bug is fixed).
"""
'''

_SETTINGS = '''
SAMPLE = torch.load(Path(__file__).with_suffix(".pt"))
DEVICE = {device!r}
LOCUS = {locus}
torch.backends.cuda.matmul.allow_tf32 = False  # full float32, as the check ran: no TF32 matmuls or convolutions
torch.backends.cudnn.allow_tf32 = False
'''

_MODULE = '''

def module_as_function(module):
    """An nn.Module called with its parameters as keyword arguments, as the check called it."""
    names = [name for name, _ in module.named_parameters()]

    def call(*args, **kwargs):
        parameters = {name: kwargs.pop(name) for name in names if name in kwargs}
        floating = next((t.dtype for t in parameters.values() if t.is_floating_point()), None)
        device = next(iter(parameters.values())).device if parameters else None
        buffers = {name: b.detach().to(device=device, dtype=floating if b.is_floating_point() and floating else None,
                                       copy=True) for name, b in module.named_buffers() if b is not None}
        return torch.func.functional_call(module, {**parameters, **buffers}, args, kwargs)

    return call
'''

_COMMON = '''

def outputs_of(result):
    """The tensor outputs in order (sparse ones as dense, complex ones as pairs of reals)."""
    if isinstance(result, torch.Tensor):
        if result.layout != torch.strided:
            result = result.to_dense()
        return [torch.view_as_real(result) if result.is_complex() else result]
    if isinstance(result, dict):
        result = list(result.values())
    found = []
    for item in result if isinstance(result, (tuple, list)) else ():
        found += outputs_of(item)
    return found


def arguments(dtype, device):
    """The sample's arguments, floating tensors in ``dtype``, every tensor on ``device``."""
    def convert(value):
        if not isinstance(value, torch.Tensor):
            return value
        return value.to(device=device, dtype=dtype if value.is_floating_point() else None, copy=True)

    return [convert(a) for a in SAMPLE["args"]], {key: convert(v) for key, v in SAMPLE["kwargs"].items()}


def call(fn, leaves, dtype, device):
    """``fn`` on the sample, the differentiated arguments (LOCUS["slots"]) replaced by clones of ``leaves``."""
    args, kwargs = arguments(dtype, device)
    for slot, leaf in zip(LOCUS["slots"], leaves):
        if isinstance(slot, int):
            args[slot] = leaf.clone()
        else:
            kwargs[slot] = leaf.clone()
    return outputs_of(fn(*args, **kwargs))


def fresh_leaves(dtype, device):
    args, kwargs = arguments(dtype, device)
    return [(args[slot] if isinstance(slot, int) else kwargs[slot]).detach().requires_grad_(True)
            for slot in LOCUS["slots"]]


def gradients(outputs, leaves, cotangents, create_graph=False):
    """vjp of the outputs along ``cotangents`` (None: not that output), zeros for unused leaves."""
    pairs = [(o, c.to(o.device, o.dtype)) for o, c in zip(outputs, cotangents) if c is not None and o.requires_grad]
    if not pairs:
        return [torch.zeros_like(leaf) for leaf in leaves]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True,
                                retain_graph=True, create_graph=create_graph)
    return [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]


def dot(parts, others):
    return sum(float((a.to(torch.float64) * b.to(torch.float64)).sum()) for a, b in zip(parts, others)
               if a is not None and b is not None)


def unit(shapes_of, leaf, element, dtype, device):
    """A direction moving one element of one leaf."""
    direction = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes_of]
    direction[leaf][tuple(element)] = 1.0
    return direction


def report(label, expected, got, expected_name, got_name, tolerance, extra=()):
    error = abs(got - expected) if got == got and expected == expected else float("inf")
    print(f"{LOCUS.get('element_label') or label}")
    print(f"  {expected_name}: {expected:.6g}")
    print(f"  {got_name}: {got:.6g}")
    for line in extra:
        print(f"  {line}")
    if not error <= tolerance:
        print(f"  abs error {error:.6g} > tolerance {tolerance:.6g}: the bug is still there")
        sys.exit(1)
    print(f"  abs error {error:.6g} <= tolerance {tolerance:.6g}: they agree")
'''

_DERIVATIVE = '''

DTYPE = torch.float64
ORDER, EPS = LOCUS["order"], LOCUS["eps"]


def function(leaves):
    """What was differentiated: the op's floating outputs (ORDER 1), or its backward (ORDER 2), as a function
    of the differentiated arguments (and, for ORDER 2, the first backward's grad_outputs)."""
    if ORDER == 1:
        return [o for o in call(op, leaves, DTYPE, DEVICE) if o.is_floating_point()]
    count = len(LOCUS["slots"])
    inputs, grad_outputs = leaves[:count], leaves[count:]
    outputs = call(op, inputs, DTYPE, DEVICE)
    grads = gradients([outputs[k] for k in LOCUS["differentiable"]], inputs, grad_outputs, create_graph=True)
    return grads


def main():
    torch.manual_seed(0)
    base = [leaf.detach() for leaf in fresh_leaves(DTYPE, DEVICE)]
    if ORDER == 2:
        base += [c.to(DEVICE).detach() for c in SAMPLE["first_cotangents"]]
    leaves = [b.clone().requires_grad_(True) for b in base]
    outputs = function(leaves)
    if LOCUS.get("output") is not None:  # one element of one output: a Jacobian entry
        cotangents = [torch.zeros_like(o) for o in outputs]
        cotangents[LOCUS["output"]][tuple(LOCUS["row"])] = 1.0
    else:  # the check's random cotangent over every output
        cotangents = [None if c is None else c.to(DEVICE) for c in SAMPLE["cotangents"]]
    if LOCUS.get("element") is not None:
        direction = unit([b.shape for b in base], LOCUS["leaf"], LOCUS["element"], DTYPE, DEVICE)
    else:
        direction = [d.to(DEVICE) for d in SAMPLE["direction"]]
    analytical = dot(gradients(outputs, leaves, cotangents), direction)

    def moved(sign, along):
        with torch.set_grad_enabled(ORDER == 2):
            points = [b + sign * EPS * d for b, d in zip(base, direction)]
            if ORDER == 2:
                points = [p.detach().requires_grad_(True) for p in points]
            return [o.detach() for o in function(points)]

    plus, minus = moved(1.0, direction), moved(-1.0, direction)

    def numerical(along):
        return dot(along, [p - m for p, m in zip(plus, minus)]) / (2 * EPS)

    tolerance = lambda value: LOCUS["atol"] + LOCUS["rtol"] * abs(value)  # noqa: E731
    what = "second derivative" if ORDER == 2 else "derivative"
    if LOCUS.get("negated"):  # backward must be linear in grad_output: backward(-v) = -backward(v)
        negated = [None if c is None else -c for c in cotangents]
        got = dot(gradients(outputs, leaves, negated), direction)
        report("gradient for -grad_output", -analytical, got, "minus the analytical gradient for grad_output",
               "the analytical gradient for -grad_output", tolerance(analytical),
               [f"numerical {what} for -grad_output (float64 central difference, eps {EPS:g}): "
                f"{numerical(negated):.6g}"])
        return
    expected = numerical(cotangents)
    report("", expected, analytical, f"numerical {what} (float64 central difference, eps {EPS:g})",
           f"analytical {what} (autograd through the op's backward)", tolerance(expected))


if __name__ == "__main__":
    main()
'''

_COMPARE = '''

DTYPE = getattr(torch, LOCUS["dtype"])
EPS = 1e-6


def side(role, device):
    """Outputs and leaves of the op or the reference, in DTYPE on ``device``."""
    fn = reference if role == "reference" else op
    leaves = fresh_leaves(DTYPE, device)
    return call(fn, leaves, DTYPE, device), leaves


def value_at(role, device):
    """The compared value: an output element, or a gradient element along the check's cotangent."""
    outputs, leaves = side(role, device)
    if LOCUS["what"] == "output":
        return float(outputs[LOCUS["output"]].detach()[tuple(LOCUS["element"])])
    grads = gradients(outputs, leaves, [None if c is None else c.to(device) for c in SAMPLE["cotangents"]])
    return float(grads[LOCUS["argument"]].detach()[tuple(LOCUS["element"])])


def finite_difference(role):
    """The float64 central difference of <cotangent, outputs> at the gradient's element, on the CPU."""
    fn = reference if role == "reference" else op
    base = [leaf.detach() for leaf in fresh_leaves(torch.float64, "cpu")]
    direction = unit([b.shape for b in base], LOCUS["argument"], LOCUS["element"], torch.float64, "cpu")
    with torch.no_grad():
        plus = call(fn, [b + EPS * d for b, d in zip(base, direction)], torch.float64, "cpu")
        minus = call(fn, [b - EPS * d for b, d in zip(base, direction)], torch.float64, "cpu")
    cotangents = [None if c is None else c.to(torch.float64) for c in SAMPLE["cotangents"]]
    return dot(cotangents, [p - m for p, m in zip(plus, minus)]) / (2 * EPS)


def main():
    torch.manual_seed(0)
    (expected_role, got_role), (expected_device, got_device) = LOCUS["expected_fn"], LOCUS["devices"]
    expected = value_at(expected_role, expected_device)
    got = value_at(got_role, got_device)
    label = (f"{'output' if LOCUS['what'] == 'output' else 'grad ' + LOCUS['names'][LOCUS['argument']]}"
             f"{list(LOCUS['element'])} in {LOCUS['dtype']}")
    extra = []
    if LOCUS["what"] == "gradient":
        roles = dict.fromkeys([expected_role, got_role])
        extra = [f"float64 central difference of the {role} (eps {EPS:g}): {finite_difference(role):.6g}"
                 for role in roles]
    report(label, expected, got, LOCUS["expected_label"], LOCUS["got_label"],
           LOCUS["atol"] + LOCUS["rtol"] * abs(expected), extra)


if __name__ == "__main__":
    main()
'''

_PRECISION = '''

LOW = getattr(torch, LOCUS["dtype"])


def run(fn, dtype):
    """The compared tensor of ``fn`` on the rounded sample in ``dtype``: an output, or a gradient along the
    check's cotangent."""
    leaves = fresh_leaves(dtype, DEVICE)
    outputs = call(fn, leaves, dtype, DEVICE)
    if LOCUS["what"] == "output":
        return outputs[LOCUS["output"]].detach().to("cpu", torch.float64)
    cotangents = [None if c is None or not o.is_floating_point() else c.to(o.device, o.dtype)
                  for o, c in zip(outputs, SAMPLE["cotangents"])]
    return gradients(outputs, leaves, cotangents)[LOCUS["argument"]].detach().to("cpu", torch.float64)


def normwise(expected, got):
    """max |got - expected| / max |expected|, as the check measures it."""
    scale = float(expected[expected.isfinite()].abs().max()) if bool(expected.isfinite().any()) else 0.0
    worst = float((got - expected).abs().nan_to_num(float("inf")).max())
    return worst / scale if scale > 0 else worst


def main():
    torch.manual_seed(0)
    truth_fn = reference if LOCUS["truth"] == "reference" else op
    truth, got = run(truth_fn, torch.float64), run(op, LOW)
    error = normwise(truth, got)
    element = tuple(LOCUS["element"])
    print(f"{LOCUS['label']}{list(element)} in {LOCUS['dtype']}")
    print(f"  float64 ({LOCUS['truth']} on the same rounded inputs): {float(truth[element]):.6g}")
    print(f"  the op in {LOCUS['dtype']}: {float(got[element]):.6g}")
    if LOCUS["truth"] == "reference":
        reference_error = normwise(truth, run(reference, LOW))
        budget = LOCUS["k"] * reference_error + LOCUS["floor"]
        print(f"  the op's error {error:.6g}, the reference's {reference_error:.6g} in {LOCUS['dtype']} "
              f"(max abs error / max |float64 value|); budget {LOCUS['k']:g} x {reference_error:.6g} + "
              f"{LOCUS['floor']:.6g} = {budget:.6g}")
    else:
        budget = LOCUS["budget"]
        print(f"  the op's error {error:.6g} (max abs error / max |float64 value|), tolerance {budget:.6g}")
    if not error <= budget:
        print("  over budget: the bug is still there")
        sys.exit(1)
    print("  within budget")


if __name__ == "__main__":
    main()
'''

_BODIES = {"derivative": _DERIVATIVE, "compare": _COMPARE, "precision": _PRECISION}
