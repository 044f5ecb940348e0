"""Tests of the autograd_ext C++/CUDA linear extension (reference_ops.extension).

The extension is compiled once per session by the module-scoped ``ops``
fixture (about 10-60 s on a small machine, then cached by torch). CUDA tests
are skipped when no GPU is present.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from reference_ops import extension as ext

# Every test here needs the compiled extension (see the "slow" marker in pyproject.toml).
pytestmark = pytest.mark.slow

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")

# (batch, in_features, out_features), including sizes that are not multiples
# of any tile size and an empty batch.
SHAPES = [
    (1, 1, 1),
    (7, 33, 129),
    (33, 129, 7),
    (129, 7, 33),
    (0, 7, 33),
    (5, 0, 3),
]


@pytest.fixture(scope="module")
def ops():
    """Build and load the extension once for the whole module."""
    try:
        ext._check_toolchain()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return ext.load_extension()


def make_inputs(batch, in_f, out_f, *, dtype, device="cpu", bias=True, requires_grad=True):
    x = torch.randn(batch, in_f, dtype=dtype, device=device)
    w = torch.randn(out_f, in_f, dtype=dtype, device=device) / math.sqrt(max(in_f, 1))
    b = torch.randn(out_f, dtype=dtype, device=device) if bias else None
    tensors = [t for t in (x, w, b) if t is not None]
    for t in tensors:
        t.requires_grad_(requires_grad)
    return x, w, b


def reference_and_ext(fn, x, w, b, grad_out=None):
    """Output and gradients of ``fn`` and of F.linear on cloned leaves."""
    results = []
    for impl in (fn, F.linear):
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None for t in (x, w, b)]
        out = impl(*leaves)
        g = torch.ones_like(out) if grad_out is None else grad_out
        wrt = [t for t in leaves if t is not None and t.requires_grad]
        grads = torch.autograd.grad(out, wrt, g, allow_unused=True) if wrt else ()
        results.append((out.detach(), [gr for gr in grads]))
    return results


def assert_matches(fn, x, w, b, *, rtol, atol, grad_out=None):
    (out, grads), (ref_out, ref_grads) = reference_and_ext(fn, x, w, b, grad_out)
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    assert len(grads) == len(ref_grads)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# Build and registration
# ---------------------------------------------------------------------------


def test_ops_are_registered(ops):
    assert ops is torch.ops.autograd_ext
    fwd = str(torch.ops.autograd_ext.linear_forward.default._schema)
    bwd = str(torch.ops.autograd_ext.linear_backward.default._schema)
    assert fwd == "autograd_ext::linear_forward(Tensor input, Tensor weight, Tensor? bias) -> Tensor"
    assert bwd == (
        "autograd_ext::linear_backward(Tensor grad_out, Tensor input, Tensor weight, "
        "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)"
    )
    assert ext.extension_available()
    assert ext.load_extension() is ops  # cached
    assert ext.cuda_extension_available() == torch.cuda.is_available()


def test_missing_sources_give_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(ext, "CSRC_CANDIDATES", (tmp_path / "package", tmp_path / "checkout"))
    with pytest.raises(RuntimeError, match="sources were not found.*looked in .*package and .*checkout"):
        ext._source_paths(with_cuda=False)


def test_sources_are_found_inside_the_package_first(monkeypatch, tmp_path):
    packaged, checkout = tmp_path / "package", tmp_path / "checkout"
    for directory in (packaged, checkout):
        directory.mkdir()
        for name in ext.CPU_SOURCES:
            (directory / name).write_text("")
    monkeypatch.setattr(ext, "CSRC_CANDIDATES", (packaged, checkout))
    assert ext._source_paths(with_cuda=False) == [str(packaged / name) for name in ext.CPU_SOURCES]
    (packaged / ext.CPU_SOURCES[0]).unlink()
    assert ext._source_paths(with_cuda=False) == [str(checkout / name) for name in ext.CPU_SOURCES]


def test_missing_tools_give_clear_errors(monkeypatch):
    monkeypatch.setattr(ext.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        ext._check_toolchain()
    monkeypatch.setattr(ext.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/" + name)
    with pytest.raises(RuntimeError, match="pip install ninja"):
        ext._check_toolchain()


# ---------------------------------------------------------------------------
# CPU numerics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("front_end", ["op", "function"])
def test_matches_torch_linear(ops, shape, bias, dtype, tol, front_end):
    fn = ext.ext_linear if front_end == "op" else ext.ExtLinearFunction.apply
    x, w, b = make_inputs(*shape, dtype=dtype, bias=bias)
    assert_matches(fn, x, w, b, rtol=tol, atol=tol)


def test_non_contiguous_inputs(ops):
    d = torch.float64
    x = torch.randn(9, 13, dtype=d).t()  # (13, 9), transposed
    w = torch.randn(6, 18, dtype=d)[:, ::2]  # (6, 9), strided columns
    b = torch.randn(12, dtype=d)[::2]  # (6,), strided
    for t in (x, w, b):
        assert not t.is_contiguous()
        t.requires_grad_(True)
    grad_out = torch.randn(6, 13, dtype=d).t()  # non-contiguous incoming gradient
    assert_matches(ext.ext_linear, x, w, b, rtol=1e-12, atol=1e-12, grad_out=grad_out)
    assert_matches(ext.ExtLinearFunction.apply, x, w, b, rtol=1e-12, atol=1e-12, grad_out=grad_out)


@pytest.mark.parametrize("lead", [(), (2, 3), (0, 4)], ids=["1d", "3d", "3d-empty"])
def test_leading_batch_dims(ops, lead):
    d = torch.float64
    x = torch.randn(*lead, 5, dtype=d, requires_grad=True)
    w = torch.randn(4, 5, dtype=d, requires_grad=True)
    b = torch.randn(4, dtype=d, requires_grad=True)
    out = ext.ext_linear(x, w, b)
    assert out.shape == (*lead, 4)
    assert_matches(ext.ext_linear, x, w, b, rtol=1e-12, atol=1e-12)


def test_backward_op_output_mask(ops):
    d = torch.float64
    x, w, _ = make_inputs(5, 3, 4, dtype=d, requires_grad=False)
    go = torch.randn(5, 4, dtype=d)
    gi, gw, gb = ext.ext_linear_backward(go, x, w)
    torch.testing.assert_close(gi, go @ w)
    torch.testing.assert_close(gw, go.t() @ x)
    torch.testing.assert_close(gb, go.sum(0))
    gi, gw, gb = ext.ext_linear_backward(go, x, w, [False, True, False])
    assert gi.shape == (0,) and gb.shape == (0,)
    torch.testing.assert_close(gw, go.t() @ x)


def test_only_needed_grads_are_computed(ops):
    x, w, b = make_inputs(4, 3, 2, dtype=torch.float64)
    x.requires_grad_(False)
    out = ext.ExtLinearFunction.apply(x, w, b)
    out.sum().backward()
    assert x.grad is None and w.grad is not None and b.grad is not None


def test_bad_arguments_raise(ops):
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="must equal weight.size"):
        ext.ext_linear(x, torch.randn(2, 5))
    with pytest.raises(RuntimeError, match="same dtype"):
        ext.ext_linear(x, torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="bias must have shape"):
        ext.ext_linear(x, torch.randn(2, 4), torch.randn(3))


# ---------------------------------------------------------------------------
# gradcheck / opcheck
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("fn", [ext.ext_linear, ext.ExtLinearFunction.apply], ids=["op", "function"])
def test_gradcheck_and_gradgradcheck(ops, fn, bias):
    x, w, b = make_inputs(4, 3, 5, dtype=torch.float64, bias=bias)
    args = (x, w, b)
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_gradcheck_backward_op(ops):
    d = torch.float64
    go = torch.randn(4, 5, dtype=d, requires_grad=True)
    x = torch.randn(4, 3, dtype=d, requires_grad=True)
    w = torch.randn(5, 3, dtype=d, requires_grad=True)
    for mask in ([True, True, True], [True, False, True], [False, True, False]):
        assert torch.autograd.gradcheck(lambda g, i, ww: ext.ext_linear_backward(g, i, ww, mask), (go, x, w))


def _opcheck_forward_cases(device="cpu", dtype=torch.float64):
    def t(*shape, rg=True):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=rg)

    return [
        (t(5, 3), t(4, 3), t(4)),
        (t(5, 3), t(4, 3), None),
        (t(0, 3, rg=False), t(4, 3), t(4)),
        (t(2, 5, 3), t(4, 3, rg=False), None),
        (t(3), t(2, 3), t(2)),
    ]


def _opcheck_backward_cases(device="cpu", dtype=torch.float64):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)

    return [
        (t(5, 4), t(5, 3), t(4, 3), [True, True, True]),
        (t(5, 4), t(5, 3), t(4, 3), [True, False, False]),
        (t(0, 4), t(0, 3), t(4, 3), [True, True, True]),
        (t(2, 5, 4), t(2, 5, 3), t(4, 3), [False, True, True]),
    ]


@pytest.mark.parametrize("case", range(5))
def test_opcheck_linear_forward(ops, case):
    torch.library.opcheck(torch.ops.autograd_ext.linear_forward.default, _opcheck_forward_cases()[case])


@pytest.mark.parametrize("case", range(4))
def test_opcheck_linear_backward(ops, case):
    torch.library.opcheck(torch.ops.autograd_ext.linear_backward.default, _opcheck_backward_cases()[case])


# ---------------------------------------------------------------------------
# nn.Module front end and torch.compile
# ---------------------------------------------------------------------------


def test_module_parameters_and_repr(ops):
    torch.manual_seed(0)
    m = ext.ExtLinear(7, 3)
    assert repr(m) == "ExtLinear(in_features=7, out_features=3, bias=True)"
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    assert m.weight.shape == (3, 7) and m.bias.shape == (3,)
    bound = 1 / math.sqrt(7)
    assert m.weight.abs().max() <= bound and m.bias.abs().max() <= bound

    m2 = ext.ExtLinear(4, 2, bias=False, dtype=torch.float64)
    assert m2.bias is None and [n for n, _ in m2.named_parameters()] == ["weight"]
    assert m2.weight.dtype == torch.float64
    assert "bias=False" in repr(m2)


def test_module_matches_nn_linear(ops):
    ref = torch.nn.Linear(6, 5, dtype=torch.float64)
    m = ext.ExtLinear(6, 5, dtype=torch.float64)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(3, 2, 6, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(m(x), ref(x))
    m(x).pow(2).sum().backward()
    gx = x.grad.clone()
    x.grad = None
    ref(x).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(m.weight.grad, ref.weight.grad)
    torch.testing.assert_close(m.bias.grad, ref.bias.grad)


def _compile_check(device, dtype, tol):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = ext.ExtLinear(9, 5, device=device, dtype=dtype)
    compiled_mod = ext.ExtLinear(9, 5, device=device, dtype=dtype)
    compiled_mod.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_mod, fullgraph=True)

    x = torch.randn(7, 9, device=device, dtype=dtype)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    out_e = eager(x1)
    out_c = compiled(x2)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol)
    out_e.sin().sum().backward()
    out_c.sin().sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(compiled_mod.weight.grad, eager.weight.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(compiled_mod.bias.grad, eager.bias.grad, rtol=tol, atol=tol)


def test_torch_compile_fullgraph(ops):
    # One small case: inductor compilation dominates the runtime on small machines.
    _compile_check("cpu", torch.float32, 1e-5)


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------

CUDA_SHAPES = SHAPES + [(257, 513, 1000), (1024, 1024, 1024)]
# Low-precision results are compared against a float64 reference computed from
# the same (rounded) inputs, relative to the output's magnitude.
CUDA_DTYPES = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 4e-2,
}


@pytest.fixture
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def assert_close_scaled(actual, expected, tol):
    """|actual - expected| <= tol * max(1, max|expected|) elementwise."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if expected.numel() == 0:
        return
    scale = max(1.0, expected.double().abs().max().item())
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol * scale:.3g}"


@CUDA
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", list(CUDA_DTYPES), ids=str)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_matches_reference(ops, no_tf32, shape, dtype, bias):
    assert ext.cuda_extension_available()
    tol = CUDA_DTYPES[dtype]
    x, w, b = make_inputs(*shape, dtype=dtype, device="cuda", bias=bias)
    go = torch.randn(shape[0], shape[2], dtype=dtype, device="cuda")

    out = ext.ext_linear(x, w, b)
    grads = torch.autograd.grad(out, [t for t in (x, w, b) if t is not None], go)

    # float64 reference on the same (already rounded) values
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    ref = F.linear(x64, w64, b64)
    ref_grads = torch.autograd.grad(ref, [t for t in (x64, w64, b64) if t is not None], go.double())

    assert_close_scaled(out, ref.to(dtype), tol)
    for g, rg in zip(grads, ref_grads):
        assert_close_scaled(g, rg.to(dtype), tol)


@CUDA
def test_cuda_non_contiguous_and_batch_dims(ops, no_tf32):
    d = torch.float32
    x = torch.randn(2, 40, 70, device="cuda", dtype=d).transpose(0, 1)[:, :, ::2]  # (40, 2, 35)
    w = torch.randn(35, 66, device="cuda", dtype=d).t()[::2]  # (33, 35)
    b = torch.randn(66, device="cuda", dtype=d)[::2]
    for t in (x, w, b):
        assert not t.is_contiguous()
        t.requires_grad_(True)
    go = torch.randn(33, 2, 40, device="cuda", dtype=d).permute(2, 1, 0)
    assert_matches(ext.ext_linear, x, w, b, rtol=1e-4, atol=1e-4, grad_out=go)


@CUDA
def test_cuda_side_stream_and_device_guard(ops, no_tf32):
    x, w, b = make_inputs(300, 200, 100, dtype=torch.float32, device="cuda", requires_grad=False)
    expected = F.linear(x, w, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = ext.ext_linear(x, w, b)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@CUDA
def test_cuda_gradcheck(ops):
    x, w, b = make_inputs(6, 5, 4, dtype=torch.float64, device="cuda")
    assert torch.autograd.gradcheck(ext.ext_linear, (x, w, b))
    assert torch.autograd.gradgradcheck(ext.ExtLinearFunction.apply, (x, w, b))


@CUDA
def test_cuda_opcheck(ops):
    for args in _opcheck_forward_cases("cuda", torch.float32):
        torch.library.opcheck(torch.ops.autograd_ext.linear_forward.default, args)
    for args in _opcheck_backward_cases("cuda", torch.float32):
        torch.library.opcheck(torch.ops.autograd_ext.linear_backward.default, args)


@CUDA
def test_cuda_torch_compile(ops, no_tf32):
    _compile_check("cuda", torch.float32, 1e-4)


# ---------------------------------------------------------------------------
# Toolchains that would link a private libstdc++
# ---------------------------------------------------------------------------


def _fake_compiler(tmp_path, answer):
    script = tmp_path / "fake-c++"
    script.write_text(f"#!/bin/sh\necho '{answer}'\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_compiler_without_a_shared_libstdcxx_links_the_one_this_process_loaded(tmp_path):
    flags = ext._libstdcxx_link_flags(_fake_compiler(tmp_path, "libstdc++.so"))
    loaded = ext._loaded_libstdcxx()
    assert loaded is not None, "torch loads libstdc++ on Linux"
    assert flags == [f"-L{os.path.dirname(loaded)}", f"-l:{os.path.basename(loaded)}"]


def test_a_compiler_with_a_shared_libstdcxx_gets_no_extra_link_flags(tmp_path):
    shared = tmp_path / "libstdc++.so"
    shared.write_text("")
    assert ext._libstdcxx_link_flags(_fake_compiler(tmp_path, str(shared))) == []
    assert ext._libstdcxx_link_flags(str(tmp_path / "no-such-compiler")) == []
