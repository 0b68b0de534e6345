"""The model runner: executes the steps the shared scheduler plans, and turns logits into tokens.

`ModelRunner` is the engine's `llmperf.serving.scheduler.Runner`: `execute(plan)` runs one
`StepPlan` and returns its measured duration and the sequences that ended. A plan lists, per request,
the tokens to compute for each of its sequences (`ScheduledItem`: positions `start .. start + n`;
their cache slots are already reserved by the scheduler). Items with the same `n` form one group
(B, n); a step of one group runs one forward `(B, n)`, and a step whose items differ in length (a
mixed step: decode tokens and prefill chunks) runs ONE forward over all its groups
(`Transformer.forward_groups`: the GEMMs, norms and activations over all the step's tokens, so each
weight is read once; attention and KV writes per group), as serving engines do and as the simulator
prices a mixed step. (It used to run one forward per length: a mixed step of a 182-token chunk and
one decode token read every weight twice, 164 + 22 ms on the 2-core CPU, against 141 ms priced.)
The step's phase comes from the plan, never from shapes.

Items that end at a sequence's last token sample its next one (`samples`): greedy, sampled or, for
beams, a `llmperf.engine.beam.BeamSearch` step on log-softmax scores, after which the beams' caches
are reordered by `source_rows`. A request's first token is chosen from its prompt's last logits for
each of its samples / beams (`fork_into`: the scheduler forks their caches after the step). Token
choice is `llmperf.engine.sampling` (processors in HF order, greedy or a draw from the group's
generator); greedy groups with identical parameters are processed as one batch. Sequences that end
(EOS, stop sequence, max_new_tokens, beam search done) are reported, and the scheduler frees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from llmperf.engine.attention import AttentionFn, get_backend
from llmperf.engine.cache import KVCache
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams, finish_reason, process_logits, select_next_tokens
from llmperf.engine.sequence import Completion, Sequence, SequenceGroup
from llmperf.engine.step import StepMeta
from llmperf.serving.scheduler import ScheduledItem, StepOutcome, StepPlan


class ModelRunner:
    """Runs plans over `groups` (request id -> `SequenceGroup`) with `model` and `cache`, using the
    attention backend `attention` (the engine's choice, not the model's)."""

    def __init__(self, model: Transformer, cache: KVCache, groups: dict[int, SequenceGroup], *,
                 attention: str | None = None, recorder: Any = NULL_RECORDER,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model, self.cache, self.groups, self.rec, self.clock = model, cache, groups, recorder, clock
        self.attend: AttentionFn = get_backend(attention or model.attention_backend)
        self.device = model.device

    # ---- forward ---------------------------------------------------------------------------------
    def _batch(self, seq_ids: list[int], inputs: list[list[int]], prompt_lens: list[int]
               ) -> tuple[torch.Tensor, StepMeta]:
        """The tokens (B, T) of one group (all inputs of one length) and its metadata: the cache's, and
        each sequence's prompt length."""
        tokens = torch.tensor(inputs, dtype=torch.long).to(self.device, non_blocking=True)  # (B, T)
        meta = self.cache.prepare(seq_ids, len(inputs[0]))
        meta.prompt_lens = tuple(prompt_lens)
        return tokens, meta

    def _forward_groups(self, groups: list[tuple[list[int], list[list[int]], list[int]]]) -> list[torch.Tensor]:
        """Logits (B_g, V) per group of a step (of several when it is mixed), from ONE forward over all of them."""
        batch = [self._batch(*g) for g in groups]
        with self.rec.forward():
            if len(batch) == 1:
                return [self.model(*batch[0], rec=self.rec, attend=self.attend)]
            return self.model.forward_groups(batch, rec=self.rec, attend=self.attend)

    # ---- one step --------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutcome:
        t0 = self.clock()
        finished: set[int] = set()
        by_len: dict[int, list[ScheduledItem]] = {}
        for item in plan.items:
            by_len.setdefault(item.num_tokens, []).append(item)
        plain: list[tuple[SequenceGroup, torch.Tensor, list[list[int]], list[int]]] = []
        groups = []  # per length: (items, seq_ids, inputs, owners, prompt lengths)
        for n in sorted(by_len):
            items = by_len[n]
            seq_ids, inputs, owners, prompt = [], [], [], []
            for item in items:
                g = self.groups[item.request_id]
                if g.metrics.scheduled is None:
                    g.metrics.scheduled = t0
                if not g.prefilled:
                    g.seqs[0].seq_id = item.seq_ids[0]  # the scheduler names the sequences
                tokens = {s.seq_id: s.tokens for s in g.seqs}
                for sid in item.seq_ids:
                    seq_ids.append(sid)
                    inputs.append(tokens[sid][item.start:item.start + n])
                    prompt.append(len(g.prompt))
                owners.append(len(item.seq_ids))
            groups.append((items, seq_ids, inputs, owners, prompt))
        all_ids = [s for _, ids, _, _, _ in groups for s in ids]
        lens = [self.cache.seq_len(s) for s in all_ids]
        with self.rec.step(plan.phase, batch=len(all_ids), q_len=max(by_len), kv_len=max(lens),
                           tokens_in_cache=sum(lens)):
            per_group = self._forward_groups([(ids, inp, prompt) for _, ids, inp, _, prompt in groups])  # (B_g, V)
            for (items, _, _, owners, _), logits in zip(groups, per_group):
                row = 0
                for item, k in zip(items, owners):
                    rows = logits[row:row + k]
                    row += k
                    if item.samples:
                        plain += self._sample(item, rows, finished)
        for (g, _, _, _), toks in zip(plain, self._choose(plain)):
            for seq, tok in zip(g.seqs, toks):
                seq.tokens.append(tok)
            self._retire(g, finished)
        now = self.clock()
        for item in plan.items:
            if not item.samples:
                continue
            g = self.groups[item.request_id]
            g.prefilled = True
            if g.metrics.first_token is None:
                g.metrics.first_token = now
            g.metrics.token_times.append(now)
            if g.is_finished:
                g.metrics.finished = now
        return StepOutcome(duration_s=now - t0, finished=frozenset(finished))

    def _sample(self, item: ScheduledItem, rows: torch.Tensor, finished: set[int]
                ) -> list[tuple[SequenceGroup, torch.Tensor, list[list[int]], list[int]]]:
        """Token choice for one item's sequences from `rows` (k, V). Beam steps run here; plain
        groups are returned for one batched choice."""
        g = self.groups[item.request_id]
        first = not g.prefilled
        if first:  # the prompt's logits give every sample / beam its first token
            seq0 = g.seqs[0]
            g.seqs = [seq0] + [Sequence(list(g.prompt), len(g.prompt), index=i, seq_id=sid)
                               for i, sid in enumerate(item.fork_into, start=1)]
            rows = rows.expand(len(g.seqs), -1)
        if g.beams is not None:
            self._beam_step(g, rows, first, finished)
            return []
        return [(g, rows, [s.tokens for s in g.seqs], [s.num_generated for s in g.seqs])]

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

    def _beam_step(self, g: SequenceGroup, logits: torch.Tensor, first: bool, finished: set[int]) -> None:
        """One beam-search step for group `g`: `logits` (K, V) of its K beams (at the first step
        every beam is the prompt). Reorders the cache, appends the tokens."""
        assert g.beams is not None
        scores = torch.log_softmax(logits.float(), dim=-1)  # (K, V); HF processes log-probs in beam search
        scores = process_logits(scores, [s.tokens for s in g.seqs], g.params, g.beams.num_generated)
        # BeamSearch keeps its (small) state on the CPU, as HF's bookkeeping is host-side too.
        tokens, src = g.beams.step(scores.cpu(), g.generator if g.params.is_sampling else None)
        tokens, src = tokens.tolist(), src.tolist()
        if first:  # every beam continues the prompt (HF starts beams 1.. at -1e9); the scheduler forks them
            assert set(src) == {0}, f"the first beam step must continue the prompt, got sources {src}"
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
            finished.update(s.seq_id for s in g.seqs)
            g.seqs = []

    def _retire(self, g: SequenceGroup, finished: set[int]) -> None:
        """Finish the sequences of `g` that hit EOS, a stop sequence or max_new_tokens (reported to
        the scheduler, which frees their cache)."""
        keep = []
        for seq in g.seqs:
            reason = finish_reason(seq.generated, g.params)
            if reason is None:
                keep.append(seq)
                continue
            g.finished[seq.index] = Completion(tokens=seq.generated, finish_reason=reason)
            finished.add(seq.seq_id)
        g.seqs = keep
