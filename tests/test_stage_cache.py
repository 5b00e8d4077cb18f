"""The demo's stage cache is keyed by config (issue 13): a stage is reused only under the key it was made with; a
stage made under another key (or by the old code, with no key) is refused with the field that differs, and
``force`` redoes it and the stages that depend on it, not the others. Fake stages: no training here (the real
demo's rerun is in tests/test_demo.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dreamgym.pipeline import (
    STAGES,
    DemoConfig,
    _stage,
    active_stages,
    collect_episodes,
    demo_config,
    run_demo,
    stage_keys,
)


def micro(**fields: Any) -> DemoConfig:
    return demo_config("micro", fields)


def run_fake_stages(out: Path, cfg: DemoConfig, force: bool = False) -> list[str]:
    """Every stage of :data:`STAGES` in order, each writing its first output; the names of those that ran."""
    keys, ran = stage_keys(cfg), []
    for name, spec in STAGES.items():
        def run(name: str = name, output: str = spec.outputs[0]) -> dict[str, Any]:
            ran.append(name)
            (out / output).write_text(name)
            return {"stage": name}

        _stage(name, out / f"stages/{name}.json", run, keys[name], force, [out / p for p in spec.outputs])
    return ran


def test_keys_follow_the_fields_and_stages_each_stage_depends_on(tmp_path: Path) -> None:
    base = stage_keys(micro())
    assert base == stage_keys(micro())  # deterministic
    assert base["train_exp"]["inputs"]["exp_sft.epochs"] == 1 and base["train_exp"]["inputs"]["stage annotate"]
    changed = stage_keys(micro(exp_sft={**micro().exp_sft, "epochs": 2}))
    # M_exp's stage and those downstream of it, the optional rows' and ablations' included (the ablations train
    # their own M_exp under the same exp_sft)
    downstream = ["train_exp", "fidelity", "dreamgym", "s2r", "dreamgym_ppo", "train_exp_no_replay", "no_replay",
                  "train_exp_no_reasoning", "no_reasoning", "no_task_generator"]
    assert {s for s in STAGES if changed[s]["hash"] != base[s]["hash"]} == set(downstream)
    changed = stage_keys(micro(bc_decision_repeat=6))  # the policy's warm start and the RL rows after it, not M_exp
    moved = {s for s in STAGES if changed[s]["hash"] != base[s]["hash"]}
    assert {"sft", "grpo_real", "dreamgym", "s2r"} <= moved and not moved & {"collect", "train_exp", "fidelity"}
    assert changed["sft"]["inputs"]["bc_decision_repeat"] == 6
    changed = stage_keys(micro(bc_on_path=True))
    assert {s for s in STAGES if changed[s]["hash"] != base[s]["hash"]} == moved  # the same stages
    # a field added after benches were committed: at the value that does what the code did before, it is not in
    # the key (those benches' stages stay reusable); at any other value it is
    assert "bc_final_repeat" not in base["sft"]["inputs"]
    changed = stage_keys(micro(bc_final_repeat=12))
    assert {s for s in STAGES if changed[s]["hash"] != base[s]["hash"]} == moved
    assert changed["sft"]["inputs"]["bc_final_repeat"] == 12
    # the prompt reserve (default on) is in every M_exp stage's key; off, as the committed benches ran, it is not
    assert base["train_exp"]["inputs"]["exp_reserve_prompt"] is True
    before = stage_keys(micro(exp_reserve_prompt=False))
    assert "exp_reserve_prompt" not in before["train_exp"]["inputs"]
    assert {s for s in STAGES if before[s]["hash"] != base[s]["hash"]} == set(downstream)
    # the rule explainer's options (none by default, as before the field) are the annotation's and all after it
    assert "annotator_options" not in base["annotate"]["inputs"]
    changed = stage_keys(micro(annotator_options={"recipe": True}))
    assert changed["annotate"]["inputs"]["annotator_options.recipe"] is True
    assert {s for s in STAGES if changed[s]["hash"] != base[s]["hash"]} == {"annotate", *downstream}
    changed = stage_keys(micro(seed=1))  # read by the first stage: every key changes
    assert all(changed[s]["hash"] != base[s]["hash"] for s in STAGES)
    data = tmp_path / "own.jsonl"
    data.write_text("a\n")
    own = stage_keys(micro(offline_file=data))
    assert own["collect"]["inputs"]["offline_file"].startswith("sha256:")
    data.write_text("b\n")  # the file's content, not its name, is in the key
    assert stage_keys(micro(offline_file=data))["collect"]["hash"] != own["collect"]["hash"]


def test_reuse_refuse_and_force_redo_only_the_dependent_stages(tmp_path: Path) -> None:
    assert run_fake_stages(tmp_path, micro()) == list(STAGES)
    assert run_fake_stages(tmp_path, micro()) == []  # the same config: all reused
    marker = json.loads((tmp_path / "stages/train_exp.json").read_text())
    assert marker["cache_key"] == stage_keys(micro())["train_exp"] and "stage_seconds" in marker
    (tmp_path / "experience_model").unlink()
    (tmp_path / "experience_model").mkdir()
    (tmp_path / "experience_model" / "stale.bin").write_text("old weights")
    two = micro(exp_sft={**micro().exp_sft, "epochs": 2})
    with pytest.raises(ValueError, match=r"^stage 'train the experience model' was made with exp_sft.epochs=1, "
                                         r"this config has 2; rerun with --force to redo it and the stages that "
                                         r"depend on it$"):
        run_fake_stages(tmp_path, two)
    assert run_fake_stages(tmp_path, two, force=True) == ["train_exp", "fidelity", "dreamgym", "s2r", "dreamgym_ppo",
                                                          "train_exp_no_replay", "no_replay", "train_exp_no_reasoning",
                                                          "no_reasoning", "no_task_generator"]
    assert (tmp_path / "experience_model").read_text() == "train_exp"  # the old output was deleted first
    assert run_fake_stages(tmp_path, two) == []


def test_a_marker_without_a_key_or_a_begun_stage_under_another_key_is_refused(tmp_path: Path) -> None:
    run_fake_stages(tmp_path, micro())
    for marker in (tmp_path / "stages").glob("*.json"):  # a run dir of the old code: markers without a key
        marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "cache_key"}))
    with pytest.raises(ValueError, match=r"^stage 'collect offline data' \(.*collect.json\) was made by an older "
                                         r"dreamgym that did not record its config"):
        run_fake_stages(tmp_path, micro())
    assert run_fake_stages(tmp_path, micro(), force=True) == list(STAGES)
    # an attempt interrupted under one key is not resumed under another
    (tmp_path / "stages/s2r.json").unlink()
    (tmp_path / "stages/s2r.started.json").write_text(json.dumps({"cache_key": stage_keys(micro())["s2r"]}))
    with pytest.raises(ValueError, match=r"stage 'DreamGym-S2R' was made with s2r_share=1.0, this config has 0.5"):
        run_fake_stages(tmp_path, micro(s2r_share=0.5))
    assert run_fake_stages(tmp_path, micro()) == ["s2r"]  # under its own key it resumes


def test_run_demo_refuses_before_writing_anything(tmp_path: Path) -> None:
    run_fake_stages(tmp_path, micro())
    (tmp_path / "demo_config.yaml").write_text("the config the stages were made under\n")
    with pytest.raises(ValueError, match=r"stage 'annotate reasoning' was made with annotator=\"rule\", this "
                                         r"config has \"diff\""):
        run_demo(micro(annotator="diff"), tmp_path)
    assert (tmp_path / "demo_config.yaml").read_text() == "the config the stages were made under\n"


def test_extra_behaviour_is_collected_apart_for_the_experience_model(tmp_path: Path) -> None:
    """``extra_behaviour``: episodes of a noisier behaviour policy go to offline_extra/ (the experience model's
    data; the policy's SFT clones offline.jsonl alone), on seeds of their own, in a stage of their own: a change to
    them redoes M_exp's stages, never the offline data or the policy's SFT."""
    from dreamgym.pipeline import collect_extra
    from dreamgym.types import read_trajectories

    cfg = micro(offline_episodes=4, extra_behaviour=[{"share": 0.5, "noise": 1.0}])
    files = [tmp_path / "offline_extra" / "0.jsonl"]
    collect_episodes(cfg, tmp_path / "offline.jsonl", 4, "train", cfg.seed)
    summary = collect_extra(cfg, files)
    assert summary["extra"][0]["trajectories"] == 2 and summary["extra"][0]["noise"] == 1.0
    assert summary["extra"][0]["policy"] == "noisy"
    primary = list(read_trajectories(tmp_path / "offline.jsonl"))
    extra = list(read_trajectories(tmp_path / "offline_extra" / "0.jsonl"))
    assert all(x.info.get("detour") for t in extra for x in t.transitions)  # noise 1: every step a random one
    assert {t.meta.get("seed") for t in primary}.isdisjoint({t.meta.get("seed") for t in extra})
    assert collect_extra(cfg, files) == summary  # resumed: as is
    keys, none = stage_keys(cfg), stage_keys(micro(offline_episodes=4, extra_behaviour=[]))
    moved = {s for s in STAGES if keys[s]["hash"] != none[s]["hash"]}
    assert {"annotate", "train_exp", "dreamgym"} <= moved and not moved & {"collect", "sft", "grpo_real"}
    # without extra behaviours the stage does not run, and annotate's key is what it was before the stage existed
    assert "collect_extra" in active_stages(cfg) and "collect_extra" not in active_stages(micro(extra_behaviour=[]))
    assert "stage collect_extra" in keys["annotate"]["inputs"]
    assert set(none["annotate"]["inputs"]) == {"annotator", "annotator_llm", "stage collect"}
    assert none["collect"]["inputs"]["extra_behaviour"] == keys["collect"]["inputs"]["extra_behaviour"] == []
    # bc_extra: the SFT clones them too, so its stage waits on them and its key moves with them
    cloned = micro(offline_episodes=4, extra_behaviour=[{"share": 0.5, "noise": 1.0}], bc_extra=True)
    assert stage_keys(cloned)["sft"]["inputs"]["stage collect_extra"] == keys["collect_extra"]["hash"]
    assert stage_keys(cloned)["sft"]["inputs"]["bc_extra"] is True and "bc_extra" not in keys["sft"]["inputs"]
    real = {"rows": ["sft", "grpo_real"], "heldout_episodes": 0}
    assert active_stages(cloned.model_copy(update=real)) == ["collect", "collect_extra", "sft", "grpo_real"]
    assert active_stages(cfg.model_copy(update=real)) == ["collect", "sft", "grpo_real"]
    with pytest.raises(ValueError, match="bc_extra clones the extra behaviours' episodes"):
        micro(bc_extra=True, extra_behaviour=[])
    with pytest.raises(ValueError, match="share"):
        micro(extra_behaviour=[{"share": 0, "noise": 0.8}])


def test_rows_without_a_dream_train_no_experience_model_and_keep_the_keys_a_dream_run_reuses() -> None:
    """``--rows sft,grpo_real`` runs only what those rows take outputs from: no annotation, no M_exp (hours on 2
    cores). Every stage's key is the same whichever rows ran, so a later run with the dream reuses those stages."""
    real = micro(rows=["sft", "grpo_real"], heldout_episodes=0)
    assert active_stages(real) == ["collect", "sft", "grpo_real"]
    assert active_stages(micro(rows=["sft", "grpo_real"])) == [  # the fidelity stage needs M_exp
        "collect", "collect_extra", "annotate", "train_exp", "fidelity", "sft", "grpo_real"]
    assert active_stages(micro(rows=["sft", "no_reasoning"], heldout_episodes=0)) == [
        "collect", "collect_extra", "annotate", "sft", "train_exp_no_reasoning", "no_reasoning"]
    dream = micro(rows=["sft", "grpo_real", "dreamgym"], heldout_episodes=0)
    assert "train_exp" in active_stages(dream)
    assert stage_keys(real) == stage_keys(dream)


def test_a_run_without_a_dream_writes_no_experience_model(tmp_path: Path) -> None:
    cfg = micro(rows=["sft"], heldout_episodes=0, offline_episodes=6, eval_episodes=2, policy_model="micro",
                sft={"epochs": 1, "batch_size": 16, "num_threads": 2})
    run_demo(cfg, tmp_path)
    assert sorted(p.stem for p in (tmp_path / "stages").glob("*.json")) == ["collect", "sft"]
    assert not (tmp_path / "experience_model").exists() and not (tmp_path / "offline_annotated.jsonl").exists()
    assert json.loads((tmp_path / "table.json").read_text())["rows"][0]["method"] == "SFT"
    # each marker and the policy's summary say what made them: the versions that can change a number, the commit
    import torch
    import transformers

    from dreamgym.software import software

    for made in (json.loads((tmp_path / "stages" / "sft.json").read_text())["software"],
                 json.loads((tmp_path / "sft" / "summary.json").read_text())["software"]):
        assert made == software()
        assert made["torch"] == torch.__version__ and made["transformers"] == transformers.__version__
    if (Path(__file__).resolve().parent.parent / ".git").exists():
        assert len(software()["dreamgym_commit"].removesuffix("+dirty")) == 40
