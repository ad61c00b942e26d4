"""pallas_attn: FlashAttention's generations as JAX/Pallas GPU kernels, plus frontier kernels.

Public API: ``attention``, ``paged_attention``, ``generations``; the oracle lives in
``pallas_attn.reference`` and the generation table in ``pallas_attn.registry``.
"""

from .api import attention, generations, paged_attention

__all__ = ["attention", "paged_attention", "generations"]
__version__ = "0.1.0"
