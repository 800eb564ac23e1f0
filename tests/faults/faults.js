// Faults on cue with the official JavaScript SDK (@azure/service-bus 7.9.5, from tests/js): run by
// tests/faults/test_js_faults.py with ONCEBUS_CONNECTION_STRING (a key with Manage) and the queue names in
// argv. Arms each fault over HTTP (POST /$faults, Basic with the connection string's key) and prints one JSON
// line with what the SDK raised and received.
"use strict";

const { ServiceBusClient } = require("@azure/service-bus");

const connectionString = process.env.ONCEBUS_CONNECTION_STRING;
const [busyQueue, lockQueue] = process.argv.slice(2);

function field(name) {
  return connectionString.match(new RegExp(`${name}=([^;]+)`))[1];
}

async function armFault(fault) {
  const endpoint = field("Endpoint").replace(/^sb:\/\//, "http://").replace(/\/$/, "");
  const key = `${field("SharedAccessKeyName")}:${field("SharedAccessKey")}`;
  const response = await fetch(`${endpoint}/$faults`, {
    method: "POST",
    headers: { Authorization: `Basic ${Buffer.from(key).toString("base64")}` },
    body: JSON.stringify(fault),
  });
  if (response.status !== 201) throw new Error(`arming ${JSON.stringify(fault)}: ${await response.text()}`);
}

async function errorCode(work) {
  try {
    await work();
  } catch (error) {
    return error.code || error.name;
  }
  return null;
}

async function main() {
  const once = new ServiceBusClient(connectionString, { retryOptions: { maxRetries: 0 } });
  const retrying = new ServiceBusClient(connectionString, { retryOptions: { maxRetries: 3, retryDelayInMs: 50 } });
  const seen = {};
  try {
    // server busy: without retries the SDK raises it; with retries it sends after two refusals
    await armFault({ kind: "server-busy", entity: busyQueue, count: 1 });
    seen.busyWithoutRetries = await errorCode(() => once.createSender(busyQueue).sendMessages({ body: "b0", messageId: "b0" }));
    await armFault({ kind: "server-busy", entity: busyQueue, count: 2 });
    seen.busyWithRetries = await errorCode(() => retrying.createSender(busyQueue).sendMessages({ body: "b1", messageId: "b1" }));

    // lock lost: the completion fails, the message comes again
    await retrying.createSender(lockQueue).sendMessages({ body: "l0", messageId: "l0" });
    await armFault({ kind: "lock-lost", entity: lockQueue });
    const receiver = once.createReceiver(lockQueue);
    const [first] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5000 });
    seen.lockLostOnComplete = await errorCode(() => receiver.completeMessage(first));
    const [again] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5000 });
    seen.redelivered = { body: again.body, deliveryCount: again.deliveryCount };
    await receiver.completeMessage(again);
    await receiver.close();
  } finally {
    await once.close();
    await retrying.close();
  }
  console.log(JSON.stringify(seen));
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});
