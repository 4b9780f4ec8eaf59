"""The reference's ground-truth metrics (goodfire-ai/spd IdentityCIError, DenseCIError, the SPD
paper's MMCS/ML2R, the residual MLP's neuron contributions), each pinned to a case worked out by
hand from the definitions (the numbers are written out here, not computed by pd)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pd_train.analysis.ground_truth import (
    alive_components,
    component_neuron_contributions,
    dense_ci_error,
    describe_identity_failures,
    ground_truth_table,
    identity_ci_error,
    identity_failures,
    identity_failures_by_site,
    mmcs_ml2r,
    neuron_contributions,
    permute_to_identity,
    plot_neuron_contributions,
    plot_permuted_ci,
    plot_uv,
    sign_even_part,
)

# Feature 0 -> component 0 (0.95: on), feature 1 -> component 2 (0.85: below 0.9, one error;
# its 0.2 in component 3 is another), feature 2 -> component 1 (its 0.15 a third). 0.05 is
# within the tolerance.
IDENTITY_CASE = np.array(
    [
        [0.95, 0.0, 0.05, 0.0],
        [0.0, 0.0, 0.85, 0.2],
        [0.0, 1.0, 0.0, 0.15],
    ]
)


def test_identity_ci_error_counts_entries_off_the_permuted_identity() -> None:
    assert identity_ci_error(IDENTITY_CASE) == 3
    permuted, perm = permute_to_identity(IDENTITY_CASE)
    assert perm.tolist() == [0, 2, 1, 3]
    np.testing.assert_array_equal(np.diagonal(permuted[:, :3]), [0.95, 0.85, 1.0])
    # A wider tolerance (0.2): 0.85 is on, 0.15 is off; the 0.2 is not above 0.2.
    assert identity_ci_error(IDENTITY_CASE, tolerance=0.2) == 0
    # The exact solution: 0 errors; a dead feature: 1 (its diagonal entry) .
    assert identity_ci_error(np.eye(3, 5)) == 0
    assert identity_ci_error(np.diag([1.0, 1.0, 0.0])) == 1
    with pytest.raises(ValueError, match="3 components cannot"):
        identity_ci_error(np.ones((4, 3)))


def test_identity_failures_are_what_identity_ci_error_counts() -> None:
    """IDENTITY_CASE's three errors by name: feature 1's own component (2) is at 0.85, and
    component 3 is on for features 1 (0.2) and 2 (0.15); 0.05 is within the tolerance."""
    failures = identity_failures(IDENTITY_CASE)
    assert failures == {
        "without_own": [1],
        "extra": [[1, 3, 0.2], [2, 3, 0.15]],
        "shared": [[3, [1, 2]]],
    }
    assert describe_identity_failures(failures) == [
        "1 feature(s) without a component ≥ 0.9 of their own: 1",
        "1 component(s) on for several features: component (features) 3 (1, 2)",
    ]
    # Two features on one component: one keeps it, the other has none of its own (2 errors).
    merged = np.array([[0.0, 0.95, 0.0], [0.0, 0.95, 0.0]])
    assert identity_failures(merged) == {
        "without_own": [1],
        "extra": [[1, 1, 0.95]],
        "shared": [[1, [0, 1]]],
    }
    assert identity_ci_error(merged) == 2
    # A feature also on a second component no other feature uses (1 error).
    split = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0]])
    assert identity_failures(split) == {"without_own": [], "extra": [[0, 2, 0.5]], "shared": []}
    assert describe_identity_failures(identity_failures(split)) == [
        "1 feature(s) also on a second component that no other feature uses: feature "
        "(component) 0 (2)"
    ]
    # Fifteen dead features: the first twelve listed, then how many more.
    dead = describe_identity_failures(identity_failures(np.zeros((15, 15))))
    assert dead == [
        "15 feature(s) without a component ≥ 0.9 of their own: "
        "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, … (3 more)"
    ]
    # Per site: only the identity sites with errors.
    by_site = identity_failures_by_site(
        {"a.in": IDENTITY_CASE, "b.in": np.eye(3, 4), "a.out": np.zeros((3, 4))}, ("*.in",)
    )
    assert list(by_site) == ["a.in"] and by_site["a.in"] == failures
    # With each feature's strength at the site: feature 1 is the weakest of the three (rank 0).
    ranked = identity_failures_by_site(
        {"a.in": IDENTITY_CASE}, ("*.in",), strength={"a.in": np.array([0.7, 0.2, 0.5])}
    )
    assert ranked["a.in"]["without_own_rank"] == [0]
    assert describe_identity_failures(ranked["a.in"])[:2] == [
        "1 feature(s) without a component ≥ 0.9 of their own: 1",
        "  their ranks by the target's output at this site (0 = the weakest): 0",
    ]
    with pytest.raises(ValueError, match="3 components cannot"):
        identity_failures(np.ones((4, 3)))


@pytest.mark.parametrize("seed", range(20))
def test_identity_failures_add_up_to_identity_ci_error(seed: int) -> None:
    rng = np.random.default_rng(seed)
    f, c = int(rng.integers(1, 12)), int(rng.integers(12, 20))
    ci = np.where(rng.random((f, c)) < 0.3, rng.random((f, c)), 0.0)
    failures = identity_failures(ci)
    assert len(failures["without_own"]) + len(failures["extra"]) == identity_ci_error(ci)
    for j, features in failures["shared"]:
        assert features == [i for i in range(f) if ci[i, j] > 0.1] and len(features) >= 2


def test_sign_even_part_by_hand() -> None:
    """out(+1) = [2, 0], [0, 3]; out(-1) = [-2, 2], [0, -1]: odd = [2, -1], [0, 2], even =
    [0, 1], [0, 1]; ‖even‖/‖odd‖ = 1/√5 and 1/2, median (1/√5 + 1/2)/2; the even parts all lie
    along [0, 1]."""
    pos = np.array([[2.0, 0.0], [0.0, 3.0]])
    neg = np.array([[-2.0, 2.0], [0.0, -1.0]])
    got = sign_even_part(pos, neg)
    assert got["even_to_odd"] == pytest.approx((1 / np.sqrt(5) + 0.5) / 2)
    assert got["top_share"] == pytest.approx(1.0)
    assert abs(got["direction"] @ np.array([0.0, 1.0])) == pytest.approx(1.0)
    # A linear site (out(-1) = -out(+1)) has none; a feature with no odd part is left out.
    linear = sign_even_part(pos, -pos)
    assert linear["even_to_odd"] == 0.0 and linear["top_share"] == 0.0
    zero_odd = sign_even_part(
        np.array([[1.0, 1.0], [2.0, 0.0]]), np.array([[1.0, 1.0], [0.0, 0.0]])
    )
    assert zero_odd["even_to_odd"] == pytest.approx(1.0)  # only feature 1: even [1, 0], odd [1, 0]
    with pytest.raises(ValueError, match=r"got \(2, 2\) and \(2, 3\)"):
        sign_even_part(pos, np.zeros((2, 3)))


def test_describe_identity_failures_names_the_even_part() -> None:
    failures = {
        "without_own": [],
        "extra": [[1, 3, 0.8]],
        "shared": [[3, [0, 1]]],
        "even_part": {"even_to_odd": 0.2512, "top_share": 0.933, "shared_alignment": [[3, 0.9987]]},
    }
    assert describe_identity_failures(failures)[1:] == [
        "the target's output here has a part even in a feature's value, which one rank-1 "
        "component per feature cannot carry at both signs: ‖even‖ / ‖odd‖ 0.25 (median over the "
        "features), 93% of it along one direction",
        "  |cos| of the shared components' U with that direction: component (|cos|) 3 (1.00)",
    ]
    failures["even_part"]["two_sided"] = [98, 100]
    assert describe_identity_failures(failures)[-1] == (
        "  98 of the 100 features with a component ≥ 0.9 of their own at +0.75 have it also on "
        "(> 0.1) at -0.75 (on at both signs a rank-1 component is linear in the feature's value "
        "and cannot carry the even part; on for one sign only it can)"
    )


def test_identity_ci_error_is_not_the_lenient_l1_distance() -> None:
    """Every feature's own CI at 0.8 (the lenient 'on above 0.5' said recovered): the
    reference's metric counts each as an error."""
    assert identity_ci_error(0.8 * np.eye(4)) == 4


# Columns by mass: c0 (2.22), c1 (1.45), c2 (0.2), c3 (0.17).
DENSE_CASE = np.array(
    [
        [1.0, 0.95, 0.0, 0.05],
        [0.92, 0.5, 0.2, 0.0],
        [0.3, 0.0, 0.0, 0.12],
    ]
)


def test_dense_ci_error_counts_weak_dense_columns_and_stray_entries() -> None:
    # k=2: c0 and c1 each have a strong (>= 0.9) entry; c2's 0.2 and c3's 0.12 are strays.
    assert dense_ci_error(DENSE_CASE, k=2) == 2
    # k=3: c2 has no strong entry (1), c3's 0.12 (1).
    assert dense_ci_error(DENSE_CASE, k=3) == 2
    weak = DENSE_CASE.copy()
    weak[0, 1] = 0.85  # c1 loses its strong entry
    assert dense_ci_error(weak, k=2) == 3
    assert dense_ci_error(np.ones((5, 2)), k=2) == 0
    with pytest.raises(ValueError, match="k=3"):
        dense_ci_error(np.ones((5, 2)), k=3)


def test_alive_counts_components_above_the_threshold() -> None:
    assert alive_components(IDENTITY_CASE) == 4  # 0.15 and 0.2 are above 0.1
    assert alive_components(IDENTITY_CASE, threshold=0.5) == 3


#: The CI [N=5, C=4] of a window of five examples: c0 fires on examples 0 and 3, c1 on
#: example 1, c2 only at 0.1 (not above the threshold), c3 only on example 4 (say an input
#: with two active features), at 0.3.
WINDOW_CASE = np.array(
    [
        [0.95, 0.0, 0.1, 0.0],
        [0.0, 1.0, 0.05, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.5, 0.02, 0.1, 0.0],
        [0.0, 0.0, 0.0, 0.3],
    ]
)
#: Its two features' one-hot CI [F=2, C=4]: c0 and c1 only.
ONE_HOT_OF_WINDOW_CASE = np.array([[0.95, 0.0, 0.1, 0.0], [0.0, 1.0, 0.05, 0.0]])


def test_alive_is_the_reference_count_over_a_window_and_alive_one_hot_pds() -> None:
    """The reference's alive (AliveComponentsTracker): fired (> 0.1) on at least one example
    of the window: c0, c1, c3 = 3 (c2's 0.1 is not above). pd's alive_one_hot: on a one-hot
    input: c0, c1 = 2 (c3 fires only on the window's fifth example)."""
    assert alive_components(WINDOW_CASE) == 3
    table = ground_truth_table(
        {"s": ONE_HOT_OF_WINDOW_CASE}, window_ci={"s": WINDOW_CASE}, identity=("s",)
    )
    assert table["gt/alive/s"] == 3.0
    assert table["gt/alive_one_hot/s"] == 2.0
    assert "gt/alive/s" not in ground_truth_table({"s": ONE_HOT_OF_WINDOW_CASE})


def test_mmcs_and_ml2r_of_a_hand_case() -> None:
    """W rows w0 = (1, 0), w1 = (0, 2); U0 = (1, 1), U1 = (0, 1); V = [[1, 0.5], [-1, 3]].
    Feature 0: c0 writes (1, 1): cos 1/√2, norm ratio √2 (c1 writes (0, 0.5): cos 0).
    Feature 1: c1 writes (0, 3): cos 1, ratio 3/2 (c0 writes (-1, -1): cos −1/√2)."""
    out = mmcs_ml2r(
        np.array([[1.0, 0.0], [0.0, 2.0]]),
        np.array([[1.0, 0.5], [-1.0, 3.0]]),
        np.array([[1.0, 1.0], [0.0, 1.0]]),
    )
    assert out["mmcs"] == pytest.approx((0.7071067811865476 + 1.0) / 2)
    assert out["ml2r"] == pytest.approx((1.4142135623730951 + 1.5) / 2)
    assert out["mmcs_std"] == pytest.approx((1.0 - 0.7071067811865476) / 2)
    assert out["ml2r_std"] == pytest.approx((1.5 - 1.4142135623730951) / 2)


def test_neuron_contributions_of_a_hand_case() -> None:
    """E = [[0.6, 0.8], [1, 0]], one neuron: w_in = [2, 1], w_out = [3, −1]. Into the neuron:
    f0 0.6·2 + 0.8·1 = 2, f1 2; out of it onto the feature: f0 3·0.6 − 0.8 = 1, f1 3.
    Contributions 2·1 = 2 and 2·3 = 6."""
    embed = np.array([[0.6, 0.8], [1.0, 0.0]])
    w_in, w_out = np.array([[[2.0], [1.0]]]), np.array([[[3.0, -1.0]]])
    np.testing.assert_allclose(neuron_contributions(embed, w_in, w_out), [[[2.0], [6.0]]])
    # Two mlp_in components splitting w_in: c0 = [2, 0] (V col (1, 0), U 2), c1 = [0, 1].
    # f0: c0 gives 0.6·2·1 = 1.2, c1 0.8·1·1 = 0.8 -> c0; f1: c0 2·3 = 6, c1 0 -> c0.
    v, u = np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([[[2.0], [1.0]]])
    np.testing.assert_allclose(component_neuron_contributions(embed, v, u, w_out), [[[1.2], [6.0]]])


def test_ground_truth_table_and_plots(tmp_path: Path) -> None:
    ci = {"layers.0.mlp_in": IDENTITY_CASE, "layers.0.mlp_out": DENSE_CASE}
    table = ground_truth_table(ci, identity=("layers.*.mlp_in",), dense={"layers.*.mlp_out": 2})
    assert table == {
        "gt/alive_one_hot/layers.0.mlp_in": 4.0,
        "gt/identity_ci_error/layers.0.mlp_in": 3.0,
        "gt/alive_one_hot/layers.0.mlp_out": 4.0,
        "gt/dense_ci_error/layers.0.mlp_out": 2.0,
        "gt/identity_ci_error": 3.0,
        "gt/dense_ci_error": 2.0,
    }
    perms = plot_permuted_ci(ci, tmp_path / "ci.png", dense={"layers.*.mlp_out": 2})
    assert perms["layers.0.mlp_in"].tolist() == [0, 2, 1, 3]
    assert perms["layers.0.mlp_out"].tolist() == [0, 1, 2, 3]
    rng = np.random.default_rng(0)
    uv = {s: (rng.normal(size=(5, 4)), rng.normal(size=(4, 6))) for s in ci}
    pngs = [
        tmp_path / "ci.png",
        plot_uv(uv, tmp_path / "uv.png", perms),
        plot_neuron_contributions(rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4)),
                                  tmp_path / "nc.png"),
    ]  # fmt: skip
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
