"""The shop's scripted policies as browser actions: ``oracle``, ``noisy`` and ``random`` for ``make("browser")``.

:class:`BrowserShopOracle` is the text shop's :class:`~dreamgym.envs.shop.policies.OraclePolicy`, unchanged: it
reads the page it is on from the browser's URL (the site keeps every page's state there,
:func:`~dreamgym.envs.web.site.state_from_url`), decides the shop's next text action, and plays it as the
browser action on the element with that text: ``search[q]`` -> ``type[<searchbox bid>][q]``,
``click[<target>]`` -> ``click[<bid of the link, button or radio named target>]`` (a product link by its id).
"""

from __future__ import annotations

import logging
from typing import Any

from dreamgym.envs.base import RandomPolicy, ScriptedPolicy, TextEnv
from dreamgym.envs.policies import NoisyPolicy as BaseNoisyPolicy
from dreamgym.envs.policies import make_policy as make_env_policy
from dreamgym.envs.shop.env import ShopEnv, parse_action
from dreamgym.envs.shop.pages import build_page
from dreamgym.envs.shop.policies import OraclePolicy
from dreamgym.envs.web.axtree import AXElement
from dreamgym.envs.web.site import state_from_url
from dreamgym.types import Task

log = logging.getLogger(__name__)


def to_browser_action(text_action: str, elements: list[AXElement]) -> str | None:
    """The browser action that plays a text-shop action on a page's elements; None when no element fits."""
    parsed = parse_action(text_action)
    if parsed is None:
        return None
    verb, arg = parsed
    if verb == "search":
        box = next((e for e in elements if e.editable), None)
        return None if box is None else f"type[{box.bid}][{arg}]"
    for e in elements:
        if not e.clickable:
            continue
        name = e.name.lower()
        if name == arg or name.split(" — ", 1)[0].strip() == arg:
            return f"click[{e.bid}]"
    return None


class BrowserShopOracle:
    """The shop oracle, acting through the browser (see the module docstring)."""

    name = "oracle"

    def __init__(self, seed: int = 0, scan_pages: int = 2) -> None:
        self.oracle = OraclePolicy(seed=seed, scan_pages=scan_pages)
        self.env: Any = None
        self.shadow: ShopEnv | None = None

    def reset(self, env: TextEnv, task: Task | None) -> None:
        shop = getattr(env, "shop", None)
        if shop is None or task is None:
            raise ValueError("the browser oracle plays the shop site's tasks (a browser env on a shop site)")
        config = shop.to_dict()
        self.env = env
        self.shadow = ShopEnv(**{k: config[k] for k in ("num_products", "catalog_seed", "num_tasks_per_split",
                                                         "results_per_page", "max_results", "test_fraction",
                                                         "val_fraction", "num_val_tasks")})
        self.oracle.reset(self.shadow, task)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        assert self.shadow is not None
        shadow = self.shadow
        parsed = state_from_url(self.env.url, shadow.catalog, shadow.engine, shadow.max_results)
        if parsed is None:  # not a shop page (a detour outside the site): back
            return "go_back"
        shadow.state = parsed[1]
        shadow.page = build_page(shadow.state, shadow.catalog, shadow.results_per_page)
        text_action = self.oracle.act(obs, info)
        action = to_browser_action(text_action, self.env.elements)
        if action is None:
            log.warning("browser oracle: no element for %s on %s", text_action, self.env.url)
            return "go_back"
        return action


class BrowserNoisyPolicy(BaseNoisyPolicy):
    """The browser oracle, except that with probability ``noise`` a step is a random admissible action."""

    def __init__(self, seed: int = 0, noise: float = 0.3, scan_pages: int = 2) -> None:
        super().__init__(BrowserShopOracle(seed=seed, scan_pages=scan_pages), noise=noise, seed=seed)


def make_policy(name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
    """A browser policy by name: ``oracle`` / ``noisy`` (the shop site's) or ``random`` (any site)."""
    return make_env_policy("browser", {"oracle": BrowserShopOracle, "noisy": BrowserNoisyPolicy,
                                       "random": RandomPolicy}, name, seed, **kwargs)
