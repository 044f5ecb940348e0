// Shared declarations for the autograd_ext linear operators.
//
//   linear_forward(input, weight, bias?)  -> input @ weight.T + bias
//   linear_backward(grad_out, input, weight, output_mask)
//       -> (grad_input, grad_weight, grad_bias)
//
// `input` may have any number of leading batch dimensions (including zero
// rows); the kernels work on the flattened (rows, in_features) view.
// Outputs that `output_mask` switches off are returned as empty 1-D tensors
// (shape [0]) rather than undefined tensors, because undefined outputs do not
// survive fake-tensor tracing and torch.compile.
//
// This header is included by both the C++ (.cpp) and the CUDA (.cu) sources,
// so it only uses host-side ATen APIs.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>

namespace autograd_ext {

using LinearGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// ---------------------------------------------------------------------------
// Argument checks and shape helpers shared by every backend.
// ---------------------------------------------------------------------------

inline bool has_bias(const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined();
}

// Rejects malformed calls early with messages that name the operator, so a
// shape bug in user code does not surface as an out-of-bounds kernel read.
inline void check_linear_args(
    const char* op,
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least 1 dimension");
  TORCH_CHECK(
      weight.dim() == 2, op, ": weight must be 2-D (out_features, in_features), got ",
      weight.sizes());
  TORCH_CHECK(
      input.size(-1) == weight.size(1), op, ": input.size(-1) (", input.size(-1),
      ") must equal weight.size(1) (", weight.size(1), ")");
  TORCH_CHECK(
      input.scalar_type() == weight.scalar_type(), op,
      ": input and weight must have the same dtype, got ", input.scalar_type(),
      " and ", weight.scalar_type());
  TORCH_CHECK(
      input.device() == weight.device(), op,
      ": input and weight must be on the same device, got ", input.device(),
      " and ", weight.device());
  if (has_bias(bias)) {
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == weight.size(0), op,
        ": bias must have shape (out_features,) = (", weight.size(0), "), got ",
        bias->sizes());
    TORCH_CHECK(
        bias->scalar_type() == weight.scalar_type(), op,
        ": bias must have the same dtype as weight");
    TORCH_CHECK(
        bias->device() == weight.device(), op,
        ": bias must be on the same device as weight");
  }
}

inline void check_backward_args(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight) {
  check_linear_args("linear_backward", input, weight, std::nullopt);
  TORCH_CHECK(
      grad_out.dim() == input.dim(),
      "linear_backward: grad_out must have the same number of dims as input");
  for (int64_t d = 0; d + 1 < input.dim(); ++d) {
    TORCH_CHECK(
        grad_out.size(d) == input.size(d),
        "linear_backward: grad_out batch dims ", grad_out.sizes(),
        " do not match input ", input.sizes());
  }
  TORCH_CHECK(
      grad_out.size(-1) == weight.size(0),
      "linear_backward: grad_out.size(-1) must equal out_features");
  TORCH_CHECK(
      grad_out.scalar_type() == input.scalar_type(),
      "linear_backward: grad_out must have the same dtype as input");
  TORCH_CHECK(
      grad_out.device() == input.device(),
      "linear_backward: grad_out must be on the same device as input");
}

// Number of rows once all leading dims are flattened. Computed explicitly
// (instead of reshape(-1, n)) so that zero-sized tensors stay unambiguous.
inline int64_t flat_rows(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// (rows, features) contiguous view or copy: the kernels assume row-major data.
inline at::Tensor as_contiguous_2d(const at::Tensor& t) {
  return t.reshape({flat_rows(t), t.size(-1)}).contiguous();
}

// Output shape of the forward pass: input's leading dims + out_features.
inline std::vector<int64_t> forward_output_shape(
    const at::Tensor& input, int64_t out_features) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = out_features;
  return shape;
}

// Placeholder returned for gradients the caller did not ask for.
inline at::Tensor skipped_grad(const at::Tensor& like) {
  return at::empty({0}, like.options());
}

// ---------------------------------------------------------------------------
// Backend entry points.
// ---------------------------------------------------------------------------

at::Tensor linear_forward_cpu(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias);

LinearGrads linear_backward_cpu(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight,
    std::array<bool, 3> output_mask);

at::Tensor linear_forward_cuda(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias);

LinearGrads linear_backward_cuda(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight,
    std::array<bool, 3> output_mask);

} // namespace autograd_ext
