"""The live sides: our reference and our port captured over a schedule (capture.py), a port of
the protocol loaded from `module:factory` (ports.py), the planted faults (faults.py,
path_faults.py), our forward-parity fixtures (fixtures.py), re-running the reference's layer
for local vs inherited error (dump_locate.py), our model loaded from the command line's flags
(model_input.py), a side named by a spec and the checks that sides agree (side_spec.py), the
port's description (runinfo.py), REFERENCE_RULES (reference_rules.py), needle-rs's fixture
regenerated (needle_rs_regen.py), and `judge`, one whole check as a call (judge.py).

May import: ladder/engine/, ladder/formats/, ladder/model/, bounded/, and reference/, port/ and
kernels/ (this is the first layer that does). Not cli/, sweep/ or pytest_plugin/.
"""
