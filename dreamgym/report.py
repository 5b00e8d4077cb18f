"""``RUN/report.html``: one self-contained page about a demo run (no external assets, no JavaScript).

Reads what the run has written and skips what it has not (a partial run still gets a report): ``table.json``
(the results table, fidelity and wm2real summaries), ``fidelity.json`` (M_exp's full fidelity report and its
side-by-side sample), ``<row>/metrics.jsonl`` of the RL rows and ``dreamgym/rollouts/iter_*.jsonl``. Plots are
matplotlib (Agg) PNGs inlined as base64; every piece of text from the run is HTML-escaped.
"""

from __future__ import annotations

import base64
import difflib
import html
import io
import json
from pathlib import Path
from typing import Any

RL_ROWS = {"grpo_real": "GRPO (real)", "dreamgym": "DreamGym", "s2r": "DreamGym-S2R"}
MAX_SIDE_BY_SIDE = 8

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; }
.muted { color: #777; }
pre { margin: 0; white-space: pre-wrap; font-size: 0.85em; text-align: left; }
.sbs td, .sbs th { width: 50%; text-align: left; }
.del { background: #fdd; }
.add { background: #dfd; }
img { max-width: 100%; }
"""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _num(x: Any) -> str:
    """A number (3 decimals for floats), a ``{mean, ci_low, ci_high}`` as ``mean [lo, hi]``, else the text."""
    if isinstance(x, dict) and "mean" in x:
        if x.get("ci_low") is not None and x.get("ci_high") is not None:
            return f"{_num(x['mean'])} <span class='muted'>[{_num(x['ci_low'])}, {_num(x['ci_high'])}]</span>"
        return _num(x["mean"])
    if isinstance(x, bool) or x is None:
        return _esc(x)
    if isinstance(x, float):
        return f"{x:.3f}"
    if isinstance(x, int):
        return str(x)
    return _esc(x)


def _mean(x: Any) -> float | None:
    if isinstance(x, dict):
        x = x.get("mean")
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return f"<img alt='plot' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _results_section(table: dict[str, Any]) -> str:
    rows = [r for r in table.get("rows") or [] if isinstance(r, dict)]
    out = ["<h2>Results</h2>"]
    facts = [f"env: <b>{_esc(table.get('env', '?'))}</b>"]
    if table.get("env_kwargs"):
        facts.append(f"env_kwargs: <code>{_esc(json.dumps(table['env_kwargs']))}</code>")
    off = table.get("offline_data")
    if isinstance(off, dict):
        facts.append(f"offline data: {_num(off.get('trajectories'))} trajectories, "
                     f"{_num(off.get('transitions'))} transitions, success {_num(off.get('success_rate'))}")
    out.append("<p>" + "; ".join(facts) + "</p>")
    if rows:
        cols = ["method", "real_transitions", "success_rate", "mean_reward", "seconds"]
        out.append(_table(cols, [[_num(r.get(c, "")) for c in cols] for r in rows]))
    else:
        out.append("<p class='muted'>no rows yet</p>")
    return "\n".join(out)


def _accuracy_rows(fid: dict[str, Any]) -> list[list[str]]:
    """Each ``X_accuracy`` (or other value with an ``X_majority_baseline``) beside its trivial baseline."""
    rows = []
    for key in sorted(fid):
        if not key.endswith("_majority_baseline"):
            continue
        stem = key[: -len("_majority_baseline")]
        name = f"{stem}_accuracy" if f"{stem}_accuracy" in fid else stem
        if name in fid:
            rows.append([_esc(name), _num(fid[name]), _num(fid[key])])
    f1 = fid.get("next_state_f1")
    copy = fid.get("next_state_copy_baseline")
    if f1 is not None:
        rows.append(["next_state_f1", _num(f1),
                     _num(copy.get("f1")) + " <span class='muted'>(copy state)</span>" if isinstance(copy, dict)
                     else "<span class='muted'>n/a</span>"])
    return rows


def _fidelity_section(fid: dict[str, Any]) -> str:
    out = ["<h2>Experience model fidelity</h2>"]
    rows = _accuracy_rows(fid)
    if rows:
        out.append(_table(["metric", "M_exp", "trivial baseline"], rows))
    extra = [k for k in ("transitions", "invalid_output_rate", "reward_mae", "epsilon_p", "reasoning_exact",
                         "click_consistency", "item_options_consistency", "reward_consistency",
                         "purchase_page_consistency") if k in fid]
    if extra:
        out.append(_table(["other", "value"], [[_esc(k), _num(fid[k])] for k in extra]))
    by_page = fid.get("next_state_f1_by_page")
    if isinstance(by_page, dict) and by_page:
        plt = _plt()
        pages = sorted(by_page)
        n = fid.get("transitions_by_page") or {}
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar([f"{p} ({n.get(p, '?')})" for p in pages], [float(by_page[p] or 0) for p in pages])
        ax.set_ylim(0, 1)
        ax.set_ylabel("next-state F1")
        ax.set_title("next-state F1 by page type (transitions)")
        out.append(_png(fig))
    return "\n".join(out)


def _wm2real_section(w: dict[str, Any]) -> str:
    out = ["<h2>Dream-to-real agreement (wm2real)</h2>",
           _table(["key", "value"], [[_esc(k), _num(v)] for k, v in w.items() if not isinstance(v, dict | list)])]
    pairs = [(k, w.get(k)) for k in ("reward_agreement", "success_agreement")]
    rates = [("success", w.get("dreamt_success_rate"), w.get("real_success_rate")),
             ("final reward", w.get("dreamt_mean_final_reward"), w.get("real_mean_final_reward"))]
    if any(_mean(v) is not None for _, v in pairs):
        plt = _plt()
        fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
        a.bar([k for k, _ in pairs], [_mean(v) or 0.0 for _, v in pairs])
        a.set_ylim(0, 1)
        a.set_title("agreement on the same actions")
        xs = range(len(rates))
        b.bar([x - 0.2 for x in xs], [_mean(d) or 0.0 for _, d, _ in rates], width=0.4, label="dreamt")
        b.bar([x + 0.2 for x in xs], [_mean(r) or 0.0 for _, _, r in rates], width=0.4, label="real")
        b.set_xticks(list(xs), [n for n, _, _ in rates])
        b.set_ylim(0, 1)
        b.legend()
        out.append(_png(fig))
    return "\n".join(out)


def _curves_png(lines: list[tuple[str | None, str | None, list[dict[str, Any]]]]) -> str:
    """Eval success against real transitions, and against wall-clock where any point has ``wall_s``; one line per
    ``(label, colour, points)``."""
    plt = _plt()
    with_wall = any("wall_s" in p for _, _, c in lines for p in c)
    fig, axes = plt.subplots(1, 2 if with_wall else 1, figsize=(10 if with_wall else 6, 3.5), squeeze=False)
    for label, color, c in lines:
        style = {"marker": "o", "label": label, **({"color": color, "alpha": 0.7} if color else {})}
        axes[0][0].plot([p.get("real_transitions", 0) for p in c], [float(p["eval_success"]) for p in c], **style)
        if with_wall:
            walled = [p for p in c if "wall_s" in p]
            axes[0][1].plot([p["wall_s"] for p in walled], [float(p["eval_success"]) for p in walled], **style)
    axes[0][0].set_xlabel("real transitions")
    axes[0][0].set_ylabel("eval success (real env)")
    if with_wall:
        axes[0][1].set_xlabel("wall-clock s")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _png(fig)


def _training_section(run: Path) -> str:
    metrics = {d: _read_jsonl(run / d / "metrics.jsonl") for d in RL_ROWS}
    metrics = {d: m for d, m in metrics.items() if m}
    if not metrics:
        return ""
    plt = _plt()
    out = ["<h2>Training curves</h2>"]
    curves = {d: [r for r in m if r.get("eval_success") is not None] for d, m in metrics.items()}
    if any(curves.values()):
        with_wall = any("wall_s" in r for c in curves.values() for r in c)
        out.append("<h3>Success vs real transitions" + (" and wall-clock" if with_wall else "") + "</h3>")
        out.append(_curves_png([(RL_ROWS[d], None, c) for d, c in curves.items() if c]))
    else:
        out.append("<p class='muted'>no evaluations in the RL rows' metrics yet</p>")
    for d, m in metrics.items():
        var_rows = [r for r in m if isinstance(r.get("task_variances"), list) and r["task_variances"]]
        if not var_rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 3))
        bins = [i * 0.025 for i in range(11)]
        for r in var_rows:
            vals = [min(max(float(v), 0.0), 0.25) for v in r["task_variances"]]
            ax.hist(vals, bins=bins, histtype="step", label=f"iter {r.get('iteration', '?')}")
        ax.set_xlabel("group reward variance V")
        ax.set_ylabel("groups")
        ax.set_title(f"curriculum group variances ({RL_ROWS[d]})")
        if len(var_rows) <= 12:
            ax.legend(fontsize="small")
        out.append(f"<h3>Curriculum group variances: {_esc(RL_ROWS[d])}</h3>")
        out.append(_png(fig))
    rows = [[_esc(RL_ROWS[d]), _num(len(m)), _num(m[-1].get("real_transitions")),
             _num(m[-1].get("synthetic_transitions")), _num(m[-1].get("success"))] for d, m in metrics.items()]
    out.append(_table(["row", "iterations", "real transitions", "synthetic transitions", "last train success"],
                      rows))
    return "\n".join(out)


def _diff_cells(real: str, dreamt: str) -> tuple[str, str]:
    """Both states line by line, lines only in the real one marked ``del``, only in the dreamt one ``add``."""
    a, b = real.splitlines(), dreamt.splitlines()
    left: list[str] = []
    right: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        cls = "" if op == "equal" else " class='{}'"
        left += [f"<span{cls.format('del')}>{_esc(line)}</span>" for line in a[i1:i2]]
        right += [f"<span{cls.format('add')}>{_esc(line)}</span>" for line in b[j1:j2]]
    return "<pre>" + "\n".join(left) + "</pre>", "<pre>" + "\n".join(right) + "</pre>"


def _side_by_side_section(rows: list[Any]) -> str:
    rows = [r for r in rows if isinstance(r, dict)][:MAX_SIDE_BY_SIDE]
    if not rows:
        return ""
    out = ["<h2>Dreamt vs real next states</h2>",
           "<p class='muted'>lines only in the real state are <span class='del'>red</span>, "
           "only in the dreamt one <span class='add'>green</span></p>"]
    for r in rows:
        real, dreamt = _diff_cells(str(r.get("real_next_state", "")), str(r.get("dreamt_next_state", "")))
        out.append(f"<h4>step {_esc(r.get('step', '?'))}, page {_esc(r.get('page', '?'))}: "
                   f"<code>{_esc(r.get('action', ''))}</code></h4>")
        out.append("<table class='sbs'><tr><th>real</th><th>dreamt</th></tr>"
                   f"<tr><td>{real}</td><td>{dreamt}</td></tr>"
                   f"<tr><td>reward {_num(r.get('real_reward'))}, done {_num(r.get('real_done'))}</td>"
                   f"<td>reward {_num(r.get('dreamt_reward'))}, done {_num(r.get('dreamt_done'))}"
                   + (f", failure {_esc(r['failure'])}" if r.get("failure") else "") + "</td></tr></table>")
        if r.get("dreamt_reasoning"):
            out.append(f"<p class='muted'>reasoning: {_esc(r['dreamt_reasoning'])}</p>")
    return "\n".join(out)


def _rollouts_section(run: Path) -> str:
    files = sorted((run / "dreamgym" / "rollouts").glob("iter_*.jsonl"))
    if not files:
        return ""
    counts = []
    sample: dict[str, Any] | None = None
    for f in files:
        trajs = _read_jsonl(f)
        counts.append([_esc(f.name), _num(len(trajs)), _num(sum(len(t.get("transitions") or []) for t in trajs))])
        sample = sample or next((t for t in trajs if t.get("transitions")), None)
    out = ["<h2>Dreamt rollouts (DreamGym row)</h2>", _table(["file", "trajectories", "transitions"], counts)]
    if sample:
        task = sample.get("task") or {}
        steps = [[_num(i), f"<code>{_esc(t.get('action', ''))}</code>", f"<pre>{_esc(t.get('next_state', ''))}</pre>",
                  _num(t.get("reward"))] for i, t in enumerate(sample["transitions"][:10])]
        out.append(f"<p>sample: {_esc(task.get('instruction', ''))}</p>")
        out.append(_table(["step", "action", "dreamt next state", "reward"], steps))
    return "\n".join(out)


def write_report(run_dir: Path | str) -> Path:
    """Write ``RUN/report.html`` from what the run dir holds; returns its path. ValueError when ``run_dir`` is
    not a directory or holds none of a demo run's outputs."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"{run}: not a directory")
    markers = [run / "table.json", run / "fidelity.json", *(run / d / "metrics.jsonl" for d in RL_ROWS)]
    if not any(p.exists() for p in markers):
        raise ValueError(f"{run}: not a demo run dir (no table.json, fidelity.json or RL metrics)")
    table = _read_json(run / "table.json")
    table = table if isinstance(table, dict) else {}
    fid = _read_json(run / "fidelity.json")
    if not isinstance(fid, dict):
        fid = table.get("fidelity") if isinstance(table.get("fidelity"), dict) else {}
    parts = [f"<h1>DreamGym run: {_esc(run.resolve().name)}</h1>"]
    if table:
        parts.append(_results_section(table))
    parts.append(_training_section(run))
    if fid:
        parts.append(_fidelity_section(fid))
    if isinstance(table.get("wm2real"), dict):
        parts.append(_wm2real_section(table["wm2real"]))
    parts.append(_side_by_side_section(fid.get("side_by_side") or []))
    parts.append(_rollouts_section(run))
    body = "\n".join(p for p in parts if p)
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'><title>DreamGym report: "
            f"{_esc(run.resolve().name)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
    out = run / "report.html"
    out.write_text(page)
    return out


# --- OUT/report.html of a `dreamgym bench` run: the table with CIs over seeds, then each seed's curves and fidelity


def _whole(x: float | None) -> str:
    """A count or seconds averaged over seeds, to the unit."""
    return "—" if x is None else f"{x:,.0f}"


def _signed_ci(diff: Any) -> str:
    """A paired difference ``{mean, ci_low, ci_high}`` as ``+0.038 [+0.003, +0.082]``; "—" when absent."""
    if not isinstance(diff, dict):
        return "—"
    return f"{diff['mean']:+.3f} <span class='muted'>[{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]</span>"


def _bench_table(bench: dict[str, Any]) -> str:
    rows = [r for r in bench.get("rows") or [] if isinstance(r, dict)]
    cells = []
    for r in rows:
        vs = r.get("vs_sft") if isinstance(r.get("vs_sft"), dict) else None
        real, synthetic, seconds = (_mean(r.get(k)) for k in ("real_transitions", "synthetic_transitions", "seconds"))
        cells.append([_esc(r.get("method", "?")), _whole(real), _whole(synthetic), _num(r.get("success_rate")),
                      _num(r.get("mean_reward")), _signed_ci(vs.get("diff") if vs else None),
                      _num(vs.get("sign_test_p")) if vs else "—", _whole(seconds)])
    base = bench.get("baseline")
    if isinstance(base, dict):
        cells.append([f"<span class='muted'>trivial baseline ({_esc(base.get('policy', 'random'))} policy)</span>",
                      "0", "0", _num(base.get("success_rate")), _num(base.get("mean_reward")), "—", "—", "—"])
    return _table(["method", "real transitions (RL)", "synthetic transitions", "success [95% CI]",
                   "mean reward [95% CI]", "success − SFT [95% CI]", "sign test p", "seconds"], cells)


# bench.md, the printed bench and this report head the ablation table alike
ABLATION_COLUMNS = ("ablation", "success - DreamGym [95% CI]", "won / lost", "sign test p",
                    "mean reward - DreamGym [95% CI]")


def _bench_ablations(bench: dict[str, Any]) -> str:
    """Each ablation row minus the DreamGym row on the same tasks (bench.json's ``vs_dreamgym``): the sign of each
    component's effect from a paired test. Empty without ablation rows."""
    rows = [r for r in bench.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("vs_dreamgym"), dict)]
    if not rows:
        return ""
    cells = []
    for r in rows:
        vs = r["vs_dreamgym"]
        cells.append([_esc(r.get("method", "?")), _signed_ci(vs.get("diff")),
                      f"{vs.get('better', '?')} / {vs.get('worse', '?')}", _num(vs.get("sign_test_p")),
                      _signed_ci(vs.get("reward_diff"))])
    return ("<h2>Ablations</h2><p>Each ablation row minus DreamGym, paired on the same tasks: a negative difference "
            "means the component helps.</p>" + _table(list(ABLATION_COLUMNS), cells))


def _bench_forest(bench: dict[str, Any]) -> str:
    """Each row's success with its 95% CI (and the difference from SFT beside it), one line per row."""
    rows = [r for r in bench.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("success_rate"), dict)]
    if not rows:
        return ""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.5 + 0.45 * len(rows)), squeeze=True)
    ys = list(range(len(rows)))[::-1]
    for ax, key in ((a, "success_rate"), (b, "diff")):
        for y, r in zip(ys, rows, strict=True):
            x = r.get("success_rate") if key == "success_rate" else (r.get("vs_sft") or {}).get("diff")
            if not isinstance(x, dict):
                continue
            ax.errorbar([x["mean"]], [y], xerr=[[x["mean"] - x["ci_low"]], [x["ci_high"] - x["mean"]]], fmt="o",
                        capsize=3)
        ax.set_yticks(ys, [str(r.get("method", "?")) for r in rows])
        ax.grid(alpha=0.3, axis="x")
    base = bench.get("baseline")
    if isinstance(base, dict) and _mean(base.get("success_rate")) is not None:
        a.axvline(_mean(base["success_rate"]) or 0.0, color="grey", ls=":", label="random policy")
        a.legend(fontsize="small")
    b.axvline(0.0, color="grey", ls="--")
    a.set_xlabel("test success [95% CI]")
    b.set_xlabel("success − SFT, paired [95% CI]")
    return _png(fig)


def _bench_seeds(bench: dict[str, Any], out: Path) -> str:
    """Per seed: each row's success (from the raw per-task results), the seed's fidelity and minutes (bench.json's
    ``seeds_detail``) and a link to the seed's own report."""
    seeds = [int(s) for s in bench.get("seeds") or []]
    rows = [r for r in bench.get("rows") or [] if isinstance(r, dict)]
    header = ["seed", *[_esc(r.get("method", "?")) for r in rows], "fidelity (done acc / majority, invalid)",
              "all stages (min)", "report"]
    detail: dict[str, Any] = bench["seeds_detail"] if isinstance(bench.get("seeds_detail"), dict) else {}
    cells = []
    for s in seeds:
        line = [_num(s)]
        for r in rows:
            tasks = (r.get("per_task") or {}).get(f"seed{s}") or []
            line.append(_num(sum(float(t.get("success", 0)) for t in tasks) / len(tasks)) if tasks else "—")
        facts: dict[str, Any] = detail.get(f"seed{s}") or {}
        fid: dict[str, Any] = facts.get("fidelity") or {}
        line.append(f"{_num(fid.get('done_accuracy'))} / {_num(fid.get('done_majority_baseline'))}, "
                    f"{_num(fid.get('invalid_output_rate'))}" if fid else "—")
        total = _mean(facts.get("total_seconds"))
        line.append(f"{total / 60:.1f}" if total is not None else "—")
        seed_report = out / f"seed{s}" / "report.html"
        line.append(f"<a href='seed{s}/report.html'>seed{s}/report.html</a>" if seed_report.exists() else "—")
        cells.append(line)
    return _table(header, cells)


def _bench_curves(bench: dict[str, Any], out: Path) -> str:
    """Eval success against real transitions (and wall-clock where logged) for every RL row, one line per seed."""
    curves: list[tuple[str, list[dict[str, Any]]]] = []
    for s in bench.get("seeds") or []:
        for d, name in RL_ROWS.items():
            pts = [r for r in _read_jsonl(out / f"seed{s}" / d / "metrics.jsonl") if r.get("eval_success") is not None]
            if pts:
                curves.append((name, pts))
    if not curves:
        return ""
    colors = {name: f"C{i}" for i, name in enumerate(RL_ROWS.values())}
    labelled: set[str] = set()  # one legend entry per row, on its first seed's line
    lines: list[tuple[str | None, str | None, list[dict[str, Any]]]] = []
    for name, c in curves:
        lines.append((None if name in labelled else name, colors[name], c))
        labelled.add(name)
    return "<h2>Success during training (one line per seed)</h2>\n" + _curves_png(lines)


def write_bench_report(bench_dir: Path | str) -> Path:
    """Write ``OUT/report.html`` for a ``dreamgym bench`` directory (its ``bench.json`` and ``seed<k>/`` run dirs);
    returns its path. ValueError when ``bench.json`` is missing or unreadable."""
    out = Path(bench_dir)
    bench = _read_json(out / "bench.json")
    if not isinstance(bench, dict) or not isinstance(bench.get("rows"), list):
        raise ValueError(f"{out}: not a bench dir (no readable bench.json)")
    seeds = ", ".join(str(s) for s in bench.get("seeds") or [])
    parts = [f"<h1>DreamGym bench: {_esc(bench.get('env', '?'))} ({_esc(bench.get('profile', '?'))} profile), "
             f"seeds {_esc(seeds)}</h1>",
             f"<p><code>{_esc(bench.get('command', ''))}</code></p>",
             f"<p>Means over {len(bench.get('seeds') or [])} seeds × {_num(bench.get('episodes_per_seed'))} test "
             f"episodes each. 95% CIs: a bootstrap over seeds, then tasks within each seed "
             f"({_num(bench.get('resamples'))} resamples). “success − SFT” is paired on the same tasks; the sign "
             "test is two-sided and exact, on the tasks where exactly one of the two succeeded.</p>",
             "<h2>Results</h2>", _bench_table(bench), _bench_forest(bench), _bench_ablations(bench),
             "<h2>Per seed</h2>", _bench_seeds(bench, out), _bench_curves(bench, out)]
    body = "\n".join(p for p in parts if p)
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'><title>"
            f"DreamGym bench: {_esc(out.resolve().name)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")
    path = out / "report.html"
    path.write_text(page)
    return path
