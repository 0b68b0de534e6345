"""Helpers for the engine tests: tiny specs of each family, seeded models, and the same weights in a
Hugging Face `transformers` model (built from a config: nothing is downloaded).

A module of its own (not conftest.py) so that test modules import it by a unique name.
"""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext

import torch

from llmperf.engine import SamplingParams, Transformer, build_model, hf_config, to_hf_state_dict
from llmperf.specs import ModelSpec, load_model

HAS_TRITON = importlib.util.find_spec("triton") is not None


def kernels_available() -> tuple[bool, str]:
    """Whether the Triton backend can run here, and why not."""
    if not HAS_TRITON:
        return False, "triton is not installed"
    try:
        import kernels
        kernels.flash_attention, kernels.flash_decoding, kernels.paged_attention  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return False, f"the kernels package is not usable yet ({exc})"
    return True, ""


def tiny(name: str, **changes) -> ModelSpec:
    """A 2-layer version of a built-in model (rotary_dim reset so it follows the new head_dim)."""
    base = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256,
                max_positions=256)
    base.update(changes)
    base.setdefault("rotary_dim", None)
    return load_model(name).scaled(**base)


SPECS = {
    "llama": lambda: tiny("llama-3.1-8b"),  # GQA 4:2, llama3 rope scaling
    "gpt2": lambda: tiny("gpt2", num_kv_heads=4, ffn_size=256),
    "qwen2": lambda: tiny("qwen2.5-7b"),  # q/k/v biases
    "mixtral": lambda: tiny("mixtral-8x7b"),  # 8 experts, top-2
    # A sliding window smaller than the test prompts, so the window matters.
    "mistral": lambda: tiny("mistral-7b", sliding_window=6),
    # GPT-2 without 1/sqrt(D) and with 1/(layer+1) (scale_attn_weights=False, scale_attn_by_inverse_layer_idx).
    "gpt2_scaled": lambda: tiny("gpt2", num_kv_heads=4, ffn_size=256, attn_scale=False,
                                attn_scale_inverse_layer_idx=True),
}


class OpNames:
    """A recorder that keeps every operator's (name, layer), in order, and ignores counts and routing."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None]] = []

    def op(self, name, layer=None):
        self.seen.append((name, layer))
        return nullcontext()

    def count(self, *args) -> None:
        pass

    def routing(self, *args) -> None:
        pass

    def of_layer(self, layer: int) -> list[str]:
        """The names recorded for `layer`, in order."""
        return [n for n, i in self.seen if i == layer]


def make_model(kind: str, seed: int = 0, **kw) -> Transformer:
    return build_model(SPECS[kind](), seed=seed, **kw)


def hf_twin(model: Transformer):
    """A `transformers` model (fp32, eval) holding exactly `model`'s weights, with no EOS of its own."""
    import transformers

    cfg = transformers.AutoConfig.for_model(**hf_config(model.spec))
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if "rotary" not in m and not m.endswith("attn.bias")], missing
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def hf_generate(hf, prompts: list[list[int]], params: SamplingParams) -> list[list[list[int]]]:
    """HF `generate()` on each prompt alone (no padding): the generated tokens of each returned
    sequence, trailing pads after an EOS removed."""
    from llmperf.engine.sampling import hf_generate_kwargs

    out = []
    for p in prompts:
        with torch.no_grad():
            seqs = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               **hf_generate_kwargs(params))
        rows = []
        for row in seqs[:, len(p):].tolist():
            if params.eos_ids:
                for i, t in enumerate(row):
                    if t in params.eos_ids:
                        row = row[:i + 1]
                        break
            rows.append(row)
        out.append(rows)
    return out


def toy_hf_lm(vocab_size: int, seed: int, *, scale: float, pad_token_id: int):
    """A deterministic toy LM as a `transformers` model, so `generate()` can run on it:
    logits = scale * bigram[last token] + a position table (seeded, no download)."""
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class ToyConfig(PretrainedConfig):
        model_type = "llmperf-toy"

    class ToyLM(PreTrainedModel, GenerationMixin):
        config_class = ToyConfig

        def __init__(self, config):
            super().__init__(config)
            g = torch.Generator().manual_seed(seed)
            self.register_buffer("bigram", torch.randn(vocab_size, vocab_size, generator=g) * scale)
            self.register_buffer("pos", torch.randn(64, vocab_size, generator=g))
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, **kwargs):
            return CausalLMOutputWithPast(logits=self.bigram[input_ids] + self.pos[:input_ids.shape[1]][None])

    return ToyLM(ToyConfig(vocab_size=vocab_size, pad_token_id=pad_token_id)).eval()


def check_schedule(logs) -> None:
    """Replay a scheduler's `StepLog`s and assert its decisions, not just its tokens: a preemption
    always takes the newest running request, a preempted request goes to the front of the queue (it
    is the next one admitted), no request is preempted in the step right after its admission, and no
    request is preempted twice without producing a token in between (the admit / preempt thrash)."""
    running: list[int] = []  # oldest admitted first
    front: list[int] = []  # preempted, most recent first: the head of the waiting queue
    produced: dict[int, int] = {}  # tokens each request has produced so far
    at_preemption: dict[int, int] = {}  # ... when it was last preempted
    for prev, log in zip([None, *logs], logs):
        for rid in log.preempted:
            assert running and running[-1] == rid, (
                f"step {log.step}: preempted request {rid}, but the newest running request is {running[-1:]}")
            running.pop()
            front.insert(0, rid)
            assert prev is None or rid not in prev.admitted, (
                f"step {log.step}: request {rid} was preempted right after its admission (thrash)")
            assert at_preemption.get(rid, -1) < produced.get(rid, 0), (
                f"step {log.step}: request {rid} preempted again without producing a token since its last "
                f"preemption (thrash)")
            at_preemption[rid] = produced.get(rid, 0)
        for rid in log.admitted:
            if front:
                assert rid == front[0], (
                    f"step {log.step}: admitted {rid} while preempted request {front[0]} waits at the front")
                front.pop(0)
            running.append(rid)
        for item in log.items:
            if item.samples and item.request_id not in log.preempted:
                produced[item.request_id] = produced.get(item.request_id, 0) + 1
        for rid in log.finished:
            running.remove(rid)
    assert not running and not front, f"requests left over: running {running}, preempted {front}"


def check_paged_usage(steps, kv, block_size: int) -> tuple[int, list[tuple[int, float]]]:
    """Each step of one sequence (`Engine.last_steps`) that leaves it running holds the bytes `kv` (a
    `KVCacheSpec`) predicts from its context and the step's first position, reserved and used. Returns the
    steps checked and the (reserved, used) bytes of the steps that finished it."""
    checked, finished = 0, []
    for s in steps:
        if s.log.finished:  # the sequence was freed after the step
            finished.append((s.usage.reserved_bytes, s.usage.used_bytes))
            continue
        (item,) = s.log.items
        context = item.start + item.num_tokens
        assert (s.usage.reserved_bytes, s.usage.used_bytes) == (
            kv.paged_reserved_bytes(context, block_size, item.start),
            kv.paged_used_bytes(context, block_size, item.start)), \
            f"step {s.step}: context {context} from {item.start}"
        checked += 1
    return checked, finished
