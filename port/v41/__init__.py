"""The DeepSeek-V4.1 attention port: the AttnV41 runtime (`attn`), its per-layer weights and
per-sequence state (`state`), the compressed part (`compress`), the arithmetic helpers
(`ops`) and decode="graph" (`graph`). From reference/ it reads only reference.v41.config.
"""
