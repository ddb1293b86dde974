"""Dapr's Python SDK (gRPC) against a running gateway for the calls beside
state: set_metadata, query_state, get_configuration, subscribe_configuration
and unsubscribe_configuration. DAPR_HTTP_PORT, DAPR_GRPC_PORT,
DAPR_RUNTIME_HOST and DAPR_API_TOKEN name the gateway as they would name
daprd. Every check raises on a mismatch; the last line printed is "ok" when
all passed."""

import json
import os
import queue
import urllib.parse
import urllib.request

from dapr.clients import DaprClient

PREFIX = os.environ.get("KEY_PREFIX", "py")


def keys(method, name, body=None):
    """A key written as it is, outside the Dapr API (as any store client may)."""
    request = urllib.request.Request(
        f"http://{os.environ['DAPR_RUNTIME_HOST']}:{os.environ['DAPR_HTTP_PORT']}/keys/"
        + urllib.parse.quote(name, safe=""),
        data=None if body is None else body.encode(),
        method=method,
        headers={"Authorization": f"Bearer {os.environ['DAPR_API_TOKEN']}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert 200 <= response.status < 300, response.status


with DaprClient() as client:
    # Sidecar metadata: set, then read back.
    client.set_metadata(f"{PREFIX}-attribute", "set by the Python SDK")
    metadata = client.get_metadata()
    assert metadata.extended_metadata[f"{PREFIX}-attribute"] == "set by the Python SDK"

    # The state query: filter, sort and paging through tokens.
    for n in range(1, 8):
        client.save_state("statestore", f"{PREFIX}/person/{n}", json.dumps({"n": n, "team": PREFIX}))
    query = {
        "filter": {"AND": [{"EQ": {"team": PREFIX}}, {"IN": {"n": [2, 3, 5, 7]}}]},
        "sort": [{"key": "n", "order": "ASC"}],
        "page": {"limit": 3},
    }
    found = []
    while True:
        page = client.query_state("statestore", json.dumps(query))
        for item in page.results:
            assert item.etag, "a result has an etag"
            found.append(item.json()["n"])
        if not page.token:
            break
        query["page"]["token"] = page.token
    assert found == [2, 3, 5, 7], found

    # Configuration: get, subscribe, a change, unsubscribe.
    color = f"{PREFIX}-color"
    keys("PUT", color, "blue")
    items = client.get_configuration("configstore", [color]).items
    assert items[color].value == "blue" and items[color].version, items
    changes = queue.Queue()
    subscription = client.subscribe_configuration(
        "configstore", [color], lambda id, response: changes.put((id, response))
    )
    assert subscription, "the SDK got the subscription's id"
    keys("PUT", color, "green")
    id, response = changes.get(timeout=20)
    assert id == subscription
    assert response.items[color].value == "green", response.items
    keys("DELETE", color)
    id, response = changes.get(timeout=20)
    assert response.items[color].value == "", response.items
    assert client.unsubscribe_configuration("configstore", subscription)
    assert not client.unsubscribe_configuration("configstore", subscription)
print("ok")
