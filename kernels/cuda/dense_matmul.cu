// Body of the generated kernel (MLX's cuda_kernel): inputs x [..., K] (XD axes, row-major: M rows of K, the
// leading axes flattened here rather than by a reshape op), w [N, K] (both bf16 or both f16); output y [..., N].
// Template integers R, KS, U, S, XD; device code in dense_matmul.cuh.
int rows = 1;
#pragma unroll
for (int i = 0; i < XD - 1; ++i) rows *= x_shape[i];
tandem_dmm::dmv<R, KS, U, S>(x, w, y, rows, w_shape[0], x_shape[XD - 1]);
