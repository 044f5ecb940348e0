// Operator schemas for the autograd_ext namespace.
//
// Only the schemas live here; kernels are attached per backend with
// TORCH_LIBRARY_IMPL in linear_cpu.cpp and linear_cuda.cu, and the fake
// (meta) kernels plus autograd formulas are registered from Python in
// reference_ops/extension.py. Keeping the definitions in one file means the
// CPU-only build and the CPU+CUDA build expose identical operators.
#include <torch/library.h>

TORCH_LIBRARY(autograd_ext, m) {
  // out = input @ weight.T + bias, input of shape (*, in_features).
  m.def(
      "linear_forward(Tensor input, Tensor weight, Tensor? bias) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Gradients of linear_forward. output_mask = which of (grad_input,
  // grad_weight, grad_bias) to compute; skipped ones come back as empty
  // tensors of shape [0].
  m.def(
      "linear_backward(Tensor grad_out, Tensor input, Tensor weight, "
      "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, "
      "Tensor grad_bias)",
      {at::Tag::pt2_compliant_tag});
}
