"""cluster-consistency on ranks' records: who is named when a version differs."""

from sftdoctor.checks.cluster import cluster_consistency


def ranks(*torches):
    return {"ranks": [{"rank": i, "local_rank": 0, "node": f"node{i}", "torch": t} for i, t in enumerate(torches)]}


def test_the_odd_node_is_named_against_the_rest():
    [finding] = cluster_consistency(ranks("2.13.0", "2.13.0", "2.12.1"))
    assert finding.title == "torch differs across ranks: node node2 (rank 2) differs from the rest"


def test_a_tie_names_every_side_instead_of_blaming_one():
    [finding] = cluster_consistency(ranks("2.13.0", "2.12.1"))
    assert finding.title == "torch differs across ranks: node node0 (rank 0); node node1 (rank 1) disagree"
    assert "2.13.0 on 1 rank, 2.12.1 on 1 rank" in finding.detail
