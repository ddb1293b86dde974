"""Dapr's Python SDK (gRPC, after its HTTP health handshake) against a running
gateway, as an app written for a Dapr sidecar would use it. DAPR_HTTP_PORT and
DAPR_GRPC_PORT (both the gateway's one port), DAPR_RUNTIME_HOST and
DAPR_API_TOKEN name the gateway as they would name daprd. Every check raises on
a mismatch; the last line printed is "ok" when all passed."""

import json
import os
import time
import urllib.request

import grpc
from dapr.clients import DaprClient
from dapr.clients.grpc._request import TransactionalStateOperation, TransactionOperationType
from dapr.clients.grpc._response import UnlockResponseStatus
from dapr.clients.grpc._state import Concurrency, StateItem, StateOptions
from dapr.proto import api_service_v1, api_v1

PREFIX = os.environ.get("KEY_PREFIX", "py")
STORE = "statestore"
LOCKSTORE = "lockstore"


def key(name):
    return f"{PREFIX}/{name}"


def expect_code(code, call):
    try:
        call()
    except grpc.RpcError as error:
        assert error.code() == code, f"expected {code}, got {error.code()}: {error.details()}"
        return
    raise AssertionError(f"expected {code}, the call succeeded")


def http(method, path, body=None):
    request = urllib.request.Request(
        f"http://{os.environ['DAPR_RUNTIME_HOST']}:{os.environ['DAPR_HTTP_PORT']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
    )
    token = os.environ.get("DAPR_API_TOKEN")
    if token:
        request.add_header("dapr-api-token", token)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


# The constructor polls GET /v1.0/healthz/outbound until it answers 204.
with DaprClient() as client:
    # Bytes and strings are stored as given and read back byte-exact.
    client.save_state(STORE, key("bytes"), b"\x00\x01binary")
    assert client.get_state(STORE, key("bytes")).data == b"\x00\x01binary"
    client.save_state(STORE, key("text"), "hello")
    first = client.get_state(STORE, key("text"))
    assert first.data == b"hello", first.data
    assert first.etag, "a read has an etag"
    # An absent key: empty data and etag, no error.
    absent = client.get_state(STORE, key("absent"))
    assert absent.data == b"" and absent.etag == ""

    # One store under both protocols: a string saved over HTTP is its JSON.
    status, _ = http("POST", f"/v1.0/state/{STORE}", [{"key": key("from-http"), "value": "hi"}])
    assert status == 204
    assert client.get_state(STORE, key("from-http")).data == b'"hi"'

    # Etags: the current one wins and gives a new one; a stale one is ABORTED.
    first_write = StateOptions(concurrency=Concurrency.first_write)
    client.save_state(STORE, key("text"), "world", etag=first.etag, options=first_write)
    second = client.get_state(STORE, key("text"))
    assert second.data == b"world" and second.etag != first.etag
    expect_code(
        grpc.StatusCode.ABORTED,
        lambda: client.save_state(STORE, key("text"), "lost", etag=first.etag, options=first_write),
    )
    # first-write without an etag: only if absent.
    expect_code(
        grpc.StatusCode.ABORTED,
        lambda: client.save_state(STORE, key("text"), "again", options=first_write),
    )
    client.save_state(STORE, key("fresh"), "new", options=first_write)
    assert client.get_state(STORE, key("fresh")).data == b"new"
    # A malformed etag is INVALID_ARGUMENT.
    expect_code(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.save_state(STORE, key("text"), "x", etag="not-an-etag"),
    )

    # Bulk save and read; an absent key's item has no data.
    client.save_bulk_state(STORE, [StateItem(key=key("b1"), value="1"), StateItem(key=key("b2"), value="2")])
    items = client.get_bulk_state(STORE, keys=[key("b1"), key("b2"), key("absent")]).items
    assert [(item.key, item.data) for item in items] == [
        (key("b1"), b"1"),
        (key("b2"), b"2"),
        (key("absent"), b""),
    ], items
    assert items[0].etag and items[1].etag and not items[2].etag

    # Deletes with etags.
    expect_code(
        grpc.StatusCode.ABORTED,
        lambda: client.delete_state(STORE, key("text"), etag=first.etag),
    )
    client.delete_state(STORE, key("text"), etag=second.etag)
    assert client.get_state(STORE, key("text")).data == b""
    client.delete_state(STORE, key("absent"))

    # TTL.
    client.save_state(STORE, key("ttl"), "brief", state_metadata={"ttlInSeconds": "1"})
    assert client.get_state(STORE, key("ttl")).data == b"brief"
    time.sleep(2.5)
    assert client.get_state(STORE, key("ttl")).data == b""

    # Transactions: every op or none.
    client.save_state(STORE, key("tx-old"), "old")
    old = client.get_state(STORE, key("tx-old"))
    client.execute_state_transaction(
        STORE,
        [
            TransactionalStateOperation(key=key("tx-a"), data="a"),
            TransactionalStateOperation(key=key("tx-old"), etag=old.etag, operation_type=TransactionOperationType.delete),
        ],
    )
    assert client.get_state(STORE, key("tx-a")).data == b"a"
    assert client.get_state(STORE, key("tx-old")).data == b""
    # A stale etag fails the whole transaction (INTERNAL), nothing applied.
    stale = client.get_state(STORE, key("tx-a")).etag
    client.save_state(STORE, key("tx-a"), "a2")
    expect_code(
        grpc.StatusCode.INTERNAL,
        lambda: client.execute_state_transaction(
            STORE,
            [
                TransactionalStateOperation(key=key("tx-b"), data="b"),
                TransactionalStateOperation(key=key("tx-a"), data="lost", etag=stale),
            ],
        ),
    )
    assert client.get_state(STORE, key("tx-b")).data == b""
    assert client.get_state(STORE, key("tx-a")).data == b"a2"

    # Locks: not re-entrant; unlock says who holds it.
    resource = key("lock")
    assert client.try_lock(LOCKSTORE, resource, "owner-a", 10).success
    assert not client.try_lock(LOCKSTORE, resource, "owner-a", 10).success
    assert not client.try_lock(LOCKSTORE, resource, "owner-b", 10).success
    assert client.unlock(LOCKSTORE, resource, "owner-b").status == UnlockResponseStatus.lock_belongs_to_others
    assert client.unlock(LOCKSTORE, resource, "owner-a").status == UnlockResponseStatus.success
    assert client.unlock(LOCKSTORE, resource, "owner-a").status == UnlockResponseStatus.lock_does_not_exist

    # An unknown store is INVALID_ARGUMENT.
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.get_state("nostore", key("x")))

# Raw gRPC: what the SDK hides.
channel = grpc.insecure_channel(f"{os.environ['DAPR_RUNTIME_HOST']}:{os.environ['DAPR_GRPC_PORT']}")
stub = api_service_v1.DaprStub(channel)
token = os.environ.get("DAPR_API_TOKEN")
auth = [("dapr-api-token", token)] if token else []
# Methods the gateway does not serve answer UNIMPLEMENTED.
expect_code(
    grpc.StatusCode.UNIMPLEMENTED,
    lambda: stub.GetSecret(api_v1.GetSecretRequest(store_name="s", key="k"), metadata=auth, timeout=10),
)
metadata = stub.GetMetadata(api_v1.GetMetadataRequest(), metadata=auth, timeout=10)
state = next(c for c in metadata.registered_components if c.name == STORE)
assert "ETAG" in state.capabilities and "TRANSACTIONAL" in state.capabilities
if token:
    # Without the token: UNAUTHENTICATED.
    expect_code(
        grpc.StatusCode.UNAUTHENTICATED,
        lambda: stub.GetState(api_v1.GetStateRequest(store_name=STORE, key=key("x")), timeout=10),
    )
print("ok")
