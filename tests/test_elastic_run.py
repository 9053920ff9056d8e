"""tools/elastic_run.py: a job that grows and loses a worker, and one of
fixed size, run end to end; what it reports is read again from the logs."""

import json
import os
import re
import sys

import pytest

import cifar10_model
from helpers import ROOT, run_in_group, suite_env
import elastic_run
from training.cluster import planner_model
from training.runtime import progress

SCRIPT = os.path.join(ROOT, 'tools', 'elastic_run.py')
PROGRESS = progress.PATTERN


# A sitecustomize for the script's tasks: each worker takes at most 20 steps
# a second, so that the job lasts past the chief's lost-worker line however
# fast the machine. Two waits make each phase's progress lines independent
# of how fast each process starts: the other workers wait for the chief's
# first step (its first steps are its slowest: without it they could take
# the global step past the first change before the chief's first line); and
# while the joiner (a Python starting afresh, its index given) has started
# but not come to its first step, the others wait, so that the job cannot
# reach --max_steps before it trains (nothing of theirs waits on them
# meanwhile). Each test's next change comes far enough after that for its
# phase to have the chief's progress lines after the wait.
PACED = r"""
import os, sys
if (sys.argv and sys.argv[0].endswith('train_distributed.py') and
    '--job_name=worker' in sys.argv):
  import importlib.abc, importlib.machinery, time
  here = os.path.dirname(__file__)
  starting, joined, stepped = (os.path.join(here, n) for n in (
      'starting', 'joined', 'chief_stepped'))
  joiner = '--task_index=%(joiner)d' in sys.argv
  chief = '--task_index=0' in sys.argv
  if joiner:
    open(starting, 'w').close()

  class Paced(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
      if name != 'training.session.creator':
        return None
      sys.meta_path.remove(self)
      spec = importlib.machinery.PathFinder.find_spec(name, path)
      load = spec.loader.exec_module
      def exec_module(module):
        load(module)
        step, last = module.run_step, [0.0]
        def waits():
          return ((not chief and not os.path.exists(stepped)) or
                  (os.path.exists(starting) and not os.path.exists(joined)))
        def paced(*args):
          if joiner and not os.path.exists(joined):
            open(joined, 'w').close()
          while waits():
            time.sleep(0.05)
          time.sleep(max(0.0, last[0] + 0.05 - time.time()))
          last[0] = time.time()
          result = step(*args)
          if chief and not os.path.exists(stepped):
            open(stepped, 'w').close()
          return result
        module.run_step = paced
      spec.loader.exec_module = exec_module
      return spec

  sys.meta_path.insert(0, Paced())
"""


def run_script(*args, paced_dir=None, joiner=None):
  """Runs the script (its workers paced if paced_dir is given: a folder for
  the sitecustomize, whose worker `joiner` joins the job); returns (exit
  status, output)."""
  env = suite_env()
  if paced_dir:
    os.makedirs(paced_dir)
    with open(os.path.join(paced_dir, 'sitecustomize.py'), 'w') as f:
      f.write(PACED % {'joiner': joiner})
    env['PYTHONPATH'] = os.pathsep.join(
        [paced_dir] + [p for p in [env.get('PYTHONPATH')] if p])
  return run_in_group([sys.executable, SCRIPT] + list(args), timeout=600,
                      env=env)


def chief_progress(run_dir):
  """{global step: line time} of the chief's progress lines."""
  with open(os.path.join(run_dir, 'worker0.log')) as f:
    return {line.step: line.time.timestamp()
            for line in progress.parse(f.read())}


@pytest.mark.slow
def test_a_job_of_1_then_2_then_1_worker_against_one_of_2(tiny_data,
                                                           tmp_path):
  work = str(tmp_path / 'work')
  code, out = run_script(
      '--data_dir=' + tiny_data, '--work_dir=' + work, '--workers=1,2,1',
      '--change_steps=15,60', '--max_steps=120', '--batch_size=16',
      '--step_ms=10', '--compare_fixed', '--',
      '--lost_worker_secs=2', '--num_preprocess_threads=2',
      paced_dir=str(tmp_path / 'paced'), joiner=1)
  assert code == 0, out
  with open(os.path.join(work, 'elastic.json')) as f:
    result = json.load(f)
  elastic, = result['elastic']
  fixed, = result['fixed']
  # Two slots: every update aggregates 2 gradients of 16.
  assert elastic['examples_per_update'] == fixed['examples_per_update'] == 32
  phases = elastic['phases']
  assert [(p['workers'], p['change']) for p in phases] == [
      (1, 'started'), (2, 'worker 1 started'), (1, 'worker 1 killed (-9)')]
  assert [(p['workers'], p['change']) for p in fixed['phases']] == [
      (2, 'started')]
  # Each change was made at or after its step; the phases follow each
  # other; each one's images/s is its steps x 32 over the time between the
  # chief's two progress lines that bound it.
  run_dir = os.path.join(work, 'elastic_seed0')
  times = chief_progress(run_dir)
  assert phases[1]['steps'][0] >= 15 and phases[2]['steps'][0] >= 60
  for before, after in zip(phases, phases[1:]):
    assert before['steps'][1] == after['steps'][0]
  for p in phases:
    start, end = p['steps']
    assert p['images_per_sec'] == round(
        (end - start) * 32 / (times[end] - times[start]), 1), p
  # The joiner trained before it was killed; the chief named it lost once
  # its port had refused for 2 s (the paced chief alone takes 0.1 s a global
  # step: the rest of the 120 outlasts that).
  with open(os.path.join(run_dir, 'worker1.log')) as f:
    assert PROGRESS.search(f.read())
  lost, = elastic['lost_lines']
  assert lost.startswith('Worker 0: lost worker 1 at localhost:') and (
      lost.endswith('(Connection refused for 2 s); the 1 left compute its '
                    'share of each update of 2 gradients; start it again '
                    'and it rejoins')), lost
  # The accuracy is the evaluator's line, on the last checkpoint.
  for kind, record in (('elastic', elastic), ('fixed', fixed)):
    with open(os.path.join(work, kind + '_seed0', 'evaluator0.log')) as f:
      line = re.search(r': step 120, loss = \S+ ,Test accuracy = (\S+) ',
                       f.read())
    assert line and '%.4f' % record['accuracy'] == line.group(1), kind
    assert ('%s: test accuracy median %.4f' % (kind, record['accuracy'])
            in out), out
  # The planner's images/s for 1 and 2 workers of 16, a 10 ms step, 10
  # Gbit/s links, 1 ps.
  assert result['predicted_images_per_sec'] == {
      str(n): round(n * 16e3 / planner_model.predict_step_ms(
          10, cifar10_model.MODEL_BYTES, 1.0, n, 10e3), 1) for n in (1, 2)}


@pytest.mark.slow
def test_an_async_job_over_2_ps_of_2_then_3_then_2_workers(tiny_data,
                                                          tmp_path):
  work = str(tmp_path / 'work')
  code, out = run_script(
      '--data_dir=' + tiny_data, '--work_dir=' + work, '--num_ps=2',
      '--workers=2,3,2', '--change_steps=30,150', '--max_steps=300',
      '--batch_size=16', '--', '--nosync_replicas', '--lost_worker_secs=2',
      '--num_preprocess_threads=2', paced_dir=str(tmp_path / 'paced'),
      joiner=2)
  assert code == 0, out
  with open(os.path.join(work, 'elastic.json')) as f:
    result = json.load(f)
  elastic, = result['elastic']
  assert result['fixed'] == [] and 'predicted_images_per_sec' not in result
  # Asynchronous: each global step is one worker's batch of 16.
  assert elastic['examples_per_update'] == 16
  phases = elastic['phases']
  assert [(p['workers'], p['change']) for p in phases] == [
      (2, 'started'), (3, 'worker 2 started'), (2, 'worker 2 killed (-9)')]
  run_dir = os.path.join(work, 'elastic_seed0')
  times = chief_progress(run_dir)
  for p in phases:
    start, end = p['steps']
    assert p['images_per_sec'] == round(
        (end - start) * 16 / (times[end] - times[start]), 1), p
  # Both ps tasks ran and exited 0 (the script checks that): their logs.
  for i in (0, 1):
    with open(os.path.join(run_dir, 'ps%d.log' % i)) as f:
      assert 'ps %d: serving on localhost:' % i in f.read()
  with open(os.path.join(run_dir, 'worker2.log')) as f:
    assert PROGRESS.search(f.read())


def test_phases_by_hand():
  # The chief's (time, global step) lines; 10 examples a global step; the
  # job grew at t=4.2, after the line of step 20; then a 10 s stall.
  progress = [(1, 5), (2, 10), (3, 15), (4, 20),
              (5, 22), (15, 24), (16, 30), (17, 36)]
  changes = [(0.0, 0, 2, 'started'), (4.2, 20, 4, 'worker 2 started')]
  assert elastic_run.phases(progress, changes, 10) == [
      # 15 steps in 3 s; the second half from the line of step 15.
      {'workers': 2, 'change': 'started', 'steps': [5, 20], 'secs': 3,
       'images_per_sec': 50.0, 'longest_pause_secs': 1,
       'second_half_steps': [15, 20], 'second_half_images_per_sec': 50.0},
      # From the line the change was made on: 16 steps in 13 s, 10 of
      # them the stall; the second half (12 steps in 2 s) leaves it out.
      {'workers': 4, 'change': 'worker 2 started', 'steps': [20, 36],
       'secs': 13, 'images_per_sec': 12.3, 'longest_pause_secs': 10,
       'second_half_steps': [24, 36], 'second_half_images_per_sec': 60.0}]


def test_a_change_without_its_step_is_one_line(tmp_path):
  code, out = run_script('--data_dir=' + str(tmp_path), '--work_dir=' +
                         str(tmp_path / 'w'), '--workers=2,4',
                         '--change_steps=10,20')
  assert code == 2
  assert out == ('Error: --change_steps needs one step per change of '
                 '--workers (1), got 2\n')
  assert not os.path.exists(tmp_path / 'w')
