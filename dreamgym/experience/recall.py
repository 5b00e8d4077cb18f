"""Recall: a dreamt step that the offline data recorded is answered as the real env answered it.

An LLM fine-tuned on the offline transitions (the paper's 8B M_exp) reproduces most of them when it meets their query
again; the 1.3M CPU M_exp does not. On TextWorld its 512-token prompt loses the retrieved real transition (12 of 1,439
training prompts keep it), and with it the only source of what a closed container holds: opening one offers a recipe
ingredient in 83% of the real steps and in 1-35% of the dreamt ones (benchmarks/results/dream_signal_textworld.json),
although 273 of 439 dreamt opens (62%) were this very query of a recorded episode (the same task, state and action;
benchmarks/results/dream_neighbours_textworld_premises.json). With recall the dream showed one behind 46% of its opens
(bench_textworld_recall_seed0.json's run), and its policy did not move on test (+0.000; GRPO-real: +0.020).

:class:`Recall` is that memory, exact and explicit: a table from (task instruction, state, action) to the recorded
outcome, made from the real trajectories the dream already holds (its ``offline_data``). ``ExperienceModel.predict``
asks it before the model and generates only the rest (``DreamConfig.recall``), counting ``recalled`` steps; the
dream marks them in their step info. No real transition is consumed: the table holds only the offline data.

Where the data recorded one query with several outcomes (TextWorld's pages list at most ``max_commands`` commands, so
which ones a page shows can depend on what lies elsewhere; an ending's text counts the turns), the most frequent
outcome is kept, the first recorded among equals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dreamgym.experience.protocol import ExperienceQuery, terminated
from dreamgym.types import ExperiencePrediction, Trajectory

Key = tuple[str, str, str]  # (task instruction, state, action)
Outcome = tuple[str, float, bool, bool]  # (next state, reward, done, success)


class Recall:
    """The recorded outcome of each (task, state, action) of a set of real trajectories."""

    def __init__(self, table: dict[Key, Outcome]) -> None:
        self.table = table

    @classmethod
    def of(cls, trajs: Sequence[Trajectory]) -> Recall:
        """The table of the real trajectories among ``trajs`` (synthetic ones are left out). ``done`` is
        :func:`~dreamgym.experience.protocol.terminated`, as in M_exp's targets (a step-limit cut is no ending);
        ``success`` the episode's, on its final step only."""
        seen: dict[Key, Counter[Outcome]] = {}
        for traj in trajs:
            if traj.source != "real":
                continue
            last = len(traj.transitions) - 1
            for t, x in enumerate(traj.transitions):
                done = terminated(x)
                outcome = (x.next_state, float(x.reward), done, bool(traj.success and done and t == last))
                seen.setdefault((traj.task.instruction, x.state, x.action), Counter())[outcome] += 1
        # Counter.most_common keeps insertion order among equal counts: the first recorded wins a tie
        return cls({key: counts.most_common(1)[0][0] for key, counts in seen.items()})

    def __len__(self) -> int:
        return len(self.table)

    def __call__(self, query: ExperienceQuery) -> ExperiencePrediction | None:
        """The recorded answer to ``query`` (marked ``recalled``), or None where the data never took this step."""
        outcome = self.table.get((query.instruction, query.state, query.action))
        if outcome is None:
            return None
        next_state, reward, done, success = outcome
        return ExperiencePrediction(None, next_state, reward, done, success, recalled=True)
