"""The technique tuner driven programmatically and through its buttons in a real IPython shell (CPU)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

from jupyter_gpumem import logbook
from jupyter_gpumem.report.record import Report
from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.predict import config_of
from jupyter_gpumem.tuner.planning.plan import Plan
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.trial import Trial
from jupyter_gpumem.units import SIZE_HELP, format_bytes
from jupyter_gpumem.widgets.plan_view import CPU_STEPS, plan_html
from jupyter_gpumem.widgets.rank_chart import COLORS
from jupyter_gpumem.widgets.tuner import FP16_HELP, NEEDS_TRIAL, AsIs, Tuner, tune
from jupyter_gpumem.widgets.tuner_charts import GPUS_BUTTON, rows_html, rows_text

LOOP = (
    "%%gpumem --quiet\n"
    "for _ in range(3):\n"
    "    loss = model(x).square().mean()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()"
)  # no trailing newline, as a notebook cell
HELPER_LOOP = (
    "%%gpumem --quiet\n"
    "for _ in range(3):\n"
    "    with tuner.applied.autocast():\n"
    "        loss = model(x).float().square().mean()\n"
    "    tuner.applied.backward(loss)\n"
    "    tuner.applied.step()"
)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class Net(nn.Module):
    """Blocks in a ModuleList whose activations outweigh the parameters, as in a transformer."""

    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


@pytest.fixture(autouse=True)
def _closed_panels() -> Iterator[None]:
    """Close every panel a test opened: an open widget keeps its model and optimizer alive,
    and a later test's kernel would hold them."""
    yield
    import gc

    import ipywidgets

    ipywidgets.Widget.close_all()
    gc.collect()


@pytest.fixture
def ns(shell: InteractiveShell) -> Iterator[dict[str, Any]]:
    """model, opt (AdamW) and x in the user namespace; no earlier cell in the input history."""
    inputs = shell.history_manager
    assert inputs is not None
    inputs.input_hist_raw[:] = [""]
    inputs.input_hist_parsed[:] = [""]
    torch.manual_seed(0)
    model = Net()
    shell.user_ns.update(
        model=model, opt=torch.optim.AdamW(model.parameters()), x=torch.randn(512, 32)
    )
    yield shell.user_ns


def _trial_tuner(shell: InteractiveShell, ns: dict[str, Any], **kwargs: Any) -> Tuner:
    trial = Trial(ns["model"], ns["x"], _loss, optimizer=ns["opt"], warmup=1, steps=2)
    return tune(ns["model"], "opt", trial=trial, shell=shell, **kwargs)


def _run_loop(shell: InteractiveShell, source: str = LOOP) -> Report:
    result = shell.run_cell(source, store_history=True)
    assert result.success, result.error_in_exec
    return logbook.reports()[-1]


def test_trial_rows_carry_numbers_from_real_reports(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    tuner.set(Config(checkpoint="blocks"))
    result = tuner.rerun()
    assert isinstance(result, TrialResult) and result.status == "ok"
    assert [r.label for r in tuner.results] == [
        "baseline",
        "ckpt blocks",
    ]  # baseline measured first
    rows = tuner.rows
    for row, r in zip(rows, tuner.results, strict=True):
        assert r.report is not None and r.report.main is not None
        assert row["peak_bytes"] == r.report.main.peak_allocated_bytes > 0
        assert sum(row["breakdown"].values()) == row["peak_bytes"]
        assert isinstance(row["step_ms"], float) and row["step_ms"] > 0
    base, ckpt = rows
    assert base["delta_peak_bytes"] == 0
    assert ckpt["delta_peak_bytes"] == ckpt["peak_bytes"] - base["peak_bytes"] < 0
    assert ckpt["breakdown"]["activations"] < base["breakdown"]["activations"]
    (sgd,) = tuner.compare([Config(optimizer="sgd")])
    assert sgd.breakdown is not None and sgd.breakdown["optimizer_state"] == 0
    assert len(tuner.rows) == 3  # the baseline is measured once
    assert "ckpt blocks" in tuner.text() and "sgd" in tuner.text()


def test_rerun_of_the_gpumem_cell_appends_rows_from_its_reports(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    first = _run_loop(shell)
    tuner = tune(ns["model"], "opt", shell=shell)
    baseline = tuner.rerun()
    assert isinstance(baseline, Report) and baseline is logbook.reports()[-1]
    assert baseline.cell_key == first.cell_key
    tuner.set(Config(optimizer="sgd"))
    report = tuner.rerun()
    assert isinstance(report, Report) and report is logbook.reports()[-1]
    assert isinstance(ns["opt"], torch.optim.SGD)  # re-run applies the configuration
    base, sgd = tuner.rows
    assert (base["configuration"], sgd["configuration"]) == ("baseline", "sgd")
    assert base["peak_bytes"] == baseline.peak_allocated_bytes
    assert sgd["peak_bytes"] == report.peak_allocated_bytes
    params = sum(p.numel() for p in ns["model"].parameters())
    assert base["breakdown"]["optimizer_state"] >= 8 * params  # AdamW: two fp32 moments
    assert sgd["breakdown"]["optimizer_state"] == 0
    assert sgd["delta_peak_bytes"] == sgd["peak_bytes"] - base["peak_bytes"] < 0
    assert sgd["step_ms"] > 0
    bars = tuner.panel.block_bars  # the re-run cell's report gives the blocks' figures
    assert report.by_module is not None and "sgd" in bars.caption.value
    assert bars.figures == {n: report.by_module[n]["activations"] for n in bars.names}


def test_compare_on_the_cell_keeps_the_panel_state(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    _run_loop(shell)
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.set(Config(optimizer="sgd"))
    applied_opt = tuner.apply().optimizer
    results = tuner.compare([Config(checkpoint="blocks"), Config(precision="bf16")])
    assert [r.label for r in results] == ["baseline", "ckpt blocks", "bf16"]
    assert all(r.status == "ok" and r.peak_allocated_bytes for r in results)
    assert tuner.applied.config == Config(optimizer="sgd")  # re-applied afterwards
    assert isinstance(ns["opt"], torch.optim.SGD) and ns["opt"] is not applied_opt


def test_optimizer_rebinding_and_revert_restore_the_original_object(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    original, model = ns["opt"], ns["model"]
    params = [id(p) for p in model.parameters()]
    tuner = tune(model, "opt", shell=shell)
    tuner.set(Config(optimizer="sgd-momentum"))
    applied = tuner.apply()
    assert ns["opt"] is applied.optimizer and isinstance(ns["opt"], torch.optim.SGD)
    tuner.panel.optimizer.value = "adam"
    tuner.panel.buttons["Apply"].click()  # a second apply reverts the first
    assert type(ns["opt"]) is torch.optim.Adam and ns["opt"] is tuner.applied.optimizer
    tuner.panel.buttons["Revert"].click()
    assert ns["opt"] is original
    assert [id(p) for p in model.parameters()] == params
    assert tuner.panel.messages.value == ""
    tuner.set(Config(precision="bf16"))
    tuner.apply()  # no optimizer change: the variable is left alone
    assert ns["opt"] is original
    tuner.revert()
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _result(label: str, peak: int | None, step_s: float | None, status: str = "ok") -> TrialResult:
    config = Config() if label == "baseline" else Config(optimizer=label)
    return TrialResult(config, label, status, None, peak, peak, None, step_s, (), ())


def test_fit_picks_the_cheapest_fitting_configuration(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.results += [
        _result("baseline", 10_000, 0.100),
        _result("adafactor", 5_000, 0.300),  # fits, saves most per ms, but slow
        _result("sgd", 6_000, 0.150),  # fits at the least step time
        _result("lion", 7_500, 0.101),  # fast but over budget
        _result("adam", None, None, status="oom"),
    ]
    kept = tuner.fit(7_000)  # by default a fit keeps the optimizer: all of these change it
    assert (kept.chosen, kept.fits) == (None, False) and tuner.config == Config()
    shown = tuner.panel.fit_text.value
    assert shown.startswith("<b>Fit to budget chose nothing: no measured configuration fits")
    assert "Fit may not change the optimizer" in shown and "Left out: adafactor, sgd" in shown
    tuner.panel.fit_techniques["optimizer"].value = True
    choice = tuner.fit(7_000)
    assert (choice.chosen, choice.fits) == ("sgd", True)
    assert tuner.config == Config(optimizer="sgd")  # shown in the panel, ready to apply
    assert "Chosen: sgd" in tuner.panel.fit_text.value
    # cells re-run on the CPU are timed under the tracker, and the panel says what that means
    assert "step times compare configurations with each other only" in tuner.panel.fit_text.value
    assert tuner.tracked_steps and CPU_STEPS.split(",")[0] in tuner.panel.steps_note.value
    assert tuner.text().endswith("not with how fast training runs.")
    assert tuner.panel.fit_text.value.startswith(
        "<b>Fit to budget chose: no checkpointing, precision kept (fp32); optimizer adamw → sgd</b>"
    )
    assert [r["fits_budget"] for r in tuner.rows] == [False, True, True, False, None]
    tuner.panel.buttons["Fit to budget"].click()
    assert "Chosen: sgd" in tuner.panel.fit_text.value and tuner.panel.messages.value == ""
    assert tuner.fit("1 B").chosen is None
    assert "No measured configuration fits" in tuner.panel.fit_text.value


def test_fit_with_a_trial_plans_verifies_and_shows_plan_beside_measurement(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    base, every = tuner.compare([Config(checkpoint="blocks")])
    assert base.peak_allocated_bytes is not None and every.peak_allocated_bytes is not None
    budget = (base.peak_allocated_bytes + every.peak_allocated_bytes) // 2
    for name in ("precision", "optimizer"):
        tuner.panel.fit_techniques[name].value = False  # fit may only checkpoint
    plan = tuner.fit(budget)
    assert isinstance(plan, Plan) and tuner.plan is plan
    assert plan.precision is None and plan.optimizer is None
    assert 0 < len(plan.checkpoint) < 4 and plan.measured_fits, plan.reasoning
    assert tuner.config == plan.config  # the panel shows the plan: Apply applies exactly it
    row = tuner.rows[-1]
    assert row["configuration"] == f"plan · {plan.config}"
    assert row["peak_bytes"] == plan.measured_peak_bytes and row["fits_budget"] is True
    shown = tuner.panel.fit_text.value
    assert "predicted" in shown and "measured" in shown and "Press Apply" in shown
    assert format_bytes(plan.predicted_peak_bytes) in shown
    assert format_bytes(plan.measured_peak_bytes) in shown
    applied = tuner.apply()
    assert applied.config == plan.config
    assert [n for n, m in ns["model"].named_modules() if "forward" in m.__dict__] == list(
        plan.checkpoint
    )
    tuner.revert()
    tuner.panel.buttons["Fit to budget"].click()  # the button does the same, measured again
    assert tuner.panel.messages.value == "" and tuner.plan is not plan
    assert tuner.plan is not None and tuner.plan.config == plan.config


def test_fit_with_a_trial_escapes_the_reasoning(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    plan = tuner.fit("1 B", techniques=("checkpoint",))  # nothing fits: nothing is verified
    assert isinstance(plan, Plan) and not plan.fits and plan.result is None
    assert "not measured" in tuner.panel.fit_text.value
    assert any(line.startswith("Nothing fits") for line in plan.reasoning)
    html = plan_html({**plan.to_dict(), "reasoning": ["<script>x</script>"]})
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_bad_budget_text_gives_a_clear_message(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    tuner = tune(ns["model"], "opt", shell=shell, budget="12GiB")
    assert tuner.budget_bytes == 12 * 2**30
    tuner.panel.budget.value = "lots"
    assert (
        "budget: &#x27;lots&#x27; is not " + SIZE_HELP.split(",")[0]
        in tuner.panel.budget_error.value
    )
    assert tuner.budget_bytes == 12 * 2**30  # unchanged
    tuner.panel.budget.value = "0GiB"
    assert "greater than zero" in tuner.panel.budget_error.value
    tuner.panel.budget.value = "512 MiB"
    assert tuner.panel.budget_error.value == "" and tuner.budget_bytes == 512 * 2**20
    tuner.panel.budget.value = ""
    assert tuner.budget_bytes is None
    with pytest.raises(ValueError, match="set a budget first"):
        tuner.fit()
    with pytest.raises(ValueError, match="512MiB, 16GiB"):
        tune(ns["model"], "opt", shell=shell, budget="12 gigs")


def test_table_text_is_escaped(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    def hostile(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        raise ValueError("<script>alert('x')</script> & <b>")

    trial = Trial(ns["model"], ns["x"], hostile, optimizer=ns["opt"], warmup=0, steps=1)
    tuner = tune(ns["model"], "opt", trial=trial, shell=shell)
    tuner.rerun()
    (row,) = tuner.rows
    assert row["status"] == "error" and "<script>" in row["error"]
    table = tuner.panel.table.value
    assert "<script>" not in table and "<b>" not in table
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;" in table
    assert "<script>" in rows_text(tuner.rows)  # plain text stays plain
    html = rows_html([{"configuration": '<img src=x onerror="1">', "peak_bytes": 1}])
    assert "<img" not in html and "&lt;img src=x onerror=&quot;1&quot;&gt;" in html


def test_button_errors_show_in_the_panel(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.panel.buttons["Re-run"].click()  # no %%gpumem cell and no trial
    assert "no %%gpumem cell has run in this kernel yet" in tuner.panel.messages.value
    tuner.panel.regex.value = "blocks\\.(0"
    tuner.panel.buttons["Apply"].click()
    assert "is not a regex" in tuner.panel.messages.value
    tuner.panel.regex.value = "nothing\\.here"
    tuner.panel.buttons["Apply"].click()
    assert "matches no module" in tuner.panel.messages.value
    tuner.panel.all_blocks.value = True
    tuner.panel.buttons["Apply"].click()
    assert "choose one" in tuner.panel.messages.value
    tuner.panel.buttons["Fit to budget"].click()
    assert "set a budget first" in tuner.panel.messages.value
    assert tuner.results == [] and tuner.panel.status.value == "failed"


def test_fp16_rerun_of_a_plain_loop_says_the_loop_must_call_the_helpers(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    _run_loop(shell)
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.set(Config(precision="fp16-autocast"))
    tuner.rerun()
    assert "tuner.applied.backward(loss)" in tuner.panel.messages.value
    assert FP16_HELP in tuner.rows[-1]["warnings"]
    shell.user_ns["tuner"] = tuner
    _run_loop(shell, HELPER_LOOP)  # a loop that calls the helpers
    tuner.panel.messages.value = ""
    tuner.rerun()
    assert tuner.panel.messages.value == ""
    assert FP16_HELP not in tuner.rows[-1]["warnings"]
    assert tuner.rows[-1]["status"] == "ok"


def test_set_and_config_round_trip_and_the_charts_follow_the_rows(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    assert tuner.panel.modules.options[0][1] == "blocks.0"  # the main ModuleList first
    for config in (
        Config(checkpoint="blocks", every=2, precision="bf16-autocast"),
        Config(checkpoint=("blocks.1", "head"), optimizer="adamw"),
        Config(checkpoint=r"blocks\.\d+\.mlp"),
        Config(),
    ):
        tuner.set(config)
        assert tuner.config == config
    with pytest.raises(ValueError, match=r"no module named 'blocks\.9'"):
        tuner.set(Config(checkpoint=("blocks.9",)))
    tuner.compare([Config(optimizer="sgd")])
    labels = [r["configuration"] for r in tuner.rows]
    assert list(tuner.panel.breakdown.bars.x) == labels
    assert list(tuner.panel.tradeoff.points.names) == labels
    assert tuner.panel.progress.value == tuner.panel.progress.max == 2


def _share(bar_html: str) -> float:
    """How much of its track a bar fills, in percent."""
    found = re.search(r"width:([\d.]+)%", bar_html)
    assert found is not None, bar_html
    return float(found.group(1))


def test_block_bars_show_each_blocks_activations_and_drop_for_a_checkpointed_one(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    bars = tuner.panel.block_bars
    names = ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert bars.names == names
    assert bars.figures == {} and "run to measure" in bars.caption.value
    base = tuner.rerun()
    assert isinstance(base, TrialResult) and base.report is not None
    before = base.report.by_module
    assert before is not None
    assert bars.figures == {n: before[n]["activations"] for n in names}
    assert min(bars.figures.values()) > 0 and "baseline" in bars.caption.value
    top = max(bars.figures.values())
    for name, n in bars.figures.items():
        assert format_bytes(n) in bars.bars[name].value
        assert _share(bars.bars[name].value) == pytest.approx(100 * n / top, abs=0.05)

    bars.toggles["blocks.1"].value = True  # the toggle beside the bar picks the block
    assert tuner.panel.modules.value == ("blocks.1",)
    assert tuner.config == Config(checkpoint=("blocks.1",))
    ckpt = tuner.rerun()
    assert isinstance(ckpt, TrialResult) and ckpt.report is not None
    after = ckpt.report.by_module
    assert after is not None
    assert bars.figures == {n: after.get(n, {}).get("activations", 0) for n in names}
    assert bars.figures["blocks.1"] < before["blocks.1"]["activations"]
    # drawn as checkpointed (hatched, named), not as a bar of its few bytes
    assert bars.checkpointed == {"blocks.1"} and "checkpointed" in bars.bars["blocks.1"].value
    assert format_bytes(bars.figures["blocks.1"]) not in bars.bars["blocks.1"].value
    assert max(_share(bars.bars[n].value) for n in names if n != "blocks.1") == 100.0
    assert "ckpt blocks.1" in bars.caption.value

    tuner.set(Config(checkpoint=("blocks.2", "head")))  # the list moves the toggles too
    assert [n for n, box in bars.toggles.items() if box.value] == ["blocks.2"]
    assert tuner.config == Config(checkpoint=("blocks.2", "head"))


def test_dropdowns_show_the_model_as_it_is(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)  # an fp32 model and an AdamW
    precision, optimizer = tuner.panel.precision, tuner.panel.optimizer
    assert (precision.label, optimizer.label) == ("fp32 (as is)", "adamw (as is: opt)")
    assert precision.index == optimizer.index == 0  # selected, not a blank dropdown
    assert tuner.config == Config()
    tuner.set(Config(precision="bf16", optimizer="sgd"))
    assert (precision.label, optimizer.label) == ("bf16", "sgd")
    tuner.set(Config())
    assert (precision.label, optimizer.label) == ("fp32 (as is)", "adamw (as is: opt)")
    assert tuner.config == Config()
    ns["opt2"] = torch.optim.SGD(ns["model"].parameters(), lr=0.1, momentum=0.9)
    assert (
        tune(ns["model"], "opt2", shell=shell).panel.optimizer.label == "sgd-momentum (as is: opt2)"
    )
    assert tune(ns["model"], "missing", shell=shell).panel.optimizer.label == "as is (missing)"


def test_the_offload_dropdown_edits_the_config(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    offload = tuner.panel.offload
    assert offload.label == "off" and tuner.config == Config()
    offload.value = "blocks"
    assert tuner.config == Config(offload="blocks")
    assert "offload blocks" in tuner.panel.configuration.value
    tuner.set(Config(offload="model", precision="bf16"))
    assert (offload.label, tuner.config) == (
        "model to host",
        Config(offload="model", precision="bf16"),
    )
    tuner.set(Config())
    assert offload.label == "off"


def test_state_on_cpu_makes_fsdp2_on_the_gpus_chosen_and_reruns_on_its_rank(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    panel = tuner.panel
    assert not panel.cpu_offload.value and tuner.config == Config()
    panel.strategy.value = "ddp"
    panel.cpu_offload.value = True
    one_rank = Config(parallel="fsdp2", world_size=1, cpu_offload=True)
    assert tuner.config == one_rank and panel.strategy.value == "fsdp2"
    assert panel.strategy.disabled  # the policy is FSDP2's
    assert "fsdp2 \N{MULTIPLICATION SIGN} 1 · state on cpu" in panel.configuration.value
    panel.gpus.value = 2
    assert tuner.config == Config(parallel="fsdp2", world_size=2, cpu_offload=True)
    assert panel.strategy.disabled
    tuner.set(one_rank)
    result = tuner.rerun()
    assert result.config == one_rank and result.status == "ok", result.error
    assert [r.rank for r in result.ranks] == [0]
    assert [r.config for r in tuner.results] == [Config(), one_rank]
    tuner.panel.buttons["Apply"].click()  # the state stays where the kernel's model has it
    assert tuner.applied.config == Config()
    assert "Apply left out fsdp2 \N{MULTIPLICATION SIGN} 1 · state on cpu" in panel.messages.value
    tuner.set(Config())
    assert not panel.cpu_offload.value and panel.strategy.disabled


def test_an_inference_trial_offers_inference_mode_and_no_training_controls(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    plain = tune(ns["model"], "opt", shell=shell)
    assert plain.panel.inference_mode.layout.display == "none"
    trial = Trial(ns["model"], ns["x"], lambda m, b: m(b), inference=True, warmup=1, steps=2)
    tuner = tune(ns["model"], "opt", trial=trial, shell=shell, budget="1MiB")
    panel = tuner.panel
    assert panel.inference_mode.layout.display is None
    assert panel.optimizer.disabled and panel.gpus.disabled and panel.cpu_offload.disabled
    search = panel.buttons["Search"]
    assert search.disabled and "inference trial" in search.tooltip
    panel.inference_mode.value = True
    assert tuner.config == Config(inference_mode=True)
    assert "inference mode" in panel.configuration.value
    tuner.rerun()
    by = {r.config: r for r in tuner.results}
    assert set(by) == {Config(), Config(inference_mode=True)}
    assert all(r.status == "ok" for r in tuner.results), [r.error for r in tuner.results]
    assert by[Config(inference_mode=True)].breakdown["activations"] == 0
    assert by[Config()].breakdown["activations"] > 0
    panel.buttons["Fit to budget"].click()
    assert "Fit to budget plans training steps" in panel.messages.value
    tuner.set(Config())
    assert not panel.inference_mode.value


# -- GPUs and strategy: "Will it fit on N GPUs?" ---------------------------------------------

X = "\N{MULTIPLICATION SIGN}"  # as Config labels its ranks
MiB = 2**20


def test_gpus_and_strategy_selectors_round_trip_through_config(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    gpus, strategy = tuner.panel.gpus, tuner.panel.strategy
    assert [label for label, _ in gpus.options] == ["1 GPU", "2 GPUs", "4 GPUs", "8 GPUs"]
    assert list(strategy.options) == ["ddp", "fsdp2"]
    assert gpus.value == 1 and strategy.disabled  # one GPU: no strategy to choose
    assert tuner.config == Config()
    gpus.value, strategy.value = 4, "fsdp2"
    assert not strategy.disabled
    assert tuner.config == Config(parallel="fsdp2", world_size=4)
    gpus.value = 1  # the strategy is kept for later but is not part of a 1-GPU configuration
    assert tuner.config == Config() and strategy.disabled
    for config in (
        Config(checkpoint="blocks", precision="bf16", parallel="ddp", world_size=8),
        Config(optimizer="sgd", parallel="fsdp2", world_size=2),
        Config(checkpoint="blocks"),
        Config(parallel="ddp", world_size=3),  # not offered: the dropdown gains it
    ):
        tuner.set(config)
        assert tuner.config == config
        assert strategy.disabled == (config.parallel is None)
    assert [n for _, n in gpus.options] == [1, 2, 3, 4, 8] and gpus.label == "3 GPUs"


def test_apply_leaves_the_gpus_out_and_says_so(shell: InteractiveShell, ns: dict[str, Any]) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    original = ns["opt"]
    tuner.set(Config(checkpoint="blocks", optimizer="sgd", parallel="fsdp2", world_size=4))
    tuner.panel.buttons["Apply"].click()
    assert tuner.applied.config == Config(checkpoint="blocks", optimizer="sgd")
    assert isinstance(ns["opt"], torch.optim.SGD)  # the rest of the configuration is applied
    assert not isinstance(ns["model"], nn.parallel.DistributedDataParallel)
    assert all(p.device.type == "cpu" and p.dim() for p in ns["model"].parameters())  # unsharded
    messages = tuner.panel.messages.value
    assert f"Apply left out fsdp2 {X} 4" in messages and "never put on this" in messages
    assert "Applied: ckpt blocks · sgd." in messages and tuner.panel.status.value != "failed"
    tuner.revert()
    assert ns["opt"] is original


class MadeUpRanks(Trial):
    """A trial whose parallel estimates and runs are made up: ranks that differ, and failures.

    One GPU is the real CPU estimate and run. Each rank of n holds a 1/n share of 64 MiB (with
    DDP, replicated: all of it) and rank r another r MiB; FSDP2 on 8 has no estimate, and DDP on
    4 raises.
    """

    calls: list[Config]

    def estimate(self, batch: Any = None, **config: Any) -> Estimate:
        chosen = config_of(config)
        self.calls = [*getattr(self, "calls", []), chosen]
        if chosen.parallel is None:
            return super().estimate(batch, **config)
        if chosen.parallel == "ddp" and chosen.world_size == 4:
            raise RuntimeError("the fake group <broke>")
        n = chosen.world_size
        reason = "no fake process group for 8 ranks" if n == 8 else None
        ranks = tuple(
            Estimate(str(chosen), "cpu", None if reason else self._share(chosen, r), None, None,
                     None, reason, config=chosen, rank=r)
            for r in range(n)
        )  # fmt: skip
        peak = None if reason else max(e.peak_bytes or 0 for e in ranks)
        return Estimate(str(chosen), "cpu", peak, None, None, None, reason, config=chosen,
                        ranks=ranks)  # fmt: skip

    def run(self, config: Config) -> TrialResult:
        if config.parallel is None:
            return super().run(config)
        ranks = tuple(
            TrialResult(config, str(config), "ok", None, self._share(config, r) + MiB // 2, None,
                        None, 0.01, (0.01,), (), rank=r)
            for r in range(config.world_size)
        )  # fmt: skip
        top = max(r.peak_allocated_bytes or 0 for r in ranks)
        return TrialResult(config, str(config), "ok", None, top, None, None, 0.01, (0.01,), (),
                           ranks=ranks)  # fmt: skip

    @staticmethod
    def _share(config: Config, rank: int) -> int:
        whole = 64 * MiB if config.parallel == "ddp" else 64 * MiB // config.world_size
        return whole + rank * MiB


def test_will_it_fit_estimates_each_choice_and_draws_each_rank(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    trial = MadeUpRanks(ns["model"], ns["x"], _loss, optimizer=ns["opt"], warmup=1, steps=2)
    tuner = tune(ns["model"], "opt", trial=trial, shell=shell, budget="40MiB")
    chart = tuner.panel.ranks
    assert chart.widget.children == ()  # nothing estimated yet: no chart
    tuner.set(Config(checkpoint="blocks", parallel="fsdp2", world_size=2))
    tuner.panel.buttons[GPUS_BUTTON].click()
    assert [(c.parallel, c.world_size) for c in trial.calls] == [
        (None, 1), ("ddp", 2), ("fsdp2", 2), ("ddp", 4), ("fsdp2", 4), ("ddp", 8), ("fsdp2", 8)
    ]  # fmt: skip
    assert {c.single for c in trial.calls} == {Config(checkpoint="blocks")}
    found = tuner.gpu_estimates
    assert [e.config for e in found] == trial.calls
    one = found[0]
    assert one.peak_bytes is not None and one.peak_bytes > 0  # the real CPU estimate
    assert [e.peak_bytes is None for e in found] == [False, False, False, True, False, True, True]
    messages = tuner.panel.messages.value
    assert f"ddp {X} 4: not estimated: RuntimeError: the fake group &lt;broke&gt;" in messages
    assert f"fsdp2 {X} 8: not estimated: no fake process group for 8 ranks" in messages
    assert tuner.panel.status.value == "estimated 4 of 7 choices"
    assert len(chart.widget.children) == 2
    labels = ["1 GPU", *(f"{s} {X} {n}" for n in (2, 4, 8) for s in ("ddp", "fsdp2"))]
    assert list(chart.x_axis.tick_labels.values()) == labels  # the failed ones keep their place
    assert chart.figure.title == "peak per GPU: ckpt blocks"
    est = [p for p in chart.points if p.kind == "estimated"]
    assert [(p.group, p.rank, p.peak_bytes) for p in est] == [
        ("1 GPU", 0, one.peak_bytes),
        (f"ddp {X} 2", 0, 64 * MiB), (f"ddp {X} 2", 1, 65 * MiB),
        (f"fsdp2 {X} 2", 0, 32 * MiB), (f"fsdp2 {X} 2", 1, 33 * MiB),
        *((f"fsdp2 {X} 4", r, (16 + r) * MiB) for r in range(4)),
    ]  # fmt: skip
    assert [(p.group, p.rank) for p in est if p.worst] == [
        (f"ddp {X} 2", 1), (f"fsdp2 {X} 2", 1), (f"fsdp2 {X} 4", 3)
    ]  # fmt: skip
    assert list(chart.budget.y) == [40.0, 40.0]  # the panel's budget, in MiB
    table = chart.table.value
    assert f"fsdp2 {X} 4" in table and "19.0 MiB" in table and "not estimated" in table

    # Re-run with GPUs > 1 measures through the trial: the same chart, outlined.
    result = tuner.rerun()
    assert isinstance(result, TrialResult) and len(result.ranks) == 2
    assert [r["configuration"] for r in tuner.rows] == ["baseline", f"ckpt blocks · fsdp2 {X} 2"]
    assert list(chart.measured.y) == [32.5, 33.5] and not chart.measured.fill
    assert list(chart.measured.colors) == [COLORS["rank"], COLORS["worst"]]
    assert list(chart.measured.x) == [p.x for p in est if p.group == f"fsdp2 {X} 2"]
    tuner.panel.budget.value = ""  # no budget: no line
    assert list(chart.budget.y) == []

    with pytest.raises(ValueError, match="whole numbers >= 1"):
        tuner.estimate_gpus((0,))
    with pytest.raises(ValueError, match="strategies are some of ddp, fsdp2"):
        tuner.estimate_gpus((2,), ("tp",))
    assert tuner.estimate_gpus((2,), ("ddp",))[0].config.world_size == 2
    assert list(chart.x_axis.tick_labels.values()) == [f"ddp {X} 2", f"fsdp2 {X} 2"]

    # A parallel run of other techniques: the chart follows it, with the baseline measured.
    tuner.set(Config(parallel="ddp", world_size=4))
    tuner.rerun()
    assert chart.figure.title == "peak per GPU"
    assert list(chart.x_axis.tick_labels.values()) == ["1 GPU", f"ddp {X} 4"]
    assert [p.kind for p in chart.points] == ["measured"] * 5


def test_without_a_trial_the_gpus_button_says_what_it_needs(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.panel.buttons[GPUS_BUTTON].click()
    assert "estimates on GPUs need a trial: tune(model, &#x27;opt&#x27;, trial=Trial(" in (
        tuner.panel.messages.value
    )
    with pytest.raises(RuntimeError, match=re.escape(NEEDS_TRIAL)):
        tuner.estimate_gpus()
    _run_loop(shell)
    tuner.set(Config(parallel="ddp", world_size=2))
    tuner.panel.buttons["Re-run"].click()  # the cell runs in this one process
    assert f"measuring ddp {X} 2 starts its ranks through a trial" in tuner.panel.messages.value


def test_will_it_fit_with_the_real_estimates_of_a_tiny_mlp_on_two_cpu_ranks(
    shell: InteractiveShell,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    shell.user_ns.update(model=model, opt=opt)
    trial = Trial(model, torch.randn(32, 64), _loss, optimizer=opt, warmup=1, steps=2)
    tuner = tune(model, "opt", trial=trial, shell=shell)
    before = [p.detach().clone() for p in model.parameters()]
    assert tuner.panel.views.selected_index == 0  # the measurements' tab
    one, ddp, fsdp = tuner.estimate_gpus((1, 2))
    assert tuner.panel.messages.value == "", tuner.panel.messages.value
    assert tuner.panel.status.value == "estimated 3 of 3 choices"
    # the chart comes to the front under the status line, its tab counting the choices
    assert tuner.panel.views.selected_index == 1
    assert tuner.panel.views.titles == ("measurements", "per GPU (3)")
    assert tuner.panel.ranks_note.value == ""
    assert [(e.config.parallel, e.config.world_size, len(e.ranks)) for e in (one, ddp, fsdp)] == [
        (None, 1, 0), ("ddp", 2, 2), ("fsdp2", 2, 2)
    ]  # fmt: skip
    assert one.peak_bytes is not None and ddp.peak_bytes is not None
    assert fsdp.peak_bytes is not None and fsdp.peak_bytes < one.peak_bytes  # sharded state
    est = [p for p in tuner.panel.ranks.points if p.kind == "estimated"]
    assert [(p.group, p.rank, p.peak_bytes) for p in est] == [
        ("1 GPU", 0, one.peak_bytes),
        *((f"ddp {X} 2", r.rank, r.peak_bytes) for r in ddp.ranks),
        *((f"fsdp2 {X} 2", r.rank, r.peak_bytes) for r in fsdp.ranks),
    ]
    assert all(p.peak_bytes > 0 for p in est)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not isinstance(model, nn.parallel.DistributedDataParallel)


def test_tune_again_for_the_same_model_shows_its_panel_or_says_why_not(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    model = ns["model"]

    def trial(steps: int = 2) -> Trial:
        return Trial(model, ns["x"], _loss, optimizer=ns["opt"], warmup=1, steps=steps)

    tuner = tune(model, "opt", trial=trial(), shell=shell)
    tuner.rerun()
    tuner.set(Config(precision="bf16-autocast"))
    # the cell re-run: a new Trial of the same step gives the same panel, as it was
    again = tune(model, "opt", trial=trial(), shell=shell, budget="1MiB")
    assert again is tuner and [r.label for r in again.results] == ["baseline"]
    assert again.config == Config(precision="bf16-autocast") and again.budget_bytes == 2**20
    assert "Shown again: tune() for this model with the same optimizer variable and trial" in (
        again.panel.messages.value
    )
    # another trial: a fresh panel that says so, the earlier one's bf16 weights reverted
    tuner.set(Config(precision="bf16"))
    tuner.apply()
    fresh = tune(model, "opt", trial=trial(steps=3), shell=shell)
    assert fresh is not tuner and fresh.results == []
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert fresh.panel.precision.label == "fp32 (as is)"
    assert (
        "A fresh panel: the one made before for this model had another trial; its 1 measurement "
        "stays in that tuner&#x27;s results; what it applied (bf16) was reverted."
    ) in fresh.panel.messages.value
    assert tuner.panel.status.value == "replaced by a fresh panel for this model: bf16 reverted"
    other = tune(model, "opt2", shell=shell)
    assert "had the optimizer variable &#x27;opt&#x27;, not &#x27;opt2&#x27;" in (
        other.panel.messages.value
    )
    other.close()  # closed: nothing to show again
    assert tune(model, "opt", trial=trial(steps=3), shell=shell).panel.messages.value == ""


# -- issue 40: what a new user sees on the CPU -------------------------------------------------


def test_apply_and_revert_say_what_they_did_and_applied_follows(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    original = ns["opt"]
    tuner = tune(ns["model"], "opt", shell=shell)
    assert repr(tuner.applied) == "<Applied nothing on Net: the model as it is>"
    assert tuner.applied.optimizer is original and tuner.applied.config == Config()
    tuner.panel.buttons["Revert"].click()
    assert tuner.panel.status.value == "nothing to revert: nothing is applied"
    tuner.set(Config(checkpoint="blocks", optimizer="sgd"))
    tuner.panel.buttons["Apply"].click()
    assert tuner.panel.status.value == (
        "applied ckpt blocks · sgd; opt now names a new SGD (Revert gives the original back)"
    )
    assert "(active)" in repr(tuner.applied) and tuner.applied.config.optimizer == "sgd"
    tuner.panel.buttons["Revert"].click()
    assert tuner.panel.status.value == (
        "reverted ckpt blocks · sgd: the model is as it was; opt names its original optimizer again"
    )
    assert repr(tuner.applied) == "<Applied nothing on Net: the model as it is>"
    assert tuner.applied.optimizer is ns["opt"] is original
    assert not [n for n, m in ns["model"].named_modules() if "forward" in m.__dict__]
    loss = ns["model"](ns["x"]).square().mean()  # the helpers still run a plain step
    tuner.applied.backward(loss)
    tuner.applied.step()
    tuner.set(Config(precision="bf16"))
    tuner.apply()
    assert tuner.panel.status.value == "applied bf16"
    tuner.revert()
    assert tuner.panel.status.value == "reverted bf16: the model is as it was"
    assert all(p.dtype == torch.float32 for p in ns["model"].parameters())


def test_compare_on_the_cell_leaves_nothing_applied_when_nothing_was(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    _run_loop(shell)
    tuner = tune(ns["model"], "opt", shell=shell)
    tuner.compare([Config(optimizer="sgd")])
    assert isinstance(tuner.applied, AsIs) and type(ns["opt"]) is torch.optim.AdamW


def test_the_charts_wait_for_the_first_run_then_name_configurations_short(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns, budget="1MiB")
    panel = tuner.panel
    assert panel.charts.children == () and "appear after the first measurement" in (
        panel.charts_note.value
    )
    two = Config(checkpoint=("blocks.0", "blocks.1"), optimizer="sgd-momentum")
    tuner.compare([two, Config(checkpoint=("blocks.0", "blocks.2"))])
    assert panel.charts.children == (panel.breakdown.widget, panel.tradeoff.figure)
    assert panel.charts_note.value == ""
    rows = tuner.rows
    assert [r["configuration"] for r in rows] == [
        "baseline", "ckpt blocks.0,blocks.1 · sgd-momentum", "ckpt blocks.0,blocks.2"
    ]  # fmt: skip
    short = ["baseline", "ckpt 2 blocks · sgd-momentum", "ckpt 2 blocks"]
    assert [r["chart_label"] for r in rows] == short
    assert list(panel.breakdown.bars.x) == short == list(panel.tradeoff.points.names)
    assert "ckpt blocks.0,blocks.1 · sgd-momentum" in panel.breakdown.names.value
    assert list(panel.breakdown.budget.x) == [1.0, 1.0]  # the budget, in MiB
    assert "budget 1.00 MiB" in panel.breakdown.legend.value
    tuner.panel.budget.value = ""
    assert list(panel.breakdown.budget.x) == []


def test_checkpoint_controls_offer_blocks_and_keep_single_layers_behind_more(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    panel = tuner.panel
    offered = [v for _, v in panel.modules.options]
    assert offered == [*(f"blocks.{i}" for i in range(4)), "blocks", *(
        f"blocks.{i}.mlp" for i in range(4)
    )]  # fmt: skip  # no Linear or GELU
    assert panel.more.selected_index is None and list(panel.block_bars.toggles) == offered[:4]
    tuner.set(Config(checkpoint=("blocks.1", "head")))  # a single layer, set from code
    assert panel.single_layers.value and panel.more.selected_index == 0
    assert tuner.config == Config(checkpoint=("blocks.1", "head"))


def test_all_blocks_and_the_block_toggles_agree_whichever_was_set(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = tune(ns["model"], "opt", shell=shell)
    panel, toggles = tuner.panel, tuner.panel.block_bars.toggles
    tuner.set(Config(checkpoint="blocks"))
    assert panel.all_blocks.value and all(box.value for box in toggles.values())
    assert tuner.config == Config(checkpoint="blocks")
    every = tuple(toggles)
    tuner.set(Config(checkpoint=every))  # a plan that names each block: kept as named
    assert panel.all_blocks.value and tuner.config == Config(checkpoint=every)
    toggles["blocks.3"].value = False
    assert not panel.all_blocks.value and tuner.config == Config(checkpoint=every[:3])
    panel.all_blocks.value = True
    assert tuner.config == Config(checkpoint="blocks") and toggles["blocks.3"].value
    assert "ckpt blocks" in panel.configuration.value


def test_a_checkpoint_of_single_layers_says_so_in_its_row(
    shell: InteractiveShell,
) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    shell.user_ns.update(model=mlp, opt=opt)
    trial = Trial(mlp, torch.randn(64, 32), _loss, optimizer=opt, warmup=1, steps=1)
    tuner = tune(mlp, "opt", trial=trial, shell=shell)
    assert tuner.panel.all_blocks.description == "all 2 blocks"  # the two Linears
    tuner.set(Config(checkpoint="blocks"))
    with pytest.warns(UserWarning, match="found no repeated blocks"):
        tuner.rerun()
    base, ckpt = tuner.rows
    assert ckpt["peak_bytes"] == base["peak_bytes"]
    assert any("found no repeated blocks in this model" in w for w in ckpt["warnings"])
    assert "found no repeated blocks in this model" in tuner.panel.table.value


def test_fit_keeps_the_optimizer_and_says_what_it_chose_and_that_steps_ran_untracked(
    shell: InteractiveShell, ns: dict[str, Any]
) -> None:
    tuner = _trial_tuner(shell, ns)
    # a trial times its steps with nothing tracked: no caveat, on the CPU too
    assert tuner.on_cpu and not tuner.tracked_steps and tuner.panel.steps_note.value == ""
    base, every = tuner.compare([Config(checkpoint="blocks")])
    assert base.peak_allocated_bytes is not None and every.peak_allocated_bytes is not None
    tuner.panel.fit_techniques["precision"].value = False  # keep the test short
    plan = tuner.fit((base.peak_allocated_bytes + every.peak_allocated_bytes) // 2)
    assert isinstance(plan, Plan) and plan.optimizer is None  # not ticked: kept
    shown = tuner.panel.fit_text.value
    first = re.search(r"<b>([^<]*)</b>", shown)
    assert first is not None and first.group(1).startswith("Fit to budget chose: checkpoint ")
    assert first.group(1).endswith("precision kept (fp32); optimizer kept (adamw)")
    assert "Fit may not change the precision or the optimizer" in shown
    assert "compare configurations with each other only" not in shown + tuner.text()
