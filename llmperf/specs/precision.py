"""Numeric formats and their sizes in bytes; a `Precision` picks weights, activations and KV cache apart.

Bytes are floats because int4 packs two values in a byte (0.5 B). Compute runs at the activation
precision unless the device has a faster path (`HardwareSpec.compute_dtype`, `matmul_dtype`).

Quantised integer weights (int4, int8) carry a 16-bit scale (and, asymmetric, a zero point) per group
of `group_size` inputs of each output row, as AWQ (Lin et al., arXiv:2306.00978) and GPTQ (Frantar
et al., arXiv:2210.17323) store them (defaults: int4 groups of 128 with zero points; int8 one scale
per output channel, symmetric); the embedding and lm_head stay at 16 bits unless `embeddings` says
otherwise. A checkpoint's per-module formats (`modules`, over `MODULES`) may be block-scaled
(`BlockScaledFormat`, every scale counted): `fp8-block128` (DeepSeek-V3 / Qwen3-FP8,
`weight_block_size`), `mxfp4` (OCP Microscaling Formats v1.0, gpt-oss's experts), `nvfp4` (NVIDIA
ModelOpt). `Precision.matmul_dtype(module)` is the format that module's matmul computes in where the
device has units for it (fp8 for fp8 weights: W8A8; fp4 for mxfp4 / nvfp4).

The defaults, the bits per weight of each format and what runs where: docs/specs.md, "Precision".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from llmperf.errors import SpecError

#: bytes per element of each storage format
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,  # stored as fp32; tf32 is a compute mode of fp32 matrix units
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,  # E2M1, two values a byte (the element format of MXFP4 and NVFP4)
}

#: storage formats a user may choose for weights, activations or the KV cache
STORAGE_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4", "fp4")

_ALIASES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
    "float4": "fp4", "float4_e2m1fn": "fp4", "e2m1": "fp4",
}


def normalize_dtype(name: str, field: str = "dtype") -> str:
    """Canonical short name (`fp16`, `bf16`, ...) of a dtype spelled any common way."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise SpecError(f"{field}: unknown dtype {name!r} (choose from {', '.join(STORAGE_DTYPES)})")
    return key


def dtype_bytes(name: str) -> float:
    """Bytes per element of `name` (int4 -> 0.5)."""
    return DTYPE_BYTES[normalize_dtype(name)]


#: integer weight formats that carry group scales
QUANTIZED_WEIGHT_DTYPES = ("int4", "int8")
#: bytes of one group scale (fp16 / bf16, as AWQ and GPTQ store them)
SCALE_BYTES = 2.0
#: default group size per format (None: one group per output channel)
DEFAULT_GROUP_SIZE: dict[str, int | None] = {"int4": 128, "int8": None}
DEFAULT_ZERO_POINT: dict[str, bool] = {"int4": True, "int8": False}
_SIXTEEN_BIT = ("fp16", "bf16")


def _matrix_bytes(dtype: str, d_in, d_out, group_size: int | None, zero_point: bool):  # noqa: ANN001, ANN202
    """`d_in x d_out` elements at `dtype`, plus one 16-bit scale (and a zero point at the weight's
    width) per group of `group_size` inputs of each output row when `dtype` is an integer format."""
    elem = DTYPE_BYTES[dtype]
    nbytes = d_in * d_out * elem
    if dtype in QUANTIZED_WEIGHT_DTYPES:
        groups = d_out * -(-d_in // (group_size or d_in))
        nbytes = nbytes + groups * (SCALE_BYTES + (elem if zero_point else 0.0))
    return nbytes


#: `Precision.group_size` value meaning one scale per output channel (as HF's `group_size: -1`)
PER_CHANNEL = -1


def _check_group_size(value: object, field: str, per_channel: object = None) -> None:
    if value is None or value == per_channel and not isinstance(value, bool):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        hint = "none: per channel" if per_channel is None else f"{per_channel}: per channel"
        raise SpecError(f"{field}: must be a positive integer ({hint}), got {value!r}")


#: the parts of a model whose weights a checkpoint may store in different formats
MODULES = ("attention", "dense_mlp", "expert", "shared_expert", "router", "embedding", "lm_head")
_VOCAB_MODULES = ("embedding", "lm_head")


@dataclass(frozen=True, kw_only=True)
class BlockScaledFormat:
    """A weight format with block scales: `dtype` values, one scale of `scale_bytes` per block of
    `block_rows` output rows x `block_cols` inputs (a last partial block included), and
    `tensor_scale_bytes` per matrix. `matmul` is the format its kernels compute in where the device
    has units for it."""

    name: str
    dtype: str
    block_rows: int
    block_cols: int
    scale_bytes: float
    tensor_scale_bytes: float = 0.0
    matmul: str

    def matrix_bytes(self, d_in, d_out):  # noqa: ANN001, ANN201
        """Bytes of one `d_in x d_out` matrix: values, block scales and the per-matrix scale."""
        blocks = -(-d_out // self.block_rows) * -(-d_in // self.block_cols)
        return d_in * d_out * DTYPE_BYTES[self.dtype] + blocks * self.scale_bytes + self.tensor_scale_bytes

    @property
    def bits_per_weight(self) -> float:
        """Bits a weight costs in a matrix of whole blocks, its scale's share included (mxfp4: 4.25)."""
        return 8 * (DTYPE_BYTES[self.dtype] + self.scale_bytes / (self.block_rows * self.block_cols))


#: OCP Microscaling MXFP4: E2M1 values, one E8M0 (8-bit power-of-two) scale per 32 inputs of a row
MXFP4 = BlockScaledFormat(name="mxfp4", dtype="fp4", block_rows=1, block_cols=32, scale_bytes=1.0, matmul="fp4")
#: NVIDIA NVFP4: E2M1 values, one fp8 E4M3 scale per 16 inputs of a row, one fp32 scale per matrix
NVFP4 = BlockScaledFormat(name="nvfp4", dtype="fp4", block_rows=1, block_cols=16, scale_bytes=1.0,
                          tensor_scale_bytes=4.0, matmul="fp4")
#: the default block of `fp8-block` (DeepSeek-V3, Qwen3-FP8, transformers' FineGrainedFP8Config)
FP8_BLOCK = (128, 128)
#: block-scaled weight formats, as `Precision.modules` spells them (fp8-block<rows>[x<cols>])
BLOCK_SCALED_FORMATS = ("fp8-block", "mxfp4", "nvfp4")
_FP8_BLOCK_NAME = re.compile(r"fp8-block(?:(\d+)(?:x(\d+))?)?")


def fp8_block_format(rows: int, cols: int) -> BlockScaledFormat:
    """fp8 E4M3 values with one fp32 scale per `rows x cols` block (`weight_block_size`)."""
    name = f"fp8-block{rows}" if rows == cols else f"fp8-block{rows}x{cols}"
    return BlockScaledFormat(name=name, dtype="fp8", block_rows=rows, block_cols=cols, scale_bytes=4.0,
                             matmul="fp8")


@lru_cache(maxsize=256)
def block_scaled_format(name: str) -> BlockScaledFormat | None:
    """The block-scaled format `name` spells (None for a plain storage dtype; unknown names raise)."""
    key = str(name).strip().lower()
    if key == "mxfp4":
        return MXFP4
    if key == "nvfp4":
        return NVFP4
    match = _FP8_BLOCK_NAME.fullmatch(key)
    if match:
        rows = int(match.group(1) or FP8_BLOCK[0])
        cols = int(match.group(2) or match.group(1) or FP8_BLOCK[1])
        if rows < 1 or cols < 1:
            raise SpecError(f"weight format {name!r}: an fp8 block must be at least 1 x 1")
        return fp8_block_format(rows, cols)
    return None


def normalize_weight_format(name: str, field: str = "weight format") -> str:
    """Canonical name of a weight format: a storage dtype (`bf16`, `int4`, ...) or a block-scaled
    format (`fp8-block128`, `mxfp4`, `nvfp4`)."""
    block = block_scaled_format(name) if isinstance(name, str) else None
    if block is not None:
        return block.name
    try:
        return normalize_dtype(name, field)
    except SpecError:
        raise SpecError(f"{field}: unknown weight format {name!r} (choose from {', '.join(STORAGE_DTYPES)}, "
                        f"{', '.join(BLOCK_SCALED_FORMATS)})") from None


def _module_pairs(value: object) -> tuple[tuple[str, str], ...]:
    """`Precision.modules` as (module, format) pairs in `MODULES` order; a mapping is accepted."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(m, f) for m, f in items]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise SpecError(f"precision.modules: must map modules ({', '.join(MODULES)}) to weight formats, "
                        f"got {value!r}") from None
    out: dict[str, str] = {}
    for module, fmt in pairs:
        if module not in MODULES:
            raise SpecError(f"precision.modules: unknown module {module!r} (modules: {', '.join(MODULES)})")
        if module in out:
            raise SpecError(f"precision.modules: {module} is given twice")
        out[module] = normalize_weight_format(fmt, f"precision.modules.{module}")
    return tuple((m, out[m]) for m in MODULES if m in out)


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Storage formats of the three kinds of tensors an inference pass moves.

    `group_size` and `zero_point` apply to integer weights (None: the format's default, see the
    module docstring; `PER_CHANNEL` = -1: one scale per output channel); `embeddings` is the format of the embedding
    and lm_head matrices (None: the
    weights' format, or 16 bits when the weights are quantised below 16 bits).

    `modules` gives the weight format of the modules (`MODULES`) a checkpoint stores apart from
    `weights`, as (module, format) pairs (a mapping is accepted): gpt-oss is
    `Precision(weights="bf16", modules={"expert": "mxfp4"})`. A module it does not name is at
    `weights`; the embedding and lm_head at `embedding_dtype`; the router at the activation format
    (small, as the roll-up has always counted it)."""

    weights: str = "fp16"
    activations: str = "fp16"
    kv: str = "fp16"
    group_size: int | None = None
    zero_point: bool | None = None
    embeddings: str | None = None
    modules: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for field in ("weights", "activations", "kv"):
            value = normalize_dtype(getattr(self, field), field=f"precision.{field}")
            object.__setattr__(self, field, value)
        _check_group_size(self.group_size, "precision.group_size", PER_CHANNEL)
        if self.zero_point is not None and not isinstance(self.zero_point, bool):
            raise SpecError(f"precision.zero_point: must be true or false, got {self.zero_point!r}")
        if (self.group_size is not None or self.zero_point) and self.weights not in QUANTIZED_WEIGHT_DTYPES:
            raise SpecError(f"precision.group_size: group scales apply to int4/int8 weights, "
                            f"got weights={self.weights}")
        if self.embeddings is not None:
            object.__setattr__(self, "embeddings", normalize_dtype(self.embeddings, "precision.embeddings"))
        object.__setattr__(self, "modules", _module_pairs(self.modules))

    @property
    def quantized(self) -> bool:
        """Weights in an integer format with group scales."""
        return self.weights in QUANTIZED_WEIGHT_DTYPES

    @property
    def effective_group_size(self) -> int | None:
        """Input elements per scale (None: per output channel); None for unquantised weights too."""
        if not self.quantized:
            return None
        if self.group_size == PER_CHANNEL:
            return None
        return self.group_size if self.group_size is not None else DEFAULT_GROUP_SIZE[self.weights]

    @property
    def effective_zero_point(self) -> bool:
        if not self.quantized:
            return False
        return self.zero_point if self.zero_point is not None else DEFAULT_ZERO_POINT[self.weights]

    @property
    def embedding_dtype(self) -> str:
        """Format of the embedding and lm_head matrices."""
        if self.embeddings is not None:
            return self.embeddings
        if DTYPE_BYTES[self.weights] >= 2:
            return self.weights
        return self.activations if self.activations in _SIXTEEN_BIT else "fp16"

    @property
    def embedding_bytes(self) -> float:
        return DTYPE_BYTES[self.embedding_dtype]

    def matrix_bytes(self, d_in: int, d_out: int, module: str | None = None) -> float:
        """Bytes of one `d_in x d_out` weight matrix of `module` at its format, scales and zeros
        included: `d_in*d_out*bytes + d_out*ceil(d_in/group)*(scale + zero)` for the weight format
        (no `module`, or one without its own format), the block scales of a block-scaled one."""
        if module is None:
            return _matrix_bytes(self.weights, d_in, d_out, self.effective_group_size, self.effective_zero_point)
        fmt = self.module_format(module)
        block = block_scaled_format(fmt)
        if block is not None:
            return block.matrix_bytes(d_in, d_out)
        if module in _VOCAB_MODULES and module not in dict(self.modules):
            return self.embedding_matrix_bytes(d_in, d_out)
        if fmt in QUANTIZED_WEIGHT_DTYPES:
            same = fmt == self.weights
            group = self.effective_group_size if same else DEFAULT_GROUP_SIZE[fmt]
            zero = self.effective_zero_point if same else DEFAULT_ZERO_POINT[fmt]
            return _matrix_bytes(fmt, d_in, d_out, group, zero)
        return _matrix_bytes(fmt, d_in, d_out, None, False)

    def module_format(self, module: str) -> str:
        """The weight format of `module` (one of `MODULES`): a storage dtype or a block-scaled format."""
        if module not in MODULES:
            raise SpecError(f"module: unknown module {module!r} (modules: {', '.join(MODULES)})")
        for name, fmt in self.modules:
            if name == module:
                return fmt
        if module in _VOCAB_MODULES:
            return self.embedding_dtype
        return self.activations if module == "router" else self.weights

    def module_dtype(self, module: str) -> str:
        """The storage dtype of `module`'s weight values (`fp4` for mxfp4 / nvfp4, `fp8` for fp8-block)."""
        fmt = self.module_format(module)
        block = block_scaled_format(fmt)
        return fmt if block is None else block.dtype

    def matmul_dtype(self, module: str | None = None) -> str:
        """The format `module`'s matmul computes in where the device has units for it: fp8 for
        fp8 weights, plain or fp8-block (W8A8: the activations quantised to fp8 on the fly at the
        GEMM's input, as vLLM's and TensorRT-LLM's fp8 GEMMs run), fp4 for mxfp4 / nvfp4, the
        activation format otherwise (integer and 16-bit weights are read and dequantised, W4A16).
        `HardwareSpec.matmul_dtype` falls back on a device without it (fp8 on an A100: W8A16)."""
        if module is None:
            return self.activations
        fmt = self.module_format(module)
        if fmt == "fp8":
            return "fp8"
        block = block_scaled_format(fmt)
        return self.activations if block is None else block.matmul

    def embedding_matrix_bytes(self, d_in: int, d_out: int) -> float:
        """Bytes of the embedding or lm_head matrix at `embedding_dtype` (group scales if integer)."""
        dt = self.embedding_dtype
        if dt not in QUANTIZED_WEIGHT_DTYPES:
            return _matrix_bytes(dt, d_in, d_out, None, False)
        group = self.effective_group_size if dt == self.weights else DEFAULT_GROUP_SIZE[dt]
        return _matrix_bytes(dt, d_in, d_out, group, DEFAULT_ZERO_POINT[dt])

    def label(self) -> str:
        """`str(self)` plus the quantisation details when they differ from plain storage."""
        text = self._base_str()
        if self.quantized:
            g = self.effective_group_size
            text += f" ({f'g{g}' if g else 'per-channel'}{', zp' if self.effective_zero_point else ''})"
        return text + self._modules_str()

    @classmethod
    def uniform(cls, dtype: str) -> Precision:
        """Weights, activations and KV all at `dtype`."""
        return cls(weights=dtype, activations=dtype, kv=dtype)

    @classmethod
    def preset(cls, name: str, native: str = "bf16") -> Precision:
        """A precision preset as serving engines deploy it. `fp8`: fp8 weights whose GEMMs run in
        fp8 (W8A8; `matmul_dtype`), the activations between operators and the all-reduces at the
        model's 16-bit `native` format, the KV cache in fp8 (vLLM's and TensorRT-LLM's fp8
        serving); on a device without fp8 units the GEMMs run W8A16 (`gemm_mode`). Any other
        name: every tensor at it (`uniform`)."""
        name = normalize_dtype(name, "precision")
        if name == "fp8":
            return cls(weights="fp8", activations=native if native in _SIXTEEN_BIT else "bf16", kv="fp8")
        return cls.uniform(name)

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.weights]

    @property
    def act_bytes(self) -> float:
        return DTYPE_BYTES[self.activations]

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[self.kv]

    def _base_str(self) -> str:
        if self.weights == self.activations == self.kv:
            return self.weights
        return f"w:{self.weights}/a:{self.activations}/kv:{self.kv}"

    def _modules_str(self) -> str:
        """` (expert mxfp4)`: the modules with their own format, grouped by format."""
        if not self.modules:
            return ""
        by_format: dict[str, list[str]] = {}
        for module, fmt in self.modules:
            by_format.setdefault(fmt, []).append(module)
        return " (" + "; ".join(f"{', '.join(mods)} {fmt}" for fmt, mods in by_format.items()) + ")"

    def __str__(self) -> str:
        return self._base_str() + self._modules_str()


def _bits(dtype: str) -> int:
    return int(round(8 * DTYPE_BYTES[normalize_dtype(dtype)]))


def gemm_mode(precision: Precision, hardware, module: str = "attention") -> str:  # noqa: ANN001
    """How `hardware` runs `module`'s linear layers at `precision`, in the W<weight bits>A<GEMM input
    bits> notation: `W8A8` (fp8 weights, fp8 GEMMs), `W8A16` (fp8 weights on a device without fp8
    units, dequantised into 16-bit GEMMs, as vLLM's Marlin kernels on an A100), `W4A16` (int4),
    `W16A16`. The modules stored in their own format (`modules`) are named after it."""
    def one(mod: str) -> str:
        return f"W{_bits(precision.module_dtype(mod))}A{_bits(hardware.matmul_dtype(precision, mod))}"
    main = one(module)
    extra = [f"{m} {one(m)}" for m, _ in precision.modules if one(m) != main]
    return main + (f" ({'; '.join(extra)})" if extra else "")


def precision_note(precision: Precision, hardware) -> str:  # noqa: ANN001
    """The line outputs print for fp8 weights: W8A8 where the device has fp8 units, else that fp8
    is weight-only there ("" for other precisions)."""
    if precision.module_dtype("attention") != "fp8" and not any(
            precision.module_dtype(m) == "fp8" for m, _ in precision.modules):
        return ""
    mod = "attention" if precision.module_dtype("attention") == "fp8" else next(
        m for m, _ in precision.modules if precision.module_dtype(m) == "fp8")
    gemm = hardware.matmul_dtype(precision, mod)
    acts = f"{precision.activations} activations between operators and all-reduces"
    if gemm == "fp8":
        return f"fp8 as deployed: W8A8 on {hardware.name} (fp8 GEMMs, {acts})"
    return (f"fp8 is weight-only on {hardware.name} (W8A16: no fp8 tensor cores; the fp8 weights are dequantised "
            f"into {gemm} GEMMs, as vLLM's Marlin kernels; {acts})")
