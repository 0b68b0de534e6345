"""Decoding parameters and logits processing, as small pure functions (no model, no state).

Semantics follow Hugging Face `transformers` 5 (`transformers/generation/logits_process.py`) exactly,
so the engine's greedy, sampled and beam-searched outputs can be compared with `generate()`:
repetition penalty (Keskar et al., CTRL, 2019, arXiv:1909.05858), no-repeat n-gram (fairseq), bad
words (HF `NoBadWordsLogitsProcessor`), min new tokens, then the warpers temperature, top-k (Fan et
al., 2018, arXiv:1805.04833) and top-p / nucleus (Holtzman et al., 2019, arXiv:1904.09751).

Shapes: N rows (sequences, or beams), V vocabulary, L tokens of history.

Entry points: `SamplingParams` (HF `GenerationConfig` names), `process_logits` (every processor and
warper in HF's order), `select_next_tokens` with a `make_generator` generator, `hits_stop` and
`finish_reason`, `hf_generate_kwargs` (the same decoding as `generate()` keyword arguments), and each
processor alone (`apply_repetition_penalty`, `ban_repeated_ngrams`, `ban_sequences`,
`enforce_min_new_tokens`, `apply_temperature`, `top_k_filter`, `top_p_filter`).

`logits` is a float tensor `(N, V)`, never modified in place; `history` is each row's tokens so far,
prompt + generated (ragged sequences, or an `(N, L)` LongTensor without padding). In beam search the
processors see log-softmax scores, as in HF (`llmperf.engine.beam`). The conventions in full:
docs/engine.md, "Decoding".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from llmperf.errors import SpecError
from llmperf.numeric import is_int, is_real

#: `SamplingParams.eos_token_id`'s default: stop at the model's own end-of-sequence id(s) (a
#: checkpoint's `generation_config.json`, else `config.json`; none for a random model), as HF
#: `generate()` does unless told otherwise. The `Engine` resolves it (`with_model_eos`); pass
#: `eos_token_id=None` to never stop on a token.
MODEL_EOS: Literal["model"] = "model"

History = Sequence[Sequence[int]] | torch.Tensor
FinishReason = Literal["eos", "stop_sequence", "length"]


def _token_tuples(name: str, value: object) -> tuple[tuple[int, ...], ...]:
    """A user's list of token-id lists as a tuple of non-empty tuples of non-negative ints."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SpecError(f"{name}: must be a sequence of token-id sequences, got {value!r}")
    out = []
    for seq in value:
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence) or len(seq) == 0:
            raise SpecError(f"{name}: every entry must be a non-empty sequence of token ids, got {seq!r}")
        if not all(is_int(t) and t >= 0 for t in seq):
            raise SpecError(f"{name}: token ids must be non-negative integers, got {seq!r}")
        out.append(tuple(seq))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to decode one request (HF `GenerationConfig` names and meanings, with llmperf's defaults:
    `top_k=0` is off, where HF's global default is 50).

    `eos_token_id` is `MODEL_EOS` (the default: the model's own EOS, resolved by the `Engine`; no EOS
    where nothing resolves it), None (never stop on a token), an int, or a tuple of ints; `bad_words_ids` and
    `stop_sequences` are tuples of token-id tuples (lists are converted). `stop_sequences` ends a
    sequence when its generated tokens end with one of them (the token-level analogue of HF's
    `stop_strings`). `early_stopping` is True, False or "never" (HF beam-search semantics).
    """

    max_new_tokens: int = 32
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    eos_token_id: int | tuple[int, ...] | None | Literal["model"] = MODEL_EOS
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    num_return_sequences: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        # Lists from users (YAML, JSON, the CLI) become tuples so the params stay hashable and frozen.
        object.__setattr__(self, "bad_words_ids", _token_tuples("bad_words_ids", self.bad_words_ids))
        object.__setattr__(self, "stop_sequences", _token_tuples("stop_sequences", self.stop_sequences))
        if isinstance(self.eos_token_id, Sequence) and not isinstance(self.eos_token_id, (str, bytes)):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self._validate()

    def _validate(self) -> None:  # noqa: C901 - one flat list of checks reads best
        def bad(name: str, why: str) -> SpecError:
            return SpecError(f"{name}: {why}, got {getattr(self, name)!r}")

        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be a positive integer")
        if not is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise bad("min_new_tokens", "must be a non-negative integer")
        if self.min_new_tokens > self.max_new_tokens:
            raise bad("min_new_tokens", f"must not exceed max_new_tokens={self.max_new_tokens}")
        if not isinstance(self.do_sample, bool):
            raise bad("do_sample", "must be True or False")
        if not is_real(self.temperature) or self.temperature < 0:
            raise bad("temperature", "must be a finite number >= 0 (0 means greedy)")
        if not is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "must be a non-negative integer (0 means off)")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1] (1 means off)")
        if not is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be a finite number > 0 (1 means off)")
        if not is_int(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise bad("no_repeat_ngram_size", "must be a non-negative integer (0 means off)")
        eos = self.eos_token_id
        if eos is not None and eos != MODEL_EOS and not (is_int(eos) and eos >= 0) and not (
                isinstance(eos, tuple) and len(eos) > 0 and all(is_int(t) and t >= 0 for t in eos)):
            raise bad("eos_token_id", f"must be {MODEL_EOS!r}, None, a non-negative integer or a non-empty tuple "
                                      "of them")
        if not is_int(self.num_beams) or self.num_beams < 1:
            raise bad("num_beams", "must be a positive integer")
        if not is_real(self.length_penalty):
            raise bad("length_penalty", "must be a finite number")
        if self.early_stopping not in (True, False, "never") or not isinstance(self.early_stopping, (bool, str)):
            raise bad("early_stopping", 'must be True, False or "never"')
        if not is_int(self.num_return_sequences) or self.num_return_sequences < 1:
            raise bad("num_return_sequences", "must be a positive integer")
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise bad("num_return_sequences", f"must not exceed num_beams={self.num_beams} in beam search")
        if self.num_beams == 1 and not self.is_sampling and self.num_return_sequences > 1:
            raise bad("num_return_sequences", "must be 1 for greedy decoding (every copy would be the same)")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise bad("seed", "must be None or a non-negative integer")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids as a tuple (empty when there is none)."""
        if self.eos_token_id is None or self.eos_token_id == MODEL_EOS:
            return ()
        return (self.eos_token_id,) if isinstance(self.eos_token_id, int) else self.eos_token_id

    def with_model_eos(self, eos: int | Sequence[int] | None) -> SamplingParams:
        """These params with `MODEL_EOS` replaced by the model's `eos` (None: the model has none);
        an explicit `eos_token_id` (None included) is kept."""
        if self.eos_token_id != MODEL_EOS:
            return self
        return dataclasses.replace(self, eos_token_id=eos)

    @property
    def is_sampling(self) -> bool:
        """Draw tokens at random (`do_sample` with a positive temperature); otherwise greedy / beam."""
        return self.do_sample and self.temperature > 0

    @property
    def is_beam_search(self) -> bool:
        return self.num_beams > 1

    @property
    def min_tokens_to_keep(self) -> int:
        """What HF's top-k / top-p warpers must keep: 1, or in beam sampling one more than the EOS ids
        (2 without EOS), so that every beam keeps a continuation that is not EOS."""
        if not self.is_beam_search:
            return 1
        return len(self.eos_ids) + 1 if self.eos_ids else 2


# ---------------------------------------------------------------------------------------------------
# Helpers


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits: expected a float tensor of shape (N, V), got {shape}")
    return logits.shape[0], logits.shape[1]


def _rows(history: History, n: int) -> list[list[int]]:
    """The history as N python lists of token ids."""
    if isinstance(history, torch.Tensor):
        if history.dim() != 2:
            raise ValueError(f"history: a tensor history must be (N, L), got shape {tuple(history.shape)}")
        rows = history.tolist()
    else:
        rows = [list(r) for r in history]
    if len(rows) != n:
        raise ValueError(f"history: {len(rows)} rows for {n} rows of logits")
    return rows


def _per_row(num_generated: int | Sequence[int], n: int) -> list[int]:
    if is_int(num_generated):
        return [num_generated] * n
    counts = list(num_generated)
    if len(counts) != n:
        raise ValueError(f"num_generated: {len(counts)} counts for {n} rows of logits")
    return counts


def _mask_from_ids(ids_per_row: Sequence[Sequence[int]], n: int, v: int, device: torch.device) -> torch.Tensor:
    """Boolean (N, V) mask, True at each row's ids; ids >= V are dropped (HF's spare column)."""
    row_idx = [r for r, ids in enumerate(ids_per_row) for t in ids if t < v]
    tok_idx = [t for ids in ids_per_row for t in ids if t < v]
    mask = torch.zeros((n, v), dtype=torch.bool)
    if tok_idx:
        mask[torch.tensor(row_idx), torch.tensor(tok_idx)] = True
    return mask.to(device)


# ---------------------------------------------------------------------------------------------------
# Processors (applied in greedy, sampling and beam search)


def apply_repetition_penalty(logits: torch.Tensor, history: History, penalty: float) -> torch.Tensor:
    """Penalise every token id present in the row's history (once, however often it occurs):
    positive logits are divided by `penalty`, negative ones multiplied (so > 1 always discourages).
    HF `RepetitionPenaltyLogitsProcessor`; the prompt counts, as for HF's decoder-only models."""
    n, v = _check_logits(logits)
    if not is_real(penalty) or penalty <= 0:
        raise ValueError(f"penalty: must be a finite number > 0, got {penalty!r}")
    if penalty == 1.0:
        return logits
    seen = _mask_from_ids(_rows(history, n), n, v, logits.device)  # (N, V)
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def _banned_ngram_tokens(tokens: list[int], n: int) -> list[int]:
    """Tokens that would complete an n-gram already in `tokens` (HF `NoRepeatNGramLogitsProcessor`)."""
    length = len(tokens)
    if length < n:
        return []
    prefix = tokens[length - n + 1:]  # the last n-1 tokens; empty for n == 1 (then all seen tokens are banned)
    # A window that starts at the prefix would need one token more than we have: it never bans itself.
    return [tokens[i + n - 1] for i in range(length - n + 1) if tokens[i:i + n - 1] == prefix]


def ban_repeated_ngrams(logits: torch.Tensor, history: History, n: int) -> torch.Tensor:
    """Forbid (-inf) every token that would repeat an n-gram of the row's history (prompt included).
    `n == 0` is off. HF `NoRepeatNGramLogitsProcessor`."""
    rows_n, v = _check_logits(logits)
    if not is_int(n) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, got {n!r}")
    if n == 0:
        return logits
    banned = [_banned_ngram_tokens(row, n) for row in _rows(history, rows_n)]
    return logits.masked_fill(_mask_from_ids(banned, rows_n, v, logits.device), -math.inf)


def ban_sequences(logits: torch.Tensor, history: History, bad_words_ids: Sequence[Sequence[int]], *,
                  eos_ids: Sequence[int] = ()) -> torch.Tensor:
    """Forbid (-inf) the last token of each banned sequence whose other tokens end the row's history;
    single-token sequences are always banned. A single-token entry equal to an EOS id is dropped,
    as HF does (a model must always be able to stop). HF `NoBadWordsLogitsProcessor`."""
    n, v = _check_logits(logits)
    seqs = [tuple(s) for s in _token_tuples("bad_words_ids", bad_words_ids)
            if not (len(s) == 1 and s[0] in set(eos_ids))]
    out_of_vocab = sorted({t for s in seqs for t in s if t >= v})
    if out_of_vocab:
        raise ValueError(f"bad_words_ids: token ids {out_of_vocab} are outside the vocabulary of {v}")
    rows = _rows(history, n)
    banned: list[list[int]] = [[] for _ in range(n)]
    for seq in seqs:
        prefix, last = list(seq[:-1]), seq[-1]
        for r, row in enumerate(rows):
            if not prefix or (len(row) >= len(prefix) and row[len(row) - len(prefix):] == prefix):
                banned[r].append(last)
    return logits.masked_fill(_mask_from_ids(banned, n, v, logits.device), -math.inf)


def enforce_min_new_tokens(logits: torch.Tensor, num_generated: int | Sequence[int], min_new_tokens: int,
                           eos_ids: Sequence[int]) -> torch.Tensor:
    """Forbid (-inf) the EOS ids in rows that have generated fewer than `min_new_tokens` tokens
    (the prompt does not count). HF `MinNewTokensLengthLogitsProcessor`."""
    n, v = _check_logits(logits)
    counts = _per_row(num_generated, n)
    eos = [t for t in eos_ids if t < v]
    if min_new_tokens <= 0 or not eos:
        return logits
    rows = torch.tensor([c < min_new_tokens for c in counts], dtype=torch.bool)  # (N,)
    cols = torch.zeros(v, dtype=torch.bool)  # (V,)
    cols[eos] = True
    return logits.masked_fill((rows[:, None] & cols[None, :]).to(logits.device), -math.inf)


# ---------------------------------------------------------------------------------------------------
# Warpers (applied only when sampling)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide the logits by `temperature` > 0 (below 1 sharpens, above 1 flattens). Greedy decoding is
    `temperature == 0` in `SamplingParams`, never a division by zero here."""
    _check_logits(logits)
    if not is_real(temperature) or temperature <= 0:
        raise ValueError(f"temperature: must be a finite number > 0, got {temperature!r}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int, *, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the `max(k, min_tokens_to_keep)` largest logits of each row (ties with the k-th are kept,
    as in HF `TopKLogitsWarper`); the rest become -inf. `k == 0` is off."""
    _, v = _check_logits(logits)
    if not is_int(k) or k < 0:
        raise ValueError(f"top_k: must be a non-negative integer, got {k!r}")
    if not is_int(min_tokens_to_keep) or min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep: must be a positive integer, got {min_tokens_to_keep!r}")
    if k == 0:
        return logits
    k = min(max(k, min_tokens_to_keep), v)
    kth = torch.topk(logits, k).values[..., -1:]  # (N, 1)
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float, *, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most probable tokens whose probabilities sum to at
    least `p` (at least `min_tokens_to_keep` tokens). Exactly HF `TopPLogitsWarper`: sort ascending
    and drop the tokens whose cumulative probability is <= 1 - p."""
    _check_logits(logits)
    if not is_real(p) or not 0 < p <= 1:
        raise ValueError(f"top_p: must be in (0, 1], got {p!r}")
    if not is_int(min_tokens_to_keep) or min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep: must be a positive integer, got {min_tokens_to_keep!r}")
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)  # (N, V), ascending
    cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum_probs <= (1 - p)
    remove_sorted[..., -min_tokens_to_keep:] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


# ---------------------------------------------------------------------------------------------------
# The pipeline, token selection and stopping


def process_logits(logits: torch.Tensor, history: History, params: SamplingParams,
                   num_generated: int | Sequence[int]) -> torch.Tensor:
    """Every processor `params` asks for, in HF `generate()`'s order: repetition penalty, no-repeat
    n-gram, bad words, min new tokens; then, only when sampling, temperature, top-k, top-p."""
    out = logits
    if params.repetition_penalty != 1.0:
        out = apply_repetition_penalty(out, history, params.repetition_penalty)
    if params.no_repeat_ngram_size > 0:
        out = ban_repeated_ngrams(out, history, params.no_repeat_ngram_size)
    if params.bad_words_ids:
        out = ban_sequences(out, history, params.bad_words_ids, eos_ids=params.eos_ids)
    if params.min_new_tokens > 0 and params.eos_ids:
        out = enforce_min_new_tokens(out, num_generated, params.min_new_tokens, params.eos_ids)
    if params.is_sampling:
        if params.temperature != 1.0:
            out = apply_temperature(out, params.temperature)
        if params.top_k != 0:
            out = top_k_filter(out, params.top_k, min_tokens_to_keep=params.min_tokens_to_keep)
        if params.top_p < 1.0:
            out = top_p_filter(out, params.top_p, min_tokens_to_keep=params.min_tokens_to_keep)
    return out


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator on `device` seeded with `seed` (None: a non-deterministic seed). On CPU, a
    generator seeded with s draws what `torch.manual_seed(s)` makes the global one draw."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def select_next_tokens(logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None) -> torch.Tensor:
    """Next token of each row from processed logits `(N, V)`: argmax when greedy, else one draw of
    `torch.multinomial(softmax(logits))` from `generator` (None: torch's global generator, as HF).
    Returns a LongTensor `(N,)`. Beam search selects with `llmperf.engine.beam.BeamSearch` instead."""
    _check_logits(logits)
    if params.is_beam_search:
        raise ValueError(f"num_beams: select_next_tokens does not do beam search, got {params.num_beams}; "
                         "use llmperf.engine.beam.BeamSearch")
    if not params.is_sampling:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)  # (N, V)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def _ends_with(tokens: Sequence[int], suffix: Sequence[int]) -> bool:
    return len(tokens) >= len(suffix) and tuple(tokens[len(tokens) - len(suffix):]) == tuple(suffix)


def hits_stop(tokens: Sequence[int], params: SamplingParams) -> bool:
    """True when `tokens` (the generated tokens; pass prompt + generated to let a stop sequence
    straddle the prompt, as HF's stop strings do) ends with an EOS id or a stop sequence.
    The length limit is not checked here: see `finish_reason`."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.tolist()
    if len(tokens) == 0:
        return False
    if tokens[-1] in params.eos_ids:
        return True
    return any(_ends_with(tokens, s) for s in params.stop_sequences)


def finish_reason(generated: Sequence[int], params: SamplingParams) -> FinishReason | None:
    """Why a sequence with these generated tokens is finished ("eos", "stop_sequence", "length"),
    or None while it runs. An EOS or stop sequence wins over the length limit it reaches with."""
    if isinstance(generated, torch.Tensor):
        generated = generated.tolist()
    if generated and generated[-1] in params.eos_ids:
        return "eos"
    if any(_ends_with(generated, s) for s in params.stop_sequences):
        return "stop_sequence"
    if len(generated) >= params.max_new_tokens:
        return "length"
    return None


def hf_generate_kwargs(params: SamplingParams) -> dict:
    """The keyword arguments that make HF `model.generate()` decode as `params` does (for
    equivalence tests). Sampling parameters are passed explicitly because HF's global default top_k
    is 50, where ours is 0 (off). `stop_sequences` has no token-level HF equivalent: ValueError.
    With `MODEL_EOS` HF uses its generation config's EOS; with `eos_token_id=None` that config must
    have no EOS either."""
    if params.stop_sequences:
        raise ValueError("stop_sequences: HF generate() has no token-level stop sequences "
                         f"(only stop_strings with a tokenizer), got {params.stop_sequences!r}")
    kwargs = dict(max_new_tokens=params.max_new_tokens, min_new_tokens=params.min_new_tokens,
                  do_sample=params.is_sampling, repetition_penalty=float(params.repetition_penalty),
                  no_repeat_ngram_size=params.no_repeat_ngram_size,
                  bad_words_ids=[list(s) for s in params.bad_words_ids] or None,
                  num_beams=params.num_beams, num_return_sequences=params.num_return_sequences,
                  length_penalty=float(params.length_penalty), early_stopping=params.early_stopping)
    if params.eos_token_id is not None and params.eos_token_id != MODEL_EOS:
        kwargs["eos_token_id"] = params.eos_token_id if is_int(params.eos_token_id) else list(params.eos_token_id)
    if params.is_sampling:
        kwargs.update(temperature=float(params.temperature), top_k=params.top_k, top_p=float(params.top_p))
    return kwargs


__all__ = [
    "MODEL_EOS", "FinishReason", "History", "SamplingParams", "apply_repetition_penalty", "apply_temperature",
    "ban_repeated_ngrams", "ban_sequences", "enforce_min_new_tokens", "finish_reason", "hf_generate_kwargs",
    "hits_stop", "make_generator", "process_logits", "select_next_tokens", "top_k_filter", "top_p_filter",
]
