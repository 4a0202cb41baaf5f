"""Forked ranks are all or nothing: a rank that cannot start stops the ranks already started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner.forked_ranks import MAX_FORKED, check_forkable  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# At the process limit fork() fails with EAGAIN. Root is exempt from RLIMIT_NPROC, so run as
# root the script stands in for the limit: fork() fails as the kernel would at it.
AT_THE_LIMIT = """
import errno, json, os, resource, sys
import torch
from torch import nn
from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.trial import Trial

model = nn.Linear(4, 4)
trial = Trial(model, torch.randn(2, 4), lambda m, b: m(b).sum(),
              optimizer=torch.optim.SGD(model.parameters(), lr=0.1), warmup=0, steps=1)
if os.getuid() == 0:
    fork, forks = os.fork, []
    def limited():
        if len(forks) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        forks.append(1)
        return fork()
    os.fork = limited
else:
    tasks = len(os.listdir("/proc/self/task"))  # threads count towards the limit too
    resource.setrlimit(resource.RLIMIT_NPROC, (tasks + 2, tasks + 2))
try:
    trial.run(Config(parallel="ddp", world_size=4))
    error = None
except RuntimeError as exc:
    error = str(exc)
me, children = os.getpid(), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, parent = f.read().rsplit(")", 1)[1].split()[:2]
    except OSError:
        continue
    if int(parent) == me and state != "Z":
        children.append(int(pid))
print(json.dumps({"error": error, "children": children}))
"""


@pytest.mark.timeout(240)
def test_a_rank_that_cannot_start_stops_the_others_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AT_THE_LIMIT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and out["error"].startswith("could not start rank "), out
    assert "of 4" in out["error"] and "the ranks already started were stopped" in out["error"]
    assert out["children"] == []  # no rank left waiting in init_process_group


def test_more_ranks_than_a_machine_forks_are_refused_before_any_starts() -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_FORKED} ranks, got {MAX_FORKED + 1}"):
        check_forkable(MAX_FORKED + 1)
    check_forkable(2)
    with pytest.raises(ValueError, match="from 1 to 1024"):
        Config(parallel="ddp", world_size=10**9)
