"""Triton kernels, each beside a torch implementation of the same contract. Imports neither
reference/ nor port/.

Without a CUDA device a Triton kernel can only run under Triton's interpreter, which is chosen
when the kernel is defined; so it is switched on here, before any kernel module is imported,
unless the caller set TRITON_INTERPRET themselves.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
