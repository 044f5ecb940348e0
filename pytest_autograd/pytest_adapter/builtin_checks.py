"""The built-in checks arrive through the plugin's own hook, like any other plugin's checks."""

import pytest

from pytest_autograd.engine.builtin import register_builtin_checks


@pytest.hookimpl
def pytest_autograd_register_checks(registry):
    register_builtin_checks(registry)
