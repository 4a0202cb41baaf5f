"""Ranks from a lived-in kernel: CUDA already initialised, so ``Trial.run`` and ``Trial.plan``
spawn their ranks, and the kernel's own CUDA tensors stay as they were.

One fresh interpreter plays the kernel: an IPython shell whose cells define the model class and
the loss function (they live in ``__main__``, as a notebook's do), move the model to the GPU
and train it one step. Then a two-rank FSDP2 run and a two-rank plan, over gloo with the ranks
sharing the GPU where there is one. The figures go to ``$GPUMEM_OUT/spawn_gpu.json`` when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

SCRIPT = textwrap.dedent(
    """
    import json
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    cell = ip.run_cell('''
    import torch
    from torch import nn
    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.forked_ranks import start_method
    from jupyter_gpumem.tuner.trial import Trial

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(256, 1024), nn.Linear(1024, 256)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    def loss_fn(m, b):
        return m(b).logsumexp(-1).mean()

    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(256, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randn(8192, 256, device="cuda")
    loss_fn(model, batch).backward()  # a lived-in kernel: CUDA up, the model trained a step
    opt.step()
    ''')
    assert cell.success, cell.error_in_exec
    ns = ip.user_ns
    torch, model, opt, batch = ns["torch"], ns["model"], ns["opt"], ns["batch"]
    Config, Trial = ns["Config"], ns["Trial"]
    assert torch.cuda.is_initialized()
    out = {"start_method": ns["start_method"](torch.device("cuda", 0))}

    tensors = [*model.parameters(), *model.buffers(), batch]
    kept = [(t.data_ptr(), t.device, t.detach().clone()) for t in tensors]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()

    trial = Trial(model, batch, ns["loss_fn"], optimizer=opt, warmup=1, steps=2)
    config = Config(parallel="fsdp2", world_size=2)
    run = trial.run(config)
    out["run"] = {
        "status": run.status, "error": run.error, "notes": list(run.warnings),
        "ranks": [
            {"rank": r.rank, "device": r.report.devices[0].device if r.report else None,
             "peak": r.peak_allocated_bytes, "own_max_allocated": r.own_peak_bytes}
            for r in run.ranks
        ],
    }
    print("run", run.status, run.error, flush=True)
    budget = round(0.8 * (run.peak_allocated_bytes or 0))
    plan = trial.plan(budget, techniques=("checkpoint",), parallel="fsdp2", world_size=2)
    print(plan, flush=True)
    plan.verify()
    out["plan"] = {
        "budget": budget, "config": str(plan.config), "parallel": plan.config.parallel,
        "world_size": plan.config.world_size, "fits": plan.fits,
        "predicted": plan.predicted_peak_bytes, "measured": plan.measured_peak_bytes,
        "measured_fits": plan.measured_fits, "measured_status": plan.result.status,
        "measured_error": plan.result.error, "reasoning": list(plan.reasoning),
    }

    torch.cuda.synchronize()
    after = [*model.parameters(), *model.buffers(), batch]
    out["same_objects"] = all(a is t for a, t in zip(after, tensors)) and len(after) == len(tensors)
    out["same_pointers"] = [t.data_ptr() for t in tensors] == [k[0] for k in kept]
    out["same_devices"] = [t.device for t in tensors] == [k[1] for k in kept]
    out["same_values"] = all(torch.equal(t, k[2]) for t, k in zip(tensors, kept))
    out["same_grads"] = all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    out["same_state"] = {id(p) for p in opt.state} == set(state) and all(
        torch.equal(v, state[id(p)][k]) for p, s in opt.state.items() for k, v in s.items()
    )
    out["allocated_before"], out["allocated_after"] = allocated, torch.cuda.memory_allocated()
    out["gpus"] = torch.cuda.device_count()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(done.stdout)
    line = next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))
    out: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    target = os.environ.get("GPUMEM_OUT")
    if target:
        Path(target, "spawn_gpu.json").write_text(json.dumps(out, indent=1))
    return out


def test_a_lived_in_kernel_spawns_its_ranks(figures: dict[str, Any]) -> None:
    assert figures["start_method"] == "spawn"
    run = figures["run"]
    assert run["status"] == "ok", run["error"]
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    backend = "gloo" if figures["gpus"] < 2 else "nccl"
    assert run["notes"][0] == f"2 ranks over {backend}"
    for rank in run["ranks"]:
        assert rank["device"].startswith("cuda")
        assert rank["peak"] == rank["own_max_allocated"], rank


def test_a_plan_on_spawned_ranks_is_made_and_verified(figures: dict[str, Any]) -> None:
    plan = figures["plan"]
    assert plan["parallel"] == "fsdp2" and plan["world_size"] == 2
    assert plan["fits"], plan["reasoning"]
    assert plan["predicted"] is not None and plan["predicted"] <= plan["budget"]
    assert any(line.startswith("Profiled step") for line in plan["reasoning"])
    assert plan["measured_status"] == "ok", plan["measured_error"]


def test_the_kernels_cuda_tensors_are_untouched(figures: dict[str, Any]) -> None:
    for key in ("same_objects", "same_pointers", "same_devices", "same_values"):
        assert figures[key], key
    assert figures["same_grads"] and figures["same_state"]
    assert figures["allocated_after"] == figures["allocated_before"]
