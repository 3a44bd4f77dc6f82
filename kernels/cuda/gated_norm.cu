// Body of the generated kernel (MLX's cuda_kernel, built strided): inputs o [B, T, H, D] (f32), z [B, T, H·D]
// (bf16, f16 or f32, any strides), w [D] (f32); output y [B, T, H·D] in z's dtype. Template integer EPS: eps's
// fp32 bits. Device code in rms_norm.cuh (`gated_norm`).
tandem_norm::gated_norm(o, o_shape, o_strides, z, z_strides, w, w_strides, y, __int_as_float(EPS));
