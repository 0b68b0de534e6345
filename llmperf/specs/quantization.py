"""`QuantizationSpec`: how a quantized checkpoint stores its linear-layer weights (AWQ, GPTQ).

Weight-only group quantization (GPTQ: Frantar et al. 2022, arXiv:2210.17323; AWQ: Lin et al. 2023,
arXiv:2306.00978) stores each weight in `bits` bits and, for every `group_size` consecutive input
channels of an output channel, one scale (fp16) and, when asymmetric, one zero point (packed at `bits`).
`group_size=None` means one scale per output channel. The embedding and the LM head stay in the
checkpoint's 16-bit dtype (both AutoAWQ and AutoGPTQ quantize only the linear layers of the blocks).

This module only describes the checkpoint; the bytes it costs are counted in `llmperf.analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmperf.errors import SpecError

#: quantization methods llmperf models (Hugging Face `quantization_config.quant_method`)
QUANT_METHODS = ("awq", "gptq")
#: weight widths the precision vocabulary can express (int4, int8)
QUANT_BITS = (4, 8)


@dataclass(frozen=True, kw_only=True)
class QuantizationSpec:
    """Weight-only quantization of a checkpoint's linear layers."""

    method: str  # awq | gptq
    bits: int  # 4 or 8
    group_size: int | None = 128  # input channels per scale; None = one scale per output channel
    zero_point: bool = True  # asymmetric (a zero point per group) or symmetric
    act_order: bool = False  # GPTQ desc_act: groups follow activation order (same bytes, a permutation)

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            raise SpecError(f"quantization.method must be one of {', '.join(QUANT_METHODS)}, got {self.method!r}")
        if isinstance(self.bits, bool) or self.bits not in QUANT_BITS:
            raise SpecError(f"quantization.bits must be one of {', '.join(map(str, QUANT_BITS))}, "
                            f"got {self.bits!r}")
        gs = self.group_size
        if gs is not None and (isinstance(gs, bool) or not isinstance(gs, int) or gs <= 0):
            raise SpecError(f"quantization.group_size must be a positive integer or null (per channel), "
                            f"got {gs!r}")
        for f in ("zero_point", "act_order"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"quantization.{f} must be true or false, got {getattr(self, f)!r}")

    @property
    def weight_dtype(self) -> str:
        """The storage dtype of the quantized weights, in the precision vocabulary (`int4`, `int8`)."""
        return f"int{self.bits}"

    @property
    def bytes_per_weight(self) -> float:
        """Bytes of one quantized weight value, scales and zeros not included (int4: 0.5)."""
        return self.bits / 8
