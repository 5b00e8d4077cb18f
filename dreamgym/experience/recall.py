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

With an env's recorded effect (``TextEnv.recorded_effect``, ``DreamConfig.recall_effects``) a step the data never
took from this state, but took in the same task from another one, is answered by that rule from the first such
record, where the rule can say (TextWorld: what opening a container shows; the dream's own opens wrote the recorded
contents in 140 of 386 with the same game's open in the prompt, as many as "no ingredient" would:
benchmarks/results/open_probe_textworld_neighbour.json). Also marked ``recalled``, counted apart (``effects``).

Where the data recorded one query with several outcomes (TextWorld's pages list at most ``max_commands`` commands, so
which ones a page shows can depend on what lies elsewhere; an ending's text counts the turns), the most frequent
outcome is kept, the first recorded among equals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from dreamgym.experience.protocol import ExperienceQuery, terminated
from dreamgym.types import ExperiencePrediction, Trajectory

Key = tuple[str, str, str]  # (task instruction, state, action)
Outcome = tuple[str, float, bool, bool]  # (next state, reward, done, success)
Effect = Callable[[str, str, str, str], "str | None"]  # TextEnv.recorded_effect


class Recall:
    """The recorded outcome of each (task, state, action) of a set of real trajectories; with ``effect``, the
    env's rule applied to a record of the same (task, action) from another state (the first one recorded that was
    not an ending)."""

    def __init__(self, table: dict[Key, Outcome], effect: Effect | None = None,
                 by_action: dict[tuple[str, str], tuple[str, str, float]] | None = None) -> None:
        self.table, self.effect, self.by_action = table, effect, by_action or {}
        self.effects = 0  # answers by the effect rule

    @classmethod
    def of(cls, trajs: Sequence[Trajectory], effect: Effect | None = None) -> Recall:
        """The table of the real trajectories among ``trajs`` (synthetic ones are left out). ``done`` is
        :func:`~dreamgym.experience.protocol.terminated`, as in M_exp's targets (a step-limit cut is no ending);
        ``success`` the episode's, on its final step only."""
        seen: dict[Key, Counter[Outcome]] = {}
        by_action: dict[tuple[str, str], tuple[str, str, float]] = {}
        for traj in trajs:
            if traj.source != "real":
                continue
            last = len(traj.transitions) - 1
            for t, x in enumerate(traj.transitions):
                done = terminated(x)
                outcome = (x.next_state, float(x.reward), done, bool(traj.success and done and t == last))
                seen.setdefault((traj.task.instruction, x.state, x.action), Counter())[outcome] += 1
                if effect is not None and not done:
                    by_action.setdefault((traj.task.instruction, x.action), (x.state, x.next_state, float(x.reward)))
        # Counter.most_common keeps insertion order among equal counts: the first recorded wins a tie
        return cls({key: counts.most_common(1)[0][0] for key, counts in seen.items()}, effect, by_action)

    def __len__(self) -> int:
        return len(self.table)

    def __call__(self, query: ExperienceQuery) -> ExperiencePrediction | None:
        """The recorded answer to ``query`` (marked ``recalled``), or None where the data never took this step (nor,
        with an effect rule, one the rule carries over)."""
        outcome = self.table.get((query.instruction, query.state, query.action))
        if outcome is not None:
            next_state, reward, done, success = outcome
            return ExperiencePrediction(None, next_state, reward, done, success, recalled=True)
        record = self.by_action.get((query.instruction, query.action))  # empty without an effect rule
        if record is None or self.effect is None or (page := self.effect(query.state, query.action, *record[:2])) is None:
            return None
        self.effects += 1
        return ExperiencePrediction(None, page, record[2], False, False, recalled=True)
