"""Which session hooks a worker runs, and in what order: TensorFlow's
(NaN, stop at a step, summaries) and the suite's (training/session/hooks.py,
membership.py, tracing.py), as the worker's role and the cluster call for.
"""

import tensorflow as tf

from training.health import membership
from training.health import stragglers
from training.health import workers_watch
from training.session import hooks as session_hooks
from training.session import tracing

tf1 = tf.compat.v1


def in_order(*, graph, scaffold, train_dir, task, single_process,
                 max_steps, save_checkpoint_steps, save_summaries_steps,
                 replicas, trace_steps, set_aside):
  """A worker's session hooks, in the order they must run.

  Args:
    graph: Its TrainingGraph; scaffold: its Scaffold.
    train_dir, task: --train_dir (absolute) and the cluster_config.Task.
    single_process: Whether there is no cluster.
    max_steps, save_checkpoint_steps, save_summaries_steps: The flags'.
    replicas: Gradients a synchronous update takes.
    trace_steps: The flag's, as numbers.
    set_aside: --set_aside: the chief sets stragglers aside.
  """
  task_index = task.task_index
  is_chief = task_index == 0
  sync_replicas = replicas if graph.sync_opt else None
  hooks = [tf1.train.NanTensorHook(graph.loss)]  # First: no NaN is saved.
  if single_process:
    hooks.append(tf1.train.StopAtStepHook(last_step=max_steps))
  # In a cluster the loop stops at max_steps on the step each run reached,
  # which it reads anyway: StopAtStepHook's own read of the global step
  # would cost every worker's step one more RPC to its ps.
  if is_chief:
    hooks += [session_hooks.CheckpointSaverHook(
        train_dir, save_checkpoint_steps, scaffold, task.ps_hosts),
              tf1.train.SummarySaverHook(
                  save_steps=save_summaries_steps, scaffold=scaffold,
                  summary_writer=session_hooks.events_writer(train_dir)),
              # After the first checkpoint: its read must not delay it.
              session_hooks.LearningRateLineHook(graph)]
  if graph.sync_opt:
    # After the first checkpoint too: the chief's sync thread applies the
    # others' gradients, and the checkpoint named step N must hold step N.
    hooks.append(session_hooks.SyncReplicasHook(
        graph.sync_opt, is_chief, graph.global_step))
  if not single_process:
    hooks.append(membership.JoinedWorkersHook(task_index, task.worker_hosts,
                                            sync_replicas))
    hooks.append(membership.PsWatchHook(task_index, task.ps_hosts))
    hooks.append(workers_watch.LostWorkersHook(
        worker_hosts=task.worker_hosts, ps_hosts=task.ps_hosts,
        global_step=graph.global_step, replicas=sync_replicas,
        set_aside=set_aside) if is_chief else membership.ChiefWatchHook(
            task_index, task.worker_hosts[0], graph.global_step, max_steps))
    if sync_replicas and not is_chief:
      hooks.append(stragglers.StandAsideHook(
          task_index=task_index, global_step=graph.global_step,
          gradients=graph.gradients, max_steps=max_steps))
  if graph.loss_scaling and is_chief:
    hooks.append(session_hooks.SkippedStepsHook(graph.loss_scaling.after))
  if trace_steps:
    hooks.append(tracing.TraceStepsHook(trace_steps, train_dir,
                                              task_index))
  # Last: its after_run comes after every other hook's checkpoint writes.
  hooks.append(session_hooks.StopOnSignalHook(
      'Worker %d' % task_index,
      *((scaffold, train_dir, graph.global_step) if is_chief else ()),
      wait_for_step=single_process, ps_hosts=task.ps_hosts))
  return hooks
