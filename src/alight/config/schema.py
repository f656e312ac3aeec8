"""The experiment schema: one dataclass per config group, registered in Hydra's ConfigStore.

A YAML experiment (configs/*.yaml) fills these; every field has a default except the agent (its
entrypoint or its command), so a config names only what differs. Hydra checks keys and types against them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

from alight.models.resolve import TINY


def _choices(name: str, *values: str) -> Any:
    """A closed choice as a str Enum whose names are its values (how OmegaConf reads YAML into it): a
    value outside it fails at load, in one line naming the choices; members compare equal to strings."""
    return StrEnum(name, [(value, value) for value in values], module=__name__)


#: trainer.mode: sync (each step waits for its rollouts) | async (runners never wait for the update)
TRAINER_MODES = ("sync", "async")
#: trainer.on_stale: an async group over the staleness bound is dropped | requeued
ON_STALE = ("drop", "requeue")
#: algorithm.name
ALGORITHMS = ("grpo", "ppo", "sft", "apo")
#: adapter.mode and warm_start.mode: one sample per LLM call (transition) or per conversation (trajectory)
SAMPLE_MODES = ("transition", "trajectory")

if TYPE_CHECKING:  # to the type checker a closed choice is its value: a str
    TrainerMode: TypeAlias = str
    OnStale: TypeAlias = str
    Algorithm: TypeAlias = str
    SampleMode: TypeAlias = str
else:
    TrainerMode = _choices("TrainerMode", *TRAINER_MODES)
    OnStale = _choices("OnStale", *ON_STALE)
    Algorithm = _choices("Algorithm", *ALGORITHMS)
    SampleMode = _choices("SampleMode", *SAMPLE_MODES)


@dataclass
class SandboxConfig:
    # Where a command agent's attempt runs (alight.sandbox): none (a plain process in a fresh
    # working copy) | local (Linux namespaces: no network but the proxy, read-only system, limits) | docker
    kind: str = "none"
    workdir: str | None = None  # task field naming a directory copied as the attempt's working copy; None: empty
    time_s: float | None = None  # wall-clock limit of the agent's command; None: runner.timeout_s
    cpu_s: float | None = None  # CPU-seconds limit of the attempt's processes; None: no limit
    memory_mb: int | None = None  # address-space limit of each process, MiB; None: no limit
    expose: list[str] = field(default_factory=list)  # further host paths visible read-only inside
    image: str | None = None  # docker: the image the attempt runs in


@dataclass
class AgentConfig:
    # Exactly one of entrypoint and command.
    entrypoint: str | None = None  # "package.module:function" or "path/to/agent.py:function"
    # A program in any language, run once per attempt: ["node", "agent.js"] or a shell-like string;
    # relative paths are relative to the working directory (see alight.command_agent)
    command: Any = None
    name: str | None = None  # agent name on spans; default: the function or class name (command: the script's stem)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # command agents: where each attempt runs


@dataclass
class DataConfig:
    # Each of train/val: a .jsonl/.json/.parquet/.csv file, a saved Hugging Face dataset
    # directory, or a generator "module:function" / "file.py:function" returning rows.
    train: str | None = None
    val: str | None = None  # validation rows (as train); None: no validation
    train_size: int | None = None  # rows to ask a generator for (and an upper bound on file rows)
    val_size: int | None = None  # as train_size, for val
    generator_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments of generators
    input_field: str | None = None  # column handed to the agent as `task`; None: the whole row
    seed: int = 0  # seed handed to generators and used to shuffle
    # algorithm.name=sft: fine-tune from another run's store (a run directory, a store .db file or an
    # `alight store` URL, token from ALIGHT_TOKEN), read only; data.train is then not used
    from_store: str | None = None


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus sampling: keep the likeliest tokens holding this much probability; 1: all
    max_tokens: int = 256  # default limit on one response


@dataclass
class EngineConfig:
    kind: str = "embedded"  # embedded | vllm | litellm
    # "tiny", a packaged model's name (smollm2-135m-instruct), a Hugging Face model directory, a GGUF file
    # (or a directory holding one; converted once), a hub id, or a LiteLLM model string (litellm engine)
    model: str = TINY
    # auto: the model's own chat template, or alight's for its family when the model's drops tools;
    # model: always the model's own; chatml-tools: alight's ChatML tool template; or a Jinja file's path
    chat_template: str = "auto"
    served_name: str = "policy"  # the model name agents send; the proxy answers to it
    device: str = "cpu"  # embedded: cpu | cuda | cuda:N
    dtype: str = (
        "float32"  # embedded: float32 | bfloat16 | float16 | auto (bfloat16 on a GPU or a CPU that has it natively)
    )
    max_batch_size: int = 32  # embedded: requests generated together (they join and leave between tokens)
    base_url: str | None = None  # litellm: the OpenAI-compatible endpoint, if any
    api_key_env: str | None = None  # litellm: environment variable holding the API key
    tokenizer: str | None = None  # litellm: tokenizer directory for token ids the endpoint does not return
    options: dict[str, Any] = field(default_factory=dict)  # further engine-specific keyword arguments
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # how responses are sampled


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"  # beyond loopback needs ALIGHT_TOKEN set (the token is never a config field)
    port: int = 0  # 0: any free port
    advertise_url: str | None = None  # http://HOST:PORT agents elsewhere use; None: the bound (or routable) address


@dataclass
class StoreConfig:
    # sqlite (one durable file) | memory (lost at exit) | http (the `alight store` server at url);
    # None: http when url is set, else sqlite. The run serves a sqlite or memory store to its runners.
    kind: str | None = None
    path: str | None = None  # sqlite: the store file; None: store.db in the run directory
    url: str | None = None  # http: an `alight store` server (token: ALIGHT_TOKEN); None: start one for the run
    host: str = "127.0.0.1"  # address the run's store binds; beyond loopback needs ALIGHT_TOKEN set
    port: int = 0  # port of the store this run starts (0: any free port)
    advertise_url: str | None = None  # http://HOST:PORT runners elsewhere use; None: the bound (or routable) address


@dataclass
class RayConfig:
    # None: start a local Ray cluster (or join the one RAY_ADDRESS names); "auto" or "ray://HOST:10001": join one
    address: str | None = None
    num_cpus: float = 0.5  # Ray CPUs each runner actor reserves (agents mostly wait on the LLM)
    # Custom Ray resources each runner needs (nodes declare them: `ray start --resources`), e.g. {runner_slot: 1}
    resources: dict[str, float] = field(default_factory=dict)
    # Node labels a runner's node must carry (nodes declare them: `ray start --labels`), e.g. {role: cpu}
    label_selector: dict[str, str] = field(default_factory=dict)
    spread: bool = False  # place runners on as many nodes as possible (Ray's SPREAD strategy)
    local_cpus: int | None = None  # CPUs of a local cluster alight starts itself; None: every core


@dataclass
class RunnerConfig:
    backend: str = "local"  # local: worker processes on this machine | ray: Ray actors on a Ray cluster
    n_runners: int = 4  # runners (processes or Ray actors) of the agent; 0: none here (alight runner elsewhere)
    timeout_s: float = 120.0  # wall-clock limit of one attempt
    max_attempts: int = 2  # tries per rollout (a failed or timed-out attempt is retried)
    heartbeat_timeout_s: float = 60.0  # silence after which an attempt counts as timed out
    tracer: str = "light"  # light | otel
    drain_timeout_s: float = 30.0  # on stop or Ctrl-C, seconds runners get to finish their attempts
    agent_spans: bool = False  # with ALIGHT_TOKEN: agents may post their own attempt's spans (rewards) with their key
    ray: RayConfig = field(default_factory=RayConfig)  # runner.backend=ray: where and how runner actors run


@dataclass
class DevConfig:
    n: int = 4  # tasks `alight dev` runs
    split: str = "val"  # which data split dev samples from (falls back to train)
    timeout_s: float = 600.0  # how long `alight dev` waits for all rollouts


@dataclass
class AdapterConfig:
    agent_match: str | None = None  # regex the agent name of an LLM call must fully match to be trained; None: all
    mode: SampleMode = "transition"  # transition: one sample per LLM call | trajectory: an agent's calls merged, masked
    credit: str = "identity"  # identity | discounted | last | "module:function" (see alight.algorithms.credit)
    gamma: float = 0.95  # discounted credit: step t of T gets gamma^(T-1-t) of the episode reward
    max_prompt_length: int | None = None  # longer prompts keep their last tokens; None: no limit
    max_response_length: int | None = None  # longer responses keep their first tokens; None: no limit
    air: list[dict[str, Any]] = field(default_factory=list)  # automatic intermediate reward rules (algorithms.air)


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters (peft) instead of every weight; for larger models
    r: int = 8  # adapter rank
    alpha: int = 16  # scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # dropout on the adapters' input
    # the layers (module names) that get an adapter
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    # One adapter per agent on the shared base (implies LoRA; embedded backend and engine only): each
    # agent's calls are answered by its adapter and its transitions update only it.
    per_agent: bool = False
    agents: list[str] = field(default_factory=list)  # per_agent: the agents that get an adapter; others get the base


@dataclass
class ApoConfig:
    # algorithm.name=apo: automatic prompt optimisation (alight.algorithms.apo); no weight update.
    prompt: str = ""  # the initial prompt: an f-string template agents read as resources[resource]
    resource: str = "prompt"  # name of the PromptTemplate resource agents read
    rounds: int = 3  # optimisation rounds after scoring the initial prompt
    beam_width: int = 2  # best prompts kept after each round (ties keep the older prompt)
    candidates: int = 2  # new prompts the optimiser writes per beam member per round
    train_batch_size: int = 8  # train tasks each beam member runs per round; their worst traces feed the critique
    val_size: int = 16  # validation tasks every candidate is scored on (greedy, trainer.val_temperature)
    n_traces: int = 3  # lowest-reward traces the optimiser reads per critique
    trace_chars: int = 1500  # longest text of one trace in the critique request (longer ones are cut)
    max_prompt_chars: int = 2000  # longer candidates are refused (recorded as failed)
    # The optimiser LLM: any engine kind (litellm reaches any provider or OpenAI-compatible endpoint);
    # with kind embedded, model "policy" loads the policy's own model (after the warm start)
    optimizer: EngineConfig = field(default_factory=EngineConfig)


@dataclass
class SftConfig:
    # Fine-tuning from a stored run (data.from_store), and `alight trace --export-sft`; the reward
    # bar is algorithm.sft_min_reward (also what on-policy sft trains on)
    # threshold: every transition rewarded at least sft_min_reward | best_of_group: each group's best
    # rollout if rewarded at least that (rejection-sampling fine-tuning)
    select: str = "threshold"
    splits: list[str] = field(default_factory=lambda: ["train"])  # source rollouts to learn from: train | val | dev
    dedupe: bool = True  # the same prompt and response token ids are kept once
    batch_size: int = 16  # transitions per optimizer step (lr, warm-up: algorithm.lr, warmup_steps)


@dataclass
class AlgorithmConfig:
    # grpo | ppo (several clipped epochs over mini-batches) | sft (on the agent's best rollouts) | apo
    name: Algorithm = "grpo"
    # The loss an update minimises: auto (nll for sft, else policy) | policy (clipped policy gradient)
    # | nll (negative log-likelihood of the responses rewarded at least sft_min_reward)
    loss: str = "auto"
    advantage: str = "grpo"  # grpo | rloo | reinforce_pp (see alight.algorithms.advantages)
    norm_std: bool = True  # grpo: divide by the group's reward std; reinforce_pp: by the batch's
    eps: float = 1e-6  # added to the std before dividing
    lr: float = 1e-5  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    warmup_steps: int = 0  # linear learning-rate warm-up over this many optimizer steps
    clip_ratio_low: float = 0.2  # the ratio is clipped to [1 - low, 1 + high]
    clip_ratio_high: float = 0.2  # raise it (e.g. 0.28, as DAPO) to let rare good tokens grow faster
    # Off-policy rows (trainer.mode=async): the ratio is taken to the proximal policy (the weights
    # before this update) and each token weighted by proximal / behaviour probability, truncated at
    # this cap (decoupled PPO with truncated importance sampling); 0: no cap
    is_cap: float = 2.0
    kl_coef: float = 0.0  # weight of the KL penalty to the frozen reference policy; 0: no reference kept
    kl_estimator: str = "low_var_kl"  # kl (k1) | abs | mse (k2) | low_var_kl (k3)
    entropy_coef: float = 0.0  # weight of an entropy bonus
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum
    max_grad_norm: float = 1.0  # gradient clipping (0: none)
    mini_batch_size: int | None = None  # transitions per optimizer step; None: the whole batch (one step)
    # Transitions per forward/backward (gradient accumulation; memory only): a number, or "auto" (the
    # most that fit the free memory, from the model's size and each batch's longest row)
    micro_batch_size: Any = 16
    log_prob_chunk: int = 512  # response tokens whose full-vocabulary logits exist at once (memory); 0: no chunks
    gradient_checkpointing: bool = False  # recompute each layer's activations in backward: less memory, ~30% slower
    memory_fraction: float = 0.8  # micro_batch_size auto: share of the free memory an update may use
    # The embedded backend's arithmetic: fp32 | bf16 (autocast matrix products; float32 weights,
    # optimizer, norms and output layer) | auto (bf16 where the CPU or GPU has it natively, else fp32)
    precision: str = "fp32"
    share_prompts: bool = True  # a prompt several rows share (a GRPO group's) runs once per forward
    epochs: int = 1  # passes over each batch; ppo defaults to several (see `ppo_epochs`)
    ppo_epochs: int = 4  # ppo: passes over each batch
    temperature: float | None = None  # log-prob temperature; None: the engine's sampling temperature
    sft_min_reward: float = 1.0  # sft: train on transitions whose reward is at least this (also data.from_store's bar)
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters instead of every weight
    apo: ApoConfig = field(default_factory=ApoConfig)  # algorithm.name=apo: prompt optimisation
    sft: SftConfig = field(default_factory=SftConfig)  # sft with data.from_store: what to select, how to batch


@dataclass
class WarmStartConfig:
    # Supervised warm start before RL: rows of {"messages": [...], "tools": [...]} (a file or a
    # generator, as data.train), each assistant message a training target. None: no warm start.
    data: str | None = None
    size: int | None = None  # rows to ask a generator for
    generator_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments of the generator
    steps: int = 0  # optimizer steps (0: no warm start)
    batch_size: int = 32  # sequences per step
    lr: float = 1e-3  # AdamW learning rate of the warm start
    warmup_steps: int = 50  # linear learning-rate warm-up over this many steps
    max_length: int | None = None  # longer demonstrations are dropped; None: the model's context
    mode: SampleMode = (
        "trajectory"  # trajectory: a conversation is one masked sequence | transition: one per assistant turn
    )


@dataclass
class TrainerConfig:
    steps: int | None = None  # RL steps; None: `epochs` passes over the train data
    epochs: int = 1  # used when steps is None
    batch_size: int = 8  # tasks per step
    group_size: int = 8  # rollouts per task (the GRPO group, n)
    val_every: int = 5  # validate every this many steps (and at step 0 and the last step); 0: only those
    val_size: int | None = None  # validation tasks (None: all the val rows)
    val_temperature: float = 0.0  # validation sampling (0: greedy)
    save_every: int = 5  # checkpoint every this many steps (and the last); 0: only the last
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    step_timeout_s: float = 900.0  # longest wait for a step's rollouts
    min_batch_fraction: float = 0.5  # at the timeout, train on the ended rollouts if at least this fraction ended
    output_dir: str = "runs"  # parent folder of run directories
    seed: int = 0  # fixes data order, model initialisation and sampling
    device: str = "cpu"  # where the embedded backend trains: cpu | cuda | cuda:N
    backend: str = "embedded"  # embedded (PyTorch in this process) | verl (verl's FSDP workers on Ray, GPUs)
    n_gpus_per_node: int = 1  # verl: GPUs per node the workers use
    nnodes: int = 1  # verl: nodes of the Ray cluster the workers use
    # PyTorch threads of the trainer process (warm start, updates, the embedded engine): auto (half
    # the usable cores on CPU, 1 with a GPU, and every core for a sync run's updates and warm start
    # unless OMP_NUM_THREADS is set; idle threads sleep) | torch (PyTorch's defaults) | a number
    torch_threads: str = "auto"
    torch_interop_threads: str = "auto"  # PyTorch inter-op threads: auto (1; alight forks no torch work) | torch | N
    # sync: each step enqueues its rollouts, waits for them, then updates (runners idle meanwhile) |
    # async: runners are fed continuously and the update runs while the next rollouts do
    mode: TrainerMode = "sync"
    # async: the most weight versions a trained group's oldest LLM call may lag the weights being
    # updated; no more work is enqueued than this allows (0: the synchronous algorithm)
    max_staleness: int = 1
    on_stale: OnStale = "drop"  # async: a group over the bound is dropped | requeue (its tasks run again)
    # log actor/logprob_gap_{mean,max} (engine vs trainer log-probs); free on the embedded backend, one
    # more actor forward a step on verl (as verl's own loop recomputes old log-probs)
    log_prob_gap: bool = True


@dataclass
class TestsRewardConfig:
    # reward.kind=tests: after the agent, run `command` in the attempt's working copy (its sandbox)
    command: Any = None  # a list of arguments or a shell-like string, e.g. "python -m pytest -q --junitxml=report.xml"
    files: str | None = None  # task field naming a directory of hidden tests copied in after the agent ends
    junit_xml: str | None = None  # JUnit XML report the command writes (in the working copy); None: pytest's summary
    timeout_s: float = 120.0  # wall-clock limit of the test command


@dataclass
class JudgeConfig:
    # reward.kind=judge: an LLM scores the attempt with a rubric; its calls are recorded, never trained on
    model: str = "policy"  # a LiteLLM model string, or "policy": the policy's own engine
    base_url: str | None = None  # an OpenAI-compatible endpoint of the judge model, if any
    api_key_env: str | None = None  # environment variable holding the judge's API key
    rubric: str = ""  # the judge's instructions: a template with {task} and {answer}
    max_score: float = 10.0  # the judge answers a score in [0, max_score]; the reward is score / max_score
    temperature: float = 0.0  # the judge's sampling temperature (0: greedy)
    max_tokens: int = 256  # longest judge answer, in tokens
    cache: bool = True  # identical judge inputs are scored once
    task_field: str | None = None  # task field shown to the judge as {task}; None: the task (JSON unless a string)


@dataclass
class RewardConfig:
    kind: str = "agent"  # agent (what the agent returns or emits) | tests (alight.rewards.tests) | judge (an LLM judge)
    tests: TestsRewardConfig = field(default_factory=TestsRewardConfig)  # kind tests: the test command, hidden tests
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # kind judge: the judge model and its rubric


@dataclass
class LoggingConfig:
    dashboard: bool = True  # the live terminal view (off with --no-dashboard)
    metrics_file: str = "metrics.jsonl"  # one JSON object per step in the run directory
    plot: bool = True  # write reward_curve.png in the run directory at the end
    tensorboard: bool = False  # also log to TensorBoard (needs `tensorboard`)
    wandb: bool = False  # also log to Weights & Biases (needs `wandb`)
    wandb_project: str = "alight"  # the Weights & Biases project runs log to


@dataclass
class ExperimentConfig:
    name: str = "experiment"  # names the run directory
    agent: AgentConfig = field(default_factory=AgentConfig)  # the agent to train: its entrypoint or command
    reward: RewardConfig = field(default_factory=RewardConfig)  # where the reward comes from (default: the agent)
    data: DataConfig = field(default_factory=DataConfig)  # the train and validation tasks
    engine: EngineConfig = field(default_factory=EngineConfig)  # the inference engine serving the policy
    proxy: ProxyConfig = field(default_factory=ProxyConfig)  # the OpenAI-compatible endpoint agents call
    store: StoreConfig = field(default_factory=StoreConfig)  # where rollouts, spans and rewards are kept
    runner: RunnerConfig = field(default_factory=RunnerConfig)  # the processes or Ray actors that run the agent
    dev: DevConfig = field(default_factory=DevConfig)  # `alight dev`, the dry run
    adapter: AdapterConfig = field(default_factory=AdapterConfig)  # spans to transitions: agents trained, credit
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # the update: algorithm, loss, optimizer
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)  # supervised fine-tuning before RL
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # the loop: steps, batches, validation, devices
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # the dashboard, metrics and plots
    # trainer.backend=verl: keys of verl's own trainer config (ppo_trainer.yaml) set on top of what
    # alight derives from the sections above, e.g. {actor_rollout_ref: {actor: {fsdp_config: ...}}}
    verl: dict[str, Any] = field(default_factory=dict)


#: Name of the schema node in Hydra's ConfigStore.
SCHEMA_NAME = "alight_experiment_schema"


def register() -> None:
    """Register the schema with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=ExperimentConfig)
