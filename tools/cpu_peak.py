"""This machine's CPU: its name, and the float32 peak of its cores, what
the benchmark's FLOP/s are a share of.

Reads /proc/cpuinfo (the model, the clock it states, the vector
instructions); needs no TensorFlow.
"""

import os
import platform


def cpuinfo_fields(cpuinfo='/proc/cpuinfo'):
  """{field: value} of the first CPU /proc/cpuinfo lists; {} without it."""
  fields = {}
  try:
    with open(cpuinfo) as f:
      for line in f:
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return fields


def cpu_model(cpuinfo='/proc/cpuinfo'):
  """This machine's CPU as /proc/cpuinfo names it, with its family and
  model (AMD's family 25 is Zen 3 at model 1, Zen 4 at model 17)."""
  fields = cpuinfo_fields(cpuinfo)
  name = fields.get('model name') or platform.processor() or (
      platform.machine())
  if 'cpu family' in fields and 'model' in fields:
    name += ' (family %s model %s)' % (fields['cpu family'], fields['model'])
  return name


def float32_peak(cpuinfo='/proc/cpuinfo', cores=None):
  """{'cores', 'ghz', 'flop_per_cycle', 'gflops'}: the float32 FLOP/s these
  cores could do at the clock /proc/cpuinfo states; None where it states
  none.

  FLOP a cycle a core, from the vector units: two FMA pipes of 256 bits
  (AVX2 and FMA, and AMD's AVX-512 before Zen 5, which splits 512-bit
  operations in two) do 32; Intel's AVX-512 and Zen 5, two of 512 bits,
  64. A VM's clock is its host's nominal one: a core that boosts above it
  puts a run above its share of this peak.
  """
  fields = cpuinfo_fields(cpuinfo)
  try:
    mhz = float(fields['cpu MHz'])
  except (KeyError, ValueError):
    return None
  flags = fields.get('flags', '').split()
  wide = 'avx512f' in flags and (fields.get('vendor_id') != 'AuthenticAMD'
                                 or int(fields.get('cpu family', 0)) >= 26)
  per_cycle = 64 if wide else 32 if 'fma' in flags else 16
  cores = cores or len(os.sched_getaffinity(0))
  return {'cores': cores, 'ghz': mhz / 1e3, 'flop_per_cycle': per_cycle,
          'gflops': cores * mhz / 1e3 * per_cycle}
