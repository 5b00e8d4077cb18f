"""A reward head for M_exp's terminal steps: the episode's reward from how the task's words meet the page.

Measured over sessions (README, "Checked verdicts"; docs/MEASUREMENTS.md, "M_exp at 4x the steps"), the tiny
experience model copies pages well (click consistency 0.99) but never decides a purchase: it writes the majority
reward, 1.0, on every terminal step, whatever the task asked. Deciding it means comparing the task's words with
the page's, which a pre-trained 8B model does in its trace and a 1.3M one does not learn in its budget. So, as a
world model such as Dreamer or MuZero predicts its reward with a head of its own, M_exp may hand the reward of the
steps it ends to this head:

* **features** (:func:`grounding_features`), computed for any env's ``[id] type: text`` state: which of the task's
  content words (its words minus those in most tasks, learned from the training tasks) appear in the page's first
  element, in marked elements (a trailing ``(selected)``-like parenthetical) and in their unmarked siblings (the
  same element type); how many marked elements hold none of them; the page's quantities written like the task's
  largest (as many decimals, standing alone: a price like a price, not an id's digits) against it; and the task's
  phrases (:func:`task_phrases`, one per requirement), each counted where the page meets it whole (the first
  element, a marked one, an unmarked choice, a choice the page does not offer, nowhere), with the share met,
  the bound's check counted as one more requirement. Nothing in them names the shop, its catalog or its reward
  rule (the share is what a task-completion score made of requirements met looks like, in any env);
* **a classifier** over the terminal rewards seen in the training data (a small MLP, torch), fitted on the same
  annotated real transitions as M_exp;
* **the answer** is the most probable reward (``tolerance`` 0), or the value most probably within ``tolerance`` of
  the truth; ``success`` is what most training endings with that reward were. Chosen on val
  (``benchmarks/results/reward_head_val.json``): the most probable reward, over classes of >= 0.3% of the endings,
  is right to 2 decimals far more often (0.894 against 0.827 at noise 0.5) and within 0.1 about as often (0.934
  against 0.946) as the answer that maximises the within-0.1 rate.
  The phrases (features version 3) raised the exact share on val from 0.894 to 0.936 at noise 0.5 and from 0.724
  to 0.833 at noise 0.8 (``benchmarks/results/reward_head_val_phrases.json``).

It is an option (``ExperienceConfig.reward_head``), off unless a config turns it on after a measurement on val:
the model's own reward is the default and the comparison. Saved as ``reward_head.json`` beside M_exp's weights
(weights as lists: no pickle).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dreamgym.envs.base import parse_elements
from dreamgym.experience.protocol import terminated
from dreamgym.types import Trajectory

HEAD_FILE = "reward_head.json"
# Bumped whenever a feature's meaning changes under the same name (2: the bound's quantities read as written like
# it; 3: the task's phrases), so that a head saved for other features is refused on load instead of silently misread.
FEATURES_VERSION = 3
FEATURES = (
    "content_words", "inv_content_words", "in_first", "in_marked", "only_in_sibling", "in_other", "unseen",
    "pairs_in_first", "marked", "marked_without_task_word", "marked_with_task_word",
    "has_bound", "number_over_bound", "number_to_bound",
    "phrases", "phrases_in_first", "phrases_in_marked", "phrases_only_in_choice", "phrases_unoffered", "phrases_unseen",
    "phrase_score", "phrase_score_unseen_met",
)
_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
# a quantity standing alone ("$57.78", "20.00"), not the digits of an id or a unit word ("B04I0YS7", "30l")
_QUANTITY = re.compile(r"(?<![A-Za-z0-9.,])\d+(?:,\d{3})*(?:\.(\d+))?(?![A-Za-z0-9]|[.,]\d)")
_MARK = re.compile(r"\([^()]*\)\s*$")  # a trailing parenthetical: "(selected)", "(checked)", "(current)"


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def quantities(text: str) -> list[tuple[float, int]]:
    """The stand-alone numbers of ``text`` with their count of decimals: ``$57.78`` is ``(57.78, 2)``."""
    return [(float(m.group(0).replace(",", "")), len(m.group(1) or "")) for m in _QUANTITY.finditer(text)]


def common_words(instructions: Sequence[str], share: float = 0.2) -> list[str]:
    """Words in more than ``share`` of the instructions (a task template's words), sorted: not content."""
    df = Counter(w for text in instructions for w in set(words(text)))
    return sorted(w for w, n in df.items() if n > share * len(instructions))


def task_bound(instruction: str) -> re.Match[str] | None:
    """The task's bound: its quantity written with the most decimals, the largest of those (``15.00`` in "in size
    33.8 fl oz, and price lower than 15.00 dollars"), or None."""
    return max(_QUANTITY.finditer(instruction), default=None,
               key=lambda m: (len(m.group(1) or ""), float(m.group(0).replace(",", ""))))


def task_phrases(instruction: str, common: frozenset[str]) -> list[frozenset[str]]:
    """The task's phrases: maximal runs of its words between template words (``common``) and punctuation, its
    bound (:func:`task_bound`) left out, each as a set of words, without repeats. ``"quick dry t-shirt in yellow
    and in size xs, and price lower than 20.00 dollars"`` gives {quick, dry, t-shirt}, {yellow}, {xs} when "in",
    "and", "size", "price", ... are template words: what the task asks for, one phrase per requirement."""
    return list(_phrase_runs(instruction, common))


def _phrase_runs(instruction: str, common: frozenset[str]) -> dict[frozenset[str], str]:
    """:func:`task_phrases`, each with the template word just before it ("" at a chunk's start)."""
    bound = task_bound(instruction)
    text = instruction if bound is None else instruction[:bound.start()] + " , " + instruction[bound.end():]
    phrases: dict[frozenset[str], str] = {}
    for chunk in re.split(r"[,;:!?]|\.(?!\d)", text.lower()):
        run: list[str] = []
        before = ""
        for w in [*words(chunk), ""]:
            if w and w not in common:
                run.append(w)
                continue
            if run:
                phrases.setdefault(frozenset(run), before)
                run = []
            before = w
    return phrases


def grounding_features(instruction: str, state: str, common: frozenset[str]) -> np.ndarray:
    """:data:`FEATURES` of a terminal step's task and state (the page the ending action was taken on)."""
    content = [w for w in dict.fromkeys(words(instruction)) if w not in common and not _NUMBER.fullmatch(w)]
    elements = parse_elements(state)
    first = set(words(elements[0].text)) if elements else set()
    marked = [e for e in elements[1:] if _MARK.search(e.text)]
    marked_types = {e.type for e in marked}
    siblings = [e for e in elements[1:] if e.type in marked_types and not _MARK.search(e.text)]
    other = [e for e in elements[1:] if e.type not in marked_types]
    in_marked = {w for e in marked for w in words(e.text)}
    in_sibling = {w for e in siblings for w in words(e.text)}
    in_other = {w for e in other for w in words(e.text)}
    n = max(len(content), 1)

    def share(found: set[str]) -> float:
        return sum(w in found for w in content) / n

    pairs = list(itertools.pairwise(content))
    first_text = " ".join(words(elements[0].text)) if elements else ""
    task_words = set(content)
    # The task's bound (:func:`task_bound`); the page's quantities written like it (as many decimals: a price like
    # a price, not a size "1.7 oz" or an id's digits) are what it bounds.
    found = task_bound(instruction)
    bound = None if found is None else float(found.group(0).replace(",", ""))
    decimals = 0 if found is None else len(found.group(1) or "")
    page_numbers = [x for e in elements for x, d in quantities(e.text) if d == decimals]
    over = bound is not None and any(x > bound + 1e-9 for x in page_numbers)
    ratio = max(page_numbers, default=0.0) / bound if bound else 0.0
    # Each task phrase where it is met whole: in the first element, in a marked one, only in an unmarked choice
    # (an element whose type repeats: offered, not chosen), or nowhere. A phrase met nowhere that the task names
    # with a choice's key ("in size loveseat" where the page offers size=...) is a choice the page does not offer;
    # another may still be met off the page (a property the title does not show). The share met, the price's
    # check counted as one more requirement: without those unseen phrases, and with them.
    marked_sets = [set(words(e.text)) for e in marked]
    type_counts = Counter(e.type for e in elements[1:])
    choice_sets = [set(words(e.text)) for e in elements[1:] if type_counts[e.type] > 1 and not _MARK.search(e.text)]
    keys = {w for e in elements[1:] if type_counts[e.type] > 1 and "=" in e.text for w in words(e.text.split("=")[0])}
    runs = _phrase_runs(instruction, common)
    where = Counter[str]()
    for phrase, before in runs.items():
        if phrase <= first:
            where["first"] += 1
        elif any(phrase <= m for m in marked_sets):
            where["marked"] += 1
        elif any(phrase <= m for m in choice_sets):
            where["choice"] += 1
        elif before in keys or phrase & keys:
            where["unoffered"] += 1
        else:
            where["unseen"] += 1
    price_ok = float(bound is not None and not over)
    requirements = len(runs) + float(bound is not None) or 1.0
    phrase_score = (where["first"] + where["marked"] + price_ok) / requirements
    phrase_score_unseen_met = (where["first"] + where["marked"] + where["unseen"] + price_ok) / requirements
    return np.array([
        len(content), 1.0 / n, share(first), share(in_marked), share(in_sibling - in_marked - first),
        share(in_other), share(set(w for w in content if w not in first | in_marked | in_sibling | in_other)),
        sum(f"{a} {b}" in first_text for a, b in pairs) / max(len(pairs), 1), len(marked),
        sum(not task_words & set(words(e.text)) for e in marked), sum(bool(task_words & set(words(e.text))) for e in marked),
        float(bound is not None), float(over), min(ratio, 4.0),
        len(runs), where["first"], where["marked"], where["choice"], where["unoffered"], where["unseen"], phrase_score,
        phrase_score_unseen_met,
    ], dtype=np.float32)


@dataclass(frozen=True)
class Ending:
    """A real terminal step: what the head reads and what it predicts."""

    instruction: str
    state: str
    reward: float
    success: bool


def endings(trajs: Sequence[Trajectory]) -> list[Ending]:
    """The real endings of ``trajs`` (done and not cut by the step limit), as the targets mark them."""
    return [Ending(t.task.instruction, x.state, float(x.reward), bool(x.info.get("success", x.reward >= 1.0)))
            for t in trajs for x in t.transitions if terminated(x)]


class RewardHead:
    """Terminal reward from :func:`grounding_features` (see the module docstring)."""

    def __init__(self, common: Sequence[str], values: Sequence[float], success: Sequence[bool], mean: Sequence[float],
                 scale: Sequence[float], weights: dict[str, Any], tolerance: float = 0.0,
                 summary: dict[str, Any] | None = None) -> None:
        self.common = frozenset(common)
        self.values = np.asarray(values, dtype=np.float64)
        self.success = list(success)
        self.mean, self.scale = np.asarray(mean, np.float32), np.asarray(scale, np.float32)
        self.weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
        self.tolerance = tolerance
        self.summary = summary or {}
        # near[i, j]: value j counts as right when the truth is value i (the accuracy the answer maximises)
        self._near = (np.abs(self.values[:, None] - self.values[None, :]) <= tolerance + 1e-9).astype(np.float64)

    # -------------------------------------------------------------------------------------------- fit
    @classmethod
    def fit(cls, data: Sequence[Ending], seed: int = 0, steps: int = 1500, hidden: int = 32, min_share: float = 0.003,
            tolerance: float = 0.0, lr: float = 1e-2, weight_decay: float = 1e-4) -> RewardHead:
        """Fit on real endings: classes are the rewards (2 decimals) of at least ``min_share`` of them, a rarer
        reward counts as its nearest class. Full-batch Adam for ``steps`` steps, seeded: the same data and seed
        give the same head."""
        import torch

        if len(data) < 2:
            raise ValueError(f"the reward head needs >= 2 real terminal steps to fit, got {len(data)}")
        common = common_words(list({e.instruction for e in data}))
        counts = Counter(round(e.reward, 2) for e in data)
        values = sorted(v for v, c in counts.items() if c >= min_share * len(data)) or [counts.most_common(1)[0][0]]
        varr = np.asarray(values)
        labels = np.array([int(np.argmin(np.abs(varr - e.reward))) for e in data])
        won = [Counter(e.success for e, y in zip(data, labels, strict=True) if y == i).most_common(1)[0][0]
               for i in range(len(values))]
        frozen = frozenset(common)
        x = np.stack([grounding_features(e.instruction, e.state, frozen) for e in data])
        mean, scale = x.mean(0), x.std(0) + 1e-6
        gen = torch.Generator().manual_seed(seed)
        layers = [torch.nn.Linear(len(FEATURES), hidden), torch.nn.Linear(hidden, len(values))]
        for layer in layers:
            bound = 1 / math.sqrt(layer.in_features)
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.uniform_(-bound, bound, generator=gen)
        net = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1])
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        xt, yt = torch.from_numpy((x - mean) / scale), torch.from_numpy(labels)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xt), yt)
            loss.backward()
            opt.step()
        weights = {"w1": layers[0].weight.detach().numpy(), "b1": layers[0].bias.detach().numpy(),
                   "w2": layers[1].weight.detach().numpy(), "b2": layers[1].bias.detach().numpy()}
        head = cls(common, values, won, mean.tolist(), scale.tolist(), weights, tolerance)
        answers = head.predict_batch([(e.instruction, e.state) for e in data])
        train_acc = float(np.mean([round(r, 2) == round(e.reward, 2) for (r, _), e in zip(answers, data, strict=True)]))
        head.summary = {"endings": len(data), "classes": values, "steps": steps, "seed": seed,
                        "train_loss": round(float(loss.detach()), 4), "train_exact_accuracy": round(train_acc, 4),
                        "tolerance": tolerance, "min_share": min_share,
                        "common_words": len(common)}
        return head

    # ---------------------------------------------------------------------------------------- predict
    def probabilities(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mean) / self.scale
        h = np.tanh(z @ self.weights["w1"].T + self.weights["b1"])
        logits = h @ self.weights["w2"].T + self.weights["b2"]
        logits = logits - logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        return np.asarray(p / p.sum(axis=-1, keepdims=True))

    def predict_batch(self, queries: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """``(reward, success)`` for each ``(instruction, state)`` of a terminal step."""
        if not queries:
            return []
        x = np.stack([grounding_features(i, s, self.common) for i, s in queries])
        best = (self.probabilities(x) @ self._near).argmax(axis=-1)  # the most probably right value
        return [(float(self.values[j]), bool(self.success[j])) for j in best]

    def predict(self, instruction: str, state: str) -> tuple[float, bool]:
        return self.predict_batch([(instruction, state)])[0]

    # ------------------------------------------------------------------------------------------- file
    def save(self, model_dir: str | os.PathLike[str]) -> Path:
        path = Path(model_dir, HEAD_FILE)
        path.write_text(json.dumps({
            "features": list(FEATURES), "features_version": FEATURES_VERSION, "common_words": sorted(self.common), "values": self.values.tolist(),
            "success": self.success, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
            "weights": {k: v.tolist() for k, v in self.weights.items()}, "tolerance": self.tolerance,
            "summary": self.summary,
        }))
        return path

    @classmethod
    def load(cls, model_dir: str | os.PathLike[str]) -> RewardHead:
        path = Path(model_dir, HEAD_FILE)
        try:
            d = json.loads(path.read_text())
            if d["features"] != list(FEATURES):
                raise ValueError(f"made for features {d['features']}, this dreamgym computes {list(FEATURES)}")
            if d.get("features_version", 1) != FEATURES_VERSION:
                raise ValueError(f"made for features version {d.get('features_version', 1)}, this dreamgym computes "
                                 f"version {FEATURES_VERSION}: fit it again (dreamgym train-exp --reward-head, or "
                                 "benchmarks/refit_reward_head.py for a bench seed)")
            return cls(d["common_words"], d["values"], d["success"], d["mean"], d["scale"], d["weights"],
                       d["tolerance"], d.get("summary"))
        except FileNotFoundError:
            raise ValueError(f"{path}: no reward head (the model was trained without ExperienceConfig.reward_head)") from None
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: invalid reward head ({str(e).splitlines()[0]})") from None
