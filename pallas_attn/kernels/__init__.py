"""One module per generation (Triton lowering); shared pieces in ``common``."""
