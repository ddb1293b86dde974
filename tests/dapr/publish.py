"""Dapr's Python SDK (gRPC) publishing through a running gateway, as an app
written for a Dapr sidecar publishes. DAPR_GRPC_PORT, DAPR_HTTP_PORT,
DAPR_RUNTIME_HOST and DAPR_API_TOKEN name the gateway; events go to
f"{KEY_PREFIX}/orders", where the test that runs this script subscribes. The
last line printed is "ok" when every call answered as it does against daprd."""

import json
import os

import grpc
from dapr.clients import DaprClient

TOPIC = f"{os.environ.get('KEY_PREFIX', 'py')}/orders"

with DaprClient() as client:
    # One event (JSON), then two in one bulk publish.
    client.publish_event(
        pubsub_name="pubsub",
        topic_name=TOPIC,
        data=json.dumps({"id": 1, "item": "book"}),
        data_content_type="application/json",
    )
    response = client.publish_events(
        pubsub_name="pubsub",
        topic_name=TOPIC,
        data=["two", "three"],
        data_content_type="text/plain",
    )
    assert response.failed_entries == [], response.failed_entries

    # A pub/sub the gateway does not have is INVALID_ARGUMENT, as with daprd.
    try:
        client.publish_event(pubsub_name="kafka", topic_name=TOPIC, data="x")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    else:
        raise AssertionError("publishing to an unknown pub/sub succeeded")

print("ok")
