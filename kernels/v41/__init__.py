"""DeepSeek-V4.1 kernels: `sparse_attn` over [window rows | compressed rows] with a per-head
sink (Triton kernel and torch twin). Imports neither reference/ nor port/."""
