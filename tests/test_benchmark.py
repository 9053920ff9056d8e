"""scripts/benchmark.py runs end to end and writes consistent numbers."""

import json
import os
import subprocess
import sys

from conftest import ROOT


def test_benchmark_quick_run(tmp_path):
  out = tmp_path / 'bench.json'
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'benchmark.py'),
       '--quick', '--steps=8', '--batch_size=16', '--json', str(out)],
      capture_output=True, text=True, timeout=400, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  results = json.loads(out.read_text())
  assert set(results['training']) == {
      'single process', '1 ps + 1 worker', '1 ps + 2 workers, sync',
      '1 ps + 2 workers, async', '2 ps + 2 workers, sync',
      '2 ps + 2 workers, async'}
  assert results['training']['single process']['ratio'] == 1.0
  for run in results['training'].values():
    assert run['images_per_sec'] > 0 and run['ratio'] > 0
  assert all(rate > 0 for rate in results['input'].values())
  assert results['bytes']['trainable_parameters'] == 179962
  assert results['bytes']['pull'] + results['bytes']['push'] == 179962 * 8
  startup = results['startup']
  assert 0 < startup['import_secs'] < startup['first_step_secs']
  assert startup['shutdown_secs'] >= 0
  assert '| 1 ps + 2 workers, sync |' in proc.stdout
  assert '| 2 ps + 2 workers, sync |' in proc.stdout
