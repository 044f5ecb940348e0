"""The CUDA-only planted bug: right on CPU (every default check passes), caught by parity on CUDA."""

import pytest
import torch
import torch.nn.functional as F

from reference_ops.buggy_cuda import TILE, LinearTailDroppedOnCuda


def samples():
    in_features = 2 * TILE + 3  # a partial last tile: the bug's trigger
    return [(torch.randn(6, in_features), torch.randn(5, in_features), torch.randn(5)),
            (torch.randn(2, 3, in_features), torch.randn(4, in_features), None)]


@pytest.mark.autograd_op(op=LinearTailDroppedOnCuda, reference=F.linear)
def test_the_cuda_only_bug_passes_every_default_check_on_cpu():
    return samples()


TEST_FILE = """
import pytest, torch, torch.nn.functional as F
from reference_ops.buggy_cuda import LinearTailDroppedOnCuda

@pytest.mark.autograd_op(op=LinearTailDroppedOnCuda, reference=F.linear, checks=["parity"])
def test_tail():
    return [(torch.randn(6, 11), torch.randn(5, 11), torch.randn(5))]
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parity_names_the_weight_gradient_of_the_cuda_only_bug(pytester, run_pytest):
    pytester.makepyfile(test_ops=TEST_FILE)
    result = run_pytest("--autograd-devices=cpu,cuda")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*gradient w.r.t. `weight` from cuda differs from cpu",
        "*check parity, device cuda, dtype float32, sample 0",
    ])
    result.stdout.re_match_lines([r".*worst element: grad weight\[\d+, (8|9|10)\]: .*"])  # the last, partial tile
