"""A task that hangs or lags, in real processes on free ports: a worker
stopped (SIGSTOP: its port still takes connections, nothing answers) is
named and the others go on, and it trains again once continued; a worker
three times slower than it can be is set aside and taken back once it keeps
pace; a hung ps is named by each worker, and nothing else changes, also
while they wait for their session; a hung chief is named by the other
worker, which waits for it. Every stopped process is continued before any
teardown; assertions on lines, global steps, checkpoints and exit codes,
never on which worker wins."""

import re
import signal

import pytest

from helpers import PACED, checkpoint_step, cluster_flags, hosts
from helpers import paused, start_cluster
from helpers import steps, wait_until

LOST = ['--lost_worker_secs=3', '--wait_report_secs=2']

# Run in worker 2 before the trainer: each of its steps, and each trial
# step while set aside, takes three times as long as it would (a sleep of
# twice its time), until the file %r exists: a straggler however fast the
# machine, that recovers when the test says.
STRAGGLER = """
import os, time
from training.health import stragglers
from training.session import creator
step, trial = creator.run_step, stragglers.StandAsideHook.trial_ms
def slow(seconds):
  if not os.path.exists(%r):
    time.sleep(2 * seconds)
def slow_step(*args):
  start = time.time()
  result = step(*args)
  slow(time.time() - start)
  return result
def slow_trial(self, session):
  start = time.time()
  ms = trial(self, session)
  took = time.time() - start
  slow(took)
  return ms * (time.time() - start) / took
creator.run_step = slow_step
stragglers.StandAsideHook.trial_ms = slow_trial
"""


def start_sync_cluster(procs, flags, fault2=None, paced=True):
  """1 ps and 3 synchronous workers; with paced, workers 0 and 1 take 20
  steps a second at most, so that the run lasts however fast the
  machine."""
  faults = {'worker2': fault2}
  if paced:
    faults.update(worker0=PACED, worker1=PACED)
  start_cluster(procs, flags, num_workers=3, faults=faults)


def start_training_pair(procs, data_dir, train_dir):
  """1 ps and 2 paced synchronous workers to --max_steps=120 (20 steps a
  second at most: 5 s at least after the first ten); returns their flags
  once both train."""
  flags = cluster_flags(data_dir, train_dir, num_workers=2) + [
      '--max_steps=120'] + LOST
  start_cluster(procs, flags, faults={'worker0': PACED, 'worker1': PACED})
  wait_until(lambda: len(steps(procs, 'worker1')) >= 2, 300,
             'the workers training', procs)
  return flags


def reached(procs, names=('worker0', 'worker1')):
  """The highest global step the named workers printed (0: none yet)."""
  return max(sum((steps(procs, n) for n in names), [0]))


@pytest.mark.slow
def test_a_hung_worker_is_named_and_trains_again_when_it_answers(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3) + [
      '--max_steps=150'] + LOST
  workers = hosts(flags, 'worker_hosts')
  start_sync_cluster(procs, flags)
  wait_until(lambda: len(steps(procs, 'worker2')) >= 2, 300,
             'worker 2 training', procs)
  with paused(procs, 'worker2'):
    line = 'Worker 0: lost worker 2 at %s (' % workers[2]
    procs.wait_for_line('worker0', line, 120)
    named = next(l for l in procs.log('worker0').splitlines()
                 if l.startswith(line))
    # Silent on its port, or stopped while the others waited on it.
    assert re.fullmatch(
        re.escape(line) + r'(takes connections but does not answer for 3 '
        r's|no step for \d+ s while the others waited on it; its port '
        r'takes connections)\); the 2 left compute its share of each '
        r'update of 3 gradients; start it again and it rejoins', named), named
    # The others go on without it.
    at_loss = reached(procs)
    wait_until(lambda: reached(procs) >= at_loss + 10, 300,
               'workers 0 and 1 training on without worker 2', procs)
    before = len(steps(procs, 'worker2'))
  procs.wait_for_line('worker0', 'Worker 0: worker 2 at %s is back; it '
                      'trains again' % workers[2], 120)
  wait_until(lambda: len(steps(procs, 'worker2')) > before, 300,
             'worker 2 training again', procs)
  assert procs.wait_all(timeout=300) == {
      'ps0': 0, 'worker0': 0, 'worker1': 0, 'worker2': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 150


@pytest.mark.slow
def test_a_straggler_is_set_aside_and_taken_back(procs, tiny_data,
                                                 tmp_path):
  train_dir = str(tmp_path / 'train')
  recovered = str(tmp_path / 'recovered')
  # Its steps take three times their time: on a loaded machine seconds
  # without a step, a straggler's pace, not a lost worker's (20 s without
  # one; one silent for half that is not judged a straggler).
  flags = cluster_flags(tiny_data, train_dir, num_workers=3) + [
      '--max_steps=100000', '--lost_worker_secs=20', '--wait_report_secs=2']
  workers = hosts(flags, 'worker_hosts')
  start_sync_cluster(procs, flags, fault2=STRAGGLER % recovered, paced=False)
  aside = re.compile(
      r'^Worker 0: worker 2 at %s lags: the updates waited for it alone '
      r'(\d+)%% of the last 10 s \((\d+\.\d) steps a second against about '
      r'(\d+\.\d) for the others\); set aside, the others make its share '
      r'of each update of 3 gradients, and it is taken back once it keeps '
      r'pace$' %
      re.escape(workers[2]), re.M)
  wait_until(lambda: aside.search(procs.log('worker0')), 300,
             'the chief setting worker 2 aside', procs)
  # Once it has timed its first trial steps, slow.
  wait_until(lambda: re.search(
      r'^Worker 2: set aside by the chief \(a trial step takes \d+ ms '
      r'here\); the others make its share of each update while it times '
      r'one every 2 s$', procs.log('worker2'), re.M), 60,
             'worker 2 standing aside', procs)
  # Aside, it takes no token: the global step goes on without its steps.
  mine = len(steps(procs, 'worker2'))
  at = reached(procs)
  # Well within the chief's 60 s before it takes it back to see.
  wait_until(lambda: reached(procs) >= at + 10, 300,
             'training on without worker 2', procs)
  assert len(steps(procs, 'worker2')) == mine
  open(recovered, 'w').close()
  back = re.compile(r'^Worker 0: worker 2 at %s keeps pace again \(a trial '
                    r'step in (\d+) ms, (\d+) ms when set aside\); taken '
                    r'back$' % re.escape(workers[2]), re.M)
  wait_until(lambda: back.search(procs.log('worker0')), 120,
             'the chief taking worker 2 back', procs)
  procs.wait_for_line('worker2', 'Worker 2: taken back by the chief; it '
                      'trains again', 60)
  wait_until(lambda: len(steps(procs, 'worker2')) >= mine + 2, 120,
             'worker 2 training again', procs)
  procs.procs['worker0'].send_signal(signal.SIGTERM)  # Saves, exits.
  assert procs.procs['worker0'].wait(120) == 128 + signal.SIGTERM
  assert 'Worker 0: SIGTERM: wrote ' in procs.log('worker0')
  for name in ('worker1', 'worker2', 'ps0'):
    procs.procs[name].send_signal(signal.SIGTERM)
  procs.wait_all(timeout=120)
  # Nothing else said of it: neither lost nor hung.
  assert 'lost worker 2' not in procs.log('worker0')


@pytest.mark.slow
def test_a_hung_ps_is_named_by_each_worker_and_nothing_else_changes(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = start_training_pair(procs, tiny_data, train_dir)
  ps = hosts(flags, 'ps_hosts')[0]
  with paused(procs, 'ps0'):
    for i in (0, 1):
      procs.wait_for_line(
          'worker%d' % i, 'Worker %d: ps 0 at %s takes connections but has '
          'not answered for 3 s: check that machine (its load, memory, disk '
          'and network); training waits for it' % (i, ps), 60)
  for i in (0, 1):
    procs.wait_for_line('worker%d' % i,
                        'Worker %d: ps 0 at %s answers again' % (i, ps), 60)
  assert procs.wait_all(timeout=300) == {'ps0': 0, 'worker0': 0,
                                         'worker1': 0}, procs.tails()
  assert 'lost worker' not in procs.log('worker0')
  assert 'lags' not in procs.log('worker0')
  assert 'lost the chief' not in procs.log('worker1')
  assert checkpoint_step(train_dir) == 120


@pytest.mark.slow
def test_a_ps_hung_before_the_session_is_named_by_the_workers_waiting(
    procs, tiny_data, tmp_path):
  """ps 0 stopped (SIGSTOP) once it serves, before any worker starts: its
  port still takes connections, so only a gRPC call with a deadline finds
  it; each worker's session wait names it, and once continued the run ends
  at --max_steps. Before, the chief sat at `Initializing session...`."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=2) + [
      '--max_steps=20'] + LOST
  ps = hosts(flags, 'ps_hosts')[0]
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  procs.wait_for_line('ps0', 'ps 0: serving on', 120)
  with paused(procs, 'ps0'):  # Its port takes connections; nothing answers.
    for i in (1, 0):
      procs.trainer('worker%d' % i, '--job_name=worker', '--task_index=%d' % i,
                    *flags)
    for i in (0, 1):
      procs.wait_for_line(
          'worker%d' % i, 'Worker %d: waiting for ps 0 at %s (takes '
          'connections but does not answer): check that machine (its load, '
          'memory, disk and network)' % (i, ps), 120)
  assert procs.wait_all(timeout=300) == {'ps0': 0, 'worker0': 0,
                                         'worker1': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 20


@pytest.mark.slow
def test_a_hung_chief_is_named_and_the_run_ends_once_it_answers(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = start_training_pair(procs, tiny_data, train_dir)
  chief = hosts(flags, 'worker_hosts')[0]
  with paused(procs, 'worker0'):
    procs.wait_for_line(
        'worker1', 'Worker 1: lost the chief, worker 0 at %s (takes '
        'connections but does not answer); no checkpoint is written until '
        'it is back, and the steps since its last one are only on the ps '
        'tasks, which keep them: start it again and it goes on from there. '
        'This worker waits for it' % chief, 60)
  procs.wait_for_line('worker1', 'Worker 1: the chief, worker 0 at %s, is '
                      'back; going on' % chief, 60)
  assert procs.wait_all(timeout=300) == {'ps0': 0, 'worker0': 0,
                                         'worker1': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 120
  # The chief's own pause is not a worker's: it names none lost or lagging.
  assert 'lost worker' not in procs.log('worker0')
  assert 'lags' not in procs.log('worker0')
