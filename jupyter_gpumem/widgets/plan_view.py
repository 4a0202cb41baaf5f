"""What "Fit to budget" chose, as the tuner panel shows it: one line first, then the numbers.

The first line says what the fit chose and what it kept (``Fit to budget chose: checkpoint
h.0-h.3 (4 of 12 blocks), bf16-autocast; optimizer kept (adamw)``). A plan made with a trial
then sets its prediction beside its measurement, the step-time changes against the model as it
is written as the reasoning writes them (:func:`jupyter_gpumem.tuner.step_change.figure`:
"within noise" where the timings spread as far). Step times get a caveat where they need one:
where the measurement is far from the prediction, and always on the CPU, whose tracker records
every allocation inside the timed steps. All text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.reasoning import FAR_OFF
from jupyter_gpumem.tuner.step_change import figure
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widgets.chart_labels import short_names

__all__ = ["CPU_STEPS", "FAR_OFF", "choice_line", "kept_line", "plan_html", "step_caveats"]

CPU_STEPS = (
    "On the CPU, a re-run cell's steps include the memory tracker's cost (it records each "
    "tensor allocation), so their step times compare configurations with each other only, not "
    "with how fast training runs."
)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    value = seconds * 1000
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def choice_line(
    config: Config | None,
    *,
    blocks: Sequence[str] = (),
    precision_now: str | None = None,
    optimizer_now: str | None = None,
    fits: bool = True,
) -> str:
    """``Fit to budget chose: checkpoint h.0-h.3 (4 of 12 blocks), bf16; optimizer kept (adamw)``.

    ``config`` None: nothing was chosen. ``fits`` False: the closest, which does not fit.
    """
    if config is None:
        return "Fit to budget chose nothing: no measured configuration fits the budget."
    head = "Fit to budget chose" if fits else "Nothing fits the budget; the closest is"
    if config.checkpoint is None:
        ckpt = "no checkpointing"
    elif isinstance(config.checkpoint, str):
        ckpt = (
            "checkpoint all blocks"
            if config.checkpoint == "blocks"
            else f"checkpoint /{config.checkpoint}/"
        )
    else:
        names = tuple(config.checkpoint)
        of = f" ({len(names)} of {len(blocks)} blocks)" if all(n in blocks for n in names) else ""
        ckpt = f"checkpoint {short_names(names, blocks)}{of}"
    if config.every > 1:
        ckpt += f" every {config.every}"
    precision = config.precision or f"precision kept ({precision_now or 'as is'})"
    yours = optimizer_now or "yours"
    optimizer = (
        f"optimizer {yours} → {config.optimizer}"
        if config.optimizer is not None
        else f"optimizer kept ({yours})"
    )
    return f"{head}: {ckpt}, {precision}; {optimizer}"


def kept_line(allowed: Collection[str]) -> str | None:
    """What the fit was not allowed to change, and how to allow it; None when all was allowed."""
    fixed = [t for t in ("checkpoint", "precision", "optimizer") if t not in allowed]
    if not fixed:
        return None
    return (
        f"Fit may not change the {' or the '.join(fixed)} (your training math stays as it is): "
        f"tick {', '.join(repr(t) for t in fixed)} under “fit may change” to let it."
    )


def step_caveats(predicted_s: float | None, measured_s: float | None) -> list[str]:
    """Why the step times should be read with care: the measured far from the predicted."""
    out = []
    if predicted_s and measured_s:
        ratio = measured_s / predicted_s
        if ratio >= FAR_OFF or ratio <= 1 / FAR_OFF:
            times = f"{ratio:.0f} times" if ratio >= FAR_OFF else f"1/{1 / ratio:.0f} of"
            out.append(
                f"* The measured step took {times} the predicted time ({_ms(measured_s)} against "
                f"{_ms(predicted_s)}): the prediction comes from the planner's shorter runs and "
                "its model of the recomputation; trust the measurement."
            )
    return out


def plan_html(
    plan: Mapping[str, Any],
    *,
    precision_now: str | None = None,
    optimizer_now: str | None = None,
    allowed: Collection[str] = ("checkpoint", "precision", "optimizer"),
) -> str:
    """A plan (``Plan.to_dict()``): what it chose, its prediction beside its measurement, the
    caveats on step times, then its reasoning."""
    esc = html.escape
    budget = plan.get("budget_bytes")
    measured = plan.get("measured_peak_bytes") is not None

    def fits(value: bool | None) -> str:
        return "" if value is None else "yes" if value else "no"

    def change(key: str) -> str:
        pct = plan.get(f"{key}_step_pct")
        return "" if pct is None else figure(pct, bool(plan.get(f"{key}_step_within_noise")))

    caveats = step_caveats(
        plan.get("predicted_step_s"), plan.get("measured_step_s") if measured else None
    )
    far = any(c.startswith("*") for c in caveats)
    rows = [
        ("peak", format_bytes(plan.get("predicted_peak_bytes")),
         format_bytes(plan.get("measured_peak_bytes")) if measured else "not measured"),
        ("step", _ms(plan.get("predicted_step_s")) + (" *" if far else ""),
         _ms(plan.get("measured_step_s")) if measured else ""),
        (f"fits {format_bytes(budget)}", fits(plan.get("fits")), fits(plan.get("measured_fits"))),
    ]  # fmt: skip
    changes = (change("predicted"), change("measured") if measured else "")
    if any(changes):  # beside the step times
        rows.insert(2, ("step against as it is", *changes))
    cell = "padding:0 .7em;text-align:right;white-space:nowrap"
    head = (
        f'<th style="{cell}"></th><th style="{cell}">predicted</th><th style="{cell}">measured</th>'
    )
    body = "".join(
        f'<tr><th style="{cell};text-align:left">{esc(name)}</th>'
        f'<td style="{cell}">{esc(a)}</td><td style="{cell}">{esc(b)}</td></tr>'
        for name, a, b in rows
    )
    config = Config(
        checkpoint=tuple(plan.get("checkpoint") or ()) or None,
        precision=plan.get("precision"),
        optimizer=plan.get("optimizer"),
    )
    first = choice_line(
        config,
        blocks=tuple(plan.get("blocks") or ()),
        precision_now=precision_now,
        optimizer_now=optimizer_now,
        fits=bool(plan.get("fits")),
    )
    kept = kept_line(allowed)
    notes = "".join(
        f'<div style="color:var(--jp-ui-font-color2,#616161)">{esc(line)}</div>'
        for line in ([kept] if kept else []) + caveats
    )
    reasons = "".join(f"<li>{esc(str(line))}</li>" for line in plan.get("reasoning") or ())
    table_style = "font-family:var(--jp-code-font-family,monospace);border-collapse:collapse"
    return (
        f'<div class="jp-gpumem-plan"><b>{esc(first)}</b>'
        f'<table style="{table_style}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f"{notes}<details><summary>how it was chosen</summary><ul>{reasons}</ul></details>"
        "<div>Press Apply to use exactly this plan.</div></div>"
    )
