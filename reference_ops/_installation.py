"""Refuse, with a clear message, a ``reference_ops`` that another distribution shares.

``reference_ops`` is a generic top-level name. If another distribution
installs a package of that name into the same site-packages, the two
overwrite each other's files, and uninstalling either one deletes files of
the other: imports then fail far from the cause, or a stranger's module is
imported in place of ours. So when :mod:`reference_ops` is imported it looks
at the distributions installed beside it (one directory, no torch, no
network) and stops at once if any other one claims the name, or if one of
its own modules is gone.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

PACKAGE = "reference_ops"
DISTRIBUTION = "pytest-autograd"
MODULES = ("functions.py", "buggy.py", "transforms.py", "extension.py")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _claims_package(distribution) -> bool:
    """Whether a distribution installs a top-level ``reference_ops``."""
    top_level = distribution.read_text("top_level.txt")
    if top_level is not None and PACKAGE in top_level.split():
        return True
    return any(Path(str(entry)).parts[:1] == (PACKAGE,) for entry in distribution.files or ())


def other_owners(site_dir: Path) -> list[str]:
    """``"name version"`` of every distribution in ``site_dir``, other than ours, that claims the package."""
    found = []
    for distribution in metadata.distributions(path=[str(site_dir)]):
        name = distribution.metadata["Name"]
        if _normalized(name) != DISTRIBUTION and _claims_package(distribution):
            found.append(f"{name} {distribution.version}")
    return sorted(set(found))


def check_installation(package_dir: Path) -> None:
    """Raise ImportError naming the conflict and the fix; return quietly when all is ours."""
    missing = [name for name in MODULES if not (package_dir / name).is_file()]
    others = other_owners(package_dir.parent)
    if not missing and not others:
        return
    if others:
        problem = (f"{', '.join(others)} also install{'s' if len(others) == 1 else ''} a top-level "
                   f"`{PACKAGE}` package into {package_dir.parent}, where {DISTRIBUTION} installed its own. "
                   "The two overwrite each other's files, and uninstalling either deletes files of the other.")
        names = " ".join(other.split()[0] for other in others)
        fix = (f"Uninstall the other one (`pip uninstall {names}`), then repair {DISTRIBUTION} with "
               f"`pip install --force-reinstall --no-deps` and the wheel or checkout you installed it from.")
    else:
        problem = (f"{PACKAGE} in {package_dir} is incomplete: {', '.join(missing)} "
                   f"{'is' if len(missing) == 1 else 'are'} missing, most likely deleted by uninstalling another "
                   f"distribution that also installed a top-level `{PACKAGE}` package.")
        fix = (f"Repair {DISTRIBUTION} with `pip install --force-reinstall --no-deps` and the wheel or "
               "checkout you installed it from.")
    raise ImportError(f"{problem} {fix}")
