"""The positional ``@autograd_op(SomeFunction)`` form, which pytest turns into decorating the class so that the
test silently vanishes: found on every collected name and in a module that failed to import, so it imports
nothing of the engine."""

import inspect
import re

POSITIONAL_OP = re.compile(r"^[ \t]*@[\w.]*autograd_op\(\s*([A-Za-z_][\w.]*)\s*[,)]", re.MULTILINE)


def positional_op_message(where, op_name, test_name="the test function"):
    return (
        f"{where}: @pytest.mark.autograd_op({op_name}) passes the op positionally. pytest then treats the "
        f"marker as a decorator applied to {op_name} and calls {op_name}({test_name}) in place of the test, so "
        f"the test silently vanishes (or the op runs at import). Write @pytest.mark.autograd_op(op={op_name})."
    )


def swallowed_test(obj):
    """True when ``obj``, found under a test's name, is what ``@autograd_op(Op)`` left in its place.

    pytest calls ``Op(test_function)``: for a Function subclass that is an
    instance of it, carrying the mark pytest stored on the class.
    """
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj):
        return False
    for klass in type(obj).__mro__:
        if klass.__name__ == "Function" and klass.__module__ == "torch.autograd.function":
            return True
    try:
        marks = getattr(type(obj), "pytestmark", None)
    except Exception:
        return False
    return isinstance(marks, list) and any(getattr(mark, "name", None) == "autograd_op" for mark in marks)


def positional_ops_in_source(path):
    """(line, op name) of each ``@...autograd_op(Op)`` decorator in the file at ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return []
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in POSITIONAL_OP.finditer(text)]
