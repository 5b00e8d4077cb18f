"""Token-level policy-optimisation losses shared by GRPO and PPO (pure PyTorch, no trainer state).

Every per-token tensor is [B, L] and comes with a ``mask`` of the same shape: 1 on the policy's own
response tokens, 0 on prompt, observation and padding tokens. Log-probs are *aligned with the token they
score*: ``logp[:, t] = log π(input_ids[:, t] | input_ids[:, <t])`` (see ``sequence_logprobs``), so one mask
built on ``input_ids`` positions serves log-probs, advantages and losses alike.

GRPO = ``policy_loss`` (+ β · ``agg_loss(kl_penalty(logp, ref_logp, "k3"))``, verl's ``use_kl_loss``);
PPO  = ``policy_loss`` + c_v · ``value_loss`` (− c_e · entropy), with advantages from ``dreamgym.rl.advantages``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]

# exp() of a log-ratio beyond ±20 overflows float16/bfloat16 ranges and means the sample is useless anyway.
LOG_RATIO_CLAMP = 20.0
# k3 is unbounded above; verl clamps it so that one token whose reference prob collapsed cannot dominate.
K3_MAX = 10.0


# ------------------------------------------------------------------------------------------ masked maths


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values · mask (over ``dim``, or everything)."""
    product = values * mask
    return product.sum() if dim is None else product.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values · mask / Σ mask for a 0/1 mask. An empty mask gives 0 (no tokens, no loss), not NaN."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the unmasked values; ``unbiased`` applies Bessel's n / (n − 1), as verl and TRL do."""
    count = mask.sum()
    if count < 2:
        raise ValueError(f"masked variance needs at least 2 unmasked values, got {int(count)}")
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    return variance * count / (count - 1) if unbiased else variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + eps) over the unmasked values (batch-level advantage normalisation for PPO).

    With ``shift_mean=False`` the mean is added back (scale only). Masked positions are transformed too;
    callers keep multiplying by the mask.
    """
    mean, variance = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    return whitened if shift_mean else whitened + mean


def agg_loss(
    loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", max_len: int | None = None
) -> Tensor:
    """Reduce a [B, L] per-token loss to a scalar. With m the mask, B' the rows that have any token:

    token-mean:               Σ_bt l·m / Σ_bt m                  (long responses weigh more; verl/TRL default)
    seq-mean-token-mean:      (1/B') Σ_b (Σ_t l·m / Σ_t m)        (original GRPO: each sequence weighs the same)
    seq-mean-token-sum:       (1/B') Σ_b Σ_t l·m
    seq-mean-token-sum-norm:  (1/B') Σ_b Σ_t l·m / L_max           (Dr.GRPO: a constant instead of |o_i|)

    L_max is ``max_len`` (the configured response budget; pass it so the scale does not change with each
    batch's padding) or else ``mask.shape[-1]``. verl's version of the last mode omits the 1/B'; we keep it
    so the loss scale does not grow with the batch size. Rows with an empty mask are left out of B'.
    """
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if loss_mat.dim() != 2:
        raise ValueError(f"{mode!r} needs [B, L] losses, got shape {tuple(loss_mat.shape)}")
    token_count = mask.sum(-1)
    num_seqs = (token_count > 0).sum().clamp(min=1)
    seq_sum = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum / token_count.clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":
        length = max_len if max_len is not None else mask.shape[-1]
        if length < 1:
            raise ValueError(f"max_len must be positive, got {length}")
        return seq_sum.sum() / (num_seqs * length)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {get_args(AggMode)}")


# ------------------------------------------------------------------------------------------ log-probs


def token_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[..., label] = z_label − logsumexp(z): [B, L, V] and [B, L] → [B, L], in float32.

    ``logits[:, t]`` must already be the distribution that predicts ``labels[:, t]`` (the caller shifts).
    Negative labels (−100: padding, prompt) give 0. Gather minus logsumexp (as TRL's selective_log_softmax)
    never materialises a [B, L, V] log-prob tensor for backward, unlike ``log_softmax(-1).gather``.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    logits = logits.float()
    ignored = labels < 0
    picked = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(logits, dim=-1)
    return logp.masked_fill(ignored, 0.0)


def sequence_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0, keep: int | None = None
) -> Tensor:
    """Per-token log-probs of ``input_ids`` under a causal LM, aligned with the tokens: [B, L].

    out[:, t] = log π(input_ids[:, t] | input_ids[:, <t]) for t ≥ 1; out[:, 0] = 0 (nothing predicts it),
    and likewise 0 on padding and on each row's first real token. Left or right padding both work: position
    ids are counted over real tokens only. ``temperature`` must match the sampler's so that these equal the behaviour
    policy's log-probs (logits / τ, as verl and vLLM do).

    ``keep``: only the last ``keep`` positions, [B, keep] (out[:, 0] = 0 again): the model computes its LM head
    there only (Hugging Face's ``logits_to_keep``), so a loss on the responses of a left-padded batch skips the
    [B, L, V] logits of the prompts (:func:`dreamgym.rl.batch.response_window`). The model's logits are then
    [B, keep, V].
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    extra = {} if keep is None else {"logits_to_keep": keep}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra).logits
    if keep is not None:
        input_ids, attention_mask = input_ids[:, -keep:], attention_mask[:, -keep:]
    if temperature != 1.0:
        logits = logits / temperature
    # logits at t-1 predict the token at t; a token is scored only if it and its predictor are both real
    scored = (attention_mask[:, 1:] > 0) & (attention_mask[:, :-1] > 0)
    labels = input_ids[:, 1:].masked_fill(~scored, -100)
    logp = token_logprobs(logits[:, :-1], labels)
    return F.pad(logp, (1, 0), value=0.0)


def allowed_vocab(mask: Tensor, allowed: Sequence[Sequence[Sequence[int]] | None], vocab_size: int) -> Tensor:
    """Invalid action masking: a [N, V] bool of the tokens each response token was sampled among, over the N
    positions that predict a response token (``mask[:, 1:] > 0``, row-major: the order of
    ``logits[:, :-1][mask[:, 1:] > 0]``). ``allowed[b]`` holds row ``b``'s sets, one per response token; a row's
    None, or an empty set, allows the whole vocabulary."""
    predicting = mask[:, 1:] > 0
    out = torch.ones((int(predicting.sum()), vocab_size), dtype=torch.bool, device=mask.device)
    k = 0
    for b, sets in enumerate(allowed):
        count = int(predicting[b].sum())
        if sets is not None:
            if len(sets) != count:
                raise ValueError(f"row {b}: {len(sets)} allowed-token sets for {count} response tokens")
            for j, ids in enumerate(sets):
                if ids:
                    out[k + j] = False
                    out[k + j, list(ids)] = True
        k += count
    return out


def restrict_logprobs(logp: Tensor, logits: Tensor, mask: Tensor, vocab: Tensor, temperature: float = 1.0) -> Tensor:
    """``logp`` ([B, L], from :func:`sequence_logprobs`) with each response token's log-prob taken under the
    softmax renormalised over its allowed tokens (``vocab``, from :func:`allowed_vocab`): the distribution a
    guided sampler drew it from. ``logits`` are the same forward's [B, L, V]. A disallowed token gets no
    probability and so no gradient (Huang & Ontañón, 2022, "A Closer Look at Invalid Action Masking")."""
    predicting = mask[:, 1:] > 0
    z = logits[:, :-1][predicting].float() / temperature
    correction = torch.logsumexp(z, -1) - torch.logsumexp(z.masked_fill(~vocab, float("-inf")), -1)
    shift = torch.zeros_like(logp[:, 1:]).masked_scatter(predicting, correction.to(logp.dtype))
    return logp + F.pad(shift, (1, 0), value=0.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H = logsumexp(z) − Σ_v softmax(z)_v z_v per position: [..., V] → [...].

    Stable for large logits, and for −inf (masked-out) logits, whose 0 · −inf term is taken as 0: the logit is
    zeroed before the product, so the backward pass never forms 0 · −inf either (``torch.where`` on the product
    would give NaN gradients: an entropy bonus under action masking trained on NaN).
    """
    logits = logits.float()
    probs = logits.softmax(-1)
    weighted = probs * torch.where(probs > 0, logits, torch.zeros_like(logits))
    return torch.logsumexp(logits, dim=-1) - weighted.sum(-1)


# ------------------------------------------------------------------------------------------ losses


def dropout_off(*modules: nn.Module | None) -> Callable[[], None]:
    """Put ``modules`` in eval mode (dropout off; gradients still flow) and return a function that restores
    every submodule's train/eval flag as it was.

    RL scores the behaviour tokens with the same network twice: at generation (eval mode, ``HFLLM``) and in the
    update. With dropout on in the update, the first ratio π_θ/π_old is not 1 even before any step, and the
    clipped objective then trains on dropout noise; PPO/GRPO for LLMs (verl, TRL) score both with dropout off.
    A no-op for models without dropout (the tiny Llamas have ``attention_dropout=0``).
    """
    saved = [(m, m.training) for module in modules if module is not None for m in module.modules()]
    for module in modules:
        if module is not None:
            module.eval()

    def restore() -> None:
        for m, training in saved:
            m.training = training

    return restore


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman, "Approximating KL").

    With x = ref_logp − logp (the log-ratio π_ref / π_θ):
    k1 = −x                    (unbiased, high variance, can be negative)
    k2 = ½ x²                  (biased, low variance)
    k3 = eˣ − x − 1 ≥ 0        (unbiased, low variance; verl's "low_var_kl", the GRPO KL loss)
    For k3, x is clamped to ±20 and the result to ≤ 10, as verl does, so that a token the reference finds
    near-impossible cannot blow up the loss.

    k1 is a metric only, never a loss (``check_kl_loss``): its gradient −∇x = ∇ log π_θ has expectation
    E_π[∇ log π_θ] = Σ ∇π_θ = 0, so as a loss term it pulls nothing toward π_ref (only adds noise).
    """
    log_ratio = ref_logp - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (log_ratio.exp() - log_ratio - 1).clamp(max=K3_MAX)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {get_args(KLKind)}")


def check_kl_loss(kind: str) -> None:
    """Refuse a KL estimator that cannot serve as a loss term (k1; see ``kl_penalty``), naming the alternatives."""
    if kind == "k1":
        raise ValueError(
            "kl_estimator 'k1' cannot be the KL loss: its gradient (∇ log π) is zero in expectation, so it does not "
            "keep the policy near the reference; use 'k3' (verl's low_var_kl, the GRPO default) or 'k2' (½ log-ratio², "
            "whose gradient is that of KL(π‖π_ref))"
        )
    if kind not in get_args(KLKind):
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {get_args(KLKind)}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: AggMode = "token-mean",
    max_len: int | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017), per token, then ``agg_loss``.

    ρ_t = exp(logp_t − old_logp_t)
    ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t) = max(−ρ_t A_t, −clip(ρ_t) A_t)

    ε_low = ``clip_eps``; ε_high = ``clip_eps_high`` or ``clip_eps`` (DAPO's "clip-higher" when larger).
    A clipped token has zero gradient. ``advantages`` is [B, L], or [B] (one per row, broadcast over tokens).

    Dual-clip (Ye et al. 2020, verl's ``clip_ratio_c``; off when None): for A_t < 0 the loss is also capped at
    −c·A_t, ℓ_t = min(max(−ρ_t A_t, −clip(ρ_t) A_t), −c A_t), so a token whose ratio grew far above 1 under a
    negative advantage (a stale or off-policy sample) cannot push an unbounded update; c > 1 (verl: 3.0).
    Stats: clip_frac (share of tokens whose clipped term is active), approx_kl (k3 of old vs new, CleanRL's),
    ratio_mean, ratio_max (over unmasked tokens); with dual-clip also clip_frac_lower (share of tokens capped
    at −c·A).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual-clip bound on the ratio), got {clip_ratio_c}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    if not (logp.shape == old_logp.shape == advantages.shape == mask.shape):
        raise ValueError(
            f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
            f"advantages {tuple(advantages.shape)}, mask {tuple(mask.shape)}"
        )
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = mask.to(logp.dtype)

    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        capped = torch.minimum(per_token, -advantages * clip_ratio_c)
        lower = (advantages < 0) & (per_token > capped)
        per_token = torch.where(advantages < 0, capped, per_token)
    loss = agg_loss(per_token, mask, agg, max_len)

    with torch.no_grad():
        has_tokens = bool(mask.sum() > 0)
        stats = {
            "clip_frac": float(masked_mean((clipped > unclipped).to(mask.dtype), mask)),
            "approx_kl": float(masked_mean(ratio - 1 - log_ratio, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "ratio_max": float(ratio[mask > 0].max()) if has_tokens else 0.0,
        }
        if clip_ratio_c is not None:
            stats["clip_frac_lower"] = float(masked_mean(lower.to(mask.dtype), mask))
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float | None = 0.2,
    agg: AggMode = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped value loss: ½ · max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²), then ``agg_loss``.

    The max keeps the critic from moving further than ε from its rollout-time estimate in one update
    (CleanRL, verl). ``clip_eps=None`` gives the plain ½ (V − R)². The four tensors share one shape: per
    token [B, L], or per turn ([N], or [B, K] with a turn mask; 1-D needs ``agg="token-mean"``).
    Stats: vf_clip_frac.
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError(
            f"shape mismatch: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, "
            f"returns {tuple(returns.shape)}, mask {tuple(mask.shape)}"
        )
    mask = mask.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        clipped = unclipped
    else:
        clipped = (old_values + (values - old_values).clamp(-clip_eps, clip_eps) - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), mask, agg)
    clip_frac = float(masked_mean((clipped > unclipped).to(mask.dtype).detach(), mask))
    return loss, {"vf_clip_frac": clip_frac}


__all__ = [
    "AggMode",
    "KLKind",
    "agg_loss",
    "allowed_vocab",
    "check_kl_loss",
    "dropout_off",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "restrict_logprobs",
    "sequence_logprobs",
    "token_logprobs",
    "value_loss",
]
