import numpy as np

from roofcal.grouping import members, unique_rows


def test_unique_rows_is_numpys_unique_over_rows():
    a = np.array([[2.0, 1.0], [1.0, 5.0], [2.0, 1.0], [1.0, 0.5], [1.0, 5.0]])
    u, inv = unique_rows(a)
    assert u.tolist() == [[1.0, 0.5], [1.0, 5.0], [2.0, 1.0]]      # lexicographic, first column first
    assert inv.tolist() == [2, 1, 2, 0, 1]
    rng = np.random.default_rng(3)
    for n, k in ((5000, 3), (200, 8), (1, 4)):
        b = rng.integers(0, 6, (n, k)) * 0.5
        want_u, want_inv = np.unique(b, axis=0, return_inverse=True)
        got_u, got_inv = unique_rows(b)
        assert np.array_equal(got_u, want_u) and np.array_equal(got_inv, want_inv.reshape(-1))
    u, inv = unique_rows(np.zeros((0, 3)))
    assert u.shape == (0, 3) and inv.shape == (0,)


def test_members_are_each_labels_rows_in_order():
    labels = np.array([2, 0, 2, 3, 0, 2])
    got = members(labels)
    assert [g.tolist() for g in got] == [[1, 4], [], [0, 2, 5], [3]]      # label 1 unused
    assert [g.tolist() for g in members(labels, 5)][4] == []
    assert members(np.zeros(0, int)) == []
    rng = np.random.default_rng(4)
    lab = rng.integers(0, 50, 3000)
    assert all(np.array_equal(g, np.flatnonzero(lab == i)) for i, g in enumerate(members(lab)))
