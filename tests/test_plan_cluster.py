"""scripts/plan_cluster.py: its predictions, its answer, and the README's
"How many ps tasks?" table, which must be what the planner prints."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
import plan_cluster

PLANNER = os.path.join(ROOT, 'scripts', 'plan_cluster.py')


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
  assert plan_cluster.link_ms(719848, 1.0, 2, 100) == pytest.approx(
      118.97, abs=0.01)
  assert plan_cluster.predict_step_ms(60, 719848, 1.0, 2, 100) == (
      pytest.approx(60 + 118.97 + 60.38, abs=0.02))
  # bfloat16 halves every transfer.
  assert plan_cluster.link_ms(719848, 1.0, 2, 100, 2) == pytest.approx(
      118.97 / 2, abs=0.01)
  # On a fast link the push hides entirely; the pull does not.
  assert plan_cluster.predict_step_ms(60, 719848, 1.0, 2, 10000) == (
      pytest.approx(60 + 1.19, abs=0.01))


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


def test_a_plan_in_a_real_process():
  code, out = planner('--step_ms=45', '--num_workers=32', '--link_gbit=10',
                      '--max_ps=8')
  assert code == 0, out
  rows = table_rows(out)
  assert [int(r[0]) for r in rows] == list(range(1, 9))
  shares = plan_cluster.largest_shares(8)
  for num_ps, mb, ms, rate, _ in rows:
    expected = plan_cluster.predict_step_ms(45, 719848, shares[num_ps], 32,
                                            10000)
    assert ms == pytest.approx(expected, abs=0.05)
    assert rate == pytest.approx(32 * 128 * 1e3 / expected, abs=0.5)
    assert mb == pytest.approx(0.719848 * max(1, 32 * shares[num_ps]),
                               abs=0.005)
  best = max(r[3] for r in rows)
  fewest = next(int(r[0]) for r in rows if r[3] >= 0.95 * best)
  assert 'Fewest ps tasks within 5%% of the best: %d (' % fewest in out
  # 32 workers outnumber what this network splits into: the ps links stay
  # the busiest.
  assert "each worker's own link" not in out
  assert 'Traceback' not in out


def test_a_plan_where_the_workers_links_are_the_limit():
  code, out = planner('--step_ms=10', '--num_workers=4', '--link_gbit=1',
                      '--transfer_dtype=bfloat16', '--max_ps=8')
  assert code == 0, out
  shares = plan_cluster.largest_shares(8)
  own = min(p for p, share in shares.items() if 4 * share <= 1)
  assert ("From %d ps on, each worker's own link is the busiest" % own) in out
  rows = table_rows(out)
  assert rows[own - 1][2] == pytest.approx(
      plan_cluster.predict_step_ms(10, 719848, shares[own], 4, 1000, 2),
      abs=0.05)
  # bfloat16: half of the 0.72 MB model on each worker's link.
  assert rows[own - 1][1] == pytest.approx(0.36, abs=0.005)


@pytest.mark.parametrize('flags, says', [
    ([], '--step_ms must be given and above 0 (got None)'),
    (['--step_ms=45', '--num_workers=0', '--link_gbit=1'],
     '--num_workers must be given and above 0 (got 0)'),
    (['--step_ms=45', '--num_workers=8', '--link_gbit=1', '--model_bytes=0'],
     '--model_bytes must be given and above 0 (got 0)'),
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


def test_the_readme_table_is_the_planners():
  code, out = planner('--typical')
  assert code == 0, out
  table = out.strip()
  assert len(table.splitlines()) == 2 + 9  # Header, rule, 3 x 3 clusters.
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    assert table in f.read()
  with open(os.path.join(ROOT, 'README.zh-CN.md'), encoding='utf-8') as f:
    assert table in f.read()
