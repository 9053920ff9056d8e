"""scripts/benchmark.py runs end to end and writes consistent numbers."""

import json
import os
import signal
import subprocess
import sys

from conftest import ROOT

RUNS = {'single process', '1 ps + 1 worker', '1 ps + 2 workers, sync',
        '1 ps + 2 workers, async', '2 ps + 2 workers, sync',
        '2 ps + 2 workers, async'}


def test_benchmark_quick_run(tmp_path):
  out = tmp_path / 'bench.json'
  # In a session of its own: if it hangs, the group (its PID) is killed with
  # every task it started, not just the script.
  proc = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, 'scripts', 'benchmark.py'),
       '--quick', '--steps=8', '--batch_size=16', '--json', str(out)],
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
  assert proc.returncode == 0, stdout
  results = json.loads(out.read_text())
  assert set(results['training']) == RUNS
  single = results['training']['single process']['images_per_sec']
  for name, run in results['training'].items():
    assert run['images_per_sec'] > 0, name
    assert run['ratio'] == run['images_per_sec'] / single, name
    # Each row of the printed table is the JSON's, rounded.
    assert '| %s | %.0f | %.2fx |' % (name, run['images_per_sec'],
                                      run['ratio']) in stdout, name
  assert all(rate > 0 for rate in results['input'].values())
  assert results['bytes']['trainable_parameters'] == 179962
  startup = results['startup']
  assert 0 < startup['import_secs'] < startup['first_step_secs']
  assert startup['shutdown_secs'] >= 0
