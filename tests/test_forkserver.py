"""The tests' fork server (forkserver.py) starts the trainer's tasks, and
they behave as processes started afresh: exit statuses, signals, logs."""

import signal
import subprocess

import pytest

import conftest
from test_cluster import single_process_flags


def test_trainer_tasks_come_from_the_fork_server(procs, tiny_data, tmp_path):
  if not conftest.USE_FORKSERVER:
    pytest.skip('TESTS_FORKSERVER=0: every task starts afresh, as asked')
  bad = procs.trainer('bad', '--bogus')
  # A forked task: the server's child, not the test's.
  assert isinstance(bad, conftest.ForkedProcess)
  assert bad.wait(60) == 1
  assert "FATAL Flags parsing error: Unknown command line flag 'bogus'" in (
      procs.log('bad'))
  # Killed by a signal: Popen's -N, as for a task started afresh.
  long = procs.trainer('long', '--max_steps=100000',
                       *single_process_flags(tiny_data,
                                             str(tmp_path / 'train')))
  procs.wait_for_line('long', 'Session initialization complete.', 120)
  with open('/proc/%d/status' % long.pid) as f:
    assert 'PPid:\t%d\n' % conftest.FORK_SERVER.proc.pid in f.read()
  long.send_signal(signal.SIGKILL)
  assert long.wait(60) == -signal.SIGKILL
  long.send_signal(signal.SIGKILL)  # Reaped: a no-op, whoever has its PID.
  # A variable TensorFlow reads as it loads: a task started afresh.
  fresh = procs.trainer('fresh', '--bogus', env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  assert isinstance(fresh, subprocess.Popen)
  assert fresh.wait(60) == 1
