// CPU kernels for the autograd_ext linear operators.
//
// The CPU path is the readable reference: every product is one ATen call
// (mm / addmm dispatch to the BLAS that PyTorch was built with), so the
// interesting work is only the shape handling shared with the CUDA path.
#include "linear.h"

#include <torch/library.h>

namespace autograd_ext {

at::Tensor linear_forward_cpu(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias) {
  check_linear_args("linear_forward", input, weight, bias);
  const at::Tensor x = as_contiguous_2d(input);  // (rows, in)
  const at::Tensor w = weight.contiguous();      // (out, in)

  // out = x @ w.T (+ bias broadcast over rows).
  const at::Tensor out = has_bias(bias)
      ? at::addmm(bias->contiguous(), x, w.t())
      : at::mm(x, w.t());
  return out.view(forward_output_shape(input, weight.size(0)));
}

LinearGrads linear_backward_cpu(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight,
    std::array<bool, 3> output_mask) {
  check_backward_args(grad_out, input, weight);
  const at::Tensor go = as_contiguous_2d(grad_out);  // (rows, out)

  // grad_input = grad_out @ W, reshaped back to input's shape.
  at::Tensor grad_input = output_mask[0]
      ? at::mm(go, weight.contiguous()).view(input.sizes())
      : skipped_grad(input);
  // grad_weight = grad_out.T @ input (zero when there are no rows).
  at::Tensor grad_weight = output_mask[1]
      ? at::mm(go.t(), as_contiguous_2d(input))
      : skipped_grad(input);
  // grad_bias = column sums of grad_out.
  at::Tensor grad_bias = output_mask[2] ? go.sum(0) : skipped_grad(input);
  return {grad_input, grad_weight, grad_bias};
}

} // namespace autograd_ext

TORCH_LIBRARY_IMPL(autograd_ext, CPU, m) {
  m.impl("linear_forward", &autograd_ext::linear_forward_cpu);
  m.impl("linear_backward", &autograd_ext::linear_backward_cpu);
}
