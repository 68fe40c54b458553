"""The engine interface: start, ready, stop, versions, capabilities.

Why a registry behind one abstract class (as lm-evaluation-harness does for
its model backends): the load generator and the pipeline never branch on the
engine. Adding an engine (say SGLang) is one module that subclasses
:class:`Engine` and calls :func:`register`, plus one ``conf/engine/*.yaml``.

A server is started once per (engine, format, engine settings) and serves all
of that variant's load cells. It binds 127.0.0.1 on a free port unless told
otherwise; any other address needs an API key (enforced by the config schema
and again here).
"""

from __future__ import annotations

import abc
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, HardwareCfg
from bakeoff.engines.container import Container, container_name
from bakeoff.errors import BakeoffError
from bakeoff.hardware.gpu import server_env
from bakeoff.hardware.memory import tree_rss
from bakeoff.loadgen.prefix_cache import PrefixCacheCounters
from bakeoff.loadgen.scrape import MetricNames
from bakeoff.loadgen.server_latency import LatencyHistograms
from bakeoff.proc import ManagedProcess, ServerStartError, free_port, tail

ENGINES: dict[str, type[Engine]] = {}
THREAD_CAPS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def register(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def get_engine(plugin: str) -> type[Engine]:
    """A registered engine by name, or ``"module:Class"``: an engine defined outside bakeoff, imported here.

    The second form is how a user adds an engine without touching bakeoff: the module (importable from
    ``PYTHONPATH``) defines an :class:`Engine` subclass, and one config file names it.
    """
    if ":" in plugin:
        return _import_engine(plugin)
    try:
        return ENGINES[plugin]
    except KeyError:
        raise BakeoffError(f"unknown engine plugin {plugin!r}; registered: {sorted(ENGINES)}, "
                           "or give one as 'module:Class'") from None


def _import_engine(plugin: str) -> type[Engine]:
    import importlib

    module, _, attr = plugin.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BakeoffError(f"engine plugin {plugin!r} cannot be loaded ({type(e).__name__}: {e}); the module "
                           "must be importable (PYTHONPATH) and define that class") from None
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise BakeoffError(f"engine plugin {plugin!r} is not a subclass of bakeoff.engines.Engine")
    return cls


@dataclass
class ServerSpec:
    """Everything needed to start one server for one variant."""

    engine: EngineCfg
    hardware: HardwareCfg
    model_dir: Path  # the format's artifact directory
    served_name: str  # the model name clients send
    log_path: Path
    toolchain_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # The job this server belongs to (experiment, model, variant): names its container, if it runs in one.
    job_name: str = ""


# Wrapper errors that only point elsewhere ("see root cause above").
_GENERIC = re.compile(r"initialization failed|see root cause|see stack trace|Failed core proc", re.I)
_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")
_LOG_PREFIX = re.compile(r"^\(.*?\)\s+(ERROR|WARNING|INFO)\s+\S+\s+\S+\s+\[[^\]]*\]\s+")


def engine_error_line(log_text: str) -> str:
    """The engine's own root-cause line from a failed start (first specific exception), else its last line."""
    found = error_line(log_text)
    if found is not None:
        return found
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "server exited without output"


def error_line(log_text: str) -> str | None:
    """The first specific exception, else the last ``error``/``failed`` line; None when the log has neither."""
    generic = ""
    for raw in log_text.splitlines():
        level = _LOG_PREFIX.match(raw.strip())
        if level and level.group(1) != "ERROR":
            continue  # warnings may quote error text ("... can cause `OSError: ...`")
        line = _LOG_PREFIX.sub("", raw.strip())
        m = _ERROR_LINE.search(line)
        if not m:
            continue
        text = f"{m.group(1)}: {m.group(2)}".strip()
        if _GENERIC.search(text):
            generic = generic or text
            continue
        return text[:500]
    if generic:
        return generic[:500]
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for ln in reversed(lines):  # llama.cpp style: "error: ..." / "failed to ..."
        if re.search(r"\berror\b|failed", ln, re.I):
            return ln[:500]
    return None


# A start that failed for want of a resource is a failure of this run, never a property of the hardware.
RESOURCE_FAILURES = re.compile(r"out of memory|OutOfMemory|Available memory on node|cannot allocate|"
                               r"address already in use|couldn't bind|failed to bind|No space left", re.I)


class Engine(abc.ABC):
    """One running (or startable) inference server."""

    name: str = ""
    serves: str = ""  # artifact kind: "hf" or "gguf"
    health_path = "/health"
    # The engine's own words for "this build or hardware cannot run this format or feature". A start
    # failure matching one is ``unsupported``; any other is ``failed``.
    unsupported_patterns: tuple[str, ...] = ()
    # The setting that bounds one request's tokens (prompt + output); None: the model's context.
    context_setting: str | None = None
    # What the DAG builds for it before it can start: "llamacpp" (the tools), "llamacpp-python" (the binding), None.
    toolchain: str | None = None
    # Its Prometheus names for KV-cache use, waiting and running requests; None: it exposes none.
    metric_names: MetricNames | None = None
    # Its Prometheus counters of prompt tokens reused from a prefix cache; None: it exposes none.
    prefix_cache_counters: PrefixCacheCounters | None = None
    # Its Prometheus latency histograms (first token, inter-token, queue); None: it keeps none.
    latency_histograms: LatencyHistograms | None = None

    # --- what the engine knows about itself, asked before any server starts ----------
    @classmethod
    def request_context(cls, settings: Mapping[str, Any], model_max_context: int | None = None) -> int:
        """Tokens one request may use with these settings (never more than the model's context)."""
        cap = model_max_context or 1 << 30
        value = settings.get(cls.context_setting) if cls.context_setting else None
        return min(int(value or cap), cap)

    @classmethod
    def hardware_flags(cls, hardware: HardwareCfg, settings: Mapping[str, Any]) -> list[str]:
        """Command-line flags this hardware needs (GPU offload, multi-GPU split), unless settings set them."""
        return []

    @classmethod
    def slots(cls, settings: Mapping[str, Any]) -> int | None:
        """Fixed request slots with state of their own, which a warm-up must each reach; None where requests
        share one pool (a warm-up at the cell's own concurrency then touches what the cell uses)."""
        return None

    @classmethod
    def sized_for_capacity(cls, settings: Mapping[str, Any], maximum: int, slot_tokens: int, model_dir: Path,
                           hardware: HardwareCfg) -> tuple[dict[str, Any], str] | None:
        """Settings that let a capacity search reach ``maximum`` requests of ``slot_tokens`` each, and what set
        them; None where the engine needs no sizing (its request pool grows with the load by itself)."""
        return None

    @classmethod
    def weight_shards(cls, hardware: Mapping[str, Any], settings: Mapping[str, Any]) -> int:
        """GPUs that read disjoint weight shards at once during one decode step (the roofline's bandwidth factor)."""
        return 1

    @classmethod
    def predict_support(cls, method: str, capabilities: Mapping[str, Any], cc: float | None) -> tuple[str, str]:
        """Expected status of a format made by quant ``method`` on hardware with the doctor's ``capabilities``."""
        return "supported", ""

    @classmethod
    def conda_env(cls, backend: str) -> str:
        """The pinned environment (a file in envs/) its serving job runs in on a cluster (--sdm conda)."""
        return "eval.yaml"

    @classmethod
    def config_problems(cls, engine: EngineCfg, hardware: HardwareCfg) -> list[str]:
        """What in this engine's config cannot work on this hardware (checked before any job starts)."""
        return []

    @classmethod
    def run_problems(cls, engine: EngineCfg, hardware: HardwareCfg, *, conda: bool = False) -> list[str]:
        """What on this machine stops this engine from serving as configured (an interpreter, a build), checked by
        the workflow before any job of a real run, never for a plan (``snakemake -n`` plans anywhere).
        ``conda``: jobs run in their pinned environments (``--sdm conda``), not in bakeoff's own."""
        return []

    @classmethod
    def start_failure_status(cls, reason: str) -> str:
        """``unsupported`` only for the engine's known refusals; resource and other failures are ``failed``."""
        if RESOURCE_FAILURES.search(reason):
            return "failed"
        return "unsupported" if any(re.search(p, reason) for p in cls.unsupported_patterns) else "failed"

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.host = spec.engine.host
        self.port = spec.engine.port or free_port(self.host if self._is_loopback(self.host) else "0.0.0.0")
        if not self._is_loopback(self.host) and not spec.engine.api_key:
            raise BakeoffError(f"refusing to bind {self.host}: a non-loopback address needs engines.<name>.api_key")
        self.process: ManagedProcess | None = None
        image = self.container_image
        self.container = (Container(container_name(spec.job_name or f"{self.name}-{spec.served_name}",
                                                   spec.log_path.parent), image, spec.log_path)
                          if image else None)

    @property
    def container_image(self) -> str | None:
        """The image the server runs in (None: a local process)."""
        return None

    @staticmethod
    def _is_loopback(host: str) -> bool:
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host == "localhost"

    # --- what each plugin defines -------------------------------------------------
    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server command line, built from config."""

    def env(self) -> dict[str, str]:
        """Environment for the server: ours, minus thread caps meant for the harness.

        Snakemake exports OMP_NUM_THREADS=<job threads> (and friends) to every
        job. A server manages its own threads (vLLM's CPU backend pins its own
        cores); inheriting the cap oversubscribes them -- measured here: 0.4
        instead of ~26 tok/s for vLLM at concurrency 1.
        """
        env = {k: v for k, v in os.environ.items() if k not in THREAD_CAPS}
        env.update(server_env(self.spec.hardware, os.environ))  # its GPUs, and NVLink multicast off
        env.update(self.spec.extra_env)
        return env

    @abc.abstractmethod
    def versions(self) -> dict[str, str]:
        """Pinned versions of what serves the requests (recorded with every result)."""

    def capabilities(self) -> dict[str, Any]:
        """What this engine can serve, for planning and for 'unsupported' rows."""
        return {"serves": self.serves}

    @classmethod
    def served_weight_bytes(cls, manifest: Mapping[str, Any], settings: Mapping[str, Any]) -> int | None:
        """Weight bytes the engine reads per decoded token: the checkpoint's, unless it upcasts them."""
        return manifest.get("weight_bytes")

    def started_facts(self) -> tuple[dict[str, Any], list[str]]:
        """What the running server set up where it may differ from what was asked: columns, and notes saying how.

        Asked once per server start, after it is ready; every cell on that start records them.
        """
        return {}, []

    @classmethod
    def prefix_caching_flags(cls, on: bool, settings: Mapping[str, Any]) -> tuple[list[str], tuple[str, ...]]:
        """The flags that turn the engine's prefix caching ``on`` or off (the ``prefix_caching`` setting), and
        the settings they take over (left out of the other flags); ``([], ())`` where it has no switch."""
        return [], ()

    @classmethod
    def prefix_caching_state(cls, settings: Mapping[str, Any]) -> str:
        """``on``, ``off`` or ``engine default``: what the ``prefix_caching`` setting asked, for the row."""
        value = settings.get("prefix_caching")
        return "engine default" if value is None else "on" if value else "off"

    def refusal_before_start(self) -> str | None:
        """The engine's own refusal of this variant, shown faster than a server start can (None: start it)."""
        return None

    # --- lifecycle, shared ---------------------------------------------------------
    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def prepare(self) -> None:
        """Work before the start that the startup timeout must not count: pulling the container image."""
        if self.container is not None:
            self.container.pull()

    def start(self) -> Engine:
        if self.container is not None:
            self.container.remove_stale()
        self.process = ManagedProcess(self.command(), self.spec.log_path, env=self.env()).start()
        if self.container is not None:
            self.container.start_reaper()  # removes the container even if this process is SIGKILLed
        return self

    def ready(self, timeout_s: float | None = None) -> float:
        """Block until the health endpoint answers; raises ServerStartError with the log tail."""
        assert self.process is not None, "start() first"
        return self.process.wait_healthy(self.base_url + self.health_path, timeout_s or self.spec.engine.startup_timeout_s)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def concurrency_limit(self, tokens_per_request: int) -> tuple[int | None, str]:
        """The most requests of ``tokens_per_request`` tokens this running server holds at once, and what sets
        that limit (named in a capacity row); ``(None, "")`` where the engine sets none that it tells."""
        return None, ""

    def stop(self) -> None:
        """Stop the server; a container is stopped and removed by name (the client's exit does neither)."""
        if self.container is not None and self.process is not None:
            self.container.stop()
        if self.process is not None:
            self.process.stop()

    def memory_bytes(self) -> int | None:
        """Memory the server holds now: its container's, else its process tree's RSS."""
        if self.container is not None:
            return self.container.memory_bytes()
        return tree_rss(self.process.pid) if self.process else None

    def memory_source(self) -> str:
        return self.container.memory_source() if self.container is not None else "process tree RSS"

    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def failure_reason(self) -> str:
        """How the server ended (exit code or signal), then its error line from this start's log.

        A server killed from outside (SIGKILL, the OOM killer) logs no error; its log's last line is then
        quoted as such, never as the cause.
        """
        if self.process is None:
            return engine_error_line(tail(self.spec.log_path, 400))
        how = self.process.exit_description()
        log = self.process.log_since_start()
        found = error_line(log)
        if how is None:
            return found or engine_error_line(log)
        if found is not None:
            return f"server {how}: {found}"
        last = [ln.strip() for ln in log.splitlines() if ln.strip()]
        return f"server {how}; no error in its log, which ends: {last[-1][:300] if last else '(empty)'}"

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ENGINES", "Engine", "ServerSpec", "ServerStartError", "engine_error_line", "error_line", "get_engine",
           "register"]
