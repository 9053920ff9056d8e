#!/usr/bin/env python3
"""Images/s against workers, each task a machine of its own on this host.

Every ps and worker runs on a machine of --share cores (a cgroup quota) and
a link of its own (a network namespace), standing for a machine of
--machine_cores cores on links of each --link_gbit (tools/machines.py: the
link carries --link_gbit x share / machine_cores). For each link it runs
1, 2, 4 and 8 workers (--workers): synchronous (every update all the
workers' gradients), with one backup worker (an update the first W - 1)
and asynchronous, each on the ps count the planner (scripts/plan_cluster.py)
chooses, and synchronous also on one fewer; repeats interleaved (--rounds).
Each point is the global images/s of the steady state (the chief's global
steps over --steps of its steps, counted once every machine has stepped,
times the examples an update takes); its efficiency is against linear: W
times 1 worker + 1 ps, synchronous, in the same round. Beside it, the
planner's prediction from one process's step on one machine (measured at
the start of each round, the median: it moves from run to run):

  sudo python3 tools/scaling_run.py --data_dir=./synthetic-cifar-10-batches-bin \\
      --work_dir=/tmp/scaling

--quick runs 1 and 2 synchronous workers on one link once. Writes
WORK_DIR/scaling.json (after each run), WORK_DIR/scaling.md and the plot
(--plot, default WORK_DIR/scaling.png); --report_only writes them
again with the planner's current model, --pool from several runs'
rounds. Needs root. Every cgroup and namespace it makes is removed at its
end, also on an error, Ctrl-C or SIGTERM; those of an earlier run killed
with SIGKILL at its start.
"""

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))  # The planner.
import cpu_peak  # pylint: disable=g-import-not-at-top,wrong-import-position
from elastic_run import int_list  # pylint: disable=g-import-not-at-top,wrong-import-position
from machine_run import Run, TaskFailed  # pylint: disable=g-import-not-at-top,wrong-import-position
import machines  # pylint: disable=g-import-not-at-top,wrong-import-position
import network_namespaces  # pylint: disable=g-import-not-at-top,wrong-import-position
import plan_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
import scaling_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.cluster import planner_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position

MODES = scaling_report.MODES


def make_parser():
  """The command line's flags."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--work_dir', required=True,
                      help="each run's logs, scaling.json and scaling.md")
  parser.add_argument('--workers', default='1,2,4,8',
                      help='the worker counts (default: %(default)s)')
  parser.add_argument('--modes', default=','.join(MODES),
                      help='of sync, backup (one backup worker) and async '
                      '(default: %(default)s)')
  parser.add_argument('--link_gbit', default='1,10',
                      help='the links the runs stand for, Gbit/s between '
                      'machines of --machine_cores (default: %(default)s)')
  parser.add_argument('--machine_cores', type=float,
                      default=machines.host_cores(),
                      help='the cores of the machines the runs stand for '
                      '(default: this host\'s, %(default)s)')
  parser.add_argument('--share', type=float,
                      help='the share of one host core each machine gets '
                      '(default: the most that fits the largest run: the '
                      'workers and the ps tasks the planner chooses)')
  parser.add_argument('--latency_us', type=float, default=0.0,
                      help='one-way latency of the links the runs stand for, '
                      'us (emulated times machine_cores / share; needs '
                      'netem; default: none added)')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=30,
                      help="the chief's steps measured in each run")
  parser.add_argument('--one_process_steps', type=int, default=120,
                      help="the steps of one process's window, the "
                      "planner's input: at a fraction of a core steps run "
                      'in phases of seconds, which a short window catches '
                      'one of (default: %(default)s)')
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--quick', action='store_true',
                      help='1 and 2 synchronous workers, the first link, '
                      'one round')
  parser.add_argument('--plot', help='the figure (default: '
                      'WORK_DIR/scaling.png)')
  parser.add_argument('--check_shares', action='store_true',
                      help='instead: one process on one core against quotas '
                      'of 1, 0.5 and 0.25 of it and --share, '
                      '--rounds times interleaved: how well a share stands '
                      'for a machine')
  parser.add_argument('--report_only', action='store_true',
                      help="make the table and the figure again from "
                      "WORK_DIR/scaling.json, with the planner's current "
                      'model; runs nothing')
  parser.add_argument('--pool',
                      help='with --report_only: the rounds of the runs in '
                      'these folders (separated by commas) together, '
                      'written to WORK_DIR')
  parser.add_argument('--constants', metavar='FILE.json',
                      help="the planner's RPC CPU constants from "
                      'scripts/calibrate_planner.py (default: the shipped)')
  return parser


def parse_args(argv):
  """The command line; exits with status 2 and one line where it is wrong."""
  parser = make_parser()
  args = parser.parse_args(argv)
  try:
    args.workers = sorted(set(int_list(args.workers, '--workers')))
    args.link_gbit = [float(g) for g in args.link_gbit.split(',')]
  except ValueError as e:
    parser.exit(2, 'Error: %s\n' % (e if '--' in str(e) else
                                    '--link_gbit must be numbers separated '
                                    'by commas (got %r)' % args.link_gbit))
  args.modes = args.modes.split(',')
  if args.quick:
    args.workers, args.modes = [1, 2], ['sync']
    args.link_gbit, args.rounds = args.link_gbit[:1], 1
  problem = usage_problem(args)
  args.pool = args.pool.split(',') if args.pool else []
  missing = [d for d in args.pool or [args.work_dir] if not os.path.exists(
      os.path.join(d, 'scaling.json'))]
  if args.pool and not args.report_only:
    problem = '--pool makes a report of runs made: add --report_only'
  elif args.report_only and missing:
    problem = ('--report_only: %s holds no scaling.json; run without '
               '--report_only first' % missing[0])
  try:
    if args.constants and not problem:
      print('The planner with the constants measured on %s' %
            planner_model.load_constants(args.constants))
  except (OSError, ValueError) as e:
    problem = '--constants=%s: %s' % (args.constants, e)
  if problem:
    parser.exit(2, 'Error: %s\n' % problem)
  args.plot = args.plot or os.path.join(args.work_dir, 'scaling.png')
  return args


def usage_problem(args):
  """One line saying what is wrong with the command line, or None."""
  why = None if args.report_only else machines.why_unavailable()
  if why:
    return 'each task a machine of its own %s: run it with sudo' % why
  bad = [m for m in args.modes if m not in MODES]
  if bad:
    return '--modes takes %s (got %s)' % (', '.join(MODES), bad[0])
  if min(args.workers) < 1 or min(args.link_gbit) <= 0:
    return '--workers and --link_gbit must all be above 0'
  if min(args.rounds, args.steps, args.one_process_steps,
         args.batch_size) < 1:
    return ('--rounds, --steps, --one_process_steps and --batch_size must '
            'be at least 1')
  if args.latency_us < 0 or args.machine_cores <= 0:
    return '--latency_us must be 0 or more, --machine_cores above 0'
  if args.latency_us and not network_namespaces.can_delay():
    return ('--latency_us needs netem (sch_netem), which this kernel lacks; '
            'leave --latency_us out')
  cores = machines.host_cores()
  if args.share is not None and not 0 < args.share <= 1:
    return ('--share=%g: a machine is held to a share of one of this '
            "host's %d cores, above 0 and at most 1" % (args.share, cores))
  fewest = max(args.workers) + 1
  if not machines.fits(fewest, args.share or 0.01):
    return too_many(fewest, args.share)
  return None


def too_many(tasks, share):
  """The line for more machines than this host's CPU holds."""
  per_core = -(-tasks // machines.host_cores())
  return ('%d machines of %g cores need %d a core, %.2f of each of this '
          "host's %d cores; it lends %.2f of each: lower --share (at most "
          '%.2f) or the workers' % (
              tasks, share, per_core, per_core * share, machines.host_cores(),
              machines.HEADROOM, fitted_share(tasks)))


def fitted_share(tasks):
  """The most cores each of `tasks` machines may have, to 0.01 below."""
  per_core = -(-tasks // machines.host_cores())
  return math.floor(machines.HEADROOM / per_core * 100) / 100


def link_mbit(gbit, args, share):
  """The emulated link for a link of gbit between --machine_cores
  machines."""
  return gbit * 1000 * share / args.machine_cores


def modes_for(args, workers):
  """The --modes a run of `workers` workers can have: a backup needs 2."""
  return [m for m in args.modes if workers > 1 or m != 'backup']


def one_process(args, share, name):
  """One process's step on one machine of share cores (Run.measure's
  result): the planner's input."""
  return Run(args=args, name=name, num_workers=1, num_ps=0, mode='sync',
             mbit=None, share=share, steps=args.one_process_steps).measure()


def points(args, ps_counts):
  """[(gbit, workers, mode, ps)] of the runs, as run in each round:
  ps_counts {(gbit, workers, mode): the planner's ps count}."""
  out = []
  for gbit in args.link_gbit:
    for w in args.workers:
      for mode in modes_for(args, w):
        fewest = ps_counts[(gbit, w, mode)]
        for ps in (fewest, fewest - 1) if mode == 'sync' else (fewest,):
          if ps >= 1:
            out.append((gbit, w, mode, ps))
    if (gbit, 1, 'sync', 1) not in out:  # The baseline of linear.
      out.insert(0, (gbit, 1, 'sync', 1))
  return out


def main(argv=None):
  args = parse_args(argv)
  os.makedirs(args.work_dir, exist_ok=True)
  if args.report_only:
    return report_only(args)
  try:
    with machines.exits_on_signals():
      swept = machines.sweep()
      if swept:
        print('Removed %d cgroups and namespaces of an earlier run that was '
              'killed.' % swept, flush=True)
      return check_shares(args) if args.check_shares else measure_all(args)
  except KeyboardInterrupt:
    print('\nInterrupted: its machines are removed; the runs so far are in '
          '%s' % os.path.join(args.work_dir, 'scaling.json'), file=sys.stderr)
    return 130
  except TaskFailed as e:
    print('Error: %s' % e, file=sys.stderr)
    return 1


def report_only(args):
  """Writes the report of WORK_DIR's run, or of the --pool runs together."""
  results = []
  for d in args.pool or [args.work_dir]:
    with open(os.path.join(d, 'scaling.json')) as f:
      results.append(json.load(f))
  try:
    results = scaling_report.pooled(results)
  except ValueError as e:
    print('Error: --pool: %s; pool runs of one command line' % e,
          file=sys.stderr)
    return 2
  return scaling_report.write_report(args, results)


def plan_runs(args, share):
  """Measures one process's step on one machine of share cores; returns
  (the step, ms; {(gbit, workers, mode): the planner's ps count})."""
  print('One process on one machine of %g cores, for the planner...' % share,
        flush=True)
  one = one_process(args, share, 'one_process')
  return one, {(g, w, m): plan_cluster.fewest_within(plan_cluster.plan(
      one['chief_step_ms'], w, link_mbit(g, args, share),
      plan_cluster.largest_shares(16), args.batch_size,
      plan_cluster.network_bytes(), 4, mode=m, worker_cores=share,
      ps_cores=share, step_cv=one['step_cv']))
                   for g in args.link_gbit for w in args.workers
                   for m in modes_for(args, w)}


def measure_all(args):
  """Measures the step, plans, checks the fit, runs the rounds.

  Without --share, each machine gets the most that fits the largest run
  with half as many ps as workers; where the planner asks for more, the
  share is fitted again (the planner's count hardly depends on it: a
  smaller share slows the compute, the RPCs and the emulated links alike).
  """
  largest = max(args.workers)
  share = args.share or fitted_share(largest + math.ceil(largest / 2) + 1)
  one, ps_counts = plan_runs(args, share)
  tasks = max(w + ps for (_, w, _), ps in ps_counts.items())
  if not machines.fits(tasks, share) and not args.share:
    share = fitted_share(tasks)
    one, ps_counts = plan_runs(args, share)
    tasks = max(w + ps for (_, w, _), ps in ps_counts.items())
  if not machines.fits(tasks, share):
    print('Error: ' + too_many(tasks, share), file=sys.stderr)
    return 2
  out_path = os.path.join(args.work_dir, 'scaling.json')
  todo = points(args, ps_counts)
  results = {'share': share, 'machine_cores': args.machine_cores,
             'batch_size': args.batch_size,
             'one_process_steps_ms': [one['chief_step_ms']],
             'one_process_step_cvs': [one['step_cv']],
             'host_cores': machines.host_cores(),
             'cpu': cpu_peak.cpu_model(),
             'latency_us': args.latency_us, 'runs': []}
  print('A step of %.0f ms (spread %.2f); %d runs a round, %d rounds.' % (
      one['chief_step_ms'], one['step_cv'], len(todo), args.rounds),
        flush=True)
  for r in range(args.rounds):
    if r:  # The planner's step again, as the machine is in this round.
      again = one_process(args, share, 'r%d_one_process' % r)
      results['one_process_steps_ms'].append(again['chief_step_ms'])
      results['one_process_step_cvs'].append(again['step_cv'])
    for i, (gbit, w, mode, ps) in enumerate(todo, 1):
      mbit = link_mbit(gbit, args, share)
      name = 'r%d_%gg_%dw_%s_%dps' % (r, gbit, w, mode, ps)
      print('Round %d of %d, run %d of %d: %d worker%s, %s, %d ps, %g Gbit/s '
            '(%.0f Mbit/s here)...' % (r + 1, args.rounds, i, len(todo), w,
                                       's' * (w > 1), mode, ps, gbit, mbit),
            flush=True)
      measured = Run(args=args, name=name, num_workers=w, num_ps=ps,
                     mode=mode, mbit=mbit, share=share).measure()
      measured.update(round=r, gbit=gbit, workers=w, mode=mode, ps=ps,
                      mbit=mbit)
      print('  %.1f images/s' % measured['images_per_sec'], flush=True)
      results['runs'].append(measured)
      with open(out_path, 'w') as f:
        json.dump(results, f, indent=1)
  return scaling_report.write_report(args, results)


def check_shares(args):
  """One process on one real core against quotas of cores; prints and
  writes (WORK_DIR/shares.json) each one's images/s a core."""
  share = args.share or fitted_share(max(args.workers) + 1)
  cases = [('1 core, no quota', 1.0, False)] + [
      ('quota of %g cores' % q, q, True) for q in sorted(
          {1.0, 0.5, 0.25, share}, reverse=True)]
  rates = {name: [] for name, _, _ in cases}
  for r in range(args.rounds):
    for i, (name, cores, held) in enumerate(cases):
      print('Round %d of %d: one process, %s...' % (r + 1, args.rounds, name),
            flush=True)
      rate = Run(args=args, name='shares_r%d_%d' % (r, i), num_workers=1,
                 num_ps=0, mode='sync', mbit=None, share=cores,
                 held=held).measure()['images_per_sec']
      rates[name].append(rate / cores)
      print('  %.1f images/s a core' % (rate / cores), flush=True)
  base = rates[cases[0][0]]
  out = ['| one process on one core | images/s a core | x no quota, by round |',
         '|---|---|---|']
  for name, _, _ in cases:
    out.append('| %s | %s | %s |' % (
        name, scaling_report.spread(rates[name], 1),
        scaling_report.spread([a / b for a, b in zip(rates[name], base)], 3)))
  print('\n'.join(out))
  with open(os.path.join(args.work_dir, 'shares.json'), 'w') as f:
    json.dump({'cpu': cpu_peak.cpu_model(), 'rates_a_core': rates,
               'batch_size': args.batch_size}, f, indent=1)
  return 0


if __name__ == '__main__':
  process.start()
  sys.exit(main())
