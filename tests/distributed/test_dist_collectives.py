"""The collectives of pipeline_opt._core.distributed on a real 2-rank gloo process group (torch.multiprocessing)."""

from __future__ import annotations

import json

import torch.multiprocessing as mp
from dist_workers import collectives_rank, free_port, live_children


def test_two_gloo_ranks_agree_gather_and_leave_nothing_behind(tmp_path):
    before = live_children()
    mp.spawn(collectives_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    for rank, out in enumerate((r0, r1)):
        info = out["info"]
        assert (info["rank"], info["world_size"], info["backend"], info["initialized"]) == (rank, 2, "gloo", True)
        # no LOCAL_WORLD_SIZE in the environment (mp.spawn): every rank is assumed to share the host
        assert info["local_world_size"] == 2 and info["local_rank"] == rank
        assert out["main"] is (rank == 0)
    # both ranks adopt the configuration with the best worst-rank throughput, not their own best
    assert r0["agreed"] == r1["agreed"] == {"num_workers": 2, "pin_memory": False}
    assert r0["unscored"] == r1["unscored"] == {"num_workers": 7}
    assert [g["rank"] for g in r0["gathered"]] == [0, 1] and r1["gathered"] is None
    assert len({g["pid"] for g in r0["gathered"]}) == 2

    assert live_children() <= before, f"orphan processes left: {sorted(live_children() - before)}"
