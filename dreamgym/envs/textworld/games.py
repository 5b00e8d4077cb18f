"""TextWorld game generation and its on-disk cache.

Generating a game with TextWorld's challenge generators (``tw-cooking``, ``tw-treasure_hunter``, …; Inform7
ships in the wheel) takes 1-10 s, so each game is compiled once per ``(challenge, settings, seed)`` into a
cache directory (default ``$DREAMGYM_CACHE/textworld`` or ``~/.cache/dreamgym/textworld``; pass the run
directory to keep a run's games with it — never commit them). Writes are atomic (compile into a private
temp folder, then ``os.replace``), so several env processes of one pool can share the cache safely.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Cooking games close to ALFWorld's household tasks and short enough for tiny policies: one ingredient to
# fetch from a closed container somewhere in a 6-room house, then "prepare meal" and "eat meal"
# (walkthroughs of ~6-8 commands).
DEFAULT_CHALLENGE = "tw-cooking"
DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "tw-cooking": {"recipe": 1, "take": 1, "go": 6, "open": True, "cook": False, "cut": False, "drop": False},
    "tw-treasure_hunter": {"level": 5},
}


def default_cache_dir() -> Path:
    root = os.environ.get("DREAMGYM_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "dreamgym") / "textworld"


@dataclass(frozen=True)
class GameSpec:
    """What identifies a generated game: the challenge, its settings and the generator seed."""

    challenge: str
    settings: tuple[tuple[str, Any], ...]
    seed: int

    @classmethod
    def create(cls, challenge: str, settings: dict[str, Any] | None, seed: int) -> GameSpec:
        merged = {**DEFAULT_SETTINGS.get(challenge, {}), **(settings or {})}
        return cls(challenge, tuple(sorted(merged.items())), int(seed))

    def settings_key(self) -> str:
        """A short stable folder name for the settings (their hash), prefixed by the challenge."""
        digest = hashlib.sha1(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.challenge}-{digest}"

    def path(self, cache_dir: Path) -> Path:
        return cache_dir / self.settings_key() / f"seed-{self.seed}.z8"


def _generator_settings(spec: GameSpec) -> dict[str, Any]:
    settings = dict(spec.settings)
    if spec.challenge == "tw-cooking":  # the recipe varies with the game seed; food from all of its splits
        settings.setdefault("recipe_seed", spec.seed)
        settings.setdefault("split", None)
    return settings


def ensure_game(spec: GameSpec, cache_dir: Path) -> Path:
    """The compiled game file of ``spec``, generating and caching it first if needed."""
    target = spec.path(cache_dir)
    if target.is_file() and target.with_suffix(".json").is_file():
        return target
    import textworld
    from textworld.challenges import CHALLENGES

    if spec.challenge not in CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {spec.challenge!r}; choose from {', '.join(sorted(CHALLENGES))}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=target.parent))
    try:
        options = textworld.GameOptions()
        options.seeds = spec.seed
        options.path = str(tmp / target.name)
        options.force_recompile = True
        _desc, make_game, _argparser = CHALLENGES[spec.challenge]
        try:
            game = make_game(_generator_settings(spec), options)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"TextWorld {spec.challenge}: bad settings {dict(spec.settings)}: {e!r}") from None
        compiled = Path(textworld.generator.compile_game(game, options))
        # JSON first: a present .z8 then implies a complete pair for concurrent readers.
        os.replace(compiled.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(compiled, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class GameInfo:
    """What the env needs from a game's JSON without starting it."""

    objective: str
    walkthrough: list[str]
    recipe: str | None
    max_score: int


def read_game_info(game_file: Path) -> GameInfo:
    """Objective, walkthrough and (cooking games) recipe of a compiled game, from its JSON sidecar."""
    json_file = Path(game_file).with_suffix(".json")
    try:
        data = json.loads(json_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"TextWorld game {game_file}: unreadable game JSON {json_file}: {e}") from None
    meta = data.get("metadata") or {}
    recipe = None
    if meta.get("ingredients"):
        items = []
        for name, *prep in meta["ingredients"]:  # e.g. ["red potato", "fried", "sliced"]
            steps = [str(p) for p in prep if p not in ("raw", "uncut")]
            items.append(f"{name} ({', '.join(steps)})" if steps else str(name))
        recipe = "ingredients: " + ", ".join(items)
    return GameInfo(
        objective=" ".join(str(data.get("objective", "")).split()),
        walkthrough=[str(c) for c in meta.get("walkthrough") or []],
        recipe=recipe,
        max_score=int(meta.get("max_score") or 0),
    )
