// Dapr's JS SDK against a running gateway for the calls beside state:
// metadata.set and state.query over HTTP, configuration.get and subscribe
// over gRPC (the SDK's HTTP client does not offer configuration).
// DAPR_HTTP_PORT, DAPR_GRPC_PORT and DAPR_API_TOKEN name the gateway, as
// they would name daprd. Every check throws on a mismatch; the last line
// printed is "ok" when all passed.
import assert from "node:assert/strict";
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";

const prefix = process.env.KEY_PREFIX ?? "js";
const http = new DaprClient({
  daprHost: "127.0.0.1",
  daprPort: process.env.DAPR_HTTP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
const grpc = new DaprClient({
  daprHost: "127.0.0.1",
  daprPort: process.env.DAPR_GRPC_PORT,
  communicationProtocol: CommunicationProtocolEnum.GRPC,
});
await http.start();
await grpc.start();

// A key written as it is, outside the Dapr API (as any store client may).
const keys = async (method, name, body) => {
  const response = await fetch(`http://127.0.0.1:${process.env.DAPR_HTTP_PORT}/keys/${encodeURIComponent(name)}`, {
    method,
    headers: { Authorization: `Bearer ${process.env.DAPR_API_TOKEN}` },
    body,
  });
  assert.ok(response.ok, `${method} /keys/${name}: ${response.status}`);
};

/** Polls `check` every 100 ms for up to 20 s. */
const eventually = async (what, check) => {
  for (let tries = 0; tries < 200; tries++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.fail(`${what} did not happen within 20 s`);
};

// Sidecar metadata: set, then read back under `extended`.
assert.equal(await http.metadata.set(`${prefix}-attribute`, "set by the JS SDK"), true);
const metadata = await http.metadata.get();
assert.equal(metadata.extended[`${prefix}-attribute`], "set by the JS SDK");
assert.ok(metadata.components.some((component) => component.type.startsWith("configuration.")));

// The state query: filter, sort and paging through tokens.
const store = "statestore";
const people = [1, 2, 3, 4, 5, 6, 7].map((n) => ({ key: `${prefix}/person/${n}`, value: { n, team: prefix, even: n % 2 === 0 } }));
assert.deepEqual(await http.state.save(store, people), {});
const sorted = [];
let token;
do {
  const page = await http.state.query(store, {
    filter: { AND: [{ EQ: { team: prefix } }, { EQ: { even: true } }] },
    sort: [{ key: "n", order: "DESC" }],
    page: { limit: 2, token },
  });
  assert.ok(page.results.length <= 2);
  for (const result of page.results) {
    assert.ok(result.etag, "a result has an etag");
    sorted.push(result.data.n);
  }
  token = page.token;
} while (token);
assert.deepEqual(sorted, [6, 4, 2]);
const nothing = await http.state.query(store, { filter: { EQ: { team: "nobody" } } });
assert.deepEqual(nothing.results, []);

// Configuration over gRPC: get, then a subscription sees changes.
const configstore = "configstore";
const color = `${prefix}-color`;
await keys("PUT", color, "blue");
const got = await grpc.configuration.get(configstore, [color]);
assert.equal(got.items[color].value, "blue");
assert.ok(got.items[color].version);
const updates = [];
const subscription = await grpc.configuration.subscribeWithKeys(configstore, [color], async (update) => {
  updates.push(update);
});
// The subscription is open once the gateway sent its id; a change written
// before that is not one the SDK promises to deliver, so write until one
// arrives.
let written = 0;
await eventually("a change of the subscribed key", async () => {
  if (updates.length > 0) return true;
  await keys("PUT", color, `green-${written++}`);
  return false;
});
assert.ok(updates[0].items[color].value.startsWith("green-"));
// A delete is the item with an empty value.
await keys("DELETE", color);
await eventually("the delete", async () => updates.some((update) => update.items[color]?.value === ""));
await subscription.stop();

await grpc.stop();
await http.stop();
console.log("ok");
