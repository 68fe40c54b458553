"""The server's latency means over a window, read from a real Prometheus exposition page.

The page is made by prometheus_client (the library vLLM exports its metrics with), served over HTTP here, so the
reading path is the one a cell takes: a GET of /metrics, the text parser, the sums and counts at the window's two
ends. What is known: the values observed between the two reads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bakeoff.engines import get_engine
from bakeoff.loadgen.server_latency import LatencyHistograms, ServerLatencyWindow

NAMES = LatencyHistograms(ttft="vllm:time_to_first_token_seconds", itl="vllm:inter_token_latency_seconds",
                          queue="vllm:request_queue_time_seconds")


@pytest.fixture()
def server() -> Iterator[tuple[str, dict[str, Histogram]]]:
    registry = CollectorRegistry()
    hists = {name: Histogram(name, "test", ["model_name"], registry=registry)
             for name in (NAMES.ttft, NAMES.itl, NAMES.queue)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hists
    httpd.shutdown()


def test_the_means_are_of_what_the_window_saw_alone(server) -> None:
    url, hists = server
    for v in (5.0, 7.0):  # before the window: never in its means
        hists[NAMES.ttft].labels("m").observe(v)
    window = ServerLatencyWindow(url, NAMES, label="vllm")
    window.open()
    for model, v in (("m", 0.010), ("m", 0.030), ("other", 0.050)):  # label sets are summed
        hists[NAMES.ttft].labels(model).observe(v)
        hists[NAMES.queue].labels(model).observe(v / 10)
    for v in (0.002, 0.004):
        hists[NAMES.itl].labels("m").observe(v)
    window.close()
    hists[NAMES.ttft].labels("m").observe(9.0)  # after it: never either
    cols = window.columns()
    assert cols["server_mean_ttft_ms"] == pytest.approx(30.0)
    assert cols["server_mean_queue_ms"] == pytest.approx(3.0)
    assert cols["server_mean_itl_ms"] == pytest.approx(3.0)
    assert cols["server_latency_requests"] == 3 and cols["server_latency_source"] == "vllm /metrics"


def test_a_window_with_no_first_token_has_no_mean(server) -> None:
    url, hists = server
    for h in hists.values():
        h.labels("m")  # the label set a server makes at its start: samples of 0
    window = ServerLatencyWindow(url, NAMES)
    window.open()
    window.close()
    cols = window.columns()
    assert cols["server_mean_ttft_ms"] is None and cols["server_latency_requests"] == 0


def test_a_server_without_the_histograms_or_without_an_answer_is_said_not_fatal(server) -> None:
    url, _ = server
    absent = ServerLatencyWindow(url, LatencyHistograms(ttft="nope_seconds"), label="x")
    absent.open()
    absent.close()
    assert absent.columns()["server_latency_source"] == "x /metrics (unavailable: no nope_seconds on /metrics)"
    gone = ServerLatencyWindow("http://127.0.0.1:9", NAMES, label="vllm")
    gone.open()
    gone.close()
    cols = gone.columns()
    assert cols["server_mean_ttft_ms"] is None and "unavailable: ConnectionError" in cols["server_latency_source"]


def test_each_engine_names_its_own_histograms_or_none() -> None:
    assert get_engine("vllm").latency_histograms == NAMES
    assert get_engine("llamacpp").latency_histograms is None
    assert ServerLatencyWindow("http://127.0.0.1:9", None).columns() == {}


def test_a_failed_start_read_keeps_its_reason_after_an_end_read_that_worked(server) -> None:
    url, hists = server
    for h in hists.values():
        h.labels("m")
    window = ServerLatencyWindow("http://127.0.0.1:9", NAMES, label="vllm")
    window.open()
    window.base_url = url  # the server answers by the window's end
    window.close()
    assert "unavailable: ConnectionError" in window.columns()["server_latency_source"]
