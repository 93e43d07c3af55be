"""The speculative engine: Engine (greedy baseline, verify, commit on the two-slot executor), and the registered
strategies it runs (mtplab.engine.strategies): commit strategies, drafters, step schedules, acceptance rules."""

from mtplab.engine import acceptance, commits, drafters, k_policies, sampling, schedules  # noqa: F401 - the built-in strategies register
