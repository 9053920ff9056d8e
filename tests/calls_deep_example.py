"""An example for test_structure's calls_deep: main -> a -> b."""


def main():
  a()


def a():
  b()


class Shadow:

  def b(self):  # Not the b that a() calls: not followed.
    while True:
      pass


def b():
  print('b')
