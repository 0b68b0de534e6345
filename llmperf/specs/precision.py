"""Numeric formats and their sizes in bytes; a `Precision` picks weights, activations and KV cache apart.

Bytes are floats because int4 packs two values in a byte (0.5 B). Compute runs at the activation
precision unless the device has a faster path (see `HardwareSpec.compute_dtype`).

Quantised integer weights (int4, int8) carry scales (and, asymmetric, zero points) per group of
`group_size` input elements of each output row, as AWQ (Lin et al., arXiv:2306.00978) and GPTQ
(Frantar et al., arXiv:2210.17323) store them: scales at 16 bits, zero points packed at the weight's
own bit width. Defaults: int4 groups of 128 with zero points (AWQ/GPTQ's default `q_group_size` /
`group_size`); int8 one scale per output channel, symmetric (SmoothQuant / LLM.int8 style); fp8 a
single per-tensor scale (one number per matrix, not counted). The embedding and lm_head matrices
stay at 16 bits when the other weights are quantised (AWQ and GPTQ leave them unquantised), unless
`embeddings` says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

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
}

#: storage formats a user may choose for weights, activations or the KV cache
STORAGE_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")

_ALIASES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
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


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Storage formats of the three kinds of tensors an inference pass moves.

    `group_size` and `zero_point` apply to integer weights (None: the format's default, see the
    module docstring; `PER_CHANNEL` = -1: one scale per output channel); `embeddings` is the format of the embedding and lm_head matrices (None: the
    weights' format, or 16 bits when the weights are quantised below 16 bits)."""

    weights: str = "fp16"
    activations: str = "fp16"
    kv: str = "fp16"
    group_size: int | None = None
    zero_point: bool | None = None
    embeddings: str | None = None

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

    def matrix_bytes(self, d_in: int, d_out: int) -> float:
        """Bytes of one `d_in x d_out` weight matrix at the weight format, scales and zeros included:
        `d_in*d_out*bytes + d_out*ceil(d_in/group)*(scale + zero)`."""
        return _matrix_bytes(self.weights, d_in, d_out, self.effective_group_size, self.effective_zero_point)

    def embedding_matrix_bytes(self, d_in: int, d_out: int) -> float:
        """Bytes of the embedding or lm_head matrix at `embedding_dtype` (group scales if integer)."""
        dt = self.embedding_dtype
        if dt not in QUANTIZED_WEIGHT_DTYPES:
            return _matrix_bytes(dt, d_in, d_out, None, False)
        group = self.effective_group_size if dt == self.weights else DEFAULT_GROUP_SIZE[dt]
        return _matrix_bytes(dt, d_in, d_out, group, DEFAULT_ZERO_POINT[dt])

    def label(self) -> str:
        """`str(self)` plus the quantisation details when they differ from plain storage."""
        text = str(self)
        if self.quantized:
            g = self.effective_group_size
            text += f" ({f'g{g}' if g else 'per-channel'}{', zp' if self.effective_zero_point else ''})"
        return text

    @classmethod
    def uniform(cls, dtype: str) -> Precision:
        return cls(weights=dtype, activations=dtype, kv=dtype)

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.weights]

    @property
    def act_bytes(self) -> float:
        return DTYPE_BYTES[self.activations]

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[self.kv]

    def __str__(self) -> str:
        if self.weights == self.activations == self.kv:
            return self.weights
        return f"w:{self.weights}/a:{self.activations}/kv:{self.kv}"
