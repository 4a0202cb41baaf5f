"""CUDA_VISIBLE_DEVICES -> NVML device mapping (pure)."""

from __future__ import annotations

import pytest

from jupyter_gpumem.nvml.visibility import MigSlot, PhysicalGpu, VisibleDevice, visible_devices

A = "GPU-aaaa1111-0000-0000-0000-000000000000"
B = "GPU-bbbb2222-0000-0000-0000-000000000000"
C = "GPU-bbbb3333-0000-0000-0000-000000000000"
M0 = "MIG-cccc0000-0000-0000-0000-000000000000"
M1 = "MIG-dddd1111-0000-0000-0000-000000000000"

MACHINE = (
    PhysicalGpu(0, A),
    PhysicalGpu(1, B, mig_enabled=True, mig=(MigSlot(M0, 1, 0), MigSlot(M1, 2, 0))),
    PhysicalGpu(2, C),
)


def mapping(spec: str | None) -> list[tuple[int, int | None]]:
    out = visible_devices(spec, MACHINE)
    assert [d.index for d in out] == list(range(len(out)))  # numbered as CUDA numbers them
    return [(d.nvml_index, d.mig_position) for d in out]


def test_unset_shows_every_gpu_with_mig_instances_in_place_of_their_gpu() -> None:
    assert mapping(None) == [(0, None), (1, 0), (1, 1), (2, None)]


@pytest.mark.parametrize("spec", ["", "-1", " "])
def test_empty_or_negative_hides_everything(spec: str) -> None:
    assert mapping(spec) == []


def test_indices_reorder_and_renumber() -> None:
    assert mapping("2,0") == [(2, None), (0, None)]
    assert visible_devices("2,0", MACHINE)[0] == VisibleDevice(index=0, nvml_index=2)


def test_gpu_uuid_and_unique_prefix() -> None:
    assert mapping(f"{C},{A}") == [(2, None), (0, None)]
    assert mapping("GPU-aaaa") == [(0, None)]


def test_ambiguous_prefix_ends_the_list_like_cuda() -> None:
    # GPU-bbbb matches B and C: CUDA treats it as invalid, and stops there.
    assert mapping("0,GPU-bbbb,2") == [(0, None)]


def test_mig_uuid_selects_one_instance() -> None:
    assert mapping(M1) == [(1, 1)]
    assert mapping(f"{M1}, {M0}") == [(1, 1), (1, 0)]


def test_legacy_mig_form() -> None:
    assert mapping(f"MIG-{B}/2/0") == [(1, 1)]
    assert mapping(f"MIG-{B}/9/0") == []


def test_index_of_mig_gpu_means_its_instances() -> None:
    assert mapping("1") == [(1, 0), (1, 1)]


def test_invalid_token_stops_and_duplicates_are_skipped() -> None:
    assert mapping("0,7,2") == [(0, None)]
    assert mapping("0,0,2") == [(0, None), (2, None)]
    assert mapping("2,banana,0") == [(2, None)]


def test_mig_enabled_gpu_without_instances_contributes_nothing() -> None:
    machine = (PhysicalGpu(0, A, mig_enabled=True), PhysicalGpu(1, B))
    assert [(d.index, d.nvml_index) for d in visible_devices(None, machine)] == [(0, 1)]
