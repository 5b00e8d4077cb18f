"""The DreamGym pipeline on any registered env (the built-in shop by default), stage by stage, each cached in
the run directory.

    collect offline data → annotate (rule) → train M_exp → [fidelity of M_exp] → SFT warm start → GRPO-real
    → DreamGym (dream GRPO) → DreamGym-S2R → Table 1 (table.json) + success-vs-real-transitions plot

Each stage records a cache key (:func:`stage_keys`: the config fields it reads and the keys of the stages it
takes outputs from) in its marker, ``RUN/stages/<stage>.json``. A rerun reuses a stage whose key matches,
refuses one made under another key (the error names the field that differs), and with ``force`` redoes it and
the stages that depend on it; an interrupted stage resumes from its own checkpoint (under the same key only).
Every number in the table is measured here, on the env's held-out test tasks, with the real transitions each
method consumed (offline data counted apart, as in the paper). The optional fidelity stage
(``heldout_episodes > 0``) scores M_exp on noisy-oracle episodes of the test tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from dreamgym.software import software
from dreamgym.types import read_yaml_mapping

if TYPE_CHECKING:
    from dreamgym.envs import ScriptedPolicy, TextEnv
    from dreamgym.rl.config import RLConfig

console = Console(stderr=True)

# What an env needs when the config does not say; its EnvSpec's demo_defaults override these (the shop's give
# its catalog size, the search[<instruction>] prompt option, rule task variations and an exp_mixture).
ENV_DEFAULTS: dict[str, Any] = {
    "env_kwargs": {},
    "policy": {"action_format": "index", "offer_task_search": False},
    "dream": {"task_generator": "none", "synthetic_share": 0.0},
    "exp_mixture": None,
    "extra_behaviour": [],
}


def env_defaults(env: str) -> dict[str, Any]:
    """:data:`ENV_DEFAULTS` with ``env``'s :attr:`EnvSpec.demo_defaults` over them."""
    from dreamgym.envs import find_spec

    env_spec = find_spec(env)
    return {**ENV_DEFAULTS, **(dict(env_spec.demo_defaults) if env_spec is not None else {})}


# The fidelity figures kept in table.json and printed under the table (all of them: RUN/fidelity.json).
# Each accuracy is followed by its trivial baseline (always the most common real value); rewards within 0.1.
FIDELITY_KEYS = ("transitions", "reward_accuracy", "reward_majority_baseline", "terminal_reward_accuracy",
                 "terminal_reward_majority_baseline", "terminal_reward_exact_accuracy",
                 "terminal_reward_exact_majority_baseline", "done_accuracy", "done_majority_baseline",
                 "invalid_output_rate", "next_state_f1", "epsilon_r_terminal", "epsilon_p", "reasoning_exact",
                 "click_consistency", "item_options_consistency", "reward_consistency",
                 "purchase_page_consistency")


# The table's rows (``DemoConfig.rows``, ``dreamgym bench --rows``): the demo's four and optional ones, each an RL
# (or ablation) stage of its own: PPO in the real env, the dream with PPO, and three DreamGym ablations on their own
# M_exp or curriculum: no_replay (exp_protocol k=0: no retrieved demonstrations), no_reasoning (M_exp trained without
# <think> traces: ProtocolConfig.reasoning False) and no_task_generator (curriculum task_generator none).
ROWS: dict[str, str] = {"sft": "SFT", "grpo_real": "GRPO (real)", "ppo_real": "PPO (real)", "dreamgym": "DreamGym",
                        "dreamgym_ppo": "DreamGym (PPO)", "s2r": "DreamGym-S2R", "no_replay": "DreamGym w/o replay",
                        "no_reasoning": "DreamGym w/o reasoning", "no_task_generator": "DreamGym w/o task generator"}
DEFAULT_ROWS = ("sft", "grpo_real", "dreamgym", "s2r")
# the rows that take one component out of DreamGym; the bench compares each with the dreamgym row, task by task
ABLATION_ROWS = ("no_replay", "no_reasoning", "no_task_generator")
# the stages a row's stage takes outputs from besides sft (S2R continues DreamGym within GRPO-real's budget)
ROW_NEEDS: dict[str, tuple[str, ...]] = {"s2r": ("grpo_real", "dreamgym"), "no_replay": ("train_exp_no_replay",),
                                         "no_reasoning": ("train_exp_no_reasoning",)}
# the ablations' M_exp: exp_protocol fields over the config's
ABLATION_PROTOCOL: dict[str, dict[str, Any]] = {"train_exp_no_replay": {"k": 0},
                                                "train_exp_no_reasoning": {"reasoning": False}}


def parse_rows(rows: str | Sequence[str]) -> tuple[str, ...]:
    """``"sft,grpo_real"`` (or a list) -> the row names, checked against :data:`ROWS` (a one-line ValueError)."""
    names = [r.strip() for r in (rows.split(",") if isinstance(rows, str) else rows)]
    names = [r for r in names if r]
    if not names:
        raise ValueError(f"no rows given; choose from {', '.join(ROWS)}")
    for r in names:
        if r not in ROWS:
            raise ValueError(f"unknown row {r!r}; choose from {', '.join(ROWS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a row is given twice: {','.join(names)}")
    return tuple(names)


class Behaviour(BaseModel):
    """More offline episodes for the experience model from another behaviour policy (by default the env's noisy
    oracle at ``noise``; see :attr:`DemoConfig.extra_behaviour`), ``share`` x ``offline_episodes`` of them."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(gt=0, le=10, description="episodes, as a share of offline_episodes")
    noise: float = Field(ge=0, le=1, description="the noisy oracle's random-step rate")
    policy: str = Field(default="noisy", description="the env's scripted policy (e.g. TextWorld's 'hasty': the "
                        "noisy oracle that also prepares the meal too soon)")
    options: dict[str, float] = Field(default_factory=dict, description="more arguments of the policy (e.g. "
                                      "{early: 0.3, swap: 0.3} for TextWorld's hasty policy)")

    def episodes(self, offline_episodes: int) -> int:
        return max(1, round(self.share * offline_episodes))


class DemoConfig(BaseModel):
    """All the demo's knobs; ``PROFILES`` holds the presets (``--profile``), ``--config``/``--set`` override fields.
    ``env_kwargs``, ``policy``, ``dream``, ``exp_mixture`` and ``extra_behaviour`` default per env
    (:func:`env_defaults`); dict fields
    are replaced whole, not merged."""

    model_config = ConfigDict(extra="forbid")

    env: str = "shop"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    offline_episodes: int = 3000
    offline_file: Path | None = Field(default=None, description="your own offline trajectories (JSONL/Parquet) "
                                      "instead of collecting offline_episodes")
    collect_policy: str | None = Field(default=None, description="the scripted policy that collects the offline "
                                       "and held-out data (None: 'noisy' where the env has one, else 'random')")
    annotator: Literal["rule", "diff", "llm"] | None = Field(
        default=None, description="who writes the reasoning traces: rule (the env's explainer), diff (any env: "
        "what each action changed), llm (a teacher, annotator_llm); None: rule where the env has an explainer, "
        "else diff")
    annotator_llm: dict[str, Any] | None = Field(default=None, description="the teacher's LLMConfig fields "
                                                 "(annotator llm)")
    annotator_options: dict[str, Any] = Field(default_factory=dict, description="keywords for the env's rule "
                                              "explainer (annotator rule), e.g. TextWorld's {recipe: true}")
    noise: float = 0.3
    extra_behaviour: list[Behaviour] = Field(default_factory=list, description="more offline episodes from "
        "noisier behaviour policies, for the experience model (and its replay buffer) only: the failures a policy in "
        "training makes, which mostly-right offline data barely shows (the policy's SFT clones offline.jsonl alone); "
        "not collected when offline_file is given. The env's EnvSpec may give a default (the shop's: one at noise 0.8)")
    eval_episodes: int = 200
    max_steps: int = Field(default=15, ge=1, description="SFT evaluation episode length (RL: rl.max_steps)")
    eval_num_envs: int = Field(default=64, ge=1, description="env instances of the SFT evaluation (a JVM each "
                               "for ScienceWorld)")
    heldout_episodes: int = Field(default=60, ge=0, description="test-split noisy-oracle episodes the fidelity "
                                  "stage scores M_exp on (0: no fidelity stage)")
    heldout_noise: float = Field(default=0.5, ge=0, le=1, description="the held-out collection's noise: more "
                                 "imperfect purchases than the offline data, so a terminal reward is not nearly always 1")
    # experience model
    # the shipped pre-trained base (128 hidden x 4 layers, ~1.3M params; dreamgym.llm.pretrained): it brings the
    # protocol's format, the done flag and non-terminal rewards, not yet copying (benchmarks/pretrained_base.py,
    # README); "128x4" trains the same shape from scratch
    exp_model: str = "pretrained"
    # copy_refs: M_exp points at the prompt text a next state repeats (dreamgym.experience.copyrefs); measured on the
    # shop from the base at 150 steps: click consistency 0.00 -> 1.00 (benchmarks/results/pretrained_base_exp_refs.json).
    # exact_neighbours: M_exp learns to use a neighbour that is the very step recorded before; on the shop's train
    # tasks the dream's pages then replay in the real shop (benchmarks/results/exact_neighbours.json)
    exp_protocol: dict[str, Any] = Field(default_factory=lambda: {"k": 1, "neighbour_states": False,
                                                                  "system_prompt": "", "history_window": 2,
                                                                  "ground_action": True, "copy_refs": True,
                                                                  "exact_neighbours": True})
    exp_sft: dict[str, Any] = Field(
        default_factory=lambda: {"epochs": 3, "max_steps": 150, "learning_rate": 2e-3, "batch_size": 16,
                                 "max_length": 768, "time_budget_s": 14400, "num_threads": 2},
        description="SFTConfig fields of M_exp's training, budgeted in steps (max_steps, else epochs) so that a seed "
        "gives the same model on any machine. 150 steps of 16 (0.15 epoch, ~4.5 min on 2 cores) is the budget the "
        "pre-trained base was measured at with copy references (click consistency 1.00; "
        "benchmarks/results/pretrained_base_exp_refs_whole.json) and keeps the default demo near 30 min; "
        "time_budget_s is only a safety cap (train_exp.json's time_cap_fired says whether it cut the schedule short)")
    exp_reward_head: bool = Field(default=False, description="the reward of the steps M_exp ends from a reward head "
                                  "fitted on the offline data's real endings (dreamgym.experience.reward_head)")
    exp_reserve_prompt: bool = Field(
        default=True, description="M_exp served the prompt layout it was trained on: its prompts fitted to "
        "ExperienceConfig.prompt_budget (the trained length minus the median target, leaving the 0.99 quantile of the "
        "targets room to answer) when served and at most that in SFT; false: the rule of the benches made before "
        "2026-12-06 (served prompts fitted to the context minus the longest answer, so that on the shop a third of "
        "them lost their neighbour)")
    exp_mixture: dict[str, float] | None = Field(default=None, description="examples per transition by the page "
                                                 "type of its next state, a terminal one's outcome apart if given "
                                                 "(done:failure; None = each once; the shop's EnvSpec gives one)")
    # policy: the same pre-trained base ("micro" is the former from-scratch default)
    policy_model: str = "pretrained"
    policy: dict[str, Any] = Field(default_factory=dict, description="PolicyConfig fields")
    sft: dict[str, Any] = Field(
        default_factory=lambda: {"epochs": 2, "max_steps": 125, "learning_rate": 3e-3, "batch_size": 32,
                                 "max_length": 768, "time_budget_s": 14400, "num_threads": 2},
        description="SFTConfig fields of the policy's warm start, budgeted in steps (max_steps, else epochs): 125 "
        "steps of 32, the budget behaviour cloning from the base was measured at (0.26 test success, 3 seeds; "
        "benchmarks/results/pretrained_base_policy_byname.json; ~5 min on 2 cores); max_length 768 holds the shop's "
        "longest agent prompts (627 tokens; at 512, 23% lost their start, the task); time_budget_s is only a "
        "safety cap (sft.json's time_cap_fired says whether it fired)")
    bc_decision_repeat: int = Field(default=1, ge=1, description="the SFT warm start clones each decision step "
                                    "(EnvSpec.decision_step: the shop's option clicks) this many times; 6 with 2,500 "
                                    "steps of 16 (~24 min on 2 cores) gives the shop a policy that matches the task's "
                                    "options (benchmarks/bc_options.py, README), too long for the demo's budget")
    bc_on_path: bool = Field(default=False, description="the SFT warm start clones each trajectory only up to its "
                             "first detour, not the oracle's recoveries from the noise (bc_examples' on_path_only); "
                             "with bc_decision_repeat 6 and 2,500 steps of 16, the shop's policy reaches 0.435 on "
                             "test (3 seeds, benchmarks/bc_options.py --on-path, README); the demo keeps False, "
                             "unmeasured at its budget")
    bc_final_repeat: int = Field(default=1, ge=1, description="the SFT warm start clones the step that ends each "
                                 "trajectory (the shop: the purchase) this many times (bc_examples' final_repeat); "
                                 "with the options x12 from pretrained-policy, the purchase cloned once is so rare "
                                 "that a quarter of the val episodes never buy")
    bc_extra: bool = Field(default=False, description="the SFT warm start also clones the extra behaviours' episodes "
                           "(extra_behaviour; otherwise M_exp's data only), under the same rules: with bc_on_path "
                           "false, TextWorld's hasty episodes show the oracle's answer to a refused 'prepare meal'; "
                           "on val (seed 0) success fell to 0.060 from 0.320 without them, and the refusals were "
                           "repeated as often (journal, session 30)")
    # RL: the settings that raised the real shop's success on 3 of 3 seeds (benchmarks/results/shop_rl.json)
    rl: dict[str, Any] = Field(default_factory=lambda: {"iterations": 6, "tasks_per_iter": 8, "group_size": 8,
                                                        "lr": 1e-4, "normalize_std": False, "turn_weighting": "episode",
                                                        "eval_every": 3, "num_threads": 2})
    dream: dict[str, Any] = Field(default_factory=dict, description="DreamConfig and CurriculumConfig fields")
    dream_iterations: int = 6
    s2r_share: float = Field(default=0.1, gt=0, le=1, description="S2R budget / GRPO-real's real transitions "
                             "(a strict budget: S2R stops before a group could exceed it)")
    rows: list[str] = Field(default_factory=lambda: list(DEFAULT_ROWS), description="the table's rows (ROWS): the demo's four by "
                                  "default; a row's stage runs with the stages it needs (s2r: grpo_real, dreamgym)")

    @model_validator(mode="after")
    def _check_rows(self) -> DemoConfig:
        self.rows = list(parse_rows(self.rows))
        if self.bc_extra and not (self.extra_behaviour and self.offline_file is None):
            raise ValueError("bc_extra clones the extra behaviours' episodes: it needs extra_behaviour and no "
                             "offline_file")
        return self

    @model_validator(mode="before")
    @classmethod
    def _env_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            defaults = env_defaults(str(data.get("env", "shop")))
            data = {**{k: v for k, v in defaults.items() if k not in data}, **data}
        return data


PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "micro": {
        "offline_episodes": 60, "eval_episodes": 20, "heldout_episodes": 4,
        "exp_model": "micro", "exp_sft": {"epochs": 1, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 2},
        "policy_model": "micro", "sft": {"epochs": 2, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 2},
        "rl": {"iterations": 2, "tasks_per_iter": 2, "group_size": 2, "eval_every": 0, "num_threads": 2,
               "max_steps": 6, "minibatch_size": 32},
        "dream": {"synthetic_share": 0.5, "max_new_tokens": 48},  # merged over the env's (the shop's: rule tasks)
        "dream_iterations": 2,
        # GRPO-real uses only ~40 real transitions here: 10% of that is less than one S2R group (2 x 6 steps),
        # and the S2R budget is strict (never exceeded), so the micro S2R may use as many as GRPO did
        "s2r_share": 1.0,
    },
}


# A profile's fields for the shop only (the env they were measured on), over PROFILES': its catalog size, and on the
# micro profile a policy cloned from the shipped base (40 steps of 16, ~2 epochs of the 60 episodes' steps), where
# the micro model's success was 0 in every row
SHOP_PROFILES: dict[str, dict[str, Any]] = {
    "micro": {"env_kwargs": {"num_products": 100}, "policy_model": "pretrained",
              "sft": {"epochs": 5, "max_steps": 40, "learning_rate": 3e-3, "batch_size": 16, "max_length": 768,
                      "num_threads": 2}},
}


def demo_config(profile: str, overrides: dict[str, Any] | None = None, config: Path | None = None) -> DemoConfig:
    """The profile's fields, then the YAML ``config`` file's, then ``overrides``, each replacing whole fields; only
    a profile's ``dream`` and ``policy`` sizes are merged over the env's defaults (:func:`env_defaults`), and its
    ``rl`` sizes over the default RL settings."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    from_file: dict[str, Any] = {}
    if config is not None:
        from_file = read_yaml_mapping(config, "demo config")
    given = {**from_file, **(overrides or {})}
    env = str(given.get("env", "shop"))
    defaults = env_defaults(env)
    profile_fields = {**PROFILES[profile], **(SHOP_PROFILES.get(profile, {}) if env == "shop" else {})}
    for key in ("dream", "policy"):  # a profile's sizes go over the env's defaults of these fields
        if key in profile_fields:
            profile_fields[key] = {**defaults[key], **profile_fields[key]}
    if "rl" in profile_fields:  # and its RL sizes over the default RL settings (lr, advantage normalisation, ...)
        default_rl = DemoConfig.model_fields["rl"].get_default(call_default_factory=True)
        profile_fields["rl"] = {**default_rl, **profile_fields["rl"]}
    fields = {**profile_fields, **given}
    return DemoConfig.model_validate(fields)


class Stage(NamedTuple):
    """A demo stage for its cache key: what it is called, the DemoConfig fields it reads, the stages whose
    outputs it takes (their keys stand in for their content) and its outputs in the run dir (what ``--force``
    deletes before redoing it)."""

    title: str
    fields: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


# In pipeline order; each stage's marker is RUN/stages/<name>.json. A field read through an input stage (env, seed)
# is in that stage's key already. EXP_FIELDS: what an M_exp stage reads.
EXP_FIELDS = ("exp_model", "exp_protocol", "exp_sft", "exp_mixture", "exp_reward_head", "exp_reserve_prompt")
STAGES: dict[str, Stage] = {
    "collect": Stage("collect offline data", ("env", "env_kwargs", "seed", "offline_episodes", "offline_file",
                                              "collect_policy", "noise"), (), ("offline.jsonl",)),
    # M_exp's data, and the policy's SFT's with bc_extra only: without it SFT does not wait on (or redo for) it
    "collect_extra": Stage("collect the extra behaviours' episodes", ("extra_behaviour",), ("collect",),
                           ("offline_extra",)),
    "annotate": Stage("annotate reasoning", ("annotator", "annotator_llm", "annotator_options"),
                      ("collect", "collect_extra"),
                      ("offline_annotated.jsonl",)),
    "train_exp": Stage("train the experience model", EXP_FIELDS,
                       ("annotate",), ("experience_model", "buffer", "buffer.partial")),
    "fidelity": Stage("fidelity of the experience model", ("heldout_episodes", "heldout_noise"), ("train_exp",),
                      ("heldout.jsonl", "heldout_annotated.jsonl", "fidelity.json")),
    "sft": Stage("SFT warm start", ("policy_model", "policy", "sft", "bc_decision_repeat", "bc_on_path", "bc_final_repeat",
                                    "bc_extra", "eval_episodes", "max_steps", "eval_num_envs"),
                 ("collect", "collect_extra"), ("sft",)),
    "grpo_real": Stage("GRPO in the real env", ("rl",), ("sft",), ("grpo_real",)),
    "dreamgym": Stage("DreamGym", ("rl", "dream", "dream_iterations"), ("sft", "train_exp"),
                      ("dreamgym", "dream_buffer", "dream_buffer.partial")),
    "s2r": Stage("DreamGym-S2R", ("s2r_share",), ("dreamgym", "grpo_real"), ("s2r",)),
    # optional rows (DemoConfig.rows) and the ablations' own experience models
    "ppo_real": Stage("PPO in the real env", ("rl",), ("sft",), ("ppo_real",)),
    "dreamgym_ppo": Stage("DreamGym (PPO)", ("rl", "dream", "dream_iterations"), ("sft", "train_exp"),
                          ("dreamgym_ppo", "dream_buffer_ppo", "dream_buffer_ppo.partial")),
    "train_exp_no_replay": Stage("M_exp without replay (k=0)", EXP_FIELDS,
                                 ("annotate",), ("experience_model_no_replay", "buffer_no_replay",
                                                 "buffer_no_replay.partial")),
    "no_replay": Stage("DreamGym w/o replay", ("rl", "dream", "dream_iterations"), ("sft", "train_exp_no_replay"),
                       ("no_replay", "dream_buffer_no_replay", "dream_buffer_no_replay.partial")),
    "train_exp_no_reasoning": Stage("M_exp without reasoning", EXP_FIELDS,
                                    ("annotate",), ("experience_model_no_reasoning", "buffer_no_reasoning",
                                                    "buffer_no_reasoning.partial")),
    "no_reasoning": Stage("DreamGym w/o reasoning", ("rl", "dream", "dream_iterations"),
                          ("sft", "train_exp_no_reasoning"),
                          ("no_reasoning", "dream_buffer_no_reasoning", "dream_buffer_no_reasoning.partial")),
    "no_task_generator": Stage("DreamGym w/o task generator", ("rl", "dream", "dream_iterations"), ("sft", "train_exp"),
                               ("no_task_generator", "dream_buffer_no_task_generator",
                                "dream_buffer_no_task_generator.partial")),
}


def stage_inputs(cfg: DemoConfig, name: str) -> tuple[str, ...]:
    """The stages whose outputs stage ``name`` reads under ``cfg``: its :data:`STAGES` ``inputs``, less
    collect_extra for an SFT without ``bc_extra`` (which clones offline.jsonl only)."""
    inputs = STAGES[name].inputs
    return tuple(s for s in inputs if s != "collect_extra") if name == "sft" and not cfg.bc_extra else inputs


def extra_files(cfg: DemoConfig, out: Path) -> list[Path]:
    """The extra behaviours' episodes of run dir ``out`` (M_exp's data; SFT's with ``bc_extra``), one file each; none
    with the user's own ``offline_file``."""
    return [out / "offline_extra" / f"{i}.jsonl" for i in range(len(cfg.extra_behaviour))] \
        if cfg.offline_file is None else []


def active_stages(cfg: DemoConfig) -> list[str]:
    """The stages ``cfg`` runs, in :data:`STAGES` order: sft, the rows' stages, fidelity (when ``heldout_episodes``)
    and every stage these take outputs from (:data:`ROW_NEEDS`, each stage's ``inputs``), so that rows without a
    dream (``--rows sft,grpo_real``) train no M_exp. collect_extra runs only with ``extra_behaviour`` and no
    ``offline_file``."""
    wanted: set[str] = set()
    todo = ["sft", *cfg.rows, *(["fidelity"] if cfg.heldout_episodes else [])]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [*stage_inputs(cfg, name), *ROW_NEEDS.get(name, ())]
    if not (cfg.extra_behaviour and cfg.offline_file is None):
        wanted.discard("collect_extra")
    return [name for name in STAGES if name in wanted]


# Fields added after benches were committed, with the value that does what the code did before them: at that
# value a field is left out of its stage's key, so the committed benches' stages stay reusable (and a seed's rerun
# can still reproduce them); any other value is in the key like every field.
LATE_FIELDS: dict[str, Any] = {"bc_final_repeat": 1, "bc_extra": False, "exp_reward_head": False, "exp_reserve_prompt": False,
                               "annotator_options": {}}
# Until session 20 one stage collected offline.jsonl and the extra behaviours' episodes: collect's key keeps the
# value most runs had then, so that their collect and SFT stages stay reusable.
FROZEN_FIELDS: dict[str, dict[str, Any]] = {"collect": {"extra_behaviour": []}}


def stage_keys(cfg: DemoConfig) -> dict[str, dict[str, Any]]:
    """Each stage's cache key: ``inputs``, the values of the :data:`STAGES` fields it reads (dicts flattened to
    ``field.key``; an ``offline_file`` by its sha256, not its path) and ``stage <name>``, the hash of each input
    stage's key (an input stage that ``cfg`` does not run, :func:`active_stages`, is left out); and ``hash``, a
    hash of those inputs. A change upstream thus changes every key downstream."""
    values = {**cfg.model_dump(mode="json"), "annotator": annotator_name(cfg)}
    if cfg.offline_file is not None:
        values["offline_file"] = "sha256:" + hashlib.sha256(cfg.offline_file.read_bytes()).hexdigest()
    # the one input that may not run whatever the rows (not by the rows: a stage's key never depends on them)
    skipped = set() if cfg.extra_behaviour and cfg.offline_file is None else {"collect_extra"}
    keys: dict[str, dict[str, Any]] = {}
    for name, stage in STAGES.items():
        inputs = _flatten({f: values[f] for f in stage.fields if f not in LATE_FIELDS or values[f] != LATE_FIELDS[f]})
        inputs.update(_flatten(FROZEN_FIELDS.get(name, {})))
        inputs.update({f"stage {s}": keys[s]["hash"] for s in stage_inputs(cfg, name) if s not in skipped})
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
        keys[name] = {"hash": digest, "inputs": inputs}
    return keys


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in values.items():
        flat.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return flat


def _stale(marker: Path, key: dict[str, Any]) -> str | None:
    """Why the stage of ``marker`` (finished, or begun: ``<stage>.started.json``) cannot be reused under ``key``;
    None when it can or nothing of it is there."""
    started = marker.with_suffix(".started.json")
    found = marker if marker.exists() else started if started.exists() else None
    if found is None:
        return None
    title = STAGES[marker.stem].title if marker.stem in STAGES else marker.stem
    old = json.loads(found.read_text()).get("cache_key")
    if old is None:
        return f"stage {title!r} ({found}) was made by an older dreamgym that did not record its config (no cache_key)"
    if old["hash"] == key["hash"]:
        return None
    was, now = old.get("inputs", {}), key["inputs"]

    def show(inputs: dict[str, Any], k: str) -> str:
        return json.dumps(inputs[k]) if k in inputs else "no such field"

    diffs = [f"the output of another {STAGES[k[6:]].title!r} stage" if k.startswith("stage ") and k[6:] in STAGES
             else f"{k}={show(was, k)}, this config has {show(now, k)}"
             for k in sorted({*was, *now}) if was.get(k, ...) != now.get(k, ...)]
    return f"stage {title!r} was made with " + ("; ".join(diffs) or f"cache key {old['hash']}, this config's is "
                                                f"{key['hash']}")


FORCE_HINT = "rerun with --force to redo it and the stages that depend on it"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _stage(name: str, marker: Path, run: Callable[[], Any], key: dict[str, Any], force: bool = False,
           outputs: Sequence[Path] = ()) -> Any:
    """Run a stage unless its marker (a JSON result file) holds ``key``; return the JSON result (with its
    ``cache_key``). A stage made or begun under another key is a ValueError naming what differs; with ``force``
    its marker and ``outputs`` are deleted first and it reruns. ``name``: what the console shows."""
    stale = _stale(marker, key)
    if stale is not None:
        if not force:
            raise ValueError(f"{stale}; {FORCE_HINT}")
        console.print(f"[yellow]{stale}: redoing it (--force)[/yellow]")
        for path in (marker, *outputs):
            _remove(path)
    elif marker.exists():
        console.print(f"[dim]✓ {name} (cached: {marker})[/dim]")
        return json.loads(marker.read_text())
    console.rule(f"[bold]{name}")
    started = marker.with_suffix(".started.json")
    marker.parent.mkdir(parents=True, exist_ok=True)
    started.write_text(json.dumps({"cache_key": key}, indent=2))  # a rerun resumes this attempt only under key
    t0 = time.monotonic()
    result = run()
    result = {**result, "stage_seconds": round(time.monotonic() - t0, 1), "software": software(), "cache_key": key}
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2))
    os.replace(partial, marker)
    started.unlink()
    return result


def copy_dream_buffer(buffer: Path, dream_buffer: Path, run_dir: Path) -> bool:
    """Copy M_exp's ``buffer`` to ``dream_buffer``, where the dream row in ``run_dir`` adds its rollouts, unless the
    row resumes from a checkpoint (which hides the rows written after it). A copy left by an attempt killed before
    its first checkpoint holds that attempt's synthetic rows, which retrieval would read: it is replaced, and the
    console says so. Returns whether it copied."""
    if dream_buffer.exists():
        if (run_dir / "checkpoint").exists() or (run_dir / "checkpoint.old").exists():
            return False
        console.print(f"[yellow]{dream_buffer}: left by an attempt killed before its first checkpoint; copied afresh "
                      f"from {buffer}[/yellow]")
        _remove(dream_buffer)
    partial = dream_buffer.with_name(dream_buffer.name + ".partial")
    _remove(partial)
    shutil.copytree(buffer, partial)
    os.replace(partial, dream_buffer)
    return True


def collect_episodes(cfg: DemoConfig, path: Path, episodes: int, split: str, seed: int,
                     noise: float | None = None, behaviour: Behaviour | None = None) -> dict[str, Any]:
    """Append episodes of ``split`` to ``path`` until it holds ``episodes``, by ``behaviour``'s policy, else by
    :func:`collect_policy` (``noise``: default ``cfg.noise``); summarise the file."""
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make
    from dreamgym.types import JsonlWriter, read_jsonl

    have = sum(1 for _ in read_jsonl(path)) if path.exists() else 0
    if have < episodes:
        env = make(cfg.env, **cfg.env_kwargs)
        try:
            policy = (collect_policy(cfg, env, seed, cfg.noise if noise is None else noise) if behaviour is None
                      else env.scripted_policy(behaviour.policy, seed=seed, noise=behaviour.noise, **behaviour.options))
            with JsonlWriter(path) as w:
                for traj in iter_episodes(env, policy, episodes, split, seed, skip=have):
                    w.write(traj)
        finally:
            env.close()
    return summarize_file(path)


def collect_extra(cfg: DemoConfig, extra: Sequence[Path]) -> dict[str, Any]:
    """Each of ``cfg.extra_behaviour``'s episodes into its file of ``extra`` (train split, seeds of their own:
    ``seed + 1_000_000 x (i + 1)``); a summary of each (``extra``)."""
    summaries = []
    for i, (b, path) in enumerate(zip(cfg.extra_behaviour, extra, strict=True)):
        path.parent.mkdir(parents=True, exist_ok=True)
        summaries.append({"policy": b.policy, "noise": b.noise, **b.options, **collect_episodes(
            cfg, path, b.episodes(cfg.offline_episodes), "train", cfg.seed + 1_000_000 * (i + 1), behaviour=b)})
    return {"extra": summaries}


def collect_policy(cfg: DemoConfig, env: TextEnv, seed: int, noise: float) -> ScriptedPolicy:
    """``cfg.collect_policy``, else the env's ``noisy`` oracle (``noise`` random steps), else ``random``."""
    if cfg.collect_policy is not None:
        kwargs = {"noise": noise} if cfg.collect_policy == "noisy" else {}
        return env.scripted_policy(cfg.collect_policy, seed=seed, **kwargs)
    try:
        return env.scripted_policy("noisy", seed=seed, noise=noise)
    except ValueError:
        console.print(f"[yellow]{cfg.env} has no noisy oracle: collecting with the random policy[/yellow]")
        return env.scripted_policy("random", seed=seed)


def summarize_file(path: Path) -> dict[str, Any]:
    """Trajectories, transitions and success rate of a trajectory file (a one-line error when it is empty)."""
    from dreamgym.types import read_trajectories

    trajs = list(read_trajectories(path))
    if not trajs:
        raise ValueError(f"{path}: no trajectories")
    policies = sorted({t.policy or "unknown" for t in trajs})
    return {"trajectories": len(trajs), "transitions": sum(t.num_steps for t in trajs),
            "success_rate": sum(t.success for t in trajs) / len(trajs), "policies": policies}


def annotator_name(cfg: DemoConfig) -> str:
    """``cfg.annotator``, else ``rule`` where the env has an explainer, else ``diff``."""
    from dreamgym.envs import find_spec

    if cfg.annotator is not None:
        return cfg.annotator
    env_spec = find_spec(cfg.env)
    return "rule" if env_spec is not None and env_spec.explainer is not None else "diff"


def annotate(cfg: DemoConfig, sources: list[Path], target: Path) -> dict[str, Any]:
    from dreamgym.experience.annotate import (
        Annotator,
        DiffAnnotator,
        LLMAnnotator,
        RuleAnnotator,
        annotate_file,
    )

    name = annotator_name(cfg)
    if cfg.annotator_options and name != "rule":
        raise ValueError(f"annotator_options {cfg.annotator_options} are the rule explainer's; this run annotates "
                         f"with {name!r}")
    worker: Annotator
    if name == "llm":
        if not cfg.annotator_llm:
            raise ValueError("annotator llm needs annotator_llm: the teacher's LLMConfig fields (model, backend, ...)")
        from dreamgym.llm.base import LLMConfig
        from dreamgym.llm.load import load_llm

        llm_cfg = LLMConfig.model_validate(cfg.annotator_llm)
        worker = LLMAnnotator(load_llm(llm_cfg), name=f"llm:{llm_cfg.model}")
    else:
        worker = RuleAnnotator(options=cfg.annotator_options) if name == "rule" else DiffAnnotator()
    progress = annotate_file(sources, worker, target)
    return {"annotator": name, "written": progress.written, "skipped": progress.skipped, **progress.stats.as_dict()}


def fidelity(cfg: DemoConfig, out: Path, exp_dir: Path) -> dict[str, Any]:
    """M_exp's fidelity report (teacher-forced) on annotated held-out real episodes; the full one in fidelity.json."""
    import torch

    from dreamgym.experience.fidelity import evaluate_experience_model
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.types import read_trajectories

    heldout, annotated = out / "heldout.jsonl", out / "heldout_annotated.jsonl"
    data = collect_episodes(cfg, heldout, cfg.heldout_episodes, "test", cfg.seed + 1, noise=cfg.heldout_noise)
    annotate(cfg, [heldout], annotated)  # resumable: trajectories already annotated are skipped
    buffer = None
    if (out / "buffer").is_dir():
        from dreamgym.replay import ReplayBuffer

        buffer = ReplayBuffer.open(out / "buffer", create=False, read_only=True)
    torch.set_num_threads(int(cfg.exp_sft.get("num_threads") or 1))
    report = evaluate_experience_model(ExperienceModel.load(exp_dir, buffer=buffer), list(read_trajectories(annotated)),
                                       seed=cfg.seed, show=3)
    (out / "fidelity.json").write_text(json.dumps(report, indent=2))
    report["epsilon_r_terminal"] = (report.get("epsilon_r") or {}).get("terminal_quantile")
    return {"heldout": data, **{k: report.get(k) for k in FIDELITY_KEYS}}


def rl_config(cfg: DemoConfig, overrides: dict[str, Any]) -> RLConfig:
    """An RL row's config: the demo's ``rl`` settings, env, seed and evaluation, then ``overrides``."""
    from dreamgym.rl.config import RLConfig

    return RLConfig.model_validate({"max_steps": cfg.max_steps, **cfg.rl, "env": cfg.env, "env_kwargs": cfg.env_kwargs,
                                    "seed": cfg.seed, "eval_episodes": cfg.eval_episodes, **overrides})


def dream_overrides(cfg: DemoConfig, init: Path, model_dir: Path, buffer: Path, offline: Path,
                    curriculum_over: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """:func:`rl_config` overrides of a dream row: from policy ``init``, in the dream of M_exp ``model_dir`` retrieving
    from ``buffer``. The demo's ``dream`` holds DreamConfig's fields and the curriculum's (RLConfig.curriculum)."""
    from dreamgym.curriculum.config import CURRICULUM_FIELDS

    dream_cfg = {**{k: v for k, v in cfg.dream.items() if k not in CURRICULUM_FIELDS},
                 "experience_model": str(model_dir), "buffer": str(buffer), "offline_data": [str(offline)]}
    curriculum = {k: v for k, v in cfg.dream.items() if k in CURRICULUM_FIELDS}
    return {"init": str(init), "dream": dream_cfg, "curriculum": {**curriculum, **(curriculum_over or {})},
            "iterations": cfg.dream_iterations, **extra}


def run_demo(cfg: DemoConfig, out: Path, force: bool = False) -> list[dict[str, Any]]:
    """Run (or reuse, :func:`_stage`) every stage in ``out``; ``force``: redo the stages made under another config
    and those that depend on them, instead of refusing."""
    from dreamgym.agent.policy import PolicyConfig, load_policy
    from dreamgym.baselines.sft import train_bc
    from dreamgym.collect import summarize
    from dreamgym.envs.pool import env_factory
    from dreamgym.experience.protocol import ProtocolConfig
    from dreamgym.experience.train import train_experience_model
    from dreamgym.plots import plot_success_vs_real, plot_task_variance
    from dreamgym.report import write_report
    from dreamgym.rl.evaluate import EVAL_TASKS, run_eval_episodes, write_per_task
    from dreamgym.rl.trainer import train
    from dreamgym.sft import SFTConfig

    keys, active = stage_keys(cfg), active_stages(cfg)
    if not force:  # refuse before anything is written (demo_config.yaml included)
        for name in active:
            if stale := _stale(out / f"stages/{name}.json", keys[name]):
                raise ValueError(f"{stale}; {FORCE_HINT}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    env = cfg.env
    offline, annotated, exp_dir, sft_dir = out / "offline.jsonl", out / "offline_annotated.jsonl", out / "experience_model", out / "sft"
    extra = extra_files(cfg, out)
    total = len(active)
    numbered = iter(f"{i}/{total}" for i in range(1, total + 1))

    def stage(name: str, title: str, run: Callable[[], Any]) -> Any:
        outputs = [out / p for p in STAGES[name].outputs]
        if cfg.offline_file is not None:  # never the user's own data
            outputs = [p for p in outputs if p.resolve() != cfg.offline_file.resolve()]
        return _stage(f"{next(numbered)} {title}", out / f"stages/{name}.json", run, keys[name], force, outputs)

    if cfg.offline_file is not None:
        offline = cfg.offline_file
        data = stage("collect", f"offline data: {offline}", lambda: summarize_file(offline))
    else:
        data = stage("collect", "collect offline data", lambda: collect_episodes(cfg, offline, cfg.offline_episodes,
                                                                                 "train", cfg.seed))
    if "collect_extra" in active:
        stage("collect_extra", STAGES["collect_extra"].title, lambda: collect_extra(cfg, extra))
    if "annotate" in active:  # M_exp's data: not run for rows without a dream (nor fidelity)
        stage("annotate", f"annotate reasoning ({annotator_name(cfg)})",
              lambda: annotate(cfg, [offline, *extra], annotated))
    if "train_exp" in active:
        stage("train_exp", "train the experience model", lambda: train_experience_model(
            [annotated], cfg.exp_model, exp_dir, ProtocolConfig(**cfg.exp_protocol), SFTConfig(**cfg.exp_sft),
            buffer_dir=out / "buffer", mixture=cfg.exp_mixture, seed=cfg.seed, reward_head=cfg.exp_reward_head,
            reserve_prompt=cfg.exp_reserve_prompt))
    fid = None
    if cfg.heldout_episodes:
        fid = stage("fidelity", "fidelity of the experience model (held-out real transitions)",
                    lambda: fidelity(cfg, out, exp_dir))

    # Tiny policies answer option numbers (index actions); see dreamgym.agent.policy.
    policy_cfg = PolicyConfig(**cfg.policy)

    def sft() -> dict[str, Any]:
        if not (sft_dir / "summary.json").exists():
            train_bc([offline, *(extra if cfg.bc_extra else [])], cfg.policy_model, sft_dir, SFTConfig(**cfg.sft), policy_cfg,
                     decision_repeat=cfg.bc_decision_repeat, on_path_only=cfg.bc_on_path,
                     final_repeat=cfg.bc_final_repeat)
        t0 = time.monotonic()
        policy = load_policy(sft_dir)
        played = run_eval_episodes(policy, env_factory(env, **cfg.env_kwargs), "test", cfg.eval_episodes,
                                   seed=cfg.seed, max_steps=cfg.max_steps, num_envs=cfg.eval_num_envs)
        trajs = [e.to_trajectory(policy.name) for e in played]
        write_per_task(sft_dir / EVAL_TASKS, trajs, iteration=0, split="test", seed=cfg.seed)
        res = summarize(trajs)
        trained = json.loads((sft_dir / "summary.json").read_text())
        return {"method": "SFT", "real_transitions": 0, **res.to_dict(), "seconds": round(time.monotonic() - t0, 1),
                "train_steps": trained.get("steps"), "time_cap_fired": trained.get("time_cap_fired")}

    rows = [stage("sft", "SFT warm start (behaviour cloning)", sft)]  # the SFT policy starts every RL row

    def rl_stage(name: str, run_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
        rl_cfg = rl_config(cfg, overrides)
        resume = (run_dir / "checkpoint").exists() or (run_dir / "checkpoint.old").exists()
        s = train(rl_cfg, run_dir, resume=resume, console=console)
        return {"method": name, "real_transitions": s["real_transitions"], "episodes": s["eval_episodes"],
                "success_rate": s["success_rate"], "mean_reward": s["mean_reward"], "seconds": s["seconds"],
                "synthetic_transitions": s.get("synthetic_transitions", 0), "evals": s["evals"],
                "wm2real": s.get("wm2real")}

    by_row: dict[str, dict[str, Any]] = {"sft": rows[0]}
    if "grpo_real" in active:
        by_row["grpo_real"] = stage("grpo_real", f"GRPO in the real {env}",
                                    lambda: rl_stage(ROWS["grpo_real"], out / "grpo_real", {"init": str(sft_dir)}))
    if "ppo_real" in cfg.rows:
        by_row["ppo_real"] = stage("ppo_real", f"PPO in the real {env}", lambda: rl_stage(
            ROWS["ppo_real"], out / "ppo_real", {"init": str(sft_dir), "algo": "ppo"}))
    # the dream adds its rollouts to a copy of M_exp's buffer, so that M_exp's stage outputs stay as it made them
    def dream(row: str, exp: str = "", extra: dict[str, Any] | None = None,
              curriculum_over: dict[str, Any] | None = None) -> dict[str, Any]:
        """GRPO (or ``extra``'s algo) in the dream of M_exp ``experience_model{exp}`` into ``out/row``."""
        model_dir, buffer = out / f"experience_model{exp}", out / f"buffer{exp}"
        dream_buffer = out / ("dream_buffer" if row == "dreamgym" else f"dream_buffer_{row.removeprefix('dreamgym_')}")
        if buffer.is_dir():
            copy_dream_buffer(buffer, dream_buffer, out / row)
        return rl_stage(ROWS[row], out / row, dream_overrides(cfg, sft_dir, model_dir, dream_buffer, offline,
                                                             curriculum_over, **(extra or {})))

    def train_exp_ablation(name: str) -> None:
        suffix = name.removeprefix("train_exp")
        protocol = {**cfg.exp_protocol, **ABLATION_PROTOCOL[name]}
        stage(name, STAGES[name].title, lambda: train_experience_model(
            [annotated], cfg.exp_model, out / f"experience_model{suffix}", ProtocolConfig(**protocol),
            SFTConfig(**cfg.exp_sft), buffer_dir=out / f"buffer{suffix}", mixture=cfg.exp_mixture, seed=cfg.seed,
            reward_head=cfg.exp_reward_head, reserve_prompt=cfg.exp_reserve_prompt))

    if "dreamgym" in active:
        by_row["dreamgym"] = stage("dreamgym", "DreamGym: GRPO in the dream (0 real transitions)",
                                   lambda: dream("dreamgym"))
    if "s2r" in cfg.rows:
        budget = max(1, int(cfg.s2r_share * max(by_row["grpo_real"]["real_transitions"], 1)))
        by_row["s2r"] = stage("s2r", f"DreamGym-S2R: continue in the real {env}", lambda: rl_stage(
            ROWS["s2r"], out / "s2r", {"init": str(out / "dreamgym"), "real_transition_budget": budget,
                                       "strict_budget": True}))
    if "dreamgym_ppo" in cfg.rows:
        by_row["dreamgym_ppo"] = stage("dreamgym_ppo", "DreamGym with PPO (0 real transitions)",
                                       lambda: dream("dreamgym_ppo", extra={"algo": "ppo"}))
    if "no_replay" in cfg.rows:
        train_exp_ablation("train_exp_no_replay")
        by_row["no_replay"] = stage("no_replay", "DreamGym w/o replay (M_exp with k=0)",
                                    lambda: dream("no_replay", "_no_replay"))
    if "no_reasoning" in cfg.rows:
        train_exp_ablation("train_exp_no_reasoning")
        by_row["no_reasoning"] = stage("no_reasoning", "DreamGym w/o reasoning (M_exp without <think>)",
                                       lambda: dream("no_reasoning", "_no_reasoning"))
    if "no_task_generator" in cfg.rows:
        by_row["no_task_generator"] = stage("no_task_generator", "DreamGym w/o task generator", lambda: dream(
            "no_task_generator", curriculum_over={"task_generator": "none"}))
    rows = [{**by_row[r], "row": r} for r in cfg.rows]
    dreamgym = by_row.get("dreamgym") or {}
    # seconds: the whole stage (training + evaluation) as first run
    table = [{**{k: r[k] for k in ("method", "real_transitions", "success_rate", "mean_reward")},
              "seconds": r["stage_seconds"]} for r in rows]
    summary: dict[str, Any] = {"env": env, "env_kwargs": cfg.env_kwargs, "offline_data": data, "rows": table}
    if fid is not None:
        summary["fidelity"] = fid
    summary["wm2real"] = dreamgym.get("wm2real")  # the dream stage's last rollouts replayed in the real env
    (out / "table.json").write_text(json.dumps(summary, indent=2))
    plot_success_vs_real(rows, out / "success_vs_real.png", env)
    if (out / "dreamgym" / "metrics.jsonl").exists():
        plot_task_variance(out / "dreamgym" / "metrics.jsonl", out / "curriculum_variance.png")
    print_table(table, data, cfg, fid, summary["wm2real"])
    console.print(f"report: {write_report(out)}")  # RUN/report.html: the table, curves, fidelity, dreams
    return table


def print_table(table: list[dict[str, Any]], data: dict[str, Any], cfg: DemoConfig, fid: dict[str, Any] | None,
                wm2real: dict[str, Any] | None = None) -> None:
    size = ", ".join(f"{k}={v}" for k, v in cfg.env_kwargs.items())
    t = Table(title=f"DreamGym on {cfg.env} ({size}; offline data: {data['trajectories']} "
                    f"{'/'.join(data.get('policies') or ['?'])} trajectories, {data['transitions']} transitions)")
    for col in ("method", "real transitions (RL)", "success", "mean reward", "seconds"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in table:
        t.add_row(r["method"], str(r["real_transitions"]), f"{r['success_rate']:.3f}", f"{r['mean_reward']:.3f}",
                  f"{r['seconds']:.0f}")
    Console().print(t)
    if fid is not None:
        Console().print("M_exp fidelity on held-out real transitions: "
                        + ", ".join(f"{k} {v:.3f}" if isinstance(v := fid.get(k), float) else f"{k} {v}"
                                    for k in FIDELITY_KEYS)
                        + " (rewards within 0.1; *_baseline: always the most common real value)")
    if wm2real:
        Console().print(f"DreamGym's last dreamt episodes replayed in the real {cfg.env} (wm2real): "
                        f"{wm2real['episodes']} episodes, final reward agrees (within {wm2real['reward_tol']:g}) "
                        f"{wm2real['reward_agreement']}, success agrees {wm2real['success_agreement']}, "
                        f"{wm2real['diverged']} diverged, {wm2real['unreplayable']} unreplayable (tasks the real env lacks)")
