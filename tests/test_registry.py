"""The generation table: order, ids, honest 'built' flags."""

import importlib

import pytest

from pallas_attn import registry

REFERENCE_IDS = ["v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv", "v7_paged", "v8_gqa",
                 "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss", "v9_fp8", "v10_nvfp4",
                 "v11_mla", "v12_mla_tc"]


def test_the_17_reference_generations_in_order():
    assert list(registry.REFERENCE_IDS) == REFERENCE_IDS


def test_parents_exist_and_precede():
    seen = set()
    for g in registry.generations():
        assert g.parent is None or g.parent in seen, g.id
        assert g.delta and g.section
        seen.add(g.id)


@pytest.mark.parametrize("gen", [g for g in registry.generations() if g.pallas], ids=lambda g: g.id)
def test_built_pallas_rows_have_real_modules(gen):
    mod = importlib.import_module(f"pallas_attn.kernels.{gen.pallas}")
    assert "faithful" in mod.CONFIGS
    entry = "forward" if gen.entry == "attention" else "paged_forward"
    assert callable(getattr(mod, entry, None)) or callable(getattr(mod, "paged_forward", None))


def test_unbuilt_generation_is_a_visible_state():
    unbuilt = [g for g in registry.generations() if g.pallas is None]
    if not unbuilt:
        pytest.skip("every generation has a Pallas twin")
    with pytest.raises(NotImplementedError, match="not built"):
        registry.pallas_module(unbuilt[0].id)


def test_unknown_id():
    with pytest.raises(ValueError, match="unknown generation"):
        registry.get("v99")
