"""The technique tuner's form in its layout, without behaviour: `Tuner` wires it.

"Search" (with a trial and a budget) shows what ``Trial.search`` found: its reasoning beside
the chart of its front (`jupyter_gpumem.widgets.search_chart`). A line under the selectors names
the configuration the panel holds, gradient accumulation included, which has no control of its
own: Search sets it, Apply applies it. With pure bf16 it says what Revert keeps.

Checkpointing offers the model's repeated blocks first: "all N blocks" and a toggle per block
beside its activations at the peak; "all" ticks every toggle and is ticked while all are. Everything else (other modules, every n-th, a regex) is
behind the "more checkpoint choices" disclosure, open only for a model without repeated blocks;
its module list leaves out single layers (a Linear, a Dropout, a LayerNorm: checkpointing one
frees next to nothing) until "list single layers too" is ticked. Until a run has a breakdown,
the charts are not drawn and a line says when they come.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import ipywidgets as widgets

from jupyter_gpumem.techniques import OFFLOADS, OPTIMIZERS, PARALLELS, PRECISIONS
from jupyter_gpumem.widgets.block_bars import BlockBars
from jupyter_gpumem.widgets.plan_view import CPU_STEPS
from jupyter_gpumem.widgets.rank_chart import GPU_COUNTS, RankChart, RankGroup
from jupyter_gpumem.widgets.search_chart import SearchChart
from jupyter_gpumem.widgets.tuner_charts import (
    AS_IS,
    CATEGORY_COLORS,
    GPUS_BUTTON,
    BreakdownChart,
    Row,
    TradeoffChart,
    message_html,
    rows_html,
)

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.planning.joint import Search

__all__ = [
    "CHARTS_LATER",
    "FIT_TECHNIQUES",
    "GPUS_LATER",
    "SEARCH_BUTTON",
    "VIEWS",
    "Module",
    "Panel",
    "gpu_options",
]

# What "Fit to budget" may change, and whether it may by default: the optimizer is the user's
# training math, so a fit keeps it unless asked.
FIT_TECHNIQUES = {"checkpoint": True, "precision": True, "optimizer": False}
CHARTS_LATER = "The charts appear after the first measurement: press Re-run or Fit to budget."
# Under the configuration line while the precision is pure bf16 (techniques.precision).
PURE_BF16 = (
    "pure bf16 casts the weights, their gradients and the optimizer state to bf16. Revert casts "
    "them back to their dtypes and keeps what was trained meanwhile, at bf16 precision; a value "
    "training left as it was comes back bit for bit."
)
GPUS_LATER = (
    f'"{GPUS_BUTTON}" estimates each GPU\'s peak on '
    f"{', '.join(map(str, GPU_COUNTS[:-1]))} and {GPU_COUNTS[-1]} GPUs with each strategy (it "
    "needs a trial); Re-run with more than 1 GPU measures them."
)
VIEWS = ("measurements", "per GPU")  # the tabs under the status line
NO_BREAKDOWN = "No measurement has a breakdown to chart yet (see the notes in the table)."
SEARCH_BUTTON = "Search"
SEARCH_NEEDS = {
    "trial": "Search needs a trial: tune(model, 'opt', trial=Trial(model, batch, loss_fn))",
    "training": "Search plans training steps, and the trial is an inference trial",
    "budget": "Search needs a budget: type one, e.g. 12GiB",
}


class Module(NamedTuple):
    """A module the checkpoint list may offer."""

    name: str
    kind: str  # its class name
    single: bool  # a single layer: no submodules


def gpu_options(counts: Sequence[int]) -> list[tuple[str, int]]:
    """The GPUs dropdown's choices: ``("1 GPU", 1), ("2 GPUs", 2), ...``."""
    return [(f"{n} GPU" + ("s" if n > 1 else ""), n) for n in counts]


def _wrap() -> widgets.Layout:
    return widgets.Layout(flex_flow="row wrap", align_items="center")


def _muted(text: str) -> str:
    return f'<div style="color:var(--jp-ui-font-color2,#616161)"><em>{text}</em></div>'


class Panel:
    """The tuner's widgets in their layout: ``children`` goes into the Tuner's VBox."""

    def __init__(
        self,
        title_html: str,
        modules: Sequence[Module],
        blocks: Sequence[str],
        optimizer: str,
        *,
        precision_now: str | None = None,
        optimizer_now: str | None = None,
        tracked_steps: bool = False,
        trial: bool = False,
        inference: bool = False,
    ) -> None:
        self.blocks = tuple(blocks)
        self._trial = trial
        self._inference = inference
        self._modules = {m.name: m for m in modules}
        self.modules = widgets.SelectMultiple(
            options=self._options(single=False),
            rows=8,
            description="modules",
            layout=widgets.Layout(width="50%"),
        )
        # a toggle per block beside its activations at the peak, in step with the list
        self.block_bars = BlockBars(blocks, CATEGORY_COLORS["activations"])
        self.block_bars.follow(self.modules)
        self.all_blocks = widgets.Checkbox(
            description=f"all {len(blocks)} blocks", disabled=not blocks, indent=False
        )
        # ticked by hand (or by `Tuner.set` with "blocks"), not because each block was picked
        self.all_chosen = False
        self._echo = False  # the all box set by the blocks' own boxes, not by the user
        self.all_blocks.observe(self._on_all_blocks, names="value")
        self.modules.observe(self._on_picked, names="value")
        kinds = sorted({m.kind for m in modules if m.single and m.name not in self.blocks})
        shown = ", ".join(kinds[:4]) + (", ..." if len(kinds) > 4 else "")
        self.single_layers = widgets.Checkbox(
            description=f"list single layers too ({shown})" if kinds else "list single layers too",
            disabled=not kinds,
            indent=False,
            layout=widgets.Layout(width="auto"),
        )
        self.single_layers.observe(self._on_single_layers, names="value")
        self.every = widgets.BoundedIntText(value=1, min=1, max=10**6, description="every n-th")
        self.regex = widgets.Text(description="or regex", placeholder=r"e.g. h\.\d+")
        self.more = widgets.Accordion(
            children=[
                widgets.HBox(
                    [self.modules, widgets.VBox([self.single_layers, self.every, self.regex])]
                )
            ],
            titles=("more checkpoint choices: other modules, every n-th, a regex",),
            selected_index=None if blocks else 0,
        )
        # The first choice is the model as it is, named by what it is (AS_IS is Config's None).
        self.precision = widgets.Dropdown(
            options=[(f"{precision_now or 'as is'} (as is)", AS_IS), *((p, p) for p in PRECISIONS)],
            value=AS_IS,
            description="precision",
        )
        now = f"{optimizer_now} (as is: {optimizer})" if optimizer_now else f"as is ({optimizer})"
        self.optimizer = widgets.Dropdown(
            options=[(now, AS_IS), *((o, o) for o in OPTIMIZERS)],
            value=AS_IS,
            description="optimizer",
            disabled=inference,  # an inference step has none
        )
        # Where what the forward saves waits in host memory (off: on the device, as is).
        self.offload = widgets.Dropdown(
            options=[("off", AS_IS), *((f"{w} to host", w) for w in OFFLOADS)],
            value=AS_IS,
            description="offload",
            layout=widgets.Layout(width="220px"),
        )
        # Parameters, gradients and optimizer state in host memory, the optimizer stepping
        # there: FSDP2's CPUOffloadPolicy, on one rank per GPU (one GPU too).
        self.cpu_offload = widgets.Checkbox(
            description="state on CPU (FSDP2)",
            indent=False,
            disabled=inference,
            tooltip="parameters, gradients and optimizer state in host memory; the optimizer "
            "steps there (FSDP2's CPUOffloadPolicy, measured on its ranks)",
            layout=widgets.Layout(width="auto", margin="2px 0 2px 16px"),
        )
        self.cpu_offload.observe(self._on_cpu_offload, names="value")
        # An inference trial's forward under torch.inference_mode (shown for one alone).
        self.inference_mode = widgets.Checkbox(
            description="inference mode",
            indent=False,
            layout=widgets.Layout(
                width="auto", margin="2px 0 2px 16px", display=None if inference else "none"
            ),
        )
        # How many GPUs, and how the model is spread over them (ignored on one GPU).
        self.gpus = widgets.Dropdown(
            options=gpu_options(GPU_COUNTS),
            value=1,
            description="GPUs",
            disabled=inference,  # ranks run training steps
            style={"description_width": "initial"},
            layout=widgets.Layout(width="150px", margin="2px 0 2px 24px"),
        )
        self.strategy = widgets.Dropdown(
            options=list(PARALLELS),
            value=PARALLELS[0],
            description="strategy",
            disabled=True,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="160px", margin="2px 0 2px 16px"),
        )
        self.gpus.observe(self._on_gpus, names="value")
        self.budget = widgets.Text(
            description="budget", placeholder="e.g. 12GiB", continuous_update=False
        )
        self.budget_error = widgets.HTML()
        # What "Fit to budget" may change (with a trial, it plans and verifies).
        self.fit_techniques = {
            name: widgets.Checkbox(value=default, description=name, indent=False,
                                   layout=widgets.Layout(width="auto"))
            for name, default in FIT_TECHNIQUES.items()
        }  # fmt: skip
        self.buttons = {
            name: widgets.Button(description=name, button_style=style)
            for name, style in (
                ("Apply", "primary"), ("Revert", ""), ("Re-run", "success"),
                ("Fit to budget", "info"), (SEARCH_BUTTON, "info"), (GPUS_BUTTON, "warning"),
            )
        }  # fmt: skip
        self.enable_search(budget=False)
        # the configuration the panel holds, in words: what Apply applies
        self.configuration = widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
        self.buttons[GPUS_BUTTON].layout.width = "auto"  # its question whole
        self.progress = widgets.IntProgress(min=0, max=1, layout=widgets.Layout(width="30%"))
        self.status = widgets.Label("not measured yet")
        self.messages = widgets.HTML()
        self.table = widgets.HTML(rows_html([]))
        # a standing note under the table: cells re-run on the CPU carry the tracker's cost
        self.steps_note = widgets.HTML(_muted(CPU_STEPS) if tracked_steps else "")
        self.fit_text = widgets.HTML()
        # what Search found: its reasoning beside the chart of its front; empty until then
        self.search_text = widgets.HTML(layout=widgets.Layout(flex="1 1 0", padding="0 0 0 12px"))
        self.search_chart = SearchChart()
        self.search_view = widgets.HBox()
        self.breakdown, self.tradeoff = BreakdownChart(), TradeoffChart()
        self.charts = widgets.HBox()  # empty until a run has something to draw
        self.charts_note = widgets.HTML(_muted(CHARTS_LATER))
        self.ranks = RankChart()  # empty until something ran or was estimated on GPUs
        self.ranks_note = widgets.HTML(_muted(GPUS_LATER))
        # The results right under the status line, one view at a time: the measurements, or
        # each GPU's peak, which "Will it fit on N GPUs?" brings to the front.
        self.views = widgets.Tab(
            children=[
                widgets.VBox([self.table, self.steps_note, self.charts_note, self.charts]),
                widgets.VBox([self.ranks_note, self.ranks.widget]),
            ],
            titles=VIEWS,
            selected_index=0,
        )
        self.cell_output = widgets.Output()
        checkpoint = (
            widgets.HBox(
                [
                    widgets.VBox(
                        [widgets.HTML("<b>checkpoint</b>"), self.all_blocks],
                        layout=widgets.Layout(width="9em"),
                    ),
                    self.block_bars.widget,
                ]
            )
            if blocks
            else widgets.HTML(
                "<b>checkpoint</b>: the model has no repeated blocks; pick modules below."
            )
        )
        self.children: list[widgets.Widget] = [
            widgets.HTML(title_html),
            checkpoint,
            self.more,
            # rows that wrap where the notebook is narrow, so that no control is cut off
            widgets.HBox(
                [
                    self.precision,
                    self.optimizer,
                    self.offload,
                    self.inference_mode,
                    self.cpu_offload,
                    self.gpus,
                    self.strategy,
                ],
                layout=_wrap(),
            ),
            self.configuration,
            widgets.HBox(list(self.buttons.values()), layout=_wrap()),
            widgets.HBox(
                [
                    self.budget,
                    widgets.Label("fit may change:"),
                    *self.fit_techniques.values(),
                    self.budget_error,
                ],
                layout=_wrap(),
            ),
            widgets.HBox([self.progress, self.status]),
            self.messages,
            self.fit_text,
            self.search_view,
            self.views,
            widgets.Accordion(children=[self.cell_output], titles=("re-run cell output",)),
        ]

    def _options(self, *, single: bool) -> list[tuple[str, str]]:
        """The module list's choices: the blocks first, then the other modules (single layers
        only when ``single``)."""
        names: Iterable[str] = [
            *self.blocks,
            *(
                n
                for n, m in self._modules.items()
                if n not in self.blocks and (single or not m.single)
            ),
        ]
        return [(f"{n}  ({self._modules[n].kind})", n) for n in names if n in self._modules]

    def _on_single_layers(self, change: dict[str, Any]) -> None:
        picked = self.modules.value
        options = self._options(single=change["new"])
        self.modules.options = options  # which empties the selection: put it back
        offered = {value for _, value in options}
        self.modules.value = tuple(n for n in picked if n in offered)

    def _on_all_blocks(self, change: dict[str, Any]) -> None:
        """ "all N blocks" ticks every block's box, or unticks them all."""
        if self._echo:
            return
        self.all_chosen = change["new"]
        picked, blocks = set(self.modules.value), set(self.blocks)
        picked = picked | blocks if change["new"] else picked - blocks
        self.modules.value = tuple(v for _, v in self.modules.options if v in picked)

    def _on_picked(self, change: dict[str, Any]) -> None:
        """ "all N blocks" is ticked exactly while every block is picked."""
        every = bool(self.blocks) and set(self.blocks) <= set(change["new"])
        if not every:
            self.all_chosen = False
        self._tick_all(every)

    def _tick_all(self, value: bool) -> None:
        """Tick or untick "all N blocks" without picking or dropping blocks."""
        if self.all_blocks.value != value:
            self._echo = True
            try:
                self.all_blocks.value = value
            finally:
                self._echo = False

    def pick(self, names: Sequence[str], *, all_blocks: bool = False) -> None:
        """Pick ``names`` to checkpoint, or every block as "all N blocks" does."""
        self.modules.value = tuple(self.blocks) if all_blocks else tuple(names)
        if all_blocks:
            self._tick_all(True)  # a model without blocks too: its step then says so
        self.all_chosen = all_blocks

    def checkpoint_spec(self) -> str | tuple[str, ...] | None:
        """What the checkpoint controls pick, as `Config.checkpoint` takes it: "blocks" when
        "all N blocks" was ticked, else the modules picked or the regex; ValueError for both."""
        regex, picked = self.regex.value.strip(), tuple(self.modules.value)
        if regex and (picked or self.all_blocks.value):
            raise ValueError(
                "checkpoint all blocks, the modules picked in the list, or a regex: choose one"
            )
        if self.all_blocks.value and self.all_chosen and set(picked) == set(self.blocks):
            return "blocks"
        return regex or picked or None

    def show_modules(self, names: Sequence[str]) -> None:
        """Make sure the list offers ``names`` (single layers too if one of them is one), and
        open "more" where the blocks' toggles cannot show them."""
        if any(self._modules[n].single and n not in self.blocks for n in names):
            self.single_layers.value = True
        if any(n not in self.blocks for n in names):
            self.more.selected_index = 0

    def set_gpus(self, count: int) -> None:
        """Select ``count`` GPUs, offering it first if the list lacks it."""
        counts = [value for _, value in self.gpus.options]
        if count not in counts:
            self.gpus.options = gpu_options(sorted({*counts, count}))
        self.gpus.value = count

    def _on_gpus(self, change: dict[str, Any]) -> None:
        self.strategy.disabled = change["new"] == 1 or self.cpu_offload.value

    def _on_cpu_offload(self, change: dict[str, Any]) -> None:
        """The policy is FSDP2's: the strategy is FSDP2 while it is ticked."""
        if change["new"]:
            self.strategy.value = "fsdp2"
        self.strategy.disabled = change["new"] or self.gpus.value == 1

    def enable_search(self, *, budget: bool) -> None:
        """Search is pressable with a trial and a budget; its tooltip says what it lacks."""
        missing = [
            SEARCH_NEEDS[k]
            for k, has in (
                ("trial", self._trial),
                ("training", not self._inference),
                ("budget", budget),
            )
            if not has
        ]
        button = self.buttons[SEARCH_BUTTON]
        button.disabled = bool(missing)
        button.tooltip = (
            "; ".join(missing)
            if missing
            else "search every combination of techniques within the budget"
        )

    def show_config(self, text: str, error: str | None = None) -> None:
        """The configuration line: ``text``, or what is wrong with the selections."""
        if error is not None:
            self.configuration.value = message_html("error", f"configuration: {error}")
        else:
            pure = f"<br>{html.escape(PURE_BF16)}" if self.precision.value == "bf16" else ""
            self.configuration.value = _muted(
                f"configuration: {html.escape(text)} (Apply applies it){pure}"
            )

    def show_search(self, found: Search, reasoning_html: str) -> None:
        """What Search found: ``reasoning_html`` beside the chart of ``found``'s front."""
        self.search_chart.update(found, self.blocks)
        self.search_text.value = reasoning_html
        self.search_view.children = (self.search_chart.widget, self.search_text)

    def hide_search(self) -> None:
        self.search_view.children = ()
        self.search_text.value = ""

    def say(self, kind: str, lines: Sequence[str]) -> None:
        """Add lines to the message area."""
        self.messages.value += "".join(message_html(kind, line) for line in lines)

    def show_view(self, name: str) -> None:
        """Bring the tab ``name`` (one of VIEWS) to the front."""
        self.views.selected_index = VIEWS.index(name)

    def show_ranks(self, groups: Sequence[RankGroup], budget_bytes: int | None, title: str) -> None:
        """Draw each GPU's peak in the "per GPU" tab; its title counts the choices."""
        self.ranks.update(groups, budget_bytes, title)
        self.ranks_note.value = "" if groups else _muted(GPUS_LATER)
        n = len(groups)
        self.views.titles = (self.views.titles[0], f"{VIEWS[1]} ({n})" if n else VIEWS[1])

    def show(self, rows: Sequence[Row], budget_bytes: int | None = None) -> None:
        """Redraw the table and the charts from ``rows``; the charts only once they have data."""
        self.table.value = rows_html(rows)
        self.breakdown.update(rows, budget_bytes)
        self.tradeoff.update(rows)
        drawn = [
            *([self.breakdown.widget] if list(self.breakdown.bars.x) else []),
            *([self.tradeoff.figure] if list(self.tradeoff.points.x) else []),
        ]
        if tuple(drawn) != tuple(self.charts.children):
            self.charts.children = drawn
        self.charts_note.value = "" if drawn else _muted(NO_BREAKDOWN if rows else CHARTS_LATER)
        n = len(rows)
        self.views.titles = (f"{VIEWS[0]} ({n})" if n else VIEWS[0], self.views.titles[1])
