"""Envs for the ``accelerate launch`` runs of tests/test_distributed.py, loaded with ``--import``:
``rank-counting-shop`` is the real shop counting this rank's ``env.step`` calls, written at exit to
``$DREAMGYM_STEP_DIR/rank<RANK>.json``; with ``$DREAMGYM_FAIL_RANK`` that rank's env raises on its first step."""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import Any

from dreamgym.envs import register
from dreamgym.envs.shop import ShopEnv

RANK = os.environ.get("RANK", "0")


class RankCountingShop(ShopEnv):
    steps_taken = 0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if os.environ.get("DREAMGYM_FAIL_RANK") == RANK:
            raise RuntimeError("the env of this rank broke")
        RankCountingShop.steps_taken += 1
        return super().step(action)


def _write_count() -> None:
    if out := os.environ.get("DREAMGYM_STEP_DIR"):
        Path(out, f"rank{RANK}.json").write_text(json.dumps(RankCountingShop.steps_taken))


atexit.register(_write_count)
register("rank-counting-shop", RankCountingShop)
