"""Build (or load the cached build of) the cuda_ref extension and print how long it took.

    PYTHONPATH=. python scripts/build_cuda_ref.py

The first call in a fresh build directory compiles (minutes); a second process shows the cached load time.
Timing the CUDA generations is compare's job: ``python -m compare run --config time_generations --impl 'cuda:*'``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    t0 = time.perf_counter()
    from cuda_ref import build

    build.load()
    import torch

    print(f"extension ready in {time.perf_counter() - t0:.1f} s (arch {build.arch()}, {torch.cuda.get_device_name()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
