"""Communication counters (distributed/comm_counters.py): each collective and send counts the bytes this rank hands
over, by collective and by group, only while count_communication() is open; nested counters both count."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist


def test_collectives_count_what_they_hand_over_by_collective_and_group():
    group = dist.default_group()
    x = it.tensor(np.ones(100, np.float32))
    whole = it.tensor(np.zeros(100, np.float32))
    dist.all_reduce(x)  # not counted: no counter open
    with dist.count_communication() as outer:
        dist.all_reduce(x)
        with dist.count_communication() as inner:
            dist.all_gather_into_tensor(whole, x)
            dist.reduce_scatter_tensor(x, whole)
        dist.broadcast(it.tensor(np.ones(3, np.float64)), 0)
    assert inner.by_collective() == {"all_gather_into_tensor": 400, "reduce_scatter_tensor": 400}
    assert outer.by_collective() == {"all_reduce": 400, "all_gather_into_tensor": 400, "reduce_scatter_tensor": 400,
                                     "broadcast": 24}
    assert outer.by_group() == {tuple(group.ranks): 1224} and outer.total_bytes == 1224
    assert outer.rows()[0][2] == 1 and all(row[1] == tuple(group.ranks) for row in outer.rows())
    with dist.count_communication() as later:
        pass
    assert later.total_bytes == 0 and later.rows() == []
