"""Importing litellm without reaching the network.

litellm downloads its model cost map when it is imported (and retries in the background)
unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set. The package sets that variable for the
process only here, right before the first import of litellm, and only when the host has not
set it: importing :mod:`memory_pipelines` changes no environment variable, and an
application that wants litellm's remote cost map sets ``LITELLM_LOCAL_MODEL_COST_MAP=False``
before litellm is first imported.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

COST_MAP_VAR = "LITELLM_LOCAL_MODEL_COST_MAP"


def import_litellm() -> ModuleType:
    """Return the litellm module, importing it now if needed (with the bundled cost map
    unless the host chose otherwise). Raises ImportError when litellm is not installed."""
    module = sys.modules.get("litellm")
    if module is not None:
        return module
    os.environ.setdefault(COST_MAP_VAR, "True")
    import litellm

    return litellm
