// Dapr's JS SDK (HTTP) publishing through a running gateway, as an app
// written for a Dapr sidecar publishes. DAPR_HTTP_PORT (and DAPR_API_TOKEN)
// name the gateway; events go to `${KEY_PREFIX}/orders`, where the test
// that runs this script subscribes. The last line printed is "ok" when
// every call answered as it does against daprd.
import assert from "node:assert/strict";
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";

const topic = `${process.env.KEY_PREFIX ?? "js"}/orders`;
const client = new DaprClient({
  daprHost: "127.0.0.1",
  daprPort: process.env.DAPR_HTTP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
await client.start();

// One event (JSON), then two in one bulk publish.
assert.deepEqual(await client.pubsub.publish("pubsub", topic, { id: 1, item: "book" }), {});
const bulk = await client.pubsub.publishBulk("pubsub", topic, [{ id: 2 }, "three"]);
assert.deepEqual(bulk.failedMessages, []);

// A pub/sub the gateway does not have is an error, as with daprd.
const unknown = await client.pubsub.publish("kafka", topic, { id: 4 });
assert.ok(unknown.error, "publishing to an unknown pub/sub fails");

console.log("ok");
