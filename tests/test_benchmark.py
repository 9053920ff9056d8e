"""scripts/benchmark.py runs end to end and writes consistent numbers.

Its slow-network runs need root and iproute2, as CI has; elsewhere the test
checks that the script says why it skipped them.
"""

import json
import os
import signal
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT
import network_namespaces
import plan_cluster

# What --quick trains of --only's pick (the rest of --quick is 2 ps + 2
# workers, which the shape matrix trains; a full run adds 1 ps + 1 worker,
# the precision flags and async runs), and the baseline, which --only keeps.
RUNS = {'single process', '1 ps + 2 workers, sync'}


def test_benchmark_quick_run(tmp_path):
  out = tmp_path / 'bench.json'
  # In a session of its own: if it hangs, the group (its PID) is killed with
  # every task it started, not just the script.
  proc = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, 'scripts', 'benchmark.py'),
       '--quick', '--steps=8', '--batch_size=16', '--json', str(out),
       '--only=^1 ps \\+ 2 workers, sync$'],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=str(tmp_path), start_new_session=True)
  try:
    stdout, _ = proc.communicate(timeout=400)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
    # And the network namespaces of its slow-network runs, had it no time
    # to delete them.
    leftover = network_namespaces.leftovers(proc.pid)
    network_namespaces.delete(leftover)
  assert proc.returncode == 0, stdout
  assert not leftover
  results = json.loads(out.read_text())
  assert set(results['training']) == RUNS
  assert results['rounds'] == 1
  single = results['training']['single process']['images_per_sec']
  for name, run in results['training'].items():
    assert run['images_per_sec'] > 0, name
    # One round (--quick): the ratio is that round's.
    assert run['ratios'] == [run['images_per_sec'] / single], name
    assert run['ratio'] == run['ratios'][0], name
    # Each row of the printed table is the JSON's, rounded.
    assert '| %s | %.0f | %.2fx | %.2f |' % (
        name, run['images_per_sec'], run['ratio'], run['ratio']) in stdout, name
  assert all(rate > 0 for rate in results['input'].values())
  assert results['bytes']['trainable_parameters'] == 179962
  startup = results['startup']
  assert 0 < startup['import_secs'] < startup['first_step_secs']
  assert startup['shutdown_secs'] >= 0
  assert_network(results, stdout, tmp_path / 'benchmark_network.png')


def assert_network(results, stdout, plot):
  """--quick measures 1 ps on an unlimited link and at 100 Mbit/s where
  namespaces can be made, and says why not elsewhere."""
  why = network_namespaces.why_unavailable()
  network = results['network']
  if why or 'skipped' in network:
    assert network == {'skipped': network['skipped']}
    assert 'Slow networks: skipped, %s' % network['skipped'] in stdout
    assert not plot.exists()
    return
  assert results['network_batch_sizes'] == [8]  # Half of --batch_size=16.
  runs = network['runs']
  # 1 ps unlimited (the planner's starting point), then at 100 Mbit/s.
  assert [(r['num_ps'], r['mbit'], r['batch_size']) for r in runs] == [
      (1, None, 8), (1, 100, 8)]
  share = results['bytes']['largest_ps_share']
  assert share['1'] == 1.0 and 0.5 <= share['2'] <= 0.6
  model = 179962 * 4
  assert model == plan_cluster.MODEL_BYTES
  for run in runs:
    assert run['ms_per_step'] == statistics.median(run['ms_per_step_rounds'])
    assert len(run['ms_per_step_rounds']) == 1
    assert run['images_per_sec'] == 1e3 * 2 * 8 / run['ms_per_step']
  free, slow = runs
  # The planner's prediction, from the unlimited run of the same shape.
  assert 'predicted_ms' not in free
  assert slow['predicted_ms'] == plan_cluster.predict_step_ms(
      free['ms_per_step'], model, 1.0, 2, 100)
  assert slow['prediction_error'] == (slow['predicted_ms'] /
                                      slow['ms_per_step'] - 1)
  # 1 ps carries both workers' 719,848 bytes each way at 100 Mbit/s:
  # 1.49 MB on the wire (headers included), 119 ms.
  assert plan_cluster.link_ms(model, 1.0, 2, 100) == pytest.approx(118.97,
                                                                   abs=0.01)
  row = ('| 1 ps + 2 workers, sync, 100 Mbit/s, batch 8 | %.0f | %.0f | %.0f '
         '| %+.0f%% |  |' % (slow['images_per_sec'], slow['ms_per_step'],
                             slow['predicted_ms'],
                             100 * slow['prediction_error']))
  assert row in stdout
  assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
