// Body of the generated kernel (MLX's cuda_kernel): inputs parts [Hq, T, NC, D] and stats [Hq, T, NC, 2]
// (fp32, from attention_partial.cu); output o [1, Hq, T, D] in q's dtype. Device code in attention.cuh.
tandem_attn::combine(parts, stats, o, parts_shape[2], parts_shape[3]);
