// Body of the generated kernel (MLX's cuda_kernel): inputs x [..., K] (XD axes, row-major: M rows of K, the
// leading axes flattened here rather than by a reshape op), w [N, K*BITS/32] (uint32), scales and biases
// [N, K/64]; output y [..., N]. Template integers BITS, R, KS, U, P, S, XD; device code in quantized_matmul.cuh.
int rows = 1;
#pragma unroll
for (int i = 0; i < XD - 1; ++i) rows *= x_shape[i];
tandem_qmm::qmv<BITS, R, KS, U, P, S>(x, w, scales, biases, y, rows, w_shape[0], x_shape[XD - 1]);
