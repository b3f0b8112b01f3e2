"""The exceptions a command maps to exit status 2 (bad input: the message names the value and
the limit), gathered from every package that raises one.
"""
from __future__ import annotations

from ladder.engine.compare import CompareError
from ladder.engine.rules import RulesError
from ladder.sides import fixtures
from ladder.sides.model_input import LadderInputError

def input_errors() -> tuple:
    """Every exception that means bad input (exit status 2, one line), from every layer."""
    from port.model import StepError
    from port.state import StateError
    from reference.config import ConfigError
    from reference.decode import DecodeInputError
    from reference.params import ParamsError
    from bounded.io import InputFileError
    errs = [LadderInputError, ConfigError, ParamsError, DecodeInputError, StepError, InputFileError,
            StateError, RulesError, CompareError, fixtures.FixtureError, OSError]
    for mod, name in (("ladder.v41.sides", "V41FixtureError"), ("port.v41.attn", "AttnV41Error"),
                      ("reference.v41.attn", "AttnV41Error")):
        try:
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    for mod, name in (("reference.cact", "CactFormatError"), ("port.cq", "CqError"),
                      ("ladder.engine.archive", "ArchiveError"), ("ladder.formats.needle_rs", "NeedleRsError"),
                      ("ladder.formats.namemap", "NameMapError"), ("ladder.model.geometry", "GeometryError"),
                      ("ladder.sides.ports", "PortLoadError"), ("ladder.sweep.grid", "SweepError"),
                      ("ladder.sides.judge", "JudgeError")):
        try:
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)
