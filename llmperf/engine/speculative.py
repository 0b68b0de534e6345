"""Speculative decoding: a draft model proposes k tokens one by one, the target checks them in one
forward of k + 1 tokens per sequence and keeps a prefix of them plus one token of its own (Leviathan et
al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): 1 to k + 1 tokens per target forward.

Greedy (the default): a draft token is kept iff it is the target's argmax, so the output is the target's
plain greedy decoding (`Engine.generate`) token for token, whatever the draft: the tests check that.
Sampled (`SamplingParams(do_sample=True)`): the draft samples d_i from its distribution q_i, d_i is kept
with probability min(1, p_i(d_i) / q_i(d_i)), the first rejected one is replaced by a draw from
norm(max(0, p_i - q_i)), and k acceptances earn a bonus token from p_(k+1) (Leviathan et al.,
Algorithm 1 and Theorem 1): the tokens have exactly the target's distribution p, which the tests check
with a chi-square test that a wrong acceptance fails. p and q are what the engine samples from:
`sampling.process_logits` at each position, with a token-by-token decode's history and count.

Sequences run in lockstep, each with a row of a `ContiguousKVCache` for the target and one for the
draft; a rejected token is rolled back by cutting its row (`ContiguousKVCache.truncate`: every backend
masks keys past a query's position). When all k are accepted the draft has not seen d_k: it is fed in
the next cycle's first draft forward (`Transformer.forward_groups`). Finished sequences leave the batch.

Acceptance: with each draft token accepted independently with probability a, a cycle emits
(1 - a^(k + 1)) / (1 - a) tokens on average (`llmperf.analysis.speculative.expected_tokens`). A run's
maximum-likelihood a is `SpeculativeResult.acceptance_rate`; sampled runs also average Leviathan's
alpha = sum_x min(p(x), q(x)) over the checked positions (`expected_acceptance`).
`early_exit_draft`: a self-speculative draft (LayerSkip, Elhoushi et al. 2024, arXiv:2404.16710): the
target's first layers, final norm and LM head, the same tensors. Letters: B live sequences, T tokens per
sequence in a forward, k draft tokens, V vocabulary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from llmperf.engine.cache import ContiguousKVCache
from llmperf.engine.deltanet import refuse_linear
from llmperf.engine.generate import Prompts, _as_prompts, _is_id
from llmperf.engine.model import Transformer
from llmperf.engine.ops import ops_for
from llmperf.engine.parts import layer_attention
from llmperf.engine.sampling import SamplingParams, finish_reason, make_generator, process_logits
from llmperf.errors import SpecError

__all__ = ["SpeculativeResult", "SpeculativeStep", "early_exit_draft", "speculative_generate"]


@dataclass(frozen=True, kw_only=True)
class SpeculativeStep:
    """One cycle over the live sequences: `batch` of them, their mean context at the verify (keys the
    last verified token attends to), the cycle's draft length (`num_draft_tokens`, less than asked
    near max_new_tokens or the cache's end), seconds of its draft forwards and of its verify forward
    (each with its token choice: argmax, or the draws and the acceptance test), draft tokens accepted
    and tokens emitted, summed over the batch."""

    batch: int
    mean_context: float
    num_draft_tokens: int
    draft_s: float
    verify_s: float
    accepted: int
    emitted: int


@dataclass(frozen=True, kw_only=True)
class SpeculativeResult:
    """A speculative run: `tokens` generated per prompt (the first from the target's prefill, the rest
    from `cycles` verify forwards), counts summed over sequences and cycles, seconds, and per cycle
    `steps`. `proposed` / `accepted`: draft tokens proposed / accepted (greedy: equal to the target's
    argmax; sampled: passing the min(1, p / q) test; an accepted token past an EOS or max_new_tokens
    is counted, not emitted); `rejections`: sequence-cycles that rejected a draft token.
    `expected_acceptance`: sampled runs' mean of sum_x min(p(x), q(x)) over the checked positions
    (NaN when greedy or nothing was checked); `seed`: the generator's seed of a sampled run (drawn
    when `SamplingParams.seed` is None; None when greedy). Times: `time.perf_counter` around each
    forward (CUDA synchronised); `wall_s` from the first prefill to the last token (the caches'
    allocation before it excluded)."""

    tokens: list[list[int]]
    num_draft_tokens: int
    cycles: int
    proposed: int
    accepted: int
    rejections: int
    target_prefill_s: float
    draft_prefill_s: float
    draft_s: float  # the draft's forwards in the cycles (its prefill is draft_prefill_s)
    verify_s: float
    wall_s: float
    steps: list[SpeculativeStep] = field(default_factory=list)
    expected_acceptance: float = math.nan
    seed: int | None = None

    @property
    def prefill_s(self) -> float:
        return self.target_prefill_s + self.draft_prefill_s

    @property
    def sequence_cycles(self) -> int:
        """Cycles summed per sequence (a cycle of batch B counts B)."""
        return sum(s.batch for s in self.steps)

    @property
    def emitted(self) -> int:
        """Tokens the cycles emitted (every generated token but each sequence's first)."""
        return sum(s.emitted for s in self.steps)

    @property
    def acceptance_rate(self) -> float:
        """Maximum-likelihood per-token acceptance a: accepted / (accepted + rejections). Under the
        i.i.d. model a sequence-cycle accepting n of k has likelihood a^n (1 - a) if n < k and a^k if
        n == k (censored), so the log-likelihood is accepted * log a + rejections * log(1 - a). NaN
        when no draft token was checked."""
        n = self.accepted + self.rejections
        return self.accepted / n if n else math.nan

    @property
    def tokens_per_cycle(self) -> float:
        """Emitted tokens per sequence-cycle; expected (1 - a^(k + 1)) / (1 - a) where no stop cuts a
        cycle short. NaN without cycles."""
        n = self.sequence_cycles
        return self.emitted / n if n else math.nan

    def to_dict(self) -> dict[str, Any]:
        """Every field and derived figure as plain JSON data (NaN as None)."""
        out = asdict(self)
        for name in ("prefill_s", "sequence_cycles", "emitted", "acceptance_rate", "tokens_per_cycle",
                     "expected_acceptance"):
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and math.isnan(value) else value
        return out

    def steps_frame(self) -> Any:
        """One row per cycle (`SpeculativeStep`'s fields): a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame([asdict(s) for s in self.steps], columns=list(SpeculativeStep.__dataclass_fields__))


# ---------------------------------------------------------------------------------------------------
# Input checks


def _params(params: Any, max_new_tokens: Any, eos_token_id: Any) -> SamplingParams:
    """The decoding rule: `params`, or greedy with `max_new_tokens` and `eos_token_id` (never both)."""
    if params is None:
        if max_new_tokens is None:
            raise ValueError("max_new_tokens: required (or pass params=SamplingParams(max_new_tokens=...))")
        # SamplingParams checks max_new_tokens and eos_token_id by name (SpecError is a ValueError)
        return SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params: must be a SamplingParams or None, got {type(params).__name__}")
    for name, value in (("max_new_tokens", max_new_tokens), ("eos_token_id", eos_token_id)):
        if value is not None:
            raise ValueError(f"{name}: given both as an argument ({value!r}) and in params "
                             f"({getattr(params, name)!r}); with params, set it there only")
    if params.is_beam_search:
        raise ValueError(f"num_beams: speculative decoding follows one sequence per prompt, beam search is not "
                         f"supported, got {params.num_beams}")
    if params.num_return_sequences > 1:
        raise ValueError(f"num_return_sequences: must be 1 (repeat the prompt for several samples), got "
                         f"{params.num_return_sequences}")
    return params


def _check(target: Any, draft: Any, prompts: list[list[int]], num_draft_tokens: Any, params: SamplingParams
           ) -> SamplingParams:
    """Every argument, before anything is allocated; `params` with the target's EOS resolved."""
    for name, m in (("target", target), ("draft", draft)):
        if not isinstance(m, Transformer):
            raise ValueError(f"{name}: must be an llmperf.engine Transformer, got {type(m).__name__}")
        refuse_linear(m.spec, "speculative decoding", f"({name}) cannot be rolled back past rejected draft tokens "
                      "(the cache's rollback cuts K/V only)")
    if not _is_id(num_draft_tokens) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens: must be a positive integer, got {num_draft_tokens!r}")
    if draft.spec.vocab_size != target.spec.vocab_size:
        raise ValueError(f"draft: vocab_size {draft.spec.vocab_size} differs from the target's vocab_size "
                         f"{target.spec.vocab_size} (the draft must propose the target's token ids)")
    if draft.device != target.device:
        raise ValueError(f"draft: on device {draft.device}, the target on {target.device} (both must be on one)")
    if draft.dtype != target.dtype:
        raise ValueError(f"draft: dtype {draft.dtype}, the target's {target.dtype} (both must be the same)")
    params = params.with_model_eos(target.eos_token_id)
    V = target.spec.vocab_size
    for name, ids in (("eos_token_id", params.eos_ids), ("bad_words_ids", [t for w in params.bad_words_ids for t in w]),
                      ("stop_sequences", [t for w in params.stop_sequences for t in w])):
        bad = [t for t in ids if t >= V]
        if bad:
            raise ValueError(f"{name}: token ids {bad[:5]} are outside the vocabulary of {V}")
    P = min(target.spec.max_positions, draft.spec.max_positions)
    for i, p in enumerate(prompts):
        bad = [t for t in p if t >= V]
        if bad:
            raise ValueError(f"prompts[{i}]: token ids {bad[:5]} are outside the vocabulary of {V}")
        # as the engine: the last new token is never fed back, so prompt + max_new_tokens may reach P + 1
        if len(p) + params.max_new_tokens > P + 1:
            raise ValueError(f"max_new_tokens: prompt {i} needs {len(p)} prompt + {params.max_new_tokens} new "
                             f"tokens, more than max_positions={P} of the target and draft (+1: the last is never fed)")
    return params


# ---------------------------------------------------------------------------------------------------
# Forwards


def _clock(device: torch.device) -> Callable[[], float]:
    """`time.perf_counter`, after a `torch.cuda.synchronize` on a CUDA device (the work queued so far
    is done when the clock is read)."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return clock


def _forward_ragged(model: Transformer, cache: ContiguousKVCache, seq_ids: list[int],
                    inputs: list[list[int]]) -> torch.Tensor:
    """Logits `(B, V)` of the last of `inputs[b]`, fed to sequence `seq_ids[b]` (its slots already
    reserved), in one forward: one group per input length (`Transformer.forward_groups`)."""
    by_len: dict[int, list[int]] = {}
    for b, toks in enumerate(inputs):
        by_len.setdefault(len(toks), []).append(b)
    groups, order = [], []
    for T, members in by_len.items():
        tokens = torch.tensor([inputs[b] for b in members], dtype=torch.long).to(model.device)  # (B_g, T)
        groups.append((tokens, cache.prepare([seq_ids[b] for b in members], T)))
        order += members
    if len(groups) == 1:
        return model(*groups[0])  # (B, V), already in order
    logits = torch.cat(model.forward_groups(groups))  # (B, V) in group order
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))
    return logits[back.to(logits.device)]


def _sized(ok: bool) -> None:
    """A cache allocation or reservation succeeded (a bug otherwise: the rows are sized for the run)."""
    assert ok, "speculative_generate: a cache row is full, though sized for the prompt, max_new_tokens and k + 1"


@dataclass
class _Seq:
    """One prompt's decoding: its cache id (its index), prompt and generated tokens."""

    index: int
    prompt: list[int]
    out: list[int]

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.out)

    def history(self, start: int) -> list[int]:
        """Tokens `start ..` of prompt + generated."""
        P = len(self.prompt)
        return self.prompt[start:] + self.out[max(0, start - P):]

    def commit(self, tokens: list[int], params: SamplingParams) -> tuple[int, bool]:
        """Append `tokens` (the accepted drafts and the target's token after them) up to the first that
        ends the sequence (EOS, a stop sequence, max_new_tokens): (tokens emitted, finished)."""
        for i, tok in enumerate(tokens):
            self.out.append(tok)
            if finish_reason(self.out, params) is not None:
                return i + 1, True
        return len(tokens), False


# ---------------------------------------------------------------------------------------------------
# Token choice: the engine's scores, greedy acceptance, rejection sampling


def _reads_history(params: SamplingParams) -> bool:
    """Whether a processor of `params` looks at the tokens so far (min_new_tokens counts them only)."""
    return params.repetition_penalty != 1.0 or params.no_repeat_ngram_size > 0 or bool(params.bad_words_ids)


def _scores(logits: torch.Tensor, live: list[_Seq], drafts: torch.Tensor, params: SamplingParams,
            start: int = 0) -> torch.Tensor:
    """`logits` (B, T, V) through `process_logits` as a token-by-token decode would see them: position
    j of row b follows sequence b's tokens and its drafts `drafts[b, :start + j]` (history and
    num_generated). Float32 scores (B, T, V): the argmax when greedy, the softmax is p or q when sampling."""
    B, T, V = logits.shape
    ngen = [len(s.out) + start + j for s in live for j in range(T)]
    if _reads_history(params):
        rows = drafts.tolist()
        hist = [s.prompt + s.out + d[:start + j] for s, d in zip(live, rows) for j in range(T)]
    else:
        hist = [()] * (B * T)  # read by no processor of these params
    return process_logits(logits.reshape(B * T, V).float(), hist, params, ngen).reshape(B, T, V)


def _pick(scores: torch.Tensor, params: SamplingParams, gen: torch.Generator | None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A token per row of `scores` (B, V): the argmax when greedy (probabilities None), else one draw
    from `gen` of softmax(scores) and those probabilities (B, V)."""
    if not params.is_sampling:
        return scores.argmax(-1), None
    probs = scores.softmax(-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1), probs


def _greedy_accept(drafts: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts `(B, k)` checked against the target's scores `(B, k + 1, V)`: per row the number n of
    leading drafts equal to the target's argmax, and the target's argmax after them `(B,)` each."""
    choice = scores.argmax(-1)  # (B, k + 1)
    n = (drafts == choice[:, :-1]).int().cumprod(-1).sum(-1)  # (B,)
    return n, choice.gather(1, n[:, None]).squeeze(1)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Weights (B, V) of norm(max(0, p - q)), the distribution of a rejected draft's replacement
    (`torch.multinomial` normalises). A row where p <= q everywhere (p == q up to rounding, where a
    rejection has probability 0 or a rounding error's) falls back to p."""
    r = (p - q).clamp_min(0.0)  # (B, V)
    return torch.where(r.sum(-1, keepdim=True) > 0, r, p)


def _rejection_sample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Leviathan et al.'s Algorithm 1 for a batch: `p` (B, k + 1, V) the target's probabilities, `q`
    (B, k, V) the draft's, `drafts` (B, k) drawn from q. Draft i is accepted when u_i q_i(d_i) <
    p_i(d_i), u_i uniform in [0, 1) (probability min(1, p_i / q_i)); the first rejection's token is
    drawn from norm(max(0, p_i - q_i)), after k acceptances from p_(k+1). Draws from `gen`: the
    uniforms (B, k), then one token per row. Returns n accepted `(B,)`, the token after them `(B,)`,
    and per row the sum of sum_x min(p, q) over its checked positions 1 .. min(n + 1, k) `(B,)`."""
    B, k = drafts.shape
    V = p.shape[-1]
    idx = drafts[..., None]  # (B, k, 1)
    p_d, q_d = p[:, :k].gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)  # (B, k)
    u = torch.rand((B, k), generator=gen, device=p.device)  # (B, k)
    n = (u * q_d < p_d).int().cumprod(-1).sum(-1)  # (B,): leading acceptances
    rows = torch.arange(B, device=p.device)
    q_pad = torch.cat([q, q.new_zeros(B, 1, V)], dim=1)  # (B, k + 1, V): q_(k+1) = 0 makes the residual p_(k+1)
    token = torch.multinomial(_residual(p[rows, n], q_pad[rows, n]), 1, generator=gen).squeeze(1)  # (B,)
    overlap = torch.minimum(p[:, :k], q).sum(-1)  # (B, k): the probability each position accepts
    checked = torch.arange(k, device=p.device)[None, :] <= n[:, None]  # (B, k)
    return n, token, (overlap * checked).sum(-1)


# ---------------------------------------------------------------------------------------------------
# Prefill and draft


def _prefill(model: Transformer, cache: ContiguousKVCache, prompts: list[list[int]],
             clock: Callable[[], float]) -> tuple[torch.Tensor, float]:
    """Every prompt into `model`'s cache: (the logits of each prompt's next token `(B, V)`, seconds)."""
    for i, p in enumerate(prompts):
        _sized(cache.allocate(i, len(p)))
    t0 = clock()
    logits = _forward_ragged(model, cache, list(range(len(prompts))), prompts)  # (B, V)
    return logits, clock() - t0


def _draft(draft: Transformer, cache: ContiguousKVCache, live: list[_Seq], k: int, params: SamplingParams,
           gen: torch.Generator | None, clock: Callable[[], float]
           ) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """k draft tokens per live sequence `(B, k)` (on the device), their distributions q `(B, k, V)`
    when sampling (None when greedy), and the seconds. The first forward feeds each sequence's tokens
    the draft has not seen (its last token, and d_k of the last cycle when all its drafts were
    accepted), the others the previous draft token."""
    ids = [s.index for s in live]
    pending = [s.history(cache.seq_len(s.index)) for s in live]
    for s, toks in zip(live, pending):
        _sized(cache.reserve(s.index, len(toks)))
    t0 = clock()
    logits = _forward_ragged(draft, cache, ids, pending)  # (B, V)
    tokens, probs = [], []
    for j in range(k):
        if j:
            for i in ids:
                _sized(cache.reserve(i, 1))
            logits = draft(tokens[-1][:, None], cache.prepare(ids, 1))  # (B, V)
        so_far = torch.stack(tokens, dim=1) if tokens else logits.new_empty(len(ids), 0, dtype=torch.long)
        tok, prob = _pick(_scores(logits[:, None], live, so_far, params, start=j)[:, 0], params, gen)
        tokens.append(tok)  # (B,)
        probs.append(prob)
    out = torch.stack(tokens, dim=1)  # (B, k)
    q = torch.stack(probs, dim=1) if params.is_sampling else None  # (B, k, V)
    return out, q, clock() - t0


# ---------------------------------------------------------------------------------------------------


@torch.inference_mode()
def speculative_generate(target: Transformer, draft: Transformer, prompts: Prompts, *, num_draft_tokens: int,
                         max_new_tokens: int | None = None, eos_token_id: int | Sequence[int] | None = None,
                         params: SamplingParams | None = None) -> SpeculativeResult:
    """Decode `prompts` (as `Engine.generate` takes them) by `target`, sped up by `draft`'s proposals of
    `num_draft_tokens` tokens a cycle, stopping at an EOS (kept, as the engine keeps it), a stop
    sequence or after max_new_tokens.

    `params=None`: greedy with `max_new_tokens` and `eos_token_id` (None never stops on a token;
    "model", `sampling.MODEL_EOS`, the target's checkpoint EOS): the same tokens as
    `Engine(target).generate(prompts, SamplingParams(max_new_tokens=..., eos_token_id=...))`.
    With `params` those two come from it (giving them as arguments too is refused) and:
    greedy (`params.is_sampling` False: `do_sample=False` or temperature 0) gives
    `Engine(target).generate(prompts, params)`'s tokens; sampling (`do_sample=True`, temperature > 0)
    runs the rejection sampler, whose tokens have exactly the distribution of the engine's sampling
    with `params`, though not its tokens (another order of draws). Both models' logits go through
    `process_logits` with the history of each position (repetition penalty, no-repeat n-gram, bad
    words, min new tokens, temperature, top-k, top-p, all applied alike to p and q). Draws come from
    one generator seeded `params.seed` (None: a fresh seed, kept in `SpeculativeResult.seed`), in a
    fixed order: the target's first tokens, then each cycle the draft's k draws, the uniforms and one
    token per sequence; the tokens depend on the seed and on the whole batch. Refused with a
    ValueError naming the field: beam search (`num_beams`), `num_return_sequences` > 1, and any bad
    input. Both models run with their own attention backend."""
    prompts = _as_prompts(prompts)
    params = _check(target, draft, prompts, num_draft_tokens, _params(params, max_new_tokens, eos_token_id))
    k, sampling = num_draft_tokens, params.is_sampling
    seed = (params.seed if params.seed is not None else torch.Generator().seed()) if sampling else None
    gen = make_generator(seed, target.device) if sampling else None
    clock = _clock(target.device)
    if not prompts:
        return SpeculativeResult(tokens=[], num_draft_tokens=k, cycles=0, proposed=0, accepted=0, rejections=0,
                                 target_prefill_s=0.0, draft_prefill_s=0.0, draft_s=0.0, verify_s=0.0, wall_s=0.0,
                                 seed=seed)
    max_new = params.max_new_tokens
    # A row holds a sequence's prompt, its tokens but the last, and a verify's k + 1 more.
    rows = min(max(len(p) for p in prompts) + max_new + k + 1, target.spec.max_positions, draft.spec.max_positions)
    t_cache = ContiguousKVCache(target.spec, max_batch=len(prompts), max_seq_len=rows, dtype=target.dtype,
                                device=target.device)
    d_cache = ContiguousKVCache(draft.spec, max_batch=len(prompts), max_seq_len=rows, dtype=draft.dtype,
                                device=draft.device)
    seqs = [_Seq(i, p, []) for i, p in enumerate(prompts)]
    no_drafts = torch.empty(len(seqs), 0, dtype=torch.long, device=target.device)
    t_start = clock()
    logits, target_prefill_s = _prefill(target, t_cache, prompts, clock)
    t0 = clock()
    first, _ = _pick(_scores(logits[:, None], seqs, no_drafts, params)[:, 0], params, gen)
    target_prefill_s += clock() - t0  # with its token choice, as the cycles' times
    _, draft_prefill_s = _prefill(draft, d_cache, prompts, clock)
    live = []
    for s, t in zip(seqs, first.tolist()):
        s.out.append(t)
        if finish_reason(s.out, params) is None:
            live.append(s)
        else:
            t_cache.free(s.index)
            d_cache.free(s.index)
    steps: list[SpeculativeStep] = []
    proposed = accepted = rejections = 0
    overlap = 0.0  # sum of sum_x min(p, q) over the checked positions (sampling)
    while live:
        # Fewer drafts where no sequence may keep them all (max_new_tokens) or a row would overflow.
        k_now = max(0, min(k, max(max_new - len(s.out) for s in live) - 1,
                           min(rows - t_cache.seq_len(s.index) for s in live) - 1))
        ids = [s.index for s in live]
        if k_now:
            drafts, q, draft_s = _draft(draft, d_cache, live, k_now, params, gen, clock)
        else:
            drafts, q, draft_s = no_drafts[:len(live)], None, 0.0
        for i in ids:
            _sized(t_cache.reserve(i, k_now + 1))
        t0 = clock()
        last = torch.tensor([s.out[-1] for s in live], dtype=torch.long).to(target.device)
        tokens = torch.cat([last[:, None], drafts], dim=1)  # (B, k_now + 1)
        meta = t_cache.prepare(ids, k_now + 1)
        scores = _scores(target(tokens, meta, all_logits=True), live, drafts, params)  # (B, k_now + 1, V)
        if sampling:
            if q is None:
                q = scores.new_empty(len(live), 0, scores.shape[-1])  # (B, 0, V)
            n, token, checked = _rejection_sample(scores.softmax(-1), q, drafts, gen)
            overlap += checked.sum().item()
        else:
            n, token = _greedy_accept(drafts, scores)
        n, token = n.tolist(), token.tolist()
        verify_s = clock() - t0
        step_accepted = step_emitted = 0
        still = []
        for s, d, n_s, t in zip(live, drafts.tolist(), n, token):
            emitted, done = s.commit(d[:n_s] + [t], params)
            step_accepted, step_emitted = step_accepted + n_s, step_emitted + emitted
            rejections += n_s < k_now
            if done:
                t_cache.free(s.index)
                d_cache.free(s.index)
                continue
            still.append(s)
            # Both rows keep only committed tokens: the target all but the new last one, the draft those it was fed.
            t_cache.truncate(s.index, s.length - 1)
            d_cache.truncate(s.index, min(d_cache.seq_len(s.index), s.length - 1))
        proposed += k_now * len(live)
        accepted += step_accepted
        steps.append(SpeculativeStep(batch=len(live), mean_context=sum(meta.seq_lens) / len(live),
                                     num_draft_tokens=k_now, draft_s=draft_s, verify_s=verify_s,
                                     accepted=step_accepted, emitted=step_emitted))
        live = still
    checked_positions = accepted + rejections
    expected = overlap / checked_positions if sampling and checked_positions else math.nan
    return SpeculativeResult(tokens=[s.out for s in seqs], num_draft_tokens=k, cycles=len(steps), proposed=proposed,
                             accepted=accepted, rejections=rejections, target_prefill_s=target_prefill_s,
                             draft_prefill_s=draft_prefill_s, draft_s=sum(s.draft_s for s in steps),
                             verify_s=sum(s.verify_s for s in steps), wall_s=clock() - t_start, steps=steps,
                             expected_acceptance=expected, seed=seed)


# ---------------------------------------------------------------------------------------------------
# Self-speculation


def early_exit_draft(target: Transformer, num_layers: int) -> Transformer:
    """A draft that is `target` stopped after its first `num_layers` layers, then its final norm and LM
    head (LayerSkip's early exit): a `Transformer` of `target.spec.scaled(num_layers=num_layers)` whose
    parameters ARE the target's tensors (no copy; per-layer patterns such as `layer_types` are cut by
    `ModelSpec.scaled`), rotary tables included. It has its own ops object (on a CPU, private packed
    copies of the weights it runs are the ops', so per model). Without training for early exit
    (LayerSkip trains for it) the acceptance is low, but the output stays exact."""
    if not isinstance(target, Transformer):
        raise ValueError(f"target: must be an llmperf.engine Transformer, got {type(target).__name__}")
    L = target.spec.num_layers
    if not _is_id(num_layers) or not 1 <= num_layers < L:
        raise ValueError(f"num_layers: must be an integer in [1, {L - 1}] (the target has {L} layers), "
                         f"got {num_layers!r}")
    dense = set(target.spec.dense_layers)
    if target.spec.num_experts > 1 and dense >= set(range(num_layers)):
        first_moe = min(set(range(L)) - dense)
        raise ValueError(f"num_layers: the first {num_layers} layers of {target.spec.name} are dense (dense_layers="
                         f"{target.spec.dense_layers}), and a mixture-of-experts spec needs an expert layer: cut at "
                         f"least {first_moe + 1} layers")
    try:
        spec = target.spec.scaled(num_layers=num_layers)
    except SpecError as exc:
        raise ValueError(f"num_layers: {target.spec.name} cannot be cut to {num_layers} layers: {exc}") from None
    # Built on the meta device (nothing allocated), then every parameter replaced by the target's.
    draft = Transformer(spec, dtype=target.dtype, device="meta", attention=target.attention_backend,
                        weight_layout=target.weight_layout)
    for name, module in draft.named_modules(remove_duplicate=False):
        source = target.get_submodule(name)
        for key, p in list(module._parameters.items()):
            q = source._parameters.get(key)
            if (p is None) != (q is None) or (p is not None and p.shape != q.shape):
                raise ValueError(f"num_layers: {target.spec.name} cannot be cut cleanly: parameter {name}.{key} "
                                 f"differs between the target and the cut spec")
            module._parameters[key] = q
    device = target.device
    draft.rotary, draft.rotary_local = target.rotary, target.rotary_local  # the same tables (num_layers-free)
    ops = ops_for(device, target.dtype, target.in_out)
    draft.set_ops(ops)
    draft._head_ops = ops_for(device, target.dtype) if target.in_out and spec.tied_embeddings else ops
    draft.attn_params = layer_attention(spec, [getattr(b, "sinks", None) for b in draft.layers])
    draft.decode_in_one_call = target.decode_in_one_call
    draft.eos_token_id = target.eos_token_id
    stray = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.device != device]
    assert not stray, f"early_exit_draft: {stray[:3]} not taken from the target (still on {device})"
    return draft
