"""The report's renderings: exact text at a fixed layout, escaped HTML, the JSON wire format."""

import json
from pathlib import Path

from jupyter_gpumem.analysis.breakdown import TensorRecord
from jupyter_gpumem.report.record import MIME_TYPE, DeviceReport, Report

GiB, MiB = 2**30, 2**20


def _report(**kw: object) -> Report:
    device = DeviceReport(
        device="cuda:0", index=0, name="NVIDIA H100 80GB HBM3", total_bytes=80 * GiB,
        allocated_before_bytes=2 * GiB, allocated_after_bytes=3 * GiB, allocated_delta_bytes=GiB,
        peak_allocated_bytes=12 * GiB, peak_reserved_bytes=13 * GiB, reserved_after_bytes=13 * GiB,
        cache_bytes=10 * GiB, nvml_process_bytes=14 * GiB, non_torch_bytes=GiB, source="allocator-trace",
        breakdown={"parameters": GiB, "gradients": GiB, "optimizer_state": 2 * GiB, "activations": 7 * GiB,
                   "inputs": 0, "other": 0, "temporary": GiB, "unattributed": 0},
        peak_phase="backward", peak_step=1,
        tensors=(TensorRecord("logits", (8, 1024, 50257), "float32", 1646264320, "cuda:0", "cell line 3", True),
                 TensorRecord(None, None, None, 512 * MiB, "cuda:0", "cell line 4", False)),
    )  # fmt: skip
    fields = dict(
        id="x", name="train <b>", execution_count=3, started_at=0.0, wall_s=3.4178, status="ok",
        error=None, cuda_available=True, source="allocator-trace", budget_bytes=16 * GiB, devices=(device,),
    )  # fmt: skip
    fields.update(kw)
    return Report(**fields)  # type: ignore[arg-type]


def test_text_rendering_is_exact() -> None:
    assert str(_report()) == "\n".join(
        [
            "gpumem train <b>: 3.42 s",
            "                              cuda:0 NVIDIA H100 80GB HBM3",
            "peak allocated                                    12.0 GiB",
            "peak reserved                                     13.0 GiB",
            "allocated before                                  2.00 GiB",
            "allocated after                                   3.00 GiB",
            "allocated delta                                  +1.00 GiB",
            "cache (reserved - allocated)                      10.0 GiB",
            "process memory (NVML)                             14.0 GiB",
            "  not PyTorch's                                   1.00 GiB",
            "budget 16.0 GiB: peak is within budget",
            "at the peak (backward, step 1) on cuda:0:",
            "  activations          7.00 GiB   58%",
            "  optimizer state      2.00 GiB   17%",
            "  parameters           1.00 GiB    8%",
            "  gradients            1.00 GiB    8%",
            "  temporary            1.00 GiB    8%",
            "tensors the cell left alive:",
            "  logits   8x1024x50257   float32    1.53 GiB  cell line 3",
            "largest freed: 512 MiB from cell line 4",
        ]
    )


def test_html_escapes_user_text_and_carries_the_breakdown() -> None:
    page = _report()._repr_mimebundle_()["text/html"]
    assert "train &lt;b&gt;" in page and "train <b>" not in page
    assert "activations" in page and "backward, step 1" in page


def test_json_matches_the_shared_fixture_keys() -> None:
    fixture = json.loads((Path(__file__).parents[1] / "fixtures" / "report.json").read_text())
    bundle = _report()._repr_mimebundle_()[MIME_TYPE]
    json.dumps(bundle)  # plain JSON
    assert set(fixture) <= set(bundle)
    assert set(fixture["devices"][0]) <= set(bundle["devices"][0])
    assert bundle["devices"][0]["tensors"][0]["shape"] == [8, 1024, 50257]


def test_over_budget_and_oom_titles() -> None:
    assert _report(budget_bytes=GiB).over_budget
    assert "(out of memory)" in str(_report(status="oom"))


def test_no_cuda_note_says_what_the_cpu_figures_are() -> None:
    from dataclasses import replace

    from jupyter_gpumem.report.record import NO_CUDA

    cpu = replace(
        _report().devices[0], device="cpu", name="CPU tensors", peak_allocated_bytes=5945425
    )
    shown = _report(cuda_available=False, devices=(cpu,), notes=(NO_CUDA,))
    plain = "No CUDA device: the figures are CPU tensor memory (peak 5.67 MiB)."
    assert shown.shown_notes() == (plain,)
    assert f"note: {plain}" in str(shown)
    assert shown.to_dict()["notes"] == [plain]
    nothing = _report(cuda_available=False, devices=(), notes=(NO_CUDA,))  # nothing stood in
    assert nothing.shown_notes() == (NO_CUDA,)


LONG = "opt.state[model.transformer.h.11.mlp.c_proj.weight]['exp_avg_sq']"  # 66 characters


def _with_tensors(*names: str) -> Report:
    from dataclasses import replace

    tensors = tuple(
        TensorRecord(n, (3072, 768), "float32", 9 * MiB, "cuda:0", "cell line 7", True)
        for n in names
    )
    return _report(devices=(replace(_report().devices[0], tensors=tensors),))


def test_tensor_names_get_the_room_they_need_and_are_shortened_only_past_it() -> None:
    text = str(_with_tensors(LONG, "x"))
    assert f"  {LONG}       3072x768   float32    9.00 MiB  cell line 7" in text
    assert f"  {'x':<{len(LONG)}}       3072x768" in text
    huge = "model." + ".".join(f"block{i}" for i in range(12)) + ".weight.grad"  # 90 characters
    line = next(li for li in str(_with_tensors(huge)).splitlines() if "3072x768" in li)
    assert line.startswith("  …") and huge[-71:] in line  # 72 wide, the distinguishing end kept
    page = _with_tensors(LONG, huge)._repr_mimebundle_()["text/html"]
    table = page[page.index('<table class="jp-gpumem-tensors"') :]
    assert f">{LONG.replace(chr(39), '&#x27;')}</td>" in table and f">{huge}</td>" in table  # whole
    assert table.count("white-space:nowrap") >= 5 * 3  # no cell of the table wraps


def test_code_spans_in_hints_are_code_in_html_and_plain_in_text() -> None:
    from jupyter_gpumem.analysis.leak_hints import graph_hint, output_cache_hint

    hints = (graph_hint(MiB, ["loss"]), output_cache_hint(MiB, ["Out[3]"]))
    assert hints[0] is not None and "`loss.item()`" in hints[0].fix  # the record keeps the markup
    shown = _report(leak_hints=hints)
    text = str(shown)
    assert "`" not in text and "Store loss.item() or loss.detach() instead" in text
    assert "Run %gpumem free, or end cells that return a tensor with a semicolon (;) so" in text
    page = shown._repr_mimebundle_()["text/html"]
    assert "`" not in page
    assert "<code>loss.item()</code>" in page and "<code>%gpumem free</code>" in page
    assert shown.to_dict()["leak_hints"][0]["fix"] == hints[0].fix
