"""N distinct TCP ports that are free now, for a local cluster.

A port from bind(('', 0)) comes from the kernel's ephemeral range, from which
it also picks the source port of every outgoing connection: between the
moment it is released here and the moment a task binds it, one of the
cluster's own gRPC connections can take it. These ports come from below
that range, which the kernel never hands out by itself, so only another
program that picks ports the same way can race for them.

scripts/run_local_cluster.sh runs it (it prints them), the tools and the
tests import it:

  python3 training/ports.py 3     # e.g. 14231 18775 11092
"""

import random
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


def free_ports(n):
  """Returns n distinct ports, free now, below the ephemeral range.

  Raises:
    RuntimeError: when that range has too few free ports.
  """
  high = ephemeral_low()
  low = LOWEST if high - LOWEST >= 1000 else 1024  # A machine set up oddly.
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
  print(' '.join(str(p) for p in free_ports(int(sys.argv[1]))))
