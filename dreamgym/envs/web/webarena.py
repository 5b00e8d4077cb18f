"""WebArena's tasks and evaluators (Zhou et al. 2023, github.com/web-arena-x/webarena ``evaluation_harness``),
for the browser env on a user's own WebArena deployment.

* :func:`load_tasks` reads WebArena's task JSON (one task, a list, or a directory of ``<id>.json`` files as in
  its ``config_files/``): ``task_id``, ``intent``, ``start_url``, ``storage_state`` and ``eval``. The site
  placeholders (``__SHOPPING__``, ``__GITLAB__``, ...) are replaced from ``url_map``. A task's split is its
  ``"split"`` field, else ``test`` (WebArena is a test set).
* :func:`evaluate_task` scores the final page and the agent's answer (``stop[answer]``) as WebArena does: the
  product of the task's ``eval_types``:

  - ``string_match``: ``exact_match`` (equal after WebArena's ``clean_answer``: stripped, one pair of outer
    quotes removed, lower case), ``must_include`` (each reference a substring; a one-character reference
    against a one-word answer compares words), ``fuzzy_match`` needs an LLM judge: such tasks are not loaded
    (counted and logged) and :func:`string_match` refuses them.
  - ``url_match`` (``url_note`` "GOLD in PRED"): a reference's host+path inside the page's, and every reference
    query parameter among the page's values; references joined by `` |OR| ``.
  - ``program_html``: per target, the page at ``url`` (``last``: the final page) and the text a JS
    ``locator`` selects (empty: the whole HTML), after its ``prep_actions``, must ``exact_match`` or
    ``must_include`` its ``required_contents`` (alternatives joined by `` |OR| ``). Targets whose ``url`` or
    ``locator`` is a ``func:`` (WebArena's Python helpers, run with ``eval``) are not supported: such tasks are
    not loaded.
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from dreamgym.types import Task

log = logging.getLogger(__name__)

SITE_PLACEHOLDERS = ("__SHOPPING_ADMIN__", "__SHOPPING__", "__REDDIT__", "__GITLAB__", "__WIKIPEDIA__", "__MAP__",
                     "__HOMEPAGE__")
_TOKEN = re.compile(r"\w+|[^\w\s]")


class UnsupportedTask(ValueError):
    """A WebArena task this implementation cannot score (an LLM judge, a ``func:`` helper, an unknown type)."""


# ------------------------------------------------------------------------------------------- strings

def clean_answer(answer: str) -> str:
    """WebArena's ``StringEvaluator.clean_answer``."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(pred) == clean_answer(ref))


def must_include(ref: str, pred: str, tokenize: bool = False) -> float:
    clean_ref, clean_pred = clean_answer(ref), clean_answer(pred)
    tokens = _TOKEN.findall(clean_pred)  # nltk's word_tokenize, for the one case WebArena uses it
    if tokenize and len(clean_ref) == 1 and len(tokens) == 1:
        return float(clean_ref in tokens)
    return float(clean_ref in clean_pred)


def string_match(reference_answers: Mapping[str, Any], answer: str) -> float:
    """WebArena's ``StringEvaluator`` on the agent's answer (``fuzzy_match`` refused: it needs an LLM)."""
    pred = clean_answer(answer)
    score = 1.0
    for approach, value in reference_answers.items():
        if approach == "exact_match":
            score *= exact_match(str(value), pred)
        elif approach == "must_include":
            values = value if isinstance(value, list) else [value]
            for must in values:
                score *= must_include(str(must), pred, tokenize=len(values) == 1)
        elif approach == "fuzzy_match":
            raise UnsupportedTask("string_match: fuzzy_match needs an LLM judge (not supported)")
        else:
            raise UnsupportedTask(f"string_match: unknown reference {approach!r}")
    return score


# ----------------------------------------------------------------------------------------------- URLs

def _parse_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urlparse(url)
    return parsed.netloc + parsed.path, parse_qs(parsed.query)


def url_match(reference_url: str, page_url: str, url_note: str = "GOLD in PRED") -> float:
    """WebArena's ``URLEvaluator``: every reference path inside the page's and each query parameter matched."""
    if url_note != "GOLD in PRED":
        raise UnsupportedTask(f"url_match: unknown url_note {url_note!r}")
    refs = [u.strip().rstrip("/") for u in reference_url.split(" |OR| ")]
    pred_path, pred_query = _parse_url(page_url.rstrip("/"))
    ref_paths: list[str] = []
    ref_queries: dict[str, set[str]] = defaultdict(set)
    for ref in refs:
        path, query = _parse_url(ref)
        ref_paths.append(path)
        for key, values in query.items():
            ref_queries[key].update(values)
    score = float(any(path in pred_path for path in ref_paths))
    for key, wanted in ref_queries.items():
        score *= float(any(v in pred_query.get(key, []) for v in wanted))
    return score


# ----------------------------------------------------------------------------------------------- HTML

def program_html(targets: list[Mapping[str, Any]], page: Any, timeout_s: float = 10.0) -> float:
    """WebArena's ``HTMLContentEvaluator`` on a Playwright page (it may navigate the page)."""
    score = 1.0
    for target in targets:
        url, locator = str(target.get("url", "last")), str(target.get("locator", ""))
        if url.startswith("func:") or locator.startswith("func:"):
            raise UnsupportedTask("program_html: func: targets (WebArena's Python helpers) are not supported")
        if url != "last":
            page.goto(url, wait_until="load", timeout=timeout_s * 1000)
        if not locator.strip():
            selected = page.content()
        elif locator.startswith(("document.", "[...document.")):
            for prep in target.get("prep_actions", []) or []:
                try:
                    page.evaluate(f"() => {prep}")
                except Exception as e:  # WebArena ignores failing preparations too
                    log.debug("program_html: prep action failed: %s", e)
            try:
                selected = str(page.evaluate(f"() => {locator}") or "")
            except Exception:
                selected = ""
        else:
            raise UnsupportedTask(f"program_html: unknown locator {locator[:60]!r}")
        selected = html.unescape(selected)
        required = target.get("required_contents", {})
        if "exact_match" in required:
            score *= exact_match(str(required["exact_match"]), selected)
        elif "must_include" in required:
            for content in required["must_include"]:
                score *= float(any(must_include(alt, selected) for alt in str(content).split(" |OR| ")))
        else:
            raise UnsupportedTask("program_html: required_contents needs exact_match or must_include")
    return score


# ------------------------------------------------------------------------------------------ tasks

def check_supported(evaluation: Mapping[str, Any]) -> None:
    """Raise :class:`UnsupportedTask` when :func:`evaluate_task` could not score a task's ``eval``."""
    types = evaluation.get("eval_types") or []
    if not types:
        raise UnsupportedTask("eval.eval_types is empty")
    for kind in types:
        if kind == "string_match":
            if "fuzzy_match" in (evaluation.get("reference_answers") or {}):
                raise UnsupportedTask("string_match: fuzzy_match needs an LLM judge (not supported)")
        elif kind == "program_html":
            for target in evaluation.get("program_html") or []:
                if str(target.get("url", "")).startswith("func:") or str(target.get("locator", "")).startswith("func:"):
                    raise UnsupportedTask("program_html: func: targets are not supported")
        elif kind != "url_match":
            raise UnsupportedTask(f"unknown eval type {kind!r}")


def evaluate_task(task: Task, answer: str, page: Any) -> float:
    """A WebArena task's score: the product of its ``eval_types`` on the answer and the final page."""
    evaluation = task.goal.get("eval") or {}
    check_supported(evaluation)
    score = 1.0
    for kind in evaluation["eval_types"]:
        if kind == "string_match":
            score *= string_match(evaluation.get("reference_answers") or {}, answer)
        elif kind == "url_match":
            score *= url_match(str(evaluation.get("reference_url", "")), page.url,
                               str(evaluation.get("url_note") or "GOLD in PRED"))
        else:
            score *= program_html(list(evaluation.get("program_html") or []), page)
    return score


def _substitute(value: Any, url_map: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for key, url in url_map.items():
            value = value.replace(key, url.rstrip("/"))
        return value
    if isinstance(value, list):
        return [_substitute(v, url_map) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, url_map) for k, v in value.items()}
    return value


def _normalise_map(url_map: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, url in url_map.items():
        name = key.strip("_").upper()
        out[f"__{name}__"] = str(url)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))  # __SHOPPING_ADMIN__ before __SHOPPING__


def load_tasks(path: str | Path, url_map: Mapping[str, str] | None = None) -> dict[str, list[Task]]:
    """WebArena tasks by split from a JSON file (a task or a list) or a directory of them; unsupported ones are
    skipped and logged. A bad file, a task without ``intent``/``eval`` or an unmapped placeholder is a one-line
    ``ValueError``."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"webarena tasks: {root}: no such file or directory")
    files = sorted(root.glob("*.json"), key=lambda p: (len(p.stem), p.stem)) if root.is_dir() else [root]
    mapping = _normalise_map(url_map or {})
    out: dict[str, list[Task]] = defaultdict(list)
    skipped = 0
    for file in files:
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"webarena tasks: {file}: not a JSON task file ({e})") from None
        for raw in data if isinstance(data, list) else [data]:
            if not isinstance(raw, dict) or "intent" not in raw or not isinstance(raw.get("eval"), dict):
                raise ValueError(f"webarena tasks: {file}: a task needs 'intent' and 'eval' (WebArena's format)")
            item = _substitute(raw, mapping)
            try:
                check_supported(item["eval"])
            except UnsupportedTask as e:
                skipped += 1
                log.warning("webarena task %s skipped: %s", raw.get("task_id"), e)
                continue
            text = json.dumps(item)
            left = [p for p in SITE_PLACEHOLDERS if p in text]
            if left:
                raise ValueError(f"webarena tasks: {file}: task {raw.get('task_id')} uses {left[0]}; "
                                 f"map it with url_map={{{left[0].strip('_')}: http://...}}")
            storage = item.get("storage_state")
            if storage:
                candidate = Path(storage) if Path(storage).is_absolute() else file.parent / storage
                storage = str(candidate) if candidate.is_file() else None
            goal = {"start_url": item.get("start_url", ""), "eval": item["eval"], "sites": item.get("sites", []),
                    "storage_state": storage}
            split = str(item.get("split", "test"))
            out[split].append(Task(task_id=f"webarena-{item.get('task_id', len(out[split]))}", env="browser",
                                   instruction=str(item["intent"]), goal=goal))
    if skipped:
        log.warning("webarena tasks: %d of the tasks in %s skipped (unsupported evaluators)", skipped, root)
    return dict(out)
