"""The benchmark's slow-network runs: synchronous clusters on limited links.

Owns which runs there are (ps and worker counts, batch sizes, link rates,
transfer dtypes), their names, and running them in interleaved rounds,
every task a host of its own (network_namespaces.py) and each worker on
cores of its own. Needs root and iproute2; elsewhere it says why it
skipped them.
"""

import re
from typing import NamedTuple, Optional

import benchmark_report
import measured_run
import network_namespaces


class Link(NamedTuple):
  """One slow-network run's shape."""
  batch_size: int
  mbit: Optional[int]  # None: unlimited.
  num_ps: int
  transfer_dtype: str
  num_workers: int = 2


def network_links(*, batch_sizes, rates, wire_dtypes, ps_counts,
                  worker_counts):
  """The runs, as Links: ps_counts ps + 2 workers at each batch size and
  rate (and unlimited), 1 ps with each other dtype of wire_dtypes; then for
  each other count N of worker_counts, the same examples a step (a batch of
  2 / N of each size), where the network bounds the step."""
  links = [Link(b, m, p, d) for b in batch_sizes for m in [None] + rates
           for p, d in [(p, 'float32') for p in ps_counts] + [
               (1, d) for d in wire_dtypes if d != 'float32']]
  return links + [Link(max(1, b * 2 // n), m, p, 'float32', n)
                  for n in worker_counts if n != 2 for b in batch_sizes
                  for m in [None] + rates for p in ps_counts]


def link_run_name(batch_size, mbit, num_ps, dtype, num_workers=2):
  """A run's name in the table, e.g. '1 ps + 2 workers, sync, 100 Mbit/s,
  batch 64'."""
  return '%d ps + %d workers, sync, %s, batch %d%s' % (
      num_ps, num_workers, link_name(mbit), batch_size,
      '' if dtype == 'float32' else ', %s transfers' % dtype)


def link_name(mbit):
  """'unlimited', '10 Gbit/s', '100 Mbit/s'."""
  if mbit is None:
    return 'unlimited'
  return '%g Gbit/s' % (mbit / 1000) if mbit >= 1000 else '%d Mbit/s' % mbit


def train_over_links(*, links, rounds, data_dir, work, steps, flags):
  """Runs each of links once a round, interleaved.

  The unlimited links measure the step the planner starts from: the same
  cluster when the network costs nothing.

  Returns:
    {'runs': [a dict a Link: its shape, its ms per step in each round and
    their median]}, or {'skipped': why}.
  """
  limited = any(link.mbit is not None for link in links)
  why = network_namespaces.why_unavailable() or (
      None if limited else 'no --network_rates given')
  measured = {link: [] for link in links}
  if not why:
    why = measure_links(measured, rounds=rounds, data_dir=data_dir,
                        work=work, steps=steps, flags=flags)
  if why:
    print('Slow networks: skipped, %s' % why, flush=True)
    return {'skipped': why}
  return {'runs': [benchmark_report.link_medians(
      name=link_run_name(*link), link=link, rounds=each_round)
                   for link, each_round in measured.items()]}


def measure_links(measured, *, rounds, data_dir, work, steps, flags):
  """Appends each round's measurements to measured {Link: [...]}; returns
  why it stopped early, or None."""
  for i in range(rounds):
    for link in measured:
      name = link_run_name(*link)
      print('Slow networks, round %d of %d: %s...' % (i + 1, rounds, name),
            flush=True)
      network = network_namespaces.Network(rate_mbit=link.mbit)
      try:
        network.make_hub()
      except RuntimeError as e:
        network.close()
        return 'cannot make network namespaces here: %s' % e
      try:
        measured[link].append(measured_run.run_training(
            name='%s_%d' % (re.sub(r'\W+', '_', name), i), data_dir=data_dir,
            work=work, num_ps=link.num_ps, num_workers=link.num_workers,
            steps=steps, batch_size=link.batch_size, network=network,
            flags=flags + ['--transfer_dtype=%s' % link.transfer_dtype]))
      finally:
        network.close()
  return None
