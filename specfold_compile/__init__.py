"""specfold-compile: a torch.compile backend that folds multi-branch speculative verification of
block-diffusion LMs (``torch.compile(model, backend="specfold")``)."""

__version__ = "0.1.0"

from .backend import SpecFoldBackend  # noqa: E402
from .ops.stats import collect_stats  # noqa: E402
from .decoding import generate  # noqa: E402

__all__ = ["generate", "SpecFoldBackend", "collect_stats", "__version__"]
