"""The wheel a user installs: built from this checkout, installed into a fresh
virtual environment, and used from there, away from the checkout.

torch is not installed again: the new environment sees the current one's
site-packages through a ``.pth`` file, after its own, so ``pytest_autograd``
and ``reference_ops`` come from the wheel and torch from here. The extension
is then built from the sources inside the installed package: about a minute
on a small machine the first time (hence ``slow``; CI runs slow tests too),
seconds afterwards while the sources do not change.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "csrc", "pytest_autograd", "reference_ops")


def _setuptools_is_new_enough():
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def _clean_environment():
    """This process's variables less PYTHONPATH, which would put the checkout (or another install) first."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _run(command, **kwargs):
    kwargs.setdefault("env", _clean_environment())
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the checkout (an in-tree build would write build/ into it)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    # The current environment's setuptools when it is recent enough (no download); else an isolated build.
    isolation = ["--no-build-isolation"] if _setuptools_is_new_enough() else []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *isolation, "-w", str(out), str(source)])
    (built,) = out.glob("pytest_autograd-*.whl")
    return built


def _cache_directory():
    """Where this checkout's wheel venv and extension build live between runs.

    torch rebuilds the extension when a source path or a source's mtime
    changes, so the venv is made afresh at the same path each run, in torch's
    extension cache, and the installed sources get back the mtimes the wheel
    recorded: a rebuild then happens only when the sources changed.
    """
    import torch
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    tag = hashlib.sha1(f"{ROOT} {sys.executable} {torch.__version__}".encode()).hexdigest()[:10]
    return Path(root) / f"pytest-autograd-wheel-{tag}"


def _restore_mtimes(wheel, site):
    for info in zipfile.ZipFile(wheel).infolist():
        path = site / info.filename
        if info.filename.startswith("reference_ops/csrc/") and path.is_file():
            stamp = time.mktime((*info.date_time, 0, 0, -1))
            os.utime(path, (stamp, stamp))


@pytest.fixture(scope="module")
def installed(wheel):
    """(python, site-packages, environment variables) of a fresh venv with only the wheel installed."""
    cache = _cache_directory()
    cache.mkdir(parents=True, exist_ok=True)
    with _exclusive(cache / "lock"):  # one pytest process (e.g. one xdist worker) at a time
        yield from _fresh_venv(wheel, cache)


@contextlib.contextmanager
def _exclusive(path):
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fresh_venv(wheel, cache):
    venv = cache / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    # torch's build lock, left behind by a build that was killed, would make the build wait forever;
    # under our lock nobody else builds here.
    for stale in (cache / "extensions").glob("*/lock"):
        stale.unlink()
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed",
          "--quiet", str(wheel)])
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    _restore_mtimes(wheel, site)
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_current_environment.pth").write_text("".join(f"{path}\n" for path in sorted(here)))
    env = _clean_environment()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # ninja
    env["TORCH_EXTENSIONS_DIR"] = str(cache / "extensions")
    yield python, site, env
    shutil.rmtree(venv, ignore_errors=True)


def test_the_wheel_carries_the_licence_and_the_extension_sources(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    sources = {path.name for path in (ROOT / "csrc").iterdir() if path.is_file()}
    assert {f"reference_ops/csrc/{name}" for name in sources} <= set(names)
    metadata_text = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in metadata_text


WHEEL_USER = textwrap.dedent("""
    import sys
    from importlib import metadata
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    import pytest_autograd
    import reference_ops
    from reference_ops import ExtLinear, extension

    site = Path(sys.argv[1]).resolve()
    for module in (pytest_autograd, reference_ops):
        assert site in Path(module.__file__).resolve().parents, f"{module.__name__} imported from {module.__file__}"
    assert extension._csrc_dir() == Path(reference_ops.__file__).resolve().parent / "csrc"
    plugins = [ep for ep in metadata.distribution("pytest-autograd").entry_points if ep.group == "pytest11"]
    assert [(ep.name, ep.value) for ep in plugins] == [("autograd", "pytest_autograd.plugin")]

    torch.manual_seed(0)
    layer = ExtLinear(5, 3, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    out, expected = layer(x), F.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(out, expected)
    cotangent = torch.randn_like(out)
    wrt = (x, layer.weight, layer.bias)
    torch.testing.assert_close(torch.autograd.grad(out, wrt, cotangent), torch.autograd.grad(expected, wrt, cotangent))
    print("ExtLinear matches F.linear")
""")


def test_ext_linear_builds_from_the_installed_wheel_and_matches_f_linear(installed, tmp_path):
    python, site, env = installed
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler here to build the extension")
    done = _run([str(python), "-c", WHEEL_USER, str(site)], cwd=tmp_path, env=env)
    assert "ExtLinear matches F.linear" in done.stdout


def test_another_distribution_sharing_reference_ops_is_refused_by_name(installed, tmp_path):
    python, site, env = installed
    squatter = site / "reference_ops_squatter-1.0.dist-info"
    squatter.mkdir()
    try:
        (squatter / "METADATA").write_text("Metadata-Version: 2.1\nName: reference-ops-squatter\nVersion: 1.0\n")
        (squatter / "RECORD").write_text("reference_ops/__init__.py,,\nreference_ops-squatter-1.0.dist-info/RECORD,,\n")
        done = subprocess.run([str(python), "-c", "import reference_ops"], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=300)
    finally:
        shutil.rmtree(squatter)
    assert done.returncode != 0
    assert "ImportError: reference-ops-squatter 1.0 also installs a top-level `reference_ops` package" in done.stderr
    assert "pip uninstall reference-ops-squatter" in done.stderr
