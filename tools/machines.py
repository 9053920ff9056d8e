"""Machines of their own on one host: a namespace, a link and a CPU share.

Each task runs on a host of its own (a network namespace with one link of
a set rate, network_namespaces.Network) and in a cgroup held to a share of
a core (cpu_shares.CpuShares), placed there before TensorFlow starts, its
threads on one of this host's cores (the machines take them in turn):
measured, a quota whose threads may use every core computed at 0.59 of a
real core per core (throttled threads stall each other), one kept to one
core at 0.90-0.94 (docs/scaling.md#scaling).

The simulated cluster is a real one slowed down. A task on q cores
computes at q/Q of a machine of Q cores, so if its link carries B x q/Q,
every part of a step (the compute, the ps's RPC handling, the bytes) takes
Q/q times as long as on Q cores and links of B: images/s scale by q/Q,
and efficiencies, ratios and which part bounds the step stay. Latency
scales the other way from rate: a round trip of L stands for L x q/Q, so
a real link's latency is emulated as L x Q/q (netem, where the kernel has
it). What does not scale: a real machine of Q cores does not compute Q
times as fast as one core (its threads share caches and memory), and the
kernel's own network work is charged to no share.
"""

import contextlib
import os
import shutil
import signal

import cpu_shares
import network_namespaces

# The share of each of the host's cores its machines' quotas may add up to:
# the rest is for the kernel's network work, the runner and what samples
# the CPU.
HEADROOM = 0.85


def why_unavailable():
  """None where machines can be made here; else why not, in a few words."""
  if os.geteuid() != 0:
    return 'needs root (network namespaces and cgroups)'
  return network_namespaces.why_unavailable() or cpu_shares.why_unavailable()


def host_cores():
  """The cores this process may run on."""
  return len(os.sched_getaffinity(0))


def fits(tasks, cores):
  """Whether `tasks` machines of `cores` each fit this host, taking its
  cores in turn (each core's machines within HEADROOM of it)."""
  per_core = -(-tasks // host_cores())
  return per_core * cores <= HEADROOM


def sweep():
  """Removes the namespaces and cgroups of runs that died without removing
  theirs (a SIGKILL); returns how many."""
  gone = cpu_shares.sweep()
  names = network_namespaces.ip('netns', 'list') if shutil.which('ip') else ''
  owners = {l.split()[0]: network_namespaces.owner(l.split()[0])
            for l in names.splitlines() if l.strip()}
  dead = [n for n, pid in owners.items()
          if pid is not None and not cpu_shares.alive(pid)]
  network_namespaces.delete(dead)
  return len(gone) + len(dead)


class Machines:
  """Hosts, each with its link and its share of the cores.

  Use as a context manager: leaving it, however (an exception, Ctrl-C,
  SIGTERM under exits_on_signals), kills what runs in the shares and
  removes every cgroup and namespace made.
  """

  def __init__(self, *, cores, rate_mbit=None, delay_ms=0.0):
    """Args: cores: each machine's share (0.25: a quarter of a core);
    rate_mbit: each link's rate (None: unlimited); delay_ms: added at each
    end of each link."""
    self.cores = cores
    self.network = network_namespaces.Network(rate_mbit=rate_mbit,
                                              delay_ms=delay_ms)
    self.shares = cpu_shares.CpuShares()
    self.cores_of = {}  # {task: the host core its threads run on}

  def __enter__(self):
    try:
      self.network.make_hub()
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc):
    self.close()

  def add(self, task, number):
    """Makes the task's machine; returns its 'address:port'.

    Its share holds from hold(task) on: a task boots (imports TensorFlow,
    builds and optimizes its graph: 5-7 CPU seconds) at the host's speed,
    else a run of 0.15-core machines spends 45 s before its first step.
    """
    address = self.network.add_host(task, number)
    self.shares.make(task)
    cores = sorted(os.sched_getaffinity(0))
    self.cores_of[task] = cores[len(self.cores_of) % len(cores)]
    return address

  def hold(self, task):
    """Holds the task's machine to its share from now on."""
    self.shares.set(task, self.cores)

  def prefix(self, task):
    """The command prefix that runs a program on the task's machine."""
    return (self.shares.prefix_for(task) + self.network.exec_prefix(task) +
            ['taskset', '-c', str(self.cores_of[task])])

  def throttled(self, task):
    """(periods, periods throttled) of the task's share so far."""
    return self.shares.throttled(task)

  def close(self):
    """Kills what runs in the shares; removes the cgroups and namespaces.
    A second Ctrl-C or SIGTERM waits until it is done."""
    signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
      self.shares.close()
      self.network.close()
    finally:
      signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


@contextlib.contextmanager
def exits_on_signals():
  """Within: SIGTERM and SIGHUP raise SystemExit, so that cleanup runs, as
  Ctrl-C's KeyboardInterrupt does."""
  def leave(signum, _):
    raise SystemExit(128 + signum)
  old = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)
