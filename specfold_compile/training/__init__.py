"""Training our small Fast-dLLM-v2-layout block-diffusion LM on the synthetic tasks (see ``train.py``)."""
