"""Files other implementations write, read as ladders: needle-rs's fixture (needle_rs.py),
name maps from another implementation's point names to ours (namemap.py, the shipped ones in
maps/), and safetensors recordings in foreign names read through a map (foreign.py). Our own
trace archive is the engine's (ladder/engine/archive.py); our forward-parity fixtures hold the
reference's config and parameters and live with the sides (ladder/sides/fixtures.py).

May import: bounded/, ladder/model/ and ladder/engine/; never reference/, port/ or kernels/.
A new foreign format goes here, as one module with a bounded reader.
"""
