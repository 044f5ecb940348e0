"""reference_ops refuses a site-packages where another distribution shares its name."""

from __future__ import annotations

import pytest

from reference_ops._installation import MODULES, check_installation, other_owners


def make_site(tmp_path, *distributions):
    """A site-packages with our package and fake dist-info folders: (name, version, top_level or None, record)."""
    package = tmp_path / "reference_ops"
    package.mkdir()
    for name in ("__init__.py", *MODULES):
        (package / name).write_text("")
    for name, version, top_level, record in distributions:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if top_level is not None:
            (info / "top_level.txt").write_text(top_level)
        (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))
    return package


def test_our_own_distribution_and_unrelated_ones_are_accepted(tmp_path):
    package = make_site(
        tmp_path,
        ("pytest-autograd", "0.1.0", "pytest_autograd\nreference_ops\n", ["reference_ops/__init__.py"]),
        ("numpy", "2.0", None, ["numpy/__init__.py"]),
        ("reference-ops-extras", "1.0", "reference_ops_extras\n", ["reference_ops_extras/__init__.py"]),
    )
    check_installation(package)
    assert other_owners(tmp_path) == []


@pytest.mark.parametrize("top_level", ["reference_ops\n", None], ids=["top_level.txt", "RECORD only"])
def test_another_distribution_installing_reference_ops_is_named_with_the_fix(tmp_path, top_level):
    package = make_site(tmp_path, ("pytest-autograd", "0.1.0", "reference_ops\n", []),
                        ("squatter", "2.3", top_level, ["reference_ops/__init__.py", "reference_ops/util.py"]))
    with pytest.raises(ImportError) as raised:
        check_installation(package)
    message = str(raised.value)
    assert message.startswith(f"squatter 2.3 also installs a top-level `reference_ops` package into {tmp_path}")
    assert "uninstalling either deletes files of the other" in message
    assert "`pip uninstall squatter`" in message and "--force-reinstall --no-deps" in message


def test_a_module_deleted_by_another_uninstall_is_named_with_the_fix(tmp_path):
    package = make_site(tmp_path)
    (package / "functions.py").unlink()
    with pytest.raises(ImportError, match=r"reference_ops in .* is incomplete: functions.py is missing, most likely "
                                          r"deleted by uninstalling another distribution.*--force-reinstall --no-deps"):
        check_installation(package)
