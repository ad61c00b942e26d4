"""compare.annotate_ceilings: a recorded fraction above 100% of a one-method read ceiling gets its explanation,
and nothing else in the record changes."""

import json

from compare.annotate_ceilings import annotate_lines


def _lines(frac, ds, bytes_, methods=None):
    meas = {"hbm_read_Bps": 4.0e12, **({"hbm_read_methods": methods} if methods else {})}
    ceil = {"type": "ceilings", "measured": meas, "datasheet": {"l2_mb": 60}}
    rec = {"type": "result", "metrics": {"hbm_fraction": frac, "hbm_fraction_datasheet": ds, "time_us_p50": 1.5},
           "prediction": {"basis": "measured", "measured": {"bytes": bytes_, "limiter": "HBM"}}}
    return [json.dumps(ceil) + "\n", json.dumps(rec) + "\n"]


def test_low_one_method_ceiling_is_named_and_numbers_stay():
    new, n = annotate_lines(_lines(1.13, 0.937, 4e9))
    assert n == 1 and new[0] == _lines(1.13, 0.937, 4e9)[0]
    m = json.loads(new[1])["metrics"]
    assert "113.0% of the measured HBM read ceiling (93.7% of the datasheet)" in m["hbm_fraction_note"]
    assert "torch x.sum() timed with CUDA events (4.00 TB/s)" in m["hbm_fraction_note"]
    assert (m["hbm_fraction"], m["time_us_p50"]) == (1.13, 1.5)
    assert annotate_lines(new) == (new, 0)  # idempotent


def test_other_causes_keep_the_runners_note():
    m = json.loads(annotate_lines(_lines(3.99, 3.5, 4e9))[0][1])["metrics"]  # above the datasheet: the model
    assert "above the datasheet: the model counts more bytes" in m["hbm_fraction_note"]
    m = json.loads(annotate_lines(_lines(1.2, 1.1, 8 * 2**20))[0][1])["metrics"]  # fits in L2
    assert "smaller than the L2" in m["hbm_fraction_note"]
    assert annotate_lines(_lines(0.95, 0.8, 4e9))[1] == 0  # nothing to explain
    assert annotate_lines(_lines(1.1, 0.9, 4e9, methods={"jnp_sum": {}}))[1] == 1  # still a note, the runner's


def test_fp32_peer_above_the_compute_floor_is_explained_as_tf32():
    ceil = {"type": "ceilings", "measured": {"hbm_read_Bps": 4.0e12, "hbm_read_methods": {"jnp_sum": {}}}}
    rec = {"type": "result", "impl": {"name": "jax:xla", "kind": "peer"},
           "metrics": {"roofline_fraction": 1.7, "time_us_p50": 9.0},
           "prediction": {"basis": "measured", "measured": {"bytes": 4e9, "limiter": "MMA", "engine": "fp32"}}}
    lines = [json.dumps(ceil) + "\n", json.dumps(rec) + "\n"]
    new, n = annotate_lines(lines)
    m = json.loads(new[1])["metrics"]
    assert n == 1 and "170.0% of the compute floor (fp32 engine)" in m["roofline_fraction_note"]
    assert "TF32" in m["roofline_fraction_note"] and (m["roofline_fraction"], m["time_us_p50"]) == (1.7, 9.0)
    assert annotate_lines(new) == (new, 0)
    rec["impl"] = {"name": "pallas:v4_fused:faithful", "kind": "generation"}  # ours: not the TF32 story
    m = json.loads(annotate_lines([lines[0], json.dumps(rec) + "\n"])[0][1])["metrics"]
    assert "TF32" not in m["roofline_fraction_note"] and "more FLOPs" in m["roofline_fraction_note"]


def test_multi_device_fractions_are_rebased_on_the_aggregate_ceiling():
    """A workload over 4 GPUs whose fraction was taken against one GPU's measured ceiling (357%): re-based to the
    aggregate (89.2%), the recorded value kept, the note saying why; a second pass and one-GPU records change
    nothing."""
    import json

    import pytest

    rec = {"type": "result", "workload": {"devices": 4}, "prediction": {},
           "metrics": {"hbm_fraction": 3.568, "tc_fraction": 0.24, "hbm_ceiling": "measured HBM read, best method: x",
                       "hbm_fraction_note": "356.8% of the measured HBM read ceiling but 84.9% of the datasheet"}}
    one = {"type": "result", "workload": {"devices": 1}, "prediction": {}, "metrics": {"hbm_fraction": 0.9}}
    new, n = annotate_lines([json.dumps(rec) + "\n", json.dumps(one) + "\n"])
    assert n == 1
    m = json.loads(new[0])["metrics"]
    assert m["hbm_fraction"] == pytest.approx(0.892) and m["hbm_fraction_one_gpu_ceiling"] == 3.568
    assert m["tc_fraction"] == pytest.approx(0.06) and "re-based" in m["hbm_fraction_note"]
    assert "x 4 GPUs" in m["hbm_ceiling"]
    assert json.loads(new[1]) == one
    again, n2 = annotate_lines(new)
    assert n2 == 0 and again == new
