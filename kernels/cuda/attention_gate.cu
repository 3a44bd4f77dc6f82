// Body of the generated kernel (MLX's cuda_kernel, built strided): inputs o [B, Hq, T, D] (the attention's
// output, any strides) and qg [B, T, Hq·2D] (the query projection, whose second D features of each head are
// its gate); output y [B, T, Hq·D] = o · sigmoid(gate), in o's dtype. Device code in attention_front.cuh (`gate`).
tandem_front::gate(o, o_shape, o_strides, qg, qg_strides, y);
