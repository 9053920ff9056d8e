"""The tests' fork server (forkserver.py) starts the trainer's tasks, and
they behave as processes started afresh: exit statuses, signals, logs;
none gets the TensorFlow variables the caller's shell exported."""

import json
import os
import signal
import subprocess
import sys

import pytest

import forkserver_client
import helpers
from helpers import single_process_flags


@pytest.mark.slow
def test_trainer_tasks_come_from_the_fork_server(procs, tiny_data, tmp_path):
  if not forkserver_client.USE_FORKSERVER:
    pytest.skip('TESTS_FORKSERVER=0: every task starts afresh, as asked')
  bad = procs.trainer('bad', '--bogus')
  # A forked task: the server's child, not the test's.
  assert isinstance(bad, forkserver_client.ForkedProcess)
  assert bad.wait(60) == 1
  assert "FATAL Flags parsing error: Unknown command line flag 'bogus'" in (
      procs.log('bad'))
  # Killed by a signal: Popen's -N, as for a task started afresh.
  long = procs.trainer('long', '--max_steps=100000',
                       *single_process_flags(tiny_data,
                                             str(tmp_path / 'train')))
  procs.wait_for_line('long', 'Session initialization complete.', 120)
  with open('/proc/%d/status' % long.pid) as f:
    assert 'PPid:\t%d\n' % forkserver_client.FORK_SERVER.proc.pid in f.read()
  long.send_signal(signal.SIGKILL)
  assert long.wait(60) == -signal.SIGKILL
  long.send_signal(signal.SIGKILL)  # Reaped: a no-op, whoever has its PID.
  # A variable TensorFlow reads as it loads: a task started afresh.
  fresh = procs.trainer('fresh', '--bogus', env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  assert isinstance(fresh, subprocess.Popen)
  assert fresh.wait(60) == 1


# Run by a Python of its own (the caller's shell, in effect): imports the
# suite's helpers, starts a task as a test does (from the fork server, or
# afresh with TESTS_FORKSERVER=0), and prints its environment and the fork
# server's, as the kernel holds them.
PROBE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import forkserver_client
import helpers
SHOW = 'import json, os; print("TASK " + json.dumps(dict(os.environ)))'
procs = helpers.Processes(sys.argv[2])
try:
  if forkserver_client.USE_FORKSERVER:
    procs.trainer('probe', fault=SHOW + '; os._exit(0)')
  else:
    procs.start('probe', ['-c', SHOW])
  assert procs.procs['probe'].wait(120) == 0, procs.log('probe')
  print(procs.log('probe'))
  if forkserver_client.FORK_SERVER.proc:
    with open('/proc/%d/environ' % forkserver_client.FORK_SERVER.proc.pid) as f:
      print('SERVER ' + json.dumps(dict(
          v.split('=', 1) for v in f.read().split('\0') if '=' in v)))
finally:
  procs.kill_all()
  forkserver_client.FORK_SERVER.stop()
"""


@pytest.mark.slow
def test_the_callers_tensorflow_variables_reach_no_task(tmp_path):
  # Exported in the caller's shell, they would change what a task does or
  # prints (and the fork server's TensorFlow would load with them, unlike
  # the tasks it forks): the suite drops them as it starts.
  caller = {'TF_CONFIG': '{"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, '
                         '"task": {"type": "worker", "index": 0}}',
            'TF_CPP_MIN_LOG_LEVEL': '2', 'CUDA_VISIBLE_DEVICES': '',
            'TF_GPU_ALLOCATOR': 'cuda_malloc_async', 'GRPC_VERBOSITY': 'debug',
            'https_proxy': 'http://proxy.invalid:3128',
            'SUITE_PROBE': 'passed on'}
  code, out = helpers.run_in_group(
      [sys.executable, '-c', PROBE, os.path.join(helpers.ROOT, 'tests'),
       str(tmp_path)], timeout=300, env=dict(os.environ, **caller))
  assert code == 0, out
  seen = {line.split(' ', 1)[0]: json.loads(line.split(' ', 1)[1])
          for line in out.splitlines()
          if line.startswith(('TASK ', 'SERVER '))}
  assert set(seen) == ({'TASK', 'SERVER'} if forkserver_client.USE_FORKSERVER
                       else {'TASK'}), out
  for name, environ in seen.items():
    assert environ['SUITE_PROBE'] == 'passed on', name
    assert not set(caller) - {'SUITE_PROBE'} & set(environ), (name, environ)
