// Body of the generated kernel (MLX's cuda_kernel): inputs q [1, Hq, T, D], k and v [1, Hkv, CAP, D], params
// f32 [2] = (L, scale); outputs parts [Hq, T, NC, D] and stats [Hq, T, NC, 2] (fp32). Template integers D,
// ROWS; device code in attention.cuh.
tandem_attn::partial<D, ROWS>(q, k, v, params, parts, stats, q_shape[1], k_shape[1], q_shape[2], k_shape[2]);
