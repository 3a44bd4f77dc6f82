// Body of the generated kernel (MLX's cuda_kernel): inputs x [M, K], w [N, K*BITS/32] (uint32), scales and
// biases [N, K/64]; output y [M, N]. Template integers BITS, R, KS, U, P; device code in quantized_matmul.cuh.
tandem_qmm::qmv<BITS, R, KS, U, P>(x, w, scales, biases, y, x_shape[0], w_shape[0], x_shape[1]);
