// Body of the generated kernel (MLX's cuda_kernel): inputs qkv [B, T, 2 HK DK + HV DV] (the causal conv's
// output), qs, ks [DK] (q's and k's norm scales), g, beta [B, T, HV], state [B, HV, DV, DK] (all fp32); outputs
// y [B, T, HV, DV] and states [T, B, HV, DV, DK]. Template integers DK, DV, HK and EPS (eps's fp32 bits).
// Device code in gated_delta.cuh.
tandem_gdn::recurrence_qkv<DK, DV, HK>(qkv, qs, ks, __int_as_float(EPS), g, beta, state, y, states, qkv_shape[0],
                                       qkv_shape[1], g_shape[2]);
