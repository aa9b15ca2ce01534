"""Configuration of a SEED program (agent-independent; agents have their own dataclass).

Why ~300 lines: `ProgramConfig`'s fields are the program's whole surface (transport,
placement, budgets, faults, the reproducible schedule), each documented where it is
declared, and its checks refuse a bad combination by name before anything starts;
split, a field's documentation and its check would live apart.
"""

import dataclasses
import numbers
import types
import typing
from typing import Any, Dict, Tuple


_SCALARS = (bool, int, float, str)


def _is(value: Any, kind: type) -> bool:
  """Whether `value` fits a field annotated `kind`: an int is a float, a bool is
  neither (True would otherwise pass as 1), numpy's ints and floats are what they are."""
  if kind is type(None):
    return value is None
  if kind is bool or kind is str:
    return isinstance(value, kind)
  if isinstance(value, bool):
    return False
  return isinstance(value, numbers.Integral if kind is int else numbers.Real)


def check_scalar_fields(config: Any) -> None:
  """Refuses a field of a config dataclass whose value is not of its annotated scalar
  type (bool/int/float/str, or None where the annotation allows it), naming the
  config, the field, the value and the type. Each agent's config calls it first in
  `__post_init__`: `--agent_config learning_rate=4e-4,kl_ceiling=0.02` gave the string
  '4e-4,kl_ceiling=0.02', which the config took and the learner failed on once the
  run had started. Fields of other types (tuples, ...) are left to the config's own
  checks."""
  hints = typing.get_type_hints(type(config))
  for field in dataclasses.fields(config):
    hint = hints.get(field.name)
    allowed = (typing.get_args(hint)
               if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
               else (hint,))
    if not all(t in _SCALARS or t is type(None) for t in allowed):
      continue
    value = getattr(config, field.name)
    if not any(_is(value, t) for t in allowed):
      names = ' or '.join('None' if t is type(None) else t.__name__ for t in allowed)
      raise ValueError(f'{type(config).__name__}.{field.name}={value!r}: expected {names}')


@dataclasses.dataclass
class ProgramConfig:
  """How many actors, how inference batches, when to stop, where to write.

  Attributes:
    num_actors: env-only actor processes.
    envs_per_actor: K, envs each actor steps per inference call.
    num_eval_envs: envs of the greedy evaluator node (0: no evaluator).
    eval_interval_s: the evaluator plays `eval_episodes` episodes every this many
      seconds and idles in between (0: it plays continuously).
    eval_episodes: episodes per evaluation round.
    inference_batch_envs: the policy runs as soon as it is free and this many envs
      wait (1, the default: whatever is queued when the policy becomes free -- no
      batch waits for a slow actor while the server idles; None: all training envs,
      one request from every actor, i.e. lockstep). Measured in bench/acting.py and
      bench/inference_service.py (README, "Benchmarks").
    inference_timeout_ms: ... or once the first waiting request is this old.
    max_learner_steps, max_env_steps, max_seconds: budgets; the program stops itself
      at the first one reached (None: not set). They count over the whole run, across
      restarts and resumes (the time: seconds of running, kept in the logdir).
    default_max_seconds: the time budget of a run that sets none of the three (None:
      it runs until stopped); a budget the user names replaces it (`time_budget`).
    target_return: stop once the average return reaches this (None: never).
    target_on: 'train' (last 100 training episodes) or 'eval' (last 20 episodes of
      the greedy evaluator).
    logdir: progress.jsonl, summary.json, TensorBoard events.
    progress_interval_s: period of progress records.
    seed: the run seed (>= 0): env e's seed is a function of it and e only
      (`seedacme.run.schedule.train_env_seed`), the same on any split of the envs;
      launchers also make it the agent config's seed (action sampling, minibatches),
      and the central node seeds TensorFlow (initial weights) with it.
    reproducible: the round schedule (issue 63): every training env steps in rounds,
      a round acts with the weights the learner gave for the rounds before it, and the
      learner takes whole rounds in env-id order with TensorFlow's op determinism on,
      so a seed names a run whatever the number of actors, hosts or the load
      (`seedacme.run.schedule`). For the unroll-queue agents (V-trace, PPO) with
      central inference, a learner batch that divides the training envs, and an
      engine that sends all of an actor's envs in one request; `validate` refuses the
      rest by name. A resume compares it (`seedacme.run.identity`).
    reproducible_lag: L >= 0, how many rounds the acting weights lag the data
      (`seedacme.run.schedule`): round r acts with the learner's output for rounds
      0..r-1-L. 0: acting and learning take turns; 1 (Cleanba's): round r acts while
      the learner trains on round r - 1. Each lag is exact, and another run.
    reproducible_threads: TF's intra-op threads on the central node of a reproducible
      run: Eigen's reductions split by it, so it is fixed rather than the machine's
      core count (`seedacme.runtime.machine_pins`, with the instruction-set caps).
      Another count is another run.
    env_not_exact: why the run's envs do not repeat their episodes under a seed (an
      env's `not_exact_because`, which the launchers read from the env they create to
      learn its spec: Football's engine, DeepMind Lab unchecked); None: nothing known.
      A reproducible run with it records its rounds and evaluator passes as not exact
      from the start, naming it (the summary's `not_exact_because`).
    checkpoint_interval_s: save learner state this often to <logdir>/checkpoints and
      resume from there on restart (None: no checkpoints).
    checkpoint_rounds: a reproducible run checkpoints every this many rounds instead
      (at the round's start, with the servers' and envs' state), so that a resume is
      exact (`seedacme.run.resume`); checkpoint_interval_s=None turns them off too.
    export_policy: write the policy as a SavedModel to <logdir>/saved_model at the end.
    supervise: run actors, evaluator and the central node as supervised child processes
      that are restarted when they die (seedacme.runtime.supervisor).
    standby_restarts: the replay and central nodes keep a standby child with Reverb /
      TensorFlow already imported, which takes over at once when the working child
      dies (a restart without ~5-20 s of imports). Costs a process per node (~450 MB
      for the central node's) and its imports' CPU 10 s into the run, so it is off
      for short local runs and on for Vertex and cluster launches.
    learner_step_delay_s: pause after every learner step: simulates a slow learner
      (backpressure tests and demos); 0 in real runs.
    inference: where the policy runs. 'central': SEED -- one batched policy on the
      central node for all actors, env-only actors. 'actor': Acme's distributed
      pattern -- every actor holds a network copy, acts for its own K envs, writes its
      own trajectories and pulls parameters from the learner
      (`seedacme.actor.actor_side`). Everything else is identical.
    variable_update_period: with inference='actor', actors fetch fresh parameters
      every this many inference calls (in the background, as Acme's VariableClient).
    accelerator: the accelerator the launch asked for the central node ('V100',
      'TPU_V3', ...; None: none). The central node refuses to start when TensorFlow
      sees no device of that kind (`seedacme.runtime.devices`) rather than train on the CPU.
    transport: how central inference requests travel from actors on the central
      node's host: 'auto' (shared memory, `seedacme.wire.shm`; Courier for actors on
      other hosts), 'courier' (always Courier: the comparison), 'shm' (shared memory
      or the actor fails at attach). Courier stays the control plane either way.
    train: False runs acting only (no trajectories written, no learner steps): for
      measuring acting throughput without the learner as the bottleneck.
    inference_devices, learner_devices: where the central node runs inference and
      the learner: device names ('GPU:1', 'GPU:2,GPU:3') or counts ('2'); None: by
      the accelerators TF sees (none or one: both together; more: inference on the
      first, the learner data-parallel on the rest). `seedacme.runtime.placement`.
    logical_cpus: split the central node's CPU into this many logical devices before
      TF starts (0: no split): placements tested and tried on a CPU-only machine.
    policy_copy: inference serves its own copy of the policy's variables, copied after
      each learner step, also when it shares the learner's device (as it always does on
      another device: `seedacme.nodes.placed`). False: it reads the learner's variables,
      so actions are served mid-update while a learner step runs.
    env_name, env_args: the env as the launcher named it (registry name, the training
      envs' factory arguments, the agent's training-env defaults included); saved with
      the run's config and compared on resume
      (`seedacme.run.identity`; None: a program composed in Python, told apart by
      `env_factory_identity`).
    env_factory_identity: which envs the training envs' factory makes (its qualified
      name and arguments, `seedacme.run.identity.factory_identity`); `make_program`
      sets it from the factory it is given, for a launcher's program and a composed
      one alike, and a resume compares it.
    allow_config_change: fields of the saved run config a resume may change, by the
      exact paths the refusal prints (`agent_config.entropy_cost`, `env_args.game`);
      '*': any field, and a checkpoint saved without a config (its config adopted).
    acting_nice: renice actor and evaluator processes by this much (0-19), so that the
      central node's inference and learner win the CPU when all are runnable
      (`seedacme.runtime.priority`; measured in bench/learner_share.py).
    env_step_timeout_s: an env call (a batch's step or reset) that has not returned
      after this long is a hung env: reported, and its actor restarted (None: no
      watchdog). 60 s is far above any step or reset seen (seconds for a DeepMind Lab
      or Football reset, stretched by a loaded machine): `seedacme.actor.env_actor`.
    max_abs_reward: the largest |reward| a request may carry; past it the server
      refuses the request by name (None: the env spec's bound, `EnvSpec.max_abs_reward`,
      1e6 unless the env says otherwise).
  """
  num_actors: int = 2
  envs_per_actor: int = 16
  num_eval_envs: int = 4
  eval_interval_s: float = 0.0
  eval_episodes: int = 20
  inference_batch_envs: int | None = 1
  inference_timeout_ms: float = 2.0
  max_learner_steps: int | None = None
  max_env_steps: int | None = None
  max_seconds: float | None = None
  default_max_seconds: float | None = 120.0
  target_return: float | None = None
  target_on: str = 'train'
  logdir: str = '/tmp/seedacme'
  progress_interval_s: float = 5.0
  seed: int = 0
  reproducible: bool = False
  reproducible_lag: int = 0
  reproducible_threads: int = 2
  env_not_exact: str | None = None
  checkpoint_interval_s: float | None = 60.0
  checkpoint_rounds: int = 50
  export_policy: bool = True
  supervise: bool = True
  standby_restarts: bool = False
  learner_step_delay_s: float = 0.0
  inference: str = 'central'
  variable_update_period: int = 100
  train: bool = True
  transport: str = 'auto'
  accelerator: str | None = None
  inference_devices: str | None = None
  learner_devices: str | None = None
  logical_cpus: int = 0
  policy_copy: bool = False
  acting_nice: int = 0
  env_step_timeout_s: float | None = 60.0
  max_abs_reward: float | None = None
  env_name: str | None = None
  env_args: Dict[str, Any] = dataclasses.field(default_factory=dict)
  env_factory_identity: Dict[str, Any] | None = None
  allow_config_change: Tuple[str, ...] = ()

  @property
  def time_budget(self) -> float | None:
    """The time budget that applies: `max_seconds`, or the default when no budget is
    set at all."""
    if self.max_seconds is not None:
      return self.max_seconds
    if self.max_learner_steps is None and self.max_env_steps is None:
      return self.default_max_seconds
    return None

  def describe_budgets(self) -> str:
    """Which budgets apply, for the start-up line (e.g. 'budgets: 1,000,000 env
    steps; no time budget')."""
    parts = []
    if self.max_learner_steps is not None:
      parts.append(f'{self.max_learner_steps:,} learner steps')
    if self.max_env_steps is not None:
      parts.append(f'{self.max_env_steps:,} env steps')
    budget = self.time_budget
    if budget is not None:
      default = ' (the default)' if self.max_seconds is None else ''
      parts.append(f'{budget:,.0f}s of run time{default}')
    text = 'budgets: ' + ', '.join(parts) if parts else 'no budget (runs until stopped)'
    if budget is None and parts:
      text += '; no time budget'
    if self.target_return is not None:
      text += f'; target return {self.target_return} ({self.target_on})'
    return text

  @property
  def num_train_envs(self) -> int:
    return self.num_actors * self.envs_per_actor

  @property
  def num_envs(self) -> int:
    """Global env ids: actors' envs first, then the evaluator's."""
    return self.num_train_envs + self.num_eval_envs

  def validate(self, builder: Any = None, env_factory: Any = None) -> None:
    """Raises ValueError naming a bad field. Given the agent's builder and the env
    factory (`make_program` and the launchers give them), it also checks that the
    reproducible schedule can run them (`check_reproducible`)."""
    if not isinstance(self.reproducible, bool):
      raise ValueError(f'reproducible must be True or False, got {self.reproducible!r}')
    if isinstance(self.reproducible_lag, bool) or \
        not isinstance(self.reproducible_lag, numbers.Integral) or self.reproducible_lag < 0:
      raise ValueError(f'reproducible_lag must be an int >= 0 (rounds the acting weights '
                       f'lag the data), got {self.reproducible_lag!r}')
    if isinstance(self.reproducible_threads, bool) or not isinstance(
        self.reproducible_threads, numbers.Integral) or self.reproducible_threads < 1:
      raise ValueError(f'reproducible_threads must be an int >= 1 (TF intra-op threads of '
                       f'a reproducible run), got {self.reproducible_threads!r}')
    if self.env_not_exact is not None and not isinstance(self.env_not_exact, str):
      raise ValueError(f'env_not_exact must be a str (why the envs are not exact) or None, '
                       f'got {self.env_not_exact!r}')
    if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) \
        or self.seed < 0:
      raise ValueError(f'seed must be an int >= 0, got {self.seed!r}')
    if self.num_actors < 1:
      raise ValueError(f'num_actors must be >= 1, got {self.num_actors}')
    if self.envs_per_actor < 1:
      raise ValueError(f'envs_per_actor must be >= 1, got {self.envs_per_actor}')
    if self.target_on not in ('train', 'eval'):
      raise ValueError(f"target_on must be 'train' or 'eval', got {self.target_on!r}")
    if self.target_on == 'eval' and self.target_return is not None and not self.num_eval_envs:
      raise ValueError("target_on='eval' needs an evaluator (num_eval_envs > 0)")
    if self.inference not in ('central', 'actor'):
      raise ValueError(f"inference must be 'central' or 'actor', got {self.inference!r}")
    if self.variable_update_period < 1:
      raise ValueError(
          f'variable_update_period must be >= 1, got {self.variable_update_period}')
    if self.transport not in ('auto', 'courier', 'shm'):
      raise ValueError(
          f"transport must be 'auto', 'courier' or 'shm', got {self.transport!r}")
    if not 0 <= self.acting_nice <= 19:
      raise ValueError(f'acting_nice must be in 0..19, got {self.acting_nice}')
    if self.max_abs_reward is not None and not self.max_abs_reward > 0:
      raise ValueError(f'max_abs_reward must be > 0 or None, got {self.max_abs_reward}')
    if self.env_step_timeout_s is not None and self.env_step_timeout_s <= 0:
      raise ValueError(f'env_step_timeout_s must be > 0 or None, got {self.env_step_timeout_s}')
    if isinstance(self.checkpoint_rounds, bool) or \
        not isinstance(self.checkpoint_rounds, numbers.Integral) or self.checkpoint_rounds < 1:
      raise ValueError(f'checkpoint_rounds must be an int >= 1, got {self.checkpoint_rounds!r}')
    if self.num_eval_envs < 0:
      raise ValueError(f'num_eval_envs must be >= 0, got {self.num_eval_envs}')
    if self.reproducible:
      self.check_reproducible(builder, env_factory)

  def check_reproducible(self, builder: Any = None, env_factory: Any = None) -> None:
    """Refuses by name what the reproducible schedule cannot run yet: actor-side
    inference, several learner devices, an agent without a round schedule (the
    builder's `round_schedule`: an off-policy agent without `samples_per_insert`; a
    learner batch that does not divide the training envs), and a half-batch engine for the actors or the
    evaluator (Atari's 'vector_async' sends half of an actor's envs per request, and a
    round needs every env's request before it is served: the actor would wait forever;
    an evaluation pass, every evaluator env's), and an evaluator on a clock
    (`eval_interval_s`)."""
    why = 'cannot run with reproducible=True (--reproducible)'
    if self.num_eval_envs and self.eval_interval_s:
      raise ValueError(
          f'eval_interval_s={self.eval_interval_s} {why}: an evaluator idling on the '
          'clock would hold training up (a reproducible evaluator plays passes, each by '
          'one version of the weights, and training waits for it when it falls 16 '
          'rounds behind: seedacme/serving/evaluation.py); leave --eval_interval_s at 0')
    if self.inference != 'central':
      raise ValueError(
          f"inference={self.inference!r} {why}: every actor would act with its own copy "
          "of the weights, pulled when it pleases; use inference='central'")
    devices = (self.learner_devices or '').strip()
    count = int(devices) if devices.isdigit() else len([d for d in devices.split(',') if d])
    if count > 1:
      raise ValueError(f'learner_devices={self.learner_devices!r} {why}: a data-parallel '
                       'learner is not yet tested to be exact; use one learner device')
    if builder is not None:
      round_schedule = getattr(builder, 'round_schedule', None)
      if round_schedule is None:
        raise ValueError(f'agent {type(builder).__name__} {why}: not yet: issue 63 '
                         'Deliver 2')
      try:
        round_schedule(self.num_train_envs, lag=self.reproducible_lag)
      except ValueError as e:
        raise ValueError(f'{why}: {e}') from e
    if env_factory is not None:
      from seedacme.types import Mode, factory_for  # pylint: disable=g-import-not-at-top
      # The evaluator's requests too: each holds all its envs (`seedacme.serving.evaluation`).
      modes = (Mode.TRAIN, Mode.EVAL) if self.num_eval_envs else (Mode.TRAIN,)
      engines = {getattr(factory_for(env_factory, m), 'engine', None) for m in modes}
      if 'vector_async' in engines:
        raise ValueError(
            f"env engine 'vector_async' {why}: it sends half of an actor's envs per "
            'request, and a round is served only once every env has asked; use '
            "--env_engine vector_sync (or python)")
