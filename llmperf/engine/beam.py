"""Beam search bookkeeping, without a model: which beams continue with which tokens, and which
hypotheses are finished (`BeamSearch`; `BeamSearch.from_params` builds one from `SamplingParams`).

A port of Hugging Face `transformers` 5 `GenerationMixin._beam_search` and its helpers
(`transformers/generation/utils.py`: `_get_top_k_continuations`, `_get_running_beams_for_next_iteration`,
`_update_finished_beams`, `_check_early_stop_heuristic`, `_beam_search_has_unfinished_sequences`),
with the same float32 arithmetic and -1e9 sentinels, so the engine's beams, tokens and scores equal
`generate()`'s bit for bit. Each step keeps the best C = max(2, 1 + number of EOS ids) * K
candidates, moves those that end into the finished set scored `sum of log-probs / generated_len **
length_penalty`, and continues with the K best that did not end.

Shapes: B batch items, K beams, V vocabulary, C candidates per item, T = max_new_tokens.
Rows are flattened batch-major: row `b * K + k` is beam k of item b (HF's layout).

How the engine drives it (the prompt is expanded to B*K identical rows first, as HF does):

    while not beams.is_done:
        logprobs = process_logits(log_softmax(logits (B*K, V)), history, params, beams.num_generated)
        tokens, src = beams.step(logprobs)
        reorder / fork the KV cache rows by `src` (row i continues row src[i]); feed `tokens`
    hypotheses = beams.finalize()

The algorithm step by step, and when the search stops: docs/engine.md, "Decoding".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from llmperf.engine.sampling import SamplingParams

_NEG = -1.0e9  # HF's "impossible" score: large enough to lose every comparison, finite to stay NaN-free


def _gather_beams(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Select along dim 1 of `t` (B, X, ...) with `idx` (B, Y): HF's `_gather_beams`."""
    while idx.dim() < t.dim():
        idx = idx.unsqueeze(-1)
    return torch.take_along_dim(t, idx, dim=1)


class BeamSearch:
    """Beam search state for B batch items of K beams each; see the module docstring."""

    def __init__(self, batch_size: int, num_beams: int, *, max_new_tokens: int,
                 eos_token_id: int | Sequence[int] | None = None, length_penalty: float = 1.0,
                 early_stopping: bool | Literal["never"] = False, num_return_sequences: int = 1,
                 stop_sequences: Sequence[Sequence[int]] = (), do_sample: bool = False) -> None:
        # Validate through SamplingParams: one set of rules and messages for every parameter.
        params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                length_penalty=length_penalty, early_stopping=early_stopping,
                                num_return_sequences=num_return_sequences, stop_sequences=stop_sequences,
                                num_beams=num_beams, do_sample=do_sample)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
        self.batch_size, self.num_beams = batch_size, num_beams
        self.max_new_tokens = max_new_tokens
        self.eos_ids = params.eos_ids
        self.stop_sequences = params.stop_sequences
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.num_return_sequences = num_return_sequences
        self.do_sample = do_sample
        self.num_candidates = max(2, 1 + len(self.eos_ids)) * num_beams

        B, K, T = batch_size, num_beams, max_new_tokens
        self._step = 0
        self._done = False
        self._tokens = torch.full((B, K, T), -1, dtype=torch.long)  # running beams' generated tokens
        # Only beam 0 starts alive: the K prompt copies are identical, and K copies of one
        # continuation would waste the beams.
        self._scores = torch.zeros((B, K), dtype=torch.float32)  # summed log-probs
        self._scores[:, 1:] = _NEG
        self._fin_tokens = torch.full((B, K, T), -1, dtype=torch.long)  # finished hypotheses, best first
        self._fin_len = torch.zeros((B, K), dtype=torch.long)
        self._fin_scores = torch.full((B, K), _NEG, dtype=torch.float32)  # length-penalised
        self._fin_mask = torch.zeros((B, K), dtype=torch.bool)  # slot holds a real hypothesis
        self._improvable = torch.ones((B, 1), dtype=torch.bool)  # HF's is_early_stop_heuristic_unsatisfied

    @classmethod
    def from_params(cls, batch_size: int, params: SamplingParams) -> BeamSearch:
        return cls(batch_size, params.num_beams, max_new_tokens=params.max_new_tokens,
                   eos_token_id=params.eos_token_id, length_penalty=params.length_penalty,
                   early_stopping=params.early_stopping, num_return_sequences=params.num_return_sequences,
                   stop_sequences=params.stop_sequences, do_sample=params.is_sampling)

    @property
    def is_done(self) -> bool:
        return self._done

    @property
    def num_generated(self) -> int:
        return self._step

    def running_tokens(self) -> torch.Tensor:
        """Generated tokens of each running beam, `(B*K, num_generated)` (append them to the prompt
        to get the history the processors need)."""
        return self._tokens[:, :, :self._step].reshape(self.batch_size * self.num_beams, self._step)

    def running_scores(self) -> torch.Tensor:
        return self._scores.reshape(-1).clone()

    # -----------------------------------------------------------------------------------------------

    def step(self, logprobs: torch.Tensor, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance every beam by one token. `logprobs` `(B*K, V)`: log-softmax of the running beams'
        next-token logits, after processors. Returns `(next_tokens, source_rows)`, both `(B*K,)`:
        new row i is old row `source_rows[i]` followed by `next_tokens[i]`. `generator` is used only
        when sampling (None: torch's global generator, as HF). After the step that makes `is_done`
        true, the returned rows are leftovers (HF's too): read the result from `finalize()`."""
        B, K, C = self.batch_size, self.num_beams, self.num_candidates
        if self._done:
            raise RuntimeError("step: the beam search is done; call finalize()")
        if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2 or logprobs.shape[0] != B * K:
            shape = tuple(logprobs.shape) if isinstance(logprobs, torch.Tensor) else type(logprobs).__name__
            raise ValueError(f"logprobs: expected shape ({B * K}, V) for {B} items x {K} beams, got {shape}")
        V = logprobs.shape[1]
        if K * V < C:
            raise ValueError(f"logprobs: a vocabulary of {V} gives fewer than the {C} candidates per item "
                             f"that {K} beams need")
        t = self._step
        cand_scores, cand_tokens, cand_src = self._top_candidates(logprobs, V, generator)
        ended = self._ended(cand_tokens, t)  # (B, C)

        self._update_finished(cand_scores, cand_tokens, ended, t)
        src = self._select_running(cand_scores, cand_tokens, cand_src, ended)
        self._step = t + 1
        self._update_done(ended)
        return self._tokens[:, :, t].reshape(B * K), src.reshape(B * K)

    def _top_candidates(self, logprobs: torch.Tensor, V: int, generator: torch.Generator | None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The C best (or sampled) continuations of each item: scores (B, C), token rows (B, C, T) with
        the new token written at the current step, and the flat source row of each (B, C)."""
        B, K, C, t = self.batch_size, self.num_beams, self.num_candidates, self._step
        acc = logprobs.to(torch.float32).reshape(B, K, V) + self._scores[:, :, None]  # (B, K, V)
        acc = acc.reshape(B, K * V)
        if self.do_sample:
            idx = torch.multinomial(torch.softmax(acc, dim=-1), num_samples=C, generator=generator)  # (B, C)
            # best first, as the greedy branch: only the first K candidates may finish a hypothesis
            scores, order = torch.gather(acc, 1, idx).sort(dim=-1, descending=True)
            idx = idx.gather(1, order)
        else:
            scores, idx = torch.topk(acc, k=C)  # (B, C), best first
        beam = idx // V  # (B, C) beam within the item
        tokens = _gather_beams(self._tokens, beam).clone()  # (B, C, T)
        tokens[:, :, t] = idx % V
        src = beam + torch.arange(B)[:, None] * K  # flat row in (B*K)
        return scores, tokens, src

    def _ended(self, cand_tokens: torch.Tensor, t: int) -> torch.Tensor:
        """(B, C) bool: the candidate reaches max_new_tokens, ends with EOS or with a stop sequence."""
        B, C = cand_tokens.shape[:2]
        if t + 1 >= self.max_new_tokens:
            return torch.ones((B, C), dtype=torch.bool)
        last = cand_tokens[:, :, t]
        ended = torch.isin(last, torch.tensor(self.eos_ids, dtype=torch.long)) if self.eos_ids \
            else torch.zeros((B, C), dtype=torch.bool)
        for seq in self.stop_sequences:
            n = len(seq)
            if n <= t + 1:
                ended |= (cand_tokens[:, :, t + 1 - n:t + 1] == torch.tensor(seq)).all(dim=-1)
        return ended

    def _update_finished(self, cand_scores: torch.Tensor, cand_tokens: torch.Tensor, ended: torch.Tensor,
                         t: int) -> None:
        """Merge the ended candidates among the first K into the finished set (HF `_update_finished_beams`)."""
        B, K, C = self.batch_size, self.num_beams, self.num_candidates
        top_k_mask = torch.arange(C) < K  # only the K best candidates may finish; the rest are spares
        just_finished = ended & top_k_mask[None, :]
        scores = cand_scores / ((t + 1) ** self.length_penalty)
        full = torch.all(self._fin_mask, dim=-1, keepdim=True) & (self.early_stopping is True)
        scores += full.to(torch.float32) * _NEG
        scores += (~self._improvable).to(torch.float32) * _NEG
        scores += (~just_finished) * _NEG

        merged_scores = torch.cat((self._fin_scores, scores), dim=1)  # (B, K + C)
        keep = torch.topk(merged_scores, k=K)[1]  # (B, K)
        lengths = torch.full((B, C), t + 1, dtype=torch.long)
        self._fin_scores = _gather_beams(merged_scores, keep)
        self._fin_tokens = _gather_beams(torch.cat((self._fin_tokens, cand_tokens), dim=1), keep)
        self._fin_len = _gather_beams(torch.cat((self._fin_len, lengths), dim=1), keep)
        self._fin_mask = _gather_beams(torch.cat((self._fin_mask, just_finished), dim=1), keep)

    def _select_running(self, cand_scores: torch.Tensor, cand_tokens: torch.Tensor, cand_src: torch.Tensor,
                        ended: torch.Tensor) -> torch.Tensor:
        """The K best candidates that did not end continue (HF `_get_running_beams_for_next_iteration`);
        returns the flat source row of each new beam (B, K)."""
        running = cand_scores + ended.to(torch.float32) * _NEG
        keep = torch.topk(running, k=self.num_beams)[1]  # (B, K)
        self._tokens = _gather_beams(cand_tokens, keep)
        self._scores = _gather_beams(running, keep)
        return _gather_beams(cand_src, keep)

    def _update_done(self, ended: torch.Tensor) -> None:
        """HF `_check_early_stop_heuristic` and `_beam_search_has_unfinished_sequences`."""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_len = self.max_new_tokens  # a positive penalty favours length: judge at the longest
        else:
            best_len = self._step
        best_running = self._scores[:, :1] / (best_len ** self.length_penalty)  # (B, 1)
        worst_finished = torch.where(self._fin_mask, torch.min(self._fin_scores, dim=1, keepdim=True)[0], _NEG)
        self._improvable = self._improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
        all_full = bool(torch.all(self._fin_mask)) and self.early_stopping is True
        self._done = not (bool(torch.any(self._improvable)) and not all_full and not bool(torch.all(ended)))

    def finalize(self) -> list[list[tuple[list[int], float]]]:
        """The best `num_return_sequences` finished hypotheses of each item, best first:
        (generated tokens, EOS included when it ended so; length-penalised score)."""
        if not self._done:
            raise RuntimeError("finalize: the beam search is not done; keep calling step()")
        out = []
        for b in range(self.batch_size):
            hyps = []
            for k in range(self.num_return_sequences):
                if not self._fin_mask[b, k]:
                    raise AssertionError(f"item {b} has fewer than {self.num_return_sequences} finished "
                                         "hypotheses: a finished search always fills K slots")
                n = int(self._fin_len[b, k])
                hyps.append((self._fin_tokens[b, k, :n].tolist(), float(self._fin_scores[b, k])))
            out.append(hyps)
        return out


__all__ = ["BeamSearch"]
