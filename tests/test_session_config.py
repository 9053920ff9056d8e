"""training/cluster/session_config.py: each task's threads are its share of
the cores it may use (usable_cores, here 6; a real CPU quota's side is in
test_machines.py)."""

import pytest

from training.cluster import session_config

WORKERS = ['localhost:2222', 'localhost:2223', 'other:2222']
PS = ['localhost:2224', 'ps1:2222']


@pytest.fixture(autouse=True)
def six_cores(monkeypatch):
  monkeypatch.setattr(session_config, 'usable_cores', lambda: 6)


def test_a_ps_beside_the_workers_gets_its_share_of_the_host():
  """A ps on a host with 2 workers: a third of the 6 cores for each pool;
  a ps on a host of its own, every core."""
  shared = session_config.session_config('ps', 0, WORKERS, ps_hosts=PS)
  assert (shared.inter_op_parallelism_threads,
          shared.intra_op_parallelism_threads) == (2, 2)
  alone = session_config.session_config('ps', 1, WORKERS, ps_hosts=PS)
  assert (alone.inter_op_parallelism_threads,
          alone.intra_op_parallelism_threads) == (6, 6)


def test_a_ps_without_the_cluster_keeps_tensorflows_pools():
  """0: TensorFlow sizes the pools (every core)."""
  config = session_config.session_config('ps', 0)
  assert (config.inter_op_parallelism_threads,
          config.intra_op_parallelism_threads) == (0, 0)


def test_workers_on_one_host_share_its_cores_and_only_the_workers_count():
  """A worker's intra-op threads: the 6 cores over the 2 workers on its
  host, the ps there (mostly waiting) not counted; its inter-op pool is
  TensorFlow's. A worker alone on its host: every core."""
  config = session_config.session_config('worker', 0, WORKERS, ps_hosts=PS)
  assert (config.inter_op_parallelism_threads,
          config.intra_op_parallelism_threads) == (0, 3)
  assert session_config.session_config(
      'worker', 2, WORKERS, ps_hosts=PS).intra_op_parallelism_threads == 6
