"""Every wait names what it waits for: a ps not started, a chief that has
not initialized the model, a worker that never joined, a worker that never
said it was done. Real processes on free ports, started out of order, as a
new user does. Each line comes after --wait_report_secs (10 s unless given;
2 s here) and again every twice that; these tests wait for the lines
themselves, and take the intervals from the trainer's settings, not from a
clock (a loaded machine delays a line, and the test's reading of it).
"""

import signal

import pytest

from helpers import assert_clean_logs, checkpoint_step, cluster_flags
from helpers import hosts, wait_until
from training.health import liveness

REPORT = ['--wait_report_secs=2']
# The first line, the repeat, and the time it takes a loaded machine to
# import TensorFlow and start a task.
LINE_SECS = 2 + 4 + 60


@pytest.mark.slow
def test_each_wait_says_what_it_waits_for(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_workers=3) + [
      '--max_steps=1000000'] + REPORT
  ps, workers = hosts(flags, 'ps_hosts'), hosts(flags, 'worker_hosts')

  def start(name, job, index):
    procs.trainer(name, '--job_name=' + job, '--task_index=%d' % index,
                  *flags)

  # Worker 1 alone: no ps to create a session with.
  start('worker1', 'worker', 1)
  procs.wait_for_line('worker1', 'Worker 1: waiting for ps 0 at %s '
                      '(Connection refused); start it, or check --ps_hosts' %
                      ps[0], LINE_SECS)
  # The ps is there, the model is not: the same wait says so next time.
  start('ps0', 'ps', 0)
  procs.wait_for_line('worker1', 'Worker 1: waiting for the chief, worker 0 '
                      'at %s, to initialize or restore the model' %
                      workers[0], LINE_SECS)
  # The chief trains with worker 1; worker 2, listed, never came.
  start('worker0', 'worker', 0)
  procs.wait_for_line(
      'worker0', 'Worker 0: waiting for worker 2 at %s to join; meanwhile the '
      'workers that have joined compute its share of the 3 gradients per '
      'step' % workers[2], LINE_SECS)
  start('worker2', 'worker', 2)
  procs.wait_for_line('worker0', 'Worker 0: all 3 workers have joined',
                      LINE_SECS)
  # Nothing but the suite's lines: TensorFlow's own "still waiting" INFO
  # lines and the cancelled connection attempts stay out. (Checked before
  # the chief goes: a ps may then say that a step's transfer from it broke.)
  assert_clean_logs(procs)
  procs.procs['worker0'].send_signal(signal.SIGTERM)
  procs.wait_for_line('worker0', 'Worker 0: SIGTERM: wrote', 30)
  assert procs.procs['worker0'].wait(30) == 143
  for name in ('worker0', 'worker1'):
    log = procs.log(name)
    assert 'Traceback' not in log, log
  assert checkpoint_step(train_dir) > 0


@pytest.mark.slow
def test_ps_names_a_slot_never_started_then_exits_without_it(
    procs, tiny_data, tmp_path):
  """Worker 1 listed, never started: the chief takes its tokens and
  finishes; the ps, once a worker is done, waits for worker 1 while its
  port refuses for less than --lost_worker_secs, naming it, then exits 0
  without it (issue: a listed slot that never started does not hold it)."""
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + [
      '--max_steps=20', '--lost_worker_secs=8'] + REPORT
  workers = hosts(flags, 'worker_hosts')
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  procs.trainer('worker0', '--job_name=worker', '--task_index=0', *flags)
  assert procs.wait_all(timeout=180) == {'ps0': 0, 'worker0': 0}, (
      procs.tails())
  log = procs.log('ps0')
  assert log.endswith(
      'ps 0: 1 of 2 worker(s) finished; not waiting for worker 1 at %s '
      '(Connection refused for 8 s), gone; exiting\n' % workers[1]), log
  # --wait_report_secs=2 < 8 s: it named worker 1 while it waited.
  assert ('ps 0: 1 of 2 worker(s) finished; still waiting for worker 1 at '
          '%s to finish' % workers[1]) in log
  assert checkpoint_step(train_dir) == 20
  assert_clean_logs(procs)


@pytest.mark.slow
def test_a_ps_no_worker_reached_names_the_workers(procs, tiny_data,
                                                 tmp_path):
  """The first mistake names itself (issue 44): a ps whose workers never
  started (they failed on their data, or --worker_hosts is wrong) names
  them, as a worker names a missing ps; once a worker is there, no more."""
  flags = cluster_flags(tiny_data, str(tmp_path / 'train')) + [
      '--max_steps=1000000'] + REPORT
  workers = hosts(flags, 'worker_hosts')
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  named = ('ps 0: no worker has reached this ps after %%d s; worker 0 at %s '
           '(Connection refused), worker 1 at %s (Connection refused): start '
           'them, or check --worker_hosts' % tuple(workers))
  procs.wait_for_line('ps0', named % 2, LINE_SECS)
  procs.wait_for_line('ps0', named % 6, LINE_SECS)  # Again 4 s later.
  procs.trainer('worker1', '--job_name=worker', '--task_index=1', *flags)
  chief = ('Worker 1: waiting for the chief, worker 0 at %s, to initialize or '
           'restore the model' % workers[0])
  procs.wait_for_line('worker1', chief, LINE_SECS)
  said = procs.log('ps0').count('no worker has reached')
  # The worker's next line comes 4 s later: the ps, saying its wait every
  # 4 s, probed meanwhile, found worker 1 and said nothing.
  wait_until(lambda: procs.log('worker1').count(chief) >= 2, LINE_SECS,
             'the second wait line', procs)
  assert procs.log('ps0').count('no worker has reached') == said, (
      procs.log('ps0'))
  assert_clean_logs(procs)


class Clock:
  """A clock that stands where the test puts it."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_a_wait_is_named_after_wait_report_secs_then_every_twice_that(
    flags, monkeypatch):
  # The times a wait is said, as the trainer sets them from the flags:
  # 10 s, then every 20 s by default; 2 s, then every 4 s with REPORT.
  for name in ('LOST_SECS', 'REPORT_SECS'):
    monkeypatch.setattr(liveness, name, getattr(liveness, name))
  monkeypatch.delenv('TF_CONFIG', raising=False)  # The caller's: not ours.
  for argv, said in (([], [10, 30, 50]), (REPORT, [2, 6, 10, 14])):
    flags(['train_distributed.py', '--job_name=ps', '--task_index=0'] + argv)
    import train_distributed  # pylint: disable=g-import-not-at-top
    train_distributed.check_flags()
    clock = Clock()
    cadence = liveness.Cadence(clock=clock)
    times = []
    for tenth in range(int(said[-1] * 10) + 1):
      clock.now = tenth / 10
      if cadence.due():
        times.append(clock.now)
    assert times == said


def test_one_threshold_says_when_any_task_is_lost(flags, monkeypatch):
  # --lost_worker_secs, for every role: a task whose port took nothing for
  # that long is lost; one that answers again starts over.
  for name in ('LOST_SECS', 'REPORT_SECS'):
    monkeypatch.setattr(liveness, name, getattr(liveness, name))
  monkeypatch.delenv('TF_CONFIG', raising=False)  # The caller's: not ours.
  flags(['train_distributed.py', '--job_name=ps', '--task_index=0',
         '--lost_worker_secs=3'])
  import train_distributed  # pylint: disable=g-import-not-at-top
  train_distributed.check_flags()
  clock = Clock()
  tracker = liveness.Tracker(['a:1', 'b:2'], clock=clock)
  assert tracker.lost_secs == 3
  tracker.observe({1: 'Connection refused'}, [0, 1])
  clock.now = 2.9
  assert not tracker.lost(1) and tracker.away_secs(1) == 2.9
  tracker.observe({1: 'Connection timed out'}, [0, 1])  # Still away.
  clock.now = 3.0
  assert tracker.lost(1) and not tracker.lost(0)
  assert tracker.why(1) == 'Connection timed out'
  tracker.observe({}, [1])  # Back: it starts over.
  assert not tracker.lost(1) and tracker.why(1) is None
  tracker.progress(0)
  clock.now = 5.5
  assert tracker.still_secs(0) == 2.5 and tracker.still_secs(1) is None
