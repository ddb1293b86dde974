"""Raw calls to Dapr's gRPC service (dapr.proto.runtime.v1.Dapr) through the
Python SDK's generated stubs, for tests that need what the SDK hides (status
codes, exact requests). Reads a JSON array of calls from stdin, each
{"method": "SaveState", "request": {...}} with the request in protobuf's JSON
mapping (bytes as base64), and prints one JSON array: per call its status code
name, message and response (protobuf's JSON mapping). DAPR_RUNTIME_HOST,
DAPR_GRPC_PORT and DAPR_API_TOKEN name the gateway, as they would name daprd.
The last line printed is "ok"."""

import json
import os
import sys

import grpc
from google.protobuf import json_format
from dapr.proto import api_service_v1, api_v1

channel = grpc.insecure_channel(f"{os.environ['DAPR_RUNTIME_HOST']}:{os.environ['DAPR_GRPC_PORT']}")
stub = api_service_v1.DaprStub(channel)
token = os.environ.get("DAPR_API_TOKEN")
auth = [("dapr-api-token", token)] if token else []

results = []
for call in json.load(sys.stdin):
    method = call["method"]
    request = json_format.ParseDict(call.get("request", {}), getattr(api_v1, f"{method}Request")())
    try:
        response = getattr(stub, method)(request, metadata=auth, timeout=30)
        results.append({"code": "OK", "message": "", "response": json_format.MessageToDict(response)})
    except grpc.RpcError as error:
        results.append({"code": error.code().name, "message": error.details(), "response": None})
print(json.dumps(results))
print("ok")
