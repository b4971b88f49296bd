"""A real OTLP/HTTP trace receiver for the tests: decodes each
`ExportTraceServiceRequest` (protobuf) with the OpenTelemetry protobuf
definitions (`opentelemetry-proto`) and appends one JSON line per span to
OUT: trace id, span id, parent span id, name, kind, attributes and the
resource's `service.name`.

Usage: receiver.py PORT_FILE OUT   (binds 127.0.0.1:0, writes the port to PORT_FILE)
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

port_file, out = sys.argv[1], sys.argv[2]


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
        if ok:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with open(out, "a") as f:
                for rs in request.resource_spans:
                    resource = {a.key: value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            f.write(json.dumps({
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "attributes": {a.key: value(a.value) for a in s.attributes},
                                "service": resource.get("service.name"),
                            }) + "\n")
        self.send_response(200 if ok else 400)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(ExportTraceServiceResponse().SerializeToString())

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.replace(port_file + ".tmp", port_file)
server.serve_forever()
