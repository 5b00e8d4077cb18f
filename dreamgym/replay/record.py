"""What the replay buffer stores per transition (:class:`ReplayRecord`) and returns per hit (:class:`Retrieved`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dreamgym.types import Source, Trajectory, Transition


class ReplayRecord(BaseModel):
    """One transition (s_t, a_t, s_{t+1}, r_{t+1}, done) with where it came from.

    ``iteration`` is the RL iteration that produced it (-1 for offline data); ``step`` is t in its trajectory.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    traj_id: str
    task_id: str
    instruction: str
    env: str
    source: Source
    iteration: int = -1
    step: int = 0
    state: str
    action: str
    next_state: str
    reward: float
    done: bool
    info: dict[str, Any] = Field(default_factory=dict)

    @property
    def transition(self) -> Transition:
        return Transition(
            state=self.state,
            action=self.action,
            next_state=self.next_state,
            reward=self.reward,
            done=self.done,
            info=self.info,
        )

    def key(self) -> bytes:
        """Exact-duplicate key: a 128-bit hash of (env, state, action, next_state, reward, done)."""
        return _key(self.env, self.state, self.action, self.next_state, self.reward, self.done)

    @classmethod
    def from_trajectory(cls, traj: Trajectory, iteration: int = -1) -> list[ReplayRecord]:
        return [
            cls(
                traj_id=traj.traj_id,
                task_id=traj.task.task_id,
                instruction=traj.task.instruction,
                env=traj.task.env,
                source=traj.source,
                iteration=iteration,
                step=t,
                state=x.state,
                action=x.action,
                next_state=x.next_state,
                reward=x.reward,
                done=x.done,
                info=x.info,
            )
            for t, x in enumerate(traj.transitions)
        ]


def _key(env: str, state: str, action: str, next_state: str, reward: float, done: bool) -> bytes:
    payload = json.dumps([env, state, action, next_state, reward, done])
    return hashlib.blake2b(payload.encode(), digest_size=16).digest()


def transition_key(traj: Trajectory, t: int) -> bytes:
    """The :meth:`ReplayRecord.key` of step ``t`` of ``traj``: the key its one stored copy has in a buffer,
    whichever trajectory that copy was added under (duplicates are kept once)."""
    x = traj.transitions[t]
    return _key(traj.task.env, x.state, x.action, x.next_state, x.reward, x.done)


class Retrieved(ReplayRecord):
    """A stored transition returned by retrieval: ``score`` is its cosine with the query, ``row`` its position."""

    score: float
    row: int
