"""The ops of ``reference_ops.edges``: each correct op passes every default check, each planted bug fails extreme.

The planted bugs (a backward that returns 0 past |x| = 4) are right at the
samples' own scale, so only the extreme check, at its moderate magnitudes,
can see them.
"""

import pytest
import torch

from reference_ops.edges import EDGE_OPS


def _marked(name, edge):
    @pytest.mark.autograd_op(op=edge.op, reference=edge.reference, **edge.options)
    def test():
        return edge.samples(torch.Generator().manual_seed(0))

    test.__name__ = test.__qualname__ = f"test_{name}"
    return test


for _name, _edge in EDGE_OPS.items():
    globals()[f"test_{_name}"] = _marked(_name, _edge)


SHORTCUTS = """
import pytest
import torch
from reference_ops.edges import EDGE_OPS, SHORTCUTS


@pytest.mark.autograd_op(op=SHORTCUTS["{name}"], reference=EDGE_OPS["{name}"].reference, **EDGE_OPS["{name}"].options)
def test_shortcut():
    return EDGE_OPS["{name}"].samples(torch.Generator().manual_seed(0))
"""


@pytest.mark.parametrize("name", ["softplus", "row_softplus"])
def test_a_planted_shortcut_fails_extreme_and_no_other_check(pytester, run_pytest, name):
    pytester.makepyfile(test_ops=SHORTCUTS.format(name=name))
    result = run_pytest()
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert [line.split(" ")[1] for line in failed] == ["test_ops.py::test_shortcut[extreme-cpu]"], result.outlines
    result.stdout.fnmatch_lines(["gradient w.r.t. `x` in float32 is off from the reference in float64 by * for "
                                 "inputs scaled to max |x| = 6, more than its error budget *"])
