"""``TextWorldEnv``: TextWorld games (Côté et al. 2018; ALFWorld is built on it) behind the dreamgym API.

Tasks are generated games: ``make("textworld")`` plays ``tw-cooking`` games (see
:mod:`dreamgym.envs.textworld.games`), train split = generator seeds ``0..num_train_games-1``, test split =
seeds ``test_seed_offset + i``, val split = seeds ``val_seed_offset + i`` (``num_val_games``; the three are
disjoint, and val's seeds never move train's or test's), each compiled once into ``cache_dir`` (on a split's
first use). ``make("textworld", game="path/to/game.z8")`` plays one given game (every split). ``challenge=``/``settings=`` pick another
generator (``settings`` merges over :data:`~dreamgym.envs.textworld.games.DEFAULT_SETTINGS`).

* Actions are TextWorld commands. A command outside the game's admissible commands is invalid: it is not
  sent to the game, the state stays, reward 0, ``info["invalid_action"]``.
* Outcome reward: 0 on every step but the last; on termination the game's score normalised by its max score
  (0 when the game is lost). ``info["success"]`` is TextWorld's ``won``.
* The game runs in-process (Jericho's Z-machine): no interpreter process to leak; ``close()`` frees it.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

from dreamgym.envs.base import TextEnv
from dreamgym.envs.explain_diff import ParsedState
from dreamgym.envs.textworld.effects import open_effect
from dreamgym.envs.textworld.games import (
    DEFAULT_CHALLENGE,
    GameSpec,
    default_cache_dir,
    ensure_game,
    read_game_info,
)
from dreamgym.envs.textworld.state import abstract_state, commands_in_state, room_name, shown_commands
from dreamgym.types import Task


def _request_infos() -> Any:
    from textworld import EnvInfos

    return EnvInfos(
        admissible_commands=True, policy_commands=True, description=True, inventory=True,
        score=True, max_score=True, won=True, lost=True,
    )


class TextWorldEnv(TextEnv):
    name = "textworld"

    def __init__(
        self,
        game: str | None = None,
        challenge: str = DEFAULT_CHALLENGE,
        settings: dict[str, Any] | None = None,
        num_train_games: int = 100,
        num_test_games: int = 20,
        test_seed_offset: int = 100_000,
        cache_dir: str | None = None,
        max_steps: int = 30,
        max_commands: int = 30,
        max_text: int = 300,
        num_val_games: int = 10,
        val_seed_offset: int | None = None,
        numbered: bool = True,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if min(num_train_games, num_test_games, num_val_games, max_steps, max_commands, max_text) < 1:
            raise ValueError("textworld env: game counts, max_steps, max_commands and max_text must be >= 1")
        if test_seed_offset < num_train_games:
            raise ValueError(f"textworld env: test_seed_offset {test_seed_offset} overlaps the train seeds")
        self.seed_offset = {"train": 0, "test": test_seed_offset}
        self.num_games = {"train": num_train_games, "test": num_test_games}
        self.seed_offset["val"], self.num_games["val"] = self._val_seeds(val_seed_offset, num_val_games), num_val_games
        self.game = game
        self.challenge, self.settings = challenge, dict(settings or {})
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.max_commands, self.max_text, self.numbered = max_commands, max_text, numbered
        self._tasks: dict[str, list[Task]] = {}
        self._game_env: Any = None  # textworld.core.Environment of the current game
        self._game_file: Path | None = None
        self._admissible: set[str] = set()
        self._game_state: Any = None
        self._done = False

    def _val_seeds(self, offset: int | None, count: int) -> int:
        """The first val seed: ``offset``, which must miss the train and test seeds; by default 200,000, or
        the first seed past both of them when those reach it."""
        ranges = [(self.seed_offset[s], self.seed_offset[s] + self.num_games[s]) for s in ("train", "test")]
        if offset is None:
            offset = 200_000
            if any(lo < offset + count and offset < hi for lo, hi in ranges):
                offset = max(hi for _, hi in ranges)
        for split, (lo, hi) in zip(("train", "test"), ranges, strict=True):
            if lo < offset + count and offset < hi:
                raise ValueError(f"textworld env: val seeds {offset}..{offset + count - 1} overlap the {split} seeds "
                                 f"{lo}..{hi - 1}")
        if offset < 0:
            raise ValueError(f"textworld env: val_seed_offset must be >= 0, got {offset}")
        return offset

    # -- tasks ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        """The split's games as tasks (generating missing ones into the cache on first use)."""
        if split not in self.num_games:
            raise ValueError(f"textworld env: unknown split {split!r} (train, val or test)")
        if split not in self._tasks:
            if self.game is not None:
                self._tasks[split] = [self._task(Path(self.game), task_id=f"tw-{Path(self.game).stem}", goal={"game": self.game})]
            else:
                seeds = range(self.seed_offset[split], self.seed_offset[split] + self.num_games[split])
                self._tasks[split] = [self._generated_task(seed) for seed in seeds]
        return list(self._tasks[split])

    def _generated_task(self, seed: int) -> Task:
        spec = GameSpec.create(self.challenge, self.settings, seed)
        goal = {"challenge": spec.challenge, "settings": dict(spec.settings), "seed": seed}
        return self._task(ensure_game(spec, self.cache_dir), task_id=f"{spec.settings_key()}-s{seed}", goal=goal)

    def _task(self, game_file: Path, task_id: str, goal: dict[str, Any]) -> Task:
        info = read_game_info(game_file)
        # The recipe joins the instruction so that the task is Markov for a memoryless policy (ALFWorld-style
        # goals name their objects too); the cookbook stays in the game.
        instruction = f"{info.objective} ({info.recipe})" if info.recipe else info.objective
        return Task(task_id=task_id, instruction=instruction, env=self.name, goal=goal)

    def _game_file_of(self, task: Task) -> Path:
        goal = task.goal
        if "game" in goal:
            return Path(str(goal["game"]))
        try:
            spec = GameSpec.create(str(goal["challenge"]), dict(goal["settings"]), int(goal["seed"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"textworld task {task.task_id!r}: goal needs game or challenge/settings/seed ({e!r})") from None
        return ensure_game(spec, self.cache_dir)

    # -- episode ----------------------------------------------------------------------------------
    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            raise ValueError("textworld env: reset needs a task (none given and the split has none)")
        game_file = self._game_file_of(task)
        if game_file != self._game_file:  # a new game: start its interpreter (reuse it across resets)
            import textworld

            self._close_game()
            if not game_file.is_file():
                raise FileNotFoundError(f"textworld task {task.task_id!r}: no game file {game_file}")
            with warnings.catch_warnings():  # Jericho: "not fully supported" — TextWorld tracks the score itself
                warnings.simplefilter("ignore")
                self._game_env = textworld.start(str(game_file), request_infos=_request_infos())
            self._game_file = game_file
        self.task = task
        state = self._game_env.reset()
        return self._observe(state, state["description"], reward=0.0)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = " ".join(action.lower().split())
        if self._game_state is None or self._done or command not in self._admissible:
            return self._last_obs, 0.0, False, self._info(invalid=True)
        state, _score, done = self._game_env.step(command)
        won, lost = bool(state["won"]), bool(state["lost"])
        terminated = bool(done or won or lost)
        reward = 0.0
        if terminated and not lost:
            reward = min(1.0, max(0.0, float(state["score"]) / max(1, int(state["max_score"]))))
        obs, info = self._observe(state, state["feedback"], reward=reward, done=terminated)
        info["success"] = won
        return obs, reward, terminated, info

    def _observe(self, state: Any, feedback: str, reward: float, done: bool = False) -> tuple[str, dict[str, Any]]:
        self._game_state, self._done = state, done
        admissible = [] if done else list(state["admissible_commands"] or [])
        self._admissible = set(admissible)
        location = room_name(state["description"] or "")
        commands = shown_commands(admissible, self.max_commands)
        obs = abstract_state(location, feedback, state["inventory"] or "", commands, self.max_text, self.numbered)
        info = self._info(invalid=False)
        info["admissible_actions"] = [] if done else commands_in_state(obs)
        info["reward"], info["score"] = reward, float(state["score"]) / max(1, int(state["max_score"]))
        return obs, info

    def _info(self, invalid: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"invalid_action": invalid, "success": False, "reward": 0.0}
        if invalid:  # the state stays: so do its admissible actions and score
            info["admissible_actions"] = list(self._last_info.get("admissible_actions", []))
            info["score"] = self._last_info.get("score", 0.0)
        return info

    @property
    def policy_commands(self) -> list[str]:
        """TextWorld's walkthrough from the current state (recomputed by the game after every step)."""
        return [] if self._game_state is None else list(self._game_state["policy_commands"] or [])

    # -- action grammar of abstract states (for the dream env) ------------------------------------
    def admissible_for_state(self, state: str) -> list[str]:
        return commands_in_state(state)

    def had_effect(self, state: str, next_state: str) -> bool:
        """Anything but the feedback line changed: the room, what is carried or the commands offered. A refused
        ``prepare meal`` ("You still miss something.") changes none of them, nor does an ``examine``."""

        def world(page: str) -> tuple[tuple[str, str], dict[str, list[str]]]:
            parsed = ParsedState.parse(page)
            return parsed.header, {k: v for k, v in parsed.elements.items() if k != "feedback"}

        return world(state) != world(next_state)

    def recorded_effect(self, state: str, action: str, recorded_state: str, recorded_next_state: str) -> str | None:
        """What opening a container shows, from a recorded open of it (:func:`~dreamgym.envs.textworld.effects.open_effect`,
        capped at this env's ``max_commands``)."""
        return open_effect(state, action, recorded_state, recorded_next_state, self.max_commands)

    # -- shutdown ----------------------------------------------------------------------------
    def _close_game(self) -> None:
        if self._game_env is not None:
            self._game_env.close()
        self._game_env, self._game_file, self._game_state = None, None, None

    def close(self) -> None:
        self._close_game()
        super().close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may already be gone
            self._close_game()
