"""Continue the no_retrieval ablation model of ``exp_fidelity.py`` (600 s, 0.55 epoch) for 1,500 s more on the
same schedule, then score it on the same 300 held-out transitions (writes runs/longer.json).

    .venv/bin/python benchmarks/exp_longer.py   # after the exp_fidelity.py run quoted in the README
"""

import json
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from exp_fidelity import KEYS, load, variants

from dreamgym.experience.fidelity import evaluate_experience_model
from dreamgym.experience.train import ExpTrainConfig, read_training_data, train_experience_model

base = ExpTrainConfig.model_validate(yaml.safe_load(Path("configs/exp-shop-tiny.yaml").read_text()))
sft = dict(base.sft)
sft["epochs"] = sft["epochs"] * 600 / sft["time_budget_s"]  # the ablation's schedule (600 s variants)
sft["time_budget_s"] = 1500
base = base.model_copy(update={"sft": sft, "snapshot_every_s": None})
cfg = variants(base, 1)["no_retrieval"]
d = Path("runs/exp_fidelity10/no_retrieval")
summary = train_experience_model(["runs/demo10/offline_annotated.jsonl"], cfg.model, d, cfg.protocol_config(),
                                 cfg.sft_config(), encoder=cfg.encoder, chat=cfg.chat, vocab_size=cfg.vocab_size,
                                 mixture=cfg.mixture, seed=cfg.seed)
torch.set_num_threads(2)
report = evaluate_experience_model(load(d), read_training_data(["runs/demo10/heldout_annotated.jsonl"]), 300, seed=0)
out = {"train": {k: summary.get(k) for k in ("epochs", "seconds", "steps", "train_loss")},
       **{k: report.get(k) for k in KEYS}, "next_state_f1_by_page": report["next_state_f1_by_page"],
       "consistency_checks": report["consistency_checks"]}
Path("runs/longer.json").write_text(json.dumps(out, indent=2))
print(json.dumps(out))
