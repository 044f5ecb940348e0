"""The rerun: line of a failure works pasted into a shell from any directory, whatever the node id holds."""

import os
import re
import shlex
import subprocess
import sys

FAILING = """
import pytest
import torch
from reference_ops.buggy import LinearGradInputWrong

@pytest.mark.autograd_op(op=LinearGradInputWrong, checks=["gradcheck"])
@pytest.mark.parametrize("label", ["it's $HOME", "plain"])
def test_linear(label):
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
"""


def rerun_lines(result):
    return [line.split("rerun: ", 1)[1] for line in result.outlines if line.startswith("  rerun: ")]


def failing_project(pytester):
    pytester.makeini("[pytest]\n")
    tests = pytester.mkdir("tests")
    (tests / "test_ops.py").write_text(FAILING)
    return tests


def test_a_node_id_with_quotes_and_dollars_is_shell_quoted(pytester, run_pytest):
    failing_project(pytester)
    result = run_pytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    quoted, plain = rerun_lines(result)
    assert shlex.split(quoted)[:2] == ["pytest", "tests/test_ops.py::test_linear[gradcheck-cpu-it's $HOME]"]
    assert plain == 'pytest "tests/test_ops.py::test_linear[gradcheck-cpu-plain]" --autograd-seed=0'


def test_run_outside_the_rootdir_the_rerun_line_changes_to_the_rootdir_first(pytester, run_pytest, monkeypatch):
    tests = failing_project(pytester)
    monkeypatch.chdir(tests)
    result = run_pytest("-k", "plain")
    result.assert_outcomes(failed=1)
    [line] = rerun_lines(result)
    assert shlex.split(line)[:4] == ["cd", str(pytester.path), "&&", "pytest"]


def test_the_rerun_line_reproduces_the_failure_pasted_into_a_shell_elsewhere(pytester, run_pytest, monkeypatch):
    tests = failing_project(pytester)
    monkeypatch.chdir(tests)
    result = run_pytest("-k", "HOME")
    [line] = rerun_lines(result)
    elsewhere = pytester.mkdir("elsewhere")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    command = line.replace("&& pytest ", f"&& {shlex.quote(sys.executable)} -m pytest -p no:cacheprovider ", 1)
    completed = subprocess.run(["bash", "-c", command], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert re.search(r"\b1 failed\b", completed.stdout), completed.stdout + completed.stderr
