"""TensorBoard, as requirements.txt installs it, serves a run's scalars."""

import glob
import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import tensorflow as tf

from helpers import FAST, ROOT, cluster_flags, free_ports, start_cluster
from helpers import suite_env

CHIEF_TAGS = {'loss', 'accuracy', 'learning_rate', 'examples/sec',
              'cluster_examples/sec'}
EVAL_TAGS = {'test/accuracy', 'test/loss'}


def get(port, path, **query):
  url = 'http://127.0.0.1:%d%s?%s' % (port, path,
                                      urllib.parse.urlencode(query))
  with urllib.request.urlopen(url, timeout=10) as response:
    return json.load(response)


def wait_for_tags(port, procs, timeout=90):
  """Polls TensorBoard's scalar tags until both runs are loaded."""
  deadline = time.time() + timeout
  tags = {}
  while time.time() < deadline:
    try:
      tags = get(port, '/data/plugin/scalars/tags')
    except (urllib.error.URLError, ConnectionError):
      pass  # Not listening yet.
    if CHIEF_TAGS <= set(tags.get('.', {})) and EVAL_TAGS <= set(
        tags.get('eval', {})):
      return tags
    assert procs.procs['tensorboard'].poll() is None, procs.tails()
    time.sleep(0.5)
  pytest.fail('TensorBoard never served %s; it served %s' % (
      sorted(CHIEF_TAGS | EVAL_TAGS), tags))


@pytest.mark.slow
def test_tensorboard_serves_the_chief_and_evaluator_scalars(procs, tiny_data,
                                                            tmp_path):
  train_dir = str(tmp_path / 'train')
  common = ['--data_dir=' + tiny_data, '--train_dir=' + train_dir] + FAST
  procs.trainer('single', '--ps_hosts=', '--max_steps=20',
                '--save_summaries_steps=5', *common)
  assert procs.wait_all(timeout=120) == {'single': 0}, procs.tails()
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once', *common)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  port, = free_ports(1)
  procs.start('tensorboard', ['-m', 'tensorboard.main', '--logdir', train_dir,
                              '--host', '127.0.0.1', '--port', str(port)])

  tags = wait_for_tags(port, procs)
  # The input queues report how full they are.
  assert any('shuffle_batch/fraction_over_' in t for t in tags['.']), tags
  loss = get(port, '/data/plugin/scalars/scalars', run='.', tag='loss')
  steps = [step for _, step, _ in loss]
  # Every --save_summaries_steps, from the first step on.
  assert len(steps) >= 3 and steps[0] <= 1, steps
  assert all(b - a == 5 for a, b in zip(steps, steps[1:])), steps
  # One process is the whole cluster: each global step is one of its own
  # batches, so the cluster's rate is its own, point for point.
  own, cluster = [[(step, value) for _, step, value in get(
      port, '/data/plugin/scalars/scalars', run='.', tag=tag)]
                  for tag in ('examples/sec', 'cluster_examples/sec')]
  assert [step for step, _ in own] == [5, 10, 15, 20], own
  assert cluster == own
  test = get(port, '/data/plugin/scalars/scalars', run='eval',
             tag='test/accuracy')
  with open(os.path.join(train_dir, 'eval', 'results.jsonl')) as f:
    result = json.loads(f.read().splitlines()[-1])
  assert [(step, round(value, 6)) for _, step, value in test] == [
      (20, round(result['accuracy'], 6))]


@pytest.mark.slow
def test_the_chief_writes_the_clusters_examples_per_second(procs, tiny_data,
                                                           tmp_path):
  """Sync, 2 workers of 16: a global step trains on 32 examples. Between two
  of the chief's points (one at each of its steps) the cluster's rate is
  its own times the global steps between them x 32 / 16."""
  train_dir = str(tmp_path / 'train')
  # The chief takes its turn for tokens: some of the 200 gradients are its,
  # whichever worker is faster; 3 points, 2 spans between them.
  flags = cluster_flags(tiny_data, train_dir) + ['--max_steps=100',
                                                 '--log_frequency=1']
  start_cluster(procs, flags)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  points = []  # (global step, its own rate, the cluster's), in order.
  for path in sorted(glob.glob(os.path.join(train_dir,
                                            'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      values = {v.tag: v.simple_value for v in event.summary.value}
      if 'examples/sec' in values:
        points.append((event.step, values['examples/sec'],
                       values['cluster_examples/sec']))
  assert len(points) >= 3, points
  # (Not from 0: worker 1 may have updated before the chief's first step.)
  for (before, _, _), (step, own, cluster) in zip(points, points[1:]):
    assert cluster == pytest.approx(own * (step - before) * 32 / 16,
                                    rel=1e-5, abs=1e-6), (step, points)


@pytest.mark.slow
def test_tensorboard_sh_says_when_its_logdir_holds_no_summaries(tmp_path):
  """An empty page with no word was what a --logdir other than the tasks'
  --train_dir gave: one line now, in either spelling of the flag, and none
  once summaries are there."""
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'events.out.tfevents.1.host').touch()
  (tmp_path / 'empty').mkdir()
  said = {}
  for name, flag in (('none', ['--logdir=' + str(tmp_path / 'none')]),
                     ('spaced', ['--logdir', str(tmp_path / 'none')]),
                     ('empty', ['--logdir=' + str(tmp_path / 'empty')]),
                     ('written', ['--logdir=' + str(tmp_path / 'run')])):
    done = subprocess.run(
        ['bash', os.path.join(ROOT, 'scripts', 'tensorboard.sh')] + flag +
        ['--version_tb'], capture_output=True, text=True, timeout=120,
        env=suite_env())
    assert done.returncode == 0, done.stderr
    said[name] = done.stderr
  line = ('tensorboard.sh: no summaries in --logdir=%s yet: the page stays '
          'empty until the chief or the evaluator writes there (the tasks\' '
          '--train_dir)\n')
  assert said == {'none': line % (tmp_path / 'none'),
                  'spaced': line % (tmp_path / 'none'),
                  'empty': line % (tmp_path / 'empty'), 'written': ''}
