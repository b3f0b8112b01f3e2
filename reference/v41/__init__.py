"""DeepSeek-V4.1 attention, restated plainly against the official `inference/model.py`.

`config` is the description (official ModelArgs fields, validation, layer roles, weight
names) that port/v41 may read; `attn` (with `index`, `quant`, `rope`) is the math, which the
port never imports. Nothing is imported here, so reading the description loads no math.
"""
