"""A checkpoint of the release before the redesign (commit 1018504) resumes:
the graph saves every variable under the name and shape that release's
checkpoint holds, in one process and over 2 ps tasks (the kernels
partitioned). The list is that checkpoint's, read with
tf.train.load_checkpoint, not made by the code under test."""

import pytest
import tensorflow as tf

from helpers import worker_graph
from training.storage import checkpoints

tf1 = tf.compat.v1

RELEASE_CHECKPOINT = {
    'InceptionResnetV2/Conv2d_1a_3x3/BatchNorm/beta': [32],
    'InceptionResnetV2/Conv2d_1a_3x3/BatchNorm/beta/ExponentialMovingAverage': [32],
    'InceptionResnetV2/Conv2d_1a_3x3/BatchNorm/moving_mean': [32],
    'InceptionResnetV2/Conv2d_1a_3x3/BatchNorm/moving_variance': [32],
    'InceptionResnetV2/Conv2d_1a_3x3/weights': [3, 3, 3, 32],
    'InceptionResnetV2/Conv2d_1a_3x3/weights/ExponentialMovingAverage': [3, 3, 3, 32],
    'InceptionResnetV2/Conv2d_2a_3x3/BatchNorm/beta': [32],
    'InceptionResnetV2/Conv2d_2a_3x3/BatchNorm/beta/ExponentialMovingAverage': [32],
    'InceptionResnetV2/Conv2d_2a_3x3/BatchNorm/moving_mean': [32],
    'InceptionResnetV2/Conv2d_2a_3x3/BatchNorm/moving_variance': [32],
    'InceptionResnetV2/Conv2d_2a_3x3/weights': [3, 3, 32, 32],
    'InceptionResnetV2/Conv2d_2a_3x3/weights/ExponentialMovingAverage': [3, 3, 32, 32],
    'InceptionResnetV2/Conv2d_2b_3x3/BatchNorm/beta': [64],
    'InceptionResnetV2/Conv2d_2b_3x3/BatchNorm/beta/ExponentialMovingAverage': [64],
    'InceptionResnetV2/Conv2d_2b_3x3/BatchNorm/moving_mean': [64],
    'InceptionResnetV2/Conv2d_2b_3x3/BatchNorm/moving_variance': [64],
    'InceptionResnetV2/Conv2d_2b_3x3/weights': [3, 3, 32, 64],
    'InceptionResnetV2/Conv2d_2b_3x3/weights/ExponentialMovingAverage': [3, 3, 32, 64],
    'InceptionResnetV2/Conv2d_3b_1x1/BatchNorm/beta': [80],
    'InceptionResnetV2/Conv2d_3b_1x1/BatchNorm/beta/ExponentialMovingAverage': [80],
    'InceptionResnetV2/Conv2d_3b_1x1/BatchNorm/moving_mean': [80],
    'InceptionResnetV2/Conv2d_3b_1x1/BatchNorm/moving_variance': [80],
    'InceptionResnetV2/Conv2d_3b_1x1/weights': [1, 1, 64, 80],
    'InceptionResnetV2/Conv2d_3b_1x1/weights/ExponentialMovingAverage': [1, 1, 64, 80],
    'InceptionResnetV2/Conv2d_4a_3x3/BatchNorm/beta': [192],
    'InceptionResnetV2/Conv2d_4a_3x3/BatchNorm/beta/ExponentialMovingAverage': [192],
    'InceptionResnetV2/Conv2d_4a_3x3/BatchNorm/moving_mean': [192],
    'InceptionResnetV2/Conv2d_4a_3x3/BatchNorm/moving_variance': [192],
    'InceptionResnetV2/Conv2d_4a_3x3/weights': [3, 3, 80, 192],
    'InceptionResnetV2/Conv2d_4a_3x3/weights/ExponentialMovingAverage': [3, 3, 80, 192],
    'InceptionResnetV2/Logits/biases': [10],
    'InceptionResnetV2/Logits/biases/ExponentialMovingAverage': [10],
    'InceptionResnetV2/Logits/weights': [768, 10],
    'InceptionResnetV2/Logits/weights/ExponentialMovingAverage': [768, 10],
    'global_step': [],
}


@pytest.mark.parametrize('num_ps, sync', [(0, False), (2, True), (2, False)])
def test_the_graph_saves_what_the_last_release_saved(num_ps, sync):
  graph, _ = worker_graph(num_ps, sync)
  with graph.as_default():
    saved = {}
    for var in tf1.global_variables():
      name, shape = checkpoints.saved_name_and_shape(var)
      saved[name] = shape
  assert saved == RELEASE_CHECKPOINT
