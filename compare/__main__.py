import os

# One BLAS thread unless the user chose: the runner's float64 oracle runs small products on the host beside compile
# threads (and, with --jobs, beside other processes), where a spinning BLAS thread team waits on busy cores (session
# 26: a 0.5 s oracle took 3 s beside the compile workers, 24 s beside three other lanes). Set before numpy loads.
from .lanes import BLAS_THREAD_VARS  # noqa: E402 -- the standard library only: numpy is not loaded yet

for _var in BLAS_THREAD_VARS:
    os.environ.setdefault(_var, "1")

from .cli import main  # noqa: E402

raise SystemExit(main())
