"""`jupyter_gpumem.tune(model, "opt")`: try memory-saving techniques on a model and measure them.

The panel edits one `Config` (checkpointed modules, precision, optimizer, offloading; the state
on the CPU, which is FSDP2's, and for an inference trial inference mode). Apply puts it on the
model and rebinds the user's optimizer variable; Revert restores the model and the original
optimizer object. Re-run measures the configuration and appends a row: with a `Trial`, the trial
runs it (after a baseline, once); without one, the tuner re-executes the kernel's last `%%gpumem`
cell with the configuration applied and reads that cell's report. Fit to budget, with a `Trial`,
plans the blocks to checkpoint with precision and optimizer (`jupyter_gpumem.tuner.planning.plan`),
verifies the plan by a measured run and shows plan, prediction and measurement side by side;
the panel then shows the plan, so Apply applies exactly it. Without a trial it picks among the
measured rows. Beside each block's checkpoint toggle, a bar gives the block's activation bytes at
the peak of the latest measured run (from its report's peak by module).

The GPUs and strategy selectors make the configuration parallel (FSDP2 on 4 GPUs). Such a
configuration is only estimated or measured through the trial, never put on the kernel's model:
Apply applies the rest of it and says so. "Will it fit on N GPUs?" (`estimate_gpus`) estimates
the configuration on 1, 2, 4 and 8 GPUs with each strategy and draws each rank's peak against
the budget; Re-run with GPUs > 1 measures the ranks, shown outlined in the same chart. The
results sit in two tabs under the status line, "measurements" (the table and its charts) and
"per GPU" (that chart), and each button brings the tab of its answer to the front.

"Search", with a trial and a budget, runs `Trial.search` over checkpointed blocks x precision x
optimizer variant x gradient accumulation (the optimizer's algorithm only when "fit may change"
ticks it), verifies the winner by a measured run where the model holds weights, and draws the
front: memory saved against step-time cost, the budget line, the winner. The panel then holds
exactly the winner, its micro-batches too (the line under the selectors names them), so Apply
applies it; ``tuner.searched`` keeps the `Search`.

Every button calls a public method (`set`, `apply`, `revert`, `rerun`, `compare`, `fit`,
`search`, `estimate_gpus`), so notebooks and tests drive the same code; a button never lets an
exception escape, it shows the message in the panel. Apply and Revert say in the status line
what they did; after Revert (or before any Apply) ``tuner.applied`` is the model as it is and
says so.

"Fit to budget" changes what "fit may change" allows: checkpointing and precision by default,
the optimizer only when ticked, since it is the user's training math. Its first line says what
it chose and what it kept. A trial times its steps with nothing tracked; re-run cells are timed
under the tracker, and on the CPU the panel says that their step times compare configurations
with each other only.

Known limitations:
    - Re-running the user's cell under fp16 autocast scales the loss only if the loop calls
      ``tuner.applied.backward(loss)`` and ``tuner.applied.step()``; the panel says so when the
      cell does not mention them. Autocast itself is entered around the re-run cell.
    - The re-run cell is found in the kernel's input history, so it must have run with history
      stored (as every notebook cell does).
    - A trial lifts the applied configuration while it runs and applies it afresh afterwards; an
      optimizer switch then names a new optimizer object, with empty state.
    - The per-rank chart shows one set of techniques: those of the latest "Will it fit on N
      GPUs?" or parallel measurement. Runs of other techniques stay in the table, estimates of
      other techniques in ``tuner.gpu_estimates``.
    - On the CPU, a re-run cell's steps include the CPU tracker's cost; the panel says so
      beside them.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import ipywidgets as widgets

from jupyter_gpumem.report.record import Report
from jupyter_gpumem.session import collect
from jupyter_gpumem.techniques import (
    PARALLELS,
    Applied,
    Config,
    apply_config,
    blocks,
    checkpoint_targets,
)
from jupyter_gpumem.techniques.optimizers import optimizer_name
from jupyter_gpumem.techniques.precision import precision_name
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.planning.blocks_at_peak import block_activations
from jupyter_gpumem.tuner.planning.fit import FitChoice, fit_to_budget
from jupyter_gpumem.tuner.planning.joint import Search, search
from jupyter_gpumem.tuner.planning.plan import Plan, fit_plan
from jupyter_gpumem.tuner.results import TrialResult, cell_result
from jupyter_gpumem.tuner.trial import Trial
from jupyter_gpumem.tuner.workload import holds_no_weights
from jupyter_gpumem.units import SIZE_HELP, echoed_kind, parse_size
from jupyter_gpumem.widgets import tuner_reuse
from jupyter_gpumem.widgets.chart_labels import chart_label
from jupyter_gpumem.widgets.plan_view import CPU_STEPS, choice_line, kept_line, plan_html
from jupyter_gpumem.widgets.rank_chart import GPU_COUNTS, choice_label, gpu_choices, rank_groups
from jupyter_gpumem.widgets.search_chart import reasoning_html
from jupyter_gpumem.widgets.tuner_charts import AS_IS, GPUS_BUTTON, message_html, rows_text
from jupyter_gpumem.widgets.tuner_panel import SEARCH_BUTTON, SEARCH_NEEDS, Module, Panel

__all__ = ["Tuner", "tune"]

MAGIC = "%%gpumem"
FP16_HELP = (
    "fp16 autocast needs loss scaling, which only happens if the re-run cell calls "
    "tuner.applied.backward(loss) instead of loss.backward() and tuner.applied.step() instead of "
    "optimizer.step(); this cell does not, so its loss was not scaled."
)
NEEDS_TRIAL = (
    "estimates on GPUs need a trial: tune(model, 'opt', trial=Trial(model, batch, loss_fn)), "
    "where loss_fn(model, batch) returns the loss"
)
ACCUMULATE_HELP = (
    "accumulate {k}: loop over tuner.applied.micro_batches(batch), calling "
    "tuner.applied.backward(loss) for each, then tuner.applied.step() once"
)
UNMEASURED = "Not measured: the model holds no weights (meta device); load them to verify."
_MISSING = object()


class AsIs(Applied):
    """Nothing applied: the model as it is, with step helpers that do what a plain loop does."""

    def __repr__(self) -> str:
        return f"<Applied nothing on {type(self.model).__name__}: the model as it is>"


class Tuner(widgets.VBox):
    """A technique-tuner panel bound to ``model`` and the optimizer variable ``optimizer``."""

    def __init__(
        self,
        model: Any,
        optimizer: str = "opt",
        trial: Trial | None = None,
        *,
        budget: str | int | None = None,
        shell: Any = None,
    ) -> None:
        if not optimizer.isidentifier():
            raise ValueError(f"optimizer is the NAME of your optimizer variable, got {optimizer!r}")
        if shell is None:
            from IPython import get_ipython

            shell = get_ipython()
        self.model, self.optimizer_name, self.trial, self.shell = model, optimizer, trial, shell
        self.results: list[TrialResult] = []
        self.plan: Plan | None = None  # the last plan "Fit to budget" made (with a trial)
        self.searched: Search | None = None  # the last search "Search" made
        self._accumulate = 1  # micro-batches: no control of its own; Search and set() set it
        self.gpu_estimates: list[Estimate] = []  # the last "Will it fit on N GPUs?", in order
        self._applied: Applied | None = None
        self._gpu_base: Config | None = None  # the techniques the per-rank chart shows
        self.budget_bytes: int | None = None
        self._ns: dict[str, Any] = shell.user_ns if shell is not None else {}
        self._original: Any = _MISSING
        self._rebound = False
        self._busy = False
        self.panel = self._build_panel()
        super().__init__(self.panel.children)
        self._show_config()
        if budget is not None:
            self.panel.budget.value = str(budget)  # validated by the observer, like typed input
            self.set_budget(budget)

    def show_again(self, budget: str | int | None = None) -> None:
        """Shown again by `tune` (its cell re-run): keep everything, set ``budget`` if given."""
        if budget is not None:
            self.panel.budget.value = str(budget)
            self.set_budget(budget)
        n = len(self.results)
        self.panel.messages.value = ""
        self.panel.say(
            "info",
            [
                f"Shown again: tune() for this model with the same optimizer variable and trial "
                f"gives the panel made before, its {n} measurement{'s' if n != 1 else ''} and "
                "selections kept (tuner.close(), then tune(), for a fresh one)."
            ],
        )

    def give_way(self) -> Config | None:
        """A fresh panel takes the model: revert what this one applied; returns it, if any."""
        held = None if self._applied is None else self._applied.config
        self._revert()
        self.panel.status.value = "replaced by a fresh panel for this model" + (
            f": {held} reverted" if held is not None else ""
        )
        return held

    # -- programmatic API: the buttons call these ---------------------------------------------
    @property
    def config(self) -> Config:
        """The configuration the panel shows; ValueError names a bad regex or a conflict."""
        spec = self.panel.checkpoint_spec()
        gpus, on_cpu = self.panel.gpus.value, self.panel.cpu_offload.value
        return Config(
            checkpoint=spec,
            every=self.panel.every.value,
            precision=self.panel.precision.value or None,  # AS_IS is Config's None
            optimizer=self.panel.optimizer.value or None,
            # the state on the CPU is FSDP2's policy: one rank on one GPU
            parallel=self.panel.strategy.value if gpus > 1 or on_cpu else None,
            world_size=gpus,
            accumulate=self._accumulate,
            offload=self.panel.offload.value or None,
            cpu_offload=on_cpu,
            inference_mode=self.panel.inference_mode.value,
        )

    def set(self, config: Config) -> None:
        """Show ``config`` in the panel (nothing is applied until `apply` or `rerun`)."""
        spec = config.checkpoint
        names = () if spec is None or isinstance(spec, str) else tuple(spec)
        unknown = [n for n in names if n not in self._module_names]
        if unknown:
            raise ValueError(f"the model has no module named {', '.join(map(repr, unknown))}")
        self.panel.show_modules(names)
        if config.every > 1 or (isinstance(spec, str) and spec != "blocks"):
            self.panel.more.selected_index = 0  # where every n-th and the regex are
        with self.hold_trait_notifications():
            self.panel.pick(names, all_blocks=spec == "blocks")  # the block boxes follow
            self.panel.regex.value = spec if isinstance(spec, str) and spec != "blocks" else ""
            self.panel.every.value = config.every
            self.panel.precision.value = config.precision or AS_IS
            self.panel.optimizer.value = config.optimizer or AS_IS
            self.panel.offload.value = config.offload or AS_IS
            self.panel.inference_mode.value = config.inference_mode
            self.panel.cpu_offload.value = config.cpu_offload
            self.panel.set_gpus(config.world_size)
            if config.parallel is not None:
                self.panel.strategy.value = config.parallel
        self._accumulate = config.accumulate
        self._show_config()

    @property
    def applied(self) -> Applied:
        """The active configuration's step helpers (``autocast``, ``backward``, ``step``) for your loop.

        Before any Apply and after Revert, nothing is applied: the helpers are those of the
        model as it is (no autocast, a plain backward and step of your optimizer).
        """
        if self._applied is not None:
            return self._applied
        import torch  # the techniques have imported it

        current = self._ns.get(self.optimizer_name)
        opt = current if isinstance(current, torch.optim.Optimizer) else None
        return AsIs(self.model, opt, Config(), (), None, [], opt)

    def apply(self) -> Applied:
        """Apply the panel's configuration (reverting any earlier one first).

        A parallel configuration is applied without its GPUs and strategy: it would wrap or
        shard the model for a process group this kernel does not have. The panel says so.
        The status line says what was applied.
        """
        config = self.config
        applied = self._apply(config.single)
        if config.parallel is not None:
            self.panel.say("info", [parallel_not_applied(config)])
        if config.accumulate > 1:
            self.panel.say("info", [ACCUMULATE_HELP.format(k=config.accumulate)])
        rebound = (
            f"; {self.optimizer_name} now names a new {type(applied.optimizer).__name__} "
            "(Revert gives the original back)"
            if self._rebound
            else ""
        )
        what = "nothing (the model as it is)" if config.single == Config() else str(config.single)
        self.panel.status.value = f"applied {what}{rebound}"
        return applied

    def revert(self) -> None:
        """Undo the applied configuration; the optimizer variable gets its original object back.

        The status line says what was reverted; ``tuner.applied`` is the model as it is again.
        """
        held, rebound = self._applied, self._rebound
        self._revert()
        if held is None:
            self.panel.status.value = "nothing to revert: nothing is applied"
            return
        back = f"; {self.optimizer_name} names its original optimizer again" if rebound else ""
        self.panel.status.value = f"reverted {held.config}: the model is as it was{back}"

    def _revert(self) -> None:
        applied, self._applied = self._applied, None
        if applied is not None:
            applied.revert()
        if self._rebound:
            if self._original is _MISSING:
                self._ns.pop(self.optimizer_name, None)
            else:
                self._ns[self.optimizer_name] = self._original
            self._rebound = False
        self._original = _MISSING

    def rerun(self) -> TrialResult | Report:
        """Measure the panel's configuration (after the baseline, once) and append its row.

        Returns the TrialResult, or the new `%%gpumem` report when the user's cell was re-run.
        """
        config = self.config
        result = self._measure_all([config], keep=True)[-1]
        return result.report if self.trial is None and result.report is not None else result

    def estimate_gpus(
        self, counts: Sequence[int] = GPU_COUNTS, strategies: Sequence[str] = PARALLELS
    ) -> list[Estimate]:
        """Estimate the panel's configuration on each count of GPUs with each strategy.

        One GPU is estimated once, without a strategy. The per-rank chart shows each rank's
        predicted peak against the budget; an estimate that fails shows its reason in the
        panel's messages (and has ``peak_bytes`` None). Returns the estimates in chart order.
        """
        if self.trial is None:
            raise RuntimeError(NEEDS_TRIAL)
        configs = gpu_choices(self.config, counts, strategies)
        if self._busy:
            raise RuntimeError("the tuner is already measuring")
        self._busy = True
        self.panel.progress.max, self.panel.progress.value = len(configs), 0
        found: list[Estimate] = []
        try:
            with self._trial_scope():
                for i, config in enumerate(configs, 1):
                    self.panel.status.value = f"estimating {i} of {len(configs)}: {config}"
                    found.append(_estimate(self.trial, config))
                    self.panel.progress.value = i
        finally:
            self._busy = False
        self.gpu_estimates, self._gpu_base = found, configs[0].single
        failed = [e for e in found if e.peak_bytes is None]
        self.panel.say(
            "warning",
            [f"{choice_label(e.config)}: not estimated: {e.reason}" for e in failed],
        )
        self.panel.status.value = f"estimated {len(found) - len(failed)} of {len(found)} choices"
        self._refresh()
        self.panel.show_view("per GPU")
        return found

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]:
        """Measure each configuration in turn (baseline first if needed); the panel's state is kept."""
        return self._measure_all(list(configs), keep=False)

    @property
    def baseline(self) -> TrialResult | None:
        """The measured baseline (`Config()`), else the first measurement."""
        base = [r for r in self.results if r.config == Config() and r.status == "ok"]
        return base[-1] if base else (self.results[0] if self.results else None)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict of plain numbers per measurement, with deltas against the baseline, and
        its configuration's short name for the charts (``chart_label``)."""
        base = self.baseline
        return [
            {
                **r.to_row(base, self.budget_bytes),
                "chart_label": self._chart_label(r),
                "status": r.status,
                "error": r.error,
                "breakdown": dict(r.breakdown) if r.breakdown else None,
                "warnings": tuple(r.warnings),
            }
            for r in self.results
        ]

    def text(self) -> str:
        """The results table as fixed-width text (cells re-run on the CPU: with what their step
        times mean)."""
        table = rows_text(self.rows)
        return f"{table}\n{CPU_STEPS}" if self.tracked_steps and self.results else table

    @property
    def on_cpu(self) -> bool:
        """Whether the measured steps run on the CPU (the trial's device, else the model's)."""
        if self.trial is not None:
            device = self.trial.device
        else:
            first = next(iter(self.model.parameters()), None)
            device = None if first is None else first.device
        return getattr(device, "type", device) == "cpu"

    @property
    def tracked_steps(self) -> bool:
        """Whether step times carry the tracker's cost: re-run cells on the CPU (a trial times
        its steps with nothing tracked)."""
        return self.trial is None and self.on_cpu

    def _chart_label(self, r: TrialResult) -> str:
        full = str(r.config)
        prefix = r.label[: -len(full)] if r.label.endswith(full) else ""
        return chart_label(r.config, self.panel.blocks, prefix)

    def set_budget(self, budget: str | int | None) -> int | None:
        """Set the memory budget from "12GiB" or bytes; ValueError says what sizes look like."""
        if budget is None or (isinstance(budget, str) and not budget.strip()):
            self.budget_bytes = None
        elif isinstance(budget, int):
            if budget <= 0:
                raise ValueError(f"budget must be greater than zero bytes, got {budget}")
            self.budget_bytes = budget
        else:
            self.budget_bytes = parse_size(budget)
        self.panel.enable_search(budget=self.budget_bytes is not None)
        self._refresh()
        return self.budget_bytes

    def fit(
        self, budget: str | int | None = None, techniques: Sequence[str] | None = None
    ) -> Plan | FitChoice:
        """Fit the budget and show the answer in the panel, ready for Apply.

        ``techniques`` names what the fit may change (by default the ones ticked under "fit
        may change": checkpointing and precision, not the optimizer). With a trial:
        ``fit_plan`` plans, verifies the plan by a measured run, and the panel shows the plan,
        its prediction and its measurement side by side; returns the Plan. Without one: the
        measured configuration that fits at the least step time among those that change only
        what is allowed; returns the FitChoice. The first line says what was chosen and kept.
        """
        if budget is not None:
            self.set_budget(budget)
        if self.budget_bytes is None:
            raise ValueError("set a budget first, e.g. tuner.fit('12GiB')")
        if self.trial is not None and self.trial.inference:
            raise ValueError(
                "Fit to budget plans training steps, and the trial is an inference trial: "
                "tick inference mode, or compare precisions and checkpointing with Re-run"
            )
        if techniques is None:
            techniques = [n for n, box in self.panel.fit_techniques.items() if box.value]
        self.panel.hide_search()  # the panel shows one answer: this fit's
        if self.trial is not None:
            return self._fit_plan(self.trial, self.budget_bytes, techniques)
        if not self.results:
            raise ValueError("nothing is measured yet: press Re-run or call tuner.compare([...])")
        allowed = [r for r in self.results if _changes_only(r.config, techniques)]
        baseline = self.baseline
        choice = fit_to_budget(allowed or self.results, self.budget_bytes, baseline)
        chosen = [r.config for r in self.results if r.label == choice.chosen]
        lines = [choice_line(chosen[-1] if chosen else None, **self._now())]
        kept = kept_line(techniques)
        left_out = [r.label for r in self.results if r not in allowed]
        if kept and left_out:
            lines.append(f"{kept} Left out: {', '.join(dict.fromkeys(left_out))}.")
        lines += list(choice.reasoning)
        if chosen:
            self.set(chosen[-1])
            lines.append("The panel now shows it: press Apply to use it.")
        if self.tracked_steps:
            lines.append(CPU_STEPS)
        first, *rest = (html.escape(line) for line in lines)
        self.panel.fit_text.value = f"<b>{first}</b><br>" + "<br>".join(rest)
        self.panel.show_view("measurements")  # where its rows are
        return choice

    def search(self, budget: str | int | None = None, allow: Sequence[str] | None = None) -> Search:
        """Search every combination of techniques within the budget (`Trial.search`), verify
        the winner where the model holds weights, and show the front and the reasoning.

        ``allow`` names changes to the training math (by default "optimizer" when "fit may
        change" ticks it). The panel then holds exactly the winner, so Apply applies it; the
        verified run joins the table (after the baseline, measured once if it is not yet).
        Returns the `Search`; ``tuner.searched`` keeps it.
        """
        if self.trial is None:
            raise RuntimeError(SEARCH_NEEDS["trial"])
        if self.trial.inference:
            raise ValueError(SEARCH_NEEDS["training"])
        if budget is not None:
            self.set_budget(budget)
        if self.budget_bytes is None:
            raise ValueError("set a budget first, e.g. tuner.search('12GiB')")
        if allow is None:
            allow = ("optimizer",) if self.panel.fit_techniques["optimizer"].value else ()
        if self._busy:
            raise RuntimeError("the tuner is already measuring")
        trial, weights = self.trial, not holds_no_weights(self.trial.model)
        self._busy = True
        added: list[TrialResult] = []
        try:
            with self._trial_scope():
                found = search(trial, self.budget_bytes, allow=allow, progress=self._progress)
                if found.config is not None and weights:
                    base = self.baseline
                    if base is None:  # the table's deltas need one
                        self.panel.status.value = "measuring the baseline for the table"
                        base = trial.run(Config())
                        added.append(base)
                    self.panel.status.value = f"verifying {found.config}"
                    found.verify(baseline=base)  # its change is the table's
        finally:
            self._busy = False
        if found.result is not None:
            added.append(replace(found.result, label=f"search · {found.result.label}"))
        self.results.extend(added)
        self.searched = found
        if found.config is not None:
            self.set(found.config)
        self.panel.fit_text.value = ""  # the panel shows one answer: this search's
        unmeasured = UNMEASURED if not weights else ""
        self.panel.show_search(found, reasoning_html(found, unmeasured=unmeasured))
        self.panel.show_view("measurements")  # where its rows are
        self.panel.status.value = (
            "searched: nothing fits"
            if found.config is None
            else "searched and verified"
            if found.result is not None
            else "searched"
        )
        self._refresh()
        return found

    def _now(self) -> dict[str, Any]:
        """The blocks, and the precision and optimizer as they are, for `choice_line`."""
        return {
            "blocks": self.panel.blocks,
            "precision_now": precision_name(self.model),
            "optimizer_now": optimizer_name(self._ns.get(self.optimizer_name))
            or (optimizer_name(self.trial.optimizer) if self.trial is not None else None),
        }

    def _fit_plan(self, trial: Trial, budget_bytes: int, techniques: Sequence[str]) -> Plan:
        if self._busy:
            raise RuntimeError("the tuner is already measuring")
        self._busy = True
        try:
            with self._trial_scope():
                # ticking "optimizer" is the opt-in to another algorithm; pure bf16 stays out
                allow = ("optimizer",) if "optimizer" in techniques else ()
                plan = fit_plan(
                    trial, budget_bytes, techniques, allow=allow, progress=self._progress
                )
        finally:
            self._busy = False
        base, shown = plan.baseline, self.baseline
        if base is not None and (shown is None or shown.step_s_all != base.step_s_all):
            # the plan's changes are against its baseline: the table's are too, from now on
            self.results.append(base if shown is None else replace(base, label="plan · baseline"))
        if plan.result is not None:
            self.results.append(replace(plan.result, label=f"plan · {plan.result.label}"))
        self.plan = plan
        self.set(plan.config)
        now = self._now()
        self.panel.fit_text.value = plan_html(
            plan.to_dict(),
            precision_now=now["precision_now"],
            optimizer_now=now["optimizer_now"],
            allowed=techniques,
        )
        self.panel.status.value = "planned and verified" if plan.result else "planned"
        self.panel.show_view("measurements")  # where its rows are
        self._refresh()
        return plan

    def _progress(self, line: str) -> None:
        self.panel.status.value = line

    # -- measuring ---------------------------------------------------------------------------
    def _measure_all(self, configs: list[Config], *, keep: bool) -> list[TrialResult]:
        if self._busy:
            raise RuntimeError("the tuner is already measuring (does the re-run cell call it?)")
        if self.baseline is None and Config() not in configs:
            configs.insert(0, Config())
        before = self._applied.config if self._applied is not None else None
        self._busy = True
        self.panel.progress.max, self.panel.progress.value = len(configs), 0
        out: list[TrialResult] = []
        try:
            with self._trial_scope():
                for i, config in enumerate(configs, 1):
                    self.panel.status.value = f"measuring {i} of {len(configs)}: {config}"
                    if config.parallel is not None:
                        self._gpu_base = config.single
                    out.append(self._measure(config))
                    self.results.append(out[-1])
                    self.panel.progress.value = i
                    self._refresh()
            self.panel.status.value = f"measured {len(out)} configuration(s)"
            ranks = any(c.parallel is not None for c in configs)
            self.panel.show_view("per GPU" if ranks else "measurements")
        finally:
            self._busy = False
            if self.trial is None and not keep:
                if before is None:
                    self._revert()  # nothing was applied before: nothing is now
                else:
                    self._apply(before)
        return out

    @contextlib.contextmanager
    def _trial_scope(self) -> Iterator[None]:
        """A trial applies its own configurations: lift the panel's one while it runs."""
        held = None if self.trial is None or self._applied is None else self._applied.config
        if held is not None:
            self._revert()
        try:
            yield
        finally:
            if held is not None:
                self._apply(held)

    def _measure(self, config: Config) -> TrialResult:
        if self.trial is not None:
            return self.trial.run(config)
        if config.parallel is not None:
            raise RuntimeError(
                f"measuring {choice_label(config)} starts its ranks through a trial: "
                "tune(model, 'opt', trial=Trial(model, batch, loss_fn)); the re-run cell runs "
                "in this one process, on 1 GPU"
            )
        if self._applied is None or self._applied.config != config:
            self._apply(config)
        return self._run_cell(config)

    def _apply(self, config: Config) -> Applied:
        self._revert()
        current = self._ns.get(self.optimizer_name, _MISSING)
        applied = apply_config(self.model, config, None if current is _MISSING else current)
        self._applied = applied
        if config.optimizer is not None:
            self._original, self._rebound = current, True
            self._ns[self.optimizer_name] = applied.optimizer
        self.panel.say("warning", applied.warnings)
        return applied

    def _cell_source(self) -> str:
        """The last `%%gpumem` cell of this kernel's input history."""
        inputs = getattr(getattr(self.shell, "history_manager", None), "input_hist_raw", [])
        for source in reversed(inputs):
            if source.lstrip().startswith(MAGIC):
                return str(source.lstrip())
        raise RuntimeError(
            "no %%gpumem cell has run in this kernel yet: run your training cell under %%gpumem "
            "once, or pass trial=Trial(model, batch, loss_fn) to tune()"
        )

    def _run_cell(self, config: Config) -> TrialResult:
        """Re-execute the last `%%gpumem` cell under ``config`` and read its report."""
        source = self._cell_source()
        notes: list[str] = []
        if config.precision == "fp16-autocast" and not any(
            w in source for w in ("applied", "scaler")
        ):
            notes.append(FP16_HELP)
            self.panel.say("warning", notes)
        error: Exception | None = None
        # The cell as IPython runs it (one run_cell_magic call), so that its report has the
        # same cell key as the original run.
        code = compile(self.shell.transform_cell(source), "<gpumem tuner re-run>", "exec")
        with self.panel.cell_output, self.applied.autocast(), collect() as made:
            try:
                exec(code, self.shell.user_ns)
            except Exception as exc:  # the cell's own error: its report says so
                error = exc
        if not made:
            raise RuntimeError(f"the %%gpumem cell made no report ({error!r})")
        return cell_result(made[-1], config, notes)

    # -- widgets ----------------------------------------------------------------------------
    def _build_panel(self) -> Panel:
        first = blocks(self.model)
        kinds = dict(self.model.named_modules())
        self._module_names = first + [n for n in kinds if n and n not in first]
        params = sum(p.numel() for p in self.model.parameters())
        title = (
            f"<b>Technique tuner</b>: {html.escape(type(self.model).__name__)}, {params:,} "
            f"parameters, optimizer variable <code>{html.escape(self.optimizer_name)}</code>"
        )
        modules = [
            Module(n, type(kinds[n]).__name__, not any(True for _ in kinds[n].children()))
            for n in self._module_names
        ]
        panel = Panel(
            title,
            modules,
            first,
            self.optimizer_name,
            precision_now=precision_name(self.model),
            optimizer_now=optimizer_name(self._ns.get(self.optimizer_name)),
            tracked_steps=self.tracked_steps,
            trial=self.trial is not None,
            inference=self.trial is not None and self.trial.inference,
        )
        actions: dict[str, Callable[[], object]] = {
            "Apply": self.apply, "Revert": self.revert, "Re-run": self.rerun, "Fit to budget": self.fit,
            SEARCH_BUTTON: self.search, GPUS_BUTTON: self.estimate_gpus,
        }  # fmt: skip
        for name, action in actions.items():
            panel.buttons[name].on_click(self._guard(action))
        panel.budget.observe(self._on_budget, names="value")
        for control in (
            panel.all_blocks,
            panel.modules,
            panel.regex,
            panel.every,
            panel.precision,
            panel.optimizer,
            panel.offload,
            panel.inference_mode,
            panel.cpu_offload,
            panel.gpus,
            panel.strategy,
        ):
            control.observe(self._show_config, names="value")
        return panel

    def _show_config(self, _: Any = None) -> None:
        """The configuration line under the selectors: what Apply would apply."""
        try:
            self.panel.show_config(str(self.config))
        except ValueError as exc:
            self.panel.show_config("", error=str(exc))

    def _guard(self, action: Callable[[], object]) -> Callable[[Any], None]:
        """A button callback: run ``action``, show any exception as text in the panel."""

        def callback(_: Any = None) -> None:
            self.panel.messages.value = ""
            try:
                action()
            except Exception as exc:
                self.panel.status.value = "failed"
                self.panel.say("error", [f"{type(exc).__name__}: {exc}"])

        return callback

    def _on_budget(self, change: dict[str, Any]) -> None:
        try:
            self.set_budget(change["new"])
            self.panel.budget_error.value = ""
        except ValueError as exc:
            self.panel.budget_error.value = message_html("error", f"budget: {exc}")

    def _refresh(self) -> None:
        self.panel.show(self.rows, self.budget_bytes)
        self._show_blocks()
        self._show_ranks()

    def _show_ranks(self) -> None:
        """The per-rank chart: estimates and runs of the techniques last tried on GPUs."""
        base = self._gpu_base
        groups = rank_groups(self.gpu_estimates, self.results, base)
        title = "peak per GPU" if base is None or base == Config() else f"peak per GPU: {base}"
        self.panel.show_ranks(groups, self.budget_bytes, title)

    def _show_blocks(self) -> None:
        """The block bars from the latest run whose report has the peak by module."""
        names = self.panel.block_bars.names
        for r in reversed(self.results):
            figures = block_activations(r.report, names)
            if figures:
                status = "" if r.status == "ok" else f" ({r.status})"
                checkpointed = self._checkpointed(r.config, names)
                self.panel.block_bars.update(figures, f"{r.label}{status}", checkpointed)
                return
        self.panel.block_bars.update({})

    def _checkpointed(self, config: Config, names: Sequence[str]) -> frozenset[str]:
        """The blocks among ``names`` that ``config`` checkpoints, whole or as part of a region."""
        try:
            targets = checkpoint_targets(self.model, config.checkpoint, config.every)
        except ValueError:  # a configuration that could not be applied checkpointed nothing
            return frozenset()
        return frozenset(n for n in names if any(n == t or n.startswith(f"{t}.") for t in targets))


def _changes_only(config: Config, techniques: Sequence[str]) -> bool:
    """Whether ``config`` changes only what ``techniques`` allows (GPUs are not a technique)."""
    changed = {
        "checkpoint": config.checkpoint is not None,
        "precision": config.precision is not None,
        "optimizer": config.optimizer is not None,
    }
    return all(t in techniques for t, on in changed.items() if on)


def parallel_not_applied(config: Config) -> str:
    """Why Apply left out the GPUs and strategy of ``config``."""
    rest = config.single
    applied = "nothing (the model as it is)" if rest == Config() else str(rest)
    return (
        f"Apply left out {choice_label(config)}: a parallel configuration is never put on this "
        f'kernel\'s model, only estimated ("{GPUS_BUTTON}") or measured on its ranks '
        f"(Re-run, with a trial). Applied: {applied}."
    )


def _estimate(trial: Trial, config: Config) -> Estimate:
    """``trial.estimate(config=config)``; an exception becomes an estimate that says why."""
    try:
        return trial.estimate(config=config)
    except Exception as exc:  # one choice that cannot be estimated leaves the others
        return Estimate(
            label=str(config), device=str(trial.device), peak_bytes=None,
            peak_reserved_bytes=None, breakdown=None, phase=None,
            reason=f"{type(exc).__name__}: {exc}", config=config,
        )  # fmt: skip


def tune(
    model: Any,
    optimizer: str = "opt",
    trial: Trial | None = None,
    *,
    budget: str | int | None = None,
    shell: Any = None,
) -> Tuner:
    """A technique-tuner panel for ``model``; ``optimizer`` names the user's optimizer variable.

    Each argument is checked first: a TypeError or ValueError says what it takes. Called
    again for the same model, optimizer variable and trial (re-running its cell), it returns
    the open panel it made before, measurements kept; otherwise a fresh one that says so.
    """
    _check_tune(model, optimizer, trial, budget, shell)
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    before = tuner_reuse.earlier(model, shell)
    change = None if before is None else tuner_reuse.differs(before, optimizer, trial)
    if before is not None and change is None:
        before.show_again(budget)
        return before
    reverted = None if before is None else before.give_way()
    tuner = Tuner(model, optimizer, trial, budget=budget, shell=shell)
    if before is not None:
        tuner.panel.say("info", [fresh_line(before, change or "", reverted)])
    tuner_reuse.remember(tuner)
    return tuner


def fresh_line(before: Tuner, change: str, reverted: Config | None) -> str:
    """What a fresh panel says of the one made before for its model."""
    n = len(before.results)
    kept = (
        f"its {n} measurement{'s stay' if n != 1 else ' stays'} in that tuner's results"
        if n
        else ""
    )
    undone = f"what it applied ({reverted}) was reverted" if reverted is not None else ""
    done = "; ".join(p for p in (kept, undone) if p)
    return (
        f"A fresh panel: the one made before for this model had {change}"
        + (f"; {done}" if done else "")
        + ". tune() with its optimizer variable and trial shows that one again."
    )


def _check_tune(model: Any, optimizer: Any, trial: Any, budget: Any, shell: Any) -> None:
    import torch  # the techniques have imported it

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tune() takes the torch.nn.Module to tune, got {echoed_kind(model)}")
    name = "optimizer is the NAME of your optimizer variable, e.g. tune(model, 'opt')"
    if not isinstance(optimizer, str):
        raise TypeError(f"{name}; got {echoed_kind(optimizer)}")
    if not optimizer.isidentifier():
        raise ValueError(f"{name}; got {echoed_kind(optimizer)}")
    if trial is not None and not isinstance(trial, Trial):
        raise TypeError(
            "trial takes a jupyter_gpumem.Trial, e.g. trial=Trial(model, batch, loss_fn), or "
            f"None; got {echoed_kind(trial)}"
        )
    sizes = f"budget takes {SIZE_HELP}, a number of bytes above 0, or None"
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (str, int))):
        raise TypeError(f"{sizes}; got {echoed_kind(budget)}")
    try:
        if isinstance(budget, int) and budget <= 0:
            raise ValueError
        if isinstance(budget, str) and budget.strip():
            parse_size(budget)
    except ValueError:
        raise ValueError(f"{sizes}; got {echoed_kind(budget)}") from None
    if shell is not None and not isinstance(getattr(shell, "user_ns", None), Mapping):
        raise TypeError(
            f"shell takes an IPython shell (get_ipython()), or None for this kernel's; got "
            f"{echoed_kind(shell)}"
        )
