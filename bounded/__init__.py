"""Bounded reading of files the project did not write, and sizes of memory: the one leaf every
package imports (reference/, port/, kernels/, ladder/) and that imports nothing of the project.

    io.py           regular files only, capped reads, JSON and TOML parsed under bounds
    safetensors.py  safetensors framing checked before allocating; its dtype table
    size.py         the default memory budget, '2G'-style sizes, byte counts printed
"""
