"""cuda_ref: our own CUDA C++ twins of the reference's kernel generations (v1_naive ... v12_mla_tc;
``cuda_ref.table()`` lists them).

Public API: ``attention`` (torch BHND CUDA tensors in, float32 BHND out, optionally the row log-sum-exp),
``paged_attention`` (paged KV pools + block table, BHND q: v7_paged and the v8 family on fp16 pools, v9_fp8 /
v10_nvfp4 on ``cuda_ref.quant`` pools), ``mla_attention`` (absorbed MLA decode over one paged latent pool:
v11_mla on CUDA cores, v12_mla_tc on tensor cores),
``table`` (the generation table, one ``CudaGeneration`` per twin row of ``attn_core.generations``, the
``generations.def`` the C++ includes),
``generations`` (ids built), ``choose_splits`` (the split-KV heuristic of ``attn_core.splits``, which the C++
mirrors), ``REFERENCE_NUM_SM`` and the KV quantizers ``quantize_fp8_e4m3`` / ``quantize_nvfp4`` (module
``cuda_ref.quant``, byte-identical to ``attn_core.formats``). Importing works on any machine and imports
neither torch nor JAX; the first kernel call builds one JIT extension (``cuda_ref.build``) and needs a CUDA GPU.
"""

from .api import REFERENCE_NUM_SM, attention, choose_splits, generations, mla_attention, paged_attention
from .quant import quantize_fp8_e4m3, quantize_nvfp4
from .table import CudaGeneration, table

__all__ = ["attention", "paged_attention", "mla_attention", "table", "CudaGeneration", "generations", "choose_splits",
           "REFERENCE_NUM_SM", "quant", "quantize_fp8_e4m3", "quantize_nvfp4"]
