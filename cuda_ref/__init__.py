"""cuda_ref: our own CUDA C++ twins of the reference's kernel generations (v1_naive ... v6_splitkv so far).

Public API: ``attention`` (torch BHND CUDA tensors in, float32 BHND out), ``generations`` (ids built),
``choose_splits`` (v6's split heuristic, mirrored from C++) and ``REFERENCE_NUM_SM``. Importing works on
any machine; the first kernel call builds one JIT extension (``cuda_ref.build``) and needs a CUDA GPU.
"""

from .api import REFERENCE_NUM_SM, attention, choose_splits, generations

__all__ = ["attention", "generations", "choose_splits", "REFERENCE_NUM_SM"]
