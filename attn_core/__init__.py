"""attn_core: what both twins share, with no dependency but numpy (no jax, no torch).

* ``generations``: the generation table (ids, families, parents, entries);
* ``oracle``: float64 attention for every family (dense, GQA, causal with offsets, ragged, paged, merge);
* ``paging``: paged-KV builders (dense cache -> pools + block table);
* ``formats``: numpy reference of the fp8 E4M3 and NVFP4 formats;
* ``splits``: the reference's split-KV heuristic and its constants;
* ``launches``: the launch vocabulary both twins declare for layer 2 (``Launch``, the sm_90 occupancy).

``import attn_core`` loads only this package's modules and numpy.
"""

from . import formats, generations, launches, oracle, paging, splits

__all__ = ["formats", "generations", "launches", "oracle", "paging", "splits"]
