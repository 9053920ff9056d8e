"""The benchmark's report: medians, ratios, tables, the plot, the JSON.

Owns what the measurements become: the median of each run's rounds and its
spread, its ratio to the single process and to TF2's strategy in the same
round, the planner's prediction beside each slow-network run, the Markdown
tables, the PNG of images/s against the link rate, and benchmark.json. It
starts nothing and needs no TensorFlow.
"""

import json
import statistics

import cpu_profile
from training.cluster import planner_model

BASELINE = 'single process'  # What each row's 'x single process' is to.
PEER_ROW = "TF2's ParameterServerStrategy, 1 ps + 2 workers (async)"
SYNC_ROW = '1 ps + 2 workers, sync'
TORCH_ROW = 'PyTorch, one process'
DDP_ROW = 'PyTorch DDP over gloo, 2 processes'
# Each of our rows beside the PyTorch row on the same cores and images a
# step a process.
TORCH_PAIRS = ((BASELINE, TORCH_ROW), (SYNC_ROW, DDP_ROW))
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}  # The trainer's --transfer_dtype.


def summarize(measured, *, num_workers, num_gpus):
  """{row: the medians of its rounds, and its ratio to the single process
  in each round and their median}, of measured {row: [a round's results]}.

  A ratio is taken within a round, so that a slow minute of the machine
  weighs on both sides alike.

  Args:
    num_workers: {row: its workers}, for the images per GPU.
    num_gpus: GPUs per machine; 0: no images per GPU.
  """
  training = {}
  for name, runs in measured.items():
    ratios = [r['images_per_sec'] / s['images_per_sec']
              for r, s in zip(runs, measured[BASELINE])]
    row = {key: statistics.median(r[key] for r in runs)
           for key in ('images_per_sec', 'first_step_secs', 'shutdown_secs')}
    row['cpu_ms_per_image'] = median_cpu(runs)
    row.update(ratio=statistics.median(ratios), ratios=ratios)
    if 'perf_ms_per_image' in runs[0]:
      row['perf_ms_per_image'] = median_profile(
          [r['perf_ms_per_image'] for r in runs])
    if num_gpus:
      row['images_per_gpu'] = (row['images_per_sec'] /
                               min(num_workers[name], num_gpus))
    training[name] = row
  return training


def median_cpu(runs):
  """{task: the median over the runs of its CPU ms per image}, of the runs
  that measured a steady state."""
  cpu = [r['cpu_ms_per_image'] for r in runs if r['cpu_ms_per_image']]
  return {task: statistics.median(c[task] for c in cpu)
          for task in (cpu[0] if cpu else ())}


def median_profile(profiles):
  """The median over the rounds of each {group: {kind: ms}} entry (a
  kind a round did not sample counts 0 there)."""
  groups = {g for p in profiles for g in p}
  return {g: {k: statistics.median(p.get(g, {}).get(k, 0.0)
                                   for p in profiles)
              for k in {k for p in profiles for k in p.get(g, {})}}
          for g in groups}


def against_peer(training):
  """{our row: (median, [per round]) of its images/s over TF2's strategy's
  (PEER_ROW) in the same round}, for every row of ours measured beside it."""
  if PEER_ROW not in training:
    return {}
  peer = training[PEER_ROW]['ratios']
  ratios = {name: [r / p for r, p in zip(run['ratios'], peer)]
            for name, run in training.items()
            if name not in (PEER_ROW, TORCH_ROW, DDP_ROW)}
  return {name: (statistics.median(r), r) for name, r in ratios.items()}


def against_tf2(training):
  """against_peer as the JSON holds it."""
  return {name: {'ratio': median, 'ratios': rounds}
          for name, (median, rounds) in against_peer(training).items()}


def against_torch(training):
  """{our row: {'pytorch': its PyTorch row, 'ratio': the median over the
  rounds of our images/s over PyTorch's in the same round, 'ratios'}}, of
  the TORCH_PAIRS measured."""
  out = {}
  for ours, theirs in TORCH_PAIRS:
    if ours in training and theirs in training:
      each = [a / b for a, b in zip(training[ours]['ratios'],
                                    training[theirs]['ratios'])]
      out[ours] = {'pytorch': theirs, 'ratio': statistics.median(each),
                   'ratios': each}
  return out


def link_medians(*, name, link, rounds):
  """A slow-network run of link (benchmark_network.Link) as the JSON holds
  it: its ms per step in each round of rounds (measurements) and their
  median."""
  images = link.num_workers * link.batch_size  # A step's, all workers'.
  ms = [1e3 * images / r['images_per_sec'] for r in rounds]
  return {'name': name, 'num_ps': link.num_ps,
          'num_workers': link.num_workers, 'mbit': link.mbit,
          'batch_size': link.batch_size,
          'transfer_dtype': link.transfer_dtype,
          'ms_per_step': statistics.median(ms), 'ms_per_step_rounds': ms,
          'images_per_sec': 1e3 * images / statistics.median(ms)}


def predict_network(network, bytes_):
  """Adds to each limited run the planner's prediction from the unlimited
  run of the same shape (planner_model.predict_step_ms) and its error; and
  to each run but the 1 ps float32 one its speed-up over that one."""
  def shape(run, **change):
    keys = ('num_workers', 'batch_size', 'num_ps', 'transfer_dtype', 'mbit')
    return tuple(change.get(k, run[k]) for k in keys)

  by_shape = {shape(r): r for r in network.get('runs', [])}
  for run in network.get('runs', []):
    free = by_shape[shape(run, mbit=None)]
    if run['mbit'] is not None:
      run['predicted_ms'] = planner_model.predict_step_ms(
          free['ms_per_step'], bytes_['pull'],
          bytes_['largest_ps_share'][run['num_ps']], run['num_workers'],
          run['mbit'], DTYPE_BYTES[run['transfer_dtype']])
      run['prediction_error'] = run['predicted_ms'] / run['ms_per_step'] - 1
    base = by_shape[shape(run, num_ps=1, transfer_dtype='float32')]
    if run is not base:
      run['speedup_over_1_ps'] = (run['images_per_sec'] /
                                  base['images_per_sec'])


def write(results, *, plot, json_path):
  """Draws the plot (if there are slow-network runs), prints the tables,
  writes the JSON, saying where each went."""
  if results['network'].get('runs'):
    plot_network(results['network'], plot)
    print('Wrote %s' % plot)
  print(markdown(results))
  with open(json_path, 'w') as f:
    json.dump(results, f, indent=2)
  print('\nWrote %s' % json_path)


def markdown(results):
  """Formats the results as Markdown tables."""
  training = results['training']
  return '\n'.join(
      input_markdown(results) + training_markdown(results) +
      peer_markdown(training) + torch_markdown(results) +
      peak_markdown(results) + cpu_markdown(training) +
      perf_markdown(training) + startup_markdown(results) +
      network_markdown(results['network']))


def input_markdown(results):
  """The machine's line, and the input pipelines against training's need."""
  bf16 = results['cpu_bf16']
  out = ['Machine: %s, %d cores (bfloat16 instructions: %s); TensorFlow %s; '
         'batch %d; %d steps per training run.' % (
             results['machine'], results['cores'],
             ', '.join(bf16) if bf16 else 'none' if bf16 is not None else
             'unknown', results['tensorflow'], results['batch_size'],
             results['steps']), '',
         '| input pipeline | records/s | x training needs | CPU ms per '
         'record |', '|---|---|---|---|']
  need = results['training'][BASELINE]['images_per_sec']
  cpu = results['input_cpu_ms_per_record']
  for name, rate in results['input'].items():
    out.append('| %s | %.0f | %.1fx | %s |' % (
        name, rate, rate / need, '%.3f' % cpu[name] if name in cpu else ''))
  return out


def training_markdown(results):
  """Each training row's images/s and its ratio to the single process."""
  out = ['', '| training (median of %d rounds) | images/s | x single '
         'process | x in each round |' % results['rounds'],
         '|---|---|---|---|']
  for name, r in results['training'].items():
    per_gpu = ('; %.0f per GPU' % r['images_per_gpu']
               if 'images_per_gpu' in r else '')
    out.append('| %s | %.0f%s | %.2fx | %s |' % (
        name, r['images_per_sec'], per_gpu, r['ratio'],
        per_round(r['ratios'])))
  return out


def per_round(ratios):
  """'0.93, 1.02, 0.97': a row's ratio in each round."""
  return ', '.join('%.2f' % x for x in ratios)


def peer_markdown(training):
  """The table of every row against TF2's strategy; none without it."""
  ratios = against_peer(training)
  if not ratios:
    return []
  out = ['', "| against TF2's ParameterServerStrategy (1 ps + 2 workers, the "
         'same step) | x TF2 | x in each round |', '|---|---|---|']
  for name, (median, each) in ratios.items():
    out.append('| %s | %.2fx | %s |' % (name, median, per_round(each)))
  return out


def torch_markdown(results):
  """The table of our rows against PyTorch's on the same cores; none
  without PyTorch's rows."""
  pairs = results.get('against_pytorch')
  if not pairs:
    return []
  out = ['', '| against PyTorch (the same net, files and cores) | PyTorch row '
         '| x PyTorch | x in each round |', '|---|---|---|---|']
  for name, pair in pairs.items():
    out.append('| %s | %s | %.2fx | %s |' % (
        name, pair['pytorch'], pair['ratio'], per_round(pair['ratios'])))
  return out


def peak_markdown(results):
  """Each row's float32 FLOP/s and its share of the cores' peak."""
  peak = results.get('peak')
  if not peak:
    return []
  out = ['', '| compute: %.1f MFLOP an image trained; peak %.0f GFLOP/s (%d '
         'cores x %.2f GHz x %d FLOP a cycle) | GFLOP/s | of peak |' % (
             results['flop_per_image'] / 1e6, peak['gflops'], peak['cores'],
             peak['ghz'], peak['flop_per_cycle']), '|---|---|---|']
  for name, run in results['training'].items():
    gflops = run['images_per_sec'] * results['flop_per_image'] / 1e9
    out.append('| %s | %.1f | %.0f%% |' % (name, gflops,
                                           100 * gflops / peak['gflops']))
  return out


def cpu_markdown(training):
  """Each run's CPU ms per image trained in its steady state, by process."""
  out = ['', '| CPU ms per image, steady state (median of the rounds) | ps | '
         'workers | coordinator | all |', '|---|---|---|---|---|']
  for name, run in training.items():
    ms = run['cpu_ms_per_image']
    if not ms:
      out.append('| %s | | | | no steady state measured |' % name)
      continue
    ps = sum(v for k, v in ms.items() if k.startswith('ps'))
    workers = sum(v for k, v in ms.items() if k.startswith('worker'))
    out.append('| %s | %s | %.2f | %s | %.2f |' % (
        name, '%.2f' % ps if any(k.startswith('ps') for k in ms) else '',
        workers, '%.2f' % ms['coordinator'] if 'coordinator' in ms else '',
        sum(ms.values())))
  return out


def perf_markdown(training):
  """With --perf: each run's CPU ms per image in its steady state, by
  group of processes and kind of work; none without."""
  runs = {n: r['perf_ms_per_image'] for n, r in training.items()
          if 'perf_ms_per_image' in r}
  if not runs:
    return []
  out = ['', '| perf: CPU ms per image, steady state (median of the rounds) '
         '| %s | all |' % ' | '.join(cpu_profile.ORDER),
         '|---|' + '---|' * (len(cpu_profile.ORDER) + 1)]
  for name, groups in runs.items():
    for group in ('workers', 'ps', 'other', 'idle'):
      if group in groups:
        row = groups[group]
        out.append('| %s: %s | %s | %.3f |' % (
            name, group, ' | '.join('%.3f' % row.get(k, 0.0)
                                    for k in cpu_profile.ORDER),
            sum(row.values())))
  return out


def startup_markdown(results):
  """Startup, shutdown, and the bytes a worker moves per step."""
  s, b = results['startup'], results['bytes']
  return [
      '', '| startup and shutdown (1 ps + 2 workers, sync) | seconds |',
      '|---|---|',
      '| import TensorFlow | %.1f |' % s['import_secs'],
      '| launch to the first step (any worker) | %.1f |' %
      s['first_step_secs'],
      '| the same, beyond importing TensorFlow | %.1f |' %
      s['first_step_beyond_import_secs'],
      '| last step to every process gone | %.1f |' % s['shutdown_secs'],
      '', '| bytes per worker per step | value |', '|---|---|',
      '| trainable parameters | %d |' % b['trainable_parameters'],
      '| pulled (variables) + pushed (gradients) | %.2f MB |' %
      ((b['pull'] + b['push']) / 1e6),
      '| on 1 Gb/s | %.1f ms |' % b['ms_at_1gbps'],
      '| on 10 Gb/s | %.2f ms |' % b['ms_at_10gbps']]


def network_markdown(network):
  """The slow-network table, or the line that says why there is none."""
  if 'skipped' in network:
    return ['', 'Slow networks: not measured (%s).' % network['skipped']]
  count = len(network['runs'][0]['ms_per_step_rounds'])
  out = ['', '| every task on its own link (median of %d round%s) | images/s '
         '| ms per step | planner, ms | planner error | x 1 ps, float32 |' % (
             count, '' if count == 1 else 's'),
         '|---|---|---|---|---|---|']
  for r in network['runs']:
    out.append('| %s | %.0f | %.0f | %s | %s | %s |' % (
        r['name'], r['images_per_sec'], r['ms_per_step'],
        '%.0f' % r['predicted_ms'] if 'predicted_ms' in r else '',
        '%+.0f%%' % (100 * r['prediction_error'])
        if 'prediction_error' in r else '',
        '%.2fx' % r['speedup_over_1_ps'] if 'speedup_over_1_ps' in r
        else ''))
  return out


def plot_network(network, path):
  """Images/s against link rate, a line per ps count and batch, and the
  planner's predictions as crosses (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  def line_of(r):
    return r['num_workers'], r['batch_size'], r['num_ps'], r['transfer_dtype']

  for num_workers, batch_size, num_ps, dtype in sorted(
      {line_of(r) for r in network['runs']}, reverse=True):
    runs = sorted((r for r in network['runs'] if line_of(r) == (
        num_workers, batch_size, num_ps, dtype) and r['mbit'] is not None),
                  key=lambda r: r['mbit'])
    line, = ax.plot([r['mbit'] for r in runs],
                    [r['images_per_sec'] for r in runs],
                    marker='s' if num_workers != 2 else 'o',
                    linestyle='-' if num_ps == 2 else ':' if dtype != 'float32'
                    else '--', label='%d ps + %d workers, batch %d%s' % (
                        num_ps, num_workers, batch_size,
                        '' if dtype == 'float32' else ', %s transfers' % dtype))
    ax.plot([r['mbit'] for r in runs if 'predicted_ms' in r],
            [1e3 * num_workers * batch_size / r['predicted_ms'] for r in runs
             if 'predicted_ms' in r], marker='x', markersize=9,
            linestyle='none', color=line.get_color())
  ax.plot([], [], marker='x', linestyle='none', color='gray',
          label="the planner's prediction")
  ax.set_xscale('log')
  ax.set_xlabel('link rate of every task (Mbit/s)')
  ax.set_ylabel('images/s (all workers)')
  ax.set_ylim(bottom=0)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize='small', loc='lower right')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
