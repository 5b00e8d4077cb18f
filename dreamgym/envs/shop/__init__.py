"""The built-in ``shop`` environment: WebShop's protocol (Yao et al. 2022) over a seeded synthetic catalog.

Modules, one concern each: ``vocab`` (categories, attributes, options), ``catalog`` (products), ``tasks``
(instructions and train/val/test splits), ``search`` (BM25), ``pages`` (pages + state mapper), ``reward``
(WebShop's purchase reward), ``env`` (``ShopEnv``), ``policies`` (oracle / noisy / random).
"""

from dreamgym.envs.shop.catalog import Catalog, Product, build_catalog
from dreamgym.envs.shop.env import ShopEnv, parse_action
from dreamgym.envs.shop.pages import Page, ShopState, ShopStateMapper
from dreamgym.envs.shop.policies import NoisyPolicy, OraclePolicy
from dreamgym.envs.shop.reward import RewardBreakdown, ShopGoal, purchase_reward, satisfies
from dreamgym.envs.shop.search import SearchEngine
from dreamgym.envs.shop.tasks import build_tasks, write_instruction

__all__ = [
    "Catalog",
    "NoisyPolicy",
    "OraclePolicy",
    "Page",
    "Product",
    "RewardBreakdown",
    "SearchEngine",
    "ShopEnv",
    "ShopGoal",
    "ShopState",
    "ShopStateMapper",
    "build_catalog",
    "build_tasks",
    "parse_action",
    "purchase_reward",
    "satisfies",
    "write_instruction",
]
