// Body of the generated kernel (MLX's cuda_kernel, built strided): inputs prev [B, K - 1, C] and next [B, T, C]
// (bf16, f16 or f32, the same dtype, any strides), w [C, K, 1] (fp32); outputs y [B, T, C]
// (fp32), window [B, K - 1, C] and, where TANDEM_RECORD is 1, input [B, K - 1 + T, C] (the rows' dtype).
// Template integer K; TANDEM_RECORD is defined (0 or 1) in front of this body by src/kernels/conv.rs, since
// the kernel's outputs differ with it. Device code in conv_silu.cuh (`conv_window`).
#if TANDEM_RECORD
tandem_conv::conv_window<K, true>(prev, prev_strides, next, next_shape, next_strides, w, w_strides, y, window, input);
#else
tandem_conv::conv_window<K, false>(prev, prev_strides, next, next_shape, next_strides, w, w_strides, y, window, window);
#endif
