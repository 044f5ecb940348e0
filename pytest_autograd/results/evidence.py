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
    # Index of the element the report names, in the tensors' own shape; None: the largest |got - expected|.
    worst: tuple = None
    kind: str = "tensor"
    # How ``worst`` was chosen, in words a picture can show.
    ranking: str = "the largest |got - expected| relative to its tolerance (atol + rtol x |expected|)"

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
