"""Skips reported where the user looks: at the test, not at a line of the plugin."""

import pytest


def skip_here(reason):
    """Skip the item, reported at the test's location rather than inside the plugin."""
    try:
        raise pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword: a plain skip
        pytest.skip(reason)
