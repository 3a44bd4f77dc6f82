// Body of the generated kernel (MLX's cuda_kernel): inputs q, k [B, T, HK, DK], v [B, T, HV, DV], g, beta
// [B, T, HV], state [B, HV, DV, DK] (all fp32); outputs y [B, T, HV, DV] and states [T, B, HV, DV, DK].
// Template integers DK, DV; device code in gated_delta.cuh.
tandem_gdn::recurrence<DK, DV>(q, k, v, g, beta, state, y, states, q_shape[0], q_shape[1], q_shape[2], v_shape[2]);
