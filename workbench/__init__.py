"""Research workbench for GPU scheduling of LLM token generation.

``workbench.run(model, strategy, tokens=..., backend=...) -> Run`` is the library entry point;
``workbench.backends()`` lists the registered backends.
"""

from .api import run
from .exec.backend import backends

__version__ = "0.1.0"

__all__ = ["__version__", "backends", "run"]
