"""Hosts on one machine: network namespaces on a bridge, links of a set rate.

Each host is a network namespace with its own address on eth0, cabled by a
veth pair to a bridge in a hub namespace, as machines on one switch are. A
task runs on a host under `ip netns exec`. A link can be cut and restored,
and limited to a rate in both directions (a token bucket, `tc qdisc tbf`, on
each end of the veth pair), so that a cluster can be measured over 10 Gbit/s
or 100 Mbit/s links instead of loopback. Needs root and iproute2; the
addresses exist only inside these namespaces.

Used by tests/test_multihost.py, tools/benchmark.py and tools/machines.py.
"""

import json
import os
import shutil
import subprocess

SUBNET = '10.77.0.'


def ip(*args):
  """Runs `ip args...`; returns its stdout, raising with its stderr."""
  return _run(['ip'] + list(args))


def _run(command):
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError('%s: %s' % (' '.join(command), result.stderr.strip()))
  return result.stdout


def why_unavailable():
  """None where namespaces can be made; else why not, in a few words."""
  if shutil.which('ip') is None:
    return 'needs the ip command (iproute2) to make network namespaces'
  if os.geteuid() != 0:
    return 'needs root to make network namespaces and veth pairs'
  return None


def prefix(pid):
  """How the names of the namespaces that process pid makes begin."""
  return 'c10t%d-' % pid


def owner(name):
  """The PID of the process that made namespace name (None: not ours)."""
  pid = name[len('c10t'):].split('-')[0] if name.startswith('c10t') else ''
  return int(pid) if pid.isdigit() else None


def can_delay():
  """Whether this kernel has netem, which delays a link's packets."""
  name = 'c10probe%d' % os.getpid()
  subprocess.run(['ip', 'netns', 'add', name], capture_output=True)
  try:
    ok = not subprocess.run(
        ['tc', '-n', name, 'qdisc', 'replace', 'dev', 'lo', 'root', 'netem',
         'delay', '1ms'], capture_output=True).returncode
  finally:
    subprocess.run(['ip', 'netns', 'del', name], capture_output=True)
  return ok


def leftovers(pid):
  """The namespaces process pid made and did not delete (it was killed)."""
  if shutil.which('ip') is None:
    return []
  return [l.split()[0] for l in ip('netns', 'list').splitlines()
          if l.startswith(prefix(pid))]


def delete(names):
  """Deletes the namespaces, and with them their links."""
  for name in reversed(names):
    subprocess.run(['ip', 'netns', 'del', name], capture_output=True)


class Network:
  """Hosts in namespaces, each linked to a bridge in a hub namespace."""

  def __init__(self, port=2222, rate_mbit=None, delay_ms=0.0):
    """Args: port: every host's; rate_mbit: each host's link, if limited;
    delay_ms: added to each end of each link (netem), if any."""
    self.prefix = prefix(os.getpid())
    self.hub = self.prefix + 'hub'
    self.port = port
    self.rate_mbit = rate_mbit
    self.delay_ms = delay_ms
    self.namespaces = []

  def make_hub(self):
    """Makes the hub namespace and its bridge; tries what the hosts need.

    Raises:
      RuntimeError: where this machine cannot make them (no privilege, no
        veth or bridge support).
    """
    self._add_namespace(self.hub)
    ip('-n', self.hub, 'link', 'add', 'br0', 'type', 'bridge')
    ip('-n', self.hub, 'link', 'set', 'br0', 'up')
    ip('-n', self.hub, 'link', 'add', 'try0', 'type', 'veth', 'peer', 'name',
       'try1')
    ip('-n', self.hub, 'link', 'del', 'try0')
    ip('netns', 'exec', self.hub, 'true')

  def _add_namespace(self, name):
    ip('netns', 'add', name)
    self.namespaces.append(name)
    ip('-n', name, 'link', 'set', 'lo', 'up')

  def add_host(self, host, number):
    """Makes namespace <prefix><host> with address SUBNET<number> on eth0.

    Returns:
      The host's 'address:port' for the cluster's host lists.
    """
    name = self.prefix + host
    self._add_namespace(name)
    ip('-n', self.hub, 'link', 'add', 'v' + host, 'type', 'veth', 'peer',
       'name', 'eth0', 'netns', name)
    ip('-n', self.hub, 'link', 'set', 'v' + host, 'master', 'br0', 'up')
    ip('-n', name, 'addr', 'add', '%s%d/24' % (SUBNET, number), 'dev', 'eth0')
    ip('-n', name, 'link', 'set', 'eth0', 'up')
    if self.rate_mbit:
      self.limit_rate(host, self.rate_mbit, self.delay_ms)
    return '%s%d:%d' % (SUBNET, number, self.port)

  def exec_prefix(self, host):
    """The command prefix that runs a program on the host."""
    return ['ip', 'netns', 'exec', self.prefix + host]

  def set_link(self, host, state):
    """Cuts ('down') or restores ('up') the host's cable at the bridge."""
    ip('-n', self.hub, 'link', 'set', 'v' + host, state)

  def limit_rate(self, host, mbit, delay_ms=0.0):
    """Limits the host's link to mbit Mbit/s each way, as a NIC would.

    A token bucket on each end's egress: the host's eth0 (what it sends)
    and the bridge's port (what it receives). A NIC sends at its rate from
    the first byte, so the bucket holds 1 ms of traffic, and at least two
    full-size frames: a larger one lets every transfer that follows a pause
    out at memory speed (with 256 KiB, 723 KB crossed 100 Mbit/s in 39.7 ms
    instead of 59.7). tbf splits the larger segments veth hands over
    (segmentation offload) into frames that fit. Measured with one TCP
    stream, 723 KB took 1.033x its bytes' time at 30 Mbit/s to 1 Gbit/s
    (the headers); at 10 Gbit/s 1.1 ms, where copying, not the bucket, is
    the limit. With delay_ms, each end first delays every packet that
    long (netem, the bucket under it): a round trip between two hosts
    crosses four ends.
    """
    burst = max(int(mbit * 1e6 / 8 / 1000), 2 * 1514)
    for namespace, device in ((self.prefix + host, 'eth0'),
                              (self.hub, 'v' + host)):
      tc = ['tc', '-n', namespace, 'qdisc', 'replace', 'dev', device]
      bucket = ['tbf', 'rate', '%dmbit' % mbit, 'burst', str(burst),
                'latency', '100ms']
      if delay_ms:
        _run(tc + ['root', 'handle', '1:', 'netem', 'delay',
                   '%.3fms' % delay_ms, 'limit', '100000'])
        _run(tc + ['parent', '1:', 'handle', '2:'] + bucket)
      else:
        _run(tc + ['root'] + bucket)

  def eth0_bytes(self, host):
    """(received, sent) bytes on the host's eth0."""
    stats = json.loads(ip('-s', '-j', '-n', self.prefix + host, 'link',
                          'show', 'eth0'))[0]['stats64']
    return stats['rx']['bytes'], stats['tx']['bytes']

  def close(self):
    """Deletes every namespace made, and with them the links."""
    delete(self.namespaces)
    self.namespaces = []
