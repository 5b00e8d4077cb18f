"""The decode loop of the ``hf`` backend: a running batch of rows that share one KV cache.

We write our own loop instead of calling ``model.generate`` because it gives, in a few lines each: a seeded
generator per row (a prompt's sample does not depend on its batch neighbours), log-probs of exactly the
distribution we sample from, sampling parameters per row (so any mix of requests shares a forward pass),
stop strings that end a row at once, and rows that join and leave a running batch, which is what lets
``dreamgym serve`` batch concurrent requests continuously. ``benchmarks/bench_llm.py`` compares its speed
with ``model.generate``.

Layout: rows are left-padded, so every row's newest token sits in the last column of the attention mask and
the cache; each row keeps its own position counter. New rows are prefilled on their own, then their cache is
left-padded to the batch's width (or the batch's to theirs) and concatenated along the batch dimension.
Finished rows are dropped from the cache once they are a quarter of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dreamgym.llm.base import Completion, FinishReason, SamplingParams

PRUNE_FRACTION = 0.25


@dataclass(eq=False)
class Row:
    """One prompt being decoded, with what it has generated so far."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None  # set when a stop string ended the row
    finish: FinishReason | None = None
    choice_ids: list[list[int]] | None = None  # guided choice: the token ids of each allowed completion
    allowed_ids: list[list[int]] = field(default_factory=list)  # guided choice: each token's allowed set

    def allowed(self) -> set[int]:
        """Guided choice: the tokens that continue one of the choices after what the row has generated."""
        n = len(self.token_ids)
        return {ids[n] for ids in self.choice_ids or () if len(ids) > n and ids[:n] == self.token_ids}

    def completion(self, tokenizer: Any) -> Completion:
        text = self.text
        if text is None:
            body = self.token_ids[:-1] if self.finish == "stop" else self.token_ids  # the EOS is not text
            text = tokenizer.decode(body, skip_special_tokens=True)
        return Completion(
            text=text,
            token_ids=self.token_ids,
            logprobs=self.logprobs if self.params.logprobs else None,
            prompt_ids=self.prompt_ids,
            finish_reason=self.finish or "length",
            allowed_ids=[list(a) for a in self.allowed_ids] if self.choice_ids is not None else None,
        )


class DecodeBatch:
    """Rows decoded together. ``add`` prefills new rows (and samples their first token); ``step`` runs one
    forward pass that appends a token to every unfinished row. Not thread-safe."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: set[int], pad_id: int) -> None:
        self.model, self.tokenizer, self.eos_ids, self.pad_id = model, tokenizer, eos_ids, pad_id
        self.device: torch.device = next(model.parameters()).device
        self.rows: list[Row] = []  # batch position -> row; finished rows stay until pruned
        self.cache = DynamicCache(config=model.config)
        self.attention_mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.next_position = torch.zeros(0, dtype=torch.long, device=self.device)
        self.last_tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        self.temperature = torch.zeros(0, device=self.device)
        self.top_p = torch.zeros(0, device=self.device)
        self.forward_passes = 0

    @property
    def active(self) -> int:
        return sum(r.finish is None for r in self.rows)

    def can_join(self) -> bool:
        """Whether rows can join while others decode: it needs plain (full-attention) cache layers."""
        return len(_plain_layers(self.cache)) == len(self.cache.layers)

    def add(self, prompt_ids: Sequence[list[int]], params: Sequence[SamplingParams]) -> list[Row]:
        """Prefill new rows, sample their first token and merge them into the batch. Some may already be
        finished when this returns (EOS, a stop string, or ``max_new_tokens == 1``)."""
        rows = [Row(list(ids), p, self._generator(p), choice_ids=self._choice_ids(p))
                for ids, p in zip(prompt_ids, params, strict=True)]
        for r in rows:  # a guided row runs to the end of its choice, however long (SamplingParams.choices)
            if r.choice_ids and (longest := max(len(c) for c in r.choice_ids)) > r.params.max_new_tokens:
                r.params = replace(r.params, max_new_tokens=longest)
        if not rows:
            return []
        width = max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention_mask[i, width - len(r.prompt_ids) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        self.forward_passes += 1
        temperature = torch.tensor([p.temperature for p in params], device=self.device)
        top_p = torch.tensor([p.top_p for p in params], device=self.device)
        tokens = self._advance(rows, logits, temperature, top_p)
        self._merge(rows, cache, attention_mask, position_ids[:, -1] + 1, tokens, temperature, top_p)
        return rows

    def step(self) -> list[Row]:
        """One forward pass for the whole batch; returns the rows that finished in it."""
        self._prune(all_finished=False)
        if not self.rows:
            return []
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones((len(self.rows), 1))], 1)
        logits = self.model(
            input_ids=self.last_tokens[:, None],
            attention_mask=self.attention_mask,
            position_ids=self.next_position[:, None],
            cache=self.cache,
            use_cache=True,
        ).logits[:, -1, :]
        self.forward_passes += 1
        self.next_position = self.next_position + 1
        unfinished = [r for r in self.rows if r.finish is None]
        self.last_tokens = self._advance(self.rows, logits, self.temperature, self.top_p)
        return [r for r in unfinished if r.finish is not None]

    # ------------------------------------------------------------------------------------- internals

    def _generator(self, p: SamplingParams) -> torch.Generator | None:
        if p.seed is None or p.temperature == 0:
            return None
        return torch.Generator(device=self.device).manual_seed(p.seed)

    def _choice_ids(self, p: SamplingParams) -> list[list[int]] | None:
        # each choice as the tokenizer spells it alone: how SFT tokenises a target (dreamgym.sft.encode_target)
        return None if p.choices is None else [
            list(self.tokenizer(c, add_special_tokens=False).input_ids) for c in p.choices]

    def _advance(self, rows: list[Row], logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        """Sample a token for every row and append it to the unfinished ones; mark the rows that finish."""
        logits = logits.float()
        for j, row in enumerate(rows):  # guided choice: only tokens that continue a choice
            if row.choice_ids is not None and row.finish is None:
                allowed = sorted(row.allowed())
                row.allowed_ids.append(allowed)  # empty: no choice continues (never on a prefix-free set)
                if allowed:
                    mask = torch.full_like(logits[j], float("-inf"))
                    mask[allowed] = 0.0
                    logits[j] = logits[j] + mask
        tokens, logprobs = sample(logits, temperature, top_p, [r.generator for r in rows])
        for row, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            if row.finish is not None:
                continue
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            if row.choice_ids is not None and row.token_ids in row.choice_ids:
                cut = self._cut_at_stop(row.token_ids, row.params.stop) if row.params.stop else None
                row.finish = "stop"  # the text is the choice, cut before a stop string it holds
                row.text = cut if cut is not None else self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
            elif token in self.eos_ids:
                row.finish = "stop"
            elif row.params.stop and (text := self._cut_at_stop(row.token_ids, row.params.stop)) is not None:
                row.finish, row.text = "stop", text
            elif len(row.token_ids) >= row.params.max_new_tokens:
                row.finish = "length"
        return tokens

    def _cut_at_stop(self, ids: list[int], stop: Sequence[str]) -> str | None:
        """The generated text cut before the first stop string, or None when none has appeared.

        Only a tail of the ids is decoded each step (enough characters to hold the longest stop string), so
        checking costs O(stop length), not O(generation length)."""
        need = max(len(s) for s in stop) + 1
        k = need
        tail = self.tokenizer.decode(ids[-k:], skip_special_tokens=True)
        while len(tail) < need and k < len(ids):
            k *= 2
            tail = self.tokenizer.decode(ids[-k:], skip_special_tokens=True)
        if not any(s in tail for s in stop):
            return None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text[: min(text.find(s) for s in stop if s in text)]

    def _prune(self, all_finished: bool) -> None:
        """Drop finished rows from the batch (all of them, or only once they are PRUNE_FRACTION of it), then
        the leading columns that are padding in every remaining row."""
        keep = [j for j, r in enumerate(self.rows) if r.finish is None]
        n_done = len(self.rows) - len(keep)
        if n_done == 0 or (not all_finished and n_done < max(1, int(PRUNE_FRACTION * len(self.rows)))):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.rows = [self.rows[j] for j in keep]
        self.cache.batch_select_indices(index)
        self.attention_mask, self.next_position = self.attention_mask[index], self.next_position[index]
        self.last_tokens, self.temperature, self.top_p = self.last_tokens[index], self.temperature[index], self.top_p[index]
        if self.rows and self.can_join():
            start = int(self.attention_mask.any(0).long().argmax())
            if start > 0:
                self.attention_mask = self.attention_mask[:, start:]
                for layer in _plain_layers(self.cache):
                    layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]

    def _merge(
        self,
        rows: list[Row],
        cache: DynamicCache,
        attention_mask: torch.Tensor,
        next_position: torch.Tensor,
        tokens: torch.Tensor,
        temperature: torch.Tensor,
        top_p: torch.Tensor,
    ) -> None:
        self._prune(all_finished=True)
        if not self.rows:
            self.rows, self.cache, self.attention_mask = rows, cache, attention_mask
            self.next_position, self.last_tokens, self.temperature, self.top_p = next_position, tokens, temperature, top_p
            return
        if not self.can_join():
            raise ValueError("this model's KV cache has sliding-window layers; rows cannot join a running batch")
        width = max(self.attention_mask.shape[1], attention_mask.shape[1])

        def left_pad(x: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            pad = width - x.shape[-dim_from_end]
            return F.pad(x, (0, 0) * (dim_from_end - 1) + (pad, 0)) if pad else x

        for old, new in zip(_plain_layers(self.cache), _plain_layers(cache), strict=True):
            old.keys = torch.cat([left_pad(old.keys, 2), left_pad(new.keys, 2)])
            old.values = torch.cat([left_pad(old.values, 2), left_pad(new.values, 2)])
        self.attention_mask = torch.cat([left_pad(self.attention_mask, 1), left_pad(attention_mask, 1)])
        self.rows = self.rows + rows
        self.next_position = torch.cat([self.next_position, next_position])
        self.last_tokens = torch.cat([self.last_tokens, tokens])
        self.temperature = torch.cat([self.temperature, temperature])
        self.top_p = torch.cat([self.top_p, top_p])


def _plain_layers(cache: DynamicCache) -> list[Any]:
    """The cache's full-attention layers, whose ``keys``/``values`` are ``[batch, heads, length, dim]``."""
    return [layer for layer in cache.layers if type(layer) is DynamicLayer]


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One next token per row and its log-prob under ``log_softmax(logits / T)`` (T = 1 for greedy rows).

    Rows with ``temperature == 0`` take the argmax; the others sample from the temperature-scaled
    distribution, truncated to the top-p nucleus, with their own generator when they have one."""
    greedy = temperature == 0
    logp = F.log_softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], dim=-1)
    next_tokens = logp.argmax(dim=-1)
    sampled = (~greedy).nonzero().flatten().tolist()
    if sampled:
        probs = logp[sampled].exp()
        p = top_p[sampled]
        if bool((p < 1).any()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = (sorted_probs.cumsum(-1) - sorted_probs) >= torch.where(p < 1, p, float("inf"))[:, None]
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        for row, j in enumerate(sampled):
            next_tokens[j] = torch.multinomial(probs[row], 1, generator=generators[j])[0]
    return next_tokens, logp.gather(-1, next_tokens[:, None])[:, 0]
