"""A seeded, deterministic product catalog in the shape of WebShop's (Yao et al. 2022) scraped one.

Each product has an ASIN-like id, a category, 2-4 attributes, for each of its category's options a subset of
values to choose from, a price, and a title, description and feature bullets written from those fields.
``build_catalog(n, seed)`` is cached in-process per ``(n, seed)``.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass

from dreamgym.envs.shop.vocab import BRAND_SYLLABLES, CATEGORIES, CATEGORY_BY_NAME, CategorySpec

ASIN_CHARS = string.ascii_uppercase + string.digits


@dataclass(frozen=True, slots=True)
class Product:
    asin: str  # "B0" + 6 characters, upper case
    category: str
    brand: str
    title: str
    price: float
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, available values)
    description: str
    features: tuple[str, ...]

    def option_values(self, name: str) -> tuple[str, ...]:
        for option, values in self.options:
            if option == name:
                return values
        return ()

    def search_text(self) -> str:
        """What the search engine indexes (WebShop indexes title, description, bullets and options)."""
        values = " ".join(v for _, vs in self.options for v in vs)
        return f"{self.title} {self.category} {' '.join(self.attributes)} {values} {self.description}"


class Catalog:
    """The products of one ``(num_products, seed)`` draw, with lookup by ASIN. Treat as read-only."""

    def __init__(self, seed: int, products: tuple[Product, ...]) -> None:
        self.seed = seed
        self.products = products
        self._index = {p.asin: i for i, p in enumerate(products)}

    def __len__(self) -> int:
        return len(self.products)

    def index_of(self, asin: str) -> int:
        """The catalog index of an ASIN (case-insensitive); ``KeyError`` if unknown."""
        return self._index[asin.upper()]

    def get(self, asin: str) -> Product:
        return self.products[self.index_of(asin)]


def category_spec(name: str) -> CategorySpec:
    if name not in CATEGORY_BY_NAME:
        raise KeyError(f"unknown shop category {name!r}; known: {', '.join(CATEGORY_BY_NAME)}")
    return CATEGORY_BY_NAME[name]


def _brands(rng: random.Random, count: int = 200) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choices(BRAND_SYLLABLES, k=rng.randint(2, 3))).capitalize())
    return sorted(names)


def _sample_ordered(rng: random.Random, pool: tuple[str, ...], k: int) -> tuple[str, ...]:
    """``k`` distinct items of ``pool`` in the pool's own order (stable, readable titles and pages)."""
    picked = set(rng.sample(pool, k))
    return tuple(x for x in pool if x in picked)


def _make_product(rng: random.Random, asin: str, brand: str, spec: CategorySpec) -> Product:
    attributes = _sample_ordered(rng, spec.attributes, rng.randint(2, 4))
    options = tuple(
        (name, _sample_ordered(rng, values, rng.randint(min(2, len(values)), min(5, len(values)))))
        for name, values in spec.options
    )
    low, high = spec.price
    price = round(rng.uniform(low, high), 2)
    shown = rng.sample(attributes, 2)  # two attributes appear in the title, all of them in the features
    title = f"{brand} {shown[0].title()} {spec.noun}, {shown[1].title()}"
    description = f"{brand} {spec.noun.lower()}: {', '.join(attributes[:-1])} and {attributes[-1]}. {spec.blurb}"
    features = tuple(f"{a.capitalize()}" for a in attributes) + tuple(
        f"{name.capitalize()}: {', '.join(values)}" for name, values in options
    )
    return Product(asin, spec.name, brand, title, price, attributes, options, description, features)


@functools.lru_cache(maxsize=4)
def build_catalog(num_products: int = 1000, seed: int = 0) -> Catalog:
    """Generate ``num_products`` products, categories round-robin, everything else drawn from ``seed``."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    rng = random.Random(f"dreamgym-shop-catalog-{seed}")
    brands = _brands(rng)
    asins: set[str] = set()
    products = []
    for i in range(num_products):
        spec = CATEGORIES[i % len(CATEGORIES)]
        asin = "B0" + "".join(rng.choices(ASIN_CHARS, k=6))
        while asin in asins:  # 36^6 ids: collisions are rare even at 100k products
            asin = "B0" + "".join(rng.choices(ASIN_CHARS, k=6))
        asins.add(asin)
        products.append(_make_product(rng, asin, rng.choice(brands), spec))
    return Catalog(seed=seed, products=tuple(products))
