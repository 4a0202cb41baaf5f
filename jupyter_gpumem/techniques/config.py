"""One configuration of memory-saving techniques, validated when it is made."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from jupyter_gpumem.techniques.accumulation import check_accumulate

PRECISIONS = ("fp32", "tf32", "fp16-autocast", "bf16-autocast", "bf16")
OPTIMIZERS = (
    "sgd",
    "sgd-momentum",
    "adam",
    "adamw",
    "adamw-fused",
    "adafactor",
    "adamw-8bit",
    "adamw-paged-8bit",
    "lion",
)
PARALLELS = ("ddp", "fsdp2")
OFFLOADS = ("blocks", "model")  # where activations wait in host memory (see techniques.offloading)
MAX_WORLD_SIZE = 1024  # the ranks an estimate plays or a machine forks, at most
WORLD_SIZES_HELP = f"world_size is the number of ranks: a whole number from 1 to {MAX_WORLD_SIZE}"
CHECKPOINT_HELP = (
    "checkpoint takes 'blocks' (the model's repeated blocks: same-class modules in an "
    "nn.ModuleList or nn.Sequential, or used throughout the model like a ResNet's Bottlenecks), "
    "a regular expression matched against whole qualified module names "
    r"(e.g. r'transformer\.h\.\d+'), or a tuple of qualified module names "
    "(e.g. ('encoder.layer.0', 'encoder.layer.1')); every=n keeps every n-th target "
    "(the 1st, the (n+1)-th, ...)."
)


def check_every(every: object) -> int:
    """`every` as a positive int, or ValueError."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive int (1 = every target), got {every!r}")
    return every


def check_checkpoint_spec(spec: object) -> str | tuple[str, ...] | None:
    """The spec in its canonical form (lists become tuples), or ValueError naming the forms."""
    if spec is None or spec == "blocks":
        return spec  # type: ignore[return-value]  # narrowed by the comparison
    if isinstance(spec, str):
        if not spec:
            raise ValueError(f"empty checkpoint pattern. {CHECKPOINT_HELP}")
        try:
            re.compile(spec)
        except re.error as exc:
            raise ValueError(
                f"checkpoint pattern {spec!r} is not a regex ({exc}). {CHECKPOINT_HELP}"
            ) from exc
        return spec
    if isinstance(spec, (tuple, list)) and spec and all(isinstance(n, str) and n for n in spec):
        return tuple(spec)
    raise ValueError(f"bad checkpoint spec {spec!r}. {CHECKPOINT_HELP}")


LORA_HELP = "lora is the adapters' rank: a whole number from 1 to 1024 (None: no LoRA)"


def check_lora(rank: object) -> int | None:
    """The LoRA rank, or ValueError saying what is allowed."""
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 1024:
        raise ValueError(f"{LORA_HELP}, got {repr(rank)[:40]}")
    return rank


OFFLOAD_HELP = (
    "offload takes 'blocks' (what the model's repeated blocks save for backward, the blocks "
    "checkpoint='blocks' finds) or 'model' (what its whole forward saves), or None"
)


def check_offload(where: object) -> str | None:
    """Where activations are offloaded, or ValueError saying what is allowed."""
    if where is not None and where not in OFFLOADS:
        raise ValueError(f"{OFFLOAD_HELP}, got {repr(where)[:40]}")
    return where  # type: ignore[return-value]  # checked against OFFLOADS


CPU_OFFLOAD_HELP = (
    "cpu_offload=True keeps parameters, gradients and optimizer state in host memory and steps "
    "the optimizer there (FSDP2's CPUOffloadPolicy): it needs parallel='fsdp2', with "
    "world_size=1 on one GPU"
)


def check_flag(name: str, value: object) -> bool:
    """``value`` as a bool, or ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} is True or False, got {repr(value)[:40]}")
    return value


def check_cpu_offload(cpu_offload: object, parallel: object) -> bool:
    """Whether parameters and optimizer state live in host memory, or ValueError."""
    if check_flag("cpu_offload", cpu_offload) and parallel != "fsdp2":
        raise ValueError(f"{CPU_OFFLOAD_HELP}, got parallel={parallel!r}")
    return cpu_offload  # type: ignore[return-value]  # checked by check_flag


def check_precision(name: object) -> str | None:
    """The precision name, or ValueError listing PRECISIONS."""
    if name is not None and name not in PRECISIONS:
        raise ValueError(
            f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)} (or None)"
        )
    return name  # type: ignore[return-value]  # checked against PRECISIONS


def check_optimizer(name: object) -> str | None:
    """The optimizer name, or ValueError listing OPTIMIZERS."""
    if name is not None and name not in OPTIMIZERS:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)} (or None)"
        )
    return name  # type: ignore[return-value]  # checked against OPTIMIZERS


def check_parallel(parallel: object, world_size: object) -> str | None:
    """The strategy name, or ValueError saying what is allowed with ``world_size``."""
    if parallel is not None and parallel not in PARALLELS:
        raise ValueError(
            f"unknown parallel strategy {repr(parallel)[:40]}; choose one of "
            f"{', '.join(PARALLELS)} (or None)"
        )
    if (
        isinstance(world_size, bool)
        or not isinstance(world_size, int)
        or not 1 <= world_size <= MAX_WORLD_SIZE
    ):
        huge = isinstance(world_size, int) and abs(world_size) >= 10**40
        raise ValueError(
            f"{WORLD_SIZES_HELP}, got {'a huge number' if huge else repr(world_size)[:40]}"
        )
    if parallel is None and world_size != 1:
        raise ValueError(
            f"world_size={world_size} needs a strategy: parallel='ddp' or parallel='fsdp2'"
        )
    return parallel  # type: ignore[return-value]  # checked against PARALLELS


@dataclass(frozen=True)
class Config:
    """One configuration of techniques; ``str(config)`` is a short label for tables and charts.

    ``None`` everywhere is the baseline: the model as the user built it.
    """

    checkpoint: str | tuple[str, ...] | None = None  # regex, tuple of names, or "blocks"
    every: int = 1  # with checkpoint: every n-th matching module
    precision: str | None = None  # one of PRECISIONS (None = leave as is)
    optimizer: str | None = None  # one of OPTIMIZERS (None = keep the user's)
    parallel: str | None = None  # one of PARALLELS (None = one process)
    world_size: int = 1  # with parallel: the number of ranks
    accumulate: int = 1  # micro-batches per optimizer step (see techniques.accumulation)
    lora: int | None = None  # the rank of LoRA adapters trained alone (see techniques.lora)
    offload: str | None = None  # one of OFFLOADS (see techniques.offloading)
    # parameters, gradients and optimizer state in host memory (FSDP2's CPUOffloadPolicy)
    cpu_offload: bool = False
    # an inference trial's forward under torch.inference_mode (see tuner.workload)
    inference_mode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint", check_checkpoint_spec(self.checkpoint))
        check_every(self.every)
        check_precision(self.precision)
        check_optimizer(self.optimizer)
        check_parallel(self.parallel, self.world_size)
        check_accumulate(self.accumulate)
        check_lora(self.lora)
        check_offload(self.offload)
        check_cpu_offload(self.cpu_offload, self.parallel)
        check_flag("inference_mode", self.inference_mode)

    @property
    def single(self) -> Config:
        """The same techniques in one process: what each rank applies before its strategy
        (which places the parameters and optimizer state, ``cpu_offload`` included)."""
        return replace(self, parallel=None, world_size=1, cpu_offload=False)

    def __str__(self) -> str:
        parts = []
        if self.checkpoint is not None:
            if isinstance(self.checkpoint, tuple):
                spec = (
                    ",".join(self.checkpoint)
                    if len(self.checkpoint) <= 2
                    else f"{len(self.checkpoint)} modules"
                )
            elif self.checkpoint == "blocks":
                spec = "blocks"
            else:
                spec = f"/{self.checkpoint}/"
            parts.append(f"ckpt {spec}" + (f" every {self.every}" if self.every > 1 else ""))
        if self.precision is not None:
            parts.append(self.precision)
        if self.optimizer is not None:
            parts.append(self.optimizer)
        if self.accumulate > 1:
            parts.append(f"accumulate {self.accumulate}")
        if self.lora is not None:
            parts.append(f"lora r{self.lora}")
        if self.offload is not None:
            parts.append(f"offload {self.offload}")
        if self.inference_mode:
            parts.append("inference mode")
        if self.parallel is not None:
            parts.append(f"{self.parallel} × {self.world_size}")  # noqa: RUF001  # a label
        if self.cpu_offload:
            parts.append("state on cpu")
        return " · ".join(parts) if parts else "baseline"
