// Body of the generated kernel (MLX's cuda_kernel, built strided): inputs qg [B, T, Hq·2D] (each query head's
// D features then its gate's), k and v [B, T, Hkv·D] (bf16, f16 or f32, any strides), qw and kw [D] (fp32
// norm scales), pos [B] (int32: row b's first position); outputs q [B, Hq, T, D], k_rot and v_heads
// [B, Hkv, T, D] in the inputs' dtype. Template integers ROPE_DIMS, EPS and BASE (the fp32 bits of eps and of
// log2 of RoPE's base). Device code in attention_front.cuh (`front`).
tandem_front::front(qg, qg_shape, qg_strides, k, k_shape, k_strides, v, v_strides, qw, qw_shape, qw_strides, kw,
                    kw_strides, pos, pos_strides, q, k_rot, v_heads, ROPE_DIMS, __int_as_float(EPS),
                    __int_as_float(BASE));
