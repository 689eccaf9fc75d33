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


CASES = {
    # splits of the 23 steps, linear dtypes, linear h0 options, selective cases,
    # Adam steps of examples/train_mamba_distributed.py
    "2-ranks": ([9, 14], workers.TEST_DTYPES, (False, True), workers.SELECTIVE_CASES, 3),
    "3-uneven-ranks-one-empty": ([6, 0, 17], ("float32", "int32"), (True,),
                                 workers.SELECTIVE_CASES, 0),
}


@pytest.mark.parametrize("name", CASES)
def test_outputs_and_gradients_match_single_process(tmp_path, name):
    """Forward outputs and every gradient of linear_scan and selective_scan_fn equal the
    single-process result (float32 within 1e-5 relative, integers bit-exact)."""
    splits, dtypes, h0_options, selective, training_steps = CASES[name]
    world = len(splits)
    _run(workers.check_all, world, str(tmp_path / "rdv"), splits, str(tmp_path), dtypes,
         h0_options, selective, training_steps)
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # every case ran to its asserts on every rank
        assert len(report["linear"]) == len(dtypes) * 2 * len(h0_options)
        assert len(report["selective"]) == len(selective)
        if training_steps:
            assert report["training"]["loss_diff"] <= 1e-5


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



def test_bench_report_tables_come_from_the_measurements(tmp_path):
    from scanweaver.bench import distributed as bench

    row = lambda s, c, b, n: {"seconds": s, "collective_seconds": c, "compute_seconds": s - c,  # noqa: E731
                              "collective_bytes": b, "local_steps": n}
    keys = ["affine/fwd", "affine/fwd+bwd", "selective/fwd", "selective/fwd+bwd"]
    measured = {
        1: [{k: row(0.2, 0.001, 4096, 1000) for k in keys}],
        2: [{k: row(0.1, 0.002, 8192, 500) for k in keys}, {k: row(0.12, 0.004, 8192, 500) for k in keys}],
    }
    bench.write(measured, tmp_path)
    text = (tmp_path / "DISTRIBUTED.md").read_text()
    assert "| affine/fwd | 2 | 500 | 120.00 | 116.00 | 4.00 | 8192 |" in text  # slowest rank
    model = json.loads((tmp_path / "results" / "distributed.json").read_text())["model_p8"]
    # compute per step 116 us at P = 2, times L/8 steps of the affine case
    assert model["affine/fwd"]["compute_seconds"] == pytest.approx(0.116 / 500 * bench.AFFINE["L"] / 8)
    assert "a model, not a measurement" in text


def test_a_rank_that_stalls_past_the_timeout_gives_a_clear_error(tmp_path):
    _run(workers.peer_stalls, 2, str(tmp_path / "rdv"), str(tmp_path), timeout=90)
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert "scanweaver.distributed" in result["message"], result
    assert result["seconds"] < 10, result  # the 4 s timeout, not the peer's 12 s stall
