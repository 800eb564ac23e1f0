// The lost-acknowledgement recipe with the official JavaScript SDK (@azure/service-bus): the third send is
// stored by the broker but its acknowledgement is lost; the SDK's retry policy sends it again; the receiver
// must get every message exactly once. That holds only when the queue has duplicate detection on.
//
//   oncebus serve --port 5672 &
//   oncebus queue create orders --duplicate-detection
//   npm install @azure/service-bus
//   ONCEBUS_CONNECTION_STRING='Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true' \
//     node examples/lost_ack.js orders
//
// Exits 0 when each message arrived once, 1 otherwise (a queue without duplicate detection gets a duplicate).
// The fault is armed over HTTP (POST /$faults on the broker's port) with the connection string's key, which
// needs the Manage right.
"use strict";

const { ServiceBusClient } = require("@azure/service-bus");

const connectionString = process.env.ONCEBUS_CONNECTION_STRING;
const queue = process.argv[2] || "orders";

function field(name) {
  const match = connectionString.match(new RegExp(`${name}=([^;]+)`));
  if (!match) throw new Error(`the connection string has no ${name}`);
  return match[1];
}

async function armFault(fault) {
  const endpoint = field("Endpoint").replace(/^sb:\/\//, "http://").replace(/\/$/, "");
  const key = `${field("SharedAccessKeyName")}:${field("SharedAccessKey")}`;
  const response = await fetch(`${endpoint}/$faults`, {
    method: "POST",
    headers: { Authorization: `Basic ${Buffer.from(key).toString("base64")}`, "Content-Type": "application/json" },
    body: JSON.stringify(fault),
  });
  if (response.status !== 201) throw new Error(`arming ${JSON.stringify(fault)}: ${await response.text()}`);
  return response.json();
}

async function main() {
  await armFault({ kind: "lost-ack", entity: queue, after: 2 }); // the third send: stored, its ack lost
  // The JS SDK notices a lost acknowledgement only when its operation times out (timeoutInMs, 60 s by
  // default), then retries: a short timeout keeps the recipe quick.
  const retryOptions = { maxRetries: 3, retryDelayInMs: 100, timeoutInMs: 2000 };
  const client = new ServiceBusClient(connectionString, { retryOptions });
  try {
    const sender = client.createSender(queue);
    const sent = [];
    for (let i = 0; i < 5; i++) {
      sent.push(`order ${i}`);
      await sender.sendMessages({ body: `order ${i}`, messageId: `order-${i}` }); // retried by the SDK
    }
    await sender.close();
    const receiver = client.createReceiver(queue);
    const received = [];
    for (;;) {
      const batch = await receiver.receiveMessages(10, { maxWaitTimeInMs: 1000 });
      if (batch.length === 0) break;
      for (const message of batch) {
        received.push(message.body);
        await receiver.completeMessage(message);
      }
    }
    await receiver.close();
    received.sort();
    const once = JSON.stringify(received) === JSON.stringify(sent);
    console.log(JSON.stringify({ sent, received, exactlyOnce: once }));
    process.exitCode = once ? 0 : 1;
  } finally {
    await client.close();
  }
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 2;
});
