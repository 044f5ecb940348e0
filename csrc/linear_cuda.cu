// CUDA kernels for the autograd_ext linear operators.
//
// Everything is built from one kernel, a shared-memory tiled GEMM
//
//     C[M, N] = A[M, K] @ B[K, N]  (+ bias[N])      all row-major, contiguous
//
// plus a small column-sum kernel for grad_bias. The three products of a linear
// layer map onto it as
//
//     forward      out    = x       @ W.T     A = x,        B = W.T (copy)
//     backward     grad_x = grad_y  @ W       A = grad_y,   B = W
//                  grad_W = grad_y.T @ x      A = grad_y.T (copy), B = x
//
// The two transposed operands are materialised as contiguous copies. That
// costs one extra pass over a matrix (O(n^2) memory traffic next to O(n^3)
// arithmetic) and keeps the kernel to a single, easy-to-follow layout.
//
// How the GEMM kernel is organised (numbers for float; double uses 64x64):
//
//   * Each thread block computes a BM x BN = 128 x 128 tile of C with 256
//     threads, so every thread owns a TM x TN = 8 x 8 micro-tile held in
//     registers ("register blocking"): per k step it reads 8 values of A and
//     8 of B from shared memory and performs 64 fused multiply-adds.
//   * K is walked in slices of BK = 8. A slice of A (BM x BK) and of B
//     (BK x BN) is staged in shared memory. A is stored transposed
//     (As[k][m]) so that both operands are read along contiguous rows.
//   * Shared memory is double buffered: while the block computes on slice t,
//     each thread has already issued the global loads for slice t + 1 into
//     registers, and writes them to the other buffer afterwards. One
//     __syncthreads per slice is enough.
//   * A thread's 8 rows are two groups of 4 consecutive rows, 64 rows apart
//     (same for columns). Four consecutive floats are one 16-byte shared
//     memory load, and neighbouring threads read neighbouring 16-byte words,
//     which avoids bank conflicts.
//   * Half and bfloat16 inputs are converted to float when they are staged in
//     shared memory and accumulated in float (at::opmath_type); the result is
//     rounded once, in the epilogue. double stays double throughout.
//   * Every global load and store is bounds-checked, so M, N and K need not
//     be multiples of the tile sizes; out-of-range elements load as zero.
#include "linear.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream (aliases c10::cuda)
#include <torch/library.h>

#include <limits>

namespace autograd_ext {
namespace {

// ---------------------------------------------------------------------------
// Tile configuration, chosen by the accumulation type.
// ---------------------------------------------------------------------------

template <typename acc_t>
struct TileConfig;

// float accumulation (float, half, bfloat16 inputs): 128x128 tile, 8x8 per thread.
template <>
struct TileConfig<float> {
  static constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
};

// double: half the tile edge so the 4x4 micro-tile of doubles fits in registers.
template <>
struct TileConfig<double> {
  static constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;
};

// Copies one 16-byte vector (4 floats or 2 doubles) from shared memory into
// registers with a single wide load.
__device__ __forceinline__ void load_vec16(const float* src, float* dst) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  dst[0] = v.x;
  dst[1] = v.y;
  dst[2] = v.z;
  dst[3] = v.w;
}

__device__ __forceinline__ void load_vec16(const double* src, double* dst) {
  const double2 v = *reinterpret_cast<const double2*>(src);
  dst[0] = v.x;
  dst[1] = v.y;
}

// ---------------------------------------------------------------------------
// Tiled GEMM: C = A @ B (+ bias), A (M, K), B (K, N), C (M, N), row-major.
// Grid: x over row tiles of C, y over column tiles of C.
// ---------------------------------------------------------------------------

template <typename scalar_t, typename acc_t, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
gemm_tiled_kernel(
    const scalar_t* __restrict__ A,
    const scalar_t* __restrict__ B,
    const scalar_t* __restrict__ bias,  // nullptr: no bias
    scalar_t* __restrict__ C,
    int M,
    int N,
    int K) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kVec = 16 / sizeof(acc_t);  // elements per 16-byte smem load
  constexpr int kPad = 4;                   // breaks bank conflicts on As stores
  // A thread's TM rows are TM / kVec groups of kVec consecutive rows; the
  // groups are kRowGroupStride rows apart. Same for columns.
  constexpr int kRowGroupStride = BM / (TM / kVec);
  constexpr int kColGroupStride = BN / (TN / kVec);
  // Global -> shared staging: every thread loads kALoads elements of the A
  // slice and kBLoads elements of the B slice.
  constexpr int kALoads = BM * BK / kThreads;
  constexpr int kBLoads = BK * BN / kThreads;
  constexpr int kARowStep = kThreads / BK;
  constexpr int kBRowStep = kThreads / BN;
  static_assert(TM % kVec == 0 && TN % kVec == 0, "micro-tile must be whole vectors");
  static_assert(kThreads % BK == 0 && kThreads % BN == 0, "staging layout");
  static_assert(kALoads * kThreads == BM * BK && kBLoads * kThreads == BK * BN,
                "staging must cover the tile exactly");

  __shared__ __align__(16) acc_t As[2][BK][BM + kPad];  // transposed: As[k][m]
  __shared__ __align__(16) acc_t Bs[2][BK][BN + kPad];  // Bs[k][n]

  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN);  // which column groups this thread owns
  const int ty = tid / (BN / TN);  // which row groups this thread owns
  const int block_row = blockIdx.x * BM;
  const int block_col = blockIdx.y * BN;

  // Staging coordinates. Neighbouring threads read neighbouring k for A and
  // neighbouring n for B: both are the contiguous axis, so loads coalesce.
  const int a_k = tid % BK;
  const int a_row = tid / BK;
  const int b_col = tid % BN;
  const int b_k = tid / BN;

  acc_t a_stage[kALoads];
  acc_t b_stage[kBLoads];

  // Global memory -> registers, for the K slice starting at k0.
  auto fetch_slice = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int row = block_row + a_row + i * kARowStep;
      const int k = k0 + a_k;
      a_stage[i] = (row < M && k < K)
          ? static_cast<acc_t>(A[static_cast<int64_t>(row) * K + k])
          : acc_t(0);
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int k = k0 + b_k + i * kBRowStep;
      const int col = block_col + b_col;
      b_stage[i] = (k < K && col < N)
          ? static_cast<acc_t>(B[static_cast<int64_t>(k) * N + col])
          : acc_t(0);
    }
  };

  // Registers -> shared memory buffer `buf`.
  auto store_slice = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kALoads; ++i) As[buf][a_k][a_row + i * kARowStep] = a_stage[i];
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) Bs[buf][b_k + i * kBRowStep][b_col] = b_stage[i];
  };

  acc_t acc[TM][TN] = {};
  acc_t a_frag[TM];
  acc_t b_frag[TN];

  const int num_slices = (K + BK - 1) / BK;
  if (num_slices > 0) {
    fetch_slice(0);
    store_slice(0);
  }
  __syncthreads();

  for (int s = 0; s < num_slices; ++s) {
    const int cur = s & 1;
    const bool has_next = s + 1 < num_slices;
    // Issue the next slice's global loads now; they complete while we compute.
    if (has_next) fetch_slice((s + 1) * BK);

#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
      for (int g = 0; g < TM / kVec; ++g)
        load_vec16(&As[cur][kk][g * kRowGroupStride + ty * kVec], &a_frag[g * kVec]);
#pragma unroll
      for (int g = 0; g < TN / kVec; ++g)
        load_vec16(&Bs[cur][kk][g * kColGroupStride + tx * kVec], &b_frag[g * kVec]);
      // Outer product of the two fragments into the register micro-tile.
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }

    // The other buffer was last read in iteration s - 1, which every thread
    // finished before the __syncthreads that ended it, so it is free now.
    if (has_next) store_slice(cur ^ 1);
    __syncthreads();
  }

  // Epilogue: add bias, round to the output type once, bounds-checked store.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int row = block_row + (i / kVec) * kRowGroupStride + ty * kVec + i % kVec;
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int col = block_col + (j / kVec) * kColGroupStride + tx * kVec + j % kVec;
      if (col >= N) continue;
      acc_t value = acc[i][j];
      if (bias != nullptr) value += static_cast<acc_t>(bias[col]);
      C[static_cast<int64_t>(row) * N + col] = static_cast<scalar_t>(value);
    }
  }
}

// ---------------------------------------------------------------------------
// Column sums (grad_bias): out[n] = sum_m G[m, n], G (M, N) row-major.
// A block covers kCols columns; its kRows thread rows stride down the matrix
// (coalesced reads along each row) and are then reduced in shared memory.
// ---------------------------------------------------------------------------

constexpr int kSumCols = 32;
constexpr int kSumRows = 8;

template <typename scalar_t>
__global__ void __launch_bounds__(kSumCols * kSumRows)
column_sum_kernel(const scalar_t* __restrict__ G, scalar_t* __restrict__ out, int64_t M, int64_t N) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kSumRows][kSumCols + 1];

  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  acc_t sum = 0;
  if (col < N) {
    for (int64_t row = threadIdx.y; row < M; row += kSumRows) sum += static_cast<acc_t>(G[row * N + col]);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();

  if (threadIdx.y == 0 && col < N) {
    acc_t total = 0;
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) total += partial[r][threadIdx.x];
    out[col] = static_cast<scalar_t>(total);
  }
}

// ---------------------------------------------------------------------------
// Host-side launchers.
// ---------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// C = A @ B (+ bias). A (M, K) and B (K, N) must be contiguous, same dtype.
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  TORCH_INTERNAL_ASSERT(a.is_contiguous() && b.is_contiguous());
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(
      M <= std::numeric_limits<int>::max() && N <= std::numeric_limits<int>::max() &&
          K <= std::numeric_limits<int>::max(),
      "autograd_ext: matrix dimensions must fit in int32, got M=", M, " N=", N, " K=", K);

  at::Tensor c = at::empty({M, N}, a.options());
  if (M == 0 || N == 0) return c;  // nothing to launch; K == 0 is handled by the kernel

  const at::Tensor bias_c = has_bias(bias) ? bias->contiguous() : at::Tensor();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "autograd_ext_gemm", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using Cfg = TileConfig<acc_t>;
    constexpr int kThreads = (Cfg::BM / Cfg::TM) * (Cfg::BN / Cfg::TN);
    const int64_t col_tiles = ceil_div(N, Cfg::BN);
    TORCH_CHECK(col_tiles <= 65535, "autograd_ext: N = ", N, " is too large for the grid");
    const dim3 grid(static_cast<unsigned>(ceil_div(M, Cfg::BM)), static_cast<unsigned>(col_tiles));

    gemm_tiled_kernel<scalar_t, acc_t, Cfg::BM, Cfg::BN, Cfg::BK, Cfg::TM, Cfg::TN>
        <<<grid, kThreads, 0, stream>>>(
            a.data_ptr<scalar_t>(),
            b.data_ptr<scalar_t>(),
            bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr,
            c.data_ptr<scalar_t>(),
            static_cast<int>(M),
            static_cast<int>(N),
            static_cast<int>(K));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return c;
}

// out[n] = sum over rows of g (M, N), g contiguous.
at::Tensor column_sum(const at::Tensor& g) {
  const int64_t M = g.size(0), N = g.size(1);
  at::Tensor out = at::empty({N}, g.options());
  if (N == 0) return out;

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "autograd_ext_column_sum", [&] {
    const dim3 block(kSumCols, kSumRows);
    const dim3 grid(static_cast<unsigned>(ceil_div(N, kSumCols)));
    column_sum_kernel<scalar_t><<<grid, block, 0, stream>>>(g.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), M, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

} // namespace

// ---------------------------------------------------------------------------
// Operator implementations.
// ---------------------------------------------------------------------------

at::Tensor linear_forward_cuda(
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias) {
  check_linear_args("linear_forward", input, weight, bias);
  TORCH_CHECK(input.is_cuda(), "linear_forward: expected CUDA tensors");
  const c10::cuda::CUDAGuard guard(input.device());

  const at::Tensor x = as_contiguous_2d(input);        // (rows, in)
  const at::Tensor w_t = weight.t().contiguous();      // (in, out)
  return gemm(x, w_t, bias).view(forward_output_shape(input, weight.size(0)));
}

LinearGrads linear_backward_cuda(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight,
    std::array<bool, 3> output_mask) {
  check_backward_args(grad_out, input, weight);
  TORCH_CHECK(input.is_cuda(), "linear_backward: expected CUDA tensors");
  const c10::cuda::CUDAGuard guard(input.device());

  const at::Tensor go = as_contiguous_2d(grad_out);  // (rows, out)

  // grad_input (rows, in) = grad_out (rows, out) @ W (out, in)
  at::Tensor grad_input = output_mask[0]
      ? gemm(go, weight.contiguous(), std::nullopt).view(input.sizes())
      : skipped_grad(input);
  // grad_weight (out, in) = grad_out.T (out, rows) @ x (rows, in)
  at::Tensor grad_weight = output_mask[1]
      ? gemm(go.t().contiguous(), as_contiguous_2d(input), std::nullopt)
      : skipped_grad(input);
  // grad_bias (out,) = column sums of grad_out
  at::Tensor grad_bias = output_mask[2] ? column_sum(go) : skipped_grad(input);
  return {grad_input, grad_weight, grad_bias};
}

} // namespace autograd_ext

TORCH_LIBRARY_IMPL(autograd_ext, CUDA, m) {
  m.impl("linear_forward", &autograd_ext::linear_forward_cuda);
  m.impl("linear_backward", &autograd_ext::linear_backward_cuda);
}
