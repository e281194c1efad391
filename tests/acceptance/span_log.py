"""OpenTelemetry spans of child processes, one JSON line each in the file $SPAN_LOG.

``start_tracing`` (connected to Celery's ``worker_process_init`` and ``beat_init`` by
``tests.acceptance.settings_otel``) sets a tracer provider whose ``SpanLogExporter`` appends each
finished span as it ends (``SimpleSpanProcessor``: no thread, nothing lost at a stop), then runs
the real ``CeleryInstrumentor().instrument()``. The service name is OTEL_SERVICE_NAME (the
deployment sets it to the process's name). ``read_spans`` reads the file back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

SPAN_LOG = "SPAN_LOG"


class SpanLogExporter(SpanExporter):
    """Append each span to ``path`` as one JSON line: name, ids (hex), service, attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            context = span.get_span_context()
            lines.append(json.dumps({
                "name": span.name,
                "kind": span.kind.name,
                "trace_id": format(context.trace_id, "032x"),
                "span_id": format(context.span_id, "016x"),
                "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                "service": span.resource.attributes.get("service.name"),
                "pid": os.getpid(),
                "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
            }))
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def start_tracing(**_: Any) -> None:
    """Trace this process into $SPAN_LOG and instrument Celery (a Celery signal receiver)."""
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(SimpleSpanProcessor(SpanLogExporter(os.environ[SPAN_LOG])))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


def read_spans(path: Path) -> list[dict[str, Any]]:
    """Every span in the file at ``path``, in the order written."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]
