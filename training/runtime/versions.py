"""The TensorFlow versions the suite is tested on, and a line for others.

tools/tf_versions.py runs the test suite on a version; docs/tests.md holds
the table of what passed on which. A version outside TESTED (by its major
and minor number; a nightly counts as the release it leads to) may work, so
it gets one warning line at a task's start, not an error.
"""

# The oldest and the newest minor versions the whole suite passed on.
TESTED = ((2, 16), (2, 23))


def minor_version(version):
  """(major, minor) of a version string such as 2.17.1, 2.22.0rc0 or a
  nightly's 2.23.0-dev20261026; None where it has no such numbers."""
  parts = version.split('.')
  try:
    return int(parts[0]), int(parts[1])
  except (IndexError, ValueError):
    return None


def untested_line(version):
  """The warning for a TensorFlow outside TESTED, or None within it."""
  minor = minor_version(version)
  if minor is not None and TESTED[0] <= minor <= TESTED[1]:
    return None
  return ('Warning: TensorFlow %s is outside the versions this suite is '
          'tested on (%d.%d to %d.%d: docs/tests.md#tensorflow-versions); it '
          'may work.' % (version, *TESTED[0], *TESTED[1]))


def warn_if_untested(version):
  """Prints untested_line(version), if any, to stdout."""
  line = untested_line(version)
  if line:
    print(line)
