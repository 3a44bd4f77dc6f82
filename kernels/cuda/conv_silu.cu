// Body of the generated kernel (MLX's cuda_kernel): inputs x [B, K - 1 + T, C], w [C, K, 1] (fp32); output
// y [B, T, C] (fp32). Template integer K; device code in conv_silu.cuh.
tandem_conv::conv_silu<K>(x, w, y, x_shape[0], x_shape[1], x_shape[2]);
