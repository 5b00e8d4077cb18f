"""A procedural pre-training corpus: the copy-and-compare skills an experience model and a policy need, on
made-up websites and worlds, in the project's own text formats.

Every example is an :class:`~dreamgym.sft.SFTExample` rendered by the same functions that render the real
ones, so the base model sees exactly the prompt layouts it is later fine-tuned on:

* experience-model transitions (:func:`~dreamgym.experience.protocol.build_messages` and
  :func:`~dreamgym.experience.protocol.format_target`): ``TASK / HISTORY / SIMILAR / STATE / ACTION / TARGET``
  in, ``<think>…</think><state>…</state><reward>…</reward> <done>…</done> <success>…</success>`` out;
* agent steps (:func:`~dreamgym.agent.policy.build_agent_prompt`): numbered admissible actions in, the number
  of the right one out (``<action>3</action>``).

The skills, one generator each (:data:`SKILLS`):

* ``open``: clicking a link copies its fields (id, title, price) into the next page, line by line; the rest
  of the page (options, buttons) is the layout a retrieved sibling page shows;
* ``select``: an option click copies the page and moves the ``(selected)`` mark;
* ``buy``: a leaf page whose score follows the rule stated in the task: count the wishes the item meets
  (title words, selected options, the price against a bound) and write the fraction with 2 decimals;
* ``search`` / ``detail`` / ``invalid``: copy a whole neighbour's next state when its action matches, copy a
  detail page from the item's title, copy the state unchanged after an action that names nothing;
* ``world``: a room world (``location:`` header, ``[c1] command:`` lines) where taking, dropping and moving
  copy objects between lines;
* ``choose``: an agent step: the number of the option whose text matches the instruction best;
* ``echo`` (recipe 4): an action naming nothing on a page of random fields; the page, unchanged, is the target;
* ``match`` (warm-up only, in no recipe's mixture): the option value an item page lists and the task names, answered
  as its click, as the shop policy answers it.

Nothing here is drawn from an env: words, names, ids, prices, option names and layouts are made up from a
seeded RNG (syllables), so a base trained on it has seen none of any evaluation's catalog, tasks or games.
The generator is a pure function of its seed and recipe (:data:`RECIPES`): :func:`examples` yields the same
stream every time, in any process (no set order leaks into it). Recipe 1 made the shipped base; 2 (a recurring
site pool), 3 (2 + a made-up lexicon) and 4 (compact sites + ``echo``: copy a page of random fields unchanged) are
the alternatives measured against it (README, "The pre-trained base"); none has yet made a 1.3M model copy.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from dreamgym.agent.policy import AgentObservation, PolicyConfig, action_target, build_agent_prompt
from dreamgym.experience.copyrefs import encode_inline, encode_refs
from dreamgym.experience.protocol import (
    ExperienceQuery,
    Neighbour,
    ProtocolConfig,
    build_messages,
    format_target,
    ref_context,
)
from dreamgym.sft import SFTExample


@dataclass(frozen=True)
class Recipe:
    """How a corpus version draws its stream: skill shares, a recurring site pool, a made-up lexicon."""

    skills: dict[str, float]  # skill -> share of the stream
    site_pool: int = 0  # sites drawn once from the seed; 0: a fresh site for every example
    fresh_site_share: float = 0.0  # share of examples on a fresh site even when there is a pool
    lexicon: int = 0  # words drawn once from the seed, every word then taken whole from them; 0: spelt afresh
    rng_tag: str = "1"  # the stream's RNG is seeded from "dreamgym-corpus-v<rng_tag>-<seed>"
    compact: bool = False  # short examples: smaller sites, shorter words, mostly no system text (more steps a token)
    agent_words: bool = False  # agent examples in the shop policy's compact prompt, options answered by their words
    match_finished: float = 0.0  # share of match examples whose named options are all selected: the answer is buy
    shop_protocol: bool = False  # M_exp examples in the shop default's protocol (SHOP_PROTOCOLS): copy references,
    # exact neighbours, and purchases checked with a type clause first ("buy_typed")


# The agent share is smaller: choosing is one token, copying is many.
_SKILLS_V1 = {"open": 0.20, "select": 0.12, "buy": 0.18, "search": 0.07, "detail": 0.06, "invalid": 0.07,
              "world": 0.10, "choose": 0.20}
# More of the copy skills (open, select, invalid): the version-1 base had not learned to copy after 10M tokens.
_SKILLS_V2 = {"open": 0.22, "select": 0.14, "buy": 0.16, "search": 0.08, "detail": 0.06, "invalid": 0.10,
              "world": 0.10, "choose": 0.14}
# Copy first: a share of ``echo`` (copy a page of random fields unchanged: every token is predictable only by
# looking it up, the cleanest signal for the attention circuit copying needs) and short, compact examples (~24%
# fewer tokens an example, so more optimizer steps for the same tokens). Measured: it moved the probe's echo skill
# (0.50 -> 0.60 after 1,928 steps) and no other; the 128x4 still does not copy (README, "The pre-trained base").
_SKILLS_V4 = {"echo": 0.16, "open": 0.22, "select": 0.12, "buy": 0.14, "search": 0.05, "detail": 0.04,
              "invalid": 0.07, "world": 0.08, "choose": 0.12}
# Recipe 4 with the option match in the mixture (a match warm-up alone is forgotten in recipe 4's mixture: README,
# "A match-first curriculum"), its agent examples in the format the shop policy now clones (a compact prompt, an
# option answered by its words after a space: the task's own tokens, PolicyConfig.answer_words).
_SKILLS_V5 = {"echo": 0.14, "open": 0.20, "select": 0.11, "buy": 0.14, "search": 0.05, "detail": 0.04,
              "invalid": 0.06, "world": 0.08, "choose": 0.08, "match": 0.10}
RECIPES: dict[str, Recipe] = {
    # The shipped base's: every example on a fresh site, every word spelt afresh from ~34x10x13 syllables.
    "1": Recipe(_SKILLS_V1),
    # Sites from a pool of 256 drawn from the seed (a made-up catalog whose words recur), a quarter fresh: on
    # the shop, a recurring catalog is where a from-scratch model's copying emerged (~2 epochs).
    "2": Recipe(_SKILLS_V2, site_pool=256, fresh_site_share=0.25, rng_tag="2"),
    # As 2, with words from a lexicon of 1,500 drawn from the seed, so that the BPE learns most words as one to
    # three tokens and a copy can match on distinctive tokens rather than on the same few syllables.
    "3": Recipe(_SKILLS_V2, site_pool=256, fresh_site_share=0.25, lexicon=1500, rng_tag="2"),
    # Copy first (above), on compact sites from a pool of 256, a quarter fresh.
    "4": Recipe(_SKILLS_V4, site_pool=256, fresh_site_share=0.25, rng_tag="4", compact=True),
    # 4 with the option match in the mixture, agent examples in the compact word-answer format (above).
    "5": Recipe(_SKILLS_V5, site_pool=256, fresh_site_share=0.25, rng_tag="5", compact=True, agent_words=True),
    # 5 where a quarter of the match examples show a page whose named options are all selected, answered by buying:
    # a policy cloned from a base warmed up on recipe 5's match alone re-clicked its last option instead of buying
    # (README, "A base warmed up on a GPU").
    "6": Recipe(_SKILLS_V5, site_pool=256, fresh_site_share=0.25, rng_tag="6", compact=True, agent_words=True,
                match_finished=0.25),
}
# Recipe 5's shares with every purchase a typed one (step_buy_typed).
_SKILLS_V7 = {("buy_typed" if k == "buy" else k): v for k, v in _SKILLS_V5.items()}
RECIPES["7"] = Recipe(_SKILLS_V7, site_pool=256, fresh_site_share=0.25, rng_tag="7", compact=True, agent_words=True,
                      match_finished=0.25, shop_protocol=True)
# 7: recipe 6 with its M_exp examples written in the shop default's exact protocol. A base made by recipe 6 scores
# the corpus's purchases whole (1.000) but, fine-tuned as M_exp on the shop, writes garbled purchase traces: the
# corpus's traces read ``buy QXZW90FY; attr ...`` where the shop's default writes ``buy @1.1; type a=b y; attr ...``
# (copy references, a type clause), so the skill met a format it had never seen (journal, "The GPU script's base,
# made on the CPU").
CORPUS_VERSION = "1"  # the default recipe (the shipped base's)
SKILLS = _SKILLS_V1

_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "dr", "fl", "gr", "kl", "pl", "pr", "sk", "sl", "st", "tr", "th", "sh", "ch", "qu", "v"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ee", "oo", "y"]
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "x", "k", "t", "nd", "st"]
# Generic interface words (no env's vocabulary): button labels and page headers are drawn from these and
# from made-up words, so the base learns to copy whatever a page says rather than a fixed layout.
_UI_BUY = ["Buy", "Buy Now", "Order", "Purchase", "Checkout", "Finish", "Confirm", "Get It"]
_UI_BACK = ["Back", "Back to Search", "Home", "Return", "Start Over", "New Search"]
_UI_PREV = ["< Prev", "Previous", "< Back", "Go Back"]
_UI_NEXT = ["Next >", "Next", "More", "Page Down", ">>"]
_UI_DETAIL = ["Details", "Description", "Features", "Reviews", "Specs", "Info", "About", "Notes"]
_UI_PRICE = ["Price", "Cost", "Fee", "Amount", "Total"]
_UI_LEAF = ["Order placed: {code} ({opts})", "Done! You got {code} ({opts})", "Purchased {code} with {opts}",
            "Checkout complete for {code} ({opts})"]
_UI_SCORE = ["Score: {s}", "Your score: {s}", "Result (0 to 1): {s}", "Match score {s}"]
_TASK_VERBS = ["find", "get me", "i want", "look for", "i need", "pick", "show me", "buy", "fetch"]
_DIRECTIONS = ["north", "south", "east", "west", "up", "down"]


class LexiconRandom(random.Random):
    """The stream's RNG, carrying its made-up lexicon: :func:`_word` draws whole words from it."""

    lexicon: list[str]


def _word(rng: random.Random, syllables: tuple[int, int] = (1, 3)) -> str:
    lexicon = getattr(rng, "lexicon", None)  # a stream with a lexicon (recipe 3)
    if lexicon:
        return str(rng.choice(lexicon))
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.randint(*syllables)))


def _unique(words: Iterable[str]) -> list[str]:
    """The distinct words in first-seen order (a set's order would follow PYTHONHASHSEED, so the stream would
    differ from one process to the next)."""
    return list(dict.fromkeys(words))


def _name(rng: random.Random) -> str:
    return _word(rng, (2, 3)).capitalize()


def _code(rng: random.Random) -> str:
    """An item id: upper-case letters and digits, at least one digit, 5-10 characters."""
    chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        code = "".join(rng.choice(chars) for _ in range(rng.randint(5, 10)))
        if any(c.isdigit() for c in code) and code[0].isalpha():
            return code


def _price(rng: random.Random) -> float:
    return round(rng.choice([rng.uniform(1, 20), rng.uniform(5, 100), rng.uniform(20, 900)]), 2)


# ------------------------------------------------------------------------------------------ a site


@dataclass
class Item:
    code: str
    brand: str
    attrs: list[str]  # shown in the title: "<Brand> <attr0> <Noun>, <attr1>[, <attr2>]"
    noun: str
    price: float

    @property
    def title(self) -> str:
        head = f"{self.brand} {self.attrs[0].title()} {self.noun}"
        return ", ".join([head, *(a.title() for a in self.attrs[1:])])

    def link(self) -> str:
        return f"{self.code} — {self.title} | ${self.price:.2f}"


@dataclass
class Site:
    """A made-up shop-like website: one product family, its options, its labels and its scoring rule."""

    noun: str
    attr_pool: list[str]
    options: dict[str, list[str]]  # option name -> values, shared by every item of the family
    items: list[Item]
    buy: str
    back: str
    prev: str
    next: str
    details: list[str]
    price_label: str
    leaf: str
    score_line: str
    search_box: str
    page_size: int

    @classmethod
    def random(cls, rng: random.Random, compact: bool = False) -> Site:
        """A fresh site; ``compact``: shorter words, at most 2 options of at most 4 values, at most 2 detail
        buttons and 3-5 results a page (recipe 4; the other recipes' streams are unchanged)."""
        if compact:
            word = lambda: _word(rng, (1, 2))  # noqa: E731
            noun = word().title()
            attr_pool = _unique(word() for _ in range(rng.randint(5, 9)))
            options = {word(): _unique(word() for _ in range(rng.randint(2, 4))) for _ in range(rng.choice([0, 1, 1, 2]))}
            brands = [word().capitalize() for _ in range(6)]
            n_details, page_size = rng.randint(0, 2), rng.randint(3, 5)
        else:
            noun = " ".join(_word(rng).title() for _ in range(rng.choice([1, 1, 2])))
            attr_pool = _unique(" ".join(_word(rng) for _ in range(rng.choice([1, 1, 2]))) for _ in range(rng.randint(5, 10)))
            options = {_word(rng, (1, 2)): _unique(_word(rng, (1, 2)) for _ in range(rng.randint(2, 5)))
                       for _ in range(rng.choice([0, 1, 2, 2, 3]))}
            brands = [_name(rng) for _ in range(6)]
        items = [Item(_code(rng), rng.choice(brands), rng.sample(attr_pool, rng.choice([2, 2, 3])), noun, _price(rng))
                 for _ in range(rng.randint(8, 20))]
        # The draws below keep recipes 1-3's order exactly (their streams are the shipped base's and its variants').
        return cls(
            noun=noun, attr_pool=attr_pool, options=options, items=items,
            buy=rng.choice(_UI_BUY), back=rng.choice(_UI_BACK), prev=rng.choice(_UI_PREV),
            next=rng.choice(_UI_NEXT),
            details=rng.sample(_UI_DETAIL, n_details if compact else rng.randint(0, 3)),
            price_label=rng.choice(_UI_PRICE), leaf=rng.choice(_UI_LEAF), score_line=rng.choice(_UI_SCORE),
            search_box=f"search[{rng.choice(['your query', 'type here', _word(rng)])}]",
            page_size=page_size if compact else rng.randint(3, 6),
        )

    # ---- pages (element lists; numbered by _render)
    def search_page(self) -> list[tuple[str, str]]:
        return [("searchbox", self.search_box)]

    def results_page(self, shown: list[Item], page: int, total: int) -> list[tuple[str, str]]:
        first = (page - 1) * self.page_size + 1
        els = [("text", f"Page {page} (results {first}-{first + len(shown) - 1} of {total})"), ("button", self.back)]
        if page > 1:
            els.append(("button", self.prev))
        els.append(("button", self.next))
        return els + [("link", it.link()) for it in shown]

    def item_page(self, it: Item, selected: dict[str, str]) -> list[tuple[str, str]]:
        els = [("text", f"{it.code} — {it.title}"), ("text", f"{self.price_label}: ${it.price:.2f}")]
        for name, values in self.options.items():
            els += [("option", f"{name}={v}" + (" (selected)" if selected.get(name) == v else "")) for v in values]
        els += [("button", d) for d in self.details]
        return [*els, ("button", self.buy), ("button", self.prev), ("button", self.back)]

    def detail_page(self, it: Item, label: str) -> list[tuple[str, str]]:
        return [("text", f"{label} of {it.code}"), *(("text", a) for a in it.attrs), ("button", self.prev)]

    def leaf_page(self, it: Item, selected: dict[str, str], score: float) -> list[tuple[str, str]]:
        opts = ", ".join(f"{k}={v}" for k, v in selected.items()) or "no options"
        return [("text", self.leaf.format(code=it.code, opts=opts)), ("text", self.score_line.format(s=f"{score:.2f}"))]


@dataclass
class Wish:
    """A task on a site: the item's attributes (some it may lack), option values, and a price bound."""

    attrs: list[str]
    opts: dict[str, str]
    bound: float | None
    rule_stated: bool = field(default=True)

    def instruction(self, site: Site, rng: random.Random) -> str:
        parts = [rng.choice(_TASK_VERBS), "a" if rng.random() < 0.5 else "the", " and ".join(self.attrs), site.noun.lower()]
        text = " ".join(parts)
        if self.opts:
            text += " with " + " and ".join(f"{k} {v}" if rng.random() < 0.5 else f"{k}={v}" for k, v in self.opts.items())
        if self.bound is not None:
            text += f", price below {self.bound:.2f}"
        if self.rule_stated:
            text += rng.choice(["; score = share of wishes met", " (score: wishes met / wishes)", ""])
        return text

    def checks(self, it: Item, selected: dict[str, str]) -> list[tuple[str, bool]]:
        """The rule: one check per wish, in a fixed order (attributes, options, price)."""
        out = [(f"attr {a} title {'y' if a in it.attrs else 'n'}", a in it.attrs) for a in self.attrs]
        out += [(f"opt {k}={v} sel {'y' if selected.get(k) == v else 'n'}", selected.get(k) == v) for k, v in self.opts.items()]
        if self.bound is not None:
            ok = it.price <= self.bound
            out.append((f"price {it.price:.2f}<={self.bound:.2f} {'y' if ok else 'n'}", ok))
        return out

    def score(self, it: Item, selected: dict[str, str]) -> tuple[float, str]:
        checks = self.checks(it, selected)
        met = sum(ok for _, ok in checks)
        score = met / len(checks)
        return score, "; ".join(text for text, _ in checks) + f"; score {met}/{len(checks)}={score:.2f}"


def _wish(site: Site, target: Item, rng: random.Random) -> Wish:
    attrs = rng.sample(target.attrs, rng.randint(1, len(target.attrs)))
    if rng.random() < 0.3:  # a wish the target may not meet
        attrs.append(rng.choice(site.attr_pool))
    attrs = list(dict.fromkeys(attrs))
    opts = {k: rng.choice(v) for k, v in site.options.items() if rng.random() < 0.7}
    bound = None if rng.random() < 0.2 else round(target.price * rng.uniform(0.8, 1.6), 2)
    return Wish(attrs, opts, bound, rule_stated=rng.random() < 0.7)


def _render(elements: list[tuple[str, str]]) -> str:
    return "\n".join(f"[{i}] {kind}: {text}" for i, (kind, text) in enumerate(elements, start=1))


def _label_action(label: str, rng: random.Random) -> str:
    return f"click[{label.lower() if rng.random() < 0.8 else label}]"


# ------------------------------------------------------------------------------------------ transitions


@dataclass
class Step:
    """One made-up transition with what M_exp must write for it."""

    instruction: str
    history: list[str]
    state: str
    action: str
    next_state: str
    reasoning: str
    reward: float = 0.0
    done: bool = False
    neighbours: list[Neighbour] = field(default_factory=list)


def _results(site: Site, rng: random.Random) -> tuple[list[Item], int, int]:
    shown = rng.sample(site.items, min(site.page_size, len(site.items)))
    return shown, rng.randint(1, 3), rng.randint(len(shown) * 3, 60)


def _neighbour(action: str, next_state: str, reward: float = 0.0, done: bool = False) -> Neighbour:
    return Neighbour(state="", action=action, next_state=next_state, reward=reward, done=done)


def step_open(site: Site, wish: Wish, rng: random.Random) -> Step:
    shown, page, total = _results(site, rng)
    state_els = site.results_page(shown, page, total)
    it = rng.choice(shown)
    line = next(i for i, (_, t) in enumerate(state_els, start=1) if t == it.link())
    next_state = _render(site.item_page(it, {}))
    sibling = rng.choice([x for x in site.items if x is not it])
    nb = [_neighbour(f"click[{sibling.code.lower()}]", _render(site.item_page(sibling, {})))]
    return Step(wish.instruction(site, rng), ["search[" + " ".join(wish.attrs) + "]"], _render(state_els),
                f"click[{it.code.lower() if rng.random() < 0.85 else it.code}]", next_state,
                f'open [{line}] {it.code} "{it.title}" ${it.price:.2f} -> item page', neighbours=nb)


def _selection(site: Site, rng: random.Random) -> dict[str, str]:
    return {k: rng.choice(v) for k, v in site.options.items() if rng.random() < 0.5}


def step_select(site: Site, wish: Wish, rng: random.Random) -> Step:
    if not site.options:
        return step_open(site, wish, rng)
    it = rng.choice(site.items)
    before = _selection(site, rng)
    name = rng.choice(list(site.options))
    value = rng.choice(site.options[name])
    after = {**before, name: value}
    els = site.item_page(it, before)
    line = next(i for i, (_, t) in enumerate(els, start=1) if t.removesuffix(" (selected)") == f"{name}={value}")
    others = [v for v in site.options[name] if v != value]
    moved = f", {name}={before[name]} unselected" if before.get(name) not in (None, value) else ""
    reasoning = f"select [{line}] {name}={value} on {it.code} -> item page, {name}={value} selected{moved}"
    if others and not moved and rng.random() < 0.3:
        reasoning += f", {name}={others[0]} unselected"
    return Step(wish.instruction(site, rng), [f"click[{it.code.lower()}]"], _render(els), f"click[{value}]",
                _render(site.item_page(it, after)), reasoning)


def step_buy(site: Site, wish: Wish, rng: random.Random) -> Step:
    it = rng.choice(site.items)
    selected = _selection(site, rng)
    if rng.random() < 0.4:  # often the wished options are the selected ones
        selected.update(wish.opts)
    score, trace = wish.score(it, selected)
    return _buy(site, wish, rng, it, selected, score, f"buy {it.code}; {trace} -> done")


def _buy(site: Site, wish: Wish, rng: random.Random, it: Item, selected: dict[str, str], score: float,
         trace: str) -> Step:
    """The purchase of ``it`` with ``selected`` options, scored ``score`` by ``trace``, with a neighbour: another
    item's purchase on the same site."""
    nb_item = rng.choice(site.items)
    nb_sel = _selection(site, rng)
    nb_score = wish.score(nb_item, nb_sel)[0]
    nb = [_neighbour(_label_action(site.buy, rng), _render(site.leaf_page(nb_item, nb_sel, nb_score)), nb_score, True)]
    return Step(wish.instruction(site, rng), [f"click[{it.code.lower()}]"], _render(site.item_page(it, selected)),
                _label_action(site.buy, rng), _render(site.leaf_page(it, selected, score)), trace,
                reward=round(score, 2), done=True, neighbours=nb)


TYPE_FACTOR = 0.5  # a typed purchase of another kind of item scores this share of its checks (stated nowhere)


def step_buy_typed(site: Site, wish: Wish, rng: random.Random) -> Step:
    """:func:`step_buy` whose item is sometimes of another kind than the wish's, checked first in the trace the way
    the shop's purchase trace checks the product type (``type wished=shown y|n``), the score then multiplied by
    :data:`TYPE_FACTOR` (``score 0.5*3/4=0.38``)."""
    it = rng.choice(site.items)
    if rng.random() < 0.3:  # another kind of item, its kind shown in its title
        it = Item(it.code, it.brand, it.attrs, _word(rng, (1, 2)).title(), it.price)
    same_kind = it.noun.lower() == site.noun.lower()
    selected = _selection(site, rng)
    if rng.random() < 0.4:
        selected.update(wish.opts)
    checks = wish.checks(it, selected)
    met = sum(ok for _, ok in checks)
    score = round((1.0 if same_kind else TYPE_FACTOR) * met / len(checks), 2)
    factor = "" if same_kind else f"{TYPE_FACTOR:g}*"
    trace = "; ".join([f"buy {it.code}", f"type {site.noun.lower()}={it.noun.lower()} {'y' if same_kind else 'n'}",
                       *(text for text, _ in checks), f"score {factor}{met}/{len(checks)}={score:.2f} -> done"])
    return _buy(site, wish, rng, it, selected, score, trace)


def step_search(site: Site, wish: Wish, rng: random.Random) -> Step:
    query = " ".join(wish.attrs) if rng.random() < 0.5 else wish.instruction(site, rng)
    shown, _, total = _results(site, rng)
    next_state = _render(site.results_page(shown, 1, total))
    # The page cannot be derived from the query: it is copyable only from a neighbour with the same query.
    same = rng.random() < 0.7
    nb_state = next_state if same else _render(site.results_page(_results(site, rng)[0], 1, total))
    nb = [_neighbour(f"search[{query if same else _word(rng)}]", nb_state)]
    last = min(len(shown), site.page_size)
    short = query if len(query) <= 40 else query[:39] + "…"
    return Step(wish.instruction(site, rng), [], _render(site.search_page()), f"search[{query}]", next_state,
                f'search "{short}" -> results page 1, 1-{last} of {total}', neighbours=nb)


def step_detail(site: Site, wish: Wish, rng: random.Random) -> Step:
    if not site.details:
        return step_buy(site, wish, rng)
    it = rng.choice(site.items)
    label = rng.choice(site.details)
    return Step(wish.instruction(site, rng), [f"click[{it.code.lower()}]"], _render(site.item_page(it, {})),
                _label_action(label, rng), _render(site.detail_page(it, label)),
                f"{label.lower()} of {it.code} -> {label.lower()} page")


def step_invalid(site: Site, wish: Wish, rng: random.Random) -> Step:
    shown, page, total = _results(site, rng)
    state = _render(rng.choice([site.results_page(shown, page, total), site.item_page(rng.choice(site.items), {})]))
    bad = f"click[{rng.choice([_word(rng), _code(rng).lower(), _word(rng) + ' ' + _word(rng)])}]"
    return Step(wish.instruction(site, rng), [], state, bad, state,
                f"invalid: {bad} not on this page -> state unchanged, reward 0")


def _field(rng: random.Random) -> str:
    """A random field of a page: an id, a price, a made-up word or name, or a short phrase of them."""
    r = rng.random()
    if r < 0.25:
        return _code(rng)
    if r < 0.35:
        return f"${_price(rng):.2f}"
    if r < 0.55:
        return _name(rng)
    return " ".join(_word(rng, (1, 2)) for _ in range(rng.randint(1, 3)))


def step_echo(rng: random.Random) -> Step:
    """Copy a page of random fields unchanged after an action that names nothing on it: nothing in the next state
    can be guessed, everything can be looked up (the purest copy signal)."""
    kinds = ["text", "link", "button", "option"]
    els = [(rng.choice(kinds), " ".join(_field(rng) for _ in range(rng.randint(1, 3)))) for _ in range(rng.randint(2, 6))]
    state = _render(els)
    bad = f"click[{_word(rng)}]"
    return Step(f"{rng.choice(_TASK_VERBS)} {_field(rng)}", [], state, bad, state,
                f"invalid: {bad} not on this page -> state unchanged, reward 0")


def step_world(rng: random.Random) -> Step:
    """A room world: ``take X`` moves an object from the room into the inventory, ``drop X`` back, ``go D``
    leads to a neighbour room (its page copyable from a neighbour that went there before)."""
    rooms = [_name(rng) for _ in range(3)]
    here = rooms[0]
    objs = [" ".join(_word(rng) for _ in range(rng.choice([1, 2]))) for _ in range(rng.randint(2, 5))]
    carrying = objs[: rng.randint(0, 2)]
    lying = objs[len(carrying):]
    exits = rng.sample(_DIRECTIONS, 2)

    def page(room: str, feedback: str, inv: list[str], floor: list[str], ex: list[str]) -> str:
        lines = [f"location: {room}", f"[f] feedback: {feedback}"]
        lines += [f"[i{i}] carrying: a {o}" for i, o in enumerate(inv, start=1)]
        cmds = [f"take {o}" for o in floor] + [f"drop {o}" for o in inv] + [f"go {d}" for d in ex]
        lines += [f"[c{i}] command: {c}" for i, c in enumerate(cmds, start=1)]
        return "\n".join(lines)

    state = page(here, rng.choice(["You arrive.", f"You see a {lying[0]} here." if lying else "It is quiet."]),
                 carrying, lying, exits)
    kind = rng.choice(["take", "drop", "go"]) if carrying else rng.choice(["take", "go"])
    nb: list[Neighbour] = []
    if kind == "take" and lying:
        o = rng.choice(lying)
        action, feedback = f"take {o}", f"You take the {o}."
        nxt = page(here, feedback, [*carrying, o], [x for x in lying if x != o], exits)
        reasoning = f"take {o} from {here} -> carrying {o}"
    elif kind == "drop" and carrying:
        o = rng.choice(carrying)
        action, feedback = f"drop {o}", f"You drop the {o}."
        nxt = page(here, feedback, [x for x in carrying if x != o], [*lying, o], exits)
        reasoning = f"drop {o} in {here} -> {o} on the floor"
    else:
        d = exits[0]
        there = rooms[1]
        new_objs = [_word(rng) for _ in range(rng.randint(0, 2))]
        nxt = page(there, f"You go {d} to the {there}.", carrying, new_objs, [exits[1]])
        action, reasoning = f"go {d}", f"go {d} from {here} -> {there}"
        nb = [_neighbour(action, nxt)] if rng.random() < 0.7 else []
    goal = rng.choice(objs)
    return Step(f"put the {goal} in the {rooms[2]}", [], state, action, nxt, reasoning,
                reward=0.0, done=False, neighbours=nb)


STEP_MAKERS = {"open": step_open, "select": step_select, "buy": step_buy, "buy_typed": step_buy_typed,
               "search": step_search,
               "detail": step_detail, "invalid": step_invalid}


# ------------------------------------------------------------------------------------------ agent steps


def _item_actions(els: list[tuple[str, str]]) -> list[str]:
    """An item page's admissible clicks: each option by its value, each button by its label."""
    return [f"click[{t.removesuffix(' (selected)').split('=', 1)[-1].lower()}]" if k == "option" else f"click[{t.lower()}]"
            for k, t in els if k in ("option", "button")]


def choose_step(site: Site, wish: Wish, rng: random.Random) -> tuple[AgentObservation, str]:
    """An agent observation and the action an oracle takes: the best-matching link on a results page, the first
    wished option not yet selected on an item page (then buy), the task's own search on the search page."""
    where = rng.choice(["results", "results", "item", "search"])
    instruction = wish.instruction(site, rng)
    if where == "search":
        queries = [f"search[{' '.join(instruction.split())}]", *(f"search[{_word(rng)} {_word(rng)}]" for _ in range(3))]
        return AgentObservation(instruction, _render(site.search_page()), queries, []), queries[0]
    if where == "results":
        shown, page, total = _results(site, rng)
        els = site.results_page(shown, page, total)
        best = max(shown, key=lambda it: wish.score(it, wish.opts)[0])
        actions = [f"click[{t.lower()}]" for k, t in els if k == "button"] + [f"click[{it.code.lower()}]" for it in shown]
        return AgentObservation(instruction, _render(els), actions, [(
            "", f"search[{' '.join(instruction.split())}]")]), f"click[{best.code.lower()}]"
    it = rng.choice(site.items)
    selected = {k: v for k, v in wish.opts.items() if rng.random() < 0.5}
    els = site.item_page(it, selected)
    missing = [v for k, v in wish.opts.items() if selected.get(k) != v]
    actions = _item_actions(els)
    answer = f"click[{missing[0].lower()}]" if missing else f"click[{site.buy.lower()}]"
    return AgentObservation(instruction, _render(els), actions, [("", f"click[{it.code.lower()}]")]), answer


# The shop policy's answer format (dreamgym.envs' shop spec): numbered actions, an option or button click answered
# as its text (PolicyConfig.answer_by_name).
MATCH_CONFIG = PolicyConfig(action_format="index", offer_task_search=True, answer_by_name=True)
# Recipe 5's: the shop policy's compact prompt, an option or button answered by its words (`<action> vorla</action>`).
WORDS_CONFIG = PolicyConfig(action_format="index", offer_task_search=True, answer_by_name=True, prompt="compact",
                            answer_words=True)
_OPTION_PHRASES = ["with {k} {v}", "with {k}={v}", "in {v}", "{v}", "{k}: {v}", "in {k} {v}"]


def match_step(rng: random.Random, compact: bool = False, finished_share: float = 0.0) -> tuple[AgentObservation, str]:
    """An agent step on an item page whose task names option values: the answer is the first named value not yet
    selected, written as its click (``<action>click[vorla]</action>``). The task words, option names and values
    are made up afresh every time and the named value's rank among the page's options is uniform, so nothing but
    finding which listed value appears in the task predicts the answer: the content match the shop policy's
    option choice needs and a 1.3M base does not learn in the mixture (README, "A match-first curriculum").
    With probability ``finished_share`` every named value is selected already and the answer is the buy button
    (no draw is made when it is 0, so recipes 4 and 5 keep their streams)."""
    site = Site.random(rng, compact)
    while not site.options:
        site = Site.random(rng, compact)
    it = rng.choice(site.items)
    names = [n for n in site.options if rng.random() < 0.7] or [rng.choice(list(site.options))]
    wished = {n: rng.choice(site.options[n]) for n in names}
    finished = finished_share > 0 and rng.random() < finished_share
    selected = dict(wished) if finished else {n: v for n, v in wished.items() if rng.random() < 0.3}
    if selected == wished and not finished:  # at least one named value is left to click
        del selected[rng.choice(list(selected))]
    for n in site.options:  # another value of an unnamed option may be selected already
        if n not in wished and rng.random() < 0.3:
            selected[n] = rng.choice(site.options[n])
    attrs = rng.sample(it.attrs, rng.randint(1, len(it.attrs)))
    phrases = [rng.choice(_OPTION_PHRASES).format(k=n, v=v) for n, v in wished.items()]
    instruction = f"{rng.choice(_TASK_VERBS)} {rng.choice(['a', 'the'])} {' '.join(attrs)} {site.noun.lower()} " + \
        rng.choice([" and ", ", "]).join(phrases)
    els = site.item_page(it, selected)
    actions = _item_actions(els)
    answer = f"click[{site.buy.lower()}]" if finished else \
        next(f"click[{v.lower()}]" for n, v in wished.items() if selected.get(n) != v)
    return AgentObservation(instruction, _render(els), actions, [("", f"click[{it.code.lower()}]")]), answer


def match_baselines(examples: Iterable[SFTExample]) -> dict[str, float]:
    """The answers to ``match`` examples that need no matching, as shares right: a random option value of the page
    (expected) and the first option not yet selected."""
    rand = first = 0.0
    n = 0
    for ex in examples:
        prompt = ex.prompt if isinstance(ex.prompt, str) else "\n".join(m["content"] for m in ex.prompt)
        lines = prompt.splitlines()
        options = [line.split("] option: ", 1)[1] for line in lines if "] option: " in line]
        answer = ex.target.removeprefix("<action>").removesuffix("</action>")
        answer = answer.removeprefix("click[").removesuffix("]") if answer.startswith("click[") else answer.strip()
        unselected = [o.split("=", 1)[1].lower() for o in options if not o.endswith(" (selected)")]
        values = {o.removesuffix(" (selected)").split("=", 1)[1].lower() for o in options}
        rand += 1 / len(options) if answer in values else 0.0  # a finished page's answer (buy) is no option
        first += bool(unselected) and unselected[0] == answer
        n += 1
    return {"random_option": round(rand / n, 4), "first_unselected": round(first / n, 4)}


# ------------------------------------------------------------------------------------------ the stream

# Prompt layouts the experience model is trained under (sampled per example): the CPU default (k=1, no
# neighbour state, no system text, TARGET line) most of the time, and variants so the base is not tied to one.
PROTOCOLS = [
    (0.6, ProtocolConfig(history_window=2, k=1, neighbour_states=False, system_prompt="", ground_action=True)),
    (0.2, ProtocolConfig(history_window=2, k=0, neighbour_states=False, system_prompt="", ground_action=True)),
    (0.2, ProtocolConfig(history_window=3, k=1, neighbour_states=False, ground_action=True)),
]
# Recipe 4's (compact): the system text rarely, its tokens buy no learning.
COMPACT_PROTOCOLS = [(0.7, PROTOCOLS[0][1]), (0.22, PROTOCOLS[1][1]), (0.08, PROTOCOLS[2][1])]
# Recipe 7's: the shop default's (DemoConfig.exp_protocol: k=1, copy references, exact neighbours), and k=0.
SHOP_PROTOCOLS = [
    (0.8, ProtocolConfig(history_window=2, k=1, neighbour_states=False, system_prompt="", ground_action=True,
                         copy_refs=True, exact_neighbours=True)),
    (0.2, ProtocolConfig(history_window=2, k=0, neighbour_states=False, system_prompt="", ground_action=True,
                         copy_refs=True, exact_neighbours=True)),
]
EXACT_SHARE = 0.15  # recipe 7: share of k=1 examples whose neighbour is the very step, recorded before
AGENT_CONFIG = PolicyConfig(action_format="index", offer_task_search=True)


def _exp_example(step: Step, rng: random.Random, compact: bool = False, shop_protocol: bool = False) -> SFTExample:
    protocols = SHOP_PROTOCOLS if shop_protocol else COMPACT_PROTOCOLS if compact else PROTOCOLS
    cfg = rng.choices([c for _, c in protocols], weights=[w for w, _ in protocols])[0]
    history = [("", a) for a in step.history]
    neighbours = step.neighbours
    if shop_protocol and cfg.k and rng.random() < EXACT_SHARE:
        neighbours = [Neighbour(step.state, step.action, step.next_state, step.reward, step.done, step.instruction)]
    query = ExperienceQuery(step.instruction, history, neighbours, step.state, step.action)
    return SFTExample(build_messages(query, cfg), exp_target(step, query, cfg))


def exp_target(step: Step, query: ExperienceQuery, cfg: ProtocolConfig) -> str:
    """What M_exp writes for ``step`` asked as ``query``; with ``cfg.copy_refs`` pointing into the prompt, as the
    shop's targets are written (:func:`dreamgym.experience.protocol.step_target`)."""
    next_state, reasoning = step.next_state, step.reasoning
    if cfg.copy_refs:
        ctx = ref_context(query, cfg)
        next_state, reasoning = encode_refs(next_state.strip(), ctx), encode_inline(reasoning.strip(), ctx)
    return format_target(next_state, step.reward, step.done, step.done and step.reward >= 1.0, reasoning, cfg)


def example(rng: random.Random, pool: list[Site] | None = None, recipe: Recipe = RECIPES[CORPUS_VERSION]) -> SFTExample:
    """One example of a skill drawn by the recipe's shares, on a site of ``pool`` (or, for the recipe's
    ``fresh_site_share`` of them and when there is no pool, on a fresh one)."""
    skill = rng.choices(list(recipe.skills), weights=list(recipe.skills.values()))[0]
    return example_of(skill, rng, pool, recipe.fresh_site_share, recipe.compact, recipe.agent_words,
                      recipe.match_finished, recipe.shop_protocol)


def example_of(skill: str, rng: random.Random, pool: list[Site] | None = None, fresh_share: float = 0.0,
               compact: bool = False, words: bool = False, finished_share: float = 0.0,
               shop_protocol: bool = False) -> SFTExample:
    """One example of ``skill`` (see :func:`example`); ``words``: agent examples in :data:`WORDS_CONFIG`'s format;
    ``finished_share``: :func:`match_step`'s; ``shop_protocol``: M_exp examples in :data:`SHOP_PROTOCOLS`."""
    if skill == "world":
        return _exp_example(step_world(rng), rng, compact, shop_protocol)
    if skill == "echo":
        return _exp_example(step_echo(rng), rng, compact, shop_protocol)
    if skill == "match":
        obs, action = match_step(rng, compact, finished_share)
        cfg = WORDS_CONFIG if words else MATCH_CONFIG
        return SFTExample(build_agent_prompt(obs, cfg), action_target(obs, action, cfg))
    site = rng.choice(pool) if pool and rng.random() >= fresh_share else Site.random(rng, compact)
    wish = _wish(site, rng.choice(site.items), rng)
    if skill == "choose":
        obs, action = choose_step(site, wish, rng)
        cfg = WORDS_CONFIG if words else AGENT_CONFIG
        return SFTExample(build_agent_prompt(obs, cfg), action_target(obs, action, cfg))
    return _exp_example(STEP_MAKERS[skill](site, wish, rng), rng, compact, shop_protocol)


def examples(seed: int, version: str = CORPUS_VERSION, stream: str = "train") -> Iterator[SFTExample]:
    """The endless, deterministic stream of examples for ``seed`` under the recipe ``version``. Another
    ``stream`` draws other examples of the same lexicon and pool (the tokenizer is fitted on one)."""
    recipe = RECIPES[version]
    rng = LexiconRandom(f"dreamgym-corpus-v{recipe.rng_tag}-{seed}")
    if recipe.lexicon:
        rng.lexicon = list(dict.fromkeys(_word(rng) for _ in range(recipe.lexicon)))
    pool = [Site.random(rng, recipe.compact) for _ in range(recipe.site_pool)]
    if stream != "train":
        rng.seed(f"dreamgym-corpus-v{recipe.rng_tag}-{seed}-{stream}")
    while True:
        yield example(rng, pool, recipe)
