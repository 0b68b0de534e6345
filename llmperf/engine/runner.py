"""The model runner: feeds scheduled sequence groups through the model and turns logits into tokens.

Two kinds of step, each one forward pass:

- `prefill(groups)`: the prompts of new groups (their first token is chosen here: greedy, sampled,
  or the first beam-search step; then the prompt's cache is forked into the group's samples / beams),
  and the tokens of preempted groups being recomputed (all but the last token; the logits are
  dropped, the last token is fed by the next decode). Sequences of equal length run as one batch.
- `decode(groups)`: one new token for every running sequence, as one batch.

The caller (the scheduler) has already reserved the cache slots these steps write. Token choice is
`llmperf.engine.sampling` (processors in HF order, greedy or a draw from the group's generator) and,
for beams, `llmperf.engine.beam.BeamSearch` on log-softmax scores, after which the beams' caches are
reordered by `source_rows`. Greedy groups with identical parameters are processed as one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence as Seq
from typing import Any

import torch

from llmperf.engine.cache import KVCache
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams, finish_reason, process_logits, select_next_tokens
from llmperf.engine.sequence import Completion, Sequence, SequenceGroup


class ModelRunner:
    def __init__(self, model: Transformer, cache: KVCache, *, recorder: Any = NULL_RECORDER,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model, self.cache, self.rec, self.clock = model, cache, recorder, clock
        self.device = model.device

    # ---- forward ---------------------------------------------------------------------------------
    def _forward(self, seqs: list[Sequence], inputs: list[list[int]]) -> torch.Tensor:
        """Logits (B, V) of the last of `inputs[b]` fed to sequence b (all inputs of one length)."""
        T = len(inputs[0])
        tokens = torch.tensor(inputs, dtype=torch.long).to(self.device, non_blocking=True)  # (B, T)
        meta = self.cache.prepare([s.seq_id for s in seqs], T)
        with self.rec.forward():
            return self.model(tokens, meta, rec=self.rec)

    def _step_shape(self, seqs: list[Sequence], q_len: int) -> dict[str, int]:
        lens = [self.cache.seq_len(s.seq_id) for s in seqs]
        return dict(batch=len(seqs), q_len=q_len, kv_len=max(lens), tokens_in_cache=sum(lens))

    # ---- prefill ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, groups: Seq[SequenceGroup]) -> None:
        """Run the prompts (or recomputations) of `groups`; fresh groups get their first token."""
        items: dict[int, list[tuple[SequenceGroup, Sequence, list[int]]]] = {}
        for g in groups:
            if not g.prefilled:
                seq = g.seqs[0]
                items.setdefault(len(seq.tokens), []).append((g, seq, seq.tokens))
            else:  # recompute after preemption: the cache gets all but the last token back
                for seq in g.seqs:
                    items.setdefault(len(seq.tokens) - 1, []).append((g, seq, seq.tokens[:-1]))
            g.needs_prefill = False
        for T in sorted(items):
            chunk = items[T]
            seqs = [seq for _, seq, _ in chunk]
            with self.rec.step("prefill", **self._step_shape(seqs, T)):
                logits = self._forward(seqs, [inp for _, _, inp in chunk])  # (B, V)
                fresh = [(g, logits[b]) for b, (g, _, _) in enumerate(chunk) if not g.prefilled]
                self._first_tokens(fresh)
            now = self.clock()
            for g, _ in fresh:
                g.prefilled = True
                g.metrics.first_token = now
                g.metrics.token_times.append(now)
                if g.is_finished:
                    g.metrics.finished = now

    def _first_tokens(self, fresh: list[tuple[SequenceGroup, torch.Tensor]]) -> None:
        """Choose each fresh group's first token(s) from its prompt's logits `(V,)`, then fork."""
        plain = []
        for g, row in fresh:
            if g.beams is not None:
                self._beam_step(g, row[None].expand(g.params.num_beams, -1), [g.seqs[0]] * g.params.num_beams)
            else:
                plain.append((g, row[None].expand(g.width, -1), [g.seqs[0].tokens] * g.width, [0] * g.width))
        for (g, _, _, _), toks in zip(plain, self._choose(plain)):
            seq0 = g.seqs[0]
            children = [Sequence(list(g.prompt), len(g.prompt), index=i) for i in range(1, g.width)]
            for child in children:
                self.cache.fork(seq0.seq_id, child.seq_id)
            g.seqs = [seq0] + children
            for seq, tok in zip(g.seqs, toks):
                seq.tokens.append(tok)
            self._retire(g)

    # ---- decode ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, groups: Seq[SequenceGroup]) -> None:
        """One token for every running sequence of `groups` (their slots already reserved)."""
        seqs = [s for g in groups for s in g.seqs]
        with self.rec.step("decode", **self._step_shape(seqs, 1)):
            logits = self._forward(seqs, [[s.tokens[-1]] for s in seqs])  # (B, V)
            plain, row = [], 0
            for g in groups:
                n = len(g.seqs)
                rows = logits[row:row + n]
                row += n
                if g.beams is not None:
                    self._beam_step(g, rows, g.seqs)
                else:
                    plain.append((g, rows, [s.tokens for s in g.seqs], [s.num_generated for s in g.seqs]))
            for (g, _, _, _), toks in zip(plain, self._choose(plain)):
                for seq, tok in zip(g.seqs, toks):
                    seq.tokens.append(tok)
                self._retire(g)
        now = self.clock()
        for g in groups:
            g.metrics.token_times.append(now)
            if g.is_finished:
                g.metrics.finished = now

    # ---- token choice ----------------------------------------------------------------------------
    def _choose(self, entries: list[tuple[SequenceGroup, torch.Tensor, list[list[int]], list[int]]]
                ) -> list[list[int]]:
        """Next token of every row of every entry (group, logits (n, V), histories, num_generated).
        Sampling groups draw from their own generator; greedy groups with equal params are batched."""
        out: list[list[int]] = [[] for _ in entries]
        batched: dict[SamplingParams, list[int]] = {}
        for i, (g, logits, hist, ngen) in enumerate(entries):
            if g.params.is_sampling:
                scores = process_logits(logits.float(), hist, g.params, ngen)
                out[i] = select_next_tokens(scores, g.params, g.generator).tolist()
            else:
                batched.setdefault(g.params, []).append(i)
        for params, idx in batched.items():
            logits = torch.cat([entries[i][1] for i in idx]) if len(idx) > 1 else entries[idx[0]][1]
            hist = [h for i in idx for h in entries[i][2]]
            ngen = [n for i in idx for n in entries[i][3]]
            toks = select_next_tokens(process_logits(logits.float(), hist, params, ngen), params, None).tolist()
            pos = 0
            for i in idx:
                n = entries[i][1].shape[0]
                out[i], pos = toks[pos:pos + n], pos + n
        return out

    def _beam_step(self, g: SequenceGroup, logits: torch.Tensor, rows: list[Sequence]) -> None:
        """One beam-search step for group `g`: `logits` (K, V) of its K rows (before the first step
        all K rows are the prompt's sequence). Reorders the cache, appends the tokens."""
        assert g.beams is not None
        K = g.params.num_beams
        scores = torch.log_softmax(logits.float(), dim=-1)  # (K, V); HF processes log-probs in beam search
        scores = process_logits(scores, [s.tokens for s in rows], g.params, g.beams.num_generated)
        # BeamSearch keeps its (small) state on the CPU, as HF's bookkeeping is host-side too.
        tokens, src = g.beams.step(scores.cpu(), g.generator if g.params.is_sampling else None)
        tokens, src = tokens.tolist(), src.tolist()
        if len(g.seqs) == 1:  # first step: every beam continues the prompt (HF starts beams 1.. at -1e9)
            assert set(src) == {0}, f"the first beam step must continue the prompt, got sources {src}"
            seq0 = g.seqs[0]
            children = [Sequence(list(g.prompt), len(g.prompt), index=i) for i in range(1, K)]
            for child in children:
                self.cache.fork(seq0.seq_id, child.seq_id)
            g.seqs = [seq0] + children
        else:
            self.cache.reorder([s.seq_id for s in g.seqs], src)
            new_tokens = [list(g.seqs[j].tokens) for j in src]
            for seq, toks in zip(g.seqs, new_tokens):
                seq.tokens = toks
        for seq, tok in zip(g.seqs, tokens):
            seq.tokens.append(tok)
        if g.beams.is_done:
            for rank, (toks, score) in enumerate(g.beams.finalize()[0]):
                g.finished[rank] = Completion(tokens=toks, finish_reason=finish_reason(toks, g.params) or "length",
                                              score=score)
            for seq in g.seqs:
                self.cache.free(seq.seq_id)
            g.seqs = []

    def _retire(self, g: SequenceGroup) -> None:
        """Finish the sequences of `g` that hit EOS, a stop sequence or max_new_tokens; free their cache."""
        keep = []
        for seq in g.seqs:
            reason = finish_reason(seq.generated, g.params)
            if reason is None:
                keep.append(seq)
                continue
            g.finished[seq.index] = Completion(tokens=seq.generated, finish_reason=reason)
            self.cache.free(seq.seq_id)
        g.seqs = keep
