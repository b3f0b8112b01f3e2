"""needle v2 as the harness sees it, as data: how points are named (names.py: `L03.u`,
`engram_k0`, `decode03/L03.u`), the one registry of points with their scopes and shapes
(points.py), and the geometry a ladder's shapes follow (geometry.py).

May import: nothing of the project (not even the reference, whose coarse ladder the sides hold
to this registry), so the engine and the formats can read it as a table.
"""
