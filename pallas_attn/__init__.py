"""pallas_attn: FlashAttention's generations as JAX/Pallas GPU kernels, plus frontier kernels.

Public API: ``dot_product_attention`` (a drop-in for ``jax.nn.dot_product_attention`` with Pallas forward and
backward; ``which_implementation`` says what a call runs), ``attention`` (dense), ``paged_attention`` (paged KV),
``paged_attention_varlen`` (paged KV, packed queries: a serving batch of chunks and decodes), ``mla_attention`` (MLA
latent decode), ``generations`` (the table, with each kernel's declared facts). The float64 oracle and paging builders
live in ``attn_core`` (numpy only).
"""

from .api import attention, generations, paged_attention, paged_attention_varlen
from .dropin import dot_product_attention, which_implementation
from .mla import mla_attention

__all__ = ["dot_product_attention", "which_implementation", "attention", "paged_attention", "paged_attention_varlen",
           "mla_attention", "generations"]
__version__ = "0.1.0"
