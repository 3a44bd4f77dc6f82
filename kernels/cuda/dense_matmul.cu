// Body of the generated kernel (MLX's cuda_kernel): inputs x [M, K], w [N, K] (both bf16 or both f16);
// output y [M, N]. Template integers R, KS, U; device code in dense_matmul.cuh.
tandem_dmm::dmv<R, KS, U>(x, w, y, x_shape[0], w_shape[0], x_shape[1]);
