"""The scaling run's report (tools/scaling_report.py) through
tools/scaling_run.py --report_only, in a real process: no root, cgroups or
namespaces needed, so it runs wherever the suite does."""

import json
import os
import subprocess
import sys

from helpers import ROOT

SCALING = os.path.join(ROOT, 'tools', 'scaling_run.py')


def test_the_report_takes_the_median_one_process_step(tmp_path):
  # Three rounds' one-process steps, 224, 179 and 176 ms: the planner
  # starts from their median, 179 ms, and the median spread, 0.05.
  runs = [dict(round=r, gbit=10.0, workers=w, mode='sync', ps=1, mbit=600.0,
               images_per_sec=rate)
          for w, rates in ((1, (120.0, 110.0, 130.0)),
                           (2, (200.0, 190.0, 230.0)))
          for r, rate in enumerate(rates)]
  (tmp_path / 'scaling.json').write_text(json.dumps(dict(
      share=0.12, machine_cores=2.0, batch_size=32, host_cores=2,
      cpu='a CPU', latency_us=0.0, one_process_steps_ms=[224.0, 179.0, 176.0],
      one_process_step_cvs=[0.1, 0.05, 0.05], runs=runs)))
  proc = subprocess.run(
      [sys.executable, SCALING, '--data_dir=unused', '--report_only',
       '--work_dir=' + str(tmp_path)], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert ("one process's step on one machine 179 (176-224) ms; rounds: 3."
          in out)
  # By hand, 600 Mbit/s, machines of 0.12 cores: 1 worker 179 + its link's
  # 9.915 ms (the push hides in 0.58 x 179) + (2.1 + 4.4) / 0.12 = 54.167 of
  # RPCs = 243.08 ms: 131.6 images/s. 2 workers: the ps link 19.829 ms,
  # 54.167 of RPCs, the slowest of 2 steps 0.05 x 179 x 0.5642 = 5.050
  # later: 258.046 ms, 248.0 images/s. Linear: twice each round's 1 worker.
  assert '| 10 Gbit/s | 1 | sync | 1 | 120.0 (110.0-130.0) | 1.00 ' \
         '(1.00-1.00) | 132 | +10% |' in out
  assert '| 10 Gbit/s | 2 | sync | 1 | 200.0 (190.0-230.0) | 0.86 ' \
         '(0.83-0.88) | 248 | +24% |' in out
  assert (tmp_path / 'scaling.png').read_bytes()[:4] == b'\x89PNG'
