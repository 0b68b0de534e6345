"""The model a profile runs and whether it fits: `--layers N` keeps N layers with their kinds (the
first layer of each kind, then the earliest others: `kept_layer_indices`), the spec is checked
buildable by the engine, and the largest configuration's weights, KV cache and activations are
checked against the free memory before anything is allocated.
"""

from __future__ import annotations

from llmperf.analysis.memory import activation_peak_bytes, weight_bytes_per_gpu
from llmperf.errors import SpecError
from llmperf.measure.profile.settings import ProfileSettings
from llmperf.specs import ModelSpec, Precision

MEMORY_HEADROOM = 0.9  # refuse a run that needs more than this share of the free memory


def memory_needed(spec: ModelSpec, prec: Precision, settings: ProfileSettings, attention: str) -> dict[str, float]:
    """Predicted bytes of the largest configuration: weights, KV cache, transient activations."""
    b, p, g = max(settings.batches), max(settings.prompt_lens), max(settings.gen_lens)
    weights = weight_bytes_per_gpu(spec, prec)
    kv = b * (p + g) * spec.kv_bytes_per_token(prec.kv)
    act = float(activation_peak_bytes(spec, prec, b, p, p, attention=attention))
    return dict(weights=weights, kv=kv, activations=act, total=weights + kv + act)


def check_fits(need: dict[str, float], available: float, device: str) -> None:
    if need["total"] > MEMORY_HEADROOM * available:
        gib = 2**30
        raise SpecError(
            f"--batch/--prompt-len/--gen-len: the largest configuration needs {need['total'] / gib:.2f} GiB "
            f"(weights {need['weights'] / gib:.2f} + KV cache {need['kv'] / gib:.2f} + activations "
            f"{need['activations'] / gib:.2f}) but {device} has {available / gib:.2f} GiB free "
            f"(at most {MEMORY_HEADROOM:.0%} is used); lower the batch or lengths, or use --layers")


def kept_layer_indices(spec: ModelSpec, n: int) -> tuple[int, ...]:
    """Which of `spec`'s layers `--layers n` keeps, in order: the first layer of each kind (its attention,
    window, rotary and FFN: `ModelSpec.layer_kinds`), as many as `n` allows, then the earliest others.
    So 2 layers of Gemma 3 (5 sliding : 1 full) are its layers 0 and 5, and 2 of DeepSeek-V3 (3 dense
    layers, then MoE) its layers 0 and 3: every kind the model runs is measured and joined when `n` is
    at least its number of kinds; a uniform model keeps its first `n` layers."""
    kinds = spec.layer_kinds()
    firsts = list(dict.fromkeys(kinds))  # the distinct kinds in order of first appearance
    chosen = [kinds.index(k) for k in firsts][:n]
    rest = [i for i in range(spec.num_layers) if i not in chosen]
    return tuple(sorted(chosen + rest[:max(n - len(chosen), 0)]))


def keep_layers(spec: ModelSpec, n: int) -> ModelSpec:
    """`spec` with `n` layers (`--layers`): fewer keep `kept_layer_indices` with their kinds (the
    per-layer `layer_types`, `dense_layers`, `nope_layers` and `shared_topk_layers` follow them); more
    repeat the pattern (`ModelSpec.scaled`)."""
    if n >= spec.num_layers:
        return spec.scaled(num_layers=n)
    kept = kept_layer_indices(spec, n)
    types = None if spec.layer_types is None else tuple(spec.layer_types[i] for i in kept)
    return spec.scaled(num_layers=n, layer_types=types,
                       dense_layers=tuple(j for j, i in enumerate(kept) if i in spec.dense_layers),
                       nope_layers=tuple(j for j, i in enumerate(kept) if i in spec.nope_layers),
                       shared_topk_layers=tuple(j for j, i in enumerate(kept) if i in spec.shared_topk_layers))


def layers_kept(settings: ProfileSettings) -> list[int] | None:
    """run.json `layers_kept`: the model's layers that `--layers` kept (None: all of them)."""
    from llmperf.specs import load_model

    if settings.layers is None:
        return None
    spec = load_model(settings.model)
    return list(kept_layer_indices(spec, settings.layers)) if settings.layers < spec.num_layers else None


def resolve_spec(settings: ProfileSettings) -> ModelSpec:
    from llmperf.specs import load_model

    spec = load_model(settings.model)
    if settings.layers is not None:
        spec = keep_layers(spec, settings.layers)
    if max(settings.prompt_lens) + max(settings.gen_lens) > spec.max_positions:
        raise SpecError(f"--prompt-len/--gen-len: a context of {max(settings.prompt_lens) + max(settings.gen_lens)} "
                        f"exceeds {spec.name}'s max_positions={spec.max_positions}")
    from llmperf.engine.model import check_buildable
    try:
        check_buildable(spec)  # an unsupported family, activation or rope type before any folder is made
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return spec
