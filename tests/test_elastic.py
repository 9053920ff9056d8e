"""Workers that come and go: a worker lost for good (killed, never started
again) does not stop a run, synchronous or not, with 1 and 2 ps tasks;
workers started mid-run in listed slots train; and every ps exits by itself
once the workers that took part are done or gone. Real processes on free
ports; assertions on the global step, checkpoints, lines and exit codes."""

import os
import signal

import pytest

from helpers import assert_clean_logs, checkpoint_step, cluster_flags
from helpers import PACED, hosts, kill9, paused, start_cluster, steps
from helpers import wait_until

LOST = ['--lost_worker_secs=3', '--wait_report_secs=2']


# Run in worker 2 before the trainer: after its 10th step (in synchronous
# training it ends with the token of its next step taken), once the file
# `seen` exists, it stops the ps tasks and itself.
STOP_AFTER_10_STEPS = """
import os, signal, time
from training.session import creator
step, done = creator.run_step, [0]
def stop_after(*args):
  result = step(*args)
  done[0] += 1
  if done[0] == 10:
    while not os.path.exists(%(seen)r):
      time.sleep(0.02)
    for pid in %(ps_pids)r:
      os.kill(pid, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)
  return result
creator.run_step = stop_after
"""

# Run in the chief before the trainer: makes the file `seen` once a probe
# of its watch on the workers finds worker 2 (at `host`) answering.
SEES_WORKER_2 = """
from training.health import liveness
probe = liveness.Tracker.probe
def probe_and_say(self, indices=None, *args, **kwargs):
  down = probe(self, indices, *args, **kwargs)
  if indices is not None and kwargs.get('answers') and any(
      self.hosts[i] == %(host)r and i not in down for i in indices):
    open(%(seen)r, 'w').close()
  return down
liveness.Tracker.probe = probe_and_say
"""

# Run in worker 1 before the trainer: its first step waits for the file
# (the path formatted in).
AFTER_THE_FILE = """
import os, time
from training.session import creator
step = creator.run_step
def after_the_file(*args):
  while not os.path.exists(%r):
    time.sleep(0.02)
  creator.run_step = step
  return step(*args)
creator.run_step = after_the_file
"""


def stopped(pid):
  """Whether process pid is stopped (state T in /proc/PID/stat)."""
  with open('/proc/%d/stat' % pid) as f:
    return f.read().rsplit(')', 1)[1].split()[0] == 'T'


def lose_worker_2(procs, flags, num_ps, signum=signal.SIGKILL):
  """Starts num_ps ps tasks and 3 workers; worker 2, after 10 steps,
  holding the token of its next step, stops the ps tasks and itself; it is
  then killed (-9), or sent signum and let go on to handle it (SIGTERM: a
  worker stopped, as Kubernetes scales a Job down), and never started
  again. Returns the chief's line that names it. The ps tasks stay stopped
  until that line: the run cannot end before the chief sees the loss,
  however fast the machine. Worker 2 stops the ps tasks, and worker 1 makes
  its first step, only once the chief's watch has seen worker 2 answer:
  else the ps tasks, stopped while the chief's session starts (its hooks
  run after the sync thread gives the first tokens), would block it before
  its watch sees worker 2, and an asynchronous worker 1 could end the run
  before then."""
  seen = os.path.join(procs.log_dir, 'chief_saw_worker2')
  for i in range(num_ps):
    procs.trainer('ps%d' % i, '--job_name=ps', '--task_index=%d' % i, *flags)
  ps_pids = [procs.procs['ps%d' % i].pid for i in range(num_ps)]
  procs.trainer('worker2', '--job_name=worker', '--task_index=2', *flags,
                fault=STOP_AFTER_10_STEPS % dict(ps_pids=ps_pids, seen=seen))
  procs.trainer('worker1', '--job_name=worker', '--task_index=1', *flags,
                fault=AFTER_THE_FILE % seen)
  procs.trainer('worker0', '--job_name=worker', '--task_index=0', *flags,
                fault=SEES_WORKER_2 % dict(
                    host=hosts(flags, 'worker_hosts')[2], seen=seen))
  try:
    wait_until(lambda: stopped(procs.procs['worker2'].pid), 300,
               'worker 2 stopping after 10 steps', procs)
    if signum == signal.SIGKILL:
      kill9(procs, 'worker2')
    else:
      procs.procs['worker2'].send_signal(signum)
      procs.procs['worker2'].send_signal(signal.SIGCONT)
      assert procs.procs['worker2'].wait(60) == 128 + signum
      # (Its stdout and stderr reach the log in either order: a line.)
      assert ('Worker 2: %s; exiting' % signal.Signals(signum).name
              in procs.log('worker2').splitlines())
    del procs.procs['worker2']
    line = 'Worker 0: lost worker 2 at %s (Connection refused for 3 s); ' % (
        hosts(flags, 'worker_hosts')[2])
    procs.wait_for_line('worker0', line, 120)
  finally:
    for pid in ps_pids:
      os.kill(pid, signal.SIGCONT)
  return next(l for l in procs.log('worker0').splitlines()
              if l.startswith(line))


@pytest.mark.slow
@pytest.mark.parametrize('num_ps, replicas, share, signum', [
    (2, 3, 'compute its share of each update of 3 gradients', signal.SIGKILL),
    (1, 2, 'make each update of 2 gradients', signal.SIGKILL),
    (1, 3, 'compute its share of each update of 3 gradients', signal.SIGTERM)],
                         ids=['2ps', '1ps_backup', '1ps_stopped'])
def test_a_synchronous_worker_lost_for_good_does_not_stop_the_run(
    procs, tiny_data, tmp_path, num_ps, replicas, share, signum):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3, num_ps=num_ps) + [
      '--max_steps=60', '--replicas_to_aggregate=%d' % replicas] + LOST
  workers = hosts(flags, 'worker_hosts')
  line = lose_worker_2(procs, flags, num_ps, signum)
  assert line == (
      'Worker 0: lost worker 2 at %s (Connection refused for 3 s); the 2 '
      'left %s; start it again and it rejoins' % (workers[2], share))
  expected = {'ps%d' % i: 0 for i in range(num_ps)}
  expected.update(worker0=0, worker1=0)
  assert procs.wait_all(timeout=600) == expected, procs.tails()
  for i in range(num_ps):
    assert procs.log('ps%d' % i).endswith(
        'ps %d: 2 of 3 worker(s) finished; not waiting for worker 2 at %s '
        '(Connection refused for 3 s), gone; exiting\n' % (i, workers[2]))
  assert 'Worker 0: training finished at global step 60' in procs.log(
      'worker0')
  assert checkpoint_step(train_dir) == 60


@pytest.mark.slow
def test_an_asynchronous_worker_lost_for_good_lets_the_ps_exit(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3) + [
      '--max_steps=100', '--nosync_replicas'] + LOST
  workers = hosts(flags, 'worker_hosts')
  line = lose_worker_2(procs, flags, 1)
  assert line == ('Worker 0: lost worker 2 at %s (Connection refused for 3 '
                  's); the 2 left train on; start it again and it rejoins' %
                  workers[2])
  assert procs.wait_all(timeout=600) == {'ps0': 0, 'worker0': 0,
                                         'worker1': 0}, procs.tails()
  assert procs.log('ps0').endswith(
      'ps 0: 2 of 3 worker(s) finished; not waiting for worker 2 at %s '
      '(Connection refused for 3 s), gone; exiting\n' % workers[2])
  assert checkpoint_step(train_dir) >= 100


@pytest.mark.slow
@pytest.mark.parametrize('sync', [True, False], ids=['sync', 'async'])
def test_workers_join_a_running_job_in_listed_slots(procs, tiny_data,
                                                    tmp_path, sync):
  """4 slots listed, workers 0 and 1 started; once they train, the ps is
  paused (SIGSTOP) while workers 2 and 3 start (and, asynchronous, workers
  0 and 1 until 2 and 3 train; synchronous, 0 and 1 are paced: alone they
  need 30 s at least for the 1,200 gradients), so that the run cannot end
  before they train; then every worker trains and every task exits 0."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=4) + [
      '--max_steps=300'] + LOST + ([] if sync else ['--nosync_replicas'])
  start_cluster(procs, flags, num_workers=2,
                faults={'worker0': PACED, 'worker1': PACED} if sync else None)
  wait_until(lambda: len(steps(procs, 'worker0')) >= 2, 300,
             'the first two workers training', procs)
  procs.procs['ps0'].send_signal(signal.SIGSTOP)
  try:
    for i in (2, 3):
      procs.trainer('worker%d' % i, '--job_name=worker',
                    '--task_index=%d' % i, *flags)
    for i in (2, 3):
      procs.wait_for_line('worker%d' % i, 'Worker %d: Waiting for session '
                          'to be initialized...' % i, 300)
    if not sync:  # Alone, 0 and 1 could finish before 2 and 3 train.
      for i in (0, 1):
        procs.procs['worker%d' % i].send_signal(signal.SIGSTOP)
  finally:
    procs.procs['ps0'].send_signal(signal.SIGCONT)
  try:
    if not sync:
      wait_until(lambda: steps(procs, 'worker2') and steps(procs, 'worker3'),
                 300, 'workers 2 and 3 training', procs)
  finally:
    if not sync:
      for i in (0, 1):
        procs.procs['worker%d' % i].send_signal(signal.SIGCONT)
  assert procs.wait_all(timeout=600) == {
      'ps0': 0, 'worker0': 0, 'worker1': 0, 'worker2': 0, 'worker3': 0}, (
          procs.tails())
  for i in (2, 3):
    assert steps(procs, 'worker%d' % i), procs.log('worker%d' % i)
  assert procs.log('ps0').endswith(
      'ps 0: all 4 worker(s) finished; exiting\n')
  assert checkpoint_step(train_dir) >= 300
  assert_clean_logs(procs)


@pytest.mark.slow
def test_a_lost_worker_started_again_rejoins(procs, tiny_data, tmp_path):
  """Synchronous, 1 ps: worker 2 lost for good as above, then started
  again with the same command (the ps paused until it is up, so that the
  run cannot end first): the chief says it is back, and it trains."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3) + [
      '--max_steps=300'] + LOST
  workers = hosts(flags, 'worker_hosts')
  lose_worker_2(procs, flags, 1)
  with paused(procs, 'ps0'):
    procs.trainer('worker2', '--job_name=worker', '--task_index=2', *flags)
    procs.wait_for_line('worker2', 'Worker 2: Waiting for session to be '
                        'initialized...', 300)
  procs.wait_for_line('worker0', 'Worker 0: worker 2 at %s is back; it '
                      'trains again' % workers[2], 300)
  assert procs.wait_all(timeout=600) == {
      'ps0': 0, 'worker0': 0, 'worker1': 0, 'worker2': 0}, procs.tails()
  assert steps(procs, 'worker2'), procs.log('worker2')
  assert procs.log('ps0').endswith('ps 0: all 3 worker(s) finished; exiting\n')
  assert checkpoint_step(train_dir) >= 300
