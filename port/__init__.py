"""The accelerated needle v2 port (V2Model, V2State, CqWeight, the AttnV41-style runtime).

May import from reference/ only config, params and cact (DESIGN.md, "Layout").
"""
