"""GRPO / PPO maths against numbers worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dreamgym.rl import (
    agg_loss,
    allowed_vocab,
    broadcast_turn_values,
    discounted_returns,
    entropy_from_logits,
    gae,
    group_advantages,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_whiten,
    policy_loss,
    restrict_logprobs,
    reward_variance,
    sequence_logprobs,
    step_advantages,
    token_logprobs,
    value_loss,
)

torch.set_num_threads(1)


def close(actual: torch.Tensor, expected: list[float] | list[list[float]] | float, tol: float = 1e-4) -> None:
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


# ------------------------------------------------------------------------------------------ GRPO


def test_group_advantage_uses_sample_std() -> None:
    # mean 0.5; sample std = sqrt(4 · 0.25 / 3) = 0.57735; A = ±0.5 / 0.57735 = ±0.86603
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), ["t"] * 4)
    close(adv, [0.86603, -0.86603, 0.86603, -0.86603])


def test_group_advantage_several_groups_and_singleton() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.7])
    groups = ["a", "a", "b", "b", "b", "c"]
    # a: mean 0.5, sample std sqrt((0.25 + 0.25) / 1) = 0.70711 → ±0.70711
    # b: mean 2/3, squared deviations 1/9 + 1/9 + 4/9 = 2/3, sample var 1/3, std 0.57735
    #    → (1/3) / 0.57735 = 0.57735 and (−2/3) / 0.57735 = −1.15470
    # c: a group of one has no baseline → 0
    close(group_advantages(rewards, groups), [0.70711, -0.70711, 0.57735, 0.57735, -1.15470, 0.0])
    # Dr.GRPO (no std): just r − mean
    close(group_advantages(rewards, groups, normalize_std=False), [0.5, -0.5, 1 / 3, 1 / 3, -2 / 3, 0.0])


def test_group_advantage_constant_group_and_tensor_ids() -> None:
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.3, 0.3]), torch.tensor([7, 7, 7, 2, 2]))
    close(adv, [0.0] * 5)


def test_group_advantage_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([1.0, float("nan")]), ["a", "a"])
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(torch.tensor([1.0, 0.0]), ["a"])


def test_discounted_returns_by_hand() -> None:
    # G_2 = 1; G_1 = 0 + 0.5 · 1 = 0.5; G_0 = −0.1 + 0.5 · 0.5 = 0.15
    assert discounted_returns([-0.1, 0.0, 1.0], 0.5) == pytest.approx([0.15, 0.5, 1.0])
    assert discounted_returns([], 0.9) == []


def test_step_advantages_group_the_turns_taken_in_the_same_state() -> None:
    """GiGPO's step groups: three episodes of one group start in s0; two reach s1, where one buys the right thing
    (reward 1) and one the wrong thing (0.5); the third goes to s2 and buys nothing. γ = 0.5, no std."""
    rewards = [[0.0, 1.0], [0.0, 0.5], [0.0, 0.0]]
    anchors = [[(0, "s0"), (0, "s1")], [(0, "s0"), (0, "s1")], [(0, "s0"), (0, "s2")]]
    adv, stats = step_advantages(rewards, anchors, gamma=0.5, normalize_std=False)
    # s0: returns 0.5, 0.25, 0 (mean 0.25) → +0.25, 0, −0.25; s1: 1 and 0.5 (mean 0.75) → ±0.25; s2 alone → 0
    assert adv == pytest.approx([0.25, 0.25, 0.0, -0.25, -0.25, 0.0])
    assert stats == {"step_groups": 2.0, "step_grouped_share": 5 / 6}
    # the same state in another group (another task) is another anchor: nothing to compare with
    other = [[(0, "s0"), (0, "s1")], [(1, "s0"), (1, "s1")]]
    adv, stats = step_advantages(rewards[:2], other, gamma=0.5)
    assert adv == [0.0] * 4 and stats["step_groups"] == 0.0
    # with the std: s1's two returns 1 and 0.5 have sample std 0.35355 → ±0.70711
    adv, _ = step_advantages(rewards[:2], anchors[:2], gamma=0.5)
    assert adv[1] == pytest.approx(0.70711, abs=1e-4) and adv[3] == pytest.approx(-0.70711, abs=1e-4)
    with pytest.raises(ValueError, match="one entry per turn"):
        step_advantages([[0.0, 1.0]], [[(0, "s0")]], gamma=0.5)


def test_reward_variance_is_population_variance() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    groups = ["half"] * 4 + ["solved"] * 3 + ["two_thirds"] * 3
    # half: mean 0.5, every deviation² 0.25 → 0.25; solved: 0;
    # two_thirds: mean 2/3, (1/9 + 1/9 + 4/9) / 3 = 2/9 = 0.22222
    var = reward_variance(rewards, groups)
    assert var == pytest.approx({"half": 0.25, "solved": 0.0, "two_thirds": 2 / 9})
    assert reward_variance(torch.tensor([0.5, 1.0]), torch.tensor([3, 4])) == {3: 0.0, 4: 0.0}


# ------------------------------------------------------------------------------------------ GAE


def test_gae_three_step_episode() -> None:
    # γ = 0.9, λ = 0.8, γλ = 0.72; rewards (0, 0, 1), V = (0.5, 0.6, 0.7), terminal at the end
    # δ2 = 1 − 0.7 = 0.3                     A2 = 0.3
    # δ1 = 0 + 0.9·0.7 − 0.6 = 0.03          A1 = 0.03 + 0.72·0.3 = 0.246
    # δ0 = 0 + 0.9·0.6 − 0.5 = 0.04          A0 = 0.04 + 0.72·0.246 = 0.21712
    # returns = A + V = (0.71712, 0.846, 1.0); the bootstrap value 5.0 is ignored after a terminal step
    adv, ret = gae(
        torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7, 5.0]), torch.tensor([0, 0, 1]), 0.9, 0.8
    )
    close(adv, [0.21712, 0.246, 0.3])
    close(ret, [0.71712, 0.846, 1.0])


def test_gae_truncated_episode_bootstraps() -> None:
    # not terminal, V(s_3) = 0.4: δ2 = 1 + 0.9·0.4 − 0.7 = 0.66           A2 = 0.66
    # A1 = 0.03 + 0.72·0.66 = 0.5052;  A0 = 0.04 + 0.72·0.5052 = 0.403744
    adv, _ = gae(
        torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7, 0.4]), torch.tensor([0, 0, 0]), 0.9, 0.8
    )
    close(adv, [0.403744, 0.5052, 0.66])


def test_episode_gae_bootstraps_a_truncated_episode_only_when_given_v_t() -> None:
    from dreamgym.rl.advantages import episode_gae

    # γ = 0.9, λ = 0.8, r = (0, 1), V = (0.5, 0.8)
    # V(s_T) = 2: δ1 = 1 + 0.9·2 − 0.8 = 2.0, A1 = 2.0; δ0 = 0.9·0.8 − 0.5 = 0.22, A0 = 0.22 + 0.72·2 = 1.66
    adv, ret = episode_gae([0.0, 1.0], [0.5, 0.8], 0.9, 0.8, last_value=2.0)
    assert adv == pytest.approx([1.66, 2.0]) and ret == pytest.approx([2.16, 2.8])
    # terminal (the default, V_T = 0): δ1 = 1 − 0.8 = 0.2, A0 = 0.22 + 0.72·0.2 = 0.364
    adv, ret = episode_gae([0.0, 1.0], [0.5, 0.8], 0.9, 0.8)
    assert adv == pytest.approx([0.364, 0.2]) and ret == pytest.approx([0.864, 1.0])


def test_gae_done_in_the_middle_stops_bootstrapping() -> None:
    # Episode 1 is step 0 alone (terminal): A0 = δ0 = 1 − 0.5 = 0.5, nothing from step 1 leaks in.
    # Episode 2 is steps 1–2: same numbers as above, A1 = 0.246, A2 = 0.3.
    rewards, dones = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1, 0, 1])
    adv, _ = gae(rewards, torch.tensor([0.5, 0.6, 0.7, 0.0]), dones, 0.9, 0.8)
    close(adv, [0.5, 0.246, 0.3])
    adv_other, _ = gae(rewards, torch.tensor([0.5, 9.0, 0.7, 0.0]), dones, 0.9, 0.8)
    assert adv_other[0].item() == pytest.approx(0.5)


def test_gae_batched_rows_and_monte_carlo_limit() -> None:
    # γ = λ = 1 turns GAE into return-to-go minus V: rewards (−0.1, 0, 1) (an invalid-action penalty first)
    # return-to-go = (0.9, 1.0, 1.0); minus V (0.2, 0.3, 0.4) → (0.7, 0.7, 0.6)
    rewards = torch.tensor([[-0.1, 0.0, 1.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.3, 0.4, 0.0], [0.5, 0.6, 0.7, 5.0]])
    dones = torch.tensor([[0, 0, 1], [0, 0, 1]])
    adv, _ = gae(rewards, values, dones, 1.0, 1.0)
    close(adv[0], [0.7, 0.7, 0.6])
    close(adv[1], [0.5, 0.4, 0.3])
    with pytest.raises(ValueError, match="bootstrap"):
        gae(rewards, values[:, :3], dones, 1.0, 1.0)


def test_broadcast_turn_values_onto_response_tokens() -> None:
    turn_adv = torch.tensor([[0.5, -0.2]])
    turn_ids = torch.tensor([[-1, 0, 0, -1, -1, 1, 1, -1]])  # prompt, turn 0, observation, turn 1, padding
    close(broadcast_turn_values(turn_adv, turn_ids), [[0.0, 0.5, 0.5, 0.0, 0.0, -0.2, -0.2, 0.0]])
    with pytest.raises(ValueError, match="turn values"):
        broadcast_turn_values(turn_adv, torch.tensor([[0, 2]]))


# ------------------------------------------------------------------------------------------ masked maths


RAGGED_LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
RAGGED_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # third row: no trainable token


def test_masked_helpers() -> None:
    assert masked_sum(RAGGED_LOSS, RAGGED_MASK).item() == 11.0  # 1 + 2 + 3 + 5
    assert masked_mean(RAGGED_LOSS, RAGGED_MASK).item() == 2.75  # 11 / 4
    close(masked_mean(RAGGED_LOSS, RAGGED_MASK, dim=-1), [2.0, 5.0, 0.0])
    # mean of (1, 2, 3) is 2, sample var 1 → (−1, 0, 1); the masked 100 does not count
    whitened = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    close(whitened[:3], [-1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(torch.tensor([1.0, 2.0]), torch.tensor([1, 0]))


@pytest.mark.parametrize(
    ("mode", "max_len", "expected"),
    [
        ("token-mean", None, 2.75),  # (1 + 2 + 3 + 5) / 4
        ("seq-mean-token-sum", None, 5.5),  # (6 + 5) / 2 non-empty rows
        ("seq-mean-token-mean", None, 3.5),  # (6/3 + 5/1) / 2
        ("seq-mean-token-sum-norm", None, 1.375),  # (6 + 5) / (2 · 4)
        ("seq-mean-token-sum-norm", 10, 0.55),  # (6 + 5) / (2 · 10)
    ],
)
def test_agg_loss_modes_on_a_ragged_mask(mode: str, max_len: int | None, expected: float) -> None:
    assert agg_loss(RAGGED_LOSS, RAGGED_MASK, mode, max_len).item() == pytest.approx(expected)  # type: ignore[arg-type]


def test_agg_loss_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_loss(RAGGED_LOSS, RAGGED_MASK, "mean")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ policy loss


def test_policy_loss_clipping_and_gradient() -> None:
    # token 0: ρ = e^0.5 = 1.64872 > 1.2 with A = +1 → clipped: ℓ = −1.2, zero gradient
    # token 1: ρ = e^0.1 = 1.10517 inside the range with A = 2 → ℓ = −2.21034, dℓ/dlogp = −A·ρ = −2.21034
    # token-mean over 2 tokens: loss = (−1.2 − 2.21034) / 2 = −1.70517; grads (0, −1.10517)
    old_logp = torch.tensor([[-1.0, -2.0]])
    logp = torch.tensor([[-0.5, -1.9]], requires_grad=True)
    loss, stats = policy_loss(logp, old_logp, torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-1.70517, abs=1e-4)
    assert logp.grad is not None
    close(logp.grad, [[0.0, -1.10517]])
    assert stats["clip_frac"] == 0.5
    assert stats["ratio_max"] == pytest.approx(1.64872, abs=1e-4)
    assert stats["ratio_mean"] == pytest.approx((1.64872 + 1.10517) / 2, abs=1e-4)
    # approx KL = mean(ρ − 1 − log ρ) = ((1.64872 − 1.5) + (1.10517 − 1.1)) / 2 = 0.07694
    assert stats["approx_kl"] == pytest.approx(0.07694, abs=1e-4)


def test_policy_loss_negative_advantage_sides() -> None:
    # token 0: ρ = e^−0.5 = 0.60653 < 0.8 with A = −1 → clipped: ℓ = max(0.60653, 0.8) = 0.8, zero gradient
    # token 1: ρ = e^0.5 = 1.64872 > 1.2 with A = −1 → NOT clipped (pessimistic side): ℓ = 1.64872,
    #          dℓ/dlogp = −A·ρ = 1.64872
    # masked token 2 (huge ratio) must not count. seq-mean-token-sum of one row: 0.8 + 1.64872 = 2.44872
    old_logp = torch.tensor([[-1.0, -1.0, -5.0]])
    logp = torch.tensor([[-1.5, -0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, old_logp, torch.tensor([-1.0]), mask, agg="seq-mean-token-sum")
    loss.backward()
    assert loss.item() == pytest.approx(2.44872, abs=1e-4)
    assert logp.grad is not None
    close(logp.grad, [[0.0, 1.64872, 0.0]])
    assert stats["clip_frac"] == 0.5
    assert stats["ratio_max"] == pytest.approx(1.64872, abs=1e-4)


def test_policy_loss_clip_higher() -> None:
    # ε_low = 0.2, ε_high = 0.28 (DAPO): ρ = 1.25 stays unclipped (ℓ = −1.25), ρ = 1.4 clips to 1.28
    old_logp = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.25, 1.4]]))
    loss, stats = policy_loss(logp, old_logp, torch.ones(1, 2), torch.ones(1, 2), clip_eps_high=0.28)
    assert loss.item() == pytest.approx((-1.25 - 1.28) / 2, abs=1e-5)
    assert stats["clip_frac"] == 0.5


def test_dual_clip_caps_the_loss_of_negative_advantages_at_c() -> None:
    # c = 3, ε = 0.2; ρ = (4, 2, 0.5, 4), A = (−1, −1, −1, +1):
    # token 0: max(−Aρ, −A clip ρ) = max(4, 1.2) = 4, capped at −cA = 3 → 3 (zero gradient)
    # token 1: max(2, 1.2) = 2 < 3 → 2, dℓ/dlogp = −Aρ = 2
    # token 2: max(0.5, 0.8) = 0.8 (ordinary clip) → 0.8
    # token 3: A > 0, no cap: max(−4, −1.2) = −1.2 (a cap applied to it would give −3)
    # token-mean: (3 + 2 + 0.8 − 1.2) / 4 = 1.15; without dual-clip (4 + 2 + 0.8 − 1.2) / 4 = 1.4
    old_logp = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[4.0, 2.0, 0.5, 4.0]])).requires_grad_(True)
    adv, mask = torch.tensor([[-1.0, -1.0, -1.0, 1.0]]), torch.ones(1, 4)
    loss, stats = policy_loss(logp, old_logp, adv, mask, clip_ratio_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.15, abs=1e-5)
    assert logp.grad is not None
    close(logp.grad, [[0.0, 0.5, 0.0, 0.0]])  # 2 / 4 tokens
    assert stats["clip_frac_lower"] == 0.25
    plain, plain_stats = policy_loss(logp, old_logp, adv, mask)
    assert plain.item() == pytest.approx(1.4, abs=1e-5) and "clip_frac_lower" not in plain_stats
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(logp, old_logp, adv, mask, clip_ratio_c=1.0)


# ------------------------------------------------------------------------------------------ KL, value, entropy


def test_k1_is_refused_as_a_kl_loss_but_stays_a_metric() -> None:
    from dreamgym.rl.losses import check_kl_loss

    with pytest.raises(ValueError, match=r"zero in expectation.*'k3'.*low_var_kl.*'k2'"):
        check_kl_loss("k1")
    check_kl_loss("k2")
    check_kl_loss("k3")
    close(kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.5]), "k1"), [0.5])  # still computable as a metric


def test_kl_estimators_hand_values() -> None:
    # x = ref − logp. logp −1, ref −1.5: x = −0.5 → k3 = e^−0.5 + 0.5 − 1 = 0.10653, k1 = 0.5, k2 = 0.125
    # logp −2, ref −1: x = 1 → k3 = e − 1 − 1 = 0.71828, k1 = −1, k2 = 0.5
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    close(kl_penalty(logp, ref, "k3"), [0.10653, 0.71828])
    close(kl_penalty(logp, ref, "k1"), [0.5, -1.0])
    close(kl_penalty(logp, ref, "k2"), [0.125, 0.5])
    # clamped: x = 50 would be e^50; it is capped at 10
    assert kl_penalty(torch.tensor([-60.0]), torch.tensor([-10.0])).item() == 10.0
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_k3_is_non_negative() -> None:
    gen = torch.Generator().manual_seed(0)
    logp, ref = -5 * torch.rand(1000, generator=gen), -5 * torch.rand(1000, generator=gen)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()


def test_value_loss_clipping() -> None:
    # ε = 0.2, three per-turn values:
    # 0: V 1.0, V_old 0.5, R 2: unclipped (1 − 2)² = 1; clipped V 0.7 → 1.69; max 1.69, gradient 0
    # 1: V 0.0, V_old 0.5, R 1: unclipped 1; clipped V 0.3 → 0.49; max 1 (unclipped), dℓ/dV = V − R = −1
    # 2: V 0.6, V_old 0.5, R 2: inside the range → 1.96, dℓ/dV = −1.4
    # token-mean of ½ · (1.69, 1, 1.96) = (0.845 + 0.5 + 0.98) / 3 = 0.775; grads divided by 3
    values = torch.tensor([1.0, 0.0, 0.6], requires_grad=True)
    old, returns = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([2.0, 1.0, 2.0])
    loss, stats = value_loss(values, old, returns, torch.ones(3))
    loss.backward()
    assert loss.item() == pytest.approx(0.775, abs=1e-5)
    assert values.grad is not None
    close(values.grad, [0.0, -1 / 3, -1.4 / 3])
    assert stats["vf_clip_frac"] == pytest.approx(1 / 3)
    unclipped, _ = value_loss(values, old, returns, torch.ones(3), clip_eps=None)
    assert unclipped.item() == pytest.approx((0.5 + 0.5 + 0.98) / 3, abs=1e-5)  # ½ · (1, 1, 1.96) / 3


def test_entropy_from_logits() -> None:
    # uniform over 4: ln 4 = 1.38629; probs (½, ¼, ¼): ½ ln 2 + 2 · ¼ ln 4 = 1.03972
    close(entropy_from_logits(torch.zeros(1, 4)), [1.38629])
    close(entropy_from_logits(torch.tensor([math.log(2.0), 0.0, 0.0])), 1.03972)
    close(entropy_from_logits(torch.tensor([math.log(2.0), 0.0, 0.0, -math.inf])), 1.03972)  # masked token
    # huge logits stay finite: one token has all the mass
    assert entropy_from_logits(torch.tensor([1000.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------------------------------ log-probs


def test_token_logprobs_hand_value_and_gather() -> None:
    # logits (0, ln 3) → probs (¼, ¾): label 1 → ln 0.75 = −0.28768, label 0 → ln 0.25 = −1.38629
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    close(token_logprobs(logits, torch.tensor([[1, 0]])), [[-0.28768, -1.38629]])
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 11, generator=gen)
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    expected = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, labels), expected)
    labels[0, 2] = -100  # padding label scores 0
    assert token_logprobs(logits, labels)[0, 2].item() == 0.0


@pytest.fixture(scope="module")
def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def test_dropout_off_sets_eval_keeps_gradients_and_restores_each_mode() -> None:
    from dreamgym.rl.losses import dropout_off

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    net.train()
    net[2].eval()  # a mixed state must come back as it was
    x = torch.ones(8, 4)
    restore = dropout_off(net, None)
    assert not any(m.training for m in net.modules())
    out = net(x)
    torch.testing.assert_close(out, net(x))  # deterministic: dropout is off
    out.sum().backward()
    assert net[0].weight.grad is not None  # gradients still flow
    restore()
    assert [m.training for m in net.modules()] == [True, True, True, False]


def test_sequence_logprobs_match_a_token_by_token_loop(tiny_llama: torch.nn.Module) -> None:
    ids = torch.tensor([[5, 17, 3, 42, 8, 11]])
    with torch.no_grad():
        got = sequence_logprobs(tiny_llama, ids, torch.ones_like(ids))
        # by hand: for each t, run the model on the prefix ids[:, :t] and read log p(ids[t]) at its last position
        expected = [0.0]
        for t in range(1, ids.shape[1]):
            last_logits = tiny_llama(input_ids=ids[:, :t]).logits[0, -1]
            expected.append(last_logits.log_softmax(-1)[ids[0, t]].item())
    close(got, [expected], tol=1e-5)


def test_sequence_logprobs_ignore_padding_side(tiny_llama: torch.nn.Module) -> None:
    ids = torch.tensor([[5, 17, 3, 42]])
    left = torch.tensor([[0, 0, 5, 17, 3, 42]])
    right = torch.tensor([[5, 17, 3, 42, 0, 0]])
    pad_left = torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        plain = sequence_logprobs(tiny_llama, ids, torch.ones_like(ids))
        from_left = sequence_logprobs(tiny_llama, left, pad_left)
        from_right = sequence_logprobs(tiny_llama, right, pad_left.flip(-1))
        hot = sequence_logprobs(tiny_llama, ids, torch.ones_like(ids), temperature=0.5)
    torch.testing.assert_close(from_left[:, 2:], plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(from_right[:, :4], plain, atol=1e-5, rtol=0)
    assert from_left[:, :2].abs().sum().item() == 0.0 and from_right[:, 4:].abs().sum().item() == 0.0
    assert not torch.allclose(hot, plain)  # temperature changes the distribution being scored


def test_restricted_logprobs_renormalise_over_the_allowed_tokens_and_leave_the_others_without_gradient() -> None:
    torch.manual_seed(0)
    vocab, temperature = 7, 0.8
    ids = torch.tensor([[5, 1, 2, 3, 0], [6, 4, 2, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    mask = torch.tensor([[0.0, 0, 1, 1, 1], [0, 0, 1, 0, 0]])  # row 0: 3 response tokens, row 1: 1
    logits = torch.randn(2, 5, vocab, requires_grad=True)
    full = F.pad(token_logprobs(logits[:, :-1] / temperature, ids[:, 1:].masked_fill(attn[:, 1:] == 0, -100)), (1, 0))
    sets = [[[2, 4], [], [0, 3, 6]], None]  # row 0's middle token and all of row 1: the whole vocabulary
    allowed = allowed_vocab(mask, sets, vocab)
    assert allowed.shape == (4, vocab) and allowed.sum(-1).tolist() == [2, vocab, 3, vocab]
    logp = restrict_logprobs(full, logits, mask, allowed, temperature)
    z = logits.detach()[0] / temperature
    assert logp[0, 2].item() == pytest.approx((z[1, 2] - torch.logsumexp(z[1, [2, 4]], 0)).item(), abs=1e-5)
    assert logp[0, 4].item() == pytest.approx((z[3, 0] - torch.logsumexp(z[3, [0, 3, 6]], 0)).item(), abs=1e-5)
    untouched = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(logp[untouched], full[untouched])  # unmasked tokens and non-response positions
    (logp * mask).sum().backward()
    assert logits.grad is not None
    assert torch.all(logits.grad[0, 1, [0, 1, 3, 5, 6]] == 0) and torch.all(logits.grad[0, 3, [1, 2, 4, 5]] == 0)
    assert logits.grad[0, 1, 4].abs() > 0 and logits.grad[0, 2].abs().sum() > 0
    with pytest.raises(ValueError, match="2 allowed-token sets for 3 response tokens"):
        allowed_vocab(mask, [[[1], [2]], None], vocab)


def test_entropy_of_masked_logits_has_the_allowed_subsets_gradient() -> None:
    """An entropy bonus under action masking: the −inf logits get gradient 0 (not NaN) and the others the
    gradient of the entropy over the allowed tokens alone."""
    from dreamgym.rl.losses import entropy_from_logits

    z = torch.tensor([[0.3, -1.2, 2.0, 0.7], [1.0, 0.0, -0.5, 0.25]], requires_grad=True)
    allowed = torch.tensor([[True, False, True, True], [False, True, True, False]])
    entropy_from_logits(z.masked_fill(~allowed, float("-inf"))).sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad).all() and (z.grad[~allowed] == 0).all()
    for row in range(2):
        sub = z.detach()[row, allowed[row]].clone().requires_grad_(True)
        p = sub.softmax(-1)
        (-(p * p.log()).sum()).backward()
        assert torch.allclose(z.grad[row, allowed[row]], sub.grad, atol=1e-6)
