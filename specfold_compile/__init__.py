"""specfold-compile: a torch.compile backend that folds multi-branch speculative verification of
block-diffusion LMs (``torch.compile(model, backend="specfold")``)."""

__version__ = "0.1.0"

from .backend import SpecFoldBackend  # noqa: E402
from .ops.stats import collect_stats  # noqa: E402
from .serving import Engine, RequestParams, generate  # noqa: E402  (one prompt: decoding.generate)

__all__ = ["generate", "Engine", "RequestParams", "SpecFoldBackend", "collect_stats", "__version__"]
