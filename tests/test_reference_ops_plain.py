"""Plain pytest checks of ``reference_ops`` (no plugin involved).

The correct ops must pass ``torch.autograd.gradcheck`` / ``gradgradcheck`` in
float64 and match their references; each planted bug must really differ from
its correct twin in the way its docstring says.
"""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import types
import weakref
from pathlib import Path

import pytest
import torch
from torch.autograd import Function, gradcheck, gradgradcheck

import reference_ops
from reference_ops import (
    DOUBLE_DIFFERENTIABLE,
    EXAMPLES,
    IN_PLACE,
    AddOneInPlace,
    Cube,
    LinearFunction,
    LinearFunctionSetupContext,
    MulConstant,
    MyReLU,
    RNNCell,
    ScaleOnceDifferentiable,
    SortWithIndices,
    SplitHalves,
)
from reference_ops import buggy
from reference_ops.buggy import PLANTED_BUGS

REPO_ROOT = Path(__file__).resolve().parents[1]


def _seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def _as_inputs(args, dtype=torch.float64, requires_grad=True):
    return tuple(
        a.detach().to(dtype).requires_grad_(requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    )


def _callable(name, fn):
    """``fn.apply``, cloning the first argument for in-place ops so leaves are never mutated."""
    if name in IN_PLACE:
        return lambda x, *rest: fn.apply(x.clone(), *rest)
    return fn.apply


def _cases():
    for name, (fn, _ref, samples) in EXAMPLES.items():
        for i, _ in enumerate(samples(_seeded())):
            yield pytest.param(name, i, id=f"{name}-{i}")


CASES = list(_cases())


def _sample(name, index, dtype=torch.float64, requires_grad=True):
    _fn, _ref, samples = EXAMPLES[name]
    return _as_inputs(samples(_seeded())[index], dtype, requires_grad)


def _grads(fn, args, grad_output=None):
    """Gradients of ``fn.apply(*args)`` w.r.t. its tensor args that require grad."""
    out = fn.apply(*args)
    if grad_output is None:
        grad_output = torch.ones_like(out)
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return torch.autograd.grad(out, inputs, grad_output, allow_unused=True)


# ---------------------------------------------------------------------------
# Correct ops
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,index", CASES)
def test_gradcheck_float64(name, index):
    fn = EXAMPLES[name].function
    assert gradcheck(_callable(name, fn), _sample(name, index))


@pytest.mark.parametrize("name,index", [c for c in CASES if c.values[0] in DOUBLE_DIFFERENTIABLE])
def test_gradgradcheck_float64(name, index):
    fn = EXAMPLES[name].function
    assert gradgradcheck(_callable(name, fn), _sample(name, index))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,index", CASES)
def test_matches_reference(name, index, dtype):
    fn, ref, _ = EXAMPLES[name]
    args = _sample(name, index, dtype=dtype, requires_grad=False)
    ref_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    got = _callable(name, fn)(*args)
    want = ref(*ref_args)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    else:
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_sample_factories(name):
    fn, _ref, samples = EXAMPLES[name]
    assert isinstance(fn, type) and issubclass(fn, Function) and fn.__doc__
    a, b = samples(_seeded(3)), samples(_seeded(3))
    assert isinstance(a, list) and a
    for sa, sb in zip(a, b):
        assert isinstance(sa, tuple)
        for x, y in zip(sa, sb):
            if isinstance(x, torch.Tensor):
                assert x.dtype == torch.float32 and not x.requires_grad
                assert torch.equal(x, y)
            else:
                assert x == y
    for sample in samples(_seeded(), dtype=torch.float64):
        assert all(x.dtype == torch.float64 for x in sample if isinstance(x, torch.Tensor))
    samples()  # global RNG works too


def test_linear_samples_include_no_bias_case():
    assert any(len(s) == 3 and s[2] is None for s in EXAMPLES["linear"].samples())


@pytest.mark.parametrize("fn", [LinearFunction, LinearFunctionSetupContext])
def test_linear_needs_input_grad_and_optional_bias(fn):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64)
    # Only the input requires grad: the weight gradient is not requested.
    (gx,) = torch.autograd.grad(fn.apply(x, w).sum(), x)
    torch.testing.assert_close(gx, torch.ones(3, 5, dtype=torch.float64) @ w)
    # Two-argument call, bias left out entirely.
    w.requires_grad_()
    assert gradcheck(fn.apply, (x, w))


def test_linear_setup_context_vmap():
    x = torch.randn(6, 3, 4)
    w, b = torch.randn(5, 4), torch.randn(5)
    out = torch.func.vmap(LinearFunctionSetupContext.apply, in_dims=(0, None, None))(x, w, b)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b))


class _DropGrad(Function):
    """Identity whose backward returns ``None``: downstream sees an undefined gradient."""

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return None


def test_mul_constant_handles_undefined_grad():
    x = torch.randn(3, requires_grad=True)
    _DropGrad.apply(MulConstant.apply(x, 2.0)).sum().backward()
    assert x.grad is None


def test_split_halves_one_output_used():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    head, tail = SplitHalves.apply(x, 2)
    (gx,) = torch.autograd.grad(tail.sum(), x)
    torch.testing.assert_close(gx, torch.tensor([0.0, 0, 3, 3, 3], dtype=torch.float64).expand(3, 5))
    head, tail = SplitHalves.apply(x, 2)
    (gx,) = torch.autograd.grad(head.sum(), x)
    torch.testing.assert_close(gx, torch.tensor([2.0, 2, 0, 0, 0], dtype=torch.float64).expand(3, 5))


def test_sort_indices_non_differentiable():
    (x,) = _sample("sort_with_indices", 0)
    values, indices = SortWithIndices.apply(x)
    assert values.requires_grad and not indices.requires_grad
    assert indices.dtype == torch.int64
    assert torch.equal(indices, torch.sort(x.detach(), dim=-1).indices)


def test_add_one_in_place_on_non_leaf():
    a = torch.randn(3, 4, requires_grad=True)
    x = a.clone()
    version = x._version
    y = AddOneInPlace.apply(x)
    assert y is x
    assert x._version > version
    torch.testing.assert_close(x, a.detach() + 1)
    weights = torch.randn(3, 4)
    (y * weights).sum().backward()
    torch.testing.assert_close(a.grad, weights)


def test_add_one_in_place_refuses_leaf():
    leaf = torch.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        AddOneInPlace.apply(leaf)


def test_once_differentiable_refuses_double_backward():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(ScaleOnceDifferentiable.apply(x).sum(), x, create_graph=True)
    torch.testing.assert_close(gx, torch.full_like(x, 2.0))
    with pytest.raises(RuntimeError):
        gx.sum().backward()


# ---------------------------------------------------------------------------
# Package surface
# ---------------------------------------------------------------------------


def test_import_does_not_touch_extension():
    code = (
        "import sys, reference_ops\n"
        "assert 'reference_ops.extension' not in sys.modules\n"
        "assert 'reference_ops.buggy' not in sys.modules\n"
        "assert 'load_extension' in dir(reference_ops)\n"
        "from reference_ops import *\n"
        "assert 'reference_ops.extension' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)


def test_extension_names_resolve_lazily(monkeypatch):
    stub = types.ModuleType("reference_ops.extension")
    names = ["load_extension", "ExtLinearFunction", "ExtLinear", "extension_available", "cuda_extension_available"]
    for n in names:
        setattr(stub, n, object())
    monkeypatch.setitem(sys.modules, "reference_ops.extension", stub)
    for n in names:
        assert getattr(reference_ops, n) is getattr(stub, n)
    with pytest.raises(AttributeError):
        reference_ops.no_such_name  # noqa: B018


def test_exports():
    from reference_ops import functions

    for n in functions.__all__:
        assert getattr(reference_ops, n) is getattr(functions, n)
    assert reference_ops.buggy is buggy
    for n in buggy.__all__:
        assert hasattr(buggy, n)


@pytest.mark.parametrize("bug_name", sorted(PLANTED_BUGS))
def test_planted_bug_shape(bug_name):
    bug, twin, example = PLANTED_BUGS[bug_name]
    assert bug.__name__ == bug_name and issubclass(bug, Function)
    assert bug.__doc__ and bug.__doc__.strip().startswith("Bug:")
    assert example in EXAMPLES
    assert inspect.signature(bug.forward) == inspect.signature(twin.forward)


# ---------------------------------------------------------------------------
# Planted bugs: each differs from its twin in the stated way
# ---------------------------------------------------------------------------


def _linear_args(n_in=4, n_out=5, bias=True, seed=0):
    g = _seeded(seed)
    x = torch.randn(3, n_in, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n_out, n_in, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n_out, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    return x, w, b


def test_bug_weight_grad_transposed():
    x, w, b = _linear_args(4, 4)
    good = _grads(LinearFunction, (x, w, b))
    bad = _grads(buggy.LinearWeightGradTransposed, (x, w, b))
    torch.testing.assert_close(bad[0], good[0])
    torch.testing.assert_close(bad[2], good[2])
    torch.testing.assert_close(bad[1], good[1].T)  # square weight: exactly the transpose
    assert not torch.allclose(bad[1], good[1])
    x, w, b = _linear_args(4, 5)  # non-square: still silently wrong, shape-compatible
    good, bad = _grads(LinearFunction, (x, w, b)), _grads(buggy.LinearWeightGradTransposed, (x, w, b))
    assert bad[1].shape == w.shape and not torch.allclose(bad[1], good[1])


def test_bug_grad_input_wrong():
    args = _linear_args()
    good = _grads(LinearFunction, args)
    bad = _grads(buggy.LinearGradInputWrong, args)
    assert bad[0].shape == good[0].shape and not torch.allclose(bad[0], good[0])
    torch.testing.assert_close(bad[1], good[1])
    torch.testing.assert_close(bad[2], good[2])


def test_bug_rnn_missing_tanh_derivative():
    args = _sample("rnn_cell", 0)
    good = _grads(RNNCell, args)
    bad = _grads(buggy.RNNCellMissingTanhDerivative, args)
    for g, b in zip(good, bad):
        assert g.shape == b.shape and not torch.allclose(g, b)
    torch.testing.assert_close(buggy.RNNCellMissingTanhDerivative.apply(*args), RNNCell.apply(*args))


def test_bug_relu_positive_grad_only():
    (x,) = _sample("relu", 0)
    positive = torch.rand_like(x) + 0.1
    torch.testing.assert_close(_grads(buggy.ReLUPositiveGradOnly, (x,), positive), _grads(MyReLU, (x,), positive))
    mixed = torch.randn(x.shape, generator=_seeded(1), dtype=x.dtype)
    (good,) = _grads(MyReLU, (x,), mixed)
    (bad,) = _grads(buggy.ReLUPositiveGradOnly, (x,), mixed)
    assert not torch.allclose(good, bad)
    # One-hot cotangents (what gradcheck's Jacobian uses) do not expose it.
    assert gradcheck(buggy.ReLUPositiveGradOnly.apply, (x,))


def test_bug_cube_not_differentiable_backward():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    v = torch.ones(5, dtype=torch.float64, requires_grad=True)  # cotangent, as in gradgradcheck
    second = {}
    for fn in (Cube, buggy.CubeNotDifferentiableBackward):
        (g1,) = torch.autograd.grad(fn.apply(x), x, v, create_graph=True)
        torch.testing.assert_close(g1.detach(), 3 * x.detach() ** 2)  # first derivative right
        assert g1.requires_grad  # still differentiable (through v) ...
        (second[fn],) = torch.autograd.grad(g1.sum(), x, allow_unused=True)
    torch.testing.assert_close(second[Cube], 6 * x.detach())
    assert second[buggy.CubeNotDifferentiableBackward] is None  # ... but the 6x term is gone
    assert not gradgradcheck(buggy.CubeNotDifferentiableBackward.apply, (x,), raise_exception=False)


def test_bug_cube_wrong_at_one_element():
    (x,) = _sample("cube", 0)
    (good,) = _grads(Cube, (x,))
    (bad,) = _grads(buggy.CubeWrongAtOneElement, (x,))
    differs = ~torch.isclose(good, bad)
    assert differs.sum() == 1 and differs.reshape(-1)[-1]
    torch.testing.assert_close(bad.reshape(-1)[-1], 2 * good.reshape(-1)[-1])


def test_bug_mul_constant_no_none_handling():
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(_grads(buggy.MulConstantNoNoneHandling, (x, 2.0))[0], torch.full((3,), 2.0))
    with pytest.raises(TypeError):
        _DropGrad.apply(buggy.MulConstantNoNoneHandling.apply(x, 2.0)).sum().backward()


def test_bug_add_one_in_place_no_mark_dirty():
    leaf = torch.zeros(3, requires_grad=True)
    y = buggy.AddOneInPlaceNoMarkDirty.apply(leaf)  # correct op raises here
    assert torch.equal(leaf.detach(), torch.ones(3))  # leaf silently mutated
    assert y is not leaf
    x = torch.zeros(3, requires_grad=True).clone()
    history = x.grad_fn
    buggy.AddOneInPlaceNoMarkDirty.apply(x)
    assert x.grad_fn is history  # autograd never learnt of the mutation


def test_bug_scale_mutates_grad_output():
    x = torch.randn(3, requires_grad=True)
    for fn, expect in ((ScaleOnceDifferentiable, 1.0), (buggy.ScaleMutatesGradOutput, 2.0)):
        cotangent = torch.ones(3)
        (gx,) = torch.autograd.grad(fn.apply(x), x, cotangent)
        torch.testing.assert_close(gx, torch.full((3,), 2.0))
        torch.testing.assert_close(cotangent, torch.full((3,), expect))


def test_bug_linear_saves_ctx_attributes():
    x0, w, b = _linear_args()
    results = {}
    for fn in (LinearFunction, buggy.LinearSavesCtxAttributes):
        x = x0.detach().clone().requires_grad_()
        inter = x * 1.0
        ref = weakref.ref(inter)
        out = fn.apply(inter, w, b)
        del inter
        out.sum().backward()
        gc.collect()
        alive = ref() is not None
        # In-place change of an input after forward.
        inter = x * 1.0
        out = fn.apply(inter, w, b)
        inter.mul_(10)
        try:
            out.sum().backward()
            detected = False
        except RuntimeError:
            detected = True
        results[fn] = (alive, detected)
    assert results[LinearFunction] == (False, True)
    assert results[buggy.LinearSavesCtxAttributes] == (True, False)


def test_bug_relu_saves_output_on_ctx():
    def make(fn):
        a = torch.randn(4, requires_grad=True)
        return weakref.ref(fn.apply(a * 1.0))

    enabled = gc.isenabled()
    gc.disable()
    try:
        assert make(MyReLU)() is None  # freed by reference counting
        leaked = make(buggy.ReLUSavesOutputOnCtx)
        assert leaked() is not None  # kept alive by the cycle
        gc.collect()
        assert leaked() is None
    finally:
        if enabled:
            gc.enable()
    (x,) = _sample("relu", 0)
    torch.testing.assert_close(_grads(buggy.ReLUSavesOutputOnCtx, (x,)), _grads(MyReLU, (x,)))


def test_bug_linear_float32_backward():
    args = _linear_args()
    good = _grads(LinearFunction, args)
    bad = _grads(buggy.LinearFloat32Backward, args)
    for g, b in zip(good, bad):
        assert b.dtype == torch.float64
        torch.testing.assert_close(b, g, rtol=1e-5, atol=1e-5)  # close ...
    assert any(not torch.allclose(b, g, rtol=1e-12, atol=1e-12) for g, b in zip(good, bad))  # ... not float64-exact


def test_bug_linear_needs_input_grad_misuse():
    x, w, b = _linear_args()
    good = _grads(LinearFunction, (x, w, b))
    torch.testing.assert_close(_grads(buggy.LinearNeedsInputGradMisuse, (x, w, b)), good)
    # Bias present but frozen: the weight silently gets no gradient.
    frozen = b.detach()
    (_gx, gw) = _grads(buggy.LinearNeedsInputGradMisuse, (x, w, frozen))
    assert gw is None
    # No bias: backward returns a gradient for the ``None`` argument.
    with pytest.raises(RuntimeError):
        _grads(buggy.LinearNeedsInputGradMisuse, (x, w, None))


def test_bug_linear_contiguous_assumption():
    _, w, b = _linear_args()
    x = torch.randn(4, 3, dtype=torch.float64).T.requires_grad_()  # (3, 4), not contiguous
    assert not x.is_contiguous()
    good = _grads(LinearFunction, (x, w, b))
    bad = _grads(buggy.LinearContiguousAssumption, (x, w, b))
    assert bad[1].shape == good[1].shape and not torch.allclose(bad[1], good[1])
    xc = x.detach().contiguous().requires_grad_()
    torch.testing.assert_close(
        _grads(buggy.LinearContiguousAssumption, (xc, w, b)), _grads(LinearFunction, (xc, w, b))
    )


def test_bug_relu_nondeterministic():
    (x,) = _sample("relu", 0)
    torch.manual_seed(0)
    (first,) = _grads(buggy.ReLUNondeterministic, (x,))
    (second,) = _grads(buggy.ReLUNondeterministic, (x,))
    assert not torch.equal(first, second)
    torch.testing.assert_close(first, second, rtol=1e-4, atol=0)
    (good,) = _grads(MyReLU, (x,))
    assert torch.equal(good, _grads(MyReLU, (x,))[0])
