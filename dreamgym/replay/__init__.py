"""The experience replay buffer: persistent transitions + φ(state, action) embeddings + a faiss index."""

from dreamgym.replay.buffer import BufferStats, ReplayBuffer
from dreamgym.replay.encoder import (
    CachedEncoder,
    Encoder,
    HashingEncoder,
    MiniLMEncoder,
    make_encoder,
    phi_text,
)
from dreamgym.replay.index import IndexConfig
from dreamgym.replay.record import ReplayRecord, Retrieved, transition_key

__all__ = [
    "BufferStats",
    "CachedEncoder",
    "Encoder",
    "HashingEncoder",
    "IndexConfig",
    "MiniLMEncoder",
    "ReplayBuffer",
    "ReplayRecord",
    "Retrieved",
    "make_encoder",
    "phi_text",
    "transition_key",
]
