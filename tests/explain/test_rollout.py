"""Attention rollout and flow on hand-built layers with known answers, then on MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import AttnlabError
from attnlab.explain.attention_flow import flow, flow_values, residual_matrices, rollout


def causal_uniform(L):
    m = np.tril(np.ones((L, L)))
    return m / m.sum(-1, keepdims=True)


# two layers, two tokens: Ã1 = [[1, 0], [.5, .5]], Ã2 = [[.5, .5], [.25, .75]]
TOY = np.array([[[[1.0, 0.0], [1.0, 0.0]]],     # (W + I) / 2 = Ã1
                [[[0.0, 1.0], [0.5, 0.5]]]])    # (W + I) / 2 = Ã2


def test_residual_matrices():
    np.testing.assert_allclose(residual_matrices(TOY), [[[1, 0], [.5, .5]],
                                                       [[.5, .5], [.25, .75]]])


def test_rollout_of_identity_layers_is_identity():
    w = np.broadcast_to(np.eye(5), (3, 4, 5, 5))
    np.testing.assert_array_equal(rollout(w), np.eye(5))
    np.testing.assert_allclose(flow(w), np.eye(5))


def test_rollout_on_the_toy_graph():
    # Ã2 · Ã1 = [[.5·1 + .5·.5, .5·.5], [.25·1 + .75·.5, .75·.5]]
    np.testing.assert_allclose(rollout(TOY), [[.75, .25], [.625, .375]])


def test_flow_on_the_toy_graph_is_the_hand_computed_max_flow():
    # from top token 0: edges (2,0)->(1,0) .5, (2,0)->(1,1) .5, (1,0)->(0,0) 1, (1,1)->(0,0) .5,
    # (1,1)->(0,1) .5: to input 0 min(.5, 1) + min(.5, .5) = 1; to input 1 min(.5, .5) = .5
    # from top token 1: (2,1)->(1,0) .25, (2,1)->(1,1) .75: to input 0 .25 + .5 = .75; to 1: .5
    np.testing.assert_array_equal(flow_values(residual_matrices(TOY)), [[1, .5], [.75, .5]])
    np.testing.assert_allclose(flow(TOY), [[2 / 3, 1 / 3], [.6, .4]])


def test_flow_is_a_bottleneck_not_a_product():
    # from top token 1 to input 0: via (1,0) min(.5, 1) = .5, via (1,1) min(.5, .5) = .5: 1;
    # rollout multiplies along paths: .5·1 + .5·.5 = .75
    mats = np.array([[[1, 0], [.5, .5]], [[1, 0], [.5, .5]]])
    assert flow_values(mats)[1, 0] == pytest.approx(1.0)
    np.testing.assert_allclose((mats[1] @ mats[0])[1], [.75, .25])


@pytest.mark.parametrize("heads", ["mean", 1, [0, 2]])
def test_rows_sum_to_one_and_causal_mask_is_kept(heads):
    rng = np.random.default_rng(0)
    L = 6
    w = rng.random((3, 3, L, L)) * np.tril(np.ones((L, L)))
    w /= w.sum(-1, keepdims=True)
    for m in (rollout(w, heads), flow(w, heads)):
        np.testing.assert_allclose(m.sum(-1), 1, atol=1e-12)
        assert (np.triu(m, 1) == 0).all() and (m >= 0).all()


def test_heads_select_which_heads_average():
    w = np.stack([np.eye(3), causal_uniform(3)])[None]  # (1, 2, 3, 3)
    np.testing.assert_allclose(rollout(w, 0), np.eye(3))
    np.testing.assert_allclose(rollout(w, [1]), (causal_uniform(3) + np.eye(3)) /
                               (causal_uniform(3) + np.eye(3)).sum(-1, keepdims=True))


def test_bad_arguments():
    w = np.ones((1, 2, 3, 3)) / 3
    with pytest.raises(AttnlabError, match=r"heads: expected indices in 0\.\.1"):
        rollout(w, 2)
    with pytest.raises(AttnlabError, match="heads: expected 'mean'"):
        rollout(w, "max")
    with pytest.raises(AttnlabError, match=r"weights: expected \(layers, H, L, L\)"):
        flow(np.ones((2, 3, 3)))


def test_flow_values_match_networkx_on_random_layers():
    import networkx as nx

    rng = np.random.default_rng(1)
    n, L = 3, 5
    w = rng.random((n, 2, L, L))
    mats = residual_matrices(w / w.sum(-1, keepdims=True))
    graph = nx.DiGraph()
    for layer in range(n):
        for i in range(L):
            for j in range(L):
                graph.add_edge((layer + 1, i), (layer, j), capacity=mats[layer, i, j])
    want = [[nx.maximum_flow_value(graph, (n, i), (0, j)) for j in range(L)] for i in range(L)]
    np.testing.assert_allclose(flow_values(mats), want, atol=L * 2.0 ** -26)


def test_public_names_stay_functions():
    import attnlab.explain as explain

    for _ in range(2):  # importing the module behind them must not shadow them
        assert callable(explain.rollout) and callable(explain.flow)
        assert callable(explain.head_stats)
    np.testing.assert_allclose(explain.rollout(TOY), rollout(TOY))
