"""scanweaver.distributed over real gloo process groups (2 and 3 local processes)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="scanweaver.distributed needs torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import distributed_workers as workers  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def _run(fn, world, *args, timeout=120):
    ctx = mp.start_processes(fn, args=(world, *args), nprocs=world, join=False,
                             start_method="spawn")
    while not ctx.join(timeout=timeout):
        pass


def _check(tmp_path, splits, dtypes, h0_options):
    world = len(splits)
    _run(workers.check_linear_scan, world, str(tmp_path / "rdv"), splits, str(tmp_path),
         dtypes, h0_options)
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # every dtype x direction x h0 case ran on every rank
        assert len(report) == len(dtypes) * 2 * len(h0_options)


def test_linear_scan_two_ranks_every_dtype_direction_and_h0(tmp_path):
    _check(tmp_path, [9, 14], workers.ALL_DTYPES, (False, True))


def test_linear_scan_three_uneven_ranks_one_empty(tmp_path):
    _check(tmp_path, [5, 0, 18], ("float32", "int32"), (True,))


def test_a_rank_that_leaves_gives_a_clear_error_not_a_hang(tmp_path):
    _run(workers.peer_leaves, 2, str(tmp_path / "rdv"), str(tmp_path), timeout=90)
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert "scanweaver.distributed" in result["message"], result
    assert "rank 0 of 2" in result["message"], result
    assert result["seconds"] < 60


def test_needs_an_initialised_group():
    import scanweaver.distributed as sd
    from scanweaver.errors import ScanWeaverError

    with pytest.raises(ScanWeaverError, match="init_process_group"):
        sd.linear_scan(torch.ones(2, 3), torch.ones(2, 3))


@pytest.mark.parametrize("splits", [[9, 14], [6, 0, 17]], ids=["2-ranks", "3-ranks-one-empty"])
def test_selective_scan_matches_single_process(tmp_path, splits):
    world = len(splits)
    _run(workers.check_selective_scan, world, str(tmp_path / "rdv"), splits, str(tmp_path))
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(report) == len(workers.SELECTIVE_CASES)
