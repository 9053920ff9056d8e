"""The scaling run's report: its table, its figure, the planner beside it.

Reads the runs tools/scaling_run.py measured (scaling.json): each point's
median images/s and spread over the rounds, its efficiency against linear
(the workers times 1 worker + 1 ps in the same round), and the planner's
prediction (training/cluster/planner_model.py) from one process's step on one
machine (the median of the rounds'); writes the Markdown table and the
figure of images/s against workers.
"""

import json
import os
import statistics

import plan_cluster
from training.cluster import planner_model

MODES = ('sync', 'backup', 'async')


def predicted(*, step_ms, step_cv, mode, num_workers, num_ps, mbit, share,
              batch_size):
  """The planner's images/s for a point."""
  return planner_model.predict_images_per_sec(
      step_ms=step_ms, model_bytes=plan_cluster.network_bytes(),
      share=plan_cluster.largest_shares(16)[num_ps],
      num_workers=num_workers, num_ps=num_ps, mbit=mbit,
      batch_size=batch_size, mode=mode, worker_cores=share, ps_cores=share,
      step_cv=step_cv)


def write_report(args, results):
  """Adds the planner's prediction to each run, writes the JSON, the
  table and the figure."""
  step_ms, step_cv = planner_input(results)
  for run in results['runs']:
    run['planner'] = predicted(
        step_ms=step_ms, step_cv=step_cv, mode=run['mode'],
        num_workers=run['workers'], num_ps=run['ps'], mbit=run['mbit'],
        share=results['share'], batch_size=results['batch_size'])
  out_path = os.path.join(args.work_dir, 'scaling.json')
  with open(out_path, 'w') as f:
    json.dump(results, f, indent=1)
  table = report(results)
  with open(os.path.join(args.work_dir, 'scaling.md'), 'w') as f:
    f.write(table + '\n')
  print(table)
  plot(results, args.plot)
  print('Wrote %s, %s and %s' % (out_path, os.path.join(
      args.work_dir, 'scaling.md'), args.plot))
  return 0


def pooled(results):
  """Several runs' results (scaling.json) as one: their rounds one after
  another, their one-process steps together. Raises ValueError where
  their host, machines or batch differ."""
  out = dict(results[0], runs=[], one_process_steps_ms=[],
             one_process_step_cvs=[])
  same = ('cpu', 'host_cores', 'share', 'machine_cores', 'batch_size',
          'latency_us')
  for res in results:
    other = ['%s %s against %s' % (k, res[k], out[k]) for k in same
             if res[k] != out[k]]
    if other:
      raise ValueError('runs of another host, machines or batch (%s)' %
                       ', '.join(other))
    first = 1 + max((r['round'] for r in out['runs']), default=-1)
    out['runs'] += [dict(r, round=r['round'] + first) for r in res['runs']]
    out['one_process_steps_ms'] += res['one_process_steps_ms']
    out['one_process_step_cvs'] += res['one_process_step_cvs']
  return out


def planner_input(results):
  """(step ms, its spread) of one process on one machine, the medians of
  the rounds' (the planner's input)."""
  return (statistics.median(results['one_process_steps_ms']),
          statistics.median(results['one_process_step_cvs']))


def summary(results):
  """[{gbit, workers, mode, ps, rates, linear, planner}] a point, in order:
  linear from each round's 1 worker + 1 ps, synchronous."""
  base = {(r['round'], r['gbit']): r['images_per_sec']
          for r in results['runs']
          if (r['workers'], r['mode'], r['ps']) == (1, 'sync', 1)}
  out = {}
  for r in results['runs']:
    key = (r['gbit'], r['workers'], r['mode'], r['ps'])
    point = out.setdefault(key, {'gbit': key[0], 'workers': key[1],
                                 'mode': key[2], 'ps': key[3], 'rates': [],
                                 'of_linear': [], 'planner': r['planner']})
    point['rates'].append(r['images_per_sec'])
    if (r['round'], r['gbit']) in base:
      point['of_linear'].append(r['images_per_sec'] / (
          r['workers'] * base[(r['round'], r['gbit'])]))
  return sorted(out.values(), key=lambda p: (p['gbit'], p['workers'],
                                             MODES.index(p['mode']),
                                             -p['ps']))


def spread(values, digits):
  """'median (min-max)' of values, or the one value."""
  fmt = '%%.%df' % digits
  if len(values) == 1:
    return fmt % values[0]
  return (fmt + ' (' + fmt + '-' + fmt + ')') % (
      statistics.median(values), min(values), max(values))


def report(results):
  """The runs as a Markdown table: a row a point."""
  out = ['Machines of %g cores of a %d-core %s, standing for machines of %g '
         "cores; batch %d; one process's step on one machine %s ms; "
         'rounds: %d.' % (
             results['share'], results['host_cores'], results['cpu'],
             results['machine_cores'], results['batch_size'],
             spread(results['one_process_steps_ms'], 0),
             max(r['round'] for r in results['runs']) + 1), '',
         '| link | workers | training | ps | images/s | of linear | the '
         'planner | its error |', '|---|---|---|---|---|---|---|---|']
  for p in summary(results):
    rate = statistics.median(p['rates'])
    out.append('| %g Gbit/s | %d | %s | %d | %s | %s | %.0f | %+.0f%% |' % (
        p['gbit'], p['workers'], p['mode'], p['ps'], spread(p['rates'], 1),
        spread(p['of_linear'], 2) if p['of_linear'] else '',
        p['planner'], 100 * (p['planner'] / rate - 1)))
  return '\n'.join(out)


def plot(results, path):
  """Images/s against workers, a panel a link: linear, each mode measured
  (median, spread as bars) and the planner's line."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  points_ = summary(results)
  links = sorted({p['gbit'] for p in points_})
  fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4.2),
                           squeeze=False)
  colors = {'sync': 'C0', 'backup': 'C1', 'async': 'C2'}
  for ax, gbit in zip(axes[0], links):
    mine = [p for p in points_ if p['gbit'] == gbit]
    base = [p for p in mine if (p['workers'], p['mode'], p['ps']) ==
            (1, 'sync', 1)]
    workers = sorted({p['workers'] for p in mine})
    if base:
      one = statistics.median(base[0]['rates'])
      ax.plot(workers, [w * one for w in workers], 'k:', label='linear')
    for mode in MODES:
      fewest = {}
      for p in mine:
        if p['mode'] == mode:
          fewest.setdefault(p['workers'], []).append(p)
      if not fewest:
        continue
      # The planner's ps count (the most run), and sync's one fewer.
      counts = [ps for _, ps in sorted(fewest.items())]
      for label, chosen in (
          ('', [max(ps, key=lambda p: p['ps']) for ps in counts]),
          (', one fewer ps', [min(ps, key=lambda p: p['ps'])
                              for ps in counts if len(ps) > 1])):
        if not chosen:
          continue
        xs = [p['workers'] for p in chosen]
        med = [statistics.median(p['rates']) for p in chosen]
        err = [[m - min(p['rates']) for m, p in zip(med, chosen)],
               [max(p['rates']) - m for m, p in zip(med, chosen)]]
        ax.errorbar(xs, med, yerr=err, marker='o' if not label else 'x',
                    linestyle='-' if not label else '--', capsize=3,
                    color=colors[mode], label='%s%s' % (
                        {'sync': 'sync', 'backup': 'sync, 1 backup',
                         'async': 'async'}[mode], label))
        if not label:
          ax.plot(xs, [p['planner'] for p in chosen], linestyle='-.',
                  color=colors[mode], alpha=0.6,
                  label='the planner, %s' % mode)
    ax.set_title('%g Gbit/s between %g-core machines' % (
        gbit, results['machine_cores']), fontsize='small')
    ax.set_xlabel('workers (the planner\'s ps count)')
    ax.set_ylabel('images/s, all workers (this host\'s time)')
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize='x-small', loc='upper left')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
