"""N distinct TCP ports that are free now, for a local cluster.

A port from bind(('', 0)) comes from the kernel's ephemeral range, from which
it also picks the source port of every outgoing connection: between the
moment it is released here and the moment a task binds it, one of the
cluster's own gRPC connections can take it. These ports come from below
that range, which the kernel never hands out by itself, so only another
program that picks ports the same way can race for them; give each such
program a range of its own in $FREE_PORT_RANGE (LOW-HIGH, HIGH excluded), as
the test suite does for its two workers.

scripts/run_local_cluster.sh runs it (it prints them), the tools and the
tests import it:

  python3 training/cluster/ports.py 3     # e.g. 14231 18775 11092
"""

import os
import random
import re
import socket
import sys

LOWEST = 10000  # Above the well-known and most registered service ports.
TRIES = 10000


def ephemeral_low():
  """Returns the lowest port of the kernel's ephemeral range."""
  try:
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return 32768  # Linux's default.


def is_free(port):
  """Whether port can be bound on all interfaces, as TensorFlow binds."""
  with socket.socket() as s:
    try:
      s.bind(('', port))
    except OSError:
      return False
  return True


def port_range():
  """(low, high): where free_ports picks, high excluded: $FREE_PORT_RANGE
  if set, else from LOWEST up to the kernel's ephemeral range.

  Raises:
    ValueError: $FREE_PORT_RANGE is not LOW-HIGH within 1024-65536.
  """
  given = os.environ.get('FREE_PORT_RANGE')
  if given:
    match = re.fullmatch(r'(\d+)-(\d+)', given)
    if not match or not 1024 <= int(match[1]) < int(match[2]) <= 65536:
      raise ValueError('FREE_PORT_RANGE=%r: give LOW-HIGH, 1024 <= LOW < '
                       'HIGH <= 65536 (HIGH not included), or unset it' %
                       given)
    return int(match[1]), int(match[2])
  high = ephemeral_low()
  return (LOWEST if high - LOWEST >= 1000 else 1024), high  # (Set up oddly.)


def free_ports(n):
  """Returns n distinct ports, free now, from port_range().

  Raises:
    RuntimeError: when that range has too few free ports.
    ValueError: from port_range().
  """
  low, high = port_range()
  ports = []
  for _ in range(TRIES):
    port = random.randrange(low, high)
    if port not in ports and is_free(port):
      ports.append(port)
      if len(ports) == n:
        return ports
  raise RuntimeError('found only %d free ports in %d..%d' % (len(ports), low,
                                                             high - 1))


if __name__ == '__main__':
  try:
    print(' '.join(str(p) for p in free_ports(int(sys.argv[1]))))
  except (RuntimeError, ValueError) as e:
    sys.exit('Error: %s' % e)
