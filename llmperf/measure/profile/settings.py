"""What `profile` runs: the model, device, dtype, attention backend, KV cache, the sweep of
(batch, prompt length, generation length) configurations and the rounds of generations over them
(`ProfileSettings`), refused by option name before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmperf.errors import SpecError
from llmperf.measure.timers import steps_timed_unrecorded

BACKENDS = ("sdpa", "naive", "triton")
KV_KINDS = ("contiguous", "paged")


Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ProfileSettings:
    model: str
    hardware: str
    device: str = "cpu"
    batches: tuple[int, ...] = (1,)
    prompt_lens: tuple[int, ...] = (64,)
    gen_lens: tuple[int, ...] = (16,)
    dtype: str = "fp32"
    backend: str = "sdpa"
    kv: str = "contiguous"
    layers: int | None = None
    reps: int = 5
    micro: bool = True
    seed: int = 0
    threads: int | None = None  # CPU threads (torch.set_num_threads); None: torch's default
    separate_step_run: bool | None = None  # time steps in an unrecorded run; None: on CUDA only
    # rounds of generations: every configuration once per round, its steps and operators the median over
    # rounds (a shared machine's speed moves over minutes; interleaving samples each configuration apart)
    runs: int = 1

    @property
    def two_runs(self) -> bool:
        """Whether steps are timed in a run without per-operator recording (`llmperf.measure.profile.recording`)."""
        return steps_timed_unrecorded(self.device) if self.separate_step_run is None else self.separate_step_run

    def configs(self) -> list[tuple[int, int, int]]:
        return [(b, p, g) for b in self.batches for p in self.prompt_lens for g in self.gen_lens]

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise SpecError(f"--backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.kv not in KV_KINDS:
            raise SpecError(f"--kv: must be one of {', '.join(KV_KINDS)}, got {self.kv!r}")
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device: must be cpu or cuda, got {self.device!r}")
        if self.device == "cpu" and self.backend == "triton":
            raise SpecError("--backend triton: on CPU the Triton kernels run in the interpreter, which says "
                            "nothing about speed, so they are not timed (use sdpa or naive, or --device cuda)")
        if self.layers is not None and self.layers < 1:
            raise SpecError(f"--layers: must be a positive integer, got {self.layers}")
        if self.threads is not None and self.threads < 1:
            raise SpecError(f"--threads: must be a positive integer, got {self.threads}")
        if self.reps < 1:
            raise SpecError(f"--reps: must be a positive integer, got {self.reps}")
        if self.runs < 1:
            raise SpecError(f"--runs: must be a positive integer, got {self.runs}")
        for name, values in (("--batch", self.batches), ("--prompt-len", self.prompt_lens),
                             ("--gen-len", self.gen_lens)):
            if not values or min(values) < 1:
                raise SpecError(f"{name}: every value must be a positive integer, got {list(values)}")
