"""Typed schema of the composed Hydra config.

Why: Snakemake plans the DAG from this config, so a typo or an impossible value
must fail *before* any job starts, with a message that names the key. Models
forbid unknown keys, and cross-field checks (a variant's format must exist and
suit its engine) live here, next to the types. What only an engine knows (is
its plugin registered, does a prompt fit its context, do its settings suit the
hardware) is asked of the engines by bakeoff.composition.compose, which sits above
both: the schema never imports an engine.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from bakeoff.config.slo import SLO_PRESETS
from bakeoff.models.synthetic import Shape

SLUG = r"^[a-z0-9][a-z0-9_.-]*$"
ENGINE_NAME = r"^[a-z0-9]+$"  # no '-' or '_': paths read "<engine>-<format>"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmbeddedSource(_Strict):
    package: str
    version: str
    file: str
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ModelCfg(_Strict):
    name: str = Field(pattern=SLUG)
    source: Literal["embedded", "hub", "synthetic"]
    embedded: EmbeddedSource | None = None
    synthetic: Shape | None = None  # bakeoff.models.synthetic's dataclass, validated by pydantic
    upstream: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    # Hub files and the sha256 each must have at ``revision``: a download that yields other bytes fails.
    files_sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = {}
    max_context: PositiveInt

    @model_validator(mode="after")
    def _source_fields(self) -> ModelCfg:
        if self.source == "hub" and not (self.repo_id and self.revision):
            raise ValueError("model.source=hub needs model.repo_id and model.revision")
        if self.source == "hub" and not re.fullmatch(r"[0-9a-f]{40}", self.revision or ""):
            raise ValueError(f"model.revision={self.revision!r} is not a commit sha (40 hex digits): a branch or tag "
                             f"can move, so the download would not be pinned. Use the commit it points at.")
        if self.source == "embedded" and self.embedded is None:
            raise ValueError("model.source=embedded needs model.embedded (package, version, file)")
        if self.source == "synthetic" and self.synthetic is None:
            raise ValueError("model.source=synthetic needs model.synthetic (the shape: n_layer, n_embd, ...)")
        return self


class HardwareCfg(_Strict):
    name: str = Field(pattern=SLUG)
    backend: Literal["cpu", "cuda"]
    gpus: NonNegativeInt
    gpu_model: str | None = None
    gpu_memory_gib: PositiveFloat | None = None
    cuda_arch: PositiveInt | None = None
    interconnect: Literal["nvlink", "pcie"] | None = None
    mem_bandwidth_gbs: PositiveFloat | None = None
    peak_tflops_fp16: PositiveFloat | None = None
    vllm_image: str | None = None
    # The interpreter vLLM serves from on this box (engines.<name>.python, when that is unset): `make setup-gpu`'s
    # .venv-gpu/bin/python, with vLLM's CUDA build. None: bakeoff's own, whose vLLM is the CPU build.
    vllm_python: str | None = None
    # Several GPUs in one node. Which devices a server may use (CUDA_VISIBLE_DEVICES); None: the
    # scheduler's allocation if it set one, else 0..gpus-1.
    visible_devices: list[NonNegativeInt] | None = None
    # llama.cpp: how one model spans the GPUs (-sm layer | row) and in what proportions (--tensor-split).
    llamacpp_split_mode: Literal["none", "layer", "row"] = "layer"
    llamacpp_tensor_split: list[PositiveFloat] | None = None
    # vLLM: tensor-parallel size (None: all gpus).
    vllm_tensor_parallel_size: PositiveInt | None = None
    # SLURM generic resource string for GPU jobs, e.g. gpu:v100:2 (None: gpu:<gpus>).
    gres: str | None = Field(default=None, pattern=r"^gpu(:[A-Za-z0-9_.-]+)?:[1-9][0-9]*$")
    # The conda environment (a file in envs/) of the llama.cpp build and its jobs; its CUDA toolkit must fit
    # the node's driver (the doctor checks). None: llamacpp-cuda.yaml on cuda, llamacpp.yaml on cpu.
    llamacpp_env: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+\.ya?ml$")

    @model_validator(mode="after")
    def _cuda_fields(self) -> HardwareCfg:
        if self.backend == "cuda" and (self.gpus < 1 or self.cuda_arch is None):
            raise ValueError("hardware.backend=cuda needs hardware.gpus >= 1 and hardware.cuda_arch (e.g. 70, 90)")
        if self.backend == "cpu":
            extra = [k for k in ("visible_devices", "llamacpp_tensor_split", "vllm_tensor_parallel_size", "gres")
                     if getattr(self, k) is not None]
            if self.gpus or extra:
                raise ValueError(f"hardware.backend=cpu cannot have hardware.gpus > 0 or GPU settings {extra}")
            return self
        if self.visible_devices is not None and (len(self.visible_devices) != self.gpus
                                                 or len(set(self.visible_devices)) != self.gpus):
            raise ValueError(f"hardware.visible_devices {self.visible_devices} must name {self.gpus} distinct devices "
                             f"(hardware.gpus={self.gpus})")
        if self.llamacpp_tensor_split is not None and len(self.llamacpp_tensor_split) != self.gpus:
            raise ValueError(f"hardware.llamacpp_tensor_split {self.llamacpp_tensor_split} needs one share per GPU "
                             f"({self.gpus})")
        if self.vllm_tensor_parallel_size is not None and self.vllm_tensor_parallel_size > self.gpus:
            raise ValueError(f"hardware.vllm_tensor_parallel_size {self.vllm_tensor_parallel_size} exceeds "
                             f"hardware.gpus {self.gpus}")
        if self.gres is not None and int(self.gres.rsplit(":", 1)[1]) != self.gpus:
            raise ValueError(f"hardware.gres {self.gres!r} asks for a different GPU count than hardware.gpus={self.gpus}")
        return self

    @property
    def tensor_parallel_size(self) -> int:
        return self.vllm_tensor_parallel_size or max(1, self.gpus)

    @property
    def toolchain_env(self) -> str:
        """The llama.cpp environment's file name in envs/."""
        return self.llamacpp_env or ("llamacpp-cuda.yaml" if self.backend == "cuda" else "llamacpp.yaml")

    @property
    def slurm_gres(self) -> str | None:
        if self.backend != "cuda":
            return None
        return self.gres or f"gpu:{self.gpus}"


class ToolchainCfg(_Strict):
    package: str
    version: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    targets: list[str] = Field(min_length=1)


class EngineCfg(_Strict):
    plugin: str  # a registered engine (bakeoff.engines.register); checked by bakeoff.composition.compose
    serves: Literal["hf", "gguf"]
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    api_key: str | None = None
    startup_timeout_s: PositiveFloat = 600
    # A Python engine's server process (vLLM): the interpreter it runs under (None: bakeoff's own) and its
    # PYTHONPATH (os.pathsep-separated; None: inherited), e.g. python3 and the folder node.sh installed vLLM into.
    python: str | None = None
    pythonpath: str | None = None
    # Where it runs on a CUDA node: auto (natively when its interpreter has a CUDA torch, else in
    # hardware.vllm_image if one is named), native, or container (hardware.vllm_image).
    runtime: Literal["auto", "native", "container"] = "auto"
    settings: dict[str, Any] = {}
    extra_args: list[str] = []
    toolchain: ToolchainCfg | None = None
    # Where quality is scored when this engine cannot score prompts itself (llama-server):
    # another server for the same artifact (llama-cpp-python for GGUF). None: this server.
    eval_server: EngineCfg | None = None
    # Load settings for this engine's variants only (keys of LoadCfg), e.g. one A/B cell pair at c=32
    # without re-running the whole matrix; applied by LoadCfg.for_variant.
    load: dict[str, Any] = {}

    @model_validator(mode="after")
    def _bind_safely(self) -> EngineCfg:
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback and not self.api_key:
            raise ValueError(f"host {self.host!r} is not loopback: set an api_key to bind it")
        return self


# What can be made from a synthetic model's HF side, which has no weights (its shape's config.json and tokenizer):
# what vLLM makes of it at load (fp8_online). Checkpoint methods (fp8, fp8_dequant, gguf_convert) read weights.
SYNTHETIC_HF_METHODS = ("fp8_online",)


class QuantCfg(_Strict):
    kind: Literal["hf", "gguf"]
    method: Literal["fp16", "fp8", "fp8_online", "fp8_dequant", "gguf_convert", "gguf_quantize"]
    input: str
    scheme: str | dict[str, Any] | None = None
    ignore: list[str] = []
    gguf_type: str | None = None


class SloCfg(_Strict):
    """Goodput SLOs in milliseconds (any subset), as ``vllm bench serve --goodput``."""

    ttft: PositiveFloat | None = None
    tpot: PositiveFloat | None = None
    e2el: PositiveFloat | None = None

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class CapacityCfg(_Strict):
    """The capacity search (bakeoff.loadgen.capacity states its rules): used when ``load.mode`` is capacity."""

    slo: list[str] = ["server"]  # presets of bakeoff.config.slo.SLO_PRESETS: server, interactive, cpu
    prompt_len: list[PositiveInt] | None = None  # searched at these prompt lengths (null: every load.prompt_len)
    min_requests: PositiveInt = 50  # a probe sends max(min_requests, waves x concurrency) measured requests
    waves: PositiveInt = 4
    # Per search; null: the most the concurrency search needs for any capacity up to max_concurrency
    # (bakeoff.loadgen.capacity.probes_needed), and 8 for the rate search.
    max_probes: PositiveInt | None = None
    start_concurrency: PositiveInt = 1
    # The search's own ceiling; the server's limit (vLLM's max_num_seqs and KV cache, llama.cpp's slots) also
    # stops it. A search stopped by either reports a lower bound, naming the limit (capacity_limit).
    max_concurrency: PositiveInt = 1024
    # The concurrency search stops once its lowest fail is within this share of its highest pass, never closer
    # than one user: fail - pass <= max(1, floor(resolution x pass)); it reports that bracket, e.g. 192–200.
    resolution: PositiveFloat = 0.05
    # How a concurrency probe's users start (bakeoff.loadgen.cellload): ramp, slot j of c at j x ramp_s / c, its
    # verdict taken over the steady span after the ramp (a served population); burst, every slot at once.
    start: Literal["burst", "ramp"] = "ramp"
    rate: bool = True  # also search the open-loop (Poisson) request rate
    rate_resolution: PositiveFloat = 0.1  # the rate search stops when fail / pass <= 1 + this
    # How a probe passes (bakeoff.loadgen.capacity): point, its p99s within the bounds; confident, also the 95 %
    # upper bound on the share over each bound at most 1 % (at least 299 requests a probe). null: by the
    # hardware (default_verdict), filled in when the whole config is validated.
    verdict: Literal["point", "confident"] | None = None

    @model_validator(mode="after")
    def _known_slos(self) -> CapacityCfg:
        if unknown := [s for s in self.slo if s not in SLO_PRESETS]:
            raise ValueError(f"load.capacity.slo: unknown preset(s) {unknown}; known: {sorted(SLO_PRESETS)}")
        return self


def default_verdict(backend: str) -> Literal["point", "confident"]:
    """The capacity verdict rule where ``load.capacity.verdict`` is unset: ``confident`` on GPUs, where a
    capacity is a published claim and 299-request probes take seconds; ``point`` on CPU, where the smoke
    matrix's probes must fit minutes (its capacities say which rule made them)."""
    return "confident" if backend == "cuda" else "point"


class ClientCfg(_Strict):
    """The load client (bakeoff.loadgen.workers): how many worker processes send a cell's requests."""

    # auto: from the cell's expected token rate and the measured cost a token (bakeoff.loadgen.sizing),
    # bounded by the cores and by the concurrency; a number: that many (at most the concurrency).
    workers: Literal["auto"] | PositiveInt = "auto"


class TraceGenCfg(_Strict):
    """The trace generator (bakeoff.loadgen.trace): requests drawn from a trace's published statistics, their
    token lengths scaled by ``trace.block_tokens`` over the statistics' block size (32 keeps a 512-token trace's
    shape at 1/16 of its lengths)."""

    stats: str = "data/traces/mooncake_conversation.yaml"  # the fitted statistics and their source
    requests: PositiveInt = 64
    seed: NonNegativeInt = 0
    max_input_len: PositiveInt | None = None  # longer drawn prompts are cut to this (recorded)
    max_output_len: PositiveInt | None = None


class TraceCfg(_Strict):
    """Replay of a trace in the Mooncake format (bakeoff.loadgen.trace states the rules)."""

    path: str | None = None  # a Mooncake-format JSONL file; null: drawn by the generator
    block_tokens: PositiveInt = 512  # tokens per hash_id block (Mooncake's are 512)
    time_scale: PositiveFloat = 1.0  # every arrival time x this (0.5: twice the trace's rate)
    requests: PositiveInt | None = None  # the trace's first N requests (null: all)
    generator: TraceGenCfg = TraceGenCfg()


class MultiturnCfg(_Strict):
    """Chat sessions (bakeoff.loadgen.sessions): each turn's prompt is the previous turns plus new text."""

    turns: Annotated[int, Field(ge=2)] = 4
    think_time_s: float = Field(default=1.0, ge=0.0)  # mean pause between a turn's answer and the next turn
    think_distribution: Literal["exponential", "constant"] = "exponential"


class SharedPrefixCfg(_Strict):
    """G groups of P prompts, each group's prompts opening with one system prompt (sglang's generated-shared-prefix)."""

    groups: PositiveInt = 4
    prompts_per_group: PositiveInt = 8
    system_prompt_len: PositiveInt = 256


WORKLOAD_KINDS = ("fixed", "trace", "multiturn", "shared_prefix")


class WorkloadCfg(_Strict):
    """What a cell's requests are (bakeoff.loadgen.workload): ``fixed`` is every cell before workloads existed."""

    kind: Literal["fixed", "trace", "multiturn", "shared_prefix"] = "fixed"
    trace: TraceCfg | None = None
    multiturn: MultiturnCfg | None = None
    shared_prefix: SharedPrefixCfg | None = None

    @model_validator(mode="before")
    @classmethod
    def _own_block(cls, data: Any) -> Any:
        """The kind's own settings block, defaulted when absent; another kind's block is refused."""
        if not isinstance(data, dict):
            return data
        kind = data.get("kind", "fixed")
        stray = [k for k in WORKLOAD_KINDS[1:] if k != kind and data.get(k) is not None]
        if stray:
            raise ValueError(f"load.workload.kind={kind!r} but settings for {stray} are given: set the kind, or drop them")
        if kind != "fixed" and data.get(kind) is None:
            data = {**data, kind: {}}
        return data

    @property
    def settings(self) -> BaseModel | None:
        """The kind's own settings (None for ``fixed``)."""
        return None if self.kind == "fixed" else getattr(self, self.kind)


class LoadCfg(_Strict):
    concurrency: list[PositiveInt] = Field(min_length=1)
    prompt_len: list[PositiveInt] = Field(min_length=1)
    output_len: PositiveInt
    num_requests: PositiveInt
    requests_per_concurrency: NonNegativeInt = 0  # per cell: max(num_requests, this * concurrency)
    warmup_requests: NonNegativeInt = 0
    # Warm-up per slot: a cell sends max(warmup_requests, warmup_per_slot * concurrency) uncounted requests at
    # its own concurrency, so every slot the measured requests use has served one (0: warmup_requests alone).
    warmup_per_slot: NonNegativeInt = 1
    repeats: PositiveInt = 1
    # Blocks: each repeat is a block in which every variant of the experiment runs once, on its own server,
    # in an order shuffled by this seed (recorded in each row as `block` and `order`).
    block_seed: NonNegativeInt = 0
    request_rate: PositiveFloat | None = None
    # How a fixed closed-loop cell's users start (bakeoff.loadgen.cellload): burst, every slot at t0, as `vllm bench
    # serve` does (comparable with it); ramp, slot j of c at j x ramp_s / c, latency over the steady span after it.
    start: Literal["burst", "ramp"] = "burst"
    ramp_s: PositiveFloat | None = None  # the ramp's length (cells and probes); null: the warm-up's median E2E latency
    temperature: float = Field(default=0.0, ge=0.0)
    slo_ms: SloCfg = SloCfg()
    # Fewer requests a cell for slow formats when time is short (e.g. f16 on a timed GPU lease).
    # Recorded in every affected row's `load_note`, never silent.
    num_requests_by_format: dict[str, PositiveInt] = {}
    # Requests a cell at one concurrency, over num_requests (e.g. {1: 30} when c=1 cells are slow and time
    # is short). Recorded in each affected row's `load_note`.
    num_requests_by_concurrency: dict[PositiveInt, PositiveInt] = {}
    # fixed: the cells above; capacity: the cells, then a search for the highest load within each SLO.
    mode: Literal["fixed", "capacity"] = "fixed"
    capacity: CapacityCfg = CapacityCfg()
    client: ClientCfg = ClientCfg()
    # What each cell sends (conf/workload/): fixed prompts of prompt_len, a trace, sessions, or shared prefixes.
    workload: WorkloadCfg = WorkloadCfg()

    @model_validator(mode="after")
    def _workload_fits(self) -> LoadCfg:
        ramps = self.start == "ramp" or (self.mode == "capacity" and self.capacity.start == "ramp")
        if ramps and self.ramp_s is None and self.warmup_requests == 0 and self.warmup_per_slot == 0:
            raise ValueError("a ramp of automatic length (load.ramp_s: null) is the warm-up's median latency: set "
                             "load.warmup_requests or load.warmup_per_slot above 0, or load.ramp_s")
        kind = self.workload.kind
        if kind == "trace" and len(self.prompt_len) > 1:
            raise ValueError(f"load.workload.kind=trace: the trace sets each request's lengths, so load.prompt_len "
                             f"names one length (its warm-up prompts'), not {self.prompt_len}")
        if kind == "trace" and len(self.concurrency) > 1:
            raise ValueError(f"load.workload.kind=trace: a trace cell replays the trace's own arrivals (open loop), "
                             f"so load.concurrency names one cell, not {self.concurrency} (the capacity search "
                             f"probes concurrencies and rates of it)")
        if kind == "multiturn" and self.request_rate is not None:
            raise ValueError("load.workload.kind=multiturn runs closed-loop sessions: load.request_rate must be null")
        return self

    def for_variant(self, engine_load: dict[str, Any], fmt: str) -> tuple[LoadCfg, str]:
        """This load as one variant runs it, and a note when it runs fewer requests than configured."""
        load = LoadCfg.model_validate({**self.model_dump(), **engine_load}) if engine_load else self
        n = load.num_requests_by_format.get(fmt)
        if n is None or n == load.num_requests:
            return load, ""
        note = (f"{fmt}: {n} requests a cell (at least {load.requests_per_concurrency} x concurrency) instead of "
                f"{load.num_requests}, load.num_requests_by_format")
        return load.model_copy(update={"num_requests": n}), note


class SamplesCfg(_Strict):
    """A fixed prompt set generated at temperature 0 by every variant (results/samples/)."""

    prompts: list[str] = []
    max_tokens: PositiveInt = 128


class EvalCfg(_Strict):
    """Quality: lm-eval tasks, their doc limits, top-k KL against fp16, and samples."""

    tasks: list[str] = []
    # Docs per task: one number for all tasks, or per task name (unlisted tasks: all docs).
    limit: PositiveInt | dict[str, PositiveInt] | None = None
    # Dataset revision (commit) per lm-eval task, so hub datasets are pinned.
    revisions: dict[str, str] = {}
    num_concurrent: PositiveInt = 4
    # Tokens of reference text scored with top-k logprobs for the KL column (0: no KL).
    kl_tokens: NonNegativeInt = 2048
    top_k: PositiveInt = 20
    samples: SamplesCfg = SamplesCfg()

    def limit_for(self, task: str) -> int | None:
        if isinstance(self.limit, dict):
            return self.limit.get(task)
        return self.limit


class TrackingCfg(_Strict):
    """MLflow: where runs go. sqlite is MLflow 3's default (the ./mlruns file store errors from 3.13).

    A relative ``sqlite:///file.db`` is resolved against the project root, so
    every job and ``mlflow ui`` started there see the same store.
    """

    enabled: bool = True
    uri: str = "sqlite:///mlflow.db"
    experiment: str = "bakeoff"


class DoctorCfg(_Strict):
    """The hardware doctor (first rule of every experiment)."""

    # Uncorrectable ECC errors stop the experiment unless this is set.
    allow_uncorrected_ecc: bool = False
    # Measure CPU memory bandwidth (a numpy copy) for the CPU roofline; MiB per array.
    bandwidth_probe_mib: NonNegativeInt = 256


class AnswerCfg(_Strict):
    """How the answer reads a paired comparison (bakeoff.results.spread states the rules).

    Why a margin: a test that finds no difference has not shown that there is none. Two variants are called
    equivalent only when the 90 % interval of their difference lies inside +- this many percent (two one-sided
    tests at 5 %); otherwise, where the 95 % interval holds 0, the answer gives no verdict and says how many
    blocks would settle it. Changes what the results say, not what is measured: left out of the config hash.
    """

    equivalence_margin_pct: PositiveFloat = 3.0


class SiteCfg(_Strict):
    """What differs by site, not by experiment (conf/site/local.yaml, ignored by git; conf/site/example.yaml).

    None of it changes what is measured, so it is left out of the config hash (bakeoff.composition.compose).
    """

    slurm_partition: str | None = None  # every cluster job's partition (None: the Slurm profile's)
    slurm_account: str | None = None  # every cluster job's account (None: the Slurm profile's)
    cache_dir: str | None = None  # the build and sha256 cache (None: $BAKEOFF_CACHE_DIR, else ~/.cache/bakeoff)


class ExperimentCfg(_Strict):
    name: str = Field(pattern=SLUG)
    description: str = ""
    variants: dict[str, list[str]] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _engines_that_serve(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        """An engine given no formats serves nothing here (a record split by engine empties its parent's other
        engine, h100_quality_vllm): dropped, so no step asks it for a server, a build or a run check."""
        kept = {engine: fmts for engine, fmts in v.items() if fmts}
        if not kept:
            raise ValueError("experiment.variants names no format for any engine")
        return kept


class Config(_Strict):
    model: ModelCfg
    hardware: HardwareCfg
    load: LoadCfg
    eval: EvalCfg
    engines: dict[str, EngineCfg]
    formats: dict[str, QuantCfg]
    experiment: ExperimentCfg
    tracking: TrackingCfg = TrackingCfg()
    doctor: DoctorCfg = DoctorCfg()
    answer: AnswerCfg = AnswerCfg()
    site: SiteCfg = SiteCfg()

    @model_validator(mode="after")
    def _capacity_verdict(self) -> Config:
        """Fill ``load.capacity.verdict`` from the hardware where unset (default_verdict), so every job's spec,
        the config hash and the capacity rows carry the rule in force."""
        cap = self.load.capacity
        if cap.verdict is None:
            filled = cap.model_copy(update={"verdict": default_verdict(self.hardware.backend)})
            object.__setattr__(self, "load", self.load.model_copy(update={"capacity": filled}))  # frozen: set once here
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        pinned = {e.toolchain.commit for e in self.engines.values() if e.toolchain is not None}
        if len(pinned) > 1:
            raise ValueError(f"engines pin different llama.cpp commits {sorted(pinned)}: one build serves them all")
        if self.model.source == "synthetic":
            weightless = [f for f in self.needed_formats() if self._reads_hf_weights(f)]
            if weightless:
                raise ValueError(f"model {self.model.name!r} is synthetic (an F16 GGUF of random weights): its HF side "
                                 f"has no weights, only its shape's config and tokenizer (vLLM's --load-format "
                                 f"dummy), so formats {weightless} cannot be made; HF formats of it are fp16 from "
                                 f"the source and fp8_online, GGUF formats are made from the source")
            if self.eval.tasks:
                raise ValueError(f"model {self.model.name!r} is synthetic: quality is not meaningful; "
                                 f"set eval.tasks=[] (eval: none)")
        for fmt, q in self.formats.items():
            if q.input != "source" and q.input not in self.formats:
                raise ValueError(f"formats.{fmt}.input={q.input!r} is neither 'source' nor a defined format")
        for engine, fmts in self.experiment.variants.items():
            if engine not in self.engines:
                raise ValueError(
                    f"experiment.variants names engine {engine!r}, which is not configured; known engines: {sorted(self.engines)}"
                )
            e = self.engines[engine]
            for fmt in fmts:
                if fmt not in self.formats:
                    raise ValueError(
                        f"unknown format {fmt!r} in experiment.variants.{engine}; known formats: {sorted(self.formats)}"
                    )
                if self.formats[fmt].kind != e.serves:
                    raise ValueError(
                        f"format {fmt!r} is a {self.formats[fmt].kind} artifact but engine {engine!r} serves {e.serves}"
                    )
            tp = int(e.settings.get("tensor_parallel_size") or 1)
            if self.hardware.backend == "cuda" and tp > self.hardware.gpus:
                raise ValueError(f"engines.{engine}.settings.tensor_parallel_size={tp} exceeds hardware.gpus="
                                 f"{self.hardware.gpus} ({self.hardware.name})")
        return self

    def _reads_hf_weights(self, fmt: str) -> bool:
        """Whether making ``fmt`` reads weights of an HF checkpoint (a synthetic model's HF side has none)."""
        q = self.formats[fmt]
        if q.input == "source":
            return q.kind == "hf" and q.method != "fp16"
        return self.formats[q.input].kind == "hf" and q.method not in SYNTHETIC_HF_METHODS

    # Convenience views used by the Snakefile -----------------------------
    def variants(self) -> list[tuple[str, str]]:
        """(engine, format) pairs of this experiment, in config order."""
        return [(e, f) for e, fmts in self.experiment.variants.items() for f in fmts]

    @property
    def toolchain(self) -> ToolchainCfg | None:
        """The pinned llama.cpp source the engines build from (every engine with a toolchain names the same)."""
        return next((e.toolchain for e in self.engines.values() if e.toolchain is not None), None)

    def needed_formats(self) -> list[str]:
        """Every format the experiment serves, plus the formats they are made from."""
        out: list[str] = []

        def add(fmt: str) -> None:
            q = self.formats[fmt]
            if q.input != "source":
                add(q.input)
            if fmt not in out:
                out.append(fmt)

        for _, fmt in self.variants():
            add(fmt)
        return out
