"""scripts/plan_cluster.py: its predictions, its answer, and the README's
"How many ps tasks?" table and docs/kubernetes.md's table of workers
running in listed slots, which must be what the planner prints."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

import cifar10_model
import calibrate_planner
from helpers import ROOT, run_in_group, suite_env
import plan_cluster
from training.cluster import planner_model

PLANNER = os.path.join(ROOT, 'scripts', 'plan_cluster.py')


def in_process(capsys, *flags):
  """Runs the planner's main in this process (TensorFlow already loaded);
  returns (exit status, stdout)."""
  code = plan_cluster.main(list(flags))
  return code, capsys.readouterr().out


def planner(*flags):
  """Runs the planner; returns (exit status, stdout + stderr)."""
  result = subprocess.run([sys.executable, PLANNER] + list(flags),
                          capture_output=True, text=True, timeout=120)
  return result.returncode, result.stdout + result.stderr


def test_the_step_by_hand():
  # 1 ps, 2 workers at 100 Mbit/s, float32: the ps link carries both
  # workers' 719,848 bytes (1.033x on the wire) each way: 118.97 ms; a
  # worker's own link half of it. Pull 118.97, then the push's
  # 0.3 x 118.97 + 59.49 = 95.18, less 0.58 x 60 hidden: 60.38 more.
  assert planner_model.link_ms(719848, 1.0, 2, 100) == pytest.approx(
      118.97, abs=0.01)
  assert planner_model.predict_step_ms(60, 719848, 1.0, 2, 100) == (
      pytest.approx(60 + 118.97 + 60.38, abs=0.02))
  # bfloat16 halves every transfer.
  assert planner_model.link_ms(719848, 1.0, 2, 100, 2) == pytest.approx(
      118.97 / 2, abs=0.01)
  # On a fast link the push hides entirely; the pull does not.
  assert planner_model.predict_step_ms(60, 719848, 1.0, 2, 10000) == (
      pytest.approx(60 + 1.19, abs=0.01))


def test_the_model_bytes_are_the_built_networks():
  # The one figure of the model's size, which the planner, the elastic run
  # and the tests read: 179,962 trainable float32 parameters.
  with tf.Graph().as_default():
    cifar10_model.inference(tf.compat.v1.placeholder(tf.float32,
                                                     [1, 32, 32, 3]))
    built = sum(v.shape.num_elements() * v.dtype.size
                for v in tf.compat.v1.trainable_variables())
  assert cifar10_model.MODEL_BYTES == built == 719848
  assert plan_cluster.network_bytes() == built


def test_more_ps_than_the_worker_link_allows_buy_nothing():
  shares = plan_cluster.even_shares(8)
  rows = plan_cluster.plan(10.0, 4, 1000, shares, 128, 719848, 4)
  # 4 workers: from 4 ps on, each worker's own link is the busiest.
  assert [r[4] for r in rows] == [False] * 3 + [True] * 5
  assert [r[2] for r in rows][3:] == [rows[3][2]] * 5
  assert rows[0][2] > rows[1][2] > rows[3][2]
  assert plan_cluster.fewest_within(rows) == 4  # 3 ps: 13% slower.


def table_rows(out):
  """The numbers of the plan's table rows."""
  return [tuple(float(x.strip().rstrip('x')) for x in line.strip('|').split('|'))
          for line in out.splitlines() if re.match(r'^\| \d+ \|', line)]


@pytest.mark.slow
def test_a_plan_and_its_plot_in_a_real_process(tmp_path):
  plot = tmp_path / 'plan.png'
  code, out = planner('--step_ms=45', '--num_workers=32', '--link_gbit=10',
                      '--max_ps=8', '--plot=%s' % plot)
  assert code == 0, out
  assert out.splitlines()[-1] == 'Wrote %s' % plot
  assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  rows = table_rows(out)
  assert [int(r[0]) for r in rows] == list(range(1, 9))
  # The largest ps's share of the 719,848 bytes, as the trainer places them
  # (1 ps: all; 2 ps: 0.513264, 4 ps: 0.269835, 8 ps: 0.147409).
  shares = plan_cluster.largest_shares(8)
  assert [round(shares[p], 6) for p in (1, 2, 4, 8)] == [
      1.0, 0.513264, 0.269835, 0.147409]
  # By hand: a ps's link carries its share for each of the 32 workers, at
  # 1.033 x 8 bits a byte on 10 Gbit/s; every push hides beside 0.58 x 45
  # ms (the largest, 1 ps's: 0.3 x 19.04 + 0.59 = 6.31 ms). So:
  #   1 ps: 32 x 719,848 = 23.04 MB, 19.04 ms: 64.04 ms, 4,096,000 / 64.04
  #   = 63,964 images/s; 2 ps: 11.82 MB, 9.77 ms: 54.77 ms, 74,785/s;
  #   4 ps: 6.22 MB, 5.14 ms: 50.14 ms, 81,697/s; 8 ps: 3.40 MB, 2.81 ms:
  #   47.81 ms, 85,679/s.
  assert rows[0] == (1, 23.04, 64.0, 63964, 1.00)
  assert rows[1] == (2, 11.82, 54.8, 74785, 1.17)
  assert rows[3] == (4, 6.22, 50.1, 81697, 1.28)
  assert rows[7] == (8, 3.40, 47.8, 85679, 1.34)
  # 3 ps (79,145/s) is below 0.95 x 85,679 = 81,395; 4 ps is above.
  assert ('Fewest ps tasks within 5% of the best: 4 (81697 images/s; the '
          'best, 8 ps: 85679).') in out
  # 32 workers outnumber what this network splits into: the ps links stay
  # the busiest.
  assert "each worker's own link" not in out
  assert 'Traceback' not in out


def test_the_variables_line_by_hand(capsys):
  """What the ps tasks hold: 2 float32 copies of the 719,848 model bytes
  (weight, moving average), 3 with momentum (its accumulator), the busiest
  of 4 ps its 0.269835 share; the table, the bytes on the wire, the same."""
  outs = {}
  for optimizer in ('sgd', 'momentum'):
    code, outs[optimizer] = in_process(
        capsys, '--step_ms=45', '--num_workers=32', '--link_gbit=10',
        '--max_ps=8', '--optimizer=' + optimizer)
    assert code == 0, outs[optimizer]
  assert table_rows(outs['sgd']) == table_rows(outs['momentum'])
  # 1,439,696 and 388,480 bytes; 2,159,544 and 582,720.
  assert ('Variables with --optimizer=sgd (each weight, its moving average): '
          "1.44 MB of a checkpoint's data, 0.39 MB on the busiest of 4 ps; "
          'the bytes on the wire are the same with either optimizer.'
          ) in outs['sgd']
  assert ('Variables with --optimizer=momentum (each weight, its moving '
          "average and its accumulator): 2.16 MB of a checkpoint's data, "
          '0.58 MB on the busiest of 4 ps') in outs['momentum']
  # Another model, 1 MB, half of it on the busiest of 4 ps: 3 x 0.5 MB.
  assert planner_model.variables_line(1e6, {4: 0.5}, 4, 'momentum') == (
      'Variables with --optimizer=momentum (each weight, its moving average '
      "and its accumulator): 3.00 MB of a checkpoint's data, 1.50 MB on the "
      'busiest of 4 ps; the bytes on the wire are the same with either '
      'optimizer.')


def test_a_plan_where_the_workers_links_are_the_limit(capsys):
  code, out = in_process(capsys, '--step_ms=10', '--num_workers=4', '--link_gbit=1',
                      '--transfer_dtype=bfloat16', '--max_ps=8')
  assert code == 0, out
  shares = plan_cluster.largest_shares(8)
  own = min(p for p, share in shares.items() if 4 * share <= 1)
  assert ("From %d ps on, each worker's own link is the busiest" % own) in out
  rows = table_rows(out)
  # By hand: bfloat16 halves the bytes, 359,924 each way on each worker's
  # link at 1.033 x 8 bits a byte on 1 Gbit/s, 2.97 ms; the push, 0.3 x
  # 2.97 + 2.97 = 3.87 ms, hides in 0.58 x 10 = 5.8 ms: 10 + 2.97 =
  # 12.97 ms.
  assert rows[own - 1][2] == 13.0
  # bfloat16: half of the 0.72 MB model on each worker's link.
  assert rows[own - 1][1] == pytest.approx(0.36, abs=0.005)


def test_the_plot_of_workers_by_hand():
  # 1 ps at 100 Mbit/s, a 45 ms step: 1 worker moves the 719,848 bytes each
  # way over its link and the ps's, 59.49 ms, and its push (0.3 x 59.49 +
  # 59.49 = 77.34) hides 26.1 ms of it: 45 + 59.49 + 51.24 = 155.72 ms, 822
  # images/s. 2 workers: 45 + 118.98 + (0.3 x 118.98 + 59.49 - 26.1) =
  # 233.06 ms, 1,098 images/s.
  series = planner_model.workers_series(45, 2, 100, {1: 1.0, 3: 0.4}, 128,
                                       719848, 4)
  assert list(series) == [1]  # Only the ps counts it draws.
  assert series[1] == [pytest.approx(821.97, abs=0.01),
                       pytest.approx(1098.44, abs=0.01)]


def test_updates_of_a_gradient_per_slot_by_hand():
  # 1 ps, 4 slots, 10 Gbit/s, a 5 ms step: a round of n workers moves n x
  # 719,848 bytes each way over the ps's link at 1.033 x 8 bits a byte,
  # n x 0.59 ms, its pushes hidden in 0.58 x 5 ms: 5 + n x 0.59 ms. An
  # update of 4 gradients: 1 running, 4 rounds of 5.59 = 22.38 ms; 2, 2
  # rounds of 6.19 = 12.38; 3, a round of 3 and one of 1, 6.78 + 5.59 =
  # 12.38, no faster than 2; 4, one round, 7.38. Images/s: 512,000 / ms.
  rows = planner_model.running_rows(5, 4, 10000, 1.0, 128, 719848, 4)
  assert [(n, round(ms, 2), round(updates, 2), round(rate))
          for n, ms, updates, rate in rows] == [
              (1, 22.38, 44.68, 22878), (2, 12.38, 80.78, 41359),
              (3, 12.38, 80.78, 41359), (4, 7.38, 135.51, 69381)]


def test_the_kubernetes_pages_table_is_the_planners(capsys):
  code, out = in_process(capsys, '--step_ms=5', '--slots=4', '--link_gbit=10',
                         '--max_ps=1')
  assert code == 0, out
  assert 'With 1 ps, each update 4 gradients (512 examples)' in out
  table = out[out.index('| workers running'):].split('\n\n')[0]
  assert len(table.splitlines()) == 2 + 4
  with open(os.path.join(ROOT, 'docs', 'kubernetes.md'),
            encoding='utf-8') as f:
    page = f.read()
  assert table in page
  assert ('python3 scripts/plan_cluster.py --step_ms=5 --slots=4 '
          '--link_gbit=10 --max_ps=1') in page
  assert out.strip().endswith('With 3 running, the last round of each update '
                              'has fewer gradients to make than workers: the '
                              "others wait for the next update's tokens.")


def test_a_plot_that_cannot_be_written_is_one_line(tmp_path):
  code, out = planner('--step_ms=5', '--num_workers=16', '--link_gbit=1',
                      '--plot=%s' % (tmp_path / 'none' / 'plan.png'))
  assert (code, out.strip()) == (2, 'Error: --plot=%s: there is no folder '
                                 '%s; make it, or name another' % (
                                     tmp_path / 'none' / 'plan.png',
                                     tmp_path / 'none'))
  code, out = planner('--step_ms=5', '--num_workers=16', '--link_gbit=1',
                      '--plot=%s' % tmp_path)
  assert (code, out.strip()) == (2, 'Error: --plot=%s is a folder; name a '
                                 'file in it, e.g. %s/plan.png' % (
                                     tmp_path, tmp_path))
  code, out = planner('--typical', '--plot=%s' % (tmp_path / 'p.png'))
  assert (code, out.strip()) == (2, "Error: --typical prints the README's "
                                 'table for its own clusters; drop --plot, '
                                 'or drop --typical')


@pytest.mark.parametrize('flags, says', [
    ([], '--step_ms must be given and above 0 (got None)'),
    (['--step_ms=45', '--num_workers=0', '--link_gbit=1'],
     '--num_workers must be given and above 0 (got 0)'),
    (['--step_ms=45', '--num_workers=8', '--link_gbit=1', '--model_bytes=0'],
     '--model_bytes must be given and above 0 (got 0)'),
    (['--step_ms=5', '--slots=4', '--num_workers=2', '--link_gbit=10'],
     '--slots=4 plans 1 to 4 workers running; drop --num_workers'),
    (['--typical', '--num_workers=8'],
     "--typical prints the README's table for its own clusters; drop "
     '--num_workers, or drop --typical'),
])
def test_bad_input_gets_one_line(flags, says):
  code, out = planner(*flags)
  assert code == 2
  assert out.strip() == 'Error: ' + says + (
      ', e.g. --step_ms=45 --num_workers=32 --link_gbit=10'
      if 'must be given' in says else '')


@pytest.mark.slow
def test_the_readme_table_is_the_planners(capsys):
  code, out = in_process(capsys, '--typical')
  assert code == 0, out
  table = out.strip()
  assert len(table.splitlines()) == 2 + 9  # Header, rule, 3 x 3 clusters.
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    assert table in f.read()
  with open(os.path.join(ROOT, 'README.zh-CN.md'), encoding='utf-8') as f:
    assert table in f.read()


def test_the_busy_links_rpcs_and_ps_0_by_hand():
  # 4 workers, 1 ps, 1 Gbit/s, a 100 ms step, machines of half a core.
  # The ps link: 4 x 719,848 bytes x 1.033 x 8 bits = 23.795 ms each way;
  # a worker's own 5.949. With the cores given the transfers (1.26 x 23.795
  # + 0.60 x 5.949 = 33.551) hide in 0.33 x 100 ms but for 0.551 ms. A
  # synchronous step's RPCs: (1.3 + 5.35 x 1 ps) / 0.5 cores = 13.3 ms:
  # 113.851 ms. Ps 0: (9.9 + 4 x 4.4) / 0.5 = 55 ms, below it.
  def rate(mode, ps_cores=0.5, step_cv=0.0):
    return planner_model.predict_images_per_sec(
        step_ms=100, model_bytes=719848, share=1.0, num_workers=4, num_ps=1,
        mbit=1000, batch_size=32, mode=mode, worker_cores=0.5,
        ps_cores=ps_cores, step_cv=step_cv)
  assert rate('sync') == pytest.approx(4 * 32e3 / 113.851, rel=1e-4)
  # A backup worker: the same step, 3 gradients an update.
  assert rate('backup') == pytest.approx(3 * 32e3 / 113.851, rel=1e-4)
  # Steps spread by 10%: the update waits for the slowest of 4 normal
  # draws, 1.0294 deviations above the mean (10.294 ms); with a backup for
  # the second slowest, 0.2970 (2.970 ms).
  assert rate('sync', step_cv=0.1) == pytest.approx(4 * 32e3 / 124.145,
                                                    rel=1e-4)
  assert rate('backup', step_cv=0.1) == pytest.approx(3 * 32e3 / 116.821,
                                                      rel=1e-4)
  # Asynchronous: each worker 100 (its own link, 1.86 x 5.949, hides) +
  # (0.65 + 5.35) / 0.5 = 112 ms, above 2.34 x the ps link's 23.795
  # (55.68) and ps 0's 4 x 3.9 / 0.5 = 31.2.
  assert rate('async') == pytest.approx(4 * 32e3 / 112.0, rel=1e-4)
  # Ps 0 of 0.05 cores: (9.9 + 4 x 4.4) / 0.05 = 550 ms a step; 4 x 3.9 /
  # 0.05 = 312 ms a round of asynchronous steps.
  assert rate('sync', 0.05) == pytest.approx(4 * 32e3 / 550, rel=1e-4)
  assert rate('async', 0.05) == pytest.approx(4 * 32e3 / 312, rel=1e-4)
  # No cores given: the link model alone, as predict_step_ms: 100 + 23.795
  # (the pull) + the push (0.3 x 23.795 + 5.949) hidden in 0.58 x 100.
  assert planner_model.predict_images_per_sec(
      step_ms=100, model_bytes=719848, share=1.0, num_workers=4, num_ps=1,
      mbit=1000, batch_size=32) == pytest.approx(4 * 32e3 / 123.795,
                                                 rel=1e-4)
  # At 100 Mbit/s the transfers no longer hide: the ps link 237.953 ms, the
  # own 59.488; with the cores given 1.26 x 237.953 + 0.60 x 59.488 - 33 =
  # 302.514 ms of them: 100 + 302.514 + 13.3 of RPCs = 415.814 ms; without
  # them the pull and what of 0.3 x 237.953 + 59.488 does not hide in 58:
  # 410.827 ms.
  slow = dict(step_ms=100, model_bytes=719848, share=1.0, num_workers=4,
              num_ps=1, mbit=100, batch_size=32)
  assert planner_model.predict_images_per_sec(
      worker_cores=0.5, ps_cores=0.5, **slow) == pytest.approx(
          4 * 32e3 / 415.814, rel=1e-4)
  assert planner_model.predict_images_per_sec(**slow) == pytest.approx(
      4 * 32e3 / 410.827, rel=1e-4)
  # One asynchronous worker there: its own link is the ps's, 59.488 ms:
  # (1.26 + 0.60) x 59.488 - 33 = 77.648 ms of transfers; with (0.65 +
  # 5.35) / 0.5 = 12 of RPCs 189.648 ms, above 2.34 x 59.488 = 139.20 and
  # ps 0's 3.9 / 0.5 = 7.8.
  assert planner_model.predict_images_per_sec(
      worker_cores=0.5, ps_cores=0.5, mode='async',
      **dict(slow, num_workers=1)) == pytest.approx(32e3 / 189.648, rel=1e-4)


def test_the_expected_slowest_of_n():
  # Tables of normal order statistics: the largest of 2, 4 and 8 draws.
  assert [round(planner_model.expected_order(n, n), 4) for n in (1, 2, 4, 8)] == [
      0.0, 0.5642, 1.0294, 1.4236]
  assert round(planner_model.expected_order(1, 2), 4) == -0.5642


def test_past_the_bytes_need_more_ps_make_a_step_slower():
  # 8 workers of 0.12 cores on 300 Mbit/s links, a 272 ms step, ps of a
  # whole core. A worker's own link carries 719,848 bytes x 1.033 x 8 bits
  # in 19.829 ms, a ps's 8 shares of it: 1 ps 158.635 ms, 2 ps (0.513)
  # 81.422, 3 ps (0.355) 56.275. Of 1.26 x the ps link + 0.60 x the own,
  # what does not hide in 0.33 x 272: 1 ps 122.018 ms, 2 ps 24.729, 3 ps
  # and more none. Each ps costs each worker (1.3 + 5.35 P) / 0.12 ms of
  # RPCs: 55.417, 100, 144.583, 189.167. So 1 ps 449.4 ms, 2 ps 396.7, 3 ps
  # 416.6, 4 ps 461.2; ps 0's (9.9 + 8 x 4.4) / 1 = 45.1 ms is below them.
  rows = plan_cluster.plan(272, 8, 300, plan_cluster.largest_shares(4), 32,
                           719848, 4, worker_cores=0.12, ps_cores=1.0)
  assert [r[2] for r in rows] == pytest.approx([449.4, 396.7, 416.6, 461.2],
                                               abs=0.05)
  assert plan_cluster.fewest_within(rows) == 2  # 1 ps 12% below the best.


def test_the_at_scale_table_is_the_planners(capsys):
  code, out = in_process(capsys, '--at_scale')
  assert code == 0, out
  table = out.strip()
  assert len(table.splitlines()) == 2 + 6  # Header, rule, 3 x 2 clusters.
  with open(os.path.join(ROOT, 'docs', 'scaling.md'),
            encoding='utf-8') as f:
    assert table in f.read()


@pytest.mark.parametrize('flags, says', [
    (['--slots=4', '--step_ms=5', '--link_gbit=10', '--training=async'],
     '--slots plans synchronous updates of a gradient per slot; drop '
     '--training=async'),
    (['--at_scale', '--ps_cores=8'],
     "--at_scale prints docs/scaling.md's table for its own clusters; "
     'drop --ps_cores, or drop --at_scale'),
    (['--step_ms=5', '--num_workers=4', '--link_gbit=10', '--ps_cores=0'],
     '--ps_cores must be given and above 0 (got 0.0), e.g. --step_ms=45 '
     '--num_workers=32 --link_gbit=10'),
    (['--step_ms=5', '--num_workers=4', '--link_gbit=10', '--worker_cores=0'],
     '--worker_cores must be given and above 0 (got 0.0), e.g. --step_ms=45 '
     '--num_workers=32 --link_gbit=10'),
    (['--step_ms=5', '--num_workers=4', '--link_gbit=10', '--step_cv=1.5'],
     '--step_cv is the spread of the steps over their mean, from 0 up to 1 '
     '(got 1.5), e.g. 0.1'),
    (['--at_scale', '--training=async'],
     "--at_scale prints docs/scaling.md's table for its own clusters; "
     'drop --batch_size/--transfer_dtype/--training/--step_cv/--optimizer, '
     'or drop --at_scale'),
    (['--typical', '--optimizer=momentum'],
     "--typical prints the README's table for its own clusters; drop "
     '--batch_size/--transfer_dtype/--training/--step_cv/--optimizer, or drop '
     '--typical'),
])
def test_bad_training_and_cores_get_one_line(flags, says):
  code, out = planner(*flags)
  assert (code, out.strip()) == (2, 'Error: ' + says)


@pytest.mark.slow
def test_a_plan_with_cores_and_async_in_a_real_process():
  code, out = planner('--step_ms=272', '--num_workers=8', '--link_gbit=0.6',
                      '--batch_size=32', '--worker_cores=0.12',
                      '--ps_cores=0.12', '--training=async', '--max_ps=4')
  assert code == 0, out
  assert out.startswith('Predicted: 8 asynchronous workers at batch 32, 600 '
                        'Mbit/s links, float32 transfers, a worker\'s step '
                        '272 ms on a fast network. Machines: workers of 0.12 '
                        'cores, ps of 0.12 cores; their RPCs\' CPU as '
                        'measured on a Zen 4 (the default).')
  assert "| ps tasks | busiest link's tensors, MB each way per step | ms " \
         "per worker's step | images/s | x 1 ps |" in out
  rows = table_rows(out)
  assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
  # By hand: each worker's step, 272 (its own link's 1.86 x 9.915 ms hide
  # in 0.33 x 272) + (0.65 + 5.35 P) / 0.12 ms of RPCs, above 2.34 x the
  # ps link (1 ps: 185.6 ms) and ps 0's 8 x 3.9 / 0.12 = 260: 1 ps 322.0
  # ms, 2 ps 366.58, 4 ps 455.75.
  assert [rows[i][2] for i in (0, 1, 3)] == pytest.approx(
      [322.0, 366.58, 455.75], abs=0.051)
  assert rows[0][3] == round(8 * 32e3 / 322.0)


def constants_file(path, **values):
  """A file as scripts/calibrate_planner.py writes it: every CPU constant
  0 but values."""
  path.write_text(json.dumps({'machine': 'a test machine', 'constants': dict(
      dict.fromkeys(planner_model.CPU_CONSTANTS, 0.0), **values)}))
  return str(path)


def test_measured_constants_replace_the_shipped_ones(tmp_path):
  """4 asynchronous workers of a 10 ms step, machines of 1 core, links that
  cost nothing (1,000 Gbit/s, a model of 1 KB): a worker's cycle is the
  longest of its step with its RPCs and ps 0's CPU for the 4 workers'
  steps. Shipped: 10 + 0.65 + 5.35 = 16 ms against 4 x 3.9 = 15.6. From
  the file: 10 + 2 + 1 = 13 against 4 x 30 = 120 ms. The line names where
  they were measured."""
  flags = ['--step_ms=10', '--num_workers=4', '--link_gbit=1000',
           '--model_bytes=1000', '--batch_size=32', '--training=async',
           '--worker_cores=1', '--ps_cores=1', '--max_ps=1']
  code, out = planner(*flags)
  assert code == 0, out
  assert 'as measured on a Zen 4 (the default).' in out
  assert table_rows(out)[0][2] == 16.0
  code, out = planner(*flags, '--constants=' + constants_file(
      tmp_path / 'c.json', ASYNC_RPC_MS=2.0, PS_RPC_MS=1.0, PS_ASYNC_MS=30))
  assert code == 0, out
  assert "their RPCs' CPU as measured on a test machine." in out
  assert table_rows(out)[0][2] == 120.0
  assert table_rows(out)[0][3] == round(4 * 32e3 / 120)
  # ps 0 quick: the worker's side, 10 + 2 + 1.
  code, out = planner(*flags, '--constants=' + constants_file(
      tmp_path / 'd.json', ASYNC_RPC_MS=2.0, PS_RPC_MS=1.0, PS_ASYNC_MS=1))
  assert table_rows(out)[0][2] == 13.0
  # Synchronous, ps 0 the bound: (100 + 4 x 10) / 1 core = 140 ms an
  # update, above the step's 10 + 0 of RPCs.
  sync = [f for f in flags if f != '--training=async']
  code, out = planner(*sync, '--constants=' + constants_file(
      tmp_path / 'e.json', PS_UPDATE_MS=100, PS_WORKER_MS=10))
  assert code == 0, out
  assert table_rows(out)[0][2] == 140.0


def test_a_constants_file_that_cannot_serve_is_one_line(tmp_path):
  flags = ['--step_ms=10', '--num_workers=4', '--link_gbit=1',
           '--model_bytes=1000']
  missing = str(tmp_path / 'none.json')
  cases = [(missing, "[Errno 2] No such file or directory: '%s'" % missing)]
  for name, value, shown in [('PS_WORKER_MS', -1.0, '-1.0'),
                             ('PS_UPDATE_MS', True, 'True'),
                             ('SYNC_RPC_MS', float('nan'), 'nan'),
                             ('PS_RPC_MS', '2', "'2'")]:
    path = constants_file(tmp_path / (name + '.json'), **{name: value})
    cases.append((path, '%s: %s is %s, not a number of 0 or more; measure '
                  'again with scripts/calibrate_planner.py' % (path, name,
                                                               shown)))
  listed = tmp_path / 'list.json'
  listed.write_text('[1, 2]')
  cases.append((str(listed), '%s holds no constants; measure them with '
                'scripts/calibrate_planner.py' % listed))
  for path, says in cases:
    code, out = planner(*flags, '--constants=' + path)
    assert (code, out.strip()) == (2, 'Error: --constants=%s: %s' % (
        path, says))


def test_the_calibration_solves_its_runs_by_hand():
  """scripts/calibrate_planner.py's algebra on CPU ms a global step written
  by hand: PS_RPC 34 - 29 = 5 (2 ps against 1), SYNC 29 - 20 - 5 = 4, ASYNC
  27 - 20 - 5 = 2, PS_WORKER 10 - 7 = 3 (2 workers' update against 1's),
  PS_UPDATE 7 - 3 = 4, PS_ASYNC 4. Noise that makes a difference negative
  makes it 0, and the rest follow from that 0."""
  runs = {'A': {'worker0': 20.0}, 'B': {'worker0': 29.0, 'ps0': 7.0},
          'C': {'worker0': 31.0, 'worker1': 28.0, 'ps0': 10.0},
          'D': {'worker0': 34.0, 'ps0': 3.0, 'ps1': 2.0},
          'E': {'worker0': 27.0, 'ps0': 4.0}}
  assert calibrate_planner.constants(runs) == {
      'PS_RPC_MS': 5.0, 'SYNC_RPC_MS': 4.0, 'ASYNC_RPC_MS': 2.0,
      'PS_WORKER_MS': 3.0, 'PS_UPDATE_MS': 4.0, 'PS_ASYNC_MS': 4.0}
  runs['D']['worker0'] = 28.0
  runs['C']['ps0'] = 6.5
  assert calibrate_planner.constants(runs) == {
      'PS_RPC_MS': 0.0, 'SYNC_RPC_MS': 9.0, 'ASYNC_RPC_MS': 7.0,
      'PS_WORKER_MS': 0.0, 'PS_UPDATE_MS': 7.0, 'PS_ASYNC_MS': 4.0}


def test_the_calibration_needs_a_data_folder_and_counts_above_0(tmp_path):
  for argv, says in [
      (['--data_dir=%s' % tmp_path, '--rounds=0'],
       '--rounds must be 1 or more (got 0)'),
      (['--data_dir=%s' % tmp_path, '--steps=-1'],
       '--steps must be 1 or more (got -1)'),
      (['--data_dir=%s' % tmp_path, '--batch_size=0'],
       '--batch_size must be 1 or more (got 0)'),
      (['--data_dir=%s' % (tmp_path / 'none')],
       '--data_dir=%s is not a folder; make the synthetic set with '
       'scripts/make_synthetic_cifar10.py' % (tmp_path / 'none'))]:
    code, out = run_in_group([sys.executable, os.path.join(
        ROOT, 'scripts', 'calibrate_planner.py')] + argv, 120)
    assert (code, out.strip()) == (2, 'Error: ' + says)


@pytest.mark.slow
def test_the_calibration_measures_here_and_the_planner_reads_it(
    tiny_data, tmp_path):
  """One round of its five runs, 20 steps each, on tiny data: a line a run
  naming each task's CPU a step, one a constant, the file; the planner
  then predicts with them and names the machine they were measured on."""
  out_file = tmp_path / 'constants.json'
  code, out = run_in_group([
      sys.executable, os.path.join(ROOT, 'scripts', 'calibrate_planner.py'),
      '--data_dir=' + tiny_data, '--rounds=1', '--steps=20',
      '--out=%s' % out_file], 900, env=suite_env())
  assert code == 0, out
  runs = re.findall(r'^round 1, run ([A-E]) \((\d) ps, (\d) (sync|async) '
                    r'workers\): (.+)$', out, re.M)
  assert [r[:4] for r in runs] == [
      ('A', '0', '1', 'sync'), ('B', '1', '1', 'sync'),
      ('C', '1', '2', 'sync'), ('D', '2', '1', 'sync'),
      ('E', '1', '1', 'async')]
  tasks = [re.findall(r'(\w+) [\d.]+ ms', r[4]) for r in runs]
  assert tasks == [['worker0'], ['worker0', 'ps0'],
                   ['worker0', 'worker1', 'ps0'], ['worker0', 'ps0', 'ps1'],
                   ['worker0', 'ps0']]
  found = json.loads(out_file.read_text())
  assert set(found['constants']) == set(planner_model.CPU_CONSTANTS)
  assert all(v >= 0 for v in found['constants'].values())
  assert found['constants'] == calibrate_planner.constants(
      {name: rounds[0] for name, rounds in found['runs'].items()})
  for name, value in found['constants'].items():
    assert re.search(r'^%s = %.2f core-ms \(rounds: %.2f\)$' % (
        name, value, value), out, re.M), name
  code, out = planner('--step_ms=45', '--num_workers=8', '--link_gbit=10',
                      '--model_bytes=719848', '--worker_cores=2',
                      '--ps_cores=2', '--constants=%s' % out_file)
  assert code == 0, out
  assert "their RPCs' CPU as measured on %s." % found['machine'] in out
