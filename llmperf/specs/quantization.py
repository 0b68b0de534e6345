"""`QuantizationSpec`: how a quantized checkpoint stores its weights, module by module.

Weight-only group quantization (GPTQ: Frantar et al. 2022, arXiv:2210.17323; AWQ: Lin et al. 2023,
arXiv:2306.00978) stores each weight in `bits` bits and, for every `group_size` consecutive input
channels of an output channel, one scale (fp16) and, when asymmetric, one zero point (packed at `bits`).
`group_size=None` means one scale per output channel. The embedding and the LM head stay in the
checkpoint's 16-bit dtype (both AutoAWQ and AutoGPTQ quantize only the linear layers of the blocks).

Block-scaled checkpoints as shipped (the formats and their bytes: `llmperf.specs.precision`):

- `fp8`: fp8 E4M3 weights with one fp32 scale per `block_size` block (`weight_block_size`, 128 x 128
  in DeepSeek-V3 and Qwen3-FP8, transformers' `FineGrainedFP8Config`), activations quantised to
  fp8 per token and 128-channel group (`activation_scheme: dynamic`) or with a static scale.
- `mxfp4`: OCP MX fp4 E2M1 values with one E8M0 scale per 32 (gpt-oss: the experts only;
  transformers' Mxfp4 quantizer converts nothing else).
- `nvfp4`: NVIDIA ModelOpt fp4 E2M1 values with an fp8 E4M3 scale per 16 and an fp32 scale per
  matrix, activations fp4 too (W4A4).

Which modules each method converts (`QUANTIZED_MODULES`) and which a checkpoint keeps
(`modules_to_not_convert`, resolved to `llmperf.specs.precision.MODULES`) give `quantized_modules`.
No method converts the embedding or the lm_head (transformers and ModelOpt keep both); the router
stays at the checkpoint dtype for the block-scaled methods (DeepSeek-V3's gate is not a Linear,
gpt-oss and Qwen3-FP8 list theirs, ModelOpt disables `*router*` and `*mlp.gate*` by default).

This module only describes the checkpoint; the bytes it costs are counted in `llmperf.analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmperf.errors import SpecError
from llmperf.specs.precision import FP8_BLOCK, MODULES, MXFP4, NVFP4, fp8_block_format, normalize_dtype

#: quantization methods llmperf models (Hugging Face `quantization_config.quant_method`, NVFP4 for ModelOpt's)
QUANT_METHODS = ("awq", "gptq", "fp8", "mxfp4", "nvfp4")
#: weight widths the integer methods can express (int4, int8)
QUANT_BITS = (4, 8)
_INTEGER_METHODS = ("awq", "gptq")
#: the bits of the block-scaled methods' values (fixed by the format)
_FORMAT_BITS = {"fp8": 8, "mxfp4": 4, "nvfp4": 4}
#: the input elements per scale the fp4 formats fix (a `group_size` may repeat it)
_FORMAT_GROUP = {"mxfp4": MXFP4.block_cols, "nvfp4": NVFP4.block_cols}
_BLOCK_MODULES = ("attention", "dense_mlp", "expert", "shared_expert")
#: the modules each method converts unless `modules_to_not_convert` names them
QUANTIZED_MODULES = {"awq": (*_BLOCK_MODULES, "router"), "gptq": (*_BLOCK_MODULES, "router"),
                     "fp8": _BLOCK_MODULES, "mxfp4": ("expert",), "nvfp4": _BLOCK_MODULES}
ACTIVATION_SCHEMES = ("dynamic", "static")
_GROUP_DEFAULT = 128  # the dataclass default of `group_size` (AWQ/GPTQ's)


@dataclass(frozen=True, kw_only=True)
class QuantizationSpec:
    """A checkpoint's quantized weights. `bits`, `group_size`, `zero_point` and `act_order` describe
    the integer methods (awq, gptq); `block_size` (output rows, inputs per fp32 scale; None: 128 x
    128) and `activation_scheme` the fp8 method; mxfp4 and nvfp4 fix their own layout (a given
    `bits` or `group_size` must repeat it). `modules_to_not_convert` lists the `MODULES` the
    checkpoint keeps at its dtype; `kv_cache` the KV-cache format it was calibrated for (ModelOpt's
    `kv_cache_quant_algo`; None: not set)."""

    method: str  # awq | gptq | fp8 | mxfp4 | nvfp4
    bits: int | None = None  # awq/gptq: 4 or 8; fp8: 8, mxfp4/nvfp4: 4 (None: the format's)
    group_size: int | None = _GROUP_DEFAULT  # input channels per scale (awq/gptq; None = per output channel);
    # the block formats fix theirs (mxfp4 32, nvfp4 16, fp8 block_size's inputs): the default or that value
    zero_point: bool = True  # awq/gptq: asymmetric (a zero point per group) or symmetric
    act_order: bool = False  # GPTQ desc_act: groups follow activation order (same bytes, a permutation)
    block_size: tuple[int, int] | None = None  # fp8: weight_block_size (output rows, inputs) per scale
    activation_scheme: str | None = None  # fp8: dynamic | static (None: dynamic)
    modules_to_not_convert: tuple[str, ...] = ()  # MODULES kept at the checkpoint dtype
    kv_cache: str | None = None  # the KV-cache dtype the checkpoint ships scales for (None: not set)

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            raise SpecError(f"quantization.method must be one of {', '.join(QUANT_METHODS)}, got {self.method!r}")
        integer = self.method in _INTEGER_METHODS
        if integer and (isinstance(self.bits, bool) or self.bits not in QUANT_BITS):
            raise SpecError(f"quantization.bits must be one of {', '.join(map(str, QUANT_BITS))}, "
                            f"got {self.bits!r}")
        if not integer and self.bits is not None and (isinstance(self.bits, bool)
                                                      or self.bits != _FORMAT_BITS[self.method]):
            raise SpecError(f"quantization.bits: {self.method} stores {_FORMAT_BITS[self.method]}-bit values, "
                            f"got {self.bits!r}")
        gs = self.group_size
        if gs is not None and (isinstance(gs, bool) or not isinstance(gs, int) or gs <= 0):
            raise SpecError(f"quantization.group_size must be a positive integer or null (per channel), "
                            f"got {gs!r}")
        self._check_block_size()
        native = self.scale_block[1] if not integer else None
        if not integer and gs not in (_GROUP_DEFAULT, native):
            raise SpecError(f"quantization.group_size: {self.method} has one scale per {native} inputs of a row"
                            f"{' (its block_size)' if self.method == 'fp8' else ''}, got {gs!r}")
        for f in ("zero_point", "act_order"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"quantization.{f} must be true or false, got {getattr(self, f)!r}")
        if not integer and self.act_order:
            raise SpecError(f"quantization.act_order applies to gptq, got true for {self.method}")
        if self.activation_scheme is not None and (self.method != "fp8"
                                                   or self.activation_scheme not in ACTIVATION_SCHEMES):
            raise SpecError(f"quantization.activation_scheme: fp8's is one of {', '.join(ACTIVATION_SCHEMES)}, "
                            f"got {self.activation_scheme!r} for {self.method}")
        self._check_modules()
        if self.kv_cache is not None:
            object.__setattr__(self, "kv_cache", normalize_dtype(self.kv_cache, "quantization.kv_cache"))

    def _check_block_size(self) -> None:
        block = self.block_size
        if block is None:
            return
        if self.method != "fp8":
            raise SpecError(f"quantization.block_size applies to fp8, got {block!r} for {self.method}")
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)):
            raise SpecError(f"quantization.block_size must be two positive integers (output rows, inputs), "
                            f"got {block!r}")
        object.__setattr__(self, "block_size", tuple(block))

    def _check_modules(self) -> None:
        kept = self.modules_to_not_convert
        if isinstance(kept, str) or not isinstance(kept, (list, tuple)):
            raise SpecError(f"quantization.modules_to_not_convert must be a list of modules "
                            f"({', '.join(MODULES)}), got {kept!r}")
        unknown = [m for m in kept if m not in MODULES]
        if unknown:
            raise SpecError(f"quantization.modules_to_not_convert: unknown module {unknown[0]!r} "
                            f"(modules: {', '.join(MODULES)})")
        object.__setattr__(self, "modules_to_not_convert", tuple(m for m in MODULES if m in kept))

    @classmethod
    def from_mapping(cls, data: dict, where: str = "quantization") -> QuantizationSpec:
        """A spec from plain data (a model YAML's `quantization:`, or `to_dict` output): unknown and
        missing fields are refused naming `where.<field>`."""
        allowed = tuple(f.name for f in fields(cls))
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise SpecError(f"unknown field '{where}.{unknown[0]}' (fields: {', '.join(allowed)})")
        if "method" not in data or ("bits" not in data and data["method"] in _INTEGER_METHODS):
            raise SpecError(f"missing field '{where}.{'method' if 'method' not in data else 'bits'}'")
        try:
            return cls(**data)
        except SpecError as exc:
            raise SpecError(str(exc).replace("quantization.", where + ".")) from None

    @property
    def weight_dtype(self) -> str:
        """The storage dtype of the quantized weights, in the precision vocabulary (`int4`, `int8`,
        `fp8`, `fp4`)."""
        if self.method in _INTEGER_METHODS:
            return f"int{self.bits}"
        return "fp8" if self.method == "fp8" else "fp4"

    @property
    def weight_format(self) -> str:
        """The weight format of the converted modules, as `Precision.modules` spells it (`int4`,
        `fp8-block128`, `mxfp4`, `nvfp4`)."""
        if self.method == "fp8":
            return fp8_block_format(*(self.block_size or FP8_BLOCK)).name
        return self.method if self.method in ("mxfp4", "nvfp4") else self.weight_dtype

    @property
    def bytes_per_weight(self) -> float:
        """Bytes of one quantized weight value, scales and zeros not included (int4, fp4: 0.5)."""
        return (self.bits or _FORMAT_BITS[self.method]) / 8

    @property
    def scale_block(self) -> tuple[int, int] | None:
        """(output rows, inputs) per scale: fp8 its block_size (128 x 128), mxfp4 (1, 32), nvfp4
        (1, 16), awq/gptq (1, group_size); None for one scale per output channel."""
        if self.method == "fp8":
            return self.block_size or FP8_BLOCK
        if self.method in _FORMAT_GROUP:
            return (1, _FORMAT_GROUP[self.method])
        return None if self.group_size is None else (1, self.group_size)

    @property
    def quantized_modules(self) -> tuple[str, ...]:
        """The modules the checkpoint stores at `weight_format` (in `MODULES` order)."""
        return tuple(m for m in QUANTIZED_MODULES[self.method] if m not in self.modules_to_not_convert)

    @property
    def label(self) -> str:
        """A short description: `awq int4 g128`, `fp8-block128`, `mxfp4 (expert)`."""
        if self.method in _INTEGER_METHODS:
            text = f"{self.method} int{self.bits} g{self.group_size or 'channel'}"
        else:
            text = self.weight_format
        if self.quantized_modules != QUANTIZED_MODULES[self.method] or self.method == "mxfp4":
            text += f" ({', '.join(self.quantized_modules) or 'no module'})"
        return text
