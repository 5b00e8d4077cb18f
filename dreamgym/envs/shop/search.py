"""The shop's search engine: BM25 (the ``bm25s`` library) over each product's title, attributes, options and
description, like WebShop's Pyserini index. Built once per catalog and cached in-process."""

from __future__ import annotations

import functools
import logging

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

from dreamgym.envs.shop.catalog import Catalog, build_catalog

# bm25s sets its own logger to DEBUG, which would print index-building chatter under any root handler.
logging.getLogger("bm25s").setLevel(logging.WARNING)

# Keep one-character tokens (sizes "s", "m", "l"); the default pattern drops them.
TOKEN_PATTERN = r"(?u)\b\w+\b"


class SearchEngine:
    """``search(query, k)`` -> catalog indices of the best ``k`` matches, by BM25 score then catalog order."""

    def __init__(self, catalog: Catalog) -> None:
        self.tokenizer = Tokenizer(stopwords="en", splitter=TOKEN_PATTERN)
        corpus = self.tokenizer.tokenize(
            [p.search_text() for p in catalog.products], show_progress=False, return_as="tuple"
        )
        self.bm25 = bm25s.BM25()
        self.bm25.index(corpus, show_progress=False)

    def search(self, query: str, k: int = 50) -> list[int]:
        """Products with a positive score, best first; ties keep catalog order, so results are deterministic."""
        tokens = self.tokenizer.tokenize([query], update_vocab=False, show_progress=False, return_as="string")[0]
        tokens = [t for t in tokens if t]  # words outside the catalog vocabulary come back as ""
        if not tokens:
            return []
        scores = self.bm25.get_scores(tokens)
        hits = np.flatnonzero(scores > 0)
        if len(hits) > k:  # keep the top k (and any ties with the k-th) before the full sort
            kth_score = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
            hits = hits[scores[hits] >= kth_score]
        order = np.lexsort((hits, -scores[hits]))[:k]
        return [int(i) for i in hits[order]]


@functools.lru_cache(maxsize=4)
def search_engine(num_products: int, seed: int) -> SearchEngine:
    """The BM25 index of ``build_catalog(num_products, seed)``, built once per process."""
    return SearchEngine(build_catalog(num_products, seed))
