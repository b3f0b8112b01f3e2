"""Triton kernels, each beside a torch implementation of the same contract. Imports neither
reference/ nor port/."""
