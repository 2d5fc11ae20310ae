"""specfold-compile: a torch.compile backend that folds multi-branch speculative verification of
block-diffusion LMs (``torch.compile(model, backend="specfold")``)."""

__version__ = "0.1.0"
