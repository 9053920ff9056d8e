"""How a process of the suite runs: its start and end, the filter that
keeps TensorFlow's C++ chatter off the terminal (and an error in one line),
the progress line a worker writes and the tools read, the TensorFlow
versions it is tested on, and the private TensorFlow API it cannot do
without.

May import: nothing of training.
"""
