"""compare: runs pallas_attn, cuda_ref and the peers on the same workloads; reports agreement, speed and
roofline fraction. Entry point: ``python -m compare {predict,run,report}``."""
