"""Run the plugin's test suite against other torch (and pytest) versions.

    pip install nox
    nox -s "tests(2.15.0)"        # the newest torch
    nox -s "tests(2.4.1)"         # the declared minimums: torch 2.4, pytest 7.4
    nox -s tests                  # every version in turn
    nox -s "tests(2.15.0)" -- tests/test_tutorial.py -x   # arguments after -- go to pytest

Each session gets its own virtual environment (in .nox/, or --envdir) with the
project installed editable, and its own torch extension cache, so an extension
built against one torch is never loaded by another. Unpinned torch wheels from
PyPI are CUDA builds that pull several GB of nvidia packages; the suite passes
on them without a GPU (the CUDA items skip, saying why).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.sessions = ["tests"]

# (torch, pytest): the declared minimums together, the version CI pins, the newest release.
VERSIONS = [
    ("2.4.1", "7.4.4"),
    ("2.13.0", None),
    ("2.15.0", None),
]


@nox.session
@nox.parametrize("torch,pytest", VERSIONS, ids=[torch for torch, _ in VERSIONS])
def tests(session: nox.Session, torch: str, pytest: str | None) -> None:
    """The whole suite, as CI runs it, on one torch version."""
    pins = [f"torch=={torch}"] + ([f"pytest=={pytest}"] if pytest else [])
    session.install(*pins)
    session.install("-e", ".[test,triton]", *pins)
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    session.env["TORCH_EXTENSIONS_DIR"] = str(cache / f"torch-{torch}")
    session.run("python", "-c", "import torch, pytest; print('torch', torch.__version__, '| pytest', pytest.__version__)")
    # No path: pytest takes testpaths (tests/) unless the arguments after -- name files.
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs)
