"""What inductor does once per process before its first compile or cache load,
answered from our cache where it can be: its vector-ISA probe
(``inductor_isa.py``) and the keys of its own source (``inductor_keys.py``).
Every place that compiles with inductor calls ``prepare_inductor`` first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .cache import current_cache
from .inductor_isa import probe_vector_isas
from .inductor_keys import answer_source_keys


def prepare_inductor(example_inputs: Sequence[Any]) -> None:
    """Inductor's per-process start for a compile on ``example_inputs``, its
    answers read from (and recorded in) the current cache."""
    cache = current_cache()
    probe_vector_isas(cache, example_inputs)
    answer_source_keys(cache)
