"""Ops whose native code crashes the process, as kernels do: reading memory they do not own.

A real kernel that reads past a tensor's end or with the wrong strides
segfaults only where the address happens to be unmapped; these read address
0 with ``ctypes`` exactly where such a kernel would read out of bounds, so
the crash is certain. The checks must report each crash, never die of it:

* :class:`RowGather` -- correct: gathers rows of ``x`` by ``index`` (which it
  never checks, as a C++ kernel would not). Every input it is given holds
  valid indices; the checks that shrink ``x``'s rows while ``index`` still
  names the last row make it crash, which is noted, never failed.
* :class:`BoxPool` -- correct: pools features per box, the box's image given
  by a float, as torchvision's ``roi_align`` takes it (a ``constants=``
  argument). The checks that cut the batch while a box still names its last
  image make it crash: noted, never failed.
* :class:`StridedGradReader` -- planted bug: its backward reads
  ``grad_output`` as if it were contiguous, and crashes on any other layout.
  :class:`ContiguousGradReader` is its correct twin (``.contiguous()`` first).
* :class:`NullForward` -- planted bug: its forward crashes on every input,
  the user's own sample included.
* :class:`BatchOfOneModel` -- a model whose op (:class:`CrashesAtBatchOfOne`)
  crashes at a batch of one: the model scan runs the model at other input
  sizes in the sandbox, and notes the size it crashed at.
"""

import ctypes

import torch


def crash():
    """What an out-of-bounds read does where nothing is mapped: the process dies with SIGSEGV."""
    ctypes.string_at(0)


class RowGather(torch.autograd.Function):
    """``x[index]`` by raw row copies, with no bounds check: an index past ``x``'s rows crashes."""

    @staticmethod
    def forward(ctx, x, index):
        if index.numel() and int(index.max()) >= x.shape[0]:
            crash()  # the row pointer lands past the end of x's storage
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        grad_x = grad.new_zeros((ctx.rows,) + tuple(grad.shape[1:]))
        return grad_x.index_add(0, index, grad), None


class StridedGradReader(torch.autograd.Function):
    """``2 * x``; its backward hands ``grad_output``'s pointer to a kernel that assumes contiguous memory."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        if not grad.is_contiguous():
            crash()  # the kernel walks rows at the contiguous stride, off the end of the buffer
        return grad * 2


class ContiguousGradReader(torch.autograd.Function):
    """``2 * x``, its backward making ``grad_output`` contiguous before its kernel reads it."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if not grad.is_contiguous():
            crash()
        return grad * 2


class NullForward(torch.autograd.Function):
    """A forward that dereferences a null pointer on every call."""

    @staticmethod
    def forward(ctx, x):
        crash()
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class BoxPool(torch.autograd.Function):
    """Mean of ``features[b, :, start:end]`` for each box ``(b, start, end)`` (float, as detection boxes are, and
    unchecked, as in a C++ ROI kernel): a box naming an image past the batch crashes."""

    @staticmethod
    def forward(ctx, features, boxes):
        rows = []
        for b, start, end in boxes.tolist():
            if int(b) >= features.shape[0] or int(end) > features.shape[2]:
                crash()  # the image's pointer lands past the end of the batch
            rows.append(features[int(b), :, int(start):int(end)].mean(-1))
        ctx.save_for_backward(boxes)
        ctx.shape = features.shape
        return torch.stack(rows)

    @staticmethod
    def backward(ctx, grad):
        (boxes,) = ctx.saved_tensors
        grad_features = grad.new_zeros(ctx.shape)
        for k, (b, start, end) in enumerate(boxes.tolist()):
            width = int(end) - int(start)
            grad_features[int(b), :, int(start):int(end)] += grad[k].unsqueeze(-1) / width
        return grad_features, None


class CrashesAtBatchOfOne(torch.autograd.Function):
    """``2 * x``, with a kernel that reads past its buffer when the batch has one row (a launch grid that assumes
    at least two)."""

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] == 1:
            crash()
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class BatchOfOneModel(torch.nn.Module):
    """A model calling :class:`CrashesAtBatchOfOne`: right at the batch it is given, crashing at a batch of one."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return CrashesAtBatchOfOne.apply(self.linear(x)).tanh()
