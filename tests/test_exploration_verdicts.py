"""A mismatch on an input the user did not give fails the op with evidence that it is meant to work there, and is a
note, in one wording, without it or where the numbers cannot be trusted."""

import pytest

from pytest_autograd.engine import triton_interpreter
from pytest_autograd.engine.exploration.verdicts import Mismatch, fails, ruling

SEEN = Mismatch("when `x` gets one more leading dim: (4, 8) as (2, 4, 8)", "gradient w.r.t. `x` is off", "float64")


class Context:
    check_name = "sizes"

    def __init__(self):
        self.notes = []

    def note(self, text):
        self.notes.append(text)


def test_a_mismatch_with_evidence_fails_the_op():
    context = Context()
    assert fails(context, SEEN, ["its forward treats the new dim as a batch"], "nothing shows it", "add a sample")
    assert context.notes == []


def test_a_mismatch_without_evidence_is_noted_saying_what_was_seen_why_and_how_to_judge_it():
    context = Context()
    assert not fails(context, SEEN, [], "nothing shows the op is meant to take one more dim", "add a 3-D sample")
    assert context.notes == ["sizes: not judged when `x` gets one more leading dim: (4, 8) as (2, 4, 8): gradient "
                             "w.r.t. `x` is off; nothing shows the op is meant to take one more dim; add a 3-D sample"]


def test_numbers_triton_s_interpreter_computes_wrongly_are_noted_whatever_the_evidence(monkeypatch):
    monkeypatch.setattr(triton_interpreter, "_WATCHES", [triton_interpreter._Watch(count=[1])])
    monkeypatch.setitem(triton_interpreter._SELF_TEST, "float64", "x * x + x off by 7 on values of magnitude 3")
    note = ruling(SEEN, ["its forward treats the new dim as a batch"], "unused", "unused")
    assert note.startswith("not judged when `x` gets one more leading dim: (4, 8) as (2, 4, 8): gradient w.r.t. `x` is "
                           "off; TRITON_INTERPRET=1: Triton's interpreter computes float64 arithmetic wrongly here "
                           "(its self-test: x * x + x off by 7 on values of magnitude 3)")
    assert note.endswith("; judge float64 on a GPU")


@pytest.mark.parametrize("launches", [[0], None])
def test_the_interpreter_is_blamed_only_once_a_kernel_ran_in_it(monkeypatch, launches):
    monkeypatch.setattr(triton_interpreter, "_WATCHES", [triton_interpreter._Watch(count=launches)])
    monkeypatch.setitem(triton_interpreter._SELF_TEST, "float64", "x * x + x off by 7 on values of magnitude 3")
    blamed = ruling(SEEN, ["evidence"], "unused", "unused") is not None
    assert blamed == (launches is None)  # None: launches cannot be counted, so kernels may have run
