"""A speculative step's drafts, whoever makes them: the MTP head at [B, 1], the oracle (from each row's own
reference or, sampled, its own mixture, seeded per row), or a drafter of the user's own, one per row; and what the
drafter keeps of each verify (the head's KV, a user drafter's commit)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mtplab.engine.acceptance import GREEDY_MATCH
from mtplab.engine.batch_head import commit_head, draft_from_rows, draft_head, prefill_head
from mtplab.engine.drafters import OracleDrafter, row_alphas
from mtplab.engine.mixture import distractor_token, mixture_drafts, row_target_rows
from mtplab.engine.strategies import DRAFTERS


def host_drafts(lengths: np.ndarray, rows: list[int], draft: Callable) -> np.ndarray:
    """The drafts [B, K] of rows drafted one at a time on the host, draft(b, K_b) each: a row that drafts fewer than
    its K (its reference ends, its drafter stops) has its length lowered to them; K is the longest row's."""
    drafts = np.zeros((len(lengths), int(lengths.max(initial=0))), dtype=np.int64)
    for b in rows:
        made = np.asarray(draft(b, int(lengths[b])), dtype=np.int64)[: lengths[b]]
        lengths[b] = made.shape[0]
        drafts[b, : lengths[b]] = made
    return drafts[:, : int(lengths.max(initial=0))]


class RowDrafters:
    """A drafter of the user's own drafts one sequence: one per row, each told only its own row (prefill, draft,
    and commit where it has one)."""

    def __init__(self, engine, kind, references, prompts: list[list[int]], first: np.ndarray, hidden, stop):
        self.engine = engine
        self.rows = [kind.build(engine, references[b] if references else None) for b in range(engine.batch)]
        for b, d in enumerate(self.rows):
            if stop is not None:
                d.stop = stop
            d.prefill(prompts[b][1:] + [int(first[b])], hidden[b])

    def draft(self, first, hidden, position, lengths: np.ndarray, rows: list[int]) -> np.ndarray:
        """Each decoding row's drafts [B, K] (host_drafts: a row may draft fewer than asked)."""
        read = self.engine.device.read
        return host_drafts(lengths, rows, lambda b, K: read(self.rows[b].draft(int(first[b]), hidden[b],
                                                                               int(position[b]), K)))

    def commit(self, hidden, ids: np.ndarray, targets: np.ndarray, counts: np.ndarray, start, rows: list[int]) -> None:
        """What each decoding row's verify kept: its accepted drafts and bonus at start + 1.., the verify's hidden
        rows from start."""
        for b in rows:
            if (commit := getattr(self.rows[b], "commit", None)) is not None:
                c = int(counts[b])
                commit(hidden[b], ids[b, 1 : c + 1].tolist() + [int(targets[b, c])], int(start[b]))


class StepDrafts:
    """The run's drafting, set up after the prefill (prompts [B, P], its first tokens and hidden states [B, P, H]):
    draft() gives every row's drafts for one step, commit() tells the drafter what each row's verify kept.
    decode_first: each step decodes its pending token first and drafts from it; else fused, from the last commit.

    The head runs where the run's drafter uses it (the oracle's default config runs it for its cost, its drafts
    replaced by the oracle's); `emitted` is every row's tokens so far, read by the sampled oracle's mixture."""

    def __init__(self, engine, prompts: np.ndarray, first: np.ndarray, hidden, references, emitted: list[list[int]],
                 stop: Callable | None, decode_first: bool):
        run, B = engine.spec, engine.batch
        kind = DRAFTERS.get(run.drafter)
        self.engine, self.stop, self.emitted, self.P = engine, stop, emitted, prompts.shape[1]
        self.decode_first = decode_first  # the step decodes first (its drafts from that decode), else fused
        self.row_prompts = [[int(t) for t in row] for row in prompts]
        self.head = not kind.per_row and kind.uses_head(run)
        self.ready = (prefill_head(engine, np.concatenate([prompts[:, 1:], first[:, None]], 1), hidden)
                      if self.head else None)
        oracle = run.drafter == "oracle"
        self.mixture = oracle and engine.acceptance.samples  # at T > 0 the oracle drafts from the target's own rows
        self.alphas = row_alphas(run.alpha, B)
        self.oracles = [OracleDrafter(references[b], alpha, run.seed + b, engine.desc.vocab_size)
                        for b, alpha in enumerate(self.alphas)] if oracle and not self.mixture else []
        for o in self.oracles:
            o.prefill([0] * self.P, None)
        self.mixtures = [(row_target_rows(engine, b), distractor_token(run.seed + b, engine.desc.vocab_size))
                         for b in range(B)] if self.mixture else []
        for b, (rows_b, _) in enumerate(self.mixtures):
            rows_b.start(self.row_prompts[b])
        self.oracle = oracle
        # the mixture's head runs for its cost, drawing nothing
        self.head_choice = GREEDY_MATCH.draft_rows if self.mixture else None
        self.own = RowDrafters(engine, kind, references, self.row_prompts, first, hidden, stop) if kind.per_row else None
        self.on_host = oracle or self.own is not None  # rows drafted one at a time: a row may draft fewer

    def draft(self, first, hidden, position: np.ndarray, lengths: np.ndarray, rows: list[int],
              uniform: bool) -> np.ndarray:
        """Every row's drafts [B, K] (K the longest row's) from its token `first[b]` and hidden state at its
        position; lengths: each row's K (0 for a row that has its tokens), lowered in place where a row drafts fewer;
        uniform: every row drafts all of them (nothing to tell the rows apart)."""
        width, drafts, told = int(lengths.max(initial=0)), None, None if uniform else lengths
        if self.head:
            drafts = draft_head(self.engine, first, hidden, position, width, told, self.stop, self.head_choice) if (
                self.decode_first) else draft_from_rows(self.engine, self.ready, position, width, told, self.stop,
                                                        self.head_choice)
        if self.oracle:  # each row its own K drafts (its generator stays where a batch-1 run of the row is)
            drafts = host_drafts(lengths, rows, lambda b, K: self._oracle(b, K, first, position))
        if self.own is not None:
            drafts = self.own.draft(first, hidden, position, lengths, rows)
        return drafts

    def _oracle(self, b: int, K: int, first, position: np.ndarray) -> list[int]:
        """Row b's K oracle drafts after its token `first[b]` (at the row's position + 1)."""
        committed = int(position[b]) + 1
        if not self.mixture:
            return self.oracles[b].draft(None, None, committed - 1, K)
        context = self.row_prompts[b] + self.emitted[b][: committed - self.P] + [int(first[b])]
        rows_b, distractor = self.mixtures[b]
        return mixture_drafts(self.engine.acceptance, rows_b, self.alphas[b], distractor, context, committed, K, b)

    def commit(self, ver_hidden, ids: np.ndarray, targets: np.ndarray, counts: np.ndarray, start: np.ndarray,
               rows: list[int]) -> None:
        """What each row's verify kept, told to the drafter before the target's commit (a re-advance may reuse the
        verify's output buffers): the head's KV rows from start, a user drafter's commit."""
        if self.head:
            self.ready = commit_head(self.engine, targets, counts, ver_hidden, start)
        if self.own is not None:
            self.own.commit(ver_hidden, ids, targets, counts, start, rows)
