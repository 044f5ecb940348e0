"""The pytest entry point (``pytest11``: ``autograd = pytest_autograd.plugin``).

The hooks and fixtures live in :mod:`pytest_autograd.pytest_adapter`; this
module only names them for pytest. Importing it imports no torch.
"""

from pytest_autograd.pytest_adapter.hooks import (  # noqa: F401 - pytest finds hooks and fixtures by name
    autograd_check,
    autograd_device,
    autograd_scan,
    pytest_addhooks,
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_generate_tests,
    pytest_itemcollected,
    pytest_make_collect_report,
    pytest_plugin_registered,
    pytest_pycollect_makeitem,
    pytest_pyfunc_call,
    pytest_report_collectionfinish,
    pytest_report_header,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_xdist_node_collection_finished,
)
