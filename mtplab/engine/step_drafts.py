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
    replaced by the oracle's)."""

    def __init__(self, engine, prompts: np.ndarray, first: np.ndarray, hidden, references, stop: Callable | None,
                 decode_first: bool):
        run, B = engine.spec, engine.batch
        kind = DRAFTERS.get(run.drafter)
        self.engine, self.stop, self.decode_first, self.P = engine, stop, decode_first, prompts.shape[1]
        self.row_prompts = [[int(t) for t in row] for row in prompts]
        self.runs_head = not kind.per_row and kind.uses_head(run)
        # the head's logits and hidden state at each row's last committed entry: a fused step's first draft
        self.head_last = (prefill_head(engine, np.concatenate([prompts[:, 1:], first[:, None]], 1), hidden)
                          if self.runs_head else None)
        self.from_oracle = run.drafter == "oracle"
        # at T > 0 the oracle drafts from a mixture of the target's own rows; its head runs for its cost, drawing nothing
        self.sampled_oracle = self.from_oracle and engine.acceptance.samples
        self.head_choice = GREEDY_MATCH.draft_rows if self.sampled_oracle else None
        self.alphas = row_alphas(run.alpha, B)
        self.oracles = [OracleDrafter(references[b], alpha, run.seed + b, engine.desc.vocab_size)
                        for b, alpha in enumerate(self.alphas)] if self.from_oracle and not self.sampled_oracle else []
        for o in self.oracles:
            o.prefill([0] * self.P, None)
        self.mixtures = [(row_target_rows(engine, b), distractor_token(run.seed + b, engine.desc.vocab_size))
                         for b in range(B)] if self.sampled_oracle else []
        for b, (rows_b, _) in enumerate(self.mixtures):
            rows_b.start(self.row_prompts[b])
        self.user_drafters = (RowDrafters(engine, kind, references, self.row_prompts, first, hidden, stop)
                              if kind.per_row else None)
        self.on_host = self.from_oracle or self.user_drafters is not None  # one row at a time: a row may draft fewer

    def draft(self, first, hidden, position: np.ndarray, lengths: np.ndarray, width: int, rows: list[int],
              uniform: bool, emitted: list[list[int]]) -> np.ndarray:
        """Every row's drafts [B, K] (K the longest row's, at most width). Row b drafts after its token first[b] at
        its position, from hidden[b] (the hidden state there: the decode's, or fused, the last commit's); lengths:
        each row's K (0 for a row that has its tokens; width, the largest), lowered in place where a row drafts
        fewer; rows: the rows still decoding; uniform: every row drafts all K (nothing to tell the rows apart);
        emitted: every row's tokens so far (the sampled oracle's context)."""
        drafts, told = None, None if uniform else lengths
        if self.runs_head:
            drafts = draft_head(self.engine, first, hidden, position, width, told, self.stop, self.head_choice) if (
                self.decode_first) else draft_from_rows(self.engine, self.head_last, position, width, told,
                                                        self.stop, self.head_choice)
        if self.from_oracle:  # each row its own K drafts (its generator stays where a batch-1 run of the row is)
            drafts = host_drafts(lengths, rows, lambda b, K: self._oracle(b, K, first, position, emitted[b]))
        if self.user_drafters is not None:
            drafts = self.user_drafters.draft(first, hidden, position, lengths, rows)
        return drafts

    def _oracle(self, b: int, K: int, first, position: np.ndarray, emitted: list[int]) -> list[int]:
        """Row b's K oracle drafts after its token `first[b]` (at the row's position + 1); emitted: the row's tokens."""
        committed = int(position[b]) + 1
        if not self.sampled_oracle:
            return self.oracles[b].draft(None, None, committed - 1, K)
        context = self.row_prompts[b] + emitted[: committed - self.P] + [int(first[b])]
        rows_b, distractor = self.mixtures[b]
        return mixture_drafts(self.engine.acceptance, rows_b, self.alphas[b], distractor, context, committed, K, b)

    def commit(self, ver_hidden, ids: np.ndarray, targets: np.ndarray, counts: np.ndarray, start: np.ndarray,
               rows: list[int]) -> None:
        """What each row's verify kept, told to the drafter before the target's commit (a re-advance may reuse the
        verify's output buffers): the head's KV rows from start, a user drafter's commit."""
        if self.runs_head:
            self.head_last = commit_head(self.engine, targets, counts, ver_hidden, start)
        if self.user_drafters is not None:
            self.user_drafters.commit(ver_hidden, ids, targets, counts, start, rows)
