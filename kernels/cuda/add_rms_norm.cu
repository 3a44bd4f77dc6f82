// Body of the generated kernel (MLX's cuda_kernel): inputs h, m [..., D] (the residual and what is added to
// it), w [D] (fp32); outputs hs = h + m and y = the norm of hs, both like h. Template integer EPS: eps's fp32
// bits. Device code in rms_norm.cuh.
tandem_norm::rms_norm<true>(h, m, w, hs, y, w_shape[0], __int_as_float(EPS));
