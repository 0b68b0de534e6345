"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434; DeepSeek-V3, Kimi-K2): not built by the
engine yet; `check_mla` refuses such a spec by name before anything is allocated."""

from __future__ import annotations

from llmperf.specs import ModelSpec


def check_mla(spec: ModelSpec) -> None:
    """A ValueError naming the MLA field the engine cannot build."""
    raise ValueError(f"kv_lora_rank: the engine does not build multi-head latent attention yet (got "
                     f"{spec.kv_lora_rank} for {spec.name}); estimate, simulate and plan model it")


__all__ = ["check_mla"]
