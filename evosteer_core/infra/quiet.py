"""Keep transformers' routine chatter out of the terminal while a model is built or loaded.

Every training task loads the backbone again, and transformers draws a "Loading weights"
progress bar each time; PEFT, when it wraps the model, reads an attribute that transformers
has deprecated, which prints a ``FutureWarning``. Neither says anything the person running
the pipeline can act on, and over a run they add up to dozens of lines. Inside
:func:`quiet_transformers` transformers' progress bars are off and every Python warning is
collected instead of printed, then logged once per distinct message (at INFO, on this
module's logger), so a run's log file keeps it (docs/pipeline.md, "The terminal and the log
file").
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_log = logging.getLogger(__name__)


@contextmanager
def quiet_transformers(doing: str) -> Iterator[None]:
    """Run the block with transformers' progress bars off (the Hugging Face hub's too, which
    transformers switches with its own) and Python warnings collected, then log each distinct
    warning as ``while <doing>: <category>: <message>``. The bars' previous setting is
    restored afterwards, also when the block raises."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hub_bars_off = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()
            if hub_bars_off:  # enable_progress_bar switched the hub's bars on as well
                disable_progress_bars()
    for line in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
        _log.info("while %s: %s", doing, line)
