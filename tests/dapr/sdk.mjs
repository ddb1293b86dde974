// Dapr's JS SDK (HTTP) against a running gateway, as an app written for a
// Dapr sidecar would use it. DAPR_HTTP_PORT (and DAPR_API_TOKEN) name the
// gateway, as they would name daprd. Every check throws on a mismatch; the
// last line printed is "ok" when all passed.
import assert from "node:assert/strict";
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";

// The SDK's LockStatus enum (types/lock/UnlockResponse), which its package
// does not export by name.
const LockStatus = { Success: 0, LockDoesNotExist: 1, LockBelongsToOthers: 2 };

const prefix = process.env.KEY_PREFIX ?? "js";
const client = new DaprClient({
  daprHost: "127.0.0.1",
  daprPort: process.env.DAPR_HTTP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
const store = "statestore";
const key = (name) => `${prefix}/${name}`;

// The SDK's start-up handshake: it polls /v1.0/metadata until it answers.
await client.start();

// Values of each type come back as saved.
const values = { text: "hello", number: 42, object: { a: 1, b: [true, null] }, list: [1, "two"] };
assert.deepEqual(await client.state.save(store, Object.entries(values).map(([k, v]) => ({ key: key(k), value: v }))), {});
for (const [k, v] of Object.entries(values)) {
  assert.deepEqual(await client.state.get(store, key(k)), v, `get ${k}`);
}
// An absent key reads as the SDK's empty answer.
assert.equal(await client.state.get(store, key("absent")), "");

// Bulk reads carry each key's etag; an absent key has no data.
const bulk = await client.state.getBulk(store, [key("text"), key("absent")]);
assert.equal(bulk.length, 2);
const text = bulk.find((item) => item.key === key("text"));
assert.equal(text.data, "hello");
assert.ok(text.etag, "a bulk item has an etag");
assert.equal(bulk.find((item) => item.key === key("absent")).data, undefined);

// A save with the current etag wins, and gives the key a new etag; the
// old etag is then refused (the SDK returns the error, it does not throw).
const saved = await client.state.save(store, [
  { key: key("text"), value: "world", etag: text.etag, options: { concurrency: "first-write" } },
]);
assert.deepEqual(saved, {});
const [after] = await client.state.getBulk(store, [key("text")]);
assert.equal(after.data, "world");
assert.notEqual(after.etag, text.etag);
const stale = await client.state.save(store, [
  { key: key("text"), value: "lost", etag: text.etag, options: { concurrency: "first-write" } },
]);
assert.ok(stale.error, "a stale etag is refused");
assert.equal(await client.state.get(store, key("text")), "world");

// Deletes: a stale etag is refused, the current one deletes.
const staleDelete = await client.state.delete(store, key("text"), { etag: text.etag });
assert.ok(staleDelete.error, "a delete with a stale etag is refused");
assert.deepEqual(await client.state.delete(store, key("text"), { etag: after.etag }), {});
assert.equal(await client.state.get(store, key("text")), "");
// Without an etag a delete always succeeds, the key absent or not.
assert.deepEqual(await client.state.delete(store, key("absent")), {});

// TTL from metadata.ttlInSeconds.
await client.state.save(store, [{ key: key("ttl"), value: "brief", metadata: { ttlInSeconds: "1" } }]);
assert.equal(await client.state.get(store, key("ttl")), "brief");
await new Promise((resolve) => setTimeout(resolve, 2500));
assert.equal(await client.state.get(store, key("ttl")), "", "the key expired");

// Transactions: every op or none.
await client.state.save(store, [{ key: key("tx-old"), value: "old" }]);
const [old] = await client.state.getBulk(store, [key("tx-old")]);
await client.state.transaction(store, [
  { operation: "upsert", request: { key: key("tx-a"), value: { n: 1 } } },
  { operation: "delete", request: { key: key("tx-old"), etag: old.etag } },
]);
assert.deepEqual(await client.state.get(store, key("tx-a")), { n: 1 });
assert.equal(await client.state.get(store, key("tx-old")), "");
// A stale etag fails the whole transaction: nothing applied.
await assert.rejects(
  client.state.transaction(store, [
    { operation: "upsert", request: { key: key("tx-b"), value: 2 } },
    { operation: "upsert", request: { key: key("tx-a"), value: 3, etag: old.etag } },
  ]),
);
assert.equal(await client.state.get(store, key("tx-b")), "");
assert.deepEqual(await client.state.get(store, key("tx-a")), { n: 1 });

// Locks: not re-entrant; unlock tells who holds it.
const lockstore = "lockstore";
const resource = key("lock");
assert.deepEqual(await client.lock.lock(lockstore, resource, "owner-a", 10), { success: true });
assert.deepEqual(await client.lock.lock(lockstore, resource, "owner-a", 10), { success: false });
assert.deepEqual(await client.lock.lock(lockstore, resource, "owner-b", 10), { success: false });
assert.equal((await client.lock.unlock(lockstore, resource, "owner-b")).status, LockStatus.LockBelongsToOthers);
assert.equal((await client.lock.unlock(lockstore, resource, "owner-a")).status, LockStatus.Success);
assert.equal((await client.lock.unlock(lockstore, resource, "owner-a")).status, LockStatus.LockDoesNotExist);

// The metadata names both components, and only true capabilities.
const metadata = await client.metadata.get();
const state = metadata.components.find((component) => component.name === store);
assert.ok(state.type.startsWith("state."));
assert.ok(state.capabilities.includes("ETAG"));
assert.ok(state.capabilities.includes("TRANSACTIONAL"));

await client.stop();
console.log("ok");
