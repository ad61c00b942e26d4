"""pallas_attn: FlashAttention's generations as JAX/Pallas GPU kernels, plus frontier kernels.

Public API: ``attention`` (dense), ``paged_attention`` (paged KV), ``generations`` (the table, with each
kernel's declared facts). The float64 oracle and paging builders live in ``attn_core`` (numpy only).
"""

from .api import attention, generations, paged_attention

__all__ = ["attention", "paged_attention", "generations"]
__version__ = "0.1.0"
