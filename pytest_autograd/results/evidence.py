"""The tensors behind a failure, kept so a picture can show where it is wrong.

A failing comparison knows more than its worst element: the whole expected
and computed tensors (or Jacobians). A check attaches them to its Report as
Evidence; the plots module draws them when ``--autograd-plots`` asks.
"""

from dataclasses import dataclass


@dataclass
class Evidence:
    """Expected vs computed values of one argument or output.

    ``kind`` says what the matrices are: ``"tensor"`` (an output or a
    gradient, shaped like it) or ``"jacobian"`` (rows: output elements,
    columns: input elements).
    """

    label: str
    expected: object  # torch.Tensor, on the CPU
    got: object  # torch.Tensor of the same shape
    worst: tuple = None  # index of the worst element, in the tensors' own shape
    kind: str = "tensor"

    @classmethod
    def of(cls, label, expected, got, worst=None, kind="tensor"):
        """Detached float64 CPU copies, so later runs cannot change what is drawn."""
        import torch

        def keep(tensor):
            tensor = tensor.detach().to("cpu")
            if tensor.is_complex():
                tensor = tensor.abs()
            return tensor.to(torch.float64).clone()

        return cls(label, keep(expected), keep(got), None if worst is None else tuple(worst), kind)
